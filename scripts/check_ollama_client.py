#!/usr/bin/env python3
"""`qwen3 serve` through the official `ollama` Python client: what an Ollama tool sees.

    pip install ollama
    python3 scripts/check_ollama_client.py --qwen3 target/release/qwen3 --model models/tiny.bin

Starts the server on a free loopback port, then checks with the client: listing, showing and
`ps`, a chat answer whole and streamed (the same text), a generate, options (num_predict,
temperature, seed), `think`, `format` with a JSON Schema, and that an unknown model raises the
client's ResponseError with 404. With --embedding-model (an export of
fixtures/models/tiny-qwen3-embedding) a second server checks `embed`: the vectors of
sentence-transformers (its reference.json, 1e-4) and the one capability `embedding`. With
--vision-model (an export of fixtures/models/tiny-qwen3_5-vl-f32) a third checks images: a chat
and a generate with `images` (a file path, which the client sends as base64) counting the image's
tokens as transformers' processor does, `vision` among the capabilities, and an image that is no
image raising ResponseError with 400. Prints one
line per check and exits non-zero on the first failure. Without the `ollama` package it says so
and exits 0.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: the server and the check lines

try:
    import ollama
except ImportError:
    print("check_ollama_client: the ollama package is not installed; skipped")
    sys.exit(0)

# One line per check; the first failure ends the run (later checks build on earlier ones).
check = serverkit.Checks("ollama-client")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default="target/release/qwen3")
    ap.add_argument("--model", default="models/tiny.bin")
    ap.add_argument("--embedding-model", help="an export of fixtures/models/tiny-qwen3-embedding")
    ap.add_argument("--vision-model", help="an export of fixtures/models/tiny-qwen3_5-vl-f32")
    args = ap.parse_args()
    with_server(args.qwen3, args.model, run)
    if args.embedding_model:
        with_server(args.qwen3, args.embedding_model, run_embed)
    if args.vision_model:
        with_server(args.qwen3, args.vision_model, run_vision)
    check.finish()


def with_server(qwen3, model, checks):
    with serverkit.Server(qwen3, model, "--model-name", "tiny") as server:
        checks(ollama.Client(host=server.url))


def run_embed(client):
    ref_path = Path(__file__).resolve().parent.parent / "fixtures/models/tiny-qwen3-embedding/reference.json"
    cases = json.loads(ref_path.read_text())["cases"]
    r = client.embed(model="tiny", input=[c["text"] for c in cases])
    close = all(len(got) == len(c["embedding"]) and max(abs(a - b) for a, b in zip(got, c["embedding"])) < 1e-4
                for got, c in zip(r.embeddings, cases))
    check("embed gives sentence-transformers' vectors", len(r.embeddings) == len(cases) and close)
    check("embed counts the prompt tokens",
          r.prompt_eval_count == sum(len(c["ids"]) for c in cases))
    check("show says an embedding model embeds", client.show("tiny").capabilities == ["embedding"])


def run_vision(client):
    fixture = Path(__file__).resolve().parent.parent / "fixtures/models/tiny-qwen3_5-vl-f32"
    case = json.loads((fixture / "images-reference.json").read_text())["cases"][3]
    text = case["messages"][0]["content"][1]["text"]
    image = str(fixture / "images" / case["images"][0])
    opts = {"temperature": 0, "num_predict": 4}
    r = client.chat(model="tiny", options=opts,
                    messages=[{"role": "user", "content": text, "images": [image]}])
    check("chat with an image counts its tokens as transformers does",
          r.prompt_eval_count == len(case["input_ids"]) and r.eval_count == 4)
    g = client.generate(model="tiny", prompt=text, images=[image], options=opts)
    said = lambda m: (m.thinking or "") + (m.content or "")
    check("generate with an image answers as the chat", (g.thinking or "") + g.response == said(r.message))
    check("show lists vision", "vision" in (client.show("tiny").capabilities or []))
    try:
        client.chat(model="tiny", messages=[{"role": "user", "content": text, "images": [b"not an image"]}])
        check("an image that is no image raises ResponseError", False)
    except ollama.ResponseError as e:
        check(f"an image that is no image raises ResponseError ({e.status_code})", e.status_code == 400)


def run(client):
    models = client.list().models
    check("list names the model", [m.model for m in models] == ["tiny"])
    show = client.show("tiny")
    check("show gives capabilities and model_info",
          "completion" in (show.capabilities or []) and show.modelinfo["general.architecture"] == "qwen3")
    check("ps lists the loaded model", [m.model for m in client.ps().models] == ["tiny"])

    msgs = [{"role": "user", "content": "Hello!"}]
    opts = {"temperature": 0, "num_predict": 8}
    r = client.chat(model="tiny", messages=msgs, options=opts, think=False)
    check("chat answers with counts", r.done and r.eval_count == 8 and r.message.role == "assistant"
          and len(r.message.content) > 0 and r.total_duration > 0)
    streamed = "".join(p.message.content for p in
                       client.chat(model="tiny", messages=msgs, options=opts, think=False, stream=True))
    check("a streamed chat is the same text", streamed == r.message.content)
    g = client.generate(model="tiny", prompt="Hello!", options=opts, think=False)
    check("generate answers the prompt as a chat turn", g.response == r.message.content)

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    f = client.chat(model="tiny", messages=msgs, format=schema, think=False,
                    options={"temperature": 1, "seed": 3, "num_predict": 100})
    check("format with a JSON Schema gives matching JSON",
          isinstance(json.loads(f.message.content).get("ok"), bool))
    try:
        client.chat(model="llama3", messages=msgs)
        check("an unknown model raises ResponseError", False)
    except ollama.ResponseError as e:
        check(f"an unknown model raises ResponseError ({e.status_code})", e.status_code == 404)


if __name__ == "__main__":
    main()
