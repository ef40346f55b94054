"""``worldloop <verb>``: one command line for every stage.

Each verb is a small module in :mod:`worldloop.commands` with ``HELP``, ``add_arguments(parser)``
and ``run(args, config)``. Verbs take the common ``--preset`` and trailing dotted overrides
(``sim.image_size=128``); a verb is listed here only once it works. A verb that writes a run folder
(``--out``) declares what defines its run (``RUN``, a :class:`~worldloop.utils.runfolder.RunSpec`):
the folder is claimed here, for every such verb alike (one run per folder, one writer at a time,
``--overwrite`` to replace another run). Expected failures end in one line on stderr; ``--debug``
shows the traceback. A verb that trains data-parallel under torchrun says so (``DISTRIBUTED = True``); the others
refuse to start as several processes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from worldloop.config import DEFAULT_PRESET, ConfigError, load_config, load_saved_config
from worldloop.config_migrations import retired_as_fixed
from worldloop.utils.gl import RenderingUnavailable
from worldloop.utils.runfolder import RunClaim, RunError, as_os_error, describe_os_error

VERBS = {
    "config": "worldloop.commands.config",
    "collect": "worldloop.commands.collect",
    "sft": "worldloop.commands.sft",
    "eval": "worldloop.commands.eval",
    "bench": "worldloop.commands.bench",
    "train-vae": "worldloop.commands.train_vae",
    "train-wm": "worldloop.commands.train_wm",
    "eval-wm": "worldloop.commands.eval_wm",
    "kir": "worldloop.commands.kir",
    "gate": "worldloop.commands.gate",
    "fidelity": "worldloop.commands.fidelity",
    "loop": "worldloop.commands.loop",
    "experiment": "worldloop.commands.experiment",
    "analyse": "worldloop.commands.analyse",
    "rl": "worldloop.commands.rl",
    "train-reward": "worldloop.commands.train_reward",
    "calibrate-reward": "worldloop.commands.calibrate_reward",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worldloop",
        description="RL post-training of VLA policies inside a learned video world model, checked in a real simulator.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for verb, module_name in VERBS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(verb, help=module.HELP, description=module.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset name or YAML path (default: {DEFAULT_PRESET})")
        module.add_arguments(p)
        p.add_argument("--debug", action="store_true", help="show the traceback of an error (also for the loop's stages)")
        if getattr(module, "RUN", None) is not None:
            p.add_argument("--overwrite", action="store_true", help="replace a run made with other settings in --out (its files are removed)")
        p.usage = "%(prog)s [options] [key=value ...]"
        p.epilog = "key=value: dotted config overrides anywhere on the line, e.g. sim.image_size=128 (see `worldloop config`)"
        p.set_defaults(_module=module)
    return parser


OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*=.*")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [token for token in rest if not OVERRIDE.fullmatch(token)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like section.key=value)")
    args.overrides = rest
    if args.debug:
        os.environ["WORLDLOOP_DEBUG"] = "1"  # the loop's stages inherit it
    debug = bool(os.environ.get("WORLDLOOP_DEBUG"))
    try:
        config = load_config(args.preset, args.overrides)
        return run_command(args, config)
    except ConfigError as error:
        if debug:
            raise
        print(f"worldloop {args.verb}: config error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, TypeError, RenderingUnavailable) as error:
        # bad input (a missing folder, a corrupt file, a wrong shape) or no OpenGL: the message says what and where
        if debug:
            raise
        print(f"worldloop {args.verb}: error: {error}", file=sys.stderr)
        return 2
    except RunError as error:  # another run in --out, a held lock, a failed stage
        if debug:
            raise
        print(f"worldloop {args.verb}: error: {error}", file=sys.stderr)
        return error.exit_code
    except Exception as error:  # a read-only folder, a full disk, missing permissions (from Python or a library)
        os_error = as_os_error(error)
        if debug or os_error is None:
            raise
        print(f"worldloop {args.verb}: error: {describe_os_error(os_error, getattr(args, 'out', None))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nworldloop {args.verb}: interrupted; finished work is kept, rerun the same command to resume", file=sys.stderr)
        return 130


def run_command(args: argparse.Namespace, config) -> int:
    """The verb, in the run folder it claims when it declares ``RUN``; under torchrun, in its process group."""
    from worldloop.utils import distributed

    if distributed.launched():
        if not getattr(args._module, "DISTRIBUTED", False):
            raise ConfigError(f"worldloop {args.verb} runs as one process; torchrun started {os.environ['WORLD_SIZE']} "
                              "(train-vae, train-wm, sft, train-reward, rl and bench wm-train run on several)")  # fmt: skip
        distributed.init(config.device)
        try:
            return _claimed(args, config)
        finally:
            distributed.close()
    return _claimed(args, config)


def _claimed(args: argparse.Namespace, config) -> int:
    """The verb in its claimed run folder: rank 0 holds the claim and tells the other ranks whether to run."""
    from worldloop.utils import distributed

    spec = getattr(args._module, "RUN", None)
    if spec is None:
        return int(args._module.run(args, config) or 0)
    if not distributed.is_main():
        said = distributed.broadcast_object(None)  # rank 0's claim: True (finished), False (go on) or its error
        if isinstance(said, str):
            raise RunError(said)
        return 0 if said else int(args._module.run(args, config) or 0)
    claim = RunClaim(args.out, args.verb, spec, config, vars(args), overwrite=args.overwrite, read_config=load_saved_config, retired=retired_as_fixed)
    try:
        claim.__enter__()
    except Exception as error:
        distributed.broadcast_object(f"rank 0 could not claim --out {args.out}: {error}")
        raise
    try:
        distributed.broadcast_object(claim.finished)
        if claim.finished:
            return 0
        code = int(args._module.run(args, config) or 0)
        if code == 0:
            claim.finish()
        return code
    finally:
        claim.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
