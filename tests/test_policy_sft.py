"""Supervised fine-tuning: the instruction decides the action after a short SFT; exact resume."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from _policy_fixtures import CLOSE, OPEN, IMAGE, images, synthetic_episodes, tiny_config
from worldloop.policies.modeling_vla import CompactVLA
from worldloop.policies.sft import action_chunks, fit_policy, random_blur, random_shift, select_episodes


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


def test_random_blur_blurs_a_share_of_frames_reproducibly():
    frames = torch.randint(0, 256, (64, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    blurred = random_blur(frames, 0.5, torch.Generator().manual_seed(1))
    assert blurred.shape == frames.shape and blurred.dtype == torch.uint8
    changed = (blurred != frames).flatten(1).any(dim=1)
    assert 16 < int(changed.sum()) < 48  # about half of the frames
    assert blurred[changed].float().std() < frames[changed].float().std()  # blur smooths noise
    assert torch.equal(blurred, random_blur(frames, 0.5, torch.Generator().manual_seed(1)))
    assert torch.equal(random_blur(frames, 0.0, torch.Generator()), frames)
    with pytest.raises(ValueError, match="augment_blur is a share of frames"):
        tiny_config("sft.augment_blur=1.5")


def test_instruction_decides_the_action_after_sft(tmp_path):
    """Frames look alike for both instructions: only the instruction can tell +0.8 from -0.8."""
    config = tiny_config("sft.steps=150", "sft.checkpoint_every=1000", "sft.eval_every=75")
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
    config = tiny_config("sft.steps=6", "sft.checkpoint_every=100", "sft.batch_size=8", "sft.augment_blur=0.5")
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
