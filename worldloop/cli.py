"""``worldloop <verb>``: one command line for every stage.

Each verb is a small module in :mod:`worldloop.commands` with ``HELP``, ``add_arguments(parser)``
and ``run(args, config)``. Verbs take the common ``--preset`` and trailing dotted overrides
(``sim.image_size=128``); a verb is listed here only once it works.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from worldloop.config import DEFAULT_PRESET, ConfigError, load_config

VERBS = {
    "config": "worldloop.commands.config",
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
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. sim.image_size=128")
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.preset, args.overrides)
        return int(args._module.run(args, config) or 0)
    except ConfigError as error:
        print(f"worldloop {args.verb}: config error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nworldloop {args.verb}: interrupted; finished work is kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
