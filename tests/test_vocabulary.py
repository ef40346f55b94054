"""The project speaks of itself: its code, tests, tools and docs name runs by date and topic, never by the
working vocabulary of the hosts they ran on. The words are built from pieces so that this file passes itself."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("README.md", "docs", "worldloop", "tests", "scripts", "tools", "Makefile")
WORDS = re.compile(rf"\b{'ses' + 'sion'}|\b{'lea' + 'se'}[sd]?\b|\b{'iss' + 'ue'}s?\s*#?\d", re.IGNORECASE)
TEXT = {".md", ".py", ".yaml", ".yml", ".sh", ".txt", ".json", ".toml", ".cfg", ".svg", ""}


def checked_files():
    for name in CHECKED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)


def offences() -> list[str]:
    found = []
    for path in checked_files():
        relative = path.relative_to(ROOT).as_posix()
        if WORDS.search(relative):
            found.append(f"{relative}: in its name")
        if path.suffix in TEXT:
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if match := WORDS.search(line):
                    found.append(f"{relative}:{number}: '{match.group(0)}' in: {line.strip()[:120]}")
    return found


def test_the_pattern_catches_each_word_and_spares_its_neighbours():
    caught = ["a " + "ses" + "sion ran", "Ses" + "sion-scoped", "media-" + "ses" + "sion10.png", "the " + "lea" + "se ended",
              "two " + "lea" + "ses", "iss" + "ue 6's criterion", "iss" + "ues 2-6", "iss" + "ue #39"]
    spared = ["release the workers", "released", "pleased", "a known " + "iss" + "ue", "reissue"]
    assert [bool(WORDS.search(text)) for text in caught] == [True] * len(caught)
    assert [bool(WORDS.search(text)) for text in spared] == [False] * len(spared)


def test_code_tests_tools_and_docs_use_none_of_the_words():
    assert offences() == []
