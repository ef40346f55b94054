"""World-model training at tiny size: action conditioning is learned, resume is exact, errors are clear."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import json
import math
import re
import shutil

import pytest
import torch

from _worldmodel_fixtures import square_episodes, tiny_vae
from worldloop.utils.checkpoint import latest_checkpoint
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
from worldloop.worldmodel.evaluate import evaluate_world_model, paired_change
from worldloop.worldmodel.rollout import sample_future
from worldloop.worldmodel.train_dit import steps_trained, train_world_model
from worldloop.worldmodel.train_vae import train_vae

CPU = torch.device("cpu")


def fast_config(**changes) -> WorldModelConfig:
    base = dict(steps=6, batch_size=4, lr=1e-3, checkpoint_every=1000, sampling_steps=2, clip_stride=4)
    return WorldModelConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def vae():
    return tiny_vae()


def bump_clips(count: int, generator: torch.Generator, channels: int = 8, grid: int = 4):
    """Latent clips where the actions move a bump: each future latent frame's bump is the previous
    one moved one cell by the sign of its 4 actions (x, y); the context actions are zero."""
    def bump(position):  # (M, 2) -> (M, C, grid, grid)
        image = torch.full((len(position), channels, grid, grid), -0.5)
        image[torch.arange(len(position)), :, position[:, 0], position[:, 1]] = 2.0
        return image

    reference = torch.randint(0, grid, (count, 2), generator=generator)
    memory = torch.randint(0, grid, (count, 2), generator=generator)
    directions = torch.randint(0, 2, (count, 2, 2), generator=generator) * 2 - 1  # per future frame
    first = (memory + directions[:, 0]).clamp(0, grid - 1)
    second = (first + directions[:, 1]).clamp(0, grid - 1)
    latents = torch.stack([bump(reference), bump(memory), bump(first), bump(second)], dim=2)
    actions = torch.zeros(count, 13, 2)
    actions[:, 5:9] = directions[:, 0, None].float()
    actions[:, 9:13] = directions[:, 1, None].float()
    return {"latents": latents, "actions": actions}, second


def test_action_conditioning_is_learned(vae, tmp_path, monkeypatch):
    """After a short training on clips where actions determine motion: two different action chunks
    from the same context and the same noise give different predictions, and the true actions
    explain the future better than the opposite ones."""
    generator = torch.Generator().manual_seed(0)
    clips, _ = bump_clips(512, generator)
    monkeypatch.setattr("worldloop.worldmodel.flow_matching.CONTEXT_NOISE", 0.0)  # clean context: the actions alone explain the motion
    config = fast_config(steps=600, batch_size=32, lr=3e-3, ema_decay=0.9, shift=1.0, sampling_steps=5)
    model = train_world_model(config, [], vae, tmp_path / "wm", CPU, clips=clips)
    context = clips["latents"][:4, :, :2]
    chunks = torch.zeros(2, 4, 13, 2)
    chunks[0, :, 5:], chunks[1, :, 5:] = 1.0, -1.0  # down-right vs up-left
    noise = torch.randn(4, 8, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    first, second = (sample_future(model.dit, context, model.normalise(c), noise, model.sigmas) for c in chunks)
    assert (first - second).abs().mean() > 0.03
    # velocity error on the training distribution with the recorded vs the opposite actions
    latents, actions = clips["latents"][:256], model.normalise(clips["actions"][:256])
    future = latents[:, :, 2:]
    eps = torch.randn(future.shape, generator=torch.Generator().manual_seed(2))
    sigmas = torch.tensor([0.0, 0.0, 0.7, 0.7]).expand(256, -1)
    noisy = torch.cat([latents[:, :, :2], 0.3 * future + 0.7 * eps], dim=2)
    with torch.no_grad():
        errors = [(model.dit(noisy, sigmas, a)[:, :, 2:] - (eps - future)).pow(2).mean() for a in (actions, -actions)]
    assert errors[0] < 0.97 * errors[1], f"recorded actions {errors[0]:.4f} vs opposite {errors[1]:.4f}"


def test_resume_is_exact_and_resolution_is_checked(vae, tmp_path):
    episodes = square_episodes(4, seed=1, length=16)
    straight = train_world_model(fast_config(steps=4, checkpoint_every=2), episodes, vae, tmp_path / "b", CPU)
    # simulate a crash after step 2: drop the final checkpoint, then rerun the same command
    checkpoints = tmp_path / "b" / "checkpoints"
    shutil.rmtree(checkpoints / "step_000000004")
    (checkpoints / "latest").unlink()
    assert latest_checkpoint(tmp_path / "b").name == "step_000000002"
    resumed = train_world_model(fast_config(steps=4, checkpoint_every=2), episodes, vae, tmp_path / "b", CPU)
    for (name, p), q in zip(straight.dit.state_dict().items(), resumed.dit.state_dict().values()):
        assert torch.equal(p, q), name
    assert json.loads((tmp_path / "b" / "results.json").read_text())["steps"] == 4
    bigger = square_episodes(4, seed=1, length=16, size=64)
    with pytest.raises(ValueError, match=r"differs in \['image_size', 'latent_shape'\]"):
        train_world_model(fast_config(steps=6), bigger, vae, tmp_path / "b", CPU)


def test_self_forcing_trains_on_the_models_own_memory(vae, tmp_path):
    """Self-forcing starts at SELF_FORCING_AFTER of the budget (3 of 10 steps) and only touches clips that have a
    predecessor one chunk earlier; ready-made clips without that link are refused by name."""
    from worldloop.worldmodel.train_dit import SELF_FORCING_AFTER

    episodes = square_episodes(3, seed=4, length=32)
    assert SELF_FORCING_AFTER == 0.3
    train_world_model(fast_config(steps=10, clip_stride=2, self_forcing=1.0), episodes, vae, tmp_path / "sf", CPU)
    assert json.loads((tmp_path / "sf" / "results.json").read_text())["self_forced_clips_this_run"] == 7 * 4  # steps 4-10, 4 clips each
    train_world_model(fast_config(steps=8, clip_stride=2, self_forcing=1.0), episodes, vae, tmp_path / "late", CPU, self_forcing_after=1.0)
    assert json.loads((tmp_path / "late" / "results.json").read_text())["self_forced_clips_this_run"] == 0
    with pytest.raises(ValueError, match="previous"):
        train_world_model(fast_config(self_forcing=0.5), [], vae, tmp_path / "bump", CPU, clips=bump_clips(8, torch.Generator().manual_seed(0))[0])


def test_self_forced_memory_is_sampled_from_the_clip_one_chunk_earlier(vae, tmp_path, monkeypatch):
    """A self-forced memory is one sample from the real context of the clip one chunk earlier, driven by that
    clip's actions: what a rollout's second chunk sees."""
    from worldloop.worldmodel import train_dit as train_lib

    # A fake sampler that adds its clip's marker action to the memory, so a result names its whole path.
    monkeypatch.setattr(train_lib, "sample_future", lambda dit, context, actions, noise, sigmas: (context[:, :, 1:] + actions[:, 5, 0].view(-1, 1, 1, 1, 1)).expand(-1, -1, 2, -1, -1))
    previous = torch.tensor([-1, 0, 1, 2, 3, 4, -1, 6])  # episodes of clips 0-5 and 6-7
    latents = torch.zeros(8, 1, 4, 1, 1)
    latents[:, 0, 1] = 100 * torch.arange(8.0).view(-1, 1, 1)  # clip i's real memory: 100 i
    actions = torch.zeros(8, 13, 1)
    actions[:, 5, 0] = 2.0 ** torch.arange(8.0)  # clip i's marker: 2^i

    result = train_lib.self_forced_memory(None, latents, actions, previous, torch.tensor([5, 1, 7]), torch.zeros(2), torch.Generator().manual_seed(0))
    assert result.flatten().tolist() == [400 + 16, 0 + 1, 600 + 64]  # clip 4's memory and marker; clip 0's; clip 6's


def test_train_vae_writes_a_loadable_folder_and_metrics(tmp_path):
    episodes = square_episodes(3, seed=2, length=12)
    metrics = train_vae(VAEConfig(steps=2, batch_size=2), episodes[:2], episodes[2:], tmp_path / "vae", CPU)
    saved = json.loads((tmp_path / "vae" / "metrics.json").read_text())
    assert saved["steps"] == 2 and 0 < saved["held_out"]["psnr"] < 100 and -1 <= saved["held_out"]["ssim"] <= 1
    assert 0 < saved["held_out"]["psnr_moving"] < 100  # the squares move: some pixels leave the first frame's colour
    # held-out PSNR at each tenth of the budget that a step crossed: 2 steps of 2 are halves 5/10 and 10/10
    assert [p["step"] for p in saved["held_out_curve"]] == [1, 2] and all(0 < p["psnr"] < 100 for p in saved["held_out_curve"])
    loaded = vae_lib.load_vae(tmp_path / "vae")
    assert len(loaded.config.latents_mean) == loaded.config.z_dim == metrics["latent_channels"]
    assert saved["image_size"] == 32  # the frames it learned, which train-wm checks its data against
    from worldloop.commands.train_vae import describe

    line = describe(saved)
    assert line.startswith("2 steps, ") and f"PSNR {saved['held_out']['psnr']:.2f} dB" in line and f"on {saved['held_out']['clips']} held-out clips" in line
    with pytest.raises(FileNotFoundError):
        vae_lib.load_vae(tmp_path / "missing")


def test_train_vae_continues_from_an_earlier_vae_with_init(tmp_path, monkeypatch):
    """vae.init: training starts from an earlier train-vae's weights (a VAE grows over several runs), not from a
    fresh initialisation; its latent statistics are measured again; with 0 steps it is taken as it is, statistics too;
    0 steps without init is refused."""
    from worldloop.config import ConfigError, load_config

    episodes = square_episodes(3, seed=2, length=12)
    skip_vae_measurements(monkeypatch)  # the earlier VAE only gives its weights: its statistics are constants
    train_vae(VAEConfig(steps=3, batch_size=2), episodes[:2], episodes[2:], tmp_path / "a", CPU)
    monkeypatch.undo()  # the continued one measures its own
    earlier = vae_lib.load_vae(tmp_path / "a").state_dict()
    fresh = vae_lib.build_vae(VAEConfig()).state_dict()
    tiny_step = VAEConfig(steps=1, batch_size=2, lr=1e-12, init=str(tmp_path / "a"))
    metrics = train_vae(tiny_step, episodes[:2], episodes[2:], tmp_path / "b", CPU, seed=5)
    continued = vae_lib.load_vae(tmp_path / "b")
    assert metrics["steps"] == 1
    for name, value in continued.state_dict().items():
        assert torch.allclose(value, earlier[name], atol=1e-6), name
    assert any(not torch.allclose(value, fresh[name]) for name, value in continued.state_dict().items())
    assert len(continued.config.latents_mean) == continued.config.z_dim
    with pytest.raises(FileNotFoundError, match="no config.json"):
        train_vae(VAEConfig(steps=1, init=str(tmp_path / "missing")), episodes[:2], episodes[2:], tmp_path / "c", CPU)
    as_is = train_vae(VAEConfig(steps=0, init=str(tmp_path / "b")), episodes[:2], episodes[2:], tmp_path / "d", CPU)
    taken = vae_lib.load_vae(tmp_path / "d")
    assert as_is["steps"] == 0 and as_is["image_size"] is None and taken.config.latents_mean == continued.config.latents_mean
    for name, value in taken.state_dict().items():
        assert torch.equal(value, continued.state_dict()[name]), name
    with pytest.raises(ConfigError, match="or 0 with init"):
        load_config("tiny-cpu", ["vae.steps=0"])


def skip_vae_measurements(monkeypatch):
    """train_vae's latent statistics and held-out metrics, replaced by constants (tests that only look at weights)."""
    from worldloop.worldmodel import train_vae as train_lib

    monkeypatch.setattr(train_lib, "latent_statistics", lambda vae, *a, **k: ([0.0] * vae.config.z_dim, [1.0] * vae.config.z_dim))
    monkeypatch.setattr(train_lib, "reconstruction_metrics", lambda *a, **k: {"psnr": 0.0, "ssim": 0.0})


def test_train_vae_resumes_exactly_from_a_checkpoint(tmp_path, monkeypatch):
    """A VAE run cut after its step-2 checkpoint and resumed ends with the weights of the uninterrupted run
    (the clips are drawn on the device from the checkpointed generator)."""
    skip_vae_measurements(monkeypatch)
    episodes = square_episodes(3, seed=2, length=12)
    config = VAEConfig(steps=3, batch_size=2, checkpoint_every=2)
    train_vae(config, episodes[:2], episodes[2:], tmp_path / "run", CPU)
    whole = vae_lib.load_vae(tmp_path / "run").state_dict()
    assert any(not torch.allclose(value, vae_lib.build_vae(config).state_dict()[name]) for name, value in whole.items())
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000000003")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000000002\n")
    train_vae(config, episodes[:2], episodes[2:], tmp_path / "run", CPU)
    for name, value in vae_lib.load_vae(tmp_path / "run").state_dict().items():
        assert torch.allclose(value, whole[name], atol=1e-6), name


def test_bench_vae_train_times_the_real_training_loop(tmp_path, monkeypatch):
    """`bench vae-train` runs train_vae itself: a warm-up, then a long and a short run; FLOPs counted, no peak on a CPU."""
    from worldloop.cli import main
    from worldloop.worldmodel import train_vae as train_lib

    calls, real = [], train_lib.train_vae

    def recorded(config, *args, **kwargs):
        calls.append(config.steps)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(train_lib, "train_vae", recorded)
    skip_vae_measurements(monkeypatch)  # fixed costs the bench subtracts; skipped here for time
    monkeypatch.setattr(train_lib, "VAE_CLIP_FRAMES", 5)  # short clips, for time
    overrides = ["sim.image_size=64", "vae.batch_size=1"]
    assert main(["bench", "vae-train", "--steps", "2", "--out", str(tmp_path / "bench.txt"), *overrides]) == 0
    assert calls == [2, 2, 1]
    (row,) = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert row["steps_per_s"] > 0 and row["tflops"] > 0 and row["mfu"] is None and row["gpu_busy"] is None
    assert "GPU busy" in (tmp_path / "bench.txt").read_text() and row["compiled"] is False  # compiled on a GPU only


def test_a_compiled_vae_forward_trains_the_same_weights(tmp_path, monkeypatch):
    """train_vae(compile_forward=True) steps through torch.compile(vae_forward); the forward it compiles is the eager
    one, so (here with compilation replaced by the function itself) the weights come out the same."""
    from worldloop.worldmodel import train_vae as train_lib

    skip_vae_measurements(monkeypatch)
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compiled.append(function) or function)
    episodes = square_episodes(3, seed=2, length=16)
    for name, flag in (("eager", False), ("compiled", True)):
        train_vae(VAEConfig(steps=2, batch_size=2), episodes[:2], episodes[2:], tmp_path / name, CPU, compile_forward=flag)
    assert compiled == [train_lib.vae_forward]
    eager, through = vae_lib.load_vae(tmp_path / "eager").state_dict(), vae_lib.load_vae(tmp_path / "compiled").state_dict()
    assert all(torch.equal(through[name], value) for name, value in eager.items())
    torch.manual_seed(0)  # train_vae's initialisation (seed 0): the two steps moved it, so the comparison above can fail
    initial = vae_lib.build_vae(VAEConfig()).state_dict()
    assert not all(torch.equal(value, initial[name]) for name, value in eager.items())


def test_evaluate_writes_metrics_and_strips(vae, tmp_path):
    from worldloop.worldmodel.rollout import WorldModel

    model = WorldModel.build(fast_config(), vae, 32, 2, device="cpu")
    episodes = square_episodes(2, seed=3, length=20)
    metrics = evaluate_world_model(model, episodes, [8, 16, 64], tmp_path / "eval", videos=1)
    assert sorted(metrics["horizons"]) == ["16", "8"] and metrics["skipped_horizons"] == [64]
    row = metrics["horizons"]["8"]
    assert row["episodes"] == 2 and row["copy_last_frame_psnr"] > 0 and metrics["lpips"].startswith("unavailable")
    assert row["action_delta_psnr"] == pytest.approx(row["psnr"] - row["psnr_other_actions"])  # the other-actions replay ran
    assert (tmp_path / "eval" / "episode_00_strip.png").is_file() and (tmp_path / "eval" / "episode_00_real_vs_generated.mp4").is_file()
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["rollout_frames_per_second"] > 0
    assert metrics["per_task"] == {}  # the square episodes are one task
    assert 0 < row["vae_psnr"] < 100 and row["vae_psnr"] != row["psnr"]  # the VAE's own ceiling, beside the model
    # every episode's own numbers, for paired comparisons; equal lengths: their mean is the pooled row's
    per_episode = metrics["per_episode"]
    assert [e["episode"] for e in per_episode] == [0, 1] and sorted(per_episode[0]["psnr"]) == ["16", "8"]  # no dataset index: the position
    assert sum(e["psnr"]["8"] for e in per_episode) / 2 == pytest.approx(row["psnr"], rel=1e-5)
    assert sum(e["copy_last_frame_psnr"]["8"] for e in per_episode) / 2 == pytest.approx(row["copy_last_frame_psnr"], rel=1e-5)
    assert sum(e["psnr_other_actions"]["8"] for e in per_episode) / 2 == pytest.approx(row["psnr_other_actions"], rel=1e-5)
    from worldloop.worldmodel.evaluate import describe

    lines = describe(metrics)  # what eval-wm prints: each horizon beside copy-last-frame, the skipped, the speed
    margin = row["psnr"] - row["copy_last_frame_psnr"]
    assert lines[0] == (f"8 frames: PSNR {row['psnr']:.2f} dB, copy-last-frame {row['copy_last_frame_psnr']:.2f} (margin {margin:+.2f} ± "
                        f"{row['psnr_margin_stderr']:.2f}); SSIM {row['ssim']:.3f} vs {row['copy_last_frame_ssim']:.3f} (n=2 episodes)")  # fmt: skip
    assert lines[2] == "horizons [64] skipped: longer than every held-out episode" and len(lines) == 4
    # paired against itself: no change, at every horizon, over both episodes
    same = paired_change(metrics, metrics, "action_delta_psnr")
    assert sorted(same) == ["16", "8"] and same["8"] == {"change": 0.0, "stderr": 0.0, "episodes": 2}


def test_the_vae_alone_encodes_each_chunk_after_the_frame_before_it(vae):
    from worldloop.worldmodel.evaluate import through_vae
    from worldloop.worldmodel.rollout import WorldModel
    from worldloop.worldmodel.vae import decode, encode

    model = WorldModel.build(fast_config(), vae, 32, 2, device="cpu")
    chunk = model.chunk_size
    frames = torch.stack([torch.as_tensor(e.frames[: 2 + chunk]) for e in square_episodes(3, seed=4, length=20)])  # 1 + chunk + 1
    codec = through_vae(model, frames[:, 0], frames[:, 1:], batch_size=2)
    assert codec.shape == frames[:, 1:].shape and codec.dtype == torch.uint8

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:  # other batch sizes: float rounding, one level at most
        return (a.int() - b.int()).abs().max().item() <= 1

    assert close(codec[:, :chunk], decode(vae, encode(vae, frames[:, : chunk + 1]))[:, 1:])  # the first chunk after frame 0
    # the second chunk starts from real frame `chunk`, then its one frame and the padding (that frame repeated)
    second = torch.cat([frames[:, chunk : chunk + 2], frames[:, -1:].expand(-1, chunk - 1, -1, -1, -1)], dim=1)
    assert close(codec[:, chunk:], decode(vae, encode(vae, second))[:, 1:2])


def test_paired_change_pairs_episodes_by_index():
    """Hand case: episodes matched by their dataset index whatever their order, the change and its paired SE
    over the shared ones; action ΔPSNR from the per-episode curves; metrics without them refused."""

    def metrics(rows):
        return {"horizons": {"8": {}, "32": {}}, "per_episode": [
            {"episode": e, "psnr": {"8": p, **({"32": p} if e != 7 else {})}, "psnr_other_actions": {"8": o, "32": o}} for e, p, o in rows]}

    before = metrics([(3, 20.0, 19.0), (5, 22.0, 21.0), (7, 24.0, 23.0)])
    after = metrics([(7, 25.0, 23.0), (3, 20.5, 19.0), (9, 30.0, 20.0)])  # 5 missing, 9 new: 3 and 7 are shared
    change = paired_change(before, after)
    assert change["8"]["episodes"] == 2 and change["8"]["change"] == pytest.approx(0.75)
    assert change["8"]["stderr"] == pytest.approx(math.sqrt(((0.5 - 0.75) ** 2 + (1.0 - 0.75) ** 2) / 1) / math.sqrt(2))
    assert change["32"]["episodes"] == 1 and change["32"]["change"] == 0.5 and math.isnan(change["32"]["stderr"])  # 7 lacks 32
    assert paired_change(before, after, "action_delta_psnr")["8"]["change"] == pytest.approx(0.75)  # other actions unchanged
    with pytest.raises(ValueError, match="per_episode"):
        paired_change({"horizons": {"8": {}}}, after)
    without_other = {"horizons": {"8": {}}, "per_episode": [{"episode": 0, "psnr": {"8": 1.0}}]}
    with pytest.raises(ValueError, match="psnr_other_actions"):
        paired_change(without_other, without_other, "action_delta_psnr")


def test_horizon_metrics_margin_stderr_is_over_episodes():
    from worldloop.worldmodel.evaluate import horizon_metrics

    # 3 episodes of 4 frames; the model's frames are off by 0, 10 and 20 grey levels, copy-last-frame by 30.
    real = torch.full((3, 4, 16, 16, 3), 100, dtype=torch.uint8)
    generated = real + torch.tensor([0, 10, 20], dtype=torch.uint8).view(3, 1, 1, 1, 1)
    baseline = real + 30
    valid = torch.ones(3, 4, dtype=torch.bool)
    row = horizon_metrics(real, generated, baseline, valid, [4])["4"]
    copy_db = 20 * math.log10(255 / 30)
    exact_db = 100.0  # psnr's ceiling: an exact frame
    margins = torch.tensor([exact_db - copy_db, 20 * math.log10(255 / 10) - copy_db, 20 * math.log10(255 / 20) - copy_db])
    assert row["psnr_margin_stderr"] == pytest.approx(float(margins.std() / math.sqrt(3)), rel=1e-4)
    assert row["ssim_margin_stderr"] >= 0


def test_reconstruct_encodes_and_decodes_each_frame_on_its_own(vae):
    from worldloop.worldmodel.vae import decode, encode, reconstruct

    frames = torch.stack([torch.as_tensor(e.frames[3]) for e in square_episodes(3, seed=5)])
    out = reconstruct(vae, frames)
    assert out.shape == frames.shape and out.dtype == torch.uint8
    # A batch changes nothing but float rounding: convolution kernels may sum in another order for another batch
    # size (seen on one CPU), which moves a pixel by one level at most; a frame mixed with its neighbours moves many.
    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return (a.int() - b.int()).abs().max().item() <= 1

    assert close(out[1:2], decode(vae, encode(vae, frames[1:2, None]))[:, 0])
    assert close(reconstruct(vae, frames[2:]), out[2:])
    assert not close(out[1:2], out[2:3])  # other frames do differ


def test_sharpness_counts_fine_detail_that_psnr_forgives():
    """One bright pixel on black: its 4-neighbour Laplacian sums to 8 (in [0, 1] units) over the 6x6 interior.
    A model that draws the frame exactly is as sharp as it (ratio 1); one that draws flat grey, none (ratio 0)."""
    from worldloop.worldmodel.evaluate import horizon_metrics
    from worldloop.worldmodel.metrics import sharpness

    real = torch.zeros(1, 2, 8, 8, 3, dtype=torch.uint8)
    real[:, :, 4, 4] = 255
    assert sharpness(real)[0].tolist() == pytest.approx([8 / 36, 8 / 36])
    valid = torch.ones(1, 2, dtype=torch.bool)
    assert horizon_metrics(real, real.clone(), real, valid, [2])["2"]["sharpness_ratio"] == pytest.approx(1.0)
    flat = torch.full_like(real, 4)  # PSNR 34 dB against the real frames, and no detail at all
    assert horizon_metrics(real, flat, real, valid, [2])["2"]["sharpness_ratio"] == 0.0


def test_per_task_metrics_separate_a_scene_the_model_renders_badly():
    """Two tasks: the model is exact on one and off by 20 grey levels on the other. Each task's row sees
    only its own episodes; the pooled row averages them; a single task gives no breakdown."""
    from types import SimpleNamespace

    from worldloop.worldmodel.evaluate import horizon_metrics, per_task_metrics

    real = torch.full((4, 4, 16, 16, 3), 100, dtype=torch.uint8)
    generated = real.clone()
    generated[2:] += 20
    baseline, valid = real + 30, torch.ones(4, 4, dtype=torch.bool)
    episodes = [SimpleNamespace(instruction=task) for task in ("open the window", "open the window", "push the puck", "push the puck")]
    rows = per_task_metrics(episodes, real, generated, baseline, valid, [4], other_actions=generated.flip(0))
    assert sorted(rows) == ["open the window", "push the puck"]
    window, puck = rows["open the window"]["4"], rows["push the puck"]["4"]
    assert window["episodes"] == puck["episodes"] == 2
    assert window["psnr"] == pytest.approx(100.0) and puck["psnr"] == pytest.approx(20 * math.log10(255 / 20), rel=1e-4)
    assert window["action_delta_psnr"] > 0 and puck["action_delta_psnr"] < 0  # each driven by the other task's frames
    pooled = horizon_metrics(real, generated, baseline, valid, [4])["4"]
    assert pooled["psnr"] == pytest.approx((window["psnr"] + puck["psnr"]) / 2)
    assert per_task_metrics(episodes[:2], real[:2], generated[:2], baseline[:2], valid[:2], [4]) == {}


def test_psnr_still_sees_a_fading_object_and_ignores_what_moved():
    """A still object (8x8) and a square that moves each frame: erasing the object costs psnr_still
    exactly its share of the still pixels; misplacing the moving square leaves psnr_still exact."""
    from worldloop.worldmodel.evaluate import horizon_metrics

    real = torch.full((1, 4, 32, 32, 3), 30, dtype=torch.uint8)
    real[:, :, 2:10, 2:10] = 200  # the object, never touched
    for t in range(4):
        real[:, t, 20:24, 4 + 4 * t : 8 + 4 * t] = 250  # the square moves 4 pixels a frame
    first = torch.full((32, 32, 3), 30, dtype=torch.uint8)
    first[2:10, 2:10] = 200
    first[20:24, 0:4] = 250  # frame 0: the square one step back
    baseline = first.expand_as(real)
    valid = torch.ones(1, 4, dtype=torch.bool)
    faded = real.clone()
    faded[:, :, 2:10, 2:10] = 30
    misplaced = real.clone()
    misplaced[:, :, 20:24] = 30
    row_faded = horizon_metrics(real, faded, baseline, valid, [4])["4"]
    row_misplaced = horizon_metrics(real, misplaced, baseline, valid, [4])["4"]
    still_pixels = 32 * 32 - 2 * 16  # the square's pixels now and at frame 0 differ from the first frame
    assert row_faded["still_fraction"] == pytest.approx(still_pixels / 1024)
    assert row_faded["psnr_still"] == pytest.approx(10 * math.log10(255**2 * still_pixels / (64 * 170**2)), abs=1e-3)
    assert row_faded["psnr_still"] < row_faded["psnr"]
    assert row_misplaced["psnr_still"] == pytest.approx(100.0) and row_misplaced["psnr"] < 40


class SquarePhysics:
    """The square episodes' true dynamics as a world model (``blind``: one that ignores the actions)."""

    chunk_size, device, side = 4, torch.device("cpu"), 8

    def __init__(self, blind: bool = False):
        self.blind = blind

    def reset(self, first_frames: torch.Tensor, seeds=None) -> None:
        square = first_frames[..., 0] == 230  # (N, H, W)
        self.size = first_frames.shape[1]
        self.position = torch.stack([square.any(2).float().argmax(1), square.any(1).float().argmax(1)], 1).float()  # top-left (y, x)

    def step(self, chunks: torch.Tensor) -> torch.Tensor:
        frames = []
        for k in range(chunks.shape[1]):
            if not self.blind:
                self.position = (self.position + 2 * chunks[:, k, :2]).clamp(0, self.size - self.side)
            frame = torch.full((len(chunks), self.size, self.size, 3), 30, dtype=torch.uint8)
            for i, (y, x) in enumerate(self.position.long().tolist()):
                frame[i, y : y + self.side, x : x + self.side] = torch.tensor([230, 200, 40], dtype=torch.uint8)
            frames.append(frame)
        return torch.stack(frames, 1)


def test_action_delta_psnr_tells_a_model_that_follows_actions_from_one_that_ignores_them():
    from worldloop.worldmodel.evaluate import horizon_metrics, open_loop

    episodes = square_episodes(6, seed=5, length=17)
    others = episodes[1:] + episodes[:1]
    first = torch.stack([torch.as_tensor(e.frames[0]) for e in episodes])
    rows = {}
    for blind in (False, True):
        real, generated, valid, _ = open_loop(SquarePhysics(blind), episodes, 16)
        _, other, _, _ = open_loop(SquarePhysics(blind), episodes, 16, actions_of=others)
        if not blind:
            assert torch.equal(generated, real)  # the true dynamics replay the episode exactly
        rows[blind] = horizon_metrics(real, generated, first[:, None].expand_as(real), valid, [16], other)["16"]
    follows, ignores = rows[False], rows[True]
    assert follows["action_delta_psnr"] > 10 and follows["action_delta_psnr"] > 3 * follows["action_delta_psnr_stderr"]
    assert ignores["action_delta_psnr"] == 0 and ignores["psnr_other_actions"] == ignores["psnr"]
    with pytest.raises(ValueError, match="5 action sequences for 6 episodes"):
        open_loop(SquarePhysics(), episodes, 16, actions_of=others[:5])


def test_time_limited_budget_warms_up_decays_and_counts_resumed_seconds(monkeypatch):
    from worldloop.worldmodel import training as train_lib

    now = [1000.0]
    monkeypatch.setattr(train_lib.time, "time", lambda: now[0])
    steps_only = train_lib.TrainingBudget(steps=2000)
    assert steps_only.lr_factor(0) == pytest.approx(1 / 100)  # warm-up: 5 % of 2000 steps
    assert steps_only.lr_factor(99) == pytest.approx(1.0)
    assert steps_only.lr_factor(1999) == pytest.approx(0.1)
    assert not steps_only.out_of_time()

    # 100 s of a 20000-step budget: the schedule follows the clock, not the far-away step count
    timed = train_lib.TrainingBudget(steps=20000, time_limit_s=100.0)
    assert timed.lr_factor(10) < 0.05
    now[0] += 50.0
    assert 0.5 < timed.lr_factor(10) < 0.6  # half-way through the cosine
    assert not timed.out_of_time()
    now[0] += 50.0
    assert timed.lr_factor(10) == pytest.approx(0.1) and timed.out_of_time()

    # a resumed run starts from the seconds its checkpoint recorded
    resumed = train_lib.TrainingBudget(steps=20000, time_limit_s=100.0, seconds_done=80.0)
    assert resumed.fraction(10) == pytest.approx(0.8)
    now[0] += 20.0
    assert resumed.out_of_time()


def test_bench_wm_train_times_the_real_training_loop(tmp_path, monkeypatch, capsys):
    """`bench wm-train` runs train_world_model itself: a warm-up, then per setting a long and a short run."""
    from worldloop.cli import main
    from worldloop.worldmodel import train_dit as train_lib

    calls, real = [], train_lib.train_world_model

    def recorded(config, *args, **kwargs):
        calls.append((config.steps, config.self_forcing, kwargs.get("self_forcing_after", train_lib.SELF_FORCING_AFTER)))
        return real(config, *args, **kwargs)

    monkeypatch.setattr(train_lib, "train_world_model", recorded)
    assert main(["bench", "wm-train", "--steps", "2", "--out", str(tmp_path / "bench.txt")]) == 0
    assert calls == [(2, 1.0, 0.0), (2, 0.0, 0.0), (1, 0.0, 0.0), (2, 0.5, 0.0), (1, 0.5, 0.0)]
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [r["self_forcing"] for r in rows] == [0.0, 0.5] and all(r["steps_per_s"] > 0 and r["clips_per_s"] > 0 for r in rows)
    assert all(r["mfu"] is None and r["gpu_busy"] is None and not r["compiled"] for r in rows)  # a CPU has no bf16 peak, no kernels
    assert "wm-train" in (tmp_path / "bench.txt").read_text() and "GPU busy" in capsys.readouterr().out
    assert main(["bench", "wm-train", "--steps", "1"]) == 2
    assert "--steps >= 2" in capsys.readouterr().err


def test_busy_time_is_the_union_of_kernel_intervals():
    from worldloop.utils.timing import union_length

    assert union_length([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20  # two overlapping kernels count once, a nested one not at all
    assert union_length([]) == 0


def test_a_profile_names_the_operators_a_call_spends_its_time_in():
    """`bench wm --profile`'s table: the operators of a call ranked by their own time, per call of it."""
    from worldloop.utils.timing import format_profile, profile_calls

    a, b = torch.randn(384, 384), torch.randn(384, 384)

    def work():  # one big product and two cheap additions per call
        (a @ b).add_(1.0).add_(2.0)

    profile = profile_calls(work, CPU, calls=4)
    top = profile["operators"][0]
    assert top["name"] in ("aten::mm", "aten::matmul") and top["calls"] == 1 and top["share"] > 0.5, profile["operators"]
    assert next(o for o in profile["operators"] if o["name"] == "aten::add_")["calls"] == 2
    assert 0.99 <= sum(o["share"] for o in profile["operators"]) <= 1.0 + 1e-9 and profile["busy"] is None
    assert profile["wall_ms"] > 0 and "aten::add_" in format_profile(profile) and "GPU busy" not in format_profile(profile)
    # the copies by input shape: a cast of a (64, 3, 3) weight-like tensor and of a (4, 8, 96, 96) activation-like one
    weight, activation = torch.randn(64, 3, 3), torch.randn(4, 8, 96, 96)
    casts = profile_calls(lambda: (weight.to(torch.bfloat16), activation.to(torch.bfloat16)), CPU, calls=2)["copies"]
    shapes = [c["shapes"] for c in casts]
    assert [[4, 8, 96, 96], [4, 8, 96, 96]] in shapes and [[64, 3, 3], [64, 3, 3]] in shapes and all(c["calls"] == 1 for c in casts)
    assert casts[0]["shapes"] == [[4, 8, 96, 96], [4, 8, 96, 96]]  # the bigger copy first


def test_frame_store_draws_clips_of_consecutive_frames_and_holds_a_short_episodes_last():
    from types import SimpleNamespace

    from worldloop.worldmodel.train_vae import FrameStore

    # frame value = 100 * episode + index: a clip's frames say where they came from
    episodes = [SimpleNamespace(frames=torch.full((n, 2, 2, 3), 0, dtype=torch.uint8) + (100 * e + torch.arange(n, dtype=torch.uint8)).view(-1, 1, 1, 1))
                for e, n in enumerate((20, 3))]  # fmt: skip
    clips = FrameStore(episodes, CPU).sample(64, 5, torch.Generator().manual_seed(0))[..., 0, 0, 0].long()  # (64, 5)
    episode, index = clips // 100, clips % 100
    assert (episode == episode[:, :1]).all() and {0, 1} == set(episode[:, 0].tolist())
    long, short = episode[:, 0] == 0, episode[:, 0] == 1
    assert (index[long].diff(dim=1) == 1).all() and index[long].max() <= 19
    assert (index[short] == torch.tensor([0, 1, 2, 2, 2])).all()  # 3 frames: the last one held


def test_self_forcing_samples_in_sampling_steps(vae, tmp_path, monkeypatch):
    """The self-forced memory is sampled as a rollout samples it: in world_model.sampling_steps Euler steps."""
    from worldloop.worldmodel import train_dit as train_lib

    episodes, real = square_episodes(2, seed=2, length=24), train_lib.sample_future
    for steps in (1, 3):
        calls = []
        monkeypatch.setattr(train_lib, "sample_future", lambda dit, c, a, n, sigmas, *rest: calls.append(len(sigmas) - 1) or real(dit, c, a, n, sigmas, *rest))
        config = fast_config(steps=2, self_forcing=1.0, sampling_steps=steps, clip_stride=8)
        train_world_model(config, episodes, vae, tmp_path / f"sf{steps}", CPU, self_forcing_after=0.0)
        assert calls[:2] == [steps, steps] and calls[-1] == steps  # two training steps, then the final samples


def test_a_copied_world_model_is_continued_by_init(vae, tmp_path):
    """Another machine's path: the world-model folder copied without its clip cache, then ``init`` starts training
    from those weights and action statistics; an init for other actions is refused."""
    import shutil

    from worldloop.worldmodel.rollout import WorldModel

    episodes = square_episodes(4, seed=1, length=16)
    trained = train_world_model(fast_config(steps=4), episodes, vae, tmp_path / "a", CPU)
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns("latents.*", "checkpoints"))
    carried = WorldModel.from_pretrained(tmp_path / "b", CPU)
    for (name, p), q in zip(trained.dit.state_dict().items(), carried.dit.state_dict().values()):
        assert torch.equal(p, q), name

    continued = train_world_model(fast_config(steps=0), square_episodes(4, seed=2, length=16), vae, tmp_path / "c", CPU, init=carried,
                                  steps_before=steps_trained(tmp_path / "b"))  # fmt: skip
    for (name, p), q in zip(carried.dit.state_dict().items(), continued.dit.state_dict().values()):
        assert torch.equal(p, q), name
    # its results count the carried model's steps too ("steps" are the run's own), and so on over further runs
    assert steps_trained(tmp_path / "b") == 4 and json.loads((tmp_path / "c" / "results.json").read_text())["steps_total"] == 4
    grown = train_world_model(fast_config(steps=2), square_episodes(4, seed=2, length=16), vae, tmp_path / "e", CPU, init=continued,
                              steps_before=steps_trained(tmp_path / "c"))  # fmt: skip
    assert json.loads((tmp_path / "e" / "results.json").read_text())["steps"] == 2 and steps_trained(tmp_path / "e") == 6
    assert steps_trained(tmp_path / "missing") is None
    assert continued.spec["action_mean"] == carried.spec["action_mean"]  # not this data's statistics
    with pytest.raises(ValueError, match="--init world model renders"):
        train_world_model(fast_config(steps=0), square_episodes(2, seed=3, length=16, action_dim=3), vae, tmp_path / "d", CPU, init=carried)




def test_outcome_clips_are_those_whose_future_reaches_the_first_success():
    """With chunk 8 and one chunk of lead, a first success after action 23 (shown from frame 24 on) marks the clips
    whose future frames t+1..t+8 meet frames 16-31; static clips and episodes that never succeed have none."""
    import numpy as np

    from worldloop.worldmodel.clips import clip_spec, episode_clips, outcome_clips

    actions = np.zeros((40, 2), np.float32)
    specs = [clip_spec(actions, t, 8) for t in range(0, 32, 4)] + [clip_spec(actions, 20, 8, static=True)]
    success = np.zeros(40, bool)
    success[23:] = True
    flags = outcome_clips(specs, success, chunk=8, lead_chunks=1)
    assert flags.tolist() == [False, False, True, True, True, True, True, True, False]  # t = 0, 4 | 8 .. 28 | static
    assert not outcome_clips(specs, np.zeros(40, bool), chunk=8).any() and not outcome_clips(specs, None, chunk=8).any()
    # with the default lead of 3 chunks the window opens at frame 0: every moving clip of this short episode
    assert outcome_clips(episode_clips(actions, 8, 4, np.random.default_rng(0), static_fraction=0.0), success, chunk=8).all()


def test_outcome_weight_draws_outcome_clips_that_much_more_often(vae, tmp_path):
    """world_model.outcome_weight W draws an outcome clip W times as often as another; train-wm says how many there
    were and what share of the draws they got; W = 1 (the default) draws uniformly, as before the option."""
    from types import SimpleNamespace

    from _worldmodel_fixtures import square_episodes
    from worldloop.worldmodel.train_dit import clip_weights, draw_batch

    outcome = torch.tensor([True, False, False, False])
    clips = {"latents": torch.arange(4.0).view(4, 1, 1, 1, 1).expand(4, 1, 4, 1, 1), "outcome": outcome}
    assert clip_weights(outcome, 1.0) is None and clip_weights(None, 4.0) is None
    weights = clip_weights(outcome, 6.0)
    assert weights.tolist() == [6.0, 1.0, 1.0, 1.0]
    run = SimpleNamespace(generator=torch.Generator().manual_seed(0), config=fast_config(batch_size=9000), latents=clips["latents"],
                          actions=torch.zeros(4, 13, 2), weights=weights)
    x0, _ = draw_batch(run, SimpleNamespace(per_step=0), None, 0, slice(None))
    assert abs(float((x0[:, 0, 0, 0, 0] == 0).float().mean()) - 6 / 9) < 0.02  # 6 / (6 + 3)

    episodes = square_episodes(3, seed=2, length=64)
    for episode in episodes:
        episode.success = torch.arange(64).numpy() >= 50  # the first success after action 50
    train_world_model(fast_config(outcome_weight=4.0), episodes, vae, tmp_path / "w", CPU)
    results = json.loads((tmp_path / "w" / "results.json").read_text())
    share = results["outcome_clips"] / results["clips"]
    assert 0 < share < 1 and results["outcome_draw_share"] == pytest.approx(4 * share / (4 * share + 1 - share))
    train_world_model(fast_config(), episodes, vae, tmp_path / "u", CPU)
    assert json.loads((tmp_path / "u" / "results.json").read_text())["outcome_draw_share"] == pytest.approx(share)
    with pytest.raises(ValueError, match="outcome_weight must be >= 1"):
        fast_config(outcome_weight=0.5).validate()
