"""TOPReward: a frozen Qwen3-VL judges a video window, score = log P(" True"). No training.

For each environment the judge reads a ``window`` of frames (16: the previous and the current
chunk) and a prompt built as TOPReward's reference (``QwenClient.compute_instruction_reward``) builds it:
the chat template applied to the video and the prefix only, cut at the tokenizer's EOS, and the rest
appended raw, with no assistant turn:

    <|im_start|>user
    <|vision_start|><|video_pad|><|vision_end|>The above video shows a robot manipulation trajectory that
    completes the following task: {instruction} Decide whether the above statement is True or not. The answer is:

The score is the log-softmax of the last position's logits at the single token " True" (the reference
appends " True" and reads its log-probability: the same number). Success is ``exp(score) >= threshold``;
TOPReward publishes no threshold (0.46 was the seed's, on LIBERO): calibrate one per suite
(rl.judge_threshold=replay, or ``calibrate-reward``).

Pitfall handled here: given bare frames, the Qwen3-VL processor re-samples the video at its
``fps`` (2) from a guessed 24 fps and keeps 4 of 16 frames. We pass ``video_metadata`` (all 16
frame indices, ``VIDEO_FPS``) and ``do_sample_frames=False``, so all 16 frames reach the model
(``video_grid_thw[:, 0] == window / temporal_patch_size``, checked on every call).

Inputs are built on the model's device by default (``worldloop.rewards.topreward_processing``: one
batched resize + normalise + patchify, prompt tokens cached per instruction); ``on_device=False`` takes
the transformers processor instead (the reference the tests compare with). All windows of a call go
through one forward pass (split at ``max_batch``), left-padded so that the last position is every
prompt's last token, with ``logits_to_keep=1``; bf16 on GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from worldloop.rewards.configuration import TOPRewardConfig
from worldloop.rewards.protocol import check_windows, judged_success

PREFIX = "The above video shows a robot manipulation trajectory that completes the following task: "
"""The templated part of the prompt, after the video."""
SUFFIX = "{instruction} Decide whether the above statement is True or not. The answer is:"
"""Appended raw after the templated video + prefix."""
ANSWER = " True"
VIDEO_FPS = 2.0
"""Frame rate the window's timestamps claim in the prompt ('<0.2 seconds>' ...), in frames per second."""


WINDOW = 16
"""Frames per judged window: the previous and the current chunk, all of them shown to the model."""


class TOPReward:
    """Judge with ``WINDOW`` frames, backed by ``Qwen3VLForConditionalGeneration``;
    ``on_device`` builds its inputs with torch ops on ``device`` (False: the transformers processor)."""

    def __init__(self, model: Any, processor: Any, config: TOPRewardConfig, device: torch.device, on_device: bool = True):
        from worldloop.rewards.topreward_processing import PromptTokens, VideoPatches

        self.model = model
        self.processor = processor
        self.config = config
        self.window = WINDOW
        self.threshold = config.threshold
        self.task_thresholds: dict[str, float] = {}
        self.device = device
        self.on_device = on_device
        self.true_id = answer_token_id(processor.tokenizer)
        self.processor.tokenizer.padding_side = "left"
        self.temporal_patch_size = int(processor.video_processor.temporal_patch_size)
        if self.window % self.temporal_patch_size:
            raise ValueError(f"TOPReward's window of {self.window} frames must be a multiple of the video temporal patch size {self.temporal_patch_size}")
        self.templated = templated_prefix(processor)
        self.video_patches = VideoPatches(processor.video_processor)
        self.prompt_tokens = PromptTokens(processor, self.prompt, self.video_metadata)

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
        templated_prefix(processor, where=str(path))
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        config = getattr(config, "topreward", config) or TOPRewardConfig()
        model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device).eval(), processor, config, device)

    # ---------------------------------------------------------------- processing
    def prompt(self, instruction: str) -> str:
        """The text of one window's prompt: the templated video + prefix, then the suffix raw."""
        return self.templated + SUFFIX.format(instruction=instruction)

    def video_metadata(self) -> dict[str, Any]:
        """Every frame of the window kept, at ``VIDEO_FPS`` (the processor's timestamps come from it)."""
        return {"total_num_frames": self.window, "fps": VIDEO_FPS, "frames_indices": list(range(self.window))}

    def inputs(self, windows: torch.Tensor, instructions: Sequence[str]) -> dict[str, torch.Tensor]:
        """Model inputs for (B, window, H, W, 3) uint8 windows; every frame is kept."""
        if self.on_device:
            inputs = self.inputs_on_device(windows, instructions)
        else:
            inputs = self.inputs_from_processor(windows, instructions)
        grid = inputs["video_grid_thw"]
        expected = self.window // self.temporal_patch_size
        if grid.shape[0] != len(instructions) or not bool((grid[:, 0] == expected).all()):
            raise RuntimeError(
                f"TOPReward: the processor kept {grid[:, 0].tolist()} temporal patches per video, expected {expected} "
                f"({self.window} frames): frames were dropped"
            )
        return inputs

    def inputs_on_device(self, windows: torch.Tensor, instructions: Sequence[str]) -> dict[str, torch.Tensor]:
        """As :meth:`inputs_from_processor` returns them, built with batched torch ops on the device."""
        _, frames, height, width, _ = windows.shape
        pixel_values, grid = self.video_patches(windows.to(self.device))
        tokens = self.prompt_tokens(instructions, frames, height, width, self.device)
        return tokens | {"pixel_values_videos": pixel_values, "video_grid_thw": grid.to(self.device)}

    def inputs_from_processor(self, windows: torch.Tensor, instructions: Sequence[str]) -> dict[str, torch.Tensor]:
        """The transformers Qwen3-VL processor's inputs (the reference for :meth:`inputs_on_device`)."""
        frames = windows.to(self.device).permute(0, 1, 4, 2, 3)  # (B, T, 3, H, W), the processor's native layout
        inputs = self.processor(
            text=[self.prompt(text) for text in instructions],
            videos=list(frames),
            video_metadata=[self.video_metadata()] * len(instructions),
            do_sample_frames=False,
            padding=True,
            return_tensors="pt",
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
            scores.append(self.forward(self.inputs(windows[start:stop], instructions[start:stop])))
        return torch.cat(scores)

    @torch.no_grad()
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Model inputs -> (b,) log P(" True") at the last position."""
        logits = self.model(**inputs, logits_to_keep=1, use_cache=False).logits  # (b, 1, vocab)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)[:, self.true_id]

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.exp()

    def success(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        return judged_success(self, windows, instructions)


def templated_prefix(processor: Any, where: str = "the processor") -> str:
    """The chat template applied to a user turn of the video and :data:`PREFIX`, cut at the tokenizer's EOS
    (TOPReward's reference: the instruction and the answer then follow raw, with no end of turn)."""
    if not getattr(processor, "chat_template", None):
        raise ValueError(f"TOPReward: {where} has no chat template (chat_template.jinja or chat_template.json); "
                         "the prompt is the model's chat template on the video and prefix")  # fmt: skip
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": PREFIX}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    eos = processor.tokenizer.eos_token
    return text.split(eos)[0] if eos else text


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
