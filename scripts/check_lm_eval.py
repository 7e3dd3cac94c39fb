#!/usr/bin/env python3
"""`qwen3 serve` under lm-evaluation-harness's `local-completions` model: what an eval run sees.

    ../venv-torch/bin/pip install "lm-eval[api]"
    ../venv-torch/bin/python scripts/check_lm_eval.py --qwen3 target/release/qwen3 \
        --model models/tiny.bin --tokenizer fixtures/models/tiny-qwen3-fullvocab

`--model` is a model file written by `qwen3 export`; `--tokenizer` is the HuggingFace directory
it was exported from (its tokenizer.json and tokenizer_config.json): lm-eval tokenizes on its
side to know where each answer starts in the echoed prompt, so it needs the same tokenizer as the
server. Writes two small tasks from made-up JSONL data into a temporary directory, one
`multiple_choice` (scored by loglikelihood: `echo`, `logprobs: 1`, `max_tokens: 1`) and one
`generate_until` (`until: ["\\n"]`, a few tokens), starts the server on a free loopback port,
and runs `python -m lm_eval run --model local-completions --include_path DIR` against
/v1/completions, once per `--tokenized-requests` mode: `true` sends token-id lists, `false` the
text (decoded by lm-eval from its tokens). `--batch-size` above 1 sends a list of prompts per
request. No hub access is needed (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1 are set). Prints
lm-eval's results table per mode and exits non-zero unless every run gave metrics for both tasks
within `--timeout` and, with both modes, the two runs gave the same loglikelihoods (the server
splits the text as lm-eval's tokenizer did) and the same answers. The server is stopped in any
case; on a failure its stderr and lm-eval's failed-request lines are printed. Without
`lm-eval[api]` it says so and exits 0. The metrics themselves are not checked (a random-weight
model scores at chance).
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: the server and the check lines

try:
    import lm_eval
    import aiohttp  # noqa: F401 (lm-eval[api]: what local-completions needs)
    import tenacity  # noqa: F401
except ImportError as e:
    print(f"check_lm_eval: {e.name} is not installed (pip install \"lm-eval[api]\"); skipped")
    sys.exit(0)

MC_TASK = "qwen3_check_mc"
GEN_TASK = "qwen3_check_gen"
MODEL_NAME = "qwen3-check"

# (question, choices, index of the right one)
MC_ITEMS = [
    ("What color is a clear daytime sky?", ["green", "blue", "red", "black"], 1),
    ("How many legs does a spider have?", ["six", "four", "eight", "ten"], 2),
    ("Which animal says moo?", ["cow", "cat", "dog", "duck"], 0),
    ("What is frozen water called?", ["steam", "sand", "ice", "glass"], 2),
    ("Which planet do we live on?", ["Mars", "Earth", "Venus", "Jupiter"], 1),
    ("What do bees make?", ["milk", "silk", "wool", "honey"], 3),
    ("How many days are in a week?", ["seven", "five", "ten", "twelve"], 0),
    ("Which is the largest ocean?", ["Atlantic", "Indian", "Pacific", "Arctic"], 2),
    ("What is the opposite of hot?", ["warm", "cold", "wet", "loud"], 1),
    ("Which of these is a fruit?", ["carrot", "potato", "apple", "onion"], 2),
    ("What do you use to write on a blackboard?", ["chalk", "soap", "paint", "ink"], 0),
    ("Which season comes after winter?", ["autumn", "summer", "spring", "fall"], 2),
]

# (prompt, expected answer)
GEN_ITEMS = [
    ("2 + 2 =", "4"),
    ("The capital of Japan is", "Tokyo"),
    ("The opposite of up is", "down"),
    ("The color of grass is", "green"),
    ("One, two, three,", "four"),
    ("Monday, Tuesday,", "Wednesday"),
    ("The chemical symbol for water is", "H2O"),
    ("The first letter of the alphabet is", "A"),
    ("A baby cat is called a", "kitten"),
    ("Ice melts into", "water"),
]


def write_tasks(root):
    """Writes the two tasks' JSONL data and YAML configs under `root` (YAML scalars as JSON)."""
    mc_data = os.path.join(root, "mc.jsonl")
    with open(mc_data, "w") as f:
        for q, choices, label in MC_ITEMS:
            f.write(json.dumps({"question": q, "choices": choices, "label": label}) + "\n")
    gen_data = os.path.join(root, "gen.jsonl")
    with open(gen_data, "w") as f:
        for prompt, answer in GEN_ITEMS:
            f.write(json.dumps({"prompt": prompt, "answer": answer}) + "\n")
    j = json.dumps
    mc_text = j("Question: {{question}}\nAnswer:")
    newline, spaces = j("\n"), j("^ +")
    with open(os.path.join(root, f"{MC_TASK}.yaml"), "w") as f:
        f.write(f"""task: {MC_TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {j(mc_data)}
test_split: test
output_type: multiple_choice
doc_to_text: {mc_text}
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""")
    with open(os.path.join(root, f"{GEN_TASK}.yaml"), "w") as f:
        f.write(f"""task: {GEN_TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {j(gen_data)}
test_split: test
output_type: generate_until
doc_to_text: prompt
doc_to_target: answer
target_delimiter: " "
generation_kwargs:
  until: [{newline}]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: [{spaces}]
metadata:
  version: 1.0
""")


def start_server(args, tmp):
    """`qwen3 serve` on a free loopback port, its stderr in TMP/server.stderr."""
    return serverkit.Server(args.qwen3, args.model, "--model-name", MODEL_NAME,
                            "--parallel", str(args.parallel),
                            log=os.path.join(tmp, "server.stderr"))


def run_lm_eval(args, url, tmp, tokenized):
    """One lm_eval run; returns (ok, wall seconds, {task: {doc_id: filtered response}})."""
    mode = "tokenized" if tokenized else "text"
    out_dir = os.path.join(tmp, f"out-{mode}")
    model_args = ",".join([
        f"base_url={url}/v1/completions",
        f"model={MODEL_NAME}",
        f"tokenizer={os.path.abspath(args.tokenizer)}",
        "tokenizer_backend=huggingface",
        f"tokenized_requests={tokenized}",
        f"num_concurrent={args.num_concurrent}",
        "max_retries=1",
        f"timeout={args.timeout}",
    ])
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
           "--model_args", model_args, "--tasks", MC_TASK, GEN_TASK,
           "--include_path", tmp, "--batch_size", str(args.batch_size),
           "--output_path", out_dir, "--log_samples"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               HF_DATASETS_CACHE=os.path.join(tmp, "datasets-cache"))
    print(f"lm_eval ({mode}): {' '.join(cmd)}", flush=True)
    log_path = os.path.join(tmp, f"lm_eval-{mode}.stderr")
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                               timeout=args.timeout)
        code, stdout = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        code, stdout = None, out.decode(errors="replace") if isinstance(out, bytes) else out
    wall = time.monotonic() - start
    print(stdout.rstrip())
    missing = task_metrics_missing(out_dir)
    ok = code == 0 and not missing
    status = "timed out" if code is None else f"exit {code}"
    check(f"lm_eval {mode} ({status}, {wall:.1f} s)"
          + (f"; no metrics for {', '.join(missing)}" if missing else ""), ok)
    if not ok:
        with open(log_path, errors="replace") as f:
            lines = f.readlines()
        failed = [line for line in lines
                  if any(w in line for w in ("API request failed", "Exception", "Error"))]
        print("lm_eval stderr (failed requests and errors, else its tail):")
        print("".join((failed or lines)[-30:]).rstrip())
    return ok, wall, read_samples(out_dir)


def read_samples(out_dir):
    samples = {}
    for task in (MC_TASK, GEN_TASK):
        files = sorted(glob.glob(os.path.join(out_dir, "**", f"samples_{task}_*.jsonl"),
                                 recursive=True))
        if files:
            with open(files[-1]) as f:
                samples[task] = {d["doc_id"]: d["filtered_resps"] for d in map(json.loads, f)}
    return samples


def compare_modes(a, b):
    """Token-id and text requests must score and answer alike: the server's tokenizer then splits
    the text as lm-eval's HF tokenizer did (lm-eval slices the echoed logprobs by its own count)."""
    mc_a, mc_b = a.get(MC_TASK, {}), b.get(MC_TASK, {})
    worst = max((abs(float(x[0]) - float(y[0])) for d in mc_a.keys() & mc_b.keys()
                 for x, y in zip(mc_a[d], mc_b[d])), default=None)
    check(f"{MC_TASK}: the same loglikelihoods from token ids and from text (max diff {worst})",
          bool(mc_a) and mc_a.keys() == mc_b.keys() and worst is not None and worst < 1e-3)
    gen_a, gen_b = a.get(GEN_TASK, {}), b.get(GEN_TASK, {})
    same = sum(gen_a[d] == gen_b.get(d) for d in gen_a)
    check(f"{GEN_TASK}: the same answers from token ids and from text ({same}/{len(gen_a)})",
          bool(gen_a) and same == len(gen_a) == len(gen_b))


# One line per check; every check runs (the two modes are compared after both ran).
check = serverkit.Checks("lm-eval", stop_at_failure=False)


def task_metrics_missing(out_dir):
    """The tasks without a numeric metric in the newest results JSON under `out_dir`."""
    files = sorted(glob.glob(os.path.join(out_dir, "**", "results_*.json"), recursive=True))
    if not files:
        return [MC_TASK, GEN_TASK]
    with open(files[-1]) as f:
        results = json.load(f).get("results", {})
    missing = []
    for task in (MC_TASK, GEN_TASK):
        values = [v for k, v in results.get(task, {}).items()
                  if "," in k and "_stderr" not in k and isinstance(v, (int, float))]
        if not values:
            missing.append(task)
    return missing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default="target/release/qwen3")
    ap.add_argument("--model", default="models/tiny.bin")
    ap.add_argument("--tokenizer", default="fixtures/models/tiny-qwen3-fullvocab",
                    help="the HuggingFace directory the model was exported from (its tokenizer)")
    ap.add_argument("--tokenized-requests", choices=["true", "false", "both"], default="both",
                    help="send token-id lists (true), text (false), or run both")
    ap.add_argument("--num-concurrent", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1, help="prompts per request")
    ap.add_argument("--parallel", type=int, default=4, help="the server's --parallel")
    ap.add_argument("--limit", type=int, default=0, help="items per task (default: all)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for each lm_eval run")
    args = ap.parse_args()
    modes = {"true": [True], "false": [False], "both": [True, False]}[args.tokenized_requests]
    print(f"lm_eval {getattr(lm_eval, '__version__', '?')}")

    with tempfile.TemporaryDirectory(prefix="check_lm_eval-") as tmp:
        write_tasks(tmp)
        server = start_server(args, tmp)
        results = []
        try:
            for tokenized in modes:
                results.append(run_lm_eval(args, server.url, tmp, tokenized))
        finally:
            code = server.stop()
            server_log = server.log_tail(30)
        if len(results) == 2 and results[0][0] and results[1][0]:
            compare_modes(results[0][2], results[1][2])
        if server_log and not check.all_passed():
            print(f"server stderr (last lines):\n{server_log}")
        check(f"server exited {code} on SIGTERM", code == 0)
    check.finish(f" ({sum(w for _, w, _ in results):.1f} s in lm_eval)")


if __name__ == "__main__":
    main()
