"""Frame-quality metrics on uint8 video: PSNR and SSIM, per frame, in torch (CPU or GPU).

LPIPS, FID and FVD need pretrained feature networks; worldloop downloads nothing, so they are
reported as "unavailable" unless their weights are found locally (see :func:`feature_metrics_status`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

UNAVAILABLE = "unavailable (feature-network weights not found locally)"


def _as_float(frames: torch.Tensor) -> torch.Tensor:
    """(..., H, W, 3) uint8 -> (M, 3, H, W) float in [0, 1]."""
    if frames.dtype != torch.uint8 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames (..., H, W, 3), got {frames.dtype} {tuple(frames.shape)}")
    return frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2).float() / 255.0


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio (dB) per frame of uint8 (..., H, W, 3) frames; shape (...)."""
    if pred.shape != target.shape:
        raise ValueError(f"psnr: shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
    mse = (_as_float(pred) - _as_float(target)).pow(2).mean(dim=(1, 2, 3)).clamp_min(1e-10)
    return (-10.0 * torch.log10(mse)).reshape(pred.shape[:-3])


STILL_TOLERANCE = 8  # uint8 levels: video-codec and renderer noise stay below it, an object's edge does not


def moving_pixels(frames: torch.Tensor) -> torch.Tensor:
    """uint8 clips (B, T, H, W, 3) -> bool (B, T, H, W): the pixels that differ from the clip's first frame by more than
    ``STILL_TOLERANCE`` in some channel (the robot and what it moved; none in frame 0)."""
    return (frames.short() - frames[:, :1].short()).abs().amax(dim=-1) > STILL_TOLERANCE


def masked_psnr(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PSNR (dB) per frame over the pixels where ``mask`` (..., H, W) is true; NaN for a frame with none."""
    if pred.shape != target.shape or mask.shape != pred.shape[:-1]:
        raise ValueError(f"masked_psnr: shapes differ: {tuple(pred.shape)}, {tuple(target.shape)}, mask {tuple(mask.shape)}")
    weights = mask.reshape(-1, 1, *mask.shape[-2:]).float()
    squared = (_as_float(pred) - _as_float(target)).pow(2) * weights
    pixels = weights.sum(dim=(1, 2, 3)) * 3
    mse = (squared.sum(dim=(1, 2, 3)) / pixels.clamp_min(1)).clamp_min(1e-10)
    return torch.where(pixels > 0, -10.0 * torch.log10(mse), torch.nan).reshape(pred.shape[:-3])


def _gaussian_window(size: int, sigma: float, device: torch.device) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(3, 1, size, size).contiguous()


def ssim(pred: torch.Tensor, target: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004, Gaussian 11x11 window, per channel, averaged) per frame."""
    if pred.shape != target.shape:
        raise ValueError(f"ssim: shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
    x, y = _as_float(pred), _as_float(target)
    size = min(window, x.shape[-1], x.shape[-2])
    kernel = _gaussian_window(size, sigma, x.device)
    c1, c2 = 0.01**2, 0.03**2

    def blur(v: torch.Tensor) -> torch.Tensor:
        return F.conv2d(v, kernel, groups=3)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    value = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return value.mean(dim=(1, 2, 3)).reshape(pred.shape[:-3])


def sharpness(frames: torch.Tensor) -> torch.Tensor:
    """Mean absolute Laplacian (4-neighbour, per channel, interior pixels) per frame of uint8 (..., H, W, 3)
    frames: the fine detail a frame holds. PSNR rewards a blurred mean prediction; this does not, and a policy
    that acts on imagined frames sees the difference (small parts such as the gripper's fingers)."""
    x = _as_float(frames)
    laplacian = x[:, :, 1:-1, :-2] + x[:, :, 1:-1, 2:] + x[:, :, :-2, 1:-1] + x[:, :, 2:, 1:-1] - 4 * x[:, :, 1:-1, 1:-1]
    return laplacian.abs().mean(dim=(1, 2, 3)).reshape(frames.shape[:-3])


def feature_metrics_status() -> dict[str, str]:
    """LPIPS / FID / FVD: their networks' weights are not shipped with any installed package."""
    return {"lpips": UNAVAILABLE, "fid": UNAVAILABLE, "fvd": UNAVAILABLE}
