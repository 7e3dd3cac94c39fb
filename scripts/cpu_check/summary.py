#!/usr/bin/env python3
"""The CPU check kit's tables, from the JSON of its runs (scripts/cpu_check/run.sh, step 5).

    summary.py RUNS_DIR > summary.md

RUNS_DIR holds `ours-SHAPE-FILE-FAMILY-ROUND.json` (`qwen3 bench --json`),
`llama-SHAPE-QUANT-ROUND.json` (`llama-bench -o json`) and machine.txt. Each cell is the median
over the rounds; "of ceiling" is the median of each run's decode over its own ceiling (the
bandwidth probe of that run over the bytes a token reads). Then, per kernel family, the default
q4 file against the goals it is held to (docs/benchmarks.md, "Every kernel family on one
machine"): decode at >= 80% of the ceiling (AVX-512: >= 85% on one thread), >= 1.5x our q8 and
>= 1.2x llama.cpp's Q4_K_M, prefill >= 1.0x Q4_K_M (AVX-512: >= 1.2x), and its q6 tables and
layers costing no more than their bytes: its share of the ceiling >= 0.95 of the plain q4 file's.
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

FILES = {"q8": "ours q8", "q4": "ours q4 (default)", "q4-plain": "ours q4 `--tables q4 --sensitive q4`"}


def median(xs):
    return statistics.median(xs) if xs else None


def main(runs: Path) -> None:
    # cells[shape][row][(kind, threads)] = [values over rounds]; kind: decode, prefill, share
    cells = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    rounds, threads = set(), set()
    for p in sorted(runs.glob("ours-*.json")):
        m = re.fullmatch(r"ours-(.+)-(q4-plain|q8|q4)-(.+)-(\d+)\.json", p.name)
        if not m:
            continue
        shape, name, family, r = m.groups()
        b = json.loads(p.read_text())
        rounds.add(r)
        row = (FILES[name], b["isa"])
        for x in b["runs"]:
            t = x["threads"]
            threads.add(t)
            cells[shape][row][("decode", t)].append(x["decode_tok_s"])
            cells[shape][row][("prefill", t)].append(x["prefill_tok_s"])
            if x["fraction_of_ceiling"] is not None:  # null when not finite
                cells[shape][row][("share", t)].append(x["fraction_of_ceiling"])
    llama_build = set()
    for p in sorted(runs.glob("llama-*.json")):
        m = re.fullmatch(r"llama-(.+)-(Q\w+?)-(\d+)\.json", p.name)
        if not m:
            continue
        shape, quant, r = m.groups()
        rounds.add(r)
        for x in json.loads(p.read_text()):
            llama_build.add(f"{x['build_commit']}, {x['backends']} backend")
            t = x["n_threads"]
            threads.add(t)
            kind = "decode" if x["n_gen"] else "prefill"
            cells[shape][(f"llama.cpp {quant}", "")][(kind, t)].append(x["avg_ts"])
    machine = (runs / "machine.txt").read_text().strip() if (runs / "machine.txt").exists() else ""
    threads = sorted(threads)
    print(f"CPU check: {machine}")
    if llama_build:
        print(f"llama.cpp: build {'; '.join(sorted(llama_build))}")
    print(f"Medians of {len(rounds)} rounds of alternating single runs; tok/s (share of the ceiling).\n")
    for shape, rows in cells.items():
        print(f"### {shape} shape\n")
        head = [f"decode {t}t" for t in threads] + [f"prefill {t}t" for t in threads]
        print("| file | kernels | " + " | ".join(head) + " |")
        print("|---|---|" + "---|" * len(head))
        order = list(FILES.values())
        for (label, isa), c in sorted(rows.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0])):
            out = []
            for t in threads:
                d, s = median(c[("decode", t)]), median(c[("share", t)])
                # Above 100%, the bytes did not all come from memory (`qwen3 bench` prints "-").
                share = "" if s is None else f" ({100 * s:.0f}%)" if s <= 1 else " (-)"
                out.append("-" if d is None else f"{d:.1f}{share}")
            for t in threads:
                v = median(c[("prefill", t)])
                out.append("-" if v is None else f"{v:.1f}")
            print(f"| {label} | {isa or '-'} | " + " | ".join(out) + " |")
        print()
        goals(rows, threads)


def goals(rows, threads) -> None:
    """The default q4 file against its goals, per family: each ratio of the medians. AVX-512
    families are held to more (they have the instructions for it): 85% of the ceiling on one
    thread and 1.2x Q4_K_M's prefill."""
    kq = rows.get(("llama.cpp Q4_K_M", ""))
    families = [isa for (label, isa) in rows if label == FILES["q4"]]
    if not families:
        return
    head = []
    for t in threads:
        head += [f"of ceiling {t}t", f"/ our q8 {t}t (>= 1.5)", f"q6's cost {t}t (>= 0.95)"]
        if kq:
            head += [f"/ Q4_K_M decode {t}t (>= 1.2)", f"/ Q4_K_M prefill {t}t"]
    print("The default q4 file against its goals (of the ceiling >= 80%, AVX-512 >= 85% on one thread;")
    print("prefill >= 1.0x Q4_K_M, AVX-512 >= 1.2x; q6's cost: its share of the ceiling over the plain q4 file's):\n")
    print("| kernels | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(head))
    for isa in families:
        q4, q8 = rows[(FILES["q4"], isa)], rows.get((FILES["q8"], isa))
        plain = rows.get((FILES["q4-plain"], isa))
        wide = isa.startswith("avx512")
        out = []
        for t in threads:
            share = median(q4[("share", t)])
            out.append(mark(share, 0.85 if wide and t == 1 else 0.8, pct=True))
            out.append(mark(ratio(q4, q8, "decode", t), 1.5))
            out.append(mark(ratio(q4, plain, "share", t), 0.95))
            if kq:
                out.append(mark(ratio(q4, kq, "decode", t), 1.2))
                out.append(mark(ratio(q4, kq, "prefill", t), 1.2 if wide else 1.0))
        print(f"| {isa} | " + " | ".join(out) + " |")
    print()


def ratio(a, b, kind, t):
    if not b:
        return None
    x, y = median(a[(kind, t)]), median(b[(kind, t)])
    return None if x is None or not y else x / y


def mark(v, goal, pct=False):
    if v is None:
        return "-"
    text = f"{100 * v:.0f}%" if pct else f"{v:.2f}"
    return text if v >= goal else f"**{text}** (short)"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summary.py RUNS_DIR")
    main(Path(sys.argv[1]))
