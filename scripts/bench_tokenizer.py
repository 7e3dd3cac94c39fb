"""Tokenizer speed: pico-qwen next to HuggingFace `tokenizers` (Python, one thread), same text,
same run.

  ../venv-tok/bin/python scripts/bench_tokenizer.py      # needs: pip install tokenizers==0.23.3

Runs `cargo bench -p qwen3-inference --bench tokenizer` (which builds ~1 MB of mixed prose, code
and CJK/multilingual text from committed files, writes it to target/tokenizer-bench.txt with our
ids, and prints our numbers), then times HF `tokenizers` on that same file: loading
tokenizer.json, one `encode` of the whole text, and one `encode` per line. It checks that HF's
ids for the whole text equal ours.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# One thread for HF: its parallelism (rayon) only applies to batches, but make sure.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

from tokenizers import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def median_time(reps, f):
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        f()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts)


def main():
    print("== pico-qwen (cargo bench -p qwen3-inference --bench tokenizer)", flush=True)
    r = subprocess.run(
        ["cargo", "bench", "-q", "-p", "qwen3-inference", "--bench", "tokenizer"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.exit("cargo bench failed")

    text = (ROOT / "target" / "tokenizer-bench.txt").read_text(encoding="utf-8")
    ours = json.loads((ROOT / "target" / "tokenizer-bench.ids.json").read_text())
    nbytes = len(text.encode("utf-8"))
    mb = nbytes / 1e6
    tj = str(ROOT / "fixtures" / "tokenizer" / "tokenizer.json")

    import tokenizers
    print(f"== HuggingFace tokenizers {tokenizers.__version__} (Python, one thread)")
    load = median_time(5, lambda: Tokenizer.from_file(tj))
    print(f"load      {load * 1e3:.0f} ms  (tokenizer.json, median of 5)")
    tok = Tokenizer.from_file(tj)
    ids = tok.encode(text).ids
    enc = median_time(5, lambda: tok.encode(text))
    print(f"encode    {mb / enc:.2f} MB/s  {len(ids) / enc / 1e6:.3f} M tokens/s  "
          f"({nbytes} bytes -> {len(ids)} tokens, {enc * 1e3:.0f} ms, one call, median of 5)")
    lines = text.splitlines(keepends=True)
    n = [0]

    def per_line():
        n[0] = sum(len(tok.encode(line).ids) for line in lines)

    per = median_time(3, per_line)
    print(f"encode    {mb / per:.2f} MB/s  {n[0] / per / 1e6:.3f} M tokens/s  "
          f"({len(lines)} calls, one per line, median of 3)")
    print(f"ids       {'identical' if ids == ours else 'DIFFERENT'} to pico-qwen's on the whole text")


if __name__ == "__main__":
    main()
