#!/usr/bin/env python3
"""`qwen3 serve` against OpenAI's published OpenAPI spec, fuzzed with schemathesis.

    pip install schemathesis
    curl -L https://raw.githubusercontent.com/openai/openai-openapi/master/openapi.yaml \\
        -o openai-openapi.yaml     # github.com/openai/openai-openapi, OpenAPI 3.1
    python3 scripts/check_openai_spec.py --qwen3 target/release/qwen3 --model models/tiny.bin \\
        --spec openai-openapi.yaml

Starts the server on a free loopback port (with an API key, a 256-position context, model name
`tiny`), then runs `schemathesis run` on the four operations of the spec the server implements
(createCompletion, createChatCompletion, listModels, retrieveModel) with a fixed seed, at most
--max-examples cases per operation in each phase (the spec's examples, coverage, fuzzing,
stateful). Checks: no 5xx; 200 answers match the spec's response schemas and content types;
spec-valid requests are accepted and invalid ones refused.

This file is also the schemathesis hooks module (SCHEMATHESIS_HOOKS): in generated bodies a
string `model` becomes the served name (any other gets 404 model_not_found, a fine answer that
would hide the rest of the request), max_tokens / max_completion_tokens are capped at
--max-tokens (and set on chat requests without either, which would otherwise fill the context)
and `n` at 2, so a run takes minutes. Changed cases are revalidated by schemathesis: they are
still spec-valid, or still invalid. retrieveModel's path parameter stays random (404).

Prints requests by status class and code (positive = spec-valid as generated), failed checks,
every 5xx and response-schema failure, and the spec-valid requests the server refused, grouped
by its error message (most are refusals by design: a feature it lacks, n over its limit).
Exits non-zero on any 5xx, a request with no answer, a panic in the server's stderr, or a server
that stopped answering; the other checks are reported, not enforced. Without the `schemathesis`
package it says so and exits 0. Where to get it and the spec: above; --report keeps the NDJSON
event log and schemathesis' own output (the failures with curl commands to replay them).
"""

import argparse
import base64
import collections
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: the server

try:
    import schemathesis
except ImportError:
    if __name__ == "__main__":
        print("check_openai_spec: the schemathesis package is not installed; skipped")
        sys.exit(0)
    raise

OPERATIONS = ["createCompletion", "createChatCompletion", "listModels", "retrieveModel"]
CHECKS = ["not_a_server_error", "response_schema_conformance", "content_type_conformance",
          "positive_data_acceptance", "negative_data_rejection"]
PIN_ENV = "CHECK_OPENAI_SPEC_MODEL"
CAP_ENV = "CHECK_OPENAI_SPEC_MAX_TOKENS"

LENGTHS = ("max_tokens", "max_completion_tokens")


def adjust(case):
    """The hooks' change to a generated request: name the served model, cap lengths."""
    body = case.body
    if not isinstance(body, dict):
        return case
    body = dict(body)
    if isinstance(body.get("model"), str):
        body["model"] = os.environ[PIN_ENV]
    cap = int(os.environ[CAP_ENV])
    for key, most in ((LENGTHS[0], cap), (LENGTHS[1], cap), ("n", 2)):
        x = body.get(key)   # an integer, which JSON Schema lets be written 19.0
        if (type(x) is int or type(x) is float and x.is_integer()) and x > most:
            body[key] = most
    if case.path == "/chat/completions" and not any(k in body for k in LENGTHS):
        body["max_completion_tokens"] = cap   # otherwise the answer fills the context
    case.body = body
    return case


if __name__ == "_schemathesis_hooks":
    # Loaded by schemathesis through SCHEMATHESIS_HOOKS. map_case, not map_body: the coverage
    # phase applies only case-level hooks, the examples phase only before_add_examples. A changed
    # case is revalidated, so a negative case stays negative only where it still breaks the spec.
    @schemathesis.hook
    def map_case(context, case):
        return adjust(case)

    @schemathesis.hook
    def before_add_examples(context, examples):
        for case in examples:
            adjust(case)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default="target/release/qwen3")
    ap.add_argument("--model", default="models/tiny.bin")
    ap.add_argument("--spec", default="openai-openapi.yaml",
                    help="openapi.yaml from github.com/openai/openai-openapi")
    ap.add_argument("--max-examples", type=int, default=50, help="per operation and phase")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--context", type=int, default=256, help="the server's --context")
    ap.add_argument("--max-tokens", type=int, default=16,
                    help="cap on generated max_tokens / max_completion_tokens (keeps a run short)")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--request-timeout", type=float, default=60)
    ap.add_argument("--report", help="also keep schemathesis' NDJSON event log here")
    ap.add_argument("--show", type=int, default=3, help="examples printed per group")
    args = ap.parse_args()
    if not os.path.exists(args.spec):
        raise SystemExit(f"no spec at {args.spec}: see this script's docstring for where to get it")

    name, key = "tiny", "test-key"
    with tempfile.TemporaryDirectory(prefix="check_openai_spec.") as tmp:
        err_path = os.path.join(tmp, "server.stderr")
        with serverkit.Server(args.qwen3, args.model, "--model-name", name,
                              "--context", str(args.context), "--api-key", key,
                              log=err_path) as server:
            report = args.report or os.path.join(tmp, "events.ndjson")
            code = run_schemathesis(args, server.url, name, key, report, tmp)
            alive = server.proc.poll() is None and serverkit.healthy(server.url)
        with open(err_path, errors="replace") as f:
            stderr = f.read()
        print(f"schemathesis: exited {code}")
        server_errors = summarize(report, args.show)
    panics = [l for l in stderr.splitlines() if "panicked" in l]
    for l in panics:
        print(f"  server stderr: {l[:300]}")
    check = serverkit.Checks("openai-spec", stop_at_failure=False)
    check("every request answered, none with a 5xx", not server_errors)
    check("no panic in the server's stderr", not panics, f"{len(panics)} lines" if panics else "")
    check("the server still answers /health", alive)
    check.finish()


def run_schemathesis(args, url, name, key, report, tmp):
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", os.path.abspath(args.spec),
           "--url", url + "/v1",
           "--checks", ",".join(CHECKS),
           "--max-examples", str(args.max_examples), "--seed", str(args.seed),
           "--workers", args.workers, "--request-timeout", str(args.request_timeout),
           "--header", f"Authorization: Bearer {key}",
           "--continue-on-failure", "--generation-database", "none",
           "--no-color", "--warnings", "off",
           "--report", "ndjson", "--report-ndjson-path", os.path.abspath(report)]
    for op in OPERATIONS:
        cmd += ["--include-operation-id", op]
    env = dict(os.environ, SCHEMATHESIS_HOOKS=os.path.abspath(__file__),
               **{PIN_ENV: name, CAP_ENV: str(args.max_tokens)})
    shown = " ".join(cmd[1:cmd.index("--report")])
    print(f"schemathesis {schemathesis.__version__}: python3 {shown}")
    # Its own output (progress and failures, long) goes to a file; the summary below is ours.
    log = os.path.splitext(os.path.abspath(report))[0] + ".log"
    print(f"schemathesis output: {log if args.report else '(not kept: see --report)'}")
    with open(log, "w") as out:
        return subprocess.call(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)


def body_of(request):
    raw = request.get("body")
    if raw is None:
        return ""
    if isinstance(raw, dict) and "$base64" in raw:
        raw = base64.b64decode(raw["$base64"]).decode("utf-8", "replace")
    return raw if isinstance(raw, str) else json.dumps(raw)


def content_of(response):
    raw = (response or {}).get("content")
    if isinstance(raw, dict) and "$base64" in raw:
        return base64.b64decode(raw["$base64"]).decode("utf-8", "replace")
    return raw or ""


def error_message(text):
    try:
        e = json.loads(text).get("error", {})
        return f"{e.get('code') or e.get('type')}: {e.get('message')}"
    except (ValueError, AttributeError):
        return text[:120]


def short(text, n=160):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def summarize(path, show):
    statuses = collections.Counter()
    by_mode = collections.defaultdict(collections.Counter)   # positive / negative -> class
    failed_checks = collections.Counter()
    no_answer, server_errors, schema_failures = [], [], []
    refused = collections.defaultdict(list)   # (label, status, message) -> request bodies
    errors = []
    for line in open(path):
        event = json.loads(line)
        kind, data = next(iter(event.items()))
        if kind in ("NonFatalError", "FatalError"):
            errors.append(short(json.dumps(data), 300))
        if kind != "ScenarioFinished":
            continue
        rec = data["recorder"]
        for cid, inter in rec.get("interactions", {}).items():
            case = rec["cases"][cid]["value"]
            label = f"{case['method']} {case['path']}"
            mode = case.get("meta", {}).get("generation", {}).get("mode")
            req, resp = inter["request"], inter.get("response")
            body = body_of(req)
            where = f"{label} {req['uri'].split('/v1', 1)[-1]} {short(body)}"
            if resp is None:
                no_answer.append(where)
                statuses["no answer"] += 1
                continue
            code = resp["status_code"]
            statuses[code] += 1
            by_mode[mode][f"{code // 100}xx"] += 1
            text = content_of(resp)
            if code >= 500:
                server_errors.append(f"{code} {where} -> {short(text)}")
            if mode == "positive" and 400 <= code < 500:
                refused[(label, code, error_message(text))].append(body)
            for check in rec.get("checks", {}).get(cid, []):
                if check["status"] == "failure":
                    failed_checks[check["name"]] += 1
                    if check["name"] == "response_schema_conformance":
                        schema_failures.append(f"{where} -> {short(text, 300)}")

    total = sum(statuses.values())
    classes = collections.Counter(
        f"{c // 100}xx" if isinstance(c, int) else c for c in statuses.elements())
    print(f"requests: {total} ({', '.join(f'{k} {v}' for k, v in sorted(classes.items()))})")
    for mode, counts in sorted(by_mode.items(), key=str):
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"  {mode}: {sum(counts.values())} ({parts})")
    print("by status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items(), key=str)))
    print("failed checks (requests): " +
          (", ".join(f"{k} {v}" for k, v in sorted(failed_checks.items())) or "none"))
    for title, items in (("5xx answers", server_errors), ("requests with no answer", no_answer),
                         ("response-schema failures", schema_failures),
                         ("schemathesis errors", errors)):
        if items:
            print(f"{title}: {len(items)}")
            for item in items[:show * 5]:
                print(f"  {item}")
    if refused:
        print(f"spec-valid requests refused: {sum(len(v) for v in refused.values())}, by message:")
        for (label, code, msg), bodies in sorted(refused.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(bodies):4} x {code} {label}: {short(msg, 200)}")
            for b in bodies[:show]:
                print(f"         {short(b, 200)}")
    return bool(server_errors or no_answer)


if __name__ == "__main__":
    main()
