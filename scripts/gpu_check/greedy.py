#!/usr/bin/env python3
"""Greedy tokens on the GPU against the CPU's f32 greedy tokens and transformers', per fixture.

Part of the GPU check kit (scripts/gpu_check/prepare.sh): run by run.sh on the GPU machine as

    python3 greedy.py QWEN3_BINARY FIXTURES_DIR WORK_DIR [--device cuda]

Each language-model fixture with a reference.json of greedy tokens (not the embedding model's,
whose reference is vectors) is exported as f32 with the carried qwen3; each of
its prompts (the reference's token ids) is completed greedily with `qwen3 generate --prompt-ids
... -t 0 --json`, once on the CPU and once on the GPU, for as many tokens as transformers decoded.
The GPU's tokens must equal the CPU's, all of them (both stop at the same EOS, if either does);
agreement with transformers' greedy ids is reported beside (the CPU f32 path's own exactness is
tests' business: qwen3-cli/tests/parity.rs). One line per fixture; exit status 1 if any differ.
`--device cpu` runs the CPU against itself: the script's own check where there is no GPU.
Standard library only.
"""

import json
import subprocess
import sys
from pathlib import Path


def generate(qwen3: str, model: Path, prompt: list, n: int, device: str) -> list:
    cmd = [qwen3, "generate", str(model), "--prompt-ids", json.dumps(prompt), "-n", str(n),
           "-t", "0", "--json", "--device", device]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)["tokens"]


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = "cuda"
    if "--device" in sys.argv:
        device = sys.argv[sys.argv.index("--device") + 1]
        args.remove(device)
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    qwen3, fixtures, work = args[0], Path(args[1]), Path(args[2])
    work.mkdir(parents=True, exist_ok=True)
    failed = 0
    names = sorted(p.parent.name for p in fixtures.glob("*/reference.json"))
    if not names:
        print(f"no fixtures with a reference.json in {fixtures}")
        return 1
    for name in names:
        ref = json.loads((fixtures / name / "reference.json").read_text())
        if not all("greedy_ids" in c for c in ref["cases"]):
            print(f"SKIP {name}: an embedding model (its reference is vectors, not greedy tokens)")
            continue
        model = work / f"{name}-f32.bin"
        exp = subprocess.run([qwen3, "export", str(fixtures / name), str(model), "--dtype", "f32"],
                             capture_output=True, text=True, timeout=300)
        if exp.returncode != 0:
            print(f"FAIL {name}: export: {exp.stderr.strip()}")
            failed += 1
            continue
        same_cpu, same_hf, tokens = 0, 0, 0
        notes = []
        try:
            for i, case in enumerate(ref["cases"]):
                n = len(case["greedy_ids"])
                cpu = generate(qwen3, model, case["prompt_ids"], n, "cpu")
                gpu = generate(qwen3, model, case["prompt_ids"], n, device)
                tokens += len(gpu)
                if gpu == cpu:
                    same_cpu += 1
                else:
                    k = next((j for j, (a, b) in enumerate(zip(cpu, gpu)) if a != b), min(len(cpu), len(gpu)))
                    notes.append(f"case {i}: first difference at token {k}: cpu {cpu[k:k + 3]}, {device} {gpu[k:k + 3]}")
                # transformers never stops at EOS; a completion that did is compared as far as it goes
                if gpu == case["greedy_ids"][: len(gpu)]:
                    same_hf += 1
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"FAIL {name}: {e}")
            failed += 1
            continue
        cases = len(ref["cases"])
        ok = same_cpu == cases
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {device} = cpu f32 on {same_cpu} of {cases} prompts "
              f"({tokens} tokens); = transformers on {same_hf} of {cases}" + "".join("; " + n for n in notes),
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
