"""Supervised fine-tuning: the instruction decides the action after a short SFT; exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from _policy_fixtures import CLOSE, OPEN, IMAGE, images, synthetic_episodes, tiny_config
from worldloop.policies.compact_vla.modeling import CompactVLA
from worldloop.policies.sft import (
    Samples,
    action_chunks,
    build_samples,
    fit_policy,
    held_out_metrics,
    random_reconstructed,
    random_shift,
    select_episodes,
)
from worldloop.policies.tokenizer import ActionTokenizer


def test_action_chunks_repeat_the_last_action():
    actions = torch.arange(10, dtype=torch.float32).view(5, 2)
    chunks = action_chunks(actions, 3)
    assert chunks.shape == (5, 3, 2)
    assert torch.equal(chunks[0], actions[0:3]) and torch.equal(chunks[4], actions[[4, 4, 4]]) and torch.equal(chunks[3], actions[[3, 4, 4]])


def test_select_episodes_prefers_clean_successes():
    summaries = [(0, 0, False, True), (1, 0, True, False), (2, 1, False, True), (3, 1, False, False), (4, 0, True, True)]
    assert select_episodes(summaries, 1) == [2, 4]
    assert select_episodes(summaries, 2) == [1, 2, 3, 4]
    assert select_episodes(summaries, 0) == [0, 1, 2, 3, 4]


def test_random_shift_moves_pixels_within_bounds():
    frames = images(4)
    shifted = random_shift(frames, 3, torch.Generator().manual_seed(0))
    assert shifted.shape == frames.shape and shifted.dtype == torch.uint8
    assert not torch.equal(shifted, frames)
    assert torch.equal(random_shift(frames, 0, torch.Generator()), frames)


def test_instruction_decides_the_action_after_sft(tmp_path):
    """Frames look alike for both instructions: only the instruction can tell +0.8 from -0.8."""
    config = tiny_config("sft.steps=150")
    results = fit_policy(config, synthetic_episodes(8), synthetic_episodes(2, seed=1), tmp_path / "m", [OPEN, CLOSE], IMAGE, 4)
    assert 0 < results["held_out_token_accuracy"] <= 1 and results["held_out_loss"] < 4.0  # chance: log(256) = 5.5
    policy = CompactVLA.from_pretrained(tmp_path / "m")
    frames = torch.from_numpy(synthetic_episodes(2, seed=2)[0].frames[:4])
    centres = policy.tokenizer.decode(torch.arange(256)[:, None].repeat(1, 4))[:, 0]  # (bins,) dimension 0

    @torch.no_grad()
    def expected_first_dim(instruction: str) -> float:
        logits, _ = policy(frames, [instruction] * len(frames))
        return float((logits[..., 0, :].softmax(-1) * centres).sum(-1).mean())

    assert expected_first_dim(OPEN) > 0.25 and expected_first_dim(CLOSE) < -0.25
    assert (tmp_path / "m" / "tb").is_dir() and (tmp_path / "m" / "sft_results.json").is_file()


def test_resume_is_exact(tmp_path):
    config = tiny_config("sft.steps=6", "sft.batch_size=8")
    train, held = synthetic_episodes(4, length=6), synthetic_episodes(2, seed=1, length=6)
    args = ([OPEN, CLOSE], IMAGE, 4)
    fit_policy(config, train, held, tmp_path / "straight", *args)
    partial = fit_policy(config, train, held, tmp_path / "resumed", *args, stop_after=3)
    assert partial == {"stopped_at": 3} and not (tmp_path / "resumed" / "model.safetensors").exists()
    torch.manual_seed(1234)  # the resumed run must not depend on the global RNG of this process
    fit_policy(config, train, held, tmp_path / "resumed", *args)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    # and a run with another seed differs (so the comparison above can fail)
    other = fit_policy(tiny_config("sft.steps=6", "sft.batch_size=8", "seed=1"), train, held, tmp_path / "other", *args)
    assert other["steps"] == 6
    assert not torch.equal(load_file(tmp_path / "other" / "model.safetensors")["action_head.weight"], straight["action_head.weight"])


def test_unknown_instruction_in_episodes_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        fit_policy(tiny_config("sft.steps=1"), synthetic_episodes(2), [], tmp_path / "m", [OPEN], IMAGE, 4)


def test_random_reconstructed_swaps_a_share_of_frames_reproducibly():
    frames = torch.zeros(64, 4, 4, 3, dtype=torch.uint8)
    reconstructed = torch.full_like(frames, 200)
    mixed = random_reconstructed(frames, reconstructed, 0.5, torch.Generator().manual_seed(1))
    swapped = (mixed == 200).flatten(1).all(dim=1)
    assert 16 < int(swapped.sum()) < 48 and bool(((mixed == 0) | (mixed == 200)).all())  # whole frames, about half
    assert torch.equal(mixed, random_reconstructed(frames, reconstructed, 0.5, torch.Generator().manual_seed(1)))
    assert torch.equal(random_reconstructed(frames, reconstructed, 1.0, torch.Generator()), reconstructed)
    with pytest.raises(ValueError, match="augment_codec is a share of frames"):
        tiny_config("sft.augment_codec=-0.1")


class _BrightnessPolicy(torch.nn.Module):
    """Greedy tokens that follow each frame's mean pixel (bin = mean // 16), so how many change under
    other frames, and by how many bins, is known without a trained network."""

    device = torch.device("cpu")

    def forward(self, frames, instructions):
        bins = frames.float().mean(dim=(1, 2, 3)).div(16).long()
        return torch.nn.functional.one_hot(bins, 256).float()[:, None, :].expand(-1, 4, -1), None


def test_codec_token_agreement_is_one_only_where_the_frames_are_kept(tmp_path):
    config = tiny_config("sft.steps=2")
    torch.manual_seed(0)
    policy = CompactVLA(config.policy, 4, IMAGE, ActionTokenizer.fit(torch.randn(64, 4), [1.0, 99.0], 256))
    policy.add_instructions([OPEN, CLOSE])
    samples = build_samples(synthetic_episodes(2, length=8), 8, [OPEN, CLOSE])
    tokens = policy.tokenizer.encode(samples.chunks)
    kept = Samples(samples.frames, samples.chunks, samples.instruction_ids, samples.instructions, samples.frames.clone())
    assert held_out_metrics(policy, kept, tokens, 4) | {"loss": 0, "token_accuracy": 0} == {
        "loss": 0, "token_accuracy": 0, "codec_token_agreement": 1.0, "codec_token_distance": 0.0}
    assert "codec_token_agreement" not in held_out_metrics(policy, samples, tokens, 4)
    # frames whose brightness moves by 0, 1 or 3 bins: agreement and distance as counted by hand
    shift = torch.tensor([0, 16, 48] * (len(samples) // 3) + [0] * (len(samples) % 3), dtype=torch.int16)
    frames = torch.full_like(samples.frames, 64)
    moved = (frames.to(torch.int16) + shift.view(-1, 1, 1, 1)).to(torch.uint8)
    changed = Samples(frames, samples.chunks, samples.instruction_ids, samples.instructions, moved)
    metrics = held_out_metrics(_BrightnessPolicy(), changed, torch.zeros(len(samples), 4, dtype=torch.long), 4)
    assert metrics["codec_token_agreement"] == pytest.approx(float((shift == 0).float().mean()))
    assert metrics["codec_token_distance"] == pytest.approx(float(shift.float().div(16).mean()))
    assert metrics["codec_token_agreement"] < 1.0


def test_sft_through_a_world_models_vae(tmp_path):
    """--world-model: the held-out agreement is measured, augment_codec trains on the VAE's frames (other
    weights than without it), resumes exactly, and refuses a world model of another resolution."""
    from _worldmodel_fixtures import tiny_vae

    tiny_vae().save_pretrained(tmp_path / "wm" / "vae")
    (tmp_path / "wm" / "config.json").write_text(json.dumps({"kind": "world_model", "image_size": IMAGE}))
    train, held = synthetic_episodes(4, length=6), synthetic_episodes(2, seed=1, length=6)
    args = ([OPEN, CLOSE], IMAGE, 4)
    base = tiny_config("sft.steps=4", "sft.batch_size=8")
    codec = tiny_config("sft.steps=4", "sft.batch_size=8", "sft.augment_codec=1.0")
    measured = fit_policy(base, train, held, tmp_path / "base", *args, world_model=tmp_path / "wm")
    assert 0 <= measured["held_out_codec_token_agreement"] <= 1 and measured["world_model"] == str(tmp_path / "wm")
    fit_policy(codec, train, held, tmp_path / "codec", *args, world_model=tmp_path / "wm")
    base_weights, codec_weights = load_file(tmp_path / "base" / "model.safetensors"), load_file(tmp_path / "codec" / "model.safetensors")
    assert any(not torch.equal(base_weights[k], codec_weights[k]) for k in base_weights)
    assert fit_policy(codec, train, held, tmp_path / "resumed", *args, stop_after=2, world_model=tmp_path / "wm") == {"stopped_at": 2}
    fit_policy(codec, train, held, tmp_path / "resumed", *args, world_model=tmp_path / "wm")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(codec_weights[k], resumed[k]) for k in codec_weights)

    with pytest.raises(ValueError, match="give the world model"):
        fit_policy(codec, train, held, tmp_path / "none", *args)
    (tmp_path / "wm" / "config.json").write_text(json.dumps({"kind": "world_model", "image_size": 64}))
    with pytest.raises(ValueError, match="imagines 64x64 frames; these are 32x32"):
        fit_policy(codec, train, held, tmp_path / "other", *args, world_model=tmp_path / "wm")
