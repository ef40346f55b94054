"""World model pieces at tiny size: VAE, DiT, clips, rollout, save/load, metrics, bad input."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.clips import clip_spec, episode_clips, predecessors
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
from worldloop.worldmodel.metrics import psnr, ssim
from worldloop.worldmodel.rollout import RETIRED_SPEC, WorldModel, sample_future

SIZE = 32


@pytest.fixture(scope="module")
def model() -> WorldModel:
    torch.manual_seed(0)
    vae = vae_lib.build_vae(VAEConfig())
    wm = WorldModel.build(WorldModelConfig(sampling_steps=2), vae, SIZE, 3, device="cpu")
    # make the action MLP non-trivial (it starts at zero, AdaLN-Zero style)
    torch.nn.init.normal_(wm.dit.frame_action_mlp[-1].weight, std=0.5)
    return wm


def frames(n: int, t: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (n, SIZE, SIZE, 3) if t is None else (n, t, SIZE, SIZE, 3)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)


def test_vae_shapes_and_streaming_decode_equals_full(model):
    video = frames(2, 13)
    with torch.no_grad():
        latents = vae_lib.encode(model.vae, video)
        assert latents.shape == (2, 8, 4, SIZE // 8, SIZE // 8)
        full = vae_lib.decode(model.vae, latents)
        stream = vae_lib.StreamingDecoder(model.vae)
        parts = torch.cat([stream(latents[:, :, :2]), stream(latents[:, :, 2:])], dim=1)
    assert full.shape == (2, 13, SIZE, SIZE, 3) and full.dtype == torch.uint8
    assert torch.equal(parts, full)


def test_dit_shapes_and_both_action_channels_matter(model):
    dit = model.dit
    latents = torch.randn(2, 8, 4, 4, 4)
    sigmas = torch.tensor([[0.0, 0.0, 0.7, 0.7]] * 2)
    actions = torch.randn(2, 13, 3)
    with torch.no_grad():
        out = dit(latents, sigmas, actions)
        assert out.shape == latents.shape
        other = actions.clone()
        other[:, 5:] *= -1
        assert (dit(latents, sigmas, other) - out).abs().max() > 1e-4
        # AdaLN channel alone: the per-frame offset is added to the timestep embedding
        groups = dit.frame_action_groups(actions)
        assert groups.shape == (2, 4, 12) and torch.equal(groups[:, 0, :9], torch.zeros(2, 9))
        assert torch.equal(groups[:, 2], actions[:, 5:9].reshape(2, 12))


def test_dit_rejects_bad_shapes(model):
    with pytest.raises(ValueError, match="actions must be"):
        model.dit(torch.randn(1, 8, 4, 4, 4), torch.zeros(1, 4), torch.randn(1, 13, 5))
    with pytest.raises(ValueError, match="latent frames"):
        model.dit(torch.randn(1, 8, 3, 4, 4), torch.zeros(1, 3), torch.randn(1, 13, 3))


def test_clip_spec_pairs_each_frame_with_the_action_that_produced_it():
    actions = np.arange(40, dtype=np.float32).reshape(20, 2)
    spec = clip_spec(actions, t=6, chunk=8)
    assert spec.frame_indices.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert np.array_equal(spec.actions[0], [0, 0])  # the pre/reference slot
    assert np.array_equal(spec.actions[1:], actions[2:14])  # frame i <- a[i-1]; future <- a[6..13]
    early = clip_spec(actions, t=1, chunk=8)
    assert early.frame_indices[:5].tolist() == [0, 0, 0, 0, 1]
    assert not early.actions[1:4].any() and np.array_equal(early.actions[4], actions[0])
    static = clip_spec(actions, t=3, chunk=8, static=True)
    assert static.static and set(static.frame_indices.tolist()) == {3} and not static.actions.any()


def test_predecessor_futures_are_the_memory_frames():
    """Self-forcing replaces a clip's memory latent with the sample of its predecessor's last future
    latent: the predecessor's last 4 frames must be exactly this clip's memory frames."""
    actions = np.zeros((40, 2), np.float32)
    specs = episode_clips(actions, chunk=8, stride=2, rng=np.random.default_rng(0), static_fraction=0.3)
    previous = predecessors(specs, chunk=8)
    assert any(s.static for s in specs) and all(previous[i] == -1 for i, s in enumerate(specs) if s.static)
    linked = [(i, j) for i, j in enumerate(previous) if j >= 0]
    assert len(linked) == sum(1 for s in specs if not s.static and s.frame_indices[4] >= 8)
    for i, j in linked:
        assert specs[j].frame_indices[-4:].tolist() == specs[i].frame_indices[1:5].tolist()
    odd = predecessors(episode_clips(actions, chunk=8, stride=3, rng=np.random.default_rng(0), static_fraction=0.0), chunk=8)
    assert (odd >= 0).sum() == len([t for t in range(0, 32, 3) if t >= 8 and (t - 8) % 3 == 0])


def test_memory_noise_changes_the_conditioning_reproducibly(model):
    first, chunks = frames(2, seed=7), torch.randn(2, 2, 8, 3)

    def rollout() -> tuple[torch.Tensor, torch.Tensor]:
        model.reset(first, seeds=[3, 4])
        reference = model.context[:, :, :1].clone()
        video = torch.cat([model.step(chunks[0]), model.step(chunks[1])], dim=1)
        assert torch.equal(model.context[:, :, :1], reference)
        return video

    clean = rollout()
    model.set_sampling(model.sampling_steps, model.shift, model.decode_mode, memory_noise=0.5)
    try:
        noisy, again = rollout(), rollout()
        with pytest.raises(ValueError, match="memory_noise"):
            model.set_sampling(model.sampling_steps, model.shift, model.decode_mode, memory_noise=1.0)
    finally:
        model.set_sampling(model.sampling_steps, model.shift, model.decode_mode)
    assert torch.equal(noisy, again)  # the memory noise comes from each env's own generator
    assert (clean.int() - noisy.int()).abs().max() > 0


def test_reference_slot_fixed_and_batched_equals_per_env(model):
    first, chunks = frames(3, seed=1), torch.randn(2, 3, 8, 3)
    model.reset(first, seeds=[11, 12, 13])
    reference = model.context[:, :, :1].clone()
    with torch.no_grad():
        expected_reference = vae_lib.encode(model.vae, first[:, None])
    assert torch.allclose(reference, expected_reference, atol=1e-5)
    batched = torch.cat([model.step(chunks[0]), model.step(chunks[1])], dim=1)
    assert batched.shape == (3, 16, SIZE, SIZE, 3) and batched.dtype == torch.uint8
    assert torch.equal(model.context[:, :, :1], reference)  # never changes during the rollout
    for i in range(3):
        model.reset(first[i : i + 1], seeds=[11 + i])
        single = torch.cat([model.step(chunks[0, i : i + 1]), model.step(chunks[1, i : i + 1])], dim=1)
        assert (single[0].int() - batched[i].int()).abs().max() <= 1
    # independent noise per env: two envs with the same start and actions but other seeds differ
    model.reset(first[:1].expand(2, -1, -1, -1), seeds=[1, 2])
    twins = model.step(chunks[0, :1].expand(2, -1, -1))
    assert (twins[0].int() - twins[1].int()).abs().max() > 0


def test_full_and_cached_decode_agree_on_the_first_chunk(model):
    first, chunk, mode = frames(2, seed=2), torch.randn(2, 8, 3), model.decode_mode
    decoded = {}
    try:
        for decode in ("cached", "full"):
            model.set_sampling(model.sampling_steps, model.shift, decode)
            model.reset(first, seeds=[0, 1])
            decoded[decode] = model.step(chunk)
    finally:
        model.set_sampling(model.sampling_steps, model.shift, mode)
    cached, full = decoded["cached"], decoded["full"]
    assert (cached.int() - full.int()).abs().max() <= 1


def test_rollout_rejects_bad_input(model):
    with pytest.raises(ValueError, match="first_frames"):
        model.reset(torch.zeros(2, 64, 64, 3, dtype=torch.uint8))  # another resolution
    with pytest.raises(ValueError, match="memory_frames"):
        model.reset(frames(2), memory_frames=frames(2, 3))  # context of the wrong length
    model.reset(frames(2))
    with pytest.raises(ValueError, match="action_chunks"):
        model.step(torch.zeros(2, 8, 4))  # wrong action dim
    with pytest.raises(ValueError, match="action_chunks"):
        model.step(torch.zeros(2, 5, 3))  # wrong chunk length


def test_save_load_roundtrip(model, tmp_path):
    model.save_pretrained(tmp_path / "wm")
    loaded = WorldModel.from_pretrained(tmp_path / "wm", "cpu")
    first, chunk = frames(2, seed=3), torch.randn(2, 8, 3)
    model.reset(first, seeds=[4, 5])
    loaded.reset(first, seeds=[4, 5])
    assert torch.equal(model.step(chunk), loaded.step(chunk))
    assert loaded.image_size == SIZE and loaded.action_dim == 3 and loaded.chunk_size == 8
    (tmp_path / "wm" / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(ValueError, match="corrupt"):
        WorldModel.from_pretrained(tmp_path / "wm", "cpu")


def test_verbs_sample_as_saved_unless_the_command_line_says_otherwise(model, tmp_path, capsys):
    """rl, train-reward, calibrate-reward and eval-wm load a world model the same way: its saved sampling
    options, of which only those named on the command line are replaced (a preset's are not)."""
    from worldloop.commands.shared import load_world_model
    from worldloop.config import load_config

    model.save_pretrained(tmp_path / "wm")  # saved: 2 sampling steps, no memory noise
    preset = load_config("metaworld-gpu")
    assert preset.world_model.memory_noise == 0.1  # the preset's value, not this model's
    as_saved = load_world_model(tmp_path / "wm", preset, [], torch.device("cpu"))
    assert (as_saved.memory_noise, as_saved.sampling_steps) == (0.0, 2)
    printed = capsys.readouterr().out
    assert "memory_noise 0.0" in printed and "command line" not in printed.split(";")[0]
    overrides = ["world_model.memory_noise=0.3", "world_model.sampling_steps=4"]
    overridden = load_world_model(tmp_path / "wm", load_config("metaworld-gpu", overrides), overrides, torch.device("cpu"))
    assert (overridden.memory_noise, overridden.sampling_steps, overridden.decode_mode) == (0.3, 4, model.decode_mode)
    assert "memory_noise 0.3 (command line)" in capsys.readouterr().out


def test_the_reference_slot_stays_and_the_memory_moves():
    torch.manual_seed(0)
    wm = WorldModel.build(WorldModelConfig(sampling_steps=1), vae_lib.build_vae(VAEConfig()), SIZE, 2, device="cpu")
    wm.reset(frames(2, seed=4))
    before = wm.context.clone()
    assert wm.step(torch.randn(2, 8, 2)).shape == (2, 8, SIZE, SIZE, 3)
    assert torch.equal(wm.context[:, :, :1], before[:, :, :1]) and not torch.allclose(wm.context[:, :, 1:], before[:, :, 1:])


def test_wan22_5b_dimensions_build_and_run_on_the_meta_device():
    """The throughput preset (`bench wm`): shapes only, no memory (5B DiT + Wan2.2 VAE on 'meta')."""
    from worldloop.worldmodel.modeling import ActionConditionedDiT

    with torch.device("meta"):
        vae = vae_lib.build_vae(VAEConfig(size="wan2.2-5b"))
        latents = vae.encode(torch.empty(1, 3, 5, 32, 32)).latent_dist.mode()  # 2x2-patchified RGB in
        assert latents.shape == (1, 48, 2, 2, 2)
        assert vae.decode(latents).sample.shape == (1, 3, 5, 32, 32)
        dit = ActionConditionedDiT("wan2.2-5b", 48, 4, 8)
    assert 4.9e9 < sum(p.numel() for p in dit.parameters()) < 5.1e9


def test_psnr_ssim():
    a = frames(2, 3, seed=5)
    assert torch.all(psnr(a, a) > 90) and torch.allclose(ssim(a, a), torch.ones(2, 3))
    b = frames(2, 3, seed=6)
    assert torch.all(psnr(a, b) < 12) and torch.all(ssim(a, b) < 0.2)
    with pytest.raises(ValueError):
        psnr(a, b[:, :2])


def test_config_validation():
    with pytest.raises(ValueError, match="chunk_size"):
        WorldModelConfig(chunk_size=6).validate()
    with pytest.raises(ValueError, match="self_forcing"):
        WorldModelConfig(self_forcing=1.5).validate()
    for config in (VAEConfig(time_limit_s=-1), WorldModelConfig(time_limit_s=-1)):
        with pytest.raises(ValueError, match="time_limit_s"):
            config.validate()


def _static_scene_error(context_channels: bool, steps: int = 100, seed: int = 0) -> float:
    """Train a tiny DiT whose futures repeat the reference latent (a random static scene per clip);
    return its one-step estimate error of the future from sigma 0.9 on new scenes."""
    from worldloop.worldmodel.modeling import ActionConditionedDiT

    torch.manual_seed(seed)
    dit = ActionConditionedDiT("tiny", 8, 2, 8, context_channels=context_channels)
    optimizer = torch.optim.AdamW(dit.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    no_actions = torch.zeros(24, 13, 2)

    def clips(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 8, 1, 8, 8, generator=g).expand(-1, -1, 4, -1, -1), torch.randn(n, 8, 2, 8, 8, generator=g)

    for _ in range(steps):
        x0, noise = clips(24)
        s = torch.rand(24, generator=g)
        noisy = (1 - s.view(-1, 1, 1, 1, 1)) * x0[:, :, 2:] + s.view(-1, 1, 1, 1, 1) * noise
        sigmas = torch.cat([torch.zeros(24, 2), s[:, None].expand(-1, 2)], dim=1)
        velocity = dit(torch.cat([x0[:, :, :2], noisy], dim=2), sigmas, no_actions)
        loss = F.mse_loss(velocity[:, :, 2:], noise - x0[:, :, 2:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        x0, noise = clips(24)
        noisy = 0.1 * x0[:, :, 2:] + 0.9 * noise
        velocity = dit(torch.cat([x0[:, :, :2], noisy], dim=2), torch.tensor([[0.0, 0.0, 0.9, 0.9]] * 24), no_actions)
        return float(F.mse_loss(noisy - 0.9 * velocity[:, :, 2:], x0[:, :, 2:]))


def test_context_channels_keep_a_static_scene_in_fewer_steps():
    """The 2026-12-01 fading-objects run's imagined objects faded within a few chunks. With the context latents on
    every frame's channels, keeping what does not move is a per-patch copy: the same tiny DiT and steps
    estimate a static random scene far better (CPU, seeds 0-2: 0.035-0.036 against 0.56-0.62)."""
    plain, concatenated = _static_scene_error(False), _static_scene_error(True)
    assert concatenated < 0.5 * plain, (plain, concatenated)


def test_context_channels_are_saved_with_the_model_and_an_init_must_match(tmp_path):
    from worldloop.worldmodel.train_dit import train_world_model

    torch.manual_seed(0)
    vae = vae_lib.build_vae(VAEConfig())
    wm = WorldModel.build(WorldModelConfig(context_channels=True, sampling_steps=1), vae, SIZE, 2, device="cpu")
    assert wm.dit.transformer.config.in_channels == 3 * 8
    wm.save_pretrained(tmp_path / "wm")
    loaded = WorldModel.from_pretrained(tmp_path / "wm", "cpu")
    first, chunk = frames(2, seed=5), torch.randn(2, 8, 2)
    wm.reset(first, seeds=[1, 2])
    loaded.reset(first, seeds=[1, 2])
    assert loaded.dit.context_channels and torch.equal(wm.step(chunk), loaded.step(chunk))
    clips = {"latents": torch.randn(4, 8, 4, SIZE // 8, SIZE // 8), "actions": torch.randn(4, 13, 2)}
    with pytest.raises(ValueError, match="context_channels=True"):
        train_world_model(WorldModelConfig(steps=1), [], vae, tmp_path / "plain", torch.device("cpu"), clips=clips, init=loaded)


# ------------------------------------------------------------------------------------ folders of earlier versions


def test_a_model_saved_with_retired_options_loads_at_the_fixed_values_and_is_refused_otherwise(model, tmp_path):
    """World models saved before the 1-frame and sliding-reference ablations and action guidance were retired hold
    memory_frames, reference_frame, null_actions, action_dropout and action_guidance in their config.json."""
    folder = model.save_pretrained(tmp_path / "old")
    config = json.loads((folder / "config.json").read_text())
    assert not RETIRED_SPEC.keys() & config.keys()
    old = {"memory_frames": 4, "reference_frame": True, "null_actions": False, "action_dropout": 0.0, "action_guidance": 1.0}
    (folder / "config.json").write_text(json.dumps({**config, **old}))
    loaded = WorldModel.from_pretrained(folder, "cpu")
    assert not RETIRED_SPEC.keys() & loaded.spec.keys()
    first, chunk = frames(2, seed=9), torch.randn(2, 8, 3)
    model.reset(first, seeds=[6, 7])
    loaded.reset(first, seeds=[6, 7])
    assert torch.equal(loaded.step(chunk), model.step(chunk))
    for key, value in (("null_actions", True), ("memory_frames", 1), ("reference_frame", False)):
        (folder / "config.json").write_text(json.dumps({**config, **old, key: value}))
        with pytest.raises(ValueError, match=re.escape(f"config.json has {key}={value!r}; world_model.{key} was retired")):
            WorldModel.from_pretrained(folder, "cpu")
