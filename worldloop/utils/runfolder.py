"""One run per folder: the settings that define a run are recorded in its folder, a rerun with the
same settings resumes it, a rerun with other settings is refused, and a finished run is left alone.

Every verb that writes an ``--out`` folder declares a :class:`RunSpec` (``RUN`` in its command
module); ``worldloop <verb>`` then *claims* the folder before the verb runs (:class:`RunClaim`):

1. it takes the folder's writer lock (:class:`FolderLock`, one writer at a time);
2. it compares the settings of this command (the config keys the verb reads, and its command-line
   options, input paths made absolute) with those recorded in ``OUT/run.json`` (or, for a folder
   written before run.json existed, with the sections of its ``config.yaml``);
3. different settings: refused with the list of differences, unless ``--overwrite`` (then the
   folder's contents are removed first); the same settings: the verb resumes from what is there;
4. a run that ended (``finished`` in run.json, set when the verb returned 0) is not run again.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
LOCK_NAME = ".writer.lock"
CONFIG_FILE = "config.yaml"  # the resolved configuration every verb writes (worldloop.config.CONFIG_FILENAME)
# argparse names that never define a run: where it goes, how it reports, how the CLI behaves
NOT_DEFINING = frozenset({"out", "preset", "overrides", "verb", "_module", "no_progress", "debug", "overwrite"})
# argparse names of the options that name input files or folders: recorded absolute whether or not they exist yet,
# so that a run refused for a missing input is the same run once the input is there
PATH_OPTIONS = frozenset({"dataset", "policy", "base_policy", "world_model", "init", "vae", "judge", "keyframes", "gate", "against", "replay"})
NOT_A_PATH = re.compile(r"expert|[a-z][a-z0-9-]*:.*")  # the scripted experts, or KIND:PATH (topreward:..., openvla-oft:...)


class RunError(RuntimeError):
    """An expected failure whose message says all (the CLI prints it alone, no traceback)."""

    exit_code = 1


class FolderBusy(RunError):
    """Another process holds the folder's writer lock."""


class RunRefused(RunError):
    """The folder holds another run (other settings, another verb, or files that are no run)."""

    exit_code = 2


@dataclass(frozen=True)
class RunSpec:
    """What defines the run a verb writes into its ``--out`` folder."""

    settings: tuple[str, ...]
    """Config keys the verb reads: sections ('sft') or dotted keys ('sim.image_size')."""
    not_defining: tuple[str, ...] = ()
    """Command-line options (argparse names) that do not define the run; every other option does."""
    final: bool = True
    """A finished run is left as it is; False: a rerun may extend it (collect adds episodes, never changes one)."""


# ------------------------------------------------------------------------------------------------
# The writer lock


_HELD: dict[str, list] = {}  # folder -> [open lock file, holders in this process]


class FolderLock:
    """An advisory lock on ``folder/.writer.lock`` (flock): one writing process at a time. Reentrant
    within a process (the CLI's claim and a :class:`~worldloop.data.writer.DatasetWriter` of the same
    folder share it); the kernel releases it when the process dies, however it dies."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.key = os.path.realpath(self.folder)
        self.held = False

    def acquire(self) -> "FolderLock":
        if self.key in _HELD:
            _HELD[self.key][1] += 1
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.folder / LOCK_NAME, "a")  # "a": opening changes nothing in the folder
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise FolderBusy(f"{self.folder} is being written by another process (lock {self.folder / LOCK_NAME} is held); "
                                 "wait for it to end or stop it, then rerun") from None  # fmt: skip
            _HELD[self.key] = [handle, 1]
        self.held = True
        return self

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        entry = _HELD[self.key]
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[self.key]
            fcntl.flock(entry[0], fcntl.LOCK_UN)
            entry[0].close()

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ------------------------------------------------------------------------------------------------
# The settings that define a run


def run_settings(spec: RunSpec, config: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The record of a run: ``config`` values of ``spec.settings``, and the command-line ``options``
    that define it (existing paths made absolute), as plain JSON values."""
    recorded = {
        "config": {key: config_value(config, key) for key in spec.settings},
        "options": {name: _recorded_option(value, name in PATH_OPTIONS) for name, value in sorted(options.items())
                    if name not in NOT_DEFINING | set(spec.not_defining)},
    }
    return json.loads(json.dumps(recorded, default=str))


def config_value(config: Any, dotted: str) -> Any:
    """The value at ``dotted`` ('sim.image_size', 'sft') of a config; sections as dicts."""
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def differences(before: dict[str, Any], now: dict[str, Any], retired: Any = None) -> list[str]:
    """'key: old there, new now' for every setting that differs, keys as a user writes them
    ('sft.lr', '--dataset'). ``retired(key, value)``: whether a key recorded there and gone now held the value this
    version always uses (worldloop.config_migrations.retired_as_fixed, which the caller passes); such a key is no difference."""
    old, new = _flatten(before), _flatten(now)
    missing = object()
    return [
        f"{key}: {_show(old.get(key, missing))} there, {_show(new.get(key, missing))} now"
        for key in sorted(old.keys() | new.keys())
        if old.get(key, missing) != new.get(key, missing)
        and not (key not in new and retired is not None and retired(key, old[key]))
    ]


def _recorded_option(value: Any, is_path: bool = False) -> Any:
    """``value`` as recorded: paths absolute (an option of :data:`PATH_OPTIONS` always, any other when it exists)."""
    if isinstance(value, (list, tuple)):
        return [_recorded_option(v, is_path) for v in value]
    if isinstance(value, str) and value and (os.path.exists(value) or (is_path and not NOT_A_PATH.fullmatch(value))):
        return os.path.abspath(value)
    return value


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    walk("", record.get("config", {}))
    for name, value in record.get("options", {}).items():
        flat["--" + name.replace("_", "-")] = value
    return flat


def _show(value: Any) -> str:
    return "(not set)" if not isinstance(value, (str, int, float, bool, list, dict, type(None))) else json.dumps(value)


# ------------------------------------------------------------------------------------------------
# The claim


class RunClaim:
    """``with RunClaim(out, verb, spec, config, options, overwrite) as claim:`` holds ``out`` for one
    run of ``verb``; ``claim.finished`` says the run there had already ended (nothing to do). Call
    :meth:`finish` when the verb has succeeded. A claim that leaves the folder with nothing but the records
    of its settings (the verb failed before its work wrote anything) removes them again."""

    def __init__(self, out: str | Path, verb: str, spec: RunSpec, config: Any, options: dict[str, Any], overwrite: bool = False,
                 read_config: Any = None, retired: Any = None):  # fmt: skip
        """``read_config(path)``: the configuration a ``config.yaml`` holds (worldloop.config.load_saved_config, which
        the caller passes: this layer does not import the config schema), for folders written before run.json;
        ``retired(key, value)``: whether a setting recorded there is a retired key at its now fixed value
        (worldloop.config_migrations.retired_as_fixed)."""
        self.out, self.verb, self.spec, self.overwrite, self.read_config = Path(out), verb, spec, overwrite, read_config
        self.retired = retired
        self.settings = run_settings(spec, config, options)
        self.lock = FolderLock(self.out)
        self.finished = False
        self._started = _now()
        self._created = False
        self._wrote_record = False

    def __enter__(self) -> "RunClaim":
        if self.out.exists() and not self.out.is_dir():
            raise RunRefused(f"--out {self.out} is a file, not a folder")
        self._created = not self.out.exists()
        self.lock.acquire()
        try:
            self._check()
        except BaseException:
            self._tidy()
            self.lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        from worldloop.utils.io import share_as_umask

        try:
            if not self.finished:
                self._tidy()
            if self.out.is_dir():  # what safetensors and tempfile made private, readable as the umask says
                share_as_umask(self.out)
        finally:
            self.lock.release()

    def finish(self) -> None:
        """Mark the run as ended: a rerun with the same settings leaves it as it is."""
        from worldloop.utils.io import atomic_write_json

        if self.spec.final:
            atomic_write_json(self.out / RUN_FILE, self._record() | {"finished": _now()})
        self.finished = True

    # ------------------------------------------------------------------------------------------

    def _check(self) -> None:
        from worldloop.utils.io import atomic_write_json

        record, saved = self._saved()
        self._started = (record or {}).get("started") or self._started
        if record is not None and record.get("verb") not in (None, self.verb):
            problem = f"holds a `worldloop {record.get('verb')}` run, not a `worldloop {self.verb}` run"
        elif saved is not None:
            changed = differences(saved, self.settings, self.retired)
            shown = "; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")
            problem = f"holds a `worldloop {self.verb}` run made with other settings ({shown})" if changed else None
        else:
            problem = None
        if problem and not self.overwrite:
            raise RunRefused(f"{self.out} {problem}; rerun with its settings to resume it, or give a new --out, or --overwrite to replace it")
        if self.overwrite and self._contents():
            print(f"{self.verb}: --overwrite: removing the run in {self.out}", flush=True)
            for path in self._contents():
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            record, self._started = None, _now()
        if record is not None and record.get("finished") and self.spec.final:
            print(f"{self.verb}: {self.out} already holds this run, finished {record['finished']}; nothing to do (--overwrite redoes it)", flush=True)
            self.finished = True
            return
        if record is None or record.get("settings") != self.settings:
            self._wrote_record = not self._contents()
            atomic_write_json(self.out / RUN_FILE, self._record())

    def _saved(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(run.json's record or None, the settings it or a legacy config.yaml recorded, or None)."""
        from worldloop.utils.io import read_json

        if (self.out / RUN_FILE).is_file():
            record = read_json(self.out / RUN_FILE)
            if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
                raise RunRefused(f"{self.out / RUN_FILE} is not a worldloop run record; give a new --out")
            return record, record["settings"]
        if (self.out / CONFIG_FILE).is_file() and self.read_config is not None:  # written before run.json existed: its config is the record
            try:
                saved = self.read_config(self.out / CONFIG_FILE)
            except ValueError as error:  # worldloop.config.ConfigError
                if self.overwrite:
                    return None, None
                raise RunRefused(f"{self.out} holds a run whose settings cannot be read ({error}); give a new --out, or --overwrite to replace it") from None
            return None, {"config": run_settings(self.spec, saved, {})["config"]}
        if self._contents():
            raise RunRefused(f"{self.out} holds files that are not a worldloop run (no {RUN_FILE} or {CONFIG_FILE}); "
                             "give an empty or new --out folder")  # fmt: skip
        return None, None

    def _record(self) -> dict[str, Any]:
        return {"verb": self.verb, "settings": self.settings, "started": self._started, "finished": None}

    def _contents(self) -> list[Path]:
        return [p for p in self.out.iterdir() if p.name != LOCK_NAME] if self.out.is_dir() else []

    def _tidy(self) -> None:
        """Leave no trace of a claim whose verb wrote nothing but the records of its settings (run.json, config.yaml):
        a verb that failed on its input leaves nothing its rerun would have to match."""
        if not self._wrote_record or not {p.name for p in self._contents()} <= {RUN_FILE, CONFIG_FILE}:
            return
        for name in (RUN_FILE, CONFIG_FILE):
            (self.out / name).unlink(missing_ok=True)
        if self._created:
            (self.out / LOCK_NAME).unlink(missing_ok=True)
            try:
                self.out.rmdir()
            except OSError:
                pass


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def as_os_error(error: BaseException) -> OSError | None:
    """The failed file operation behind ``error``: itself, its cause, or the 'os error N' that libraries
    which are not Python's (safetensors) put in their message; None when it is none of these."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        found = re.search(r"\(os error (\d+)\)", str(seen))
        if found:
            number = int(found.group(1))
            return OSError(number, os.strerror(number))
        seen = seen.__cause__ or seen.__context__
    return None


def describe_os_error(error: OSError, out: str | Path | None = None) -> str:
    """One line for a failed file operation: why, where (the file, or the folder of a hidden temporary or
    lock file; ``out`` when the error does not say), and what to do."""
    where = error.filename if error.filename is not None else out
    if where is not None and Path(where).name.startswith("."):
        where = Path(where).parent
    reason = error.strerror or str(error)
    hint = {errno.ENOSPC: "; free some space and rerun to resume", errno.EDQUOT: "; free some space and rerun to resume",
            errno.EACCES: "; check the folder's permissions", errno.EPERM: "; check the folder's permissions",
            errno.EROFS: "; choose a writable --out"}.get(error.errno, "")  # fmt: skip
    return f"{reason}: {where}{hint}" if where is not None else f"{reason}{hint}"
