"""A trained model folder through parts of limited size (pack on the GPU host, unpack on the next machine)."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parts import main, pack, unpack  # noqa: E402
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import VAEConfig


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("trained") / "vae"
    vae = vae_lib.build_vae(VAEConfig())
    vae.register_to_config(latents_mean=[0.1] * 8, latents_std=[2.0] * 8)  # statistics a trained VAE carries
    vae.save_pretrained(str(folder), safe_serialization=True)
    (folder / "metrics.json").write_text('{"steps": 3}')
    (folder / "checkpoints" / "step_000000003").mkdir(parents=True)
    (folder / "checkpoints" / "step_000000003" / "state.safetensors").write_bytes(b"not carried")
    return folder


def test_a_vae_survives_pack_and_unpack_from_two_carries(vae_folder, tmp_path):
    manifest = pack(vae_folder, tmp_path / "out", "vae", part_mb=0.1)
    spec = json.loads(manifest.read_text())
    assert len(spec["parts"]) >= 3 and all(p["bytes"] <= 100_000 for p in spec["parts"])
    assert not any("checkpoints" in f for f in spec["files"]) and "metrics.json" in spec["files"]
    weights = next(vae_folder.glob("*.safetensors")).stat().st_size
    assert sum(p["bytes"] for p in spec["parts"]) < 0.6 * weights  # float32 stored as float16
    second = tmp_path / "second-carry"
    second.mkdir()
    shutil.move(tmp_path / "out" / spec["parts"][-1]["file"], second)

    folder = unpack(manifest, tmp_path / "vae", search=[second])
    original, copy = vae_lib.load_vae(vae_folder), vae_lib.load_vae(folder)
    assert copy.config.latents_mean == [0.1] * 8 and json.loads((folder / "metrics.json").read_text()) == {"steps": 3}
    assert all(p.dtype == torch.float32 for p in copy.parameters())
    pixels = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        a = original.decode(original.encode(pixels).latent_dist.mode()).sample
        b = copy.decode(copy.encode(pixels).latent_dist.mode()).sample
    assert (a - b).abs().max() < 1e-2  # float16 rounding of the weights only


def test_missing_or_corrupt_parts_are_named(vae_folder, tmp_path):
    manifest = pack(vae_folder, tmp_path, "vae", part_mb=0.1)
    parts = json.loads(manifest.read_text())["parts"]
    (tmp_path / parts[1]["file"]).write_bytes(b"x" * parts[1]["bytes"])
    with pytest.raises(ValueError, match=f"{parts[1]['file']} is corrupt"):
        unpack(manifest, tmp_path / "a")
    (tmp_path / parts[1]["file"]).unlink()
    with pytest.raises(FileNotFoundError, match=f"part {parts[1]['file']} of vae.parts.json"):
        unpack(manifest, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(FileNotFoundError, match="no .safetensors weights"):
        pack(tmp_path / "a", tmp_path, "nothing")
    with pytest.raises(FileNotFoundError, match="no 'vae' to skip"):
        pack(vae_folder, tmp_path, "dit", skip=["vae"])


def test_command_line_round_trip(vae_folder, tmp_path, capsys):
    assert main(["pack", str(vae_folder), str(tmp_path), "vae"]) == 0
    assert "1 part file(s)" in capsys.readouterr().out
    assert main(["unpack", str(tmp_path / "vae.parts.json"), str(tmp_path / "copy")]) == 0
    assert vae_lib.load_vae(tmp_path / "copy").config.z_dim == 8
    # a missing manifest or a typo in --skip: exit 2 with the reason, no traceback
    assert main(["unpack", str(tmp_path / "nope.parts.json"), str(tmp_path / "x")]) == 2
    assert "parts: error:" in capsys.readouterr().err
    assert main(["pack", str(vae_folder), str(tmp_path), "vae", "--skip", "vea"]) == 2
    assert "no 'vea' to skip" in capsys.readouterr().err
