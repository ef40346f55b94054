"""``worldloop <verb>``: one command line for every stage.

Each verb is a small module in :mod:`worldloop.commands` with ``HELP``, ``add_arguments(parser)``
and ``run(args, config)``. Verbs take the common ``--preset`` and trailing dotted overrides
(``sim.image_size=128``); a verb is listed here only once it works.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from worldloop.config import DEFAULT_PRESET, ConfigError, load_config
from worldloop.utils.gl import RenderingUnavailable

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
    try:
        config = load_config(args.preset, args.overrides)
        return int(args._module.run(args, config) or 0)
    except ConfigError as error:
        print(f"worldloop {args.verb}: config error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, TypeError, RenderingUnavailable) as error:
        # bad input (a missing folder, a corrupt file, a wrong shape) or no OpenGL: the message says what and where;
        # WORLDLOOP_DEBUG=1 shows the traceback too
        if os.environ.get("WORLDLOOP_DEBUG"):
            raise
        print(f"worldloop {args.verb}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nworldloop {args.verb}: interrupted; finished work is kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
