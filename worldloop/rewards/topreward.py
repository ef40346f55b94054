"""TOPReward: a frozen Qwen3-VL judges a video window, score = log P(" True"). No training.

For each environment the judge reads a ``window`` of frames (16: the previous and the current
chunk) and the prompt, used raw, without the chat template:

    <video> The above video shows a robot manipulation trajectory that completes the following
    task: {instruction} Decide whether the above statement is True or not. The answer is:

and returns the log-softmax of the last position's logits at the single token " True".
Success is ``exp(score) >= threshold`` (0.46 in the seed).

Pitfall handled here: given bare frames, the Qwen3-VL processor re-samples the video at its
``fps`` (2) from a guessed 24 fps and keeps 4 of 16 frames. We pass ``video_metadata`` (all 16
frame indices, ``VIDEO_FPS``) and ``do_sample_frames=False``, so all 16 frames reach the model
(``video_grid_thw[:, 0] == window / temporal_patch_size``, checked on every call).

All windows go through one processor call and one forward pass (split at ``max_batch``), left-padded
so that the last position is every prompt's last token, with ``logits_to_keep=1``; bf16 on GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from worldloop.rewards.configuration import TOPRewardConfig
from worldloop.rewards.protocol import check_windows, judged_success

PROMPT = (
    "{video} The above video shows a robot manipulation trajectory that completes the following task: "
    "{instruction} Decide whether the above statement is True or not. The answer is:"
)
ANSWER = " True"
VIDEO_FPS = 2.0
"""Frame rate the window's timestamps claim in the prompt ('<0.2 seconds>' ...), in frames per second."""


class TOPReward:
    """Judge with ``window = config.window`` frames, backed by ``Qwen3VLForConditionalGeneration``."""

    def __init__(self, model: Any, processor: Any, config: TOPRewardConfig, device: torch.device):
        self.model = model
        self.processor = processor
        self.config = config
        self.window = config.window
        self.threshold = config.threshold
        self.task_thresholds: dict[str, float] = {}
        self.device = device
        self.true_id = answer_token_id(processor.tokenizer)
        self.processor.tokenizer.padding_side = "left"
        self.temporal_patch_size = int(processor.video_processor.temporal_patch_size)
        if self.window % self.temporal_patch_size:
            raise ValueError(f"topreward.window={self.window} must be a multiple of the video temporal patch size {self.temporal_patch_size}")

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu", config: Any = None) -> "TOPReward":
        """Load model + processor from a local Qwen3-VL folder (e.g. the Qwen3-VL-8B-Instruct download);
        ``config``: a TOPRewardConfig, or a RewardConfig whose ``topreward`` section is read."""
        from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"TOPReward: {path} is not a Qwen3-VL model folder (no config.json)")
        device = torch.device(device)
        processor = AutoProcessor.from_pretrained(str(path))
        answer_token_id(processor.tokenizer, where=str(path))  # refuse before loading the weights
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        config = getattr(config, "topreward", config) or TOPRewardConfig()
        model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device).eval(), processor, config, device)

    # ---------------------------------------------------------------- processing
    def prompts(self, instructions: Sequence[str]) -> list[str]:
        return [PROMPT.format(video=self.processor.video_token, instruction=text) for text in instructions]

    def inputs(self, windows: torch.Tensor, instructions: Sequence[str]) -> dict[str, torch.Tensor]:
        """Processor inputs for (B, window, H, W, 3) uint8 windows; every frame is kept."""
        frames = windows.to(self.device).permute(0, 1, 4, 2, 3)  # (B, T, 3, H, W), the processor's native layout
        metadata = [
            {"total_num_frames": self.window, "fps": VIDEO_FPS, "frames_indices": list(range(self.window))}
        ] * len(instructions)
        inputs = self.processor(
            text=self.prompts(instructions),
            videos=list(frames),
            video_metadata=metadata,
            do_sample_frames=False,
            padding=True,
            return_tensors="pt",
        )
        grid = inputs["video_grid_thw"]
        expected = self.window // self.temporal_patch_size
        if grid.shape[0] != len(instructions) or not bool((grid[:, 0] == expected).all()):
            raise RuntimeError(
                f"TOPReward: the processor kept {grid[:, 0].tolist()} temporal patches per video, expected {expected} "
                f"({self.window} frames): frames were dropped"
            )
        return {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}

    # ---------------------------------------------------------------- judge protocol
    @torch.no_grad()
    def score(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """(B, window, H, W, 3) uint8 -> (B,) log P(" True" | window, prompt), float32 on the device."""
        check_windows(windows, instructions, self.window, "TOPReward")
        scores = []
        for start in range(0, len(instructions), self.config.max_batch):  # memory bound, not per env
            stop = start + self.config.max_batch
            inputs = self.inputs(windows[start:stop], instructions[start:stop])
            logits = self.model(**inputs, logits_to_keep=1, use_cache=False).logits  # (b, 1, vocab)
            scores.append(torch.log_softmax(logits[:, -1].float(), dim=-1)[:, self.true_id])
        return torch.cat(scores)

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.exp()

    def success(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        return judged_success(self, windows, instructions)


def answer_token_id(tokenizer: Any, where: str = "the tokenizer") -> int:
    """The id of the single token " True"; refuse tokenizers that split it."""
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(
            f"TOPReward needs '{ANSWER}' to be one token, but {where} splits it into {len(ids)} tokens {pieces}; "
            "this is not a Qwen3-VL tokenizer (log P(' True') would be undefined)"
        )
    return int(ids[0])
