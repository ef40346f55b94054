"""Configuration of reinforcement learning in imagination (masked GRPO / PPO) and of KIR keyframes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RLDiagnosticsConfig:
    """What a run measures beyond its reality checks, its stop rules and its control arm: each off by default."""

    stop_when_real_falls_se: float = 0.0
    """Stop RL at the first evaluation whose real success, overall or on any evaluation task, lies below the first
    evaluation's by more than this many standard errors of the difference (paired episode by episode: the evaluations
    share their initial states, so only episodes whose outcome flipped count); the weights of the last evaluation that
    did not fall become the final policy (OUT/policy; results.json's "stopped" says which). 0: off. RL in
    imagination lowered door-open's real success while imagination said it rose in the thirteenth and fifteenth
    refinement-ab runs (0.46 -> 0.13, 0.49 -> 0.07). Each evaluation and task is one more look: with several of
    each, a fall of 2 standard errors by chance alone gets likely, so 3 suits long runs."""
    imagined_actions_in_reality: bool = False
    """At each reality check, also drive the simulator open loop, from the same initial states, by the closed-loop
    imagined episodes' action chunks: the simulator's verdict on what the policy did in imagination, with its kappa
    against the imagined verdicts. Says whether a task imagination fails (door-open in the 2026-12-03 reality-through-the-vae run:
    0.04 imagined, 0.35 real) fails for the policy's actions on imagined frames or for the world model's rendering of
    them. One more real run per check (results.json imagined_actions_in_reality). Needs --world-model, --judge and
    rl.checks.episodes_per_task > 0."""
    reality_through_codec: bool = False
    """The policy observes the real simulator through the world model's VAE (worldloop/envs/codec.py), as it
    observes imagination: the reality checks (calibration, tracking, the stop rule) and, with --env real, the
    training env. Then the policy RL makes is one that is deployed behind that VAE (`worldloop eval --world-model`).
    In the 2026-12-03 vae-changes-first-choices run the VAE alone changed 0.32 of the policy's first action tokens. Needs --world-model
    at sim.image_size.
    The refinement rounds' episodes (rl.refine.every) stay raw: the world model learns from the simulator's own frames."""
    shuffled_scores: bool = False
    """A control run (GRPO only). Each group's trajectory scores are permuted among its members before
    the advantages, so a rollout is credited with another rollout's score from the same initial state: the kept
    groups, the advantages' sizes and the loss masks stay as in a real run, only the link between what a rollout did
    and its reward is cut. Real success that rises under it does not come from imagination's reward (door-open rose
    in reality in four H200 runs while its imagined verdicts agreed with its actions' real outcome at kappa 0.03)."""

    def validate(self) -> None:
        if self.stop_when_real_falls_se < 0:
            raise ValueError(f"diagnostics.stop_when_real_falls_se must be >= 0 (0: off), got {self.stop_when_real_falls_se}")


@dataclass
class RLChecksConfig:
    """The reality checks of a run (worldloop/diagnostics/reality.py): the policy in the real simulator, and in
    imagination from the same initial states, before the first iteration, every rl.checks.every iterations and after the last."""

    every: int = 10
    """A reality check every this many iterations; 0: only before and after training."""
    tasks: list[str] = field(default_factory=list)
    """Tasks of the reality checks; empty: the tasks that RL trains on."""
    episodes_per_task: int = 4
    """Real (and imagined) episodes per task at each check; 0: no checks. rl.judge_threshold 'replay' calibrates on
    as many more per task."""

    def validate(self) -> None:
        if min(self.every, self.episodes_per_task) < 0:
            raise ValueError(f"checks.every and checks.episodes_per_task must be >= 0, got {self.every} and {self.episodes_per_task}")


@dataclass
class RLRefineConfig:
    """PACE within one run (worldloop/rl/refine.py), and how much the loop's WM Evo stage spends."""

    every: int = 0
    """PACE within one run: every this many iterations the policy runs rl.refine.episodes_per_task real episodes
    per training task (sampled at rl.train_temperature, initial states apart from the evaluations'), and the
    world model (the built-in one: its DiT; one of your own: through its refine_* methods, worldloop.worldmodel.protocol.WorldModelLike)
    trains rl.refine.steps steps on them, half of each batch (the other half: the dataset's
    training episodes of those tasks), so that it learns what the evolved policy's actions really do before RL
    exploits what it renders wrongly (the 2026-12-02 replay-calibrated-judge run: replay kappa 0.50 -> -0.20 on door-open
    while real success fell; worldloop/rl/refine.py). It spends real episodes; OUT/refine keeps their clips, OUT/world_model the refined world model.
    0: never, RL in imagination alone (--env imagined only)."""
    episodes_per_task: int = 8
    """Real episodes per training task in each refinement round; the loop's PACE stage (loop.pace) collects as many
    real rollouts of the stage-1 policy per task for WM Evo."""
    steps: int = 200
    """World-model optimizer steps per refinement round (batches of world_model.batch_size examples: the built-in's clips);
    the loop's WM Evo trains as many steps of train-wm on from WM Base."""

    def validate(self) -> None:
        if self.every < 0 or self.episodes_per_task < 1 or self.steps < 1:
            raise ValueError("refine.every >= 0, refine.episodes_per_task >= 1 and refine.steps >= 1 are required")


@dataclass
class RLConfig:
    """Masked GRPO (or PPO) on a vectorised, chunked environment: the imagined one by default."""

    algorithm: Literal["grpo", "ppo"] = "grpo"
    """'grpo': group-relative advantages, no critic. 'ppo': value head, GAE (gamma, gae_lambda) and clipped value loss."""
    iterations: int = 100
    """RL iterations; each collects one batch of rollouts and updates the policy on it."""
    group_size: int = 8
    """G: rollouts that share one initial state (GRPO's group)."""
    num_groups: int = 8
    """Initial states per iteration; the environment runs group_size * num_groups episodes at once."""
    max_steps: int = 200
    """Episode length limit in actions for the imagined environment (truncation); the real simulator keeps sim.max_steps."""
    success_chunks: int = 1
    """An imagined episode succeeds once the judge has said success at the end of this many consecutive
    chunks; 1: its first verdict (WoVR). 2 costs a chunk of delay and ignores a one-chunk false positive."""
    judge_threshold: float | Literal["replay"] | None = None
    """The judge's success threshold for RL and its imagined evaluations, in place of the judge's own (the
    classifier's saved one, TOPReward's reward.topreward.threshold); null keeps it. `calibrate-reward
    --world-model` suggests one from imagined frames. 'replay': chosen before training on the base
    policy's own real episodes (rl.checks.episodes_per_task per evaluation task, initial states apart from the
    evaluations'), replayed in the world model with their own actions: the highest threshold whose
    per-episode verdicts agree with the simulator's within reward.calibrate.threshold_tolerance_se standard errors
    of the best kappa (OUT/judge_calibration.json; a resumed run keeps it). The 2026-12-02 gap-sources-blame-the-judge run's judge,
    whose threshold was chosen on mostly expert episodes, passed 0.90 of the base policy's real episodes
    (0.45 real), and RL learned to fail in ways it passed; the thirteenth's, calibrated so, agreed with the
    simulator on real frames at kappa 0.67-0.85 (docs/results.md). The metaworld-gpu preset's default."""
    train_tasks: Literal["all", "tracked"] = "all"
    """'all': train on every task of --tasks (or the dataset's). 'tracked' (needs rl.judge_threshold 'replay'):
    only on those among them whose replays in the calibration agree with the simulator, within the task, more
    than reward.calibrate.threshold_significance_se standard errors beyond chance at the chosen threshold; rl stops
    with an error when none does. Where imagination cannot tell a task's successes from its failures, RL's
    reward there is noise (the 2026-12-02 judge-never-says-success run's window tasks: kappa -0.17 and -0.09) while the shared
    policy still changes there. The calibration runs on rl.checks.tasks (default: every candidate); the
    evaluations then on rl.checks.tasks when set, else on the tasks kept."""
    kir_ratio: float = 0.5
    """Fraction of imagined initial states drawn from KIR keyframes (the rest are episodes' first frames); 0 without keyframes."""
    train_temperature: float = 1.6
    """Sampling temperature of the policy while collecting training rollouts (old and new log-probs use it too);
    evaluations sample like the eval verb (eval.temperature, eval.greedy)."""
    mask_after_success: bool = True
    """Mask every chunk after the first success (WoVR); False keeps the whole rollout in the loss: WoVR's ablation,
    the `no_mask` arm of `worldloop experiment`."""
    filter_groups: bool = True
    """Drop groups whose scores are all equal (all fail or all succeed): they carry no GRPO signal."""
    update_epochs: int = 2
    """Passes over each rollout batch in the update."""
    num_minibatches: int = 4
    """Minibatches per epoch when every group is kept; the valid (trajectory, chunk) samples are shuffled and split
    into this many. When rl.filter_groups drops groups, into proportionally fewer (ceil(M * kept fraction), at least
    one), so that a minibatch holds as many trajectories either way: an iteration with little signal takes fewer
    AdamW steps, not as many on fewer samples. The 2026-12-02 refinement-ab run, which split 1 kept group of 8 into 4,
    saw approx_kl 0.26 in such an iteration (docs/results.md)."""
    lr: float = 1e-5
    """AdamW learning rate of the policy (constant after the warm-up of worldloop.rl.trainer.LR_WARMUP_STEPS optimizer steps)."""
    clip_low: float = 0.2
    """Lower ratio clip: ratios below 1 - clip_low get no gradient when the advantage is negative."""
    clip_high: float = 0.28
    """Upper ratio clip (asymmetric, DAPO 'clip higher'): ratios above 1 + clip_high get no gradient for positive advantages."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: none)."""
    kl_coef: float = 0.0
    """Weight of a KL penalty towards the starting policy (k3 estimator); 0: no KL and no reference copy is kept."""
    gamma: float = 0.99
    """PPO: discount per chunk in GAE."""
    gae_lambda: float = 0.95
    """PPO: GAE lambda."""
    checks: RLChecksConfig = field(default_factory=RLChecksConfig)
    """The reality checks: real-simulator evaluations (and imagined ones from the same initial states) before, during and after training."""
    refine: RLRefineConfig = field(default_factory=RLRefineConfig)
    """PACE within one run: the world model refined on the policy's real episodes every rl.refine.every iterations (off by default)."""
    time_limit_min: float = 0.0
    """Wall-clock budget of a run in minutes, its first and final evaluations included: the current iteration is
    the last (final evaluation, checkpoint and policy as usual) once another one, as slow as the slowest so far, and
    the evaluations after it, each as long as the latest, would end past it; 0: no limit."""
    diagnostics: RLDiagnosticsConfig = field(default_factory=RLDiagnosticsConfig)
    """Extra measurements, stop rules and the control arm (each off by default)."""
    checkpoint_every: int = 10
    """Save an atomic checkpoint every this many iterations (and at the end)."""

    def validate(self) -> None:
        if self.iterations < 0 or self.group_size < 1 or self.num_groups < 1 or self.max_steps < 1:
            raise ValueError("iterations >= 0, group_size >= 1, num_groups >= 1 and max_steps >= 1 are required")
        if self.algorithm == "grpo" and self.group_size < 2:
            raise ValueError(f"GRPO needs group_size >= 2 to compare rollouts, got {self.group_size}")
        if self.diagnostics.shuffled_scores and self.algorithm != "grpo":
            raise ValueError("diagnostics.shuffled_scores permutes GRPO's trajectory scores within groups; PPO's per-chunk rewards have no groups")
        if self.success_chunks < 1:
            raise ValueError(f"success_chunks must be >= 1, got {self.success_chunks}")
        if isinstance(self.judge_threshold, float) and not 0.0 < self.judge_threshold < 1.0:
            raise ValueError(f"judge_threshold is a probability in (0, 1), 'replay' or null, got {self.judge_threshold}")
        if self.train_tasks == "tracked" and self.judge_threshold != "replay":
            raise ValueError(f"train_tasks 'tracked' keeps the tasks that rl.judge_threshold 'replay' finds tracked; judge_threshold is {self.judge_threshold}")
        if not 0.0 <= self.kir_ratio <= 1.0:
            raise ValueError(f"kir_ratio must lie in [0, 1], got {self.kir_ratio}")
        if self.train_temperature <= 0:
            raise ValueError(f"train_temperature must be > 0, got {self.train_temperature}")
        if self.update_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("update_epochs and num_minibatches must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not (0 < self.clip_low < 1 and self.clip_high > 0):
            raise ValueError("0 < clip_low < 1 and clip_high > 0 are required")
        self.diagnostics.validate()
        if self.time_limit_min < 0:
            raise ValueError(f"time_limit_min must be >= 0, got {self.time_limit_min}")
        if self.entropy_coef < 0 or self.kl_coef < 0:
            raise ValueError("entropy_coef and kl_coef must be >= 0")
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"0 < gamma <= 1 and 0 <= gae_lambda <= 1 are required, got {self.gamma} and {self.gae_lambda}")
        self.checks.validate()
        self.refine.validate()
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
