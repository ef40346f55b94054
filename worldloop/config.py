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

from worldloop.config_migrations import RETIRED, old_key_error, retired_as_fixed, upgraded
from worldloop.data.configuration import CollectConfig
from worldloop.policies.compact_vla.configuration import PolicyConfig
from worldloop.policies.configuration import EvalConfig, SFTConfig
from worldloop.rewards.configuration import RewardConfig
from worldloop.rl.configuration import RLConfig
from worldloop.sims.configuration import ExpertConfig, SimConfig
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig

DEFAULT_PRESET = "tiny-cpu"
CONFIG_FILENAME = "config.yaml"


class ConfigError(ValueError):
    """A configuration key or value that the schema does not accept."""


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
    """Run the second half of the loop: rl.refine.episodes_per_task real rollouts per task of the stage-1 policy, on which
    the world model trains rl.refine.steps more steps (WM Base -> WM Evo), then RL stage 2; False: the w/o-PACE ablation."""
    gate_episodes_per_task: int = 48
    """The fidelity gate (`worldloop gate`, before RL): real episodes of the base policy per task, replayed in the world model."""
    gate_min_kappa: float | None = 0.6
    """The fidelity gate: the judge-on-replay kappa a task needs on the gate's evaluation episodes for RL to train on it,
    and the loop's judge then learns the world model's replays too (train-reward --world-model); null: the gate measures
    and reports, RL trains on every task, and the judge learns real frames only."""
    gate_min_kappa_lower: float = 0.3
    """The fidelity gate: the lower bound of a task's bootstrap 95 % kappa interval must lie above this too (with 24
    evaluation episodes a kappa of 0.6 can rest on 3 successes)."""
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
    "vae": ("size", "spatial_downsamples", "decoder_base_dim"),
    "world_model": ("size", "chunk_size", "context_channels", "sampling_steps", "shift", "decode", "decoder", "memory_noise"),
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
