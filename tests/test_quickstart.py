"""The README's quickstart, walked as a user walks it: every `worldloop` line of its first bash block, exactly as
written, with `--preset micro` appended, in a fresh folder, in order. A renamed option, a verb that no longer takes
what the one before it wrote, or a stage that stops on the micro preset's data fails here before a user meets it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from worldloop.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_commands(readme: str) -> list[list[str]]:
    """The argument lists of the `worldloop` lines of the Quickstart section's bash block (continuations joined,
    comments dropped)."""
    section = readme.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [words[1:] for words in lines if words and words[0] == "worldloop"]


def test_the_quickstart_block_is_read_as_written():
    commands = quickstart_commands(README.read_text())
    assert [c[0] for c in commands] == ["collect", "sft", "eval", "collect", "train-vae", "train-wm", "eval-wm", "train-reward", "gate",
                                        "kir", "rl", "eval"]  # fmt: skip
    rl = next(c for c in commands if c[0] == "rl")
    assert rl[-2:] == ["--out", "runs/rl"] and "--keyframes" in rl  # the continued line is joined


def test_the_readme_quickstart_runs_as_written_on_the_micro_preset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in quickstart_commands(README.read_text()):
        code = main([*argv, "--preset", "micro"])
        printed = capsys.readouterr()
        assert code == 0, f"worldloop {shlex.join(argv)} --preset micro exited {code}:\n{printed.err[-2000:]}"
        raw = [line for line in printed.out.splitlines() if line.strip().startswith(("{", '"'))]
        assert not raw, f"worldloop {argv[0]} printed raw JSON ({raw[:2]}): a verb prints a summary and writes its JSON to --out"
        out = Path(argv[argv.index("--out") + 1])
        assert (out / "run.json").is_file(), f"worldloop {argv[0]} left no run in {out}"
    change = json.loads(Path("runs/eval-rl/results.json").read_text())["paired_change"]
    assert change["against"] == "runs/eval-sft1/results.json"

