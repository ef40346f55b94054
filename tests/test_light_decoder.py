"""A light decoder: train-vae distils a narrower decoder of a VAE's latents (vae.init + vae.decoder_base_dim), and a
world model decodes its imagination with it (world_model.decoder), checked to share the world model's encoder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch

from _worldmodel_fixtures import square_episodes, tiny_vae
from worldloop.commands.train_vae import describe
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
from worldloop.worldmodel.rollout import WorldModel
from worldloop.worldmodel.train_vae import teacher_agreement, train_vae

CPU = torch.device("cpu")
DISTILLED_PSNR = 18.0
"""dB against the teacher's own decode of held-out latents that 20 distillation steps reach on the square episodes (19.9
measured on 2026-12-07; the untrained narrow decoder scores ~14)."""


def imagine(model: WorldModel, episodes, chunks: int = 2) -> torch.Tensor:
    first = torch.as_tensor(episodes[0].frames[None, 0])
    model.reset(first, seeds=[7])
    actions = torch.as_tensor(episodes[0].actions[None, : model.chunk_size])
    return torch.cat([model.step(actions) for _ in range(chunks)], dim=1)


@pytest.mark.parametrize("decode", ["full", "cached"])
def test_a_copy_of_the_own_vae_as_decoder_gives_bit_identical_frames(tmp_path, decode):
    vae = tiny_vae()
    vae.save_pretrained(str(tmp_path / "copy"))
    episodes = square_episodes(1, seed=3)
    model = WorldModel.build(WorldModelConfig(sampling_steps=1, decode=decode), vae, 32, 2, device="cpu")
    own = imagine(model, episodes)
    model.use_decoder(tmp_path / "copy")
    assert model.spec["decoder"] == str(tmp_path / "copy") and model.decoding_vae is not model.vae
    assert torch.equal(imagine(model, episodes), own)
    model.save_pretrained(tmp_path / "wm")  # the option travels with the model; its own VAE stays its own
    loaded = WorldModel.from_pretrained(tmp_path / "wm", "cpu")
    assert loaded.spec["decoder"] == str(tmp_path / "copy") and torch.equal(imagine(loaded, episodes), own)


def test_a_decoder_of_another_encoder_or_normalisation_is_refused(tmp_path):
    vae = tiny_vae()
    model = WorldModel.build(WorldModelConfig(sampling_steps=1), vae, 32, 2, device="cpu")
    torch.manual_seed(1)
    other = vae_lib.build_vae(VAEConfig())
    other.register_to_config(latents_mean=vae.config.latents_mean, latents_std=vae.config.latents_std)
    other.save_pretrained(str(tmp_path / "other"))
    with pytest.raises(ValueError, match="encoder differs"):
        model.use_decoder(tmp_path / "other")
    vae.register_to_config(latents_std=[2.0 * s for s in vae.config.latents_std])
    vae.save_pretrained(str(tmp_path / "rescaled"))
    with pytest.raises(ValueError, match="latents_std"):
        WorldModel.build(WorldModelConfig(sampling_steps=1), tiny_vae(), 32, 2, device="cpu").use_decoder(tmp_path / "rescaled")
    assert model.spec["decoder"] is None and model.decoding_vae is model.vae  # unchanged by the refusals


def test_train_vae_distils_a_light_decoder_that_a_world_model_decodes_with(tmp_path):
    teacher = tiny_vae()
    teacher.save_pretrained(str(tmp_path / "teacher"))
    episodes = square_episodes(3, seed=2, length=12)
    untrained = teacher_agreement(vae_lib.narrow_decoder(teacher, 8).eval(), teacher, episodes[2:], CPU)["psnr"]
    config = VAEConfig(steps=20, batch_size=2, lr=2e-3, init=str(tmp_path / "teacher"), decoder_base_dim=8)
    metrics = train_vae(config, episodes[:2], episodes[2:], tmp_path / "light", CPU)
    agreement = metrics["teacher"]["held_out_psnr_vs_teacher"]["psnr"]
    assert metrics["decoder_base_dim"] == 8 and metrics["teacher"]["decoder_base_dim"] == 16
    assert agreement >= DISTILLED_PSNR and agreement > untrained + 3, (agreement, untrained)
    assert f"{agreement:.2f} dB against its own decode" in describe(metrics)  # what train-vae prints
    light = vae_lib.load_vae(tmp_path / "light")
    assert metrics["decoder_parameters_millions"] < sum(p.numel() for p in teacher.decoder.parameters()) / 1e6 / 2
    vae_lib.check_same_encoding(light, teacher, "the light decoder")  # its encoder and statistics stayed the teacher's
    model = WorldModel.build(WorldModelConfig(sampling_steps=1), teacher, 32, 2, device="cpu")
    own = imagine(model, episodes)
    model.use_decoder(tmp_path / "light")
    fast = imagine(model, episodes)
    assert fast.shape == own.shape and fast.dtype == torch.uint8 and not torch.equal(fast, own)


@pytest.mark.parametrize("size, width, default", [("tiny", 8, 16), ("wan2.2-5b", 64, 256)])
def test_build_vae_narrows_the_decoder_it_is_told_to(size, width, default):
    """What `bench wm vae.decoder_base_dim=64` builds (on the meta device: shapes only); the size's own width by default."""
    with torch.device("meta"):
        assert vae_lib.decoder_width(vae_lib.build_vae(VAEConfig(size=size, decoder_base_dim=width))) == width
        assert vae_lib.decoder_width(vae_lib.build_vae(VAEConfig(size=size))) == default
