"""Every relative link and image in the README and docs/ points at a file that exists (media renamed, records moved)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links() -> list[str]:
    broken = []
    for doc in [ROOT / "README.md", ROOT / "tools" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL or an anchor in the same file
                path = (doc.parent / target.split("#", 1)[0]).resolve()
                if not path.exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{number}: {target}")
    return broken


def test_relative_links_resolve():
    assert broken_links() == []
