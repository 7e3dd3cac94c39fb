#!/usr/bin/env python3
"""Embeddings throughput of an OpenAI-compatible server under 1 and 16 concurrent clients.

Works against `qwen3 serve` with an embedding model and llama.cpp's `llama-server --embedding
--pooling last` alike. Python's standard library only.

    python3 scripts/bench_embed.py --url http://127.0.0.1:8080 --label qwen3 [--concurrency 1,16] [--rounds 6,2]

Each concurrency level runs C client threads; each client sends --rounds `/v1/embeddings`
requests one after the other (--rounds is one number for every level, or one per level), each
with ONE input text of --prompt-words random words (about 256 tokens with the default 222 words:
the mean actually sent is reported from the answers' `usage.prompt_tokens`). Every text of a run
is distinct from its first word on, so no prefix cache helps; --seed picks another set of texts.
Every answer must hold exactly one vector of --dim finite values (the largest distance of a
vector's length from 1 is reported: both servers normalize by default). Reported per level:

- embeddings/s: requests completed / wall time of the level;
- prompt tok/s: the prompt tokens of all requests (as the server counted them) / wall time;
- latency: time from sending a request to having read its whole answer (median and p99).

A failed request (a non-200 answer, a wrong vector) fails the level and the run.
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: /health, concurrent clients, percentiles

WORDS = ("river stone quantum bread violet engine mouse cloud ladder silver orbit garden paper "
         "thunder candle mirror forest copper lantern harbor meadow falcon pepper signal marble "
         "window basket rocket velvet glacier pillow tiger anchor canyon saddle whisper comet "
         "island tunnel feather market bottle compass desert ribbon castle pocket spider vessel "
         "blanket cactus dragon hammer jungle kettle lemon magnet needle ocean pencil puzzle "
         "rabbit shadow spark timber umbrella valley wagon yellow zebra acorn bridge cotton "
         "dolphin ember fossil ginger hollow iron jacket kernel lizard maple nickel oyster "
         "parrot quartz raven saffron tulip uranium violin walnut").split()


def text(seed: int, i: int, words: int) -> str:
    rng = random.Random(seed * 1_000_003 + i)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" ({seed}.{i})"


def one_request(url, model, input_text, dim):
    """Sends one embeddings request; returns (latency s, prompt tokens, |norm - 1|)."""
    body = {"input": [input_text], "encoding_format": "float"}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn, resp = serverkit.post(url, "/v1/embeddings", body)
    raw = resp.read()
    latency = time.perf_counter() - t0
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {raw[:300]!r}")
    answer = json.loads(raw)
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != 1:
        raise RuntimeError(f"expected one vector, got {0 if not isinstance(data, list) else len(data)}")
    vec = data[0].get("embedding")
    if not isinstance(vec, list) or len(vec) != dim:
        raise RuntimeError(f"expected {dim} values, got {len(vec) if isinstance(vec, list) else type(vec).__name__}")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in vec):
        raise RuntimeError("vector holds a value that is not a finite number")
    tokens = (answer.get("usage") or {}).get("prompt_tokens")
    if not isinstance(tokens, int) or tokens <= 0:
        raise RuntimeError(f"no usage.prompt_tokens in the answer: {answer.get('usage')!r}")
    return latency, tokens, abs(math.sqrt(sum(x * x for x in vec)) - 1.0)


def level(args, c, rounds, offset):
    results, wall = serverkit.run_level(
        c, rounds, offset,
        lambda i: one_request(args.url, args.model, text(args.seed, i, args.prompt_words), args.dim))
    latency = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    return {
        "concurrency": c, "requests": len(results), "prompt_tokens": tokens, "wall_s": wall,
        "mean_prompt_tokens": tokens / len(results),
        "emb_s": len(results) / wall, "prompt_tok_s": tokens / wall,
        "lat_med_s": statistics.median(latency), "lat_p99_s": serverkit.percentile(latency, 99),
        "max_norm_err": max(r[2] for r in results),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None, help="model name to send (default: none)")
    ap.add_argument("--label", default="server")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", default="4",
                    help="requests per client per level: one number, or one per level (6,2)")
    ap.add_argument("--prompt-words", type=int, default=222, help="words per input text (~256 Qwen3 tokens)")
    ap.add_argument("--dim", type=int, default=1024, help="values every vector must have (Qwen3-0.6B: 1024)")
    ap.add_argument("--seed", type=int, default=0, help="picks the set of texts")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    if len(rounds) == 1:
        rounds *= len(levels)
    if len(rounds) != len(levels):
        raise SystemExit(f"--rounds has {len(rounds)} values for {len(levels)} concurrency levels")

    serverkit.wait_healthy(args.url)
    one_request(args.url, args.model, text(-1 - args.seed, 0, args.prompt_words), args.dim)  # warm-up
    rows, offset = [], 0
    print(f"| {args.label} | clients | requests | embeddings/s | prompt tok/s | mean prompt tokens | latency median / p99 s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for c, r in zip(levels, rounds):
        row = level(args, c, r, offset)
        offset += c * r
        rows.append(row)
        print(f"| {args.label} | {c} | {row['requests']} | {row['emb_s']:.3f} | {row['prompt_tok_s']:.1f} | "
              f"{row['mean_prompt_tokens']:.1f} | {row['lat_med_s']:.2f} / {row['lat_p99_s']:.2f} | "
              f"{row['wall_s']:.1f} |", flush=True)
    print(f"largest | |vector| - 1 |: {max(r['max_norm_err'] for r in rows):.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "url": args.url, "seed": args.seed, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
