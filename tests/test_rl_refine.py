"""Refining the world model on the policy's real rollouts during RL: the episodes, one round, resume."""

import dataclasses
import json
import math

import pytest
import torch
from _rl_fixtures import ToyPolicy
from _worldmodel_fixtures import square_episodes, tiny_vae
from test_rl_env import make_pool

from worldloop.envs.imagined import ImaginedEnv
from worldloop.envs.toy import ToyEnv, ToyJudge, ToyWorldModel
from worldloop.rl.configuration import RLConfig
from worldloop.rl.refine import WorldModelRefiner, refine_seed, rollout_episodes
from worldloop.diagnostics.reality import RealityCheck
from worldloop.rl.rollout import collect
from worldloop.diagnostics.monitor import train_watched
from worldloop.rl.summary import results_table
from worldloop.worldmodel.configuration import WorldModelConfig
from worldloop.worldmodel.rollout import WorldModel

TASK = "reach-top-right"
CLIPS = WorldModelConfig(batch_size=4, clip_stride=4, sampling_steps=1)


@pytest.fixture(scope="module")
def vae():
    return tiny_vae()


def refiner_for(vae, folder, steps: int = 10, per_task: int = 4, ema_decay: float = 0.5) -> WorldModelRefiner:
    torch.manual_seed(1)
    world_model = WorldModel.build(CLIPS, vae, 32, 2, device="cpu")
    rl = RLConfig(refine_every=1, refine_episodes_per_task=per_task, refine_steps=steps)
    known = square_episodes(2, seed=1, length=24)  # the scenes it knew: another world of the same size
    return WorldModelRefiner(world_model, ToyEnv(per_task, max_steps=32), [TASK], known, rl, CLIPS, folder, seed=0, lr=1e-3, ema_decay=ema_decay)


def test_rollout_episodes_pair_each_frame_with_the_action_taken_from_it():
    torch.manual_seed(0)
    env = ToyEnv(16, max_steps=32, speed=0.3)  # fast: some episodes end early
    first = env.reset([TASK] * 16, list(range(16)))
    rollout = collect(ToyPolicy(), env, first, keep_frames=True)
    episodes = rollout_episodes(first, rollout)
    lengths = rollout.elapsed.tolist()
    assert [len(e.actions) for e in episodes] == [len(e.frames) for e in episodes] == lengths and min(lengths) < max(lengths)
    for i, episode in enumerate(episodes):
        assert torch.equal(torch.as_tensor(episode.frames[0]), first.frames[i])
        assert torch.equal(torch.as_tensor(episode.frames[1:]), rollout.frames[i, : lengths[i] - 1])  # the frame after action t - 1
        assert torch.equal(torch.as_tensor(episode.actions), rollout.actions[i].flatten(0, 1)[: lengths[i]])
    with pytest.raises(ValueError, match="keep_frames"):
        rollout_episodes(first, collect(ToyPolicy(), env, env.reset([TASK] * 16, list(range(16)))))


def test_refinement_seeds_stay_apart_from_evaluation_and_collection_seeds():
    from worldloop.rl.evaluate import eval_seed
    from worldloop.sims.tasks import ALL_TASKS

    offset = 2**31
    evaluation = {eval_seed(task, e, offset) for task in ALL_TASKS for e in range(1000)}
    refinement = {refine_seed(position, e, offset) for position in range(10) for e in (0, 1, 99_999)}
    assert len(refinement) == 30 and not refinement & evaluation and min(refinement) >= offset
    with pytest.raises(ValueError, match="at most"):
        refine_seed(0, 100_000, offset)


def test_a_round_teaches_the_world_model_the_policys_rollouts_and_a_resumed_run_rebuilds_it(vae, tmp_path):
    refiner = refiner_for(vae, tmp_path, steps=15)
    before = [p.detach().clone() for p in refiner.world_model.dit.parameters()]
    torch.manual_seed(2)
    metrics = refiner(ToyPolicy(), 1)
    # its loss on the new clips, on the same noise, falls
    assert metrics["world_model/refine_loss_new_after"] < metrics["world_model/refine_loss_new_before"], metrics
    assert 0.0 <= metrics["world_model/refine_real_success"] <= 1.0 and metrics["world_model/refine_real_episodes"] == 4
    assert metrics["world_model/refine_clips"] > 0 and math.isfinite(metrics["world_model/refine_loss"])
    # the imagined environment's DiT now holds the refined weights' moving average, not the last step's weights
    after = list(refiner.world_model.dit.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.equal(a, b) for a, b in zip(after, refiner.ema.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(after, refiner.master.parameters()))
    assert (tmp_path / "refine" / "round_000001.safetensors").is_file()

    # a resumed run: the checkpoint gives the weights, restore() the rounds up to the checkpoint's iteration
    resumed = refiner_for(vae, tmp_path)
    resumed.master.load_state_dict(refiner.master.state_dict())
    resumed.ema.load_state_dict(refiner.ema.state_dict())
    resumed.restore(0)
    assert resumed.rounds == []
    resumed.restore(1)
    assert len(resumed.rounds) == 1 and torch.equal(resumed.rounds[0]["latents"], refiner.rounds[0]["latents"])
    assert all(torch.equal(a, b) for a, b in zip(resumed.world_model.dit.parameters(), refiner.ema.parameters()))


def test_without_averaging_the_last_steps_weights_are_used(vae, tmp_path):
    refiner = refiner_for(vae, tmp_path, steps=3, ema_decay=0.0)
    torch.manual_seed(2)
    refiner(ToyPolicy(), 1)
    assert all(torch.equal(a, b) for a, b in zip(refiner.world_model.dit.parameters(), refiner.master.parameters()))
    with pytest.raises(ValueError, match="ema_decay must lie in"):
        refiner_for(vae, tmp_path / "bad", steps=1, ema_decay=1.0)


def test_each_round_chooses_the_judges_threshold_again_and_a_resumed_run_takes_it_back(vae, tmp_path):
    """rl.judge_threshold=replay with refinement: after a round, the calibration's real episodes are replayed in the
    world model as it now is and the threshold chosen again (here the judge's world model is the toy's, which the
    round does not change, so the choice is the calibration's own); the choice is saved, and restored on resume."""
    torch.manual_seed(0)
    judge = ToyJudge(threshold=1e-3)
    env = ImaginedEnv(ToyWorldModel(), judge, make_pool(32, 3), 32, 1, max_steps=16, kir_ratio=0.0)
    check = RealityCheck(ToyEnv(32), [TASK], 32, imagined_env=env, seeds=[5000 + e for e in range(32)])
    with pytest.raises(ValueError, match="episodes of an earlier calibrate_judge"):
        check.recalibrate_judge()
    calibrated = check.calibrate_judge(ToyPolicy(), 1.0)["threshold"]
    assert calibrated > 0.1 and 0 < float(check.labelled.success_once.float().mean()) < 1

    refiner = refiner_for(vae, tmp_path, steps=2)
    refiner.judge_check = check
    judge.threshold = 1e-3
    metrics = refiner(ToyPolicy(), 1)
    assert metrics["world_model/judge_threshold"] == judge.threshold == calibrated and metrics["world_model/judge_replay_kappa"] > 0.2
    saved = json.loads((tmp_path / "refine" / "judge_000001.json").read_text())
    assert saved["threshold"] == calibrated and saved["previous"] == 1e-3
    table = results_table([], [metrics | {"iteration": 1}])
    assert "judge threshold (kappa) |" in table and f"| {calibrated:.3f} ({metrics['world_model/judge_replay_kappa']:.2f}) |" in table, table

    judge.threshold = 0.5
    resumed = refiner_for(vae, tmp_path)
    resumed.judge_check = check
    resumed.restore(0)  # before the round: the threshold it had
    assert judge.threshold == 0.5
    resumed.restore(1)
    assert judge.threshold == calibrated


def test_refining_rl_resumes_exactly(vae, tmp_path):
    def run(folder, iterations, refine_every=1):
        torch.manual_seed(0)
        policy = ToyPolicy()
        refiner = refiner_for(vae, folder, steps=3)
        rl = RLConfig(iterations=iterations, group_size=4, num_groups=2, max_steps=16, lr=3e-3, train_temperature=1.0, checkpoint_every=1,
                      refine_every=refine_every, refine_episodes_per_task=4, refine_steps=3)  # fmt: skip
        env = ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(32, 3), 8, 4, max_steps=16, kir_ratio=0.3)
        return train_watched(policy, env, rl, folder, seed=3, refiner=refiner, console=False), refiner

    straight, straight_refiner = run(tmp_path / "a", 2)
    run(tmp_path / "b", 1)
    resumed, resumed_refiner = run(tmp_path / "b", 2)
    assert [h["iteration"] for h in straight["history"]] == [1, 2]
    for name in ("world_model/refine_loss", "world_model/refine_loss_new_before", "world_model/refine_real_success", "env/success_once"):
        assert resumed["history"][1][name] == straight["history"][1][name], name
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.master.parameters(), resumed_refiner.master.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.ema.parameters(), resumed_refiner.ema.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.world_model.dit.parameters(), resumed_refiner.world_model.dit.parameters()))
    assert resumed["history"][1]["world_model/refine_real_episodes"] == 8  # two rounds of 4
    saved = WorldModel.from_pretrained(tmp_path / "a" / "world_model", device="cpu")  # the refined model, for eval-wm or the next run
    assert all(torch.equal(a, b) for a, b in zip(saved.dit.parameters(), straight_refiner.ema.parameters()))
    table = (tmp_path / "a" / "results.md").read_text()
    assert "World-model refinement" in table and table.count("\n| 1 | 4 |") == 1 and table.count("\n| 2 | 8 |") == 1, table
    # resumed without the refinement, the run would go on in the unrefined world model: refused
    with pytest.raises(ValueError, match="resume it with the same rl.refine_"):
        run(tmp_path / "b", 3, refine_every=0)
    # and a run that never refined, resumed with refinement, is refused too: its checkpoint has no refined world model
    run(tmp_path / "c", 1, refine_every=0)
    with pytest.raises(FileNotFoundError, match="no weights for 'world_model'"):
        run(tmp_path / "c", 2)
