"""TOPReward on a tiny random Qwen3-VL saved and loaded like the real Qwen3-VL-8B-Instruct folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _rewards_fixtures import TINY_VIDEO_SIZE, cue_episodes, drop_true_token
from worldloop.rewards.configuration import CalibrateConfig, RewardConfig
from worldloop.rewards import load_judge
from worldloop.rewards.protocol import Judge
from worldloop.rewards.qwen_random import save_random_qwen3_vl_folder
from worldloop.rewards.topreward import ANSWER

INSTRUCTIONS = ["open the drawer", "push the red button that sits on the wall", "pick up the puck and place it at the goal"]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return save_random_qwen3_vl_folder(tmp_path_factory.mktemp("qwen") / "Qwen3-VL-tiny", "tiny", video_size=TINY_VIDEO_SIZE)


@pytest.fixture(scope="module")
def judge(qwen_folder):
    torch.manual_seed(0)
    judge = load_judge(f"topreward:{qwen_folder}", "cpu")
    with torch.no_grad():
        judge.model.lm_head.weight.mul_(200.0)  # spread the random model's answers so scores differ visibly
    return judge


def windows(batch: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 16, 32, 32, 3), dtype=torch.uint8, generator=generator)


def test_tokenizer_is_qwen_and_true_is_one_token(judge):
    tokenizer = judge.processor.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|video_pad|>") == judge.model.config.video_token_id == 151656
    assert tokenizer.encode(ANSWER, add_special_tokens=False) == [judge.true_id]
    assert judge.true_id == 3007  # " True" in Qwen's BPE ranks
    assert isinstance(judge, Judge) and judge.window == 16 and judge.threshold == pytest.approx(0.46)


def test_all_16_frames_reach_the_model_and_true_is_read_at_the_last_position(judge):
    seen = {}
    forward = judge.model.forward

    def spy(**kwargs):
        seen.update(kwargs)
        return forward(**kwargs)

    judge.model.forward = spy
    try:
        video = windows(3)
        scores = judge.score(video, INSTRUCTIONS)
    finally:
        del judge.model.forward
    grid = seen["video_grid_thw"]
    assert grid[:, 0].tolist() == [8, 8, 8]  # 16 frames / temporal patch 2: no frame sampled away
    assert seen["pixel_values_videos"].shape[0] == int(grid.prod(dim=1).sum())
    assert seen["logits_to_keep"] == 1
    assert bool(seen["attention_mask"][:, -1].all())  # left padding: the last position is every prompt's end
    colon = judge.processor.tokenizer.encode(":", add_special_tokens=False)
    assert seen["input_ids"][:, -1].tolist() == colon * 3
    # The score is log-softmax of the full model's last position at " True".
    inputs = judge.inputs(video, INSTRUCTIONS)
    with torch.no_grad():
        logits = judge.model(**inputs, use_cache=False).logits
    expected = torch.log_softmax(logits[:, -1].float(), dim=-1)[:, judge.true_id]
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    # The first frame of the window matters (it was not dropped).
    changed = video.clone()
    changed[:, 0] = 255 - changed[:, 0]
    assert (judge.score(changed, INSTRUCTIONS) - scores).abs().max() > 1e-6


def test_batched_scores_equal_one_by_one(judge):
    video = windows(3, seed=1)
    batched = judge.score(video, INSTRUCTIONS)
    single = torch.cat([judge.score(video[i : i + 1], INSTRUCTIONS[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=1e-4)
    assert (batched.max() - batched.min()) > 1e-3  # the scores really differ between windows
    assert torch.equal(judge.success(video, INSTRUCTIONS), batched.exp() >= judge.threshold)


def test_bad_input_gives_clear_errors(judge):
    with pytest.raises(ValueError, match="windows of 16 frames, got 8"):
        judge.score(windows(2)[:, :8], INSTRUCTIONS[:2])
    with pytest.raises(ValueError, match=r"one instruction per window \(2\), got 3"):
        judge.score(windows(2), INSTRUCTIONS)
    with pytest.raises(TypeError, match="uint8"):
        judge.score(windows(2).float(), INSTRUCTIONS[:2])


def test_folder_without_single_true_token_is_refused(qwen_folder, tmp_path):
    broken = drop_true_token(qwen_folder, tmp_path / "no-true")
    with pytest.raises(ValueError, match="' True' to be one token"):
        load_judge(f"topreward:{broken}", "cpu")
    with pytest.raises(FileNotFoundError, match="not a Qwen3-VL model folder"):
        load_judge(f"topreward:{tmp_path}", "cpu")


def test_calibrate_topreward_windows(judge, tmp_path):
    from worldloop.rewards.calibrate import calibrate

    episodes = cue_episodes(2, length=10)
    metrics = calibrate(judge, episodes, CalibrateConfig(stride=3, batch_size=4), tmp_path, "topreward:tiny")
    assert metrics["window"] == 16
    assert metrics["windows"] == 2 * 3  # labelled frames 1..9, every 3rd counted from the last
    assert (tmp_path / "histogram.png").stat().st_size > 1000
    assert RewardConfig().topreward.window == judge.window
    scores = np.load(tmp_path / "scores.npz")
    assert scores["time"].tolist() == [3, 6, 9, 3, 6, 9]
