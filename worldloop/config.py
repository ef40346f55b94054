"""One typed configuration for every stage of worldloop.

The schema is a tree of dataclasses: :class:`Config` at the root, one section per component
(each section lives next to the code that reads it, LeRobot style). A run's configuration is
built in three layers, each validated the same way:

    defaults of the dataclasses  <-  a YAML preset  <-  dotted overrides (``sim.image_size=128``)

Every key is checked against the schema: an unknown key or a value of the wrong type stops with
a :class:`ConfigError` that names the key and what is allowed. Field documentation is the
string literal written under each field (an attribute docstring); ``worldloop config`` prints
it next to the resolved values.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from worldloop.data.configuration import CollectConfig
from worldloop.policies.configuration import EvalConfig, PolicyConfig, SFTConfig
from worldloop.rewards.configuration import RewardConfig
from worldloop.rl.configuration import RLConfig
from worldloop.sims.configuration import ExpertConfig, SimConfig
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig

DEFAULT_PRESET = "tiny-cpu"
CONFIG_FILENAME = "config.yaml"


class ConfigError(ValueError):
    """A configuration key or value that the schema does not accept."""


RENAMED: dict[str, str] = {
    "rl.eval_imagined_actions_in_reality": "rl.diagnostics.imagined_actions_in_reality",
    "rl.judge_threshold_per_task": "rl.diagnostics.threshold_per_task",
    "rl.stop_when_real_falls_se": "rl.diagnostics.stop_when_real_falls_se",
    "rl.reality_through_codec": "rl.diagnostics.reality_through_codec",
    "rl.eval_videos_per_task": "eval.videos_per_task",
    "rl.judge_threshold_tolerance_se": "reward.calibrate.threshold_tolerance_se",
    "rl.judge_threshold_significance_se": "reward.calibrate.threshold_significance_se",
    "reward.classifier.threshold_tolerance_se": "reward.calibrate.threshold_tolerance_se",
    "reward.classifier.threshold_significance_se": "reward.calibrate.threshold_significance_se",
    **{f"reward.classifier.{name}": f"reward.training.{name}"
       for name in ("threshold_from", "steps", "batch_size", "lr")},
    "loop.evo_rollouts_per_task": "rl.refine_episodes_per_task",
    "loop.evo_wm_steps": "rl.refine_steps",
}
"""Keys that moved: old dotted name -> the key that holds the same setting now."""

ANY_VALUE = "(any value)"
"""A retired key whose value never changed what a run did (a saved config may hold any)."""

RETIRED: dict[str, tuple[Any, str]] = {
    "vae.perceptual_weight": (0.0, "the VGG perceptual loss is gone; remove the key"),
    "vae.perceptual_weights": (None, "the VGG perceptual loss is gone; remove the key"),
    "vae.channels_last": (False, "remove the key (no faster at the presets' batch sizes)"),
    "world_model.bench_sizes": (ANY_VALUE, "`worldloop bench wm --models` takes them"),
    "world_model.bench_batch_sizes": (ANY_VALUE, "`worldloop bench wm --batch-sizes` takes them"),
    "reward.topreward.attn_implementation": ("sdpa", "remove the key"),
    "rl.length_normalise": (True, "remove the key (WoVR's ablation; every trajectory's loss is divided by its valid length)"),
    "rl.reward_control": ("none", "a control run sets rl.diagnostics.shuffled_scores=true"),
    "sim.shadows": (False, "frames render without shadows (~3x faster, docs/benchmarks.md); remove the key"),
    "sim.reward_scale": (5.0, "the chunk reward's c is worldloop.envs.protocol.REWARD_SCALE; remove the key"),
    "rl.reward_scale": (5.0, "the chunk reward's c is worldloop.envs.protocol.REWARD_SCALE; remove the key"),
    "policy.mlp_ratio": (4.0, "remove the key"),
    "policy.norm_percentiles": ([1.0, 99.0], "actions are normalised by their 1st and 99th percentiles; remove the key"),
    "policy.max_instruction_tokens": (16, "remove the key"),
    "sft.augment_blur": (0.0, "sft.augment_codec trains on the world model's own frames (it beat blur: "
                              "docs/experiments/2026-12-03-vae-changes-first-choices.md)"),
    "sft.weight_decay": (0.01, "remove the key"),
    "sft.grad_clip": (1.0, "remove the key"),
    "sft.checkpoint_every": (ANY_VALUE, "a checkpoint is written at every held-out evaluation (worldloop.utils.checkpoint.EVALUATIONS)"),
    "expert.perturb_start_min": (10, "remove the key (worldloop.sims.experts.PERTURB_START)"),
    "expert.perturb_start_max": (120, "remove the key (worldloop.sims.experts.PERTURB_START)"),
    "expert.gripper_perturb_fraction": (0.5, "remove the key"),
    "eval.video_fps": (20, "evaluation videos play at worldloop.data.configuration.FPS"),
    **{f"reward.{section}.{name}": retired for section in ("classifier", "training") for name, retired in {  # classifier: before 2026-12-04
        "weight_decay": (1e-4, "remove the key"),
        "blur_prob": (0.5, "reward.training.augment switches the whole degradation on or off"),
        "jitter": (0.2, "reward.training.augment switches the whole degradation on or off"),
        "noise_std": (0.03, "reward.training.augment switches the whole degradation on or off"),
        "max_frames": (200000, "remove the key"),
    }.items()},
    "reward.topreward.video_fps": (2.0, "remove the key"),
    "vae.kl_weight": (1e-6, "remove the key (worldloop.worldmodel.train.KL_WEIGHT)"),
    "world_model.weight_decay": (0.01, "remove the key (worldloop.worldmodel.train.WEIGHT_DECAY)"),
    "world_model.grad_clip": (1.0, "remove the key (worldloop.worldmodel.train.GRAD_CLIP)"),
    "rl.weight_decay": (0.0, "remove the key"),
    "rl.value_clip": (0.2, "remove the key"),
    "rl.value_coef": (0.5, "remove the key"),
    "rl.refine_lr": (1e-4, "remove the key"),
    "rl.refine_ema_decay": (0.99, "remove the key (0, the raw weights, turned imagination pessimistic in the 2026-12-02 refinement-ab run)"),
    "rl.keep_checkpoints": (2, "remove the key"),
    "rl.kir_lead_frames": (4, "remove the key"),
    "rl.kir_max_per_episode": (4, "remove the key"),
    "rl.kir_failure_stride": (16, "remove the key"),
    # 2026-12-04, third pass: one-off experiment switches, ablations that lost, and knobs no preset moved
    **{f"{section}.held_out_fraction": (0.1, "training keeps worldloop.data.dataset.HELD_OUT_FRACTION of each task's episodes "
                                             "out; `worldloop eval-wm --held-out-fraction` measures on another share")
       for section in ("sft", "vae", "world_model")},
    **{f"reward.{section}.held_out_fraction": (0.2, "train-reward keeps worldloop.rewards.train.HELD_OUT_FRACTION out; remove the key")
       for section in ("classifier", "training")},
    "vae.log_every": (ANY_VALUE, "losses are logged every worldloop.worldmodel.train.LOG_EVERY steps; remove the key"),
    "world_model.log_every": (ANY_VALUE, "losses are logged every worldloop.worldmodel.train.LOG_EVERY steps; remove the key"),
    "world_model.static_fraction": (0.05, "remove the key (worldloop.worldmodel.clips.STATIC_FRACTION)"),
    "world_model.self_forcing_steps": (0, "a self-forced memory is sampled in world_model.sampling_steps Euler steps, as in a rollout"),
    "world_model.memory_frames": (4, "WoVR's four memory frames; the one-frame ablation is gone"),
    "world_model.reference_frame": (True, "first-frame anchoring; the sliding ablation is gone"),
    "world_model.context_noise": (0.3, "remove the key (worldloop.worldmodel.train.CONTEXT_NOISE)"),
    "world_model.action_dropout": (0.0, "action guidance was not a fix as trained (docs/experiments/2026-12-03-action-guidance.md)"),
    "world_model.action_guidance": (1.0, "action guidance was not a fix as trained (docs/experiments/2026-12-03-action-guidance.md)"),
    "reward.calibrate.max_episodes": (ANY_VALUE, "`worldloop calibrate-reward --max-episodes` takes it"),
    "sft.augment_shift": (4, "remove the key (worldloop.policies.sft.AUGMENT_SHIFT)"),
    "eval.temperature": (1.0, "evaluations sample at temperature 1 unless eval.greedy; `worldloop eval --temperature` takes another"),
    "eval.seed_offset": (2**31, "remove the key (worldloop.rl.evaluate.EVAL_SEED_OFFSET)"),
    "expert.noise_hold_steps": (1, "expert noise is a new draw every step; remove the key"),
    "reward.classifier.conditioning": ("task", "the judge is always FiLM-conditioned on the task; remove the key"),
    **{f"reward.{section}.augment": (True, "the judge always trains on frames degraded like world-model output; remove the key")
       for section in ("classifier", "training")},
    "policy.num_bins": (256, "remove the key (worldloop.policies.tokenizer.NUM_BINS)"),
    "vae.clip_frames": (13, "remove the key (worldloop.worldmodel.train.VAE_CLIP_FRAMES: the world model's 4 latent frames)"),
    "reward.topreward.window": (16, "remove the key (worldloop.rewards.topreward.WINDOW: the previous and the current chunk)"),
    "world_model.gradient_checkpointing": (ANY_VALUE, "the DiT trains without it (the GPU preset had it off: batch 256 fits, compiled); remove the key"),
    # 2026-12-04, fourth pass: diagnostics that ran once, knobs no preset moved, and settings a verb's option or a fixed share now holds
    **{key: (False, "a task whose success rises in imagination only is named by rl's warning; leave it out with rl.train_tasks or --tasks")
       for key in ("rl.drop_imagined_only", "rl.diagnostics.drop_imagined_only")},
    **{key: (False, "remove the key (measured once, in docs/experiments/2026-12-04-grown-world-model-tracks-door-open.md)")
       for key in ("rl.eval_imagination_repeat", "rl.diagnostics.imagination_repeat")},
    "rl.lr_warmup_steps": (16, "remove the key (worldloop.rl.trainer.LR_WARMUP_STEPS)"),
    "rl.target_kl": (None, "remove the key (no run stopped an update early: the learning rate warms up instead)"),
    "rl.max_grad_norm": (1.0, "remove the key (worldloop.rl.trainer.MAX_GRAD_NORM)"),
    "rl.kir_failure_episodes_per_task": (ANY_VALUE, "`worldloop kir --policy MODEL --failure-episodes N` takes it"),
    "world_model.self_forcing_after": (0.3, "remove the key (worldloop.worldmodel.train.SELF_FORCING_AFTER)"),
    "world_model.self_forcing_chunks": (1, "a self-forced memory is sampled from the clip one chunk earlier (deeper ones were never measured)"),
    "world_model.sample_every": (ANY_VALUE, "sample videos are written at every world_model.checkpoint_every"),
    **{key: (ANY_VALUE, "held-out evaluations and checkpoints come every quarter of the steps (worldloop.utils.checkpoint.EVALUATIONS); remove the key")
       for key in ("sft.eval_every", "reward.classifier.eval_every", "reward.training.eval_every")},
    "sft.held_out_samples": (ANY_VALUE, "each evaluation scores worldloop.policies.sft.HELD_OUT_SAMPLES held-out samples; remove the key"),
    "sft.episodes_per_task": (ANY_VALUE, "`worldloop sft --episodes-per-task N` takes it"),
    "collect.fps": (20, "remove the key (worldloop.data.configuration.FPS)"),
    "policy.vision_weights": (ANY_VALUE, "the image encoder starts from random weights (no preset loaded any; a saved policy holds its own)"),
    "reward.calibrate.stride": (4, "remove the key (worldloop.rewards.scoring.WINDOW_STRIDE)"),
    "reward.calibrate.batch_size": (ANY_VALUE, "calibrate-reward scores worldloop.rewards.scoring.JUDGE_BATCH windows per call; "
                                               "TOPReward splits them at reward.topreward.max_batch"),
}
"""Keys that are gone: old dotted name -> (the value the code now always uses, what to do instead).
A user's preset or override that sets one stops with an error naming it; a saved config or model folder
that holds one loads when its value is the one now fixed (it was built as this version builds it)."""


@dataclass
class LoopConfig:
    """The closed loop (``worldloop loop``): how much real data each stage spends."""

    demo_episodes_per_task: int = 5
    """Expert demonstrations collected per task (clean and noisy, as `collect.*` says)."""
    sft_episodes_per_task: int = 1
    """Demonstrations per task the base policy is fine-tuned on (1: WoVR's one-trajectory SFT)."""
    base_rollouts_per_task: int = 10
    """Real rollouts of the base policy per task: the world model's and the judge's training data."""
    eval_episodes_per_task: int = 10
    """Real-simulator evaluation episodes per task for the base, stage-1 and stage-2 policies."""
    judge: str = "classifier"
    """'classifier' (trained on the base rollouts) or 'topreward:PATH' (a local Qwen3-VL folder)."""
    pace: bool = True
    """Run the second half of the loop: rl.refine_episodes_per_task real rollouts per task of the stage-1 policy, on which
    the world model trains rl.refine_steps more steps (WM Base -> WM Evo), then RL stage 2; False: the w/o-PACE ablation."""
    gate_episodes_per_task: int = 48
    """The fidelity gate (`worldloop gate`, before RL): real episodes of the base policy per task, replayed in the world model."""
    gate_min_kappa: float | None = 0.6
    """The fidelity gate: the judge-on-replay kappa a task needs on the gate's evaluation episodes for RL to train on it,
    and the loop's judge then learns the world model's replays too (train-reward --world-model); null: the gate measures
    and reports, RL trains on every task, and the judge learns real frames only."""
    gate_min_kappa_lower: float = 0.3
    """The fidelity gate: the lower bound of a task's bootstrap 95 % kappa interval must lie above this too (with 24
    evaluation episodes a kappa of 0.6 can rest on 3 successes)."""
    gate_threshold_per_task: bool = False
    """The fidelity gate: each task's calibration episodes choose a judge threshold of its own (the one for all where
    they cannot); RL in the loop judges each task at its own."""
    time_budget_min: float = 0.0
    """Wall-clock minutes for the whole loop (`loop --time-budget`): the RL stages get what the stages before them
    left, less a minute for each stage after them; 0: no budget (each stage as its own settings say)."""

    def validate(self) -> None:
        if self.judge != "classifier" and not self.judge.startswith("topreward:"):
            raise ValueError(f"judge must be 'classifier' or 'topreward:PATH', got {self.judge!r}")
        if self.gate_episodes_per_task < 1:
            raise ValueError(f"gate_episodes_per_task must be >= 1, got {self.gate_episodes_per_task}")
        if self.gate_min_kappa is not None and not -1.0 <= self.gate_min_kappa <= 1.0:
            raise ValueError(f"gate_min_kappa must be a kappa in [-1, 1] or null (not enforced), got {self.gate_min_kappa}")
        if not -1.0 <= self.gate_min_kappa_lower <= 1.0:
            raise ValueError(f"gate_min_kappa_lower must be a kappa in [-1, 1], got {self.gate_min_kappa_lower}")
        if self.time_budget_min < 0:
            raise ValueError(f"time_budget_min must be >= 0 (0: no budget), got {self.time_budget_min}")
        counts = (self.demo_episodes_per_task, self.sft_episodes_per_task, self.base_rollouts_per_task, self.eval_episodes_per_task)
        if min(counts) < 1:
            raise ValueError("episode counts must be >= 1")


@dataclass
class Config:
    """The whole configuration of a worldloop run."""

    preset: str = DEFAULT_PRESET
    """Name of the preset these values started from (informational; set by the loader)."""
    seed: int = 0
    """Global random seed: simulator seeds, initialisation and sampling derive from it."""
    device: str = "auto"
    """Torch device for models: 'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:1'..."""
    sim: SimConfig = field(default_factory=SimConfig)
    """The real simulator."""
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    """Scripted experts used to collect demonstrations."""
    collect: CollectConfig = field(default_factory=CollectConfig)
    """Trajectory collection."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The compact VLA policy."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning of the policy."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Real-simulator evaluation."""
    vae: VAEConfig = field(default_factory=VAEConfig)
    """The video VAE of the world model."""
    world_model: WorldModelConfig = field(default_factory=WorldModelConfig)
    """The action-conditioned video diffusion world model."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Success judges (classifier, TOPReward)."""
    rl: RLConfig = field(default_factory=RLConfig)
    """Reinforcement learning in imagination."""
    loop: LoopConfig = field(default_factory=LoopConfig)
    """The closed loop that chains every stage."""


# --------------------------------------------------------------------------------------------
# Loading


def preset_names() -> list[str]:
    """Names of the presets shipped inside the package."""
    folder = resources.files("worldloop") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_preset(name_or_path: str | Path) -> dict[str, Any]:
    """The raw mapping of a preset: a shipped preset's name or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"preset file {path} does not exist")
        text, where = path.read_text(), str(path)
    else:
        if str(name_or_path) not in preset_names():
            raise ConfigError(f"unknown preset '{name_or_path}'; allowed: {', '.join(preset_names())} or a path to a .yaml file")
        text = (resources.files("worldloop") / "presets" / f"{name_or_path}.yaml").read_text()
        where = f"preset {name_or_path}"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{where} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of config keys, got {type(data).__name__}")
    return data


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["sim.image_size=128", "rl.lr=3e-5"]`` -> nested mapping, values parsed as YAML scalars."""
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"override '{item}': cannot parse value: {error}") from error
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}' sets inside '{part}', which is a value, not a section")
        node[parts[-1]] = value
    return nested


def resolve_preset(name_or_path: str | Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's mapping with its ``base:`` chain (presets it extends) merged underneath."""
    data = read_preset(name_or_path)
    base = data.pop("base", None)
    if base is None:
        return data
    if str(base) in seen:
        raise ConfigError(f"preset {name_or_path}: 'base: {base}' makes a cycle ({' -> '.join(seen)})")
    return deep_merge(resolve_preset(base, (*seen, str(name_or_path))), data)


def load_config(preset: str | Path = DEFAULT_PRESET, overrides: list[str] | None = None) -> Config:
    """Defaults <- preset (and the presets it extends) <- overrides, validated against the schema."""
    data = deep_merge(resolve_preset(preset), parse_overrides(overrides or []))
    data.setdefault("preset", Path(preset).stem if Path(preset).suffix else str(preset))
    return from_dict(Config, data)


def load_saved_config(path: str | Path) -> Config:
    """Read a ``config.yaml`` written by :func:`save_config` (a run folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILENAME
    if not path.is_file():
        raise ConfigError(f"no saved config at {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from error
    return from_dict(Config, upgraded(data), saved=True)


def save_config(config: Any, folder: str | Path) -> Path:
    """Write the resolved config next to an output, atomically, as ``folder/config.yaml``."""
    from worldloop.utils.io import atomic_write_text

    path = Path(folder) / CONFIG_FILENAME
    atomic_write_text(path, to_yaml(config))
    return path


def to_yaml(config: Any) -> str:
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# --------------------------------------------------------------------------------------------
# Validation: mapping -> dataclass, with errors that name the key


def old_key_error(where: str) -> str | None:
    """The one-line message for a key that was renamed or retired; None for any other key."""
    if where in RENAMED:
        return f"config key '{where}' is now '{RENAMED[where]}'; set that instead"
    if where in RETIRED:
        fixed, instead = RETIRED[where]
        return f"config key '{where}' was retired{'' if fixed == ANY_VALUE else f' (now always {fixed!r})'}; {instead}"
    return None


def retired_as_fixed(dotted: str, value: Any) -> bool:
    """Whether ``dotted`` is a retired key and ``value`` (as saved) the one this version now always uses."""
    return dotted in RETIRED and RETIRED[dotted][0] in (value, ANY_VALUE)


def upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A mapping saved by an earlier version with its renamed keys moved to where they live now, values kept
    (where both are set, the new key's value wins)."""
    data = copy.deepcopy(data)
    for old, new in RENAMED.items():
        *path, name = old.split(".")
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or name not in node:
            continue
        value = node.pop(name)
        *new_path, new_name = new.split(".")
        target = data
        for part in new_path:
            target = target.setdefault(part, {})
        target.setdefault(new_name, value)
    return data


def from_dict(cls: type, data: Any, path: str = "", saved: bool = False) -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and value. ``saved``: the mapping was
    written by an earlier version (a run's config.yaml, a model's config.json), whose retired keys are
    accepted when they hold the value now fixed."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{path or 'config'}' must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{path}{key}"
        if key not in names:
            if saved and retired_as_fixed(where, value):
                continue
            if saved and where in RETIRED:
                raise ConfigError(f"saved config key '{where}' = {value!r}: this version always uses {RETIRED[where][0]!r}")
            message = old_key_error(where)
            if message:
                raise ConfigError(message)
            raise ConfigError(f"unknown config key '{where}'; allowed keys{' in ' + path.rstrip('.') if path else ''}: {', '.join(names)}")
        hint = hints[key]
        kwargs[key] = from_dict(hint, value, where + ".", saved) if dataclasses.is_dataclass(hint) else convert(hint, value, where)
    instance = cls(**kwargs)
    check = getattr(instance, "validate", None)
    if check is not None:
        try:
            check()
        except ValueError as error:
            raise ConfigError(f"{path.rstrip('.') or 'config'}: {error}") from error
    return instance


def convert(hint: Any, value: Any, where: str) -> Any:
    """Check ``value`` against type ``hint`` (coercing int -> float, lists -> tuples)."""
    origin, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key '{where}' = {value!r} is not allowed; allowed values: {', '.join(map(repr, args))}")
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(option, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"config key '{where}' = {value!r} matches none of {describe(hint)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{where}' must be a list ({describe(hint)}), got {value!r}")
        item_hint = args[0] if args else Any
        items = [convert(item_hint, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"config key '{where}' must be a number, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{where}' must be an integer, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{where}' must be true or false, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key '{where}' must be a string, got {value!r}")
    raise ConfigError(f"config key '{where}': unsupported type {hint!r} in the schema")


def describe(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin in (list, tuple):
        return f"list of {describe(args[0])}" if args else "list"
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


# --------------------------------------------------------------------------------------------
# Documentation: attribute docstrings


SAVED_WITH_MODEL: dict[str, tuple[str, ...] | None] = {
    "policy": None,
    "vae": ("size", "spatial_downsamples"),
    "world_model": ("size", "chunk_size", "context_channels", "sampling_steps", "shift", "decode", "memory_noise"),
    "reward.classifier": None,
}
"""What a trained model keeps in its folder (section -> its fields, None: every field): the architecture, and the world
model's sampling options. A verb that loads a model builds it as saved, whatever the run's config says (a world model's
sampling options can be overridden on the command line); the other fields are run knobs: training, evaluation, budgets."""


def saved_with_model(dotted: str) -> bool:
    """Whether the leaf ``dotted`` (``world_model.chunk_size``) is saved with a trained model."""
    section, _, name = dotted.rpartition(".")
    return section in SAVED_WITH_MODEL and (SAVED_WITH_MODEL[section] is None or name in SAVED_WITH_MODEL[section])


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The string literal written under each field of dataclass ``cls``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def explain(config: Any, prefix: str = "") -> list[str]:
    """Lines ``key = value  # doc`` for every leaf of the config tree."""
    lines = []
    docs = field_docs(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"# {prefix}{f.name}: {docs.get(f.name, '')}")
            lines.extend(explain(value, f"{prefix}{f.name}."))
        else:
            saved = "[saved with the model] " if saved_with_model(prefix + f.name) else ""
            lines.append(f"{prefix}{f.name} = {value!r}  # {saved}{docs.get(f.name, '')}")
    return lines


def missing_docs(cls: type = Config, prefix: str = "") -> list[str]:
    """Fields without a docstring (the test suite keeps this empty)."""
    missing = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not docs.get(f.name):
            missing.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            missing.extend(missing_docs(hints[f.name], f"{prefix}{f.name}."))
    return missing


def leaf_fields(cls: type = Config, prefix: str = "") -> list[str]:
    """Dotted names of every leaf field (a knob a preset or override can set): ``rl.lr``, ``sim.image_size``, ..."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            leaves.extend(leaf_fields(hints[f.name], f"{prefix}{f.name}."))
        else:
            leaves.append(prefix + f.name)
    return leaves
