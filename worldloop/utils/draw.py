"""Annotating videos for reports: an instruction caption and a success mark, and side-by-side layout.

PIL draws the text (this is for report videos, never the training or RL hot path). Frames are uint8
(T, H, W, 3) numpy arrays or tensors; the result is always a numpy array.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SUCCESS_COLOUR = (40, 200, 60)
FAILURE_COLOUR = (220, 40, 40)


def _frames(frames) -> np.ndarray:
    array = frames.detach().cpu().numpy() if hasattr(frames, "detach") else np.asarray(frames)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {array.dtype} {array.shape}")
    return array


def _font(height: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=max(8, height))
    except TypeError:  # Pillow < 10.1 has one bitmap size
        return ImageFont.load_default()


def caption(frames, text: str, success: bool | None = None) -> np.ndarray:
    """Frames with ``text`` on a dark band at the bottom and, when ``success`` is given, a green
    (success) or red (failure) square in the top-right corner. Same shape as the input."""
    video = _frames(frames).copy()
    _, height, width, _ = video.shape
    band = max(10, height // 8)
    font = _font(band - 2)
    label = Image.new("RGB", (width, band), (0, 0, 0))
    draw = ImageDraw.Draw(label)
    shown = text
    while shown and draw.textlength(shown, font=font) > width - 4:
        shown = shown[:-2] + "…" if len(shown) > 2 else ""
    draw.text((2, 0), shown, fill=(255, 255, 255), font=font)
    strip = np.asarray(label)
    video[:, height - band :, :, :] = (0.35 * video[:, height - band :, :, :] + strip).clip(0, 255).astype(np.uint8)
    if success is not None:
        side = max(4, height // 10)
        video[:, 1 : 1 + side, width - 1 - side : width - 1] = SUCCESS_COLOUR if success else FAILURE_COLOUR
    return video


def side_by_side(*videos) -> np.ndarray:
    """Videos placed left to right; shorter ones hold their last frame, heights must match."""
    arrays = [_frames(v) for v in videos]
    if not arrays:
        raise ValueError("side_by_side needs at least one video")
    heights = {a.shape[1] for a in arrays}
    if len(heights) != 1:
        raise ValueError(f"side_by_side: videos have different heights {sorted(heights)}")
    length = max(len(a) for a in arrays)
    padded = [np.concatenate([a, np.repeat(a[-1:], length - len(a), axis=0)]) if len(a) < length else a for a in arrays]
    return np.concatenate(padded, axis=2)
