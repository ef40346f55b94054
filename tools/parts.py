"""Move a trained model folder through a channel that only takes files of limited size.

Some remote GPU hosts return at most 8 files of 16 MB per call, and a call carries 64 MiB. So a VAE or
world model trained on one such machine reaches the next one in parts:

    python tools/parts.py pack /root/mw/wm/vae "$OUT" vae            # on the GPU host
    python tools/parts.py unpack .carry/vae.parts.json runs/vae      # here, or on the next host

A world model's folder written by ``train-wm`` also holds its VAE (vae/) and its encoded clips
(latents.safetensors, a cache of gigabytes). ``--skip vae latents.safetensors latents.json`` leaves
them out; the VAE then travels on its own and is unpacked into the world model's vae/ afterwards.

``pack`` keeps the folder's JSON files and safetensors weights (not checkpoints, logs or samples),
stores float32 tensors as float16 (half the bytes; loading casts them back to the module's
dtype), and writes NAME.partNN files of at most ``part_mb`` MB and NAME.parts.json. The manifest
lists every part with its SHA-256, so ``unpack`` refuses a missing, truncated or corrupt part by name.
Parts may be spread over several folders (one carry each): ``unpack`` looks for them in the folders
it is given, the manifest's own first.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from worldloop.utils.io import atomic_dir, atomic_write_bytes, atomic_write_json

KEPT = ("*.json", "*.safetensors")
SKIPPED_FOLDERS = {"checkpoints", "tb", "samples"}


def pack(folder: str | Path, out: str | Path, name: str, part_mb: float = 15.0, skip: Sequence[str] = ()) -> Path:
    """Write ``out/NAME.partNN`` and ``out/NAME.parts.json``; returns the manifest's path. ``skip``
    lists files or subfolders of ``folder`` (relative paths) to leave out."""
    folder, out = Path(folder), Path(out)
    for relative in skip:
        if not (folder / relative).exists():
            raise FileNotFoundError(f"{folder} has no {relative!r} to skip")
    left_out = [Path(relative).parts for relative in skip]

    def kept(path: Path) -> bool:
        parts = path.relative_to(folder).parts
        return not SKIPPED_FOLDERS & set(parts[:-1]) and not any(parts[: len(s)] == s for s in left_out)

    files = sorted(p for pattern in KEPT for p in folder.rglob(pattern) if kept(p))
    if not any(p.suffix == ".safetensors" for p in files):
        raise FileNotFoundError(f"{folder} holds no .safetensors weights to pack")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in files:
            data = path.read_bytes() if path.suffix != ".safetensors" else _half(path)
            info = tarfile.TarInfo(str(path.relative_to(folder)))
            info.size, info.mtime = len(data), int(path.stat().st_mtime)
            archive.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    size = max(1, int(part_mb * 1e6))
    parts = []
    for number, start in enumerate(range(0, len(blob), size)):
        chunk = blob[start : start + size]
        part = out / f"{name}.part{number:02d}"
        atomic_write_bytes(part, chunk)
        parts.append({"file": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = out / f"{name}.parts.json"
    atomic_write_json(manifest, {"folder": folder.name, "files": [str(p.relative_to(folder)) for p in files], "skipped": sorted(skip), "parts": parts})
    return manifest


def unpack(manifest: str | Path, out: str | Path, search: Sequence[str | Path] = ()) -> Path:
    """Join and check the parts ``manifest`` lists (looked for beside it, then in ``search``) and
    write the folder to ``out`` atomically."""
    manifest = Path(manifest)
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no such parts manifest (pack writes NAME.parts.json)")
    spec = json.loads(manifest.read_text())
    folders = [manifest.parent, *map(Path, search)]
    chunks = []
    for part in spec["parts"]:
        found = next((f / part["file"] for f in folders if (f / part["file"]).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"part {part['file']} of {manifest.name} is in none of {[str(f) for f in folders]}")
        chunk = found.read_bytes()
        if len(chunk) != part["bytes"] or hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise ValueError(f"{found} is corrupt or truncated: {len(chunk)} bytes, its checksum does not match {manifest.name}")
        chunks.append(chunk)
    with atomic_dir(out) as tmp, tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as archive:
        for member in archive.getmembers():  # only the plain files pack wrote, inside the folder
            if not member.isfile() or Path(member.name).is_absolute() or ".." in Path(member.name).parts:
                raise ValueError(f"{manifest.name}: {member.name!r} is not a file that pack writes")
        archive.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return Path(out)


def _half(path: Path) -> bytes:
    """The safetensors file ``path`` with its float32 tensors stored as float16 (others and the metadata unchanged)."""
    with safe_open(path, framework="pt") as weights:
        metadata = weights.metadata()
    tensors = {key: (t.half() if t.dtype == torch.float32 else t) for key, t in load_file(path).items()}
    return save(tensors, metadata=metadata)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/parts.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="a model folder -> NAME.partNN files and NAME.parts.json")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("--part-mb", type=float, default=15.0, help="largest part, MB (default 15: the GPU host returns files up to 16 MB)")
    p.add_argument("--skip", nargs="*", default=[], help="files or subfolders to leave out (a world model: vae latents.safetensors latents.json)")
    u = verbs.add_parser("unpack", help="NAME.parts.json and its parts -> the model folder")
    u.add_argument("manifest")
    u.add_argument("out")
    u.add_argument("--search", nargs="*", default=[], help="more folders holding parts")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (FileNotFoundError, ValueError) as error:  # missing or corrupt input: say what, not a traceback
        print(f"parts: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.verb == "pack":
        manifest = pack(args.folder, args.out, args.name, args.part_mb, args.skip)
        print(f"packed {args.folder}: {len(json.loads(manifest.read_text())['parts'])} part file(s) listed in {manifest}")
    else:
        folder = unpack(args.manifest, args.out, args.search)
        skipped = json.loads(Path(args.manifest).read_text()).get("skipped") or []
        print(f"unpacked {folder}" + (f" (left out when packed: {', '.join(skipped)})" if skipped else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
