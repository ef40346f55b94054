"""Configuration of the success judges: the trained classifier, TOPReward and their calibration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ClassifierConfig:
    """ResNet-18 success classifier on single frames, FiLM-conditioned on the task: what is saved with it (training: ClassifierTrainingConfig)."""

    pretrained_backbone: str = ""
    """Local file of torchvision ResNet-18 weights (.pth state dict or .safetensors) to start from; '' = random init."""
    input_size: int = 64
    """Side in pixels the frames are resized to before the network (on the device)."""
    threshold: float = 0.5
    """P(success) at or above which a frame counts as success; kept in the saved judge (0.5 = the seed's rounding)."""
    def validate(self) -> None:
        if self.input_size < 16 or not 0 < self.threshold < 1:
            raise ValueError("classifier: input_size >= 16 and 0 < threshold < 1 are required")


@dataclass
class ClassifierTrainingConfig:
    """How ``worldloop train-reward`` trains the classifier (nothing of it is saved with the judge)."""

    threshold_from: Literal["fixed", "max_f1", "youden", "episode_kappa"] = "fixed"
    """'fixed': keep reward.classifier.threshold. 'max_f1' / 'youden': after training, the saved judge's threshold is the one that
    maximises F1 / Youden's J on the held-out frames: the world model's replays of them when train-reward has
    --world-model (the frames the judge reads in RL), else the real ones. Class-balanced batches teach a 50 %
    prior, so 0.5 fires too often on real data, where success frames are rare. 'episode_kappa': the same
    held-out episodes, judged as RL judges them (success once any chunk's last frame crosses the threshold,
    one verdict per sim.chunk_size frames); the threshold whose verdicts agree best with the simulator's
    beyond chance (Cohen's kappa within tasks). A frame-level threshold ignores that a false positive in any
    of an episode's ~20 verdicts makes it a success."""
    steps: int = 300
    """Optimizer steps of training. Every quarter of them (and at the end) the held-out frames are scored (TensorBoard)
    and a checkpoint is written; every batch is degraded like world-model output (worldloop.rewards.augment.world_model_artefacts)."""
    batch_size: int = 64
    """Frames per training batch (half success, half failure: class-balanced sampling)."""
    lr: float = 3e-4
    """AdamW learning rate."""

    def validate(self) -> None:
        if self.steps < 1 or self.batch_size < 2:
            raise ValueError("training: steps >= 1 and batch_size >= 2 are required")
        if self.threshold_from not in ("fixed", "max_f1", "youden", "episode_kappa"):
            raise ValueError(f"training: threshold_from must be 'fixed', 'max_f1', 'youden' or 'episode_kappa', got {self.threshold_from!r}")
        if self.lr <= 0:
            raise ValueError(f"training: lr must be > 0, got {self.lr}")


@dataclass
class TOPRewardConfig:
    """TOPReward: a frozen Qwen3-VL judges a video window by log P(" True")."""

    threshold: float = 0.46
    """exp(score) = P(" True") at or above which a window counts as success (0.46 in the seed, on LIBERO; TOPReward
    publishes none: rl.judge_threshold=replay or calibrate-reward chooses one per suite)."""
    max_batch: int = 32
    """Largest number of windows in one forward pass; bigger batches are split (bounds GPU memory)."""

    def validate(self) -> None:
        if not 0 < self.threshold < 1 or self.max_batch < 1:
            raise ValueError("topreward: 0 < threshold < 1 and max_batch >= 1 are required")


@dataclass
class CalibrateConfig:
    """How a judge's threshold is chosen on the kappa of its per-episode verdicts (train-reward, the fidelity gate, rl.judge_threshold 'replay')."""

    threshold_tolerance_se: float = 1.0
    """Wherever a threshold is chosen by the kappa of per-episode verdicts against the simulator's (train-reward's
    reward.training.threshold_from 'episode_kappa', rl.judge_threshold 'replay'): of the thresholds whose kappa lies
    within this many standard errors of the best, the highest; 0: the best itself. Kappa's standard error on ~80
    episodes is ~0.15, so its argmax is noise: the 2026-12-02 gap-sources-blame-the-judge run's landed on 0.125 (kappa 0.22 +- 0.17), whose
    judge then passed 0.90 of the base policy's real episodes (real 0.45), and RL learned to fail in ways it passed.
    RL is paid for a false success and only loses signal on a missed one."""
    threshold_per_task: bool = False
    """Wherever a threshold is chosen on replays against the simulator (the fidelity gate's calibration half, rl.judge_threshold
    'replay'): each task's episodes also choose one of their own by the same rule (the one for all stays where a task's
    cannot), and RL judges each task at its own. One threshold for all is where the tasks' replays score alike; the nineteenth H200
    one-threshold-for-all-tasks run's did not: door-open's replays agreed with the simulator at kappa ~0.35 around 0.9 and at 0 at the
    0.998 that button-press-topdown's chose for all (docs/results.md). Within a task the choice rests on fewer episodes, so it is noisier."""
    threshold_significance_se: float = 2.0
    """Where a threshold is chosen as above: only thresholds whose kappa is above 0 by more than this many standard
    errors are chosen; where none is, the judge keeps its threshold (and rl warns that its reward is noise). Without
    it the 2026-12-02 judge-never-says-success run's calibration (kappa <= 0 at every threshold) chose 0.999, where the judge passed
    nothing, not even real successes. rl.train_tasks 'tracked' keeps the tasks whose kappa clears it too."""

    def validate(self) -> None:
        if self.threshold_tolerance_se < 0 or self.threshold_significance_se < 0:
            raise ValueError("calibrate: threshold_tolerance_se and threshold_significance_se must be >= 0")


@dataclass
class RewardConfig:
    """Success judges: a trained classifier and the zero-training TOPReward, with calibration."""

    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    """The ResNet-18 success classifier (what is saved with it)."""
    training: ClassifierTrainingConfig = field(default_factory=ClassifierTrainingConfig)
    """How train-reward trains the classifier."""
    topreward: TOPRewardConfig = field(default_factory=TOPRewardConfig)
    """The Qwen3-VL TOPReward judge."""
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    """Calibration of any judge on labelled windows."""
