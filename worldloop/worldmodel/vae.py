"""The video VAE: diffusers ``AutoencoderKLWan`` (causal 3D, 4x temporal) and how frames get in and out.

Frames are uint8 ``(B, T, H, W, 3)``; latents are ``(B, C, 1 + (T - 1) / 4, H / s, W / s)``,
normalised per channel with the ``latents_mean`` / ``latents_std`` stored in the VAE's own config
(the diffusers convention, so a Wan2.2 VAE folder works unchanged). A VAE trained here gets its
statistics measured on the training frames.

:class:`StreamingDecoder` decodes latent frames one chunk at a time while keeping the causal
convolution cache between calls: a rollout decodes only its new latents and the frames still
continue smoothly from the previous chunk.
"""

from __future__ import annotations

from pathlib import Path

import torch

from worldloop.worldmodel.configuration import VAEConfig

TEMPORAL_FACTOR = 4


def vae_architecture(size: str, spatial_downsamples: int = 3) -> dict:
    """diffusers ``AutoencoderKLWan`` constructor arguments for a named size."""
    if size == "wan2.2-5b":
        z_dim = 48
        return dict(
            base_dim=160, decoder_base_dim=256, z_dim=z_dim, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
            in_channels=12, out_channels=12,  # 2x2 patchified RGB, as in the Wan2.2 VAE
            temperal_downsample=[False, True, True], is_residual=True, patch_size=2,
            scale_factor_spatial=16, scale_factor_temporal=4,
            latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
        )  # fmt: skip
    base_dim, z_dim, widest, res_blocks = {"tiny": (16, 8, 2, 1), "small": (64, 32, 4, 1)}[size]
    mult = {3: [1, 2, widest, widest], 2: [1, 2, widest]}[spatial_downsamples]
    return dict(
        base_dim=base_dim, z_dim=z_dim, dim_mult=mult, num_res_blocks=res_blocks,
        temperal_downsample=[False] * (len(mult) - 3) + [True, True],
        scale_factor_spatial=2**spatial_downsamples, scale_factor_temporal=4,
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    )  # fmt: skip


def build_vae(config: VAEConfig):
    """A randomly initialised ``AutoencoderKLWan`` of ``config.size`` (its decoder ``config.decoder_base_dim`` wide)."""
    from diffusers import AutoencoderKLWan

    architecture = vae_architecture(config.size, config.spatial_downsamples)
    if config.decoder_base_dim is not None:  # else the size's own (the Wan2.2 VAE's 256, the encoder's elsewhere)
        architecture["decoder_base_dim"] = config.decoder_base_dim
    return AutoencoderKLWan(**architecture)


ENCODING = ("encoder.", "quant_conv.")
"""The parameters that turn frames into latents: a light decoder's VAE keeps its teacher's."""


def decoder_width(vae) -> int:
    """Channels of the decoder's first stage (diffusers' ``decoder_base_dim``, which defaults to ``base_dim``)."""
    return int(vae.config.decoder_base_dim or vae.config.base_dim)


def narrow_decoder(teacher, decoder_base_dim: int):
    """A VAE with ``teacher``'s encoder (its weights, frozen) and latent statistics and a new, randomly initialised
    decoder ``decoder_base_dim`` wide: what `train-vae` distils into a light decoder of ``teacher``'s latents."""
    from diffusers import AutoencoderKLWan

    config = {k: v for k, v in teacher.config.items() if not k.startswith("_")} | {"decoder_base_dim": decoder_base_dim}
    light = AutoencoderKLWan.from_config(config).to(next(teacher.parameters()).device)
    encoding = {k: v for k, v in teacher.state_dict().items() if k.startswith(ENCODING)}
    missing = [k for k in light.load_state_dict(encoding, strict=False).missing_keys if k.startswith(ENCODING)]
    if missing:
        raise ValueError(f"the light decoder's VAE lacks {missing[:3]} of its teacher's encoder")
    for name, parameter in light.named_parameters():
        parameter.requires_grad_(not name.startswith(ENCODING))
    return light


def check_same_encoding(vae, reference, what: str) -> None:
    """Refuse a VAE (a light decoder's, ``what``) that does not encode as ``reference`` does: latents of another
    encoder, layout or normalisation would be decoded as if they were the reference's."""
    for key in ("z_dim", "scale_factor_spatial", "scale_factor_temporal", "patch_size", "latents_mean", "latents_std"):
        if vae.config[key] != reference.config[key]:
            raise ValueError(f"{what} has {key} {str(vae.config[key])[:60]}, the world model's VAE {str(reference.config[key])[:60]}: "
                             f"decode with a light decoder distilled from this world model's VAE (vae.init=WM/vae)")  # fmt: skip
    theirs = vae.state_dict()
    for name, tensor in reference.state_dict().items():
        if name.startswith(ENCODING) and (name not in theirs or not torch.equal(theirs[name].to(tensor), tensor)):
            raise ValueError(f"{what}'s encoder differs from the world model's VAE ({name}): it was not distilled from it")


def load_vae(folder: str | Path):
    """An ``AutoencoderKLWan`` from a local diffusers-format folder (config.json + safetensors weights).

    Built from the config and filled with ``load_state_dict(strict=True)``: every tensor must be in
    the file, nothing is left at its random initialisation whichever loading path diffusers prefers."""
    from diffusers import AutoencoderKLWan

    from worldloop.utils.checkpoint import read_finite_weights

    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a diffusers VAE folder (no config.json)")
    weights = sorted(folder.glob("*.safetensors"))
    if len(weights) != 1:
        raise FileNotFoundError(f"{folder} must hold exactly one .safetensors weights file, found {[w.name for w in weights]}")
    vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(folder)))
    try:
        vae.load_state_dict(read_finite_weights(weights[0]), strict=True)
    except RuntimeError as error:
        raise ValueError(f"{weights[0]} does not match the VAE described by {config_file}: {str(error)[:300]}") from error
    return vae.eval()


def world_model_vae(folder: str | Path, image_size: int):
    """The VAE of a world-model folder (its vae/), or a VAE folder itself: what imagination shows a policy through.
    A world model of another resolution than ``image_size`` is refused (its frames are not what the policy sees)."""
    import json

    folder = Path(folder)
    if (folder / "vae" / "config.json").is_file():
        trained_at = json.loads((folder / "config.json").read_text()).get("image_size") if (folder / "config.json").is_file() else None
        if trained_at is not None and int(trained_at) != image_size:
            raise ValueError(f"world model {folder} imagines {trained_at}x{trained_at} frames; these are {image_size}x{image_size} (sim.image_size)")
        folder = folder / "vae"
    return load_vae(folder)


def check_frames(folder: str | Path, vae, image_size: int, source: str) -> None:
    """Refuse frames of ``source`` (image_size x image_size) that the VAE of ``folder`` cannot encode or was not
    trained on (the frame size a `worldloop train-vae` folder's metrics.json records)."""
    from worldloop.utils.io import read_json

    factor = spatial_factor(vae)
    if image_size % factor:
        raise ValueError(f"{source} holds {image_size}x{image_size} frames, not divisible by the {factor}x spatial compression of the VAE {folder}")
    metrics = Path(folder) / "metrics.json"
    trained_at = read_json(metrics).get("image_size") if metrics.is_file() else None
    if trained_at is not None and int(trained_at) != image_size:
        raise ValueError(f"the VAE {folder} was trained on {trained_at}x{trained_at} frames, {source} holds {image_size}x{image_size}: "
                         f"train a VAE on these frames (worldloop train-vae --dataset {source}) or use data of {trained_at}x{trained_at}")  # fmt: skip


def spatial_factor(vae) -> int:
    return int(vae.config.scale_factor_spatial)


def latent_frames(num_frames: int) -> int:
    """Latent frames of a clip of ``num_frames`` (1 + 4k) frames under the 4x causal VAE."""
    if num_frames < 1 or (num_frames - 1) % TEMPORAL_FACTOR:
        raise ValueError(f"a causal 4x VAE encodes 1 + 4k frames, got {num_frames}")
    return 1 + (num_frames - 1) // TEMPORAL_FACTOR


def frames_to_pixels(frames: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> float (B, 3, T, H, W) in [-1, 1]."""
    if frames.dtype != torch.uint8 or frames.ndim != 5 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames (B, T, H, W, 3), got {frames.dtype} {tuple(frames.shape)}")
    return frames.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def pixels_to_frames(pixels: torch.Tensor) -> torch.Tensor:
    """float (B, 3, T, H, W) in [-1, 1] -> uint8 (B, T, H, W, 3)."""
    return ((pixels.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1)


def _stats(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=torch.float32).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=torch.float32).view(1, -1, 1, 1, 1)
    return mean, std


def encode(vae, frames: torch.Tensor) -> torch.Tensor:
    """uint8 frames (B, T, H, W, 3) -> normalised latents (B, C, t, h, w), the posterior mean."""
    pixels = frames_to_pixels(frames).to(next(vae.parameters()).dtype)
    raw = vae.encode(pixels).latent_dist.mode().float()
    mean, std = _stats(vae, raw)
    return (raw - mean) / std


def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents (B, C, t, h, w) -> uint8 frames (B, 1 + 4(t-1), H, W, 3), decoded from scratch."""
    mean, std = _stats(vae, latents)
    raw = (latents.float() * std + mean).to(next(vae.parameters()).dtype)
    return pixels_to_frames(vae.decode(raw).sample)


@torch.no_grad()
def reconstruct(vae, frames: torch.Tensor, batch_size: int = 256, progress: str | None = None) -> torch.Tensor:
    """uint8 frames (..., H, W, 3), each encoded and decoded on its own (a one-frame clip) on the VAE's device,
    ``batch_size`` at a time -> uint8 frames of the same shape on the frames' device: what the VAE keeps of a
    single observation. ``progress``: a progress bar's description (minutes of frames on a CPU)."""
    from tqdm import tqdm

    device = next(vae.parameters()).device
    flat = frames.reshape(-1, *frames.shape[-3:])
    starts = tqdm(range(0, len(flat), batch_size), desc=progress, disable=None if progress else True, leave=False)
    parts = [decode(vae, encode(vae, flat[start : start + batch_size, None].to(device)))[:, 0].to(frames.device) for start in starts]
    if parts and parts[0].shape[1:] != flat.shape[1:]:
        raise ValueError(f"the VAE turns {tuple(flat.shape[1:])} frames into {tuple(parts[0].shape[1:])}: its spatial factor "
                         f"{spatial_factor(vae)} must divide the frame size (give a VAE trained at this resolution)")  # fmt: skip
    return torch.cat(parts).reshape(frames.shape)


class StreamingDecoder:
    """Decode latent frames chunk by chunk, keeping the causal decoder cache between calls.

    The first call decodes its first latent as a single frame (like a from-scratch decode); every
    later latent frame becomes 4 frames that continue from what was decoded before. Decoding
    [l0, l1] then [l2, l3] gives the same frames as decoding [l0, l1, l2, l3] at once.
    """

    def __init__(self, vae):
        self.vae = vae
        self.cache: list | None = None

    def reset(self) -> None:
        self.cache = None

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.vae
        mean, std = _stats(vae, latents)
        raw = (latents.float() * std + mean).to(next(vae.parameters()).dtype)
        first = self.cache is None
        if first:
            self.cache = [None] * vae._cached_conv_counts["decoder"]
        x = vae.post_quant_conv(raw)
        outs = []
        for i in range(x.shape[2]):
            # diffusers' own per-frame loop (AutoencoderKLWan._decode) with a cache that outlives the call
            outs.append(vae.decoder(x[:, :, i : i + 1], feat_cache=self.cache, feat_idx=[0], first_chunk=first and i == 0))
        out = torch.cat(outs, dim=2)
        if vae.config.patch_size is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

            out = unpatchify(out, patch_size=vae.config.patch_size)
        return pixels_to_frames(out)

    def select(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` of the cache (after environments are dropped)."""
        if self.cache is not None:
            self.cache = [c[index] if isinstance(c, torch.Tensor) else c for c in self.cache]
