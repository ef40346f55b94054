"""Batched on-device augmentations that imitate world-model artefacts.

A classifier trained on crisp simulator frames must still judge the blurry, colour-shifted,
noisy frames a video world model produces. Each function takes images (B, 3, H, W) in [0, 1] on
any device and draws its own per-image parameters: no Python loop over images, no CPU round trip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift(images: torch.Tensor, max_shift: float = 0.06) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` of its size (border pixels repeat)."""
    b = images.shape[0]
    theta = torch.zeros(b, 2, 3, device=images.device, dtype=images.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, :, 2] = (torch.rand(b, 2, device=images.device, dtype=images.dtype) * 2 - 1) * 2 * max_shift
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def colour_jitter(images: torch.Tensor, strength: float) -> torch.Tensor:
    """Random brightness, contrast and saturation factors in [1 - strength, 1 + strength] per image."""
    if strength <= 0:
        return images
    b = images.shape[0]

    def factors() -> torch.Tensor:
        return 1.0 + (torch.rand(b, 1, 1, 1, device=images.device, dtype=images.dtype) * 2 - 1) * strength

    images = images * factors()
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (images - mean) * factors() + mean
    grey = (0.299 * images[:, 0:1] + 0.587 * images[:, 1:2] + 0.114 * images[:, 2:3]).expand_as(images)
    images = (images - grey) * factors() + grey
    return images.clamp(0.0, 1.0)


def gaussian_blur(
    images: torch.Tensor, prob: float, sigma_range: tuple[float, float] = (0.1, 1.5), generator: torch.Generator | None = None
) -> torch.Tensor:
    """Blur a random ``prob`` share of the images with a per-image sigma (separable grouped conv).
    ``generator`` (optional, any device) makes the draws reproducible, e.g. for a training run's exact resume."""
    if prob <= 0:
        return images
    b, c, h, w = images.shape
    radius = max(1, int(round(3 * sigma_range[1])))
    offsets = torch.arange(-radius, radius + 1, device=images.device, dtype=images.dtype)
    if generator is None:
        sigma = torch.empty(b, 1, device=images.device, dtype=images.dtype).uniform_(*sigma_range)
        pick = torch.rand(b, 1, 1, 1, device=images.device)
    else:  # drawn where the generator lives, then moved
        draws = torch.rand(2, b, generator=generator, device=generator.device).to(images.device)
        sigma = (sigma_range[0] + draws[0] * (sigma_range[1] - sigma_range[0])).to(images.dtype)[:, None]
        pick = draws[1].view(b, 1, 1, 1)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (B, k)
    kernel = kernel.repeat_interleave(c, dim=0)  # (B*C, k): one kernel per image channel
    flat = images.reshape(1, b * c, h, w)
    flat = F.pad(flat, (radius, radius, radius, radius), mode="replicate")
    flat = F.conv2d(flat, kernel.view(b * c, 1, 1, -1), groups=b * c)
    flat = F.conv2d(flat, kernel.view(b * c, 1, -1, 1), groups=b * c)
    blurred = flat.view(b, c, h, w)
    chosen = (pick < prob).to(images.dtype)
    return chosen * blurred + (1 - chosen) * images


def pixel_noise(images: torch.Tensor, max_std: float) -> torch.Tensor:
    """Additive Gaussian noise with a per-image std drawn in [0, max_std]."""
    if max_std <= 0:
        return images
    std = torch.rand(images.shape[0], 1, 1, 1, device=images.device, dtype=images.dtype) * max_std
    return (images + torch.randn_like(images) * std).clamp(0.0, 1.0)


def world_model_artefacts(images: torch.Tensor, blur_prob: float = 0.5, jitter: float = 0.2, noise_std: float = 0.03) -> torch.Tensor:
    """Shift, colour jitter, blur and noise, in that order: a Gaussian blur (sigma in [0.1, 1.5] px) on a
    ``blur_prob`` share of the images, brightness, contrast and saturation changed by up to ``jitter``
    (relative), additive pixel noise of std drawn in [0, noise_std] on the [0, 1] scale."""
    images = random_shift(images)
    images = colour_jitter(images, jitter)
    images = gaussian_blur(images, blur_prob)
    return pixel_noise(images, noise_std)
