"""The TOPReward arm end to end on the micro preset: `worldloop loop` with loop.judge=topreward:DIR runs the
base policy's evaluation and rollouts, the gate, `worldloop rl --judge topreward:DIR` (its threshold chosen on
the base policy's real episodes replayed in the world model) and the evaluation after it, with a tiny random
Qwen3-VL folder as the judge. The base policy and the world model are random (their training has its own tests)."""

from __future__ import annotations

import json
import math

import torch

from _policy_fixtures import TINY
from _rewards_fixtures import TINY_VIDEO_SIZE
from worldloop.cli import main
from worldloop.config import load_config
from worldloop.loop import STAGES_DIR, Inputs, plan, run_loop
from worldloop.rewards.qwen_random import QWEN_VOCAB_SIZE, save_random_qwen3_vl_folder

# Real episodes of two chunks (16 steps: keyframes need a failure that long), imagined ones of one, one Euler step of
# imagination, two base rollouts per task (one held out for eval-wm), one RL iteration of the preset's 2 groups of 2.
OVERRIDES = [*TINY, "loop.pace=false", "loop.eval_episodes_per_task=1", "loop.base_rollouts_per_task=2", "loop.gate_episodes_per_task=2",
             "sim.max_steps=16", "rl.max_steps=8", "world_model.sampling_steps=1", "rl.iterations=1", "rl.judge_threshold=replay", "rl.kir_ratio=0",
             "world_model.eval_horizons=[4]", "world_model.eval_episodes=1"]  # fmt: skip


def random_base(config, folder):
    """A random CompactVLA for the preset's tasks and a random world model at the simulator's frame size."""
    from worldloop.policies.compact_vla.modeling import CompactVLA
    from worldloop.policies.tokenizer import ActionTokenizer
    from worldloop.sims.tasks import INSTRUCTIONS
    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.rollout import WorldModel

    torch.manual_seed(0)
    size, action_dim = config.sim.image_size, 4
    policy = CompactVLA(config.policy, action_dim, size, ActionTokenizer.fit(torch.rand(64, action_dim) * 2 - 1))
    policy.add_instructions([INSTRUCTIONS[task] for task in config.sim.tasks])
    policy.save_pretrained(folder / "policy")
    WorldModel.build(config.world_model, vae_lib.build_vae(config.vae), size, action_dim, device="cpu").save_pretrained(folder / "wm")
    return str(folder / "policy"), str(folder / "wm")


def test_the_topreward_arm_runs_the_loop_and_the_gate_reads_its_replays(tmp_path):
    qwen = save_random_qwen3_vl_folder(tmp_path / "Qwen3-VL-tiny", "tiny", video_size=TINY_VIDEO_SIZE)
    overrides = [*OVERRIDES, f"loop.judge=topreward:{qwen}"]
    config = load_config("micro", overrides)
    policy, world_model = random_base(config, tmp_path)
    inputs = Inputs(dataset=str(tmp_path / "unused-demos"), base_policy=policy, world_model=world_model)  # the demos train only what is given
    run, calls = tmp_path / "run", []

    def verb(argv):
        calls.append(argv)
        return main(argv)

    run_loop(config, run, inputs, "micro", overrides, verb=verb)
    stages = [s.name for s in plan(config, run, inputs)[0]]
    assert "judge" not in stages and stages[-1] == "eval_rl1"
    assert sorted(p.stem for p in (run / STAGES_DIR).glob("*.json")) == sorted(stages)
    rl = next(argv for argv in calls if argv[0] == "rl")
    assert rl[rl.index("--judge") + 1] == f"topreward:{qwen}"
    assert (run / "rl1" / "policy" / "model.safetensors").is_file()
    # the gate read TOPReward's P(" True") of the base policy's replayed episodes
    gate = json.loads((run / "gate" / "gate.json").read_text())
    assert gate["judge_threshold"] == config.reward.topreward.threshold
    replayed = [p for chunks in json.loads((run / "gate" / "gate_episodes.json").read_text())["replay"] for p in chunks]
    # a random tiny Qwen3-VL answers near uniformly over its 151936 tokens: P(" True") ~ 1 / 151936, never 0
    assert len(replayed) >= 2 * len(config.sim.tasks) and all(abs(math.log(p * QWEN_VOCAB_SIZE)) < 1 for p in replayed), replayed
    # the random base policy fails every real episode: no kappa to choose by, TOPReward's default threshold stays, and RL judges at it
    assert not any(json.loads((run / "gate" / "gate_episodes.json").read_text())["real"]) and not gate["calibrated"]
    assert load_config(run / "rl1" / "config.yaml").rl.judge_threshold == gate["threshold"] == gate["judge_threshold"]
