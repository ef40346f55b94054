"""``worldloop config``: print the resolved configuration with each field's documentation."""

from __future__ import annotations

import argparse

from worldloop.config import Config, explain, preset_names, to_yaml

HELP = "Print the resolved configuration (preset + overrides), documented field by field."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yaml", action="store_true", help="print plain YAML instead of documented lines")
    parser.add_argument("--list-presets", action="store_true", help="list the presets shipped with worldloop")


def run(args: argparse.Namespace, config: Config) -> int:
    if args.list_presets:
        print("\n".join(preset_names()))
    elif args.yaml:
        print(to_yaml(config), end="")
    else:
        print("\n".join(explain(config)))
    return 0
