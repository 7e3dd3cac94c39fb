#!/usr/bin/env python3
"""Check that the code the docs name still exists, so the teaching path cannot drift.

    python3 scripts/check_doc_names.py          # exit 1 and one line per stale name

Reads the Markdown of README.md, ARCHITECTURE.md, CONTRIBUTING.md, fixtures/README.md and
docs/*.md, and checks every inline code span (`like this`, outside fenced blocks) that has the
shape of a name in code:

- a source file (`model/forward.rs`, `scripts/make_fixtures.py`): some file of the repository
  (`git ls-files`) has that path or ends with it;
- a directory (`kernels/dot/`): some file of the repository lies under it;
- a Rust path (`Forward::run`, `model::Session`, `Session::new(&backend, ...)`): each segment is
  an identifier somewhere in the repository's Rust;
- a CamelCase type or a snake_case name (`CpuKvCache`, `scatter_add_rows`, `rope_theta`): an
  identifier somewhere in the repository's code (Rust, Python, shell, CUDA, TOML, HTML/JS), config
  keys and JSON fields included, since the code spells them.

Spans of other shapes (commands, values, JSON) are not checked. Names that come from other
projects (transformers' modules, llama.cpp's tools, CUDA intrinsics) are listed, each with where
it comes from, in docs/external-names.txt. Python's standard library only.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_EXT = (".rs", ".py", ".sh", ".cu", ".toml", ".jinja", ".yml", ".html", ".js", ".css")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SPAN = re.compile(r"`([^`\n]+)`")
SOURCE_FILE = re.compile(r"[\w./-]+\.(?:rs|py|sh|cu)")
DIRECTORY = re.compile(r"[\w-]+(?:/[\w.-]+)*/")
RUST_PATH = re.compile(r"([A-Za-z_]\w*(?:::[A-Za-z_]\w*)+)(?:\(.*\))?")
NAME = re.compile(r"([A-Za-z_]\w*)(?:\(\))?")
CAMEL = re.compile(r"[A-Z][a-z0-9]+[A-Z]\w*")


def tracked_files() -> list:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def code_identifiers(files: list) -> tuple:
    """(identifiers of all code, identifiers of the Rust code); fixtures and docs are not code."""
    every, rust = set(), set()
    for f in files:
        if f.startswith(("fixtures/", "docs/")) or not (f.endswith(CODE_EXT) or f == ".ci/run"):
            continue
        try:
            ids = set(IDENT.findall((ROOT / f).read_text()))
        except (UnicodeDecodeError, OSError):
            continue
        every |= ids
        if f.endswith(".rs"):
            rust |= ids
    return every, rust


def external_names() -> set:
    """docs/external-names.txt: a name per line (first word); `#` starts a comment."""
    names = set()
    for line in (ROOT / "docs" / "external-names.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line.split()[0])
    return names


def stale(span: str, files: list, every: set, rust: set) -> str | None:
    """Why `span` names nothing in the repository, or None when it does (or is not a name)."""
    if SOURCE_FILE.fullmatch(span):
        if any(f == span or f.endswith("/" + span) for f in files):
            return None
        return "no such file"
    if DIRECTORY.fullmatch(span):
        if any(f.startswith(span) or ("/" + span) in f for f in files):
            return None
        return "no such directory"
    m = RUST_PATH.fullmatch(span)
    if m:
        missing = [seg for seg in m.group(1).split("::") if seg not in rust]
        return f"no {', '.join(missing)} in the Rust code" if missing else None
    m = NAME.fullmatch(span)
    if m:
        w = m.group(1)
        if (CAMEL.fullmatch(w) or ("_" in w.strip("_") and w.islower())) and w not in every:
            return "no such name in the code"
    return None


def main() -> int:
    files = tracked_files()
    every, rust = code_identifiers(files)
    allowed = external_names()
    docs = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "fixtures/README.md"]
    docs += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    problems = checked = 0
    for doc in docs:
        if not (ROOT / doc).exists():
            continue
        fenced = False
        for no, line in enumerate((ROOT / doc).read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in SPAN.finditer(line):
                span = m.group(1).strip()
                checked += 1
                if span in allowed:
                    continue
                why = stale(span, files, every, rust)
                if why:
                    print(f"{doc}:{no}: `{span}`: {why} (a name from another project goes in "
                          "docs/external-names.txt)")
                    problems += 1
    print(f"check_doc_names: {checked} code spans in {len(docs)} documents, {problems} stale",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
