"""MP4 video files: uint8 RGB frames in, uint8 RGB frames out (PyAV, H.264, yuv420p).

Frames are stored with time base 1/fps and presentation timestamps 0, 1, 2, ..., so frame ``i``
lies at ``i / fps`` seconds, exactly what LeRobot's decoders look up. Writes are atomic: the file
appears whole under its name or not at all.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from worldloop.utils.io import atomic_path

CODECS = ("libx264", "h264", "mpeg4")
"""Encoders tried in order; the first PyAV build offers is used. H.264 is what LeRobot (pyav or
torchcodec) expects; MPEG-4 part 2 is a fallback that every FFmpeg build has."""
PIX_FMT = "yuv420p"


def write_mp4(path: str | Path, frames: np.ndarray, fps: int, crf: int = 18) -> None:
    """Encode ``frames`` (T, H, W, 3) uint8 RGB at ``fps`` into ``path`` (H.264, yuv420p).

    ``crf`` is x264's constant rate factor (0 lossless-ish luma, 18 visually lossless, 23 default).
    H and W must be even (yuv420p halves the chroma planes).
    """
    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"write_mp4({path}): frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if len(frames) == 0:
        raise ValueError(f"write_mp4({path}): no frames to write")
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise ValueError(f"write_mp4({path}): height and width must be even for yuv420p, got {height}x{width}")
    with atomic_path(path) as tmp:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream(video_codec(), rate=int(fps))
            stream.width, stream.height, stream.pix_fmt = width, height, PIX_FMT
            stream.time_base = Fraction(1, int(fps))
            # Every frame a keyframe would be huge; a short GOP keeps random access cheap.
            if stream.codec_context.name == "libx264":
                stream.options = {"crf": str(crf), "g": "8", "bf": "0", "preset": "veryfast"}
            else:
                stream.options = {"g": "8", "bf": "0"}
                stream.bit_rate = 4 * width * height * int(fps)
            stream.codec_context.time_base = Fraction(1, int(fps))
            for i, rgb in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts = i
                frame.time_base = Fraction(1, int(fps))
                container.mux(stream.encode(frame))
            container.mux(stream.encode())


def video_codec() -> str:
    """Name of the encoder :func:`write_mp4` uses with this PyAV build."""
    import av

    for codec in CODECS:
        if codec in av.codecs_available:
            return codec
    raise RuntimeError(f"PyAV offers none of the encoders {CODECS}; reinstall 'av' from PyPI (its wheels include libx264)")


def read_mp4(path: str | Path, start_time: float | None = None, end_time: float | None = None) -> np.ndarray:
    """Decode ``path`` into uint8 RGB frames (T, H, W, 3).

    ``start_time``/``end_time`` (seconds, end exclusive) select the frames whose timestamps lie in
    [start_time, end_time); this is how one episode is cut out of a video file that holds several
    (LeRobot v3 ``from_timestamp``/``to_timestamp``). A missing, truncated or corrupt file raises
    an error that names it.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file {path} does not exist")
    # Timestamps in a file are multiples of 1/fps; half a frame of slack absorbs float rounding.
    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"video file {path} has no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            rate = float(stream.average_rate or stream.guessed_rate or 0) or None
            slack = 0.5 / rate if rate else 1e-4
            expected = stream.frames or None
            if start_time is not None and start_time > 0:
                container.seek(int(max(start_time - 1.0, 0) / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                t = float(frame.pts * stream.time_base) if frame.pts is not None else float(frame.time or 0)
                if start_time is not None and t < start_time - slack:
                    continue
                if end_time is not None and t >= end_time - slack:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, EOFError) as error:
        raise ValueError(f"video file {path} is truncated or corrupt ({error})") from error
    if not frames:
        if start_time is None and end_time is None:
            raise ValueError(f"video file {path} holds no decodable frame; it is truncated or corrupt")
        raise ValueError(f"video file {path} holds no frame in [{start_time}, {end_time}) s; the file is truncated or the metadata is wrong")
    if start_time is None and end_time is None and expected and len(frames) < expected:
        raise ValueError(f"video file {path} decoded {len(frames)} of its {expected} frames; it is truncated or corrupt")
    return np.stack(frames)
