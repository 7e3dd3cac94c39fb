#!/usr/bin/env python3
"""Write the goldens of M-RoPE's positions: what transformers' `get_rope_index` (Qwen3-VL's and
Qwen3.5's, the same code) gives for prompts with images, and which position component each
rotary frequency follows (`recomposition_frequencies`) at the real models' `mrope_section`.

    ../venv-torch/bin/python scripts/vision_positions_reference.py [--out fixtures/vision/positions-reference.json]

Needs torch and transformers (5.x); run once, commit the output (a few KB). CI never runs it.
"""
import argparse
import json
import types
from pathlib import Path

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model, Qwen3_5TextRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel, Qwen3VLTextRotaryEmbedding

ROOT = Path(__file__).resolve().parent.parent
IMAGE = 9  # the image-pad token of these prompts; everything else is text

# (name, token kinds: "t" text, "i" image pad; image grids in patches), merge 2.
PROMPTS = [
    ("text only", "tttttt", []),
    ("one image", "tt" + "i" * 6 + "ttt", [[1, 4, 6]]),
    ("a tall image", "t" + "i" * 12 + "tt", [[1, 12, 4]]),
    ("two images, text between", "ttt" + "i" * 4 + "tt" + "i" * 6 + "t", [[1, 4, 4], [1, 6, 4]]),
    ("an image first", "i" * 20 + "tttt", [[1, 8, 10]]),
]


def rope_index(model_cls, kinds, grids):
    """transformers' get_rope_index, its `self` a stand-in with the two things it reads."""
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2)))
    fake.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, fake)
    ids = torch.tensor([[IMAGE if k == "i" else 1 for k in kinds]])
    types_ = torch.tensor([[1 if k == "i" else 0 for k in kinds]], dtype=torch.int)
    grid = torch.tensor(grids) if grids else None
    pos, delta = model_cls.get_rope_index(fake, ids, types_, image_grid_thw=grid)
    return pos[:, 0, :].T.tolist(), int(delta[0, 0]) + len(kinds)


def components(rotary_cls, section, half):
    """Which of the three position tables each of `half` frequencies comes from."""
    fake = types.SimpleNamespace(mrope_section=section)
    freq = torch.stack([torch.full((1, 1, half), float(c)) for c in range(3)])
    out = rotary_cls.recomposition_frequencies(fake, freq)
    return [int(v) for v in out[0, 0, :half].tolist()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "vision" / "positions-reference.json")
    args = ap.parse_args()
    prompts = []
    for name, kinds, grids in PROMPTS:
        thw, nxt = rope_index(Qwen3VLModel, kinds, grids)
        assert (thw, nxt) == rope_index(Qwen3_5Model, kinds, grids), name
        prompts.append(dict(name=name, tokens=kinds, grids=grids, merge=2, positions=thw, next=nxt))
        print(f"{name}: {len(kinds)} tokens, next position {nxt}")
    sections = [
        # Qwen3-VL (head_dim 128: 64 frequencies), Qwen3.5 (64 rotated dims of 256: 32).
        dict(model="Qwen3-VL", mrope_section=[24, 20, 20], frequencies=64,
             components=components(Qwen3VLTextRotaryEmbedding, [24, 20, 20], 64)),
        dict(model="Qwen3.5", mrope_section=[11, 11, 10], frequencies=32,
             components=components(Qwen3_5TextRotaryEmbedding, [11, 11, 10], 32)),
    ]
    args.out.write_text(json.dumps(dict(about="scripts/vision_positions_reference.py: transformers' "
                                             "get_rope_index and recomposition_frequencies",
                                        prompts=prompts, sections=sections)) + "\n")


if __name__ == "__main__":
    main()
