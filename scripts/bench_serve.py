#!/usr/bin/env python3
"""Aggregate generation speed of an OpenAI-compatible server under 1, 2, 4, 8, 16 concurrent streams.

Works against `qwen3 serve` and llama.cpp's `llama-server` alike (both take `ignore_eos`, so every
request generates exactly --max-tokens tokens). Python's standard library only.

    python3 scripts/bench_serve.py --url http://127.0.0.1:8080 --label qwen3 [--concurrency 1,2,4,8,16]

Each concurrency level runs C client threads; each client sends --rounds streamed
`/v1/completions` requests one after the other, greedy, each with its own prompt of about
--prompt-words words (distinct prompts, so no prefix cache helps). Reported per level:

- aggregate tok/s: generated tokens of all requests / wall time of the level;
- per stream tok/s: the median over requests of (tokens - 1) / (last token - first token);
- TTFT: time from sending a request to its first token (median and p99);
- ITL: gaps between consecutive streamed chunks of a request (median and p99), all requests.

With --schema FILE every request also carries that JSON Schema as `response_format` (and as
`json_schema`, llama-server's own field) and no `ignore_eos`: give a schema that cannot end within
--max-tokens (a `minItems` larger than fits), so every request still generates --max-tokens tokens.

A chunk is one token for both servers, except that `qwen3 serve` holds back the bytes of an
incomplete UTF-8 character, so a multi-token character arrives as one chunk (gaps are then larger,
never smaller).
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: /health, concurrent clients, percentiles

WORDS = ("river stone quantum bread violet engine mouse cloud ladder silver orbit garden paper "
         "thunder candle mirror forest copper lantern harbor").split()


def prompt(i: int, words: int) -> str:
    rng = random.Random(i)
    return f"Story {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))


SCHEMA = None
EXTRA = {}


def one_request(url, model, text, max_tokens):
    """Sends one streamed completion; returns (send time, [arrival time of each chunk], tokens)."""
    body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if SCHEMA is not None:
        del body["ignore_eos"]
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "bench", "schema": SCHEMA}}
        body["json_schema"] = SCHEMA
    body.update(EXTRA)
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn, resp = serverkit.post(url, "/v1/completions", body)
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    arrivals, tokens = [], None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            arrivals.append(time.perf_counter())
    conn.close()
    return t0, arrivals, tokens if tokens is not None else len(arrivals)


def level(args, c, offset):
    results, wall = serverkit.run_level(
        c, args.rounds, offset,
        lambda i: one_request(args.url, args.model, prompt(i, args.prompt_words), args.max_tokens))
    tokens = sum(r[2] for r in results)
    ttft = [r[1][0] - r[0] for r in results if r[1]]
    itl = [b - a for r in results for a, b in zip(r[1], r[1][1:])]
    per_stream = [(len(r[1]) - 1) / (r[1][-1] - r[1][0]) for r in results if len(r[1]) > 1]
    return {
        "concurrency": c, "requests": len(results), "tokens": tokens, "wall_s": wall,
        "agg_tok_s": tokens / wall, "stream_tok_s": statistics.median(per_stream),
        "ttft_med_s": statistics.median(ttft), "ttft_p99_s": serverkit.percentile(ttft, 99),
        "itl_med_ms": 1000 * statistics.median(itl), "itl_p99_ms": 1000 * serverkit.percentile(itl, 99),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None, help="model name to send (default: none)")
    ap.add_argument("--label", default="server")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--schema", help="a JSON Schema file every answer must follow (see above)")
    ap.add_argument("--extra", help="more fields for every request's body, as a JSON object")
    args = ap.parse_args()
    if args.extra:
        EXTRA.update(json.loads(args.extra))
    if args.schema:
        global SCHEMA
        with open(args.schema) as f:
            SCHEMA = json.load(f)

    serverkit.wait_healthy(args.url)
    one_request(args.url, args.model, prompt(10**6, args.prompt_words), 8)  # warm-up
    rows, offset = [], 0
    print(f"| {args.label} | streams | requests | aggregate tok/s | per stream tok/s | TTFT median / p99 s | ITL median / p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for c in [int(x) for x in args.concurrency.split(",")]:
        row = level(args, c, offset)
        offset += c * args.rounds
        rows.append(row)
        print(f"| {args.label} | {c} | {row['requests']} | {row['agg_tok_s']:.1f} | {row['stream_tok_s']:.1f} | "
              f"{row['ttft_med_s']:.3f} / {row['ttft_p99_s']:.3f} | {row['itl_med_ms']:.1f} / {row['itl_p99_ms']:.1f} |",
              flush=True)
    base = rows[0]["agg_tok_s"]
    print("aggregate tok/s relative to the first level: "
          + ", ".join(f"{r['concurrency']}: {r['agg_tok_s'] / base:.2f}x" for r in rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
