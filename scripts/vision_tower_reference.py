#!/usr/bin/env python3
"""Write tiny random vision towers (Qwen3-VL's, with DeepStack, and Qwen3.5's, without) and what
transformers' `Qwen3VLVisionModel` / `Qwen3_5VisionModel` compute from the image processor's
goldens, for the Rust tower's tests.

    ../venv-torch/bin/python scripts/vision_tower_reference.py [--out fixtures/vision/tower]

Needs torch and transformers (5.x) and fixtures/vision/processor-reference.json (written by
scripts/vision_reference.py, whose tiny patch of 4 these towers share); run once, commit the
output (about 1 MB). CI never runs it.

Per tower, under OUT/<name>/:
- config.json: the hub layout's `vision_config` (and `model_type`, `architectures`).
- model.safetensors: the tower's tensors under the hub's names (`model.visual.*`), f32. Drawn
  here, not transformers' initialisation (which gives weights of 0.02 and zero biases, under
  which every block is nearly the identity): matrices of gain 1 over their inputs, biases and
  norm gains spread, position embeddings of 0.5, so that every step changes the result.
- reference.json: per case (one image, the other, both in one call), the input (which processor
  cases, `image_grid_thw`), the merged output the language model receives (`pooler_output`,
  [patches / 4, out_hidden_size]) and each DeepStack feature, f32 base64; transformers in f32 with
  eager attention.
"""
import argparse
import base64
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent

VISION = dict(depth=3, hidden_act="gelu_pytorch_tanh", hidden_size=32, in_channels=3, initializer_range=0.02,
              intermediate_size=64, num_heads=2, num_position_embeddings=16, out_hidden_size=48, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2)
TOWERS = {
    # Qwen3-VL: DeepStack features after blocks 0 and 2.
    "qwen3-vl": dict(arch="Qwen3VLForConditionalGeneration", model_type="qwen3_vl",
                     vision=dict(VISION, model_type="qwen3_vl", deepstack_visual_indexes=[0, 2])),
    # Qwen3.5: the same tower without DeepStack.
    "qwen3_5": dict(arch="Qwen3_5ForConditionalGeneration", model_type="qwen3_5",
                    vision=dict(VISION, model_type="qwen3_5")),
}
# Processor goldens fed to the towers: grids of 6x10 and 8x12 patches.
IMAGES = ["processor/rgb-24x40.png", "processor/rgb-30x45.png"]
CASES = [[0], [1], [0, 1]]


def tower_class(name):
    if name == "qwen3-vl":
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
        return Qwen3VLVisionConfig, Qwen3VLVisionModel
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    return Qwen3_5VisionConfig, Qwen3_5VisionModel


def randomise(model, seed):
    """Weights under which every step matters (see the module doc)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2] if "." in name else ""
            if "norm" in module and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name == "pos_embed.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "vision" / "tower")
    args = ap.parse_args()
    proc = json.loads((ROOT / "fixtures" / "vision" / "processor-reference.json").read_text())
    by_file = {c["file"]: c for c in proc["cases"]}
    inputs = []
    for f in IMAGES:
        c = by_file[f]
        pv = np.frombuffer(base64.b64decode(c["pixel_values_b64"]), dtype="<f4").reshape(c["grid_thw"][1] * c["grid_thw"][2], -1)
        inputs.append((torch.from_numpy(pv.copy()), c["grid_thw"]))

    for seed, (name, t) in enumerate(TOWERS.items()):
        config_cls, model_cls = tower_class(name)
        cfg = config_cls(**{k: v for k, v in t["vision"].items() if k != "model_type"})
        cfg._attn_implementation = "eager"
        model = model_cls(cfg).eval()
        randomise(model, 2026 + seed)
        out_dir = args.out / name
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file({"model.visual." + k: v.detach().contiguous() for k, v in model.state_dict().items()},
                  str(out_dir / "model.safetensors"))
        vision_config = dict(t["vision"], rope_parameters=dict(cfg.rope_parameters))
        (out_dir / "config.json").write_text(json.dumps(
            {"architectures": [t["arch"]], "model_type": t["model_type"], "vision_config": vision_config,
             "transformers_version": transformers.__version__}, indent=1) + "\n")
        cases = []
        for case in CASES:
            pixels = torch.cat([inputs[i][0] for i in case])
            grid = torch.tensor([inputs[i][1] for i in case])
            with torch.no_grad():
                out = model(pixels, grid_thw=grid)
            deepstack = getattr(out, "deepstack_features", None) or []
            cases.append(dict(images=[IMAGES[i] for i in case], grid_thw=grid.tolist(),
                              merged_shape=list(out.pooler_output.shape), merged_b64=b64(out.pooler_output.numpy()),
                              deepstack_b64=[b64(d.numpy()) for d in deepstack]))
            print(f"{name} {[IMAGES[i] for i in case]}: merged {list(out.pooler_output.shape)}, "
                  f"{len(deepstack)} DeepStack features, |merged| max {out.pooler_output.abs().max():.3f}")
        (out_dir / "reference.json").write_text(json.dumps(
            dict(about=f"scripts/vision_tower_reference.py: transformers {transformers.__version__} "
                       f"{model_cls.__name__}, f32, eager attention", cases=cases), indent=1) + "\n")


if __name__ == "__main__":
    main()
