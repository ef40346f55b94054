"""A user's own policy, judge, simulator and world model plug in by a registered name or by 'module:Class'."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from worldloop.commands.shared import load_world_model
from worldloop.config import load_config
from worldloop.policies import load_policy
from worldloop.rewards import load_judge
from worldloop.sims import make_env
from worldloop.sims.tasks import resolve_tasks
from worldloop.utils.registry import JUDGES, POLICIES, SIMULATORS, WORLD_MODELS, Registry

PLUGINS = '''
class MyPolicy:
    @classmethod
    def from_pretrained(cls, folder, device):
        policy = cls()
        policy.folder, policy.device = str(folder), device
        return policy


class MyJudge:
    @classmethod
    def from_pretrained(cls, path, device, config):
        judge = cls()
        judge.path, judge.config = str(path), config
        return judge


class MySim:
    def __init__(self, sim_config, num_envs, tasks=None):
        self.num_envs, self.chunk_size, self.tasks = num_envs, sim_config.chunk_size, tasks


class MyWorldModel:
    @classmethod
    def from_pretrained(cls, folder, device, **sampling):
        model = cls()
        model.folder, model.sampling = str(folder), sampling
        return model
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A module of the user's own, importable as ``my_plugins`` (as any installed package would be)."""
    (tmp_path / "my_plugins.py").write_text(textwrap.dedent(PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sys.modules.setdefault("my_plugins", __import__("my_plugins"))
    sys.modules.pop("my_plugins", None)


def model_folder(path, kind):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"kind": kind}))
    return path


def test_a_users_classes_plug_in_by_import_path(tmp_path, plugins):
    policy = load_policy(model_folder(tmp_path / "policy", "my_plugins:MyPolicy"), torch.device("cpu"))
    assert isinstance(policy, plugins.MyPolicy) and policy.folder == str(tmp_path / "policy")

    config = load_config("tiny-cpu", ["sim.backend=my_plugins:MySim"])
    env = make_env(config, 3, tasks=["reach-v3"])
    assert isinstance(env, plugins.MySim) and env.num_envs == 3 and env.tasks == ["reach-v3"]
    # a simulator without a task table of its own takes the registered simulators' tasks
    assert resolve_tasks(load_config("tiny-cpu", ["sim.backend=my_plugins:MySim", "sim.tasks=[reach]"]).sim) == ["reach-v3"]

    judge = load_judge("my_plugins:MyJudge=/weights/mine", "cpu", config.reward)
    assert isinstance(judge, plugins.MyJudge) and judge.path == "/weights/mine" and judge.config is config.reward
    judge = load_judge(model_folder(tmp_path / "judge", "my_plugins:MyJudge"), "cpu")
    assert judge.path == str(tmp_path / "judge")

    model = load_world_model(model_folder(tmp_path / "wm", "my_plugins:MyWorldModel"), config, ["world_model.shift=2.0"], torch.device("cpu"))
    assert isinstance(model, plugins.MyWorldModel) and set(model.sampling) == {"shift"}  # only what the command line set


def test_a_users_classes_plug_in_by_a_registered_name(tmp_path, plugins, monkeypatch):
    for registry in (POLICIES, JUDGES, SIMULATORS, WORLD_MODELS):  # registrations end with the test
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    POLICIES.register("my_vla")(plugins.MyPolicy)
    JUDGES.register("mine")(plugins.MyJudge)
    SIMULATORS.register("my_sim")(plugins.MySim)
    WORLD_MODELS.register("my_wm")(plugins.MyWorldModel)

    assert isinstance(load_policy(model_folder(tmp_path / "policy", "my_vla")), plugins.MyPolicy)
    assert isinstance(load_judge("mine:/weights", "cpu"), plugins.MyJudge)
    assert isinstance(make_env(load_config("tiny-cpu", ["sim.backend=my_sim"]), 2), plugins.MySim)
    model = load_world_model(model_folder(tmp_path / "wm", "my_wm"), load_config("tiny-cpu"), [], torch.device("cpu"))
    assert isinstance(model, plugins.MyWorldModel)
    with pytest.raises(ValueError, match="already registered"):
        POLICIES.register("my_vla")(plugins.MyJudge)


def test_the_built_in_names_resolve_and_unknown_ones_say_what_is_known(tmp_path):
    from worldloop.policies.compact_vla.modeling import CompactVLA
    from worldloop.rewards.classifier import SuccessClassifier
    from worldloop.sims.metaworld import MetaWorldVecEnv

    assert POLICIES.get("compact_vla") is CompactVLA and JUDGES.get("success_classifier") is SuccessClassifier
    assert SIMULATORS.get("metaworld") is MetaWorldVecEnv and "world_model" in WORLD_MODELS
    with pytest.raises(ValueError, match="sim.backend .isaac. is unknown; registered: libero, metaworld"):
        load_config("tiny-cpu", ["sim.backend=isaac"])
    with pytest.raises(ValueError, match="unknown simulator .isaac.; registered: libero, metaworld"):
        SIMULATORS.get("isaac")
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        Registry("thing", {}).get("no_such_module:Thing")
    with pytest.raises(ValueError, match="names no 'kind'"):
        load_policy(model_folder(tmp_path / "unnamed", None))
