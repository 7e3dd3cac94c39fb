#!/usr/bin/env python3
"""Check that no hand-written file is longer than a reader can take in one sitting.

    python3 scripts/check_file_sizes.py          # exit 1 and one line per file over the limit

CONTRIBUTING.md's rule: one concept per module, and no hand-written file over about 800 lines.
Every file of the repository (`git ls-files`) that holds code or prose (Rust, Python, shell,
CUDA, HTML/JS, Markdown) counts, except the fixtures' and models' data and files that say they
are generated ("do not edit by hand" in their first lines, with the script that writes them).
Python's standard library only.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 800
CHECKED = (".rs", ".py", ".sh", ".cu", ".html", ".js", ".md")
# Data, not text a reader reads through: test fixtures and llama.cpp's vocabularies and templates.
NOT_CHECKED = ("fixtures/", "models/")
GENERATED = "do not edit by hand"


def generated(line: str) -> bool:
    """A comment line of a file's header that says it is generated."""
    return line.lstrip().startswith(("//", "#", "<!--")) and GENERATED in line


def main() -> int:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    over = []
    for name in names:
        if not name.endswith(CHECKED) or name.startswith(NOT_CHECKED):
            continue
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if any(generated(line) for line in lines[:10]):
            continue
        if len(lines) > LIMIT:
            over.append(f"{name}: {len(lines)} lines, over {LIMIT}: split it by concept")
    for line in over:
        print(line)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
