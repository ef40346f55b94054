"""TOPReward on a tiny random Qwen3-VL saved and loaded like the real Qwen3-VL-8B-Instruct folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _rewards_fixtures import TINY_VIDEO_SIZE, cue_episodes, drop_true_token
from worldloop.rewards.configuration import RewardConfig
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
    metrics = calibrate(judge, episodes, tmp_path, "topreward:tiny", stride=3)
    assert metrics["window"] == 16
    assert metrics["windows"] == 2 * 3  # labelled frames 1..9, every 3rd counted from the last
    assert (tmp_path / "histogram.png").stat().st_size > 1000
    scores = np.load(tmp_path / "scores.npz")
    assert scores["time"].tolist() == [3, 6, 9, 3, 6, 9]


def test_prompt_is_topreward_reference_and_scores_its_true_token(judge):
    """TOPReward's reference (QwenClient.compute_instruction_reward): the chat template on the video and the
    prefix only, cut at EOS, then "{instruction} Decide ... The answer is: True" raw; the reward is the
    log-probability of that last token. Our prompt stops before " True" and reads it at the last position."""
    from worldloop.rewards.topreward import PREFIX

    assert judge.prompt("open the drawer") == (
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>The above video shows a robot manipulation trajectory "
        "that completes the following task: open the drawer Decide whether the above statement is True or not. The answer is:"
    )
    video = windows(2, seed=3)
    processor, texts = judge.processor, INSTRUCTIONS[:2]
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": PREFIX}]}]
    chat = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False).split(processor.tokenizer.eos_token)[0]
    reference = []
    for i, text in enumerate(texts):  # the reference, one window at a time: labels masked but for the last token
        full = f"{chat}{text} Decide whether the above statement is True or not. The answer is: True"
        inputs = processor(text=[full], videos=[video[i].permute(0, 3, 1, 2)], video_metadata=[judge.video_metadata()],
                           do_sample_frames=False, return_tensors="pt")  # fmt: skip
        assert inputs["input_ids"][0, -1] == judge.true_id
        with torch.no_grad():
            logits = judge.model(**inputs, use_cache=False).logits
        reference.append(torch.log_softmax(logits[0, -2].float(), dim=-1)[inputs["input_ids"][0, -1]])
    torch.testing.assert_close(judge.score(video, texts), torch.stack(reference), atol=1e-4, rtol=1e-4)


def test_a_folder_without_a_chat_template_is_refused(qwen_folder, tmp_path):
    import shutil

    bare = tmp_path / "no-template"
    shutil.copytree(qwen_folder, bare)
    for name in ("chat_template.jinja", "chat_template.json"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no-template has no chat template"):
        load_judge(f"topreward:{bare}", "cpu")


@pytest.mark.parametrize(
    "frame_size, video_size, cap",
    [
        ((32, 32), TINY_VIDEO_SIZE, False),  # kept as they are: 2x2 patches
        ((48, 80), {"shortest_edge": 16 * 32 * 32, "longest_edge": 16 * 64 * 96}, False),  # upscaled bicubic, non-square
        ((96, 96), {"shortest_edge": 16 * 32 * 32, "longest_edge": 16 * 64 * 64}, False),  # downscaled with antialiasing
        ((96, 96), {"shortest_edge": 16 * 32 * 32, "longest_edge": 16 * 96 * 96}, True),  # the per-frame pixel cap
    ],
)
def test_video_patches_match_the_qwen3_vl_video_processor(frame_size, video_size, cap):
    """Pixel values within 1e-5 (the same resize, normalisation and patch order), the same grid."""
    from transformers import Qwen3VLVideoProcessor

    from worldloop.rewards.topreward_processing import VideoPatches

    processor = Qwen3VLVideoProcessor(size=video_size, cap_pixels_per_frame=cap, max_video_tokens=4)
    generator = torch.Generator().manual_seed(7)
    video = torch.randint(0, 256, (3, 16, *frame_size, 3), dtype=torch.uint8, generator=generator)
    metadata = [{"total_num_frames": 16, "fps": 2.0, "frames_indices": list(range(16))}] * 3
    reference = processor(videos=list(video.permute(0, 1, 4, 2, 3)), video_metadata=metadata, do_sample_frames=False, return_tensors="pt")
    pixel_values, grid = VideoPatches(processor)(video)
    assert grid.tolist() == reference["video_grid_thw"].tolist() and grid[0, 0] == 8
    assert pixel_values.shape == reference["pixel_values_videos"].shape
    torch.testing.assert_close(pixel_values, reference["pixel_values_videos"], atol=1e-5, rtol=0)
    assert pixel_values.std() > 0.2  # normalised pixels, not a constant


def test_inputs_on_device_match_the_processors_and_so_do_scores_and_verdicts(judge):
    """The default path (torch ops on the device, cached prompt tokens) against the transformers processor, on a
    fixed set of windows with instructions of several lengths (left padding): the same tokens, pixel values within
    1e-5, scores within 1e-4, and the same verdicts at a threshold among the scores."""
    video = windows(6, seed=11)
    texts = INSTRUCTIONS * 2
    fast = judge.inputs_on_device(video, texts)
    reference = judge.inputs_from_processor(video, texts)
    assert set(fast) == set(reference) - {"video_metadata"}
    for name in set(fast) - {"pixel_values_videos"}:
        assert torch.equal(fast[name].cpu(), reference[name].cpu()), name
    torch.testing.assert_close(fast["pixel_values_videos"], reference["pixel_values_videos"], atol=1e-5, rtol=0)
    assert judge.on_device
    scores = judge.score(video, texts)
    judge.on_device = False
    try:
        reference_scores = judge.score(video, texts)
    finally:
        judge.on_device = True
    torch.testing.assert_close(scores, reference_scores, atol=1e-4, rtol=1e-4)
    threshold = float(reference_scores.median().exp())
    assert torch.equal(scores.exp() >= threshold, reference_scores.exp() >= threshold)
    assert 0 < int((scores.exp() >= threshold).sum()) < len(texts)  # the threshold splits the set


def test_bench_times_both_input_paths_and_the_share_spent_building_inputs(capsys):
    from worldloop.rewards.bench import bench_topreward

    rows = bench_topreward(torch.device("cpu"), "tiny", [32], [2], 1, RewardConfig())
    assert [(row["inputs"], row["batch"]) for row in rows] == [("device", 2), ("processor", 2)]
    for row in rows:
        assert row["windows_per_s"] > 0 and 0 < row["inputs_share"] <= 1 and row["inputs_ms"] > 0, row
        assert row["tokens_per_window"] > 16 * 4  # 16 frames of >= 2x2 merged patches each, and the prompt
    assert rows[0]["tokens_per_window"] == rows[1]["tokens_per_window"]
    printed = capsys.readouterr().out
    assert "device" in printed and "processor" in printed
