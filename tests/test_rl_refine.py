"""Refining the world model on the policy's real rollouts during RL: the episodes, one round, resume, a user's own world model."""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _rl_fixtures import ToyPolicy
from _worldmodel_fixtures import square_episodes, tiny_vae
from test_rl_env import make_pool

from worldloop.envs.imagined import ImaginedEnv
from worldloop.envs.toy import ToyEnv, ToyJudge, ToyWorldModel
from worldloop.rl.configuration import RLConfig, RLRefineConfig
from worldloop.rl.evaluate import EVAL_SEED_OFFSET
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
    rl = RLConfig(refine=RLRefineConfig(every=1, episodes_per_task=per_task, steps=steps))
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
    assert all(torch.equal(a, b) for a, b in zip(after, refiner.state.ema.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(after, refiner.state.master.parameters()))
    assert (tmp_path / "refine" / "round_000001.safetensors").is_file()

    # a resumed run: the checkpoint gives the weights, restore() the rounds up to the checkpoint's iteration
    resumed = refiner_for(vae, tmp_path)
    resumed.state.master.load_state_dict(refiner.state.master.state_dict())
    resumed.state.ema.load_state_dict(refiner.state.ema.state_dict())
    resumed.restore(0)
    assert resumed.rounds == []
    resumed.restore(1)
    assert len(resumed.rounds) == 1 and torch.equal(resumed.rounds[0]["latents"], refiner.rounds[0]["latents"])
    assert all(torch.equal(a, b) for a, b in zip(resumed.world_model.dit.parameters(), refiner.state.ema.parameters()))


def test_without_averaging_the_last_steps_weights_are_used(vae, tmp_path):
    refiner = refiner_for(vae, tmp_path, steps=3, ema_decay=0.0)
    torch.manual_seed(2)
    refiner(ToyPolicy(), 1)
    assert all(torch.equal(a, b) for a, b in zip(refiner.world_model.dit.parameters(), refiner.state.master.parameters()))
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
                      refine=RLRefineConfig(every=refine_every, episodes_per_task=4, steps=3))  # fmt: skip
        env = ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(32, 3), 8, 4, max_steps=16, kir_ratio=0.3)
        return train_watched(policy, env, rl, folder, seed=3, refiner=refiner, console=False), refiner

    straight, straight_refiner = run(tmp_path / "a", 2)
    run(tmp_path / "b", 1)
    resumed, resumed_refiner = run(tmp_path / "b", 2)
    assert [h["iteration"] for h in straight["history"]] == [1, 2]
    for name in ("world_model/refine_loss", "world_model/refine_loss_new_before", "world_model/refine_real_success", "env/success_once"):
        assert resumed["history"][1][name] == straight["history"][1][name], name
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.state.master.parameters(), resumed_refiner.state.master.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.state.ema.parameters(), resumed_refiner.state.ema.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(straight_refiner.world_model.dit.parameters(), resumed_refiner.world_model.dit.parameters()))
    assert resumed["history"][1]["world_model/refine_real_episodes"] == 8  # two rounds of 4
    saved = WorldModel.from_pretrained(tmp_path / "a" / "world_model", device="cpu")  # the refined model, for eval-wm or the next run
    assert all(torch.equal(a, b) for a, b in zip(saved.dit.parameters(), straight_refiner.state.ema.parameters()))
    table = (tmp_path / "a" / "results.md").read_text()
    assert "World-model refinement" in table and table.count("\n| 1 | 4 |") == 1 and table.count("\n| 2 | 8 |") == 1, table
    # resumed without the refinement, the run would go on in the unrefined world model: refused
    with pytest.raises(ValueError, match="resume it with the same rl.refine_"):
        run(tmp_path / "b", 3, refine_every=0)
    # and a run that never refined, resumed with refinement, is refused too: its checkpoint has no refined world model
    run(tmp_path / "c", 1, refine_every=0)
    with pytest.raises(FileNotFoundError, match="no weights for 'world_model'"):
        run(tmp_path / "c", 2)


@dataclass
class BrightnessRefinement:
    """What the brightness model's refinement trains: its own weights, with Adam."""

    modules: dict
    stateful: dict


class BrightnessWorldModel:
    """A world model of a user's own (not worldloop's): the next frame is the current one times a learnable brightness
    plus a learnable shift, whatever the action. It implements the world-model protocol, the refinement methods
    included, and records what refinement hands it."""

    image_size, chunk_size, action_dim = 32, 4, 2
    kind = "brightness_wm"

    def __init__(self, brightness: float, shift: float, device="cpu"):
        self.device = torch.device(device)
        self.weights = torch.nn.ParameterDict({"brightness": torch.nn.Parameter(torch.tensor(brightness)), "shift": torch.nn.Parameter(torch.tensor(shift))})
        self.examples_of: list[list] = []  # the episodes each refine_examples call got
        self.batches: list[dict] = []  # the batch of each refine_step call
        self.frames: torch.Tensor | None = None

    @classmethod
    def from_pretrained(cls, folder, device, **sampling):
        saved = json.loads((Path(folder) / "config.json").read_text())
        return cls(saved["brightness"], saved["shift"], device)

    def predict(self, frames: torch.Tensor) -> torch.Tensor:
        """(N, H, W, 3) uint8 -> the next frames in [0, 1]."""
        return frames.float() / 255 * self.weights["brightness"] + self.weights["shift"]

    def loss(self, examples: dict) -> torch.Tensor:
        return (self.predict(examples["frames"]) - examples["next"].float() / 255).pow(2).mean()

    def reset(self, first_frames, memory_frames=None, seeds=None, memory_actions=None) -> None:
        self.frames = first_frames if memory_frames is None else memory_frames[:, -1]

    @torch.no_grad()
    def step(self, action_chunks: torch.Tensor) -> torch.Tensor:
        frames = []
        for _ in range(self.chunk_size):
            self.frames = (self.predict(self.frames).clamp(0, 1) * 255).round().to(torch.uint8)
            frames.append(self.frames)
        return torch.stack(frames, dim=1)

    def start_refinement(self, config, lr: float, ema_decay: float) -> BrightnessRefinement:
        optimizer = torch.optim.Adam(self.weights.parameters(), lr=lr)
        return BrightnessRefinement({"world_model": self.weights}, {"world_model_optimizer": optimizer})

    def refine_examples(self, episodes, state, seed: int) -> dict:
        episodes = list(episodes)
        self.examples_of.append(episodes)
        return brightness_examples(episodes)

    def refine_step(self, batch: dict, state: BrightnessRefinement, generator) -> float:
        self.batches.append(batch)
        loss = self.loss(batch)
        state.stateful["world_model_optimizer"].zero_grad()
        loss.backward()
        state.stateful["world_model_optimizer"].step()
        return float(loss.detach())

    @torch.no_grad()
    def refine_loss(self, examples: dict, state, generator) -> float:
        return float(self.loss(examples))

    def use_refined(self, state) -> None:
        """It imagines with the very weights refinement trains."""

    def save_refined(self, folder, state) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        saved = {"kind": self.kind, "brightness": self.weights["brightness"].item(), "shift": self.weights["shift"].item()}
        (folder / "config.json").write_text(json.dumps(saved))
        return folder


def brightness_examples(episodes) -> dict:
    """Every (frame, next frame) pair of ``episodes``."""
    return {"frames": torch.as_tensor(np.concatenate([e.frames[:-1] for e in episodes])),
            "next": torch.as_tensor(np.concatenate([e.frames[1:] for e in episodes]))}  # fmt: skip


def test_a_users_own_world_model_registered_by_name_is_refined_through_its_refine_methods(tmp_path, monkeypatch):
    """A world model of the user's own, registered as the registry says and loaded by its folder's kind, is refined on
    the policy's real episodes through the protocol's refinement methods: refine_examples gets those episodes,
    refine_step trains its weights on batches of their examples, its loss on them falls, and the refined model saves
    to a folder that loads again by its kind."""
    from worldloop.commands.shared import load_world_model
    from worldloop.config import load_config
    from worldloop.utils.registry import WORLD_MODELS

    monkeypatch.setattr(WORLD_MODELS, "_entries", dict(WORLD_MODELS._entries))  # the registration ends with the test
    WORLD_MODELS.register(BrightnessWorldModel.kind)(BrightnessWorldModel)
    folder = tmp_path / "wm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"kind": BrightnessWorldModel.kind, "brightness": 0.5, "shift": 0.1}))
    model = load_world_model(folder, load_config("tiny-cpu"), [], torch.device("cpu"))
    assert isinstance(model, BrightnessWorldModel)

    rl = RLConfig(refine=RLRefineConfig(every=1, episodes_per_task=4, steps=20))
    known = square_episodes(2, seed=1, length=24)  # the scenes it knew
    refiner = WorldModelRefiner(model, ToyEnv(4, max_steps=32), [TASK], known, rl, WorldModelConfig(batch_size=8), tmp_path / "rl", lr=0.05)
    assert refiner.modules == {"world_model": model.weights}  # what RL's checkpoints keep
    torch.manual_seed(0)
    metrics = refiner(ToyPolicy(), 1)

    # refine_examples got the round's real episodes (then the dataset's), each from its refinement seed's initial state
    real, dataset = model.examples_of
    first_frames = ToyEnv(4).reset([TASK] * 4, [refine_seed(0, e, EVAL_SEED_OFFSET) for e in range(4)]).frames
    assert len(real) == metrics["world_model/refine_real_episodes"] == 4 and dataset == known
    for episode, first in zip(real, first_frames):
        assert torch.equal(torch.as_tensor(episode.frames[0]), first) and len(episode.frames) == len(episode.actions) > model.chunk_size
    # refine_step trained on batches of world_model.batch_size examples, half the real episodes' and half the dataset's
    examples = brightness_examples(real)
    assert len(model.batches) == rl.refine.steps and all(len(batch["frames"]) == 8 for batch in model.batches)
    pairs = {(bytes(f.numpy()), bytes(n.numpy())) for f, n in zip(examples["frames"], examples["next"])}
    assert sum((bytes(f.numpy()), bytes(n.numpy())) in pairs for f, n in zip(model.batches[0]["frames"], model.batches[0]["next"])) == 4
    # its weights moved, and its loss on the real episodes fell
    assert model.weights["brightness"].item() != 0.5 and model.weights["shift"].item() != 0.1
    with torch.no_grad():
        refined, untrained = float(model.loss(examples)), float(BrightnessWorldModel(0.5, 0.1).loss(examples))
    assert refined < 0.8 * untrained
    assert metrics["world_model/refine_loss_new_after"] < metrics["world_model/refine_loss_new_before"] == pytest.approx(untrained)
    assert metrics["world_model/refine_clips"] == len(examples["frames"]) and (tmp_path / "rl" / "refine" / "round_000001.safetensors").is_file()

    refiner.save(tmp_path / "refined")
    again = load_world_model(tmp_path / "refined", load_config("tiny-cpu"), [], torch.device("cpu"))
    assert again.weights["brightness"].item() == pytest.approx(model.weights["brightness"].item())

