#!/usr/bin/env python3
"""How much a request with an image slows the answers already streaming, against a long text
prompt arriving the same way. Python's standard library only.

    qwen3 serve MODEL.bin --parallel 2 &      # a model that sees images (Qwen3-VL, Qwen3.5)
    python3 scripts/bench_image_stall.py --url http://127.0.0.1:8080 --image PICTURE.png

A server encodes an image with the model's vision tower before the image's request joins the
engine's steps, while the other sequences go on decoding. This measures what that costs them.
One streamed completion of --max-tokens tokens (greedy, `ignore_eos`) is the sequence already
decoding; once --after tokens have arrived, a second request is sent:

- `alone`: none (the stream's own gaps between tokens);
- `prompt`: a text completion with a prompt of about --prompt-words words and one token to
  generate, whose prefill the engine runs in chunks beside the stream's steps;
- `image`: a chat completion with --image (as a data URL) and a short question, one token to
  generate: the image is decoded and encoded, then its prompt is prefilled the same way.

A gap is the time between two chunks of the stream divided by the tokens of the later one (a
character split over two tokens arrives as one chunk, two steps after the last). Reported per
case, over the stream's gaps while the second request was in flight (`alone`: all of them): the median, 90th percentile and largest gap, and how long the second request took;
and for `image`, the gaps while it is encoded: those before the first gap over three times the
round's median alone (the image prompt's first prefill step). Rounds alternate the
cases (--rounds), and the table gives every round, so that a machine's noise shows.
"""

import argparse
import base64
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: posting, percentiles

WORDS = ("river stone quantum bread violet engine mouse cloud ladder silver orbit garden paper "
         "thunder candle mirror forest copper lantern harbor").split()


def stream(url, text, max_tokens, arrivals):
    """A streamed greedy completion; each chunk's arrival time and tokens appended to
    `arrivals`."""
    body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "logprobs": 0}
    conn, resp = serverkit.post(url, "/v1/completions", body)
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            # A character split over two tokens arrives as one chunk of both: its gap spans
            # two steps (the chunk's logprobs list its tokens).
            tokens = len(chunk["choices"][0]["logprobs"]["tokens"])
            arrivals.append((time.perf_counter(), tokens))
    conn.close()


def second(url, case, args, image_url, n):
    """The second request of `case`; returns (sent, done) times."""
    if case == "prompt":
        words = " ".join(WORDS[(i * 7 + n) % len(WORDS)] for i in range(args.prompt_words))
        path, body = "/v1/completions", {"prompt": f"Round {n}: {words}", "max_tokens": 1,
                                         "temperature": 0}
    else:
        content = [{"type": "image_url", "image_url": {"url": image_url}},
                   {"type": "text", "text": f"Round {n}: what is in the picture?"}]
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                              "max_tokens": 1, "temperature": 0}
    sent = time.perf_counter()
    conn, resp = serverkit.post(url, path, body)
    answer = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{case}: HTTP {resp.status}: {answer[:300]!r}")
    return sent, time.perf_counter()


def one(url, case, args, image_url, n):
    arrivals = []
    text = f"Story {n}: " + " ".join(WORDS[(i * 3 + n) % len(WORDS)] for i in range(20))
    t = threading.Thread(target=stream, args=(url, text, args.max_tokens, arrivals))
    t.start()
    window = None
    if case != "alone":
        while len(arrivals) < args.after and t.is_alive():
            time.sleep(0.001)
        if not t.is_alive():
            raise SystemExit(f"round {n} {case}: the streaming request ended early (see above)")
        window = second(url, case, args, image_url, n)
    t.join()
    # Each gap as the time of one step: a chunk of n tokens ended n steps.
    gaps = [((b - a) / n, b) for (a, _), (b, n) in zip(arrivals, arrivals[1:])]
    if window:
        sent, done = window
        # The gaps that end while the second request is in flight, and the first one after it.
        inside = [g for g, end in gaps if sent < end <= done]
        after = [g for g, end in gaps if end > done][:1]
        gaps_ms = [1000 * g for g in inside + after]
    else:
        gaps_ms = [1000 * g for g, _ in gaps]
    return {"case": case, "round": n, "gaps": len(gaps_ms),
            "gap_med_ms": statistics.median(gaps_ms) if gaps_ms else float("nan"),
            "gap_p90_ms": serverkit.percentile(gaps_ms, 90) if gaps_ms else float("nan"),
            "gap_max_ms": max(gaps_ms) if gaps_ms else float("nan"),
            "second_s": window[1] - window[0] if window else 0.0,
            # Each gap (ms) and when it ended (s after the second request was sent).
            "timeline": [(round(1000 * g, 1), round(end - window[0], 3)) for g, end in gaps]
            if window else []}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--image", required=True, help="a picture file (PNG, JPEG, ...)")
    ap.add_argument("--max-tokens", type=int, default=200, help="the streaming answer's length")
    ap.add_argument("--after", type=int, default=8, help="tokens streamed before the second request")
    ap.add_argument("--prompt-words", type=int, default=400, help="the text prompt's length in words")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    serverkit.wait_healthy(args.url, limit_s=600)
    mime = "image/png" if args.image.lower().endswith(".png") else "image/jpeg"
    with open(args.image, "rb") as f:
        image_url = f"data:{mime};base64," + base64.b64encode(f.read()).decode()
    one(args.url, "alone", args, image_url, 0)  # warm-up
    rows = []
    for n in range(1, args.rounds + 1):
        for case in ("alone", "prompt", "image"):
            r = one(args.url, case, args, image_url, n)
            rows.append(r)
            print(f"round {n} {case:6}: {r['gaps']:3} gaps, median {r['gap_med_ms']:7.1f} ms, "
                  f"p90 {r['gap_p90_ms']:7.1f} ms, largest {r['gap_max_ms']:7.1f} ms; "
                  f"second request {r['second_s']:6.2f} s", flush=True)
            if case == "alone":
                alone = r["gap_med_ms"]
            if case == "image":
                # While the image is encoded: the gaps before the image's first prefill step,
                # taken as the first gap over three times this round's median alone.
                timeline = [(g, end) for g, end in r["timeline"] if end > 0]
                first = next((end for g, end in timeline if g > 3 * alone), float("inf"))
                encoding = [g for g, end in timeline if end < first]
                if encoding:
                    print(f"round {n} image, while encoded (first {first:.2f} s): {len(encoding)} gaps, "
                          f"median {statistics.median(encoding):7.1f} ms, largest {max(encoding):7.1f} ms",
                          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
