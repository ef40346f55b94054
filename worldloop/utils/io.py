"""Atomic file output: a reader never sees a half-written file, a crash never corrupts a finished one.

Files and folders get the permissions the user's umask gives any new file: tempfile's and safetensors'
private 0600 and 0700 would keep a dataset or a model from a colleague on the same machine
(:func:`share_as_umask`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as handle:
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), 0o666 & ~umask())  # the writer may have replaced the file
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def umask() -> int:
    """The process's umask (read without changing it where /proc tells it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_as_umask(folder: str | Path) -> None:
    """Give ``folder`` and every file and folder in it that is private to its owner (0600, 0700: what
    tempfile and safetensors create) the mode the umask gives a new one; other modes are left as set."""
    mask = umask()
    for root, dirs, files in os.walk(folder):
        for path, private, shared in [(root, 0o700, 0o777)] + [(os.path.join(root, name), 0o600, 0o666) for name in files]:
            try:
                mode = os.lstat(path).st_mode
                if mode & 0o777 == private and not os.path.islink(path):
                    os.chmod(path, shared & ~mask)
            except OSError:  # gone meanwhile, or not ours: nothing to share
                pass


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it takes ``path``'s place whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        share_as_umask(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_figure(figure: Any, path: str | Path, dpi: float | str = "figure") -> Path:
    """A matplotlib ``figure`` laid out tight, written to ``path`` as PNG in one rename, then closed (pyplot
    keeps every figure until it is)."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=dpi)
    plt.close(figure)
    return Path(path)


def read_json(path: str | Path) -> Any:
    """Read a JSON file, naming the file when it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); the file may be truncated or corrupt") from error


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")
