"""The package's imports run one way: from a layer to the same or a lower one, never in a circle.

Every ``import`` in worldloop/ counts, at module level or inside a function (a function-level import is
still a dependency; it only hides it until the call). The layers, lowest first:

    utils < config schema < sims/data < policies/worldmodel/rewards < envs < rl < diagnostics < loop/commands

The config schema layer holds worldloop/config.py (and its config_migrations.py), every ``configuration.py`` and the protocols the stages
exchange (envs/protocol.py, policies/protocol.py: plain types, importing nothing of worldloop), so a simulator
can implement the environment protocol without depending on the environments built on top of it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "worldloop"

LAYERS = [
    ("utils", r"utils(\..*)?"),
    ("config schema", r"config(_migrations)?|(\w+\.)+configuration|envs\.protocol|policies\.protocol"),
    ("sims/data", r"(sims|data)(\..*)?"),
    ("policies/worldmodel/rewards", r"(policies|worldmodel|rewards)(\..*)?"),
    ("envs", r"envs(\..*)?"),
    ("rl", r"rl(\..*)?"),
    ("diagnostics", r"diagnostics(\..*)?"),
    ("loop/commands", r"(loop|report|experiment|fidelity|analysis|commands|cli|__main__)(\..*)?|"),
]
"""(name, pattern of the module path below ``worldloop.``), lowest first; a module takes the first that matches."""

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
"""(importer, imported) pairs that may run upward, each with its reason. None are needed today."""


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """worldloop modules ``name`` imports (anywhere in the file) -> the line of the first such import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from worldloop.x import y` depends on worldloop.x.y when y is a module, else on worldloop.x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            if target.split(".")[0] == "worldloop" and target != name:
                found.setdefault(target, node.lineno)
    return found


def layer_of(name: str) -> int:
    below = name.removeprefix("worldloop").removeprefix(".")
    for index, (_, pattern) in enumerate(LAYERS):
        if re.fullmatch(pattern, below):
            return index
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS in {__file__}")


def import_graph() -> dict[str, dict[str, int]]:
    known = module_names()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, {}):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for name, imported in graph.items():
        for target, line in imported.items():
            if target == "worldloop" or (name, target) in ALLOWED_UPWARD:
                continue
            mine, theirs = layer_of(name), layer_of(target)
            if theirs > mine:
                problems.append(f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]}) at line {line}")
    return problems


def test_no_import_runs_in_a_circle():
    assert circles(import_graph()) == []


def test_no_import_runs_up_the_layers():
    assert upward_imports(import_graph()) == []


def test_rl_owns_its_application_and_never_imports_the_diagnostics():
    """RL's entry point, its environments and its judge loading live in rl/; what watches a run (reality checks,
    calibration, tracking, warnings, stop rules) is diagnostics', injected by the command: no rl module imports it."""
    graph = import_graph()
    assert {"worldloop.rl.app", "worldloop.rl.envs"} <= set(graph)
    assert [f"{name} imports {target}" for name, imported in graph.items() if name.startswith("worldloop.rl")
            for target in imported if target.startswith("worldloop.diagnostics")] == []  # fmt: skip
    assert "worldloop.rl.app" in graph["worldloop.commands.rl"] and "worldloop.diagnostics.monitor" in graph["worldloop.commands.rl"]
    assert ("worldloop.rl", "worldloop.diagnostics") not in {(a.rsplit(".", 1)[0], b.rsplit(".", 1)[0]) for a, b in ALLOWED_UPWARD}


def test_the_walk_sees_function_level_imports_circles_and_upward_imports(tmp_path):
    """The checks themselves: a made-up graph with a circle and an upward import is caught."""
    graph = {"worldloop.utils.a": {"worldloop.rl.b": 3}, "worldloop.rl.b": {"worldloop.utils.a": 1}}
    assert circles(graph) == [["worldloop.rl.b", "worldloop.utils.a"]]
    assert upward_imports(graph) == ["worldloop.utils.a (utils) imports worldloop.rl.b (rl) at line 3"]
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from worldloop.rl import trainer\n    from . import x\n")
    known = {"worldloop.rl.trainer": source, "worldloop.utils.x": source}
    assert imports_of("worldloop.utils.m", source, known) == {"worldloop.rl.trainer": 4, "worldloop.utils.x": 5}
    with pytest.raises(AssertionError, match="no layer"):
        layer_of("worldloop.nowhere")
