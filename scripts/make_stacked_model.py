#!/usr/bin/env python3
"""A target model for benchmarking speculative decoding with a draft model on random weights.

Random weights give a draft model nothing to agree with: two random models guess each other's
tokens about never. This writes a target that a given draft model guesses exactly: the draft
model's checkpoint with N more decoder layers after its own, copies of its layers except that
their two output projections (self_attn.o_proj and mlp.down_proj) are zero. Such a layer adds
zero to the residual stream (x + 0 = x, exactly, in every dtype), so the target's logits are the
draft model's, bit for bit, while each token reads all of its layers' weights: a target
(L + N) / L times the draft's layers, whose every greedy guess is right. That measures the
ceiling of draft-model speculation at that cost ratio; real drafts are right less often
(docs/performance.md, "Speculative decoding").

    ../venv-torch/bin/python scripts/make_bench_model.py --shape 0.6b DRAFT_DIR
    ../venv-torch/bin/python scripts/make_stacked_model.py DRAFT_DIR OUT_DIR --extra-layers 112

DRAFT_DIR is a dense Qwen3 checkpoint in one model.safetensors (bf16), as make_bench_model.py
writes; OUT_DIR gets the same files with num_hidden_layers raised. Streams one tensor at a time;
written under a temporary name and renamed when complete. Do not commit the output.
"""

import argparse
import json
import re
import shutil
import struct
from pathlib import Path

import torch
from safetensors import safe_open

ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draft_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--extra-layers", type=int, required=True)
    args = ap.parse_args()

    config = json.loads((args.draft_dir / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        ap.error("the draft model must be a dense Qwen3 checkpoint")
    layers = config["num_hidden_layers"]
    total = layers + args.extra_layers
    src = safe_open(args.draft_dir / "model.safetensors", framework="pt")

    # Every output tensor: its name, the source tensor it copies (its shape), and whether it is
    # zero instead. Layer i's tensors are copied into the extra layers L + i, 2L + i, ..
    layer_re = re.compile(r"model\.layers\.(\d+)\.(.+)")
    plan = []
    for name in src.keys():
        plan.append((name, name, False))
        m = layer_re.fullmatch(name)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            for j in range(layers + i, total, layers):
                plan.append((f"model.layers.{j}.{rest}", name, rest in ZEROED))
    plan.sort()

    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, source, _ in plan:
        shape = src.get_slice(source).get_shape()
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)

    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for name, source, zero in plan:
            x = src.get_tensor(source).to(torch.bfloat16)
            if zero:
                x = torch.zeros_like(x)
            f.write(x.contiguous().view(torch.int16).numpy().tobytes())
    tmp.rename(out / "model.safetensors")

    config["num_hidden_layers"] = total
    if "max_window_layers" in config:
        config["max_window_layers"] = total
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (args.draft_dir / f).exists():
            shutil.copy(args.draft_dir / f, out / f)
    print(f"{out}: {total} layers ({layers} of the draft model's, {args.extra_layers} adding nothing), "
          f"{offset} bytes of bf16")


if __name__ == "__main__":
    main()
