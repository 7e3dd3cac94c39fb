#!/usr/bin/env python3
"""Write a tiny vision-language model in the hub's layout (f32) and what transformers computes with
it on prompts holding images, for the tests of the tower in the model file, of the text model's
image positions and of Qwen3-VL's DeepStack:

    ../venv-torch/bin/python scripts/fixture_vision_models.py --family qwen3_5
    ../venv-torch/bin/python scripts/fixture_vision_models.py --family qwen3_vl
    ../venv-torch/bin/python scripts/fixture_vision_models.py --family qwen3_vl_moe

- `qwen3_5`: `Qwen3_5ForConditionalGeneration` (fixtures/models/tiny-qwen3_5-vl-f32):
  fixtures/models/tiny-qwen3_5-bf16's hybrid text model, in f32, and a tower without DeepStack.
- `qwen3_vl`: `Qwen3VLForConditionalGeneration` (fixtures/models/tiny-qwen3-vl-f32):
  fixtures/models/tiny-f32-tied-gqa2's Qwen3 text model with interleaved M-RoPE
  (`mrope_section` [6, 5, 5] of its 16 frequencies), and a tower with DeepStack after both blocks
  (its features added to the outputs of text layers 0 and 1).
- `qwen3_vl_moe`: `Qwen3VLMoeForConditionalGeneration` (fixtures/models/tiny-qwen3-vl-moe-f32):
  fixtures/models/tiny-qwen3moe-f32-sharded-dense-yarn's Qwen3-MoE text model (8 experts, 3 a
  token, layer 1 dense) with Qwen3-VL's M-RoPE (`mrope_section` [3, 3, 2] of its 8 frequencies)
  in place of its YaRN, and the DeepStack tower. Its experts are written as the hub's Qwen3-VL-MoE checkpoints hold them
  (Qwen/Qwen3-VL-30B-A3B-Instruct): fused and transposed, `experts.gate_up_proj` `[E, H, 2I]`
  and `experts.down_proj` `[E, I, H]`, which transformers 5 transposes at load
  (conversion_mapping.py's "qwen3_vl_moe"); the script reloads that file and checks its logits.

Needs torch, transformers (5.x), Pillow, and fixtures/chat/qwen3.5-tokenizer_config.json (the
real Qwen3.5 chat template; the Qwen3-VL fixture takes it too: the repo holds no Qwen3-VL
template, and both render an image part as `<|vision_start|><|image_pad|><|vision_end|>`). Run
once per family, commit the output (a few MB). CI never runs it.

What it writes under OUT/:
- config.json: the source's text model under `text_config`, with a tower of 2 blocks at the real
  patch size (16) and merge (2), `dtype` float32.
- model.safetensors: transformers' `save_pretrained`: `model.language_model.*` (the text model),
  `model.visual.*` (the tower: weights drawn by scripts/vision_tower_reference.py's `randomise`, so
  that no step is near the identity), `lm_head.weight`.
- preprocessor_config.json: the hub's processor settings (mean and std 0.5), with pixel
  bounds small enough that the test images are a few tokens: at least 4 and at most 24 merged
  tokens (32 x 32 pixels each).
- tokenizer.json, tokenizer_config.json: the source's vocabulary with the vision tokens
  added at the ids config.json names (507 `<|vision_start|>`, 508 `<|vision_end|>`, 509
  `<|image_pad|>`, 510 `<|video_pad|>`), and the real Qwen3.5 chat template.
- images/: a 64 x 96 RGB image (no resize: 2 x 3 merged tokens), a 50 x 70 grayscale one
  (resized to 64 x 64), a 96 x 64 RGBA one.
- images-reference.json (not `reference.json`: the text fixtures' schema, which tests read from
  every checkpoint that has one): per case, the prompt's ids (text ids drawn from the vocabulary, each image's
  `<|vision_start|>`, one `<|image_pad|>` per merged token, `<|vision_end|>`; or a chat's
  messages through the chat template, the pads repeated as the processor does), the images,
  `image_grid_thw`, the position ids (3 x L), the tower's merged vectors, every position's f32
  logits, and 8 greedy tokens from `generate` with the smallest gap between the two best
  logits along the way (a test of greedy tokens needs that gap above the rounding), and how far
  transformers' f32 logits are from its own float64 ones (`f32_vs_f64_max_abs`: the reference's
  rounding, which a test's tolerance must leave room for).
"""
import argparse
import base64
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file
from safetensors.torch import save_file
from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLConfig,
                          Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

# The tower's weights drawn as the tower fixtures' are (gains near 1, spread biases, matrices of
# gain 1), from the script beside this one.
from vision_tower_reference import randomise

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {
    "qwen3_5": dict(source="tiny-qwen3_5-bf16", out="tiny-qwen3_5-vl-f32", config=Qwen3_5Config,
                    model=Qwen3_5ForConditionalGeneration, tower=dict(model_type="qwen3_5_vision")),
    "qwen3_vl": dict(source="tiny-f32-tied-gqa2", out="tiny-qwen3-vl-f32", config=Qwen3VLConfig,
                     model=Qwen3VLForConditionalGeneration,
                     tower=dict(model_type="qwen3_vl_vision", deepstack_visual_indexes=[0, 1]),
                     mrope_section=[6, 5, 5]),
    "qwen3_vl_moe": dict(source="tiny-qwen3moe-f32-sharded-dense-yarn", out="tiny-qwen3-vl-moe-f32", config=Qwen3VLMoeConfig,
                         model=Qwen3VLMoeForConditionalGeneration,
                         tower=dict(model_type="qwen3_vl_moe_vision", deepstack_visual_indexes=[0, 1]),
                         mrope_section=[3, 3, 2], tower_seed=2029),
}
ARCHITECTURE = dict(qwen3_vl="Qwen3VLForConditionalGeneration", qwen3_vl_moe="Qwen3VLMoeForConditionalGeneration")
VISION_TOKENS = {507: "<|vision_start|>", 508: "<|vision_end|>", 509: "<|image_pad|>", 510: "<|video_pad|>"}
IMAGE_PAD, VISION_START, VISION_END = 509, 507, 508
TOWER = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=16,
             out_hidden_size=64, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
             hidden_act="gelu_pytorch_tanh", initializer_range=0.02)
PROCESSOR = dict(image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen3VLProcessor",
                 do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True,
                 rescale_factor=1 / 255, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                 patch_size=16, temporal_patch_size=2, merge_size=2,
                 size=dict(shortest_edge=4 * 32 * 32, longest_edge=24 * 32 * 32), resample=3)
# (file, mode, height, width)
IMAGES = [("rgb-64x96.png", "RGB", 64, 96), ("gray-50x70.png", "L", 50, 70), ("rgba-96x64.png", "RGBA", 96, 64)]
# (name, [text-run lengths and image indices]): ints >= 0 are text runs, strings name images.
CASES = [
    ("one image", [3, "rgb-64x96.png", 4]),
    ("two images, text between", [2, "rgb-64x96.png", 3, "gray-50x70.png", 2]),
    ("an image in a second turn", [4, "rgba-96x64.png", 6, "gray-50x70.png", 3]),
]
# Chat cases: the messages, rendered by the chat template with the generation prompt, each
# `<|image_pad|>` then repeated for its image's merged tokens in the text before tokenizing (as
# Qwen3VLProcessor does); the images in the order the messages hold them.
CHATS = [
    ("chat: an image, then the question",
     [dict(role="user", content=[dict(type="image"), dict(type="text", text="What is in the picture?")])],
     ["rgb-64x96.png"]),
    ("chat: two turns, an image in each",
     [dict(role="user", content=[dict(type="image"), dict(type="text", text="Describe it.")]),
      dict(role="assistant", content="A gradient."),
      dict(role="user", content=[dict(type="text", text="And this one?"), dict(type="image")])],
     ["rgba-96x64.png", "gray-50x70.png"]),
]


def make_images(out):
    rng = np.random.default_rng(7)
    for name, mode, h, w in IMAGES:
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 255 // (h + w))], -1)
        rgb = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
        if mode == "RGB":
            img = Image.fromarray(rgb, "RGB")
        elif mode == "L":
            img = Image.fromarray(rgb[..., 0], "L")
        else:
            alpha = np.clip(x * 255 // w + rng.integers(0, 60, (h, w)), 0, 255).astype(np.uint8)
            img = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
        img.save(out / "images" / name)


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def text_config(family, source):
    """The source text model's config.json as the family's `text_config`."""
    config = json.loads((source / "config.json").read_text())
    if family == "qwen3_5":
        config["text_config"]["dtype"] = "float32"
        return config
    # Qwen3 -> Qwen3VLTextConfig: the same keys, rope_parameters with M-RoPE's sections
    # (interleaved, as every Qwen3-VL checkpoint has them).
    text = {k: v for k, v in config.items() if k not in ("architectures", "rope_scaling", "rope_theta",
                                                           "torch_dtype", "transformers_version",
                                                           # Qwen3VLMoeTextTopKRouter always renormalises
                                                           "norm_topk_prob", "max_window_layers",
                                                           "sliding_window", "use_sliding_window")}
    if "num_local_experts" in config:
        text["num_experts"] = text.pop("num_local_experts")
    theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    text.update(model_type=f"{family}_text", dtype="float32",
                rope_parameters=dict(rope_type="default", rope_theta=theta,
                                     mrope_section=FAMILIES[family]["mrope_section"], mrope_interleaved=True))
    return dict(architectures=[ARCHITECTURE[family]], model_type=family, text_config=text,
                tie_word_embeddings=config["tie_word_embeddings"], image_token_id=IMAGE_PAD,
                video_token_id=510, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)


def text_weights(family, source):
    """The source's text weights under the vision-language model's names."""
    if family == "qwen3_5":
        model = Qwen3_5ForConditionalGeneration.from_pretrained(source, dtype=torch.float32)
        return {k: v for k, v in model.state_dict().items() if not k.startswith("model.visual.")}
    weights = {k: v for f in sorted(source.glob("*.safetensors")) for k, v in load_file(f).items()}
    out = {k.replace("model.", "model.language_model.", 1): v.float() for k, v in weights.items()}
    out.setdefault("lm_head.weight", weights["model.embed_tokens.weight"].float())
    if family == "qwen3_vl_moe" and any(".mlp.experts.0." in k for k in out):
        # Qwen3-MoE's per-expert matrices fused as Qwen3VLMoeTextExperts holds them in memory:
        # gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I].
        layers = {k.split(".")[3] for k in out if ".mlp.experts." in k}
        for layer in sorted(layers):
            pre = f"model.language_model.layers.{layer}.mlp.experts."
            n = len({k for k in out if k.startswith(pre)}) // 3
            def take(e, proj):
                return out.pop(f"{pre}{e}.{proj}.weight")
            out[pre + "gate_up_proj"] = torch.stack(
                [torch.cat([take(e, "gate_proj"), take(e, "up_proj")]) for e in range(n)])
            out[pre + "down_proj"] = torch.stack([take(e, "down_proj") for e in range(n)])
    return out


def write_hub_experts(out, model):
    """model.safetensors rewritten with the experts in the hub's layout (`[E, H, 2I]`, `[E, I, H]`),
    and the model loaded back from it as transformers loads a hub checkpoint (it transposes them
    at load), with its experts run by transformers' own loop (`experts_implementation="eager"`,
    as make_fixtures.reference_load_kwargs says): the model the references come from. Its
    logits are checked against the model as built."""
    weights = load_file(out / "model.safetensors")
    for k in list(weights):
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            expected = tuple(model.get_parameter(k).shape)
            assert tuple(weights[k].shape) == expected, (k, weights[k].shape, expected)
            # transformers transposes only a tensor whose shape differs from its own layout.
            assert expected[1] != expected[2], f"{k}: square experts are ambiguous"
            weights[k] = weights[k].transpose(1, 2).contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    again = FAMILIES["qwen3_vl_moe"]["model"].from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
    assert again.config.text_config._experts_implementation == "eager"
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, again(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
    return again


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_5")
    ap.add_argument("--out", type=Path, help="default: fixtures/models/<the family's name>")
    args = ap.parse_args()
    fam = FAMILIES[args.family]
    source = ROOT / "fixtures" / "models" / fam["source"]
    out = args.out or ROOT / "fixtures" / "models" / fam["out"]
    (out / "images").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    # 1. The model: the source's text model in f32, a new tower.
    config = text_config(args.family, source)
    config["vision_config"] = dict(TOWER, **fam["tower"])
    config["dtype"] = "float32"
    cfg = fam["config"](**config)
    cfg._attn_implementation = "eager"
    model = fam["model"](cfg).eval()
    missing, unexpected = model.load_state_dict(text_weights(args.family, source), strict=False)
    assert not unexpected and all(k.startswith("model.visual.") for k in missing), (missing, unexpected)
    # (The MoE fixture's tower from another seed: with 2027 one chat's greedy answer passes
    # within 1e-2 of a tie, closer than a test of greedy tokens can trust.)
    randomise(model.model.visual, fam.get("tower_seed", 2027))
    model.save_pretrained(out, safe_serialization=True)
    if args.family == "qwen3_vl_moe":
        model = write_hub_experts(out, model)
    cfg_json = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    shutil.copy(source / "generation_config.json", out / "generation_config.json")
    (out / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=2) + "\n")

    # 2. The tokenizer: the vision tokens added, the real chat template.
    tok = json.loads((source / "tokenizer.json").read_text())
    for i, content in VISION_TOKENS.items():
        tok["added_tokens"].append(dict(id=i, content=content, single_word=False, lstrip=False, rstrip=False,
                                        normalized=False, special=True))
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    tcfg = json.loads((source / "tokenizer_config.json").read_text())
    real = json.loads((ROOT / "fixtures" / "chat" / "qwen3.5-tokenizer_config.json").read_text())
    tcfg["chat_template"] = real["chat_template"]
    for i, content in VISION_TOKENS.items():
        tcfg.setdefault("added_tokens_decoder", {})[str(i)] = dict(
            content=content, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")

    # 3. Images, and the processor's view of them (the PIL backend, which the Rust processor
    #    matches bit for bit).
    make_images(out)
    proc = Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size=PROCESSOR["size"])
    processed = {}
    for name, _, _, _ in IMAGES:
        r = proc(images=[Image.open(out / "images" / name)], return_tensors="pt")
        processed[name] = (r["pixel_values"], r["image_grid_thw"][0])
        print(f"{name}: grid {r['image_grid_thw'][0].tolist()}")

    # 4. The cases: random text ids around images, then chats through the template.
    rng = np.random.default_rng(11)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompts = []
    for name, parts in CASES:
        ids, images = [], []
        for p in parts:
            if isinstance(p, int):
                ids += rng.integers(0, 500, p).tolist()
            else:
                n = int(processed[p][1].prod()) // 4
                ids += [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
                images.append(p)
        prompts.append((name, ids, images, None))
    for name, messages, images in CHATS:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(images) + 1, text
        expanded = pieces[0]
        for image, piece in zip(images, pieces[1:]):
            expanded += "<|image_pad|>" * (int(processed[image][1].prod()) // 4) + piece
        ids = tokenizer(expanded, add_special_tokens=False)["input_ids"]
        prompts.append((name, ids, images, messages))
    cases = []
    for name, ids, images, messages in prompts:
        kinds = [1 if t == IMAGE_PAD else 0 for t in ids]
        input_ids = torch.tensor([ids])
        mm = torch.tensor([kinds], dtype=torch.int)
        pixels = torch.cat([processed[i][0] for i in images])
        grids = torch.stack([processed[i][1] for i in images])
        with torch.no_grad():
            merged = model.model.get_image_features(pixels, grids, return_dict=True).pooler_output
            merged = torch.cat(list(merged)) if isinstance(merged, (list, tuple)) else merged
            positions, delta = model.model.get_rope_index(input_ids, mm, image_grid_thw=grids)
            model.model.rope_deltas = None
            logits = model(input_ids=input_ids, pixel_values=pixels, image_grid_thw=grids,
                           mm_token_type_ids=mm).logits[0]
            model.model.rope_deltas = None
            gen = model.generate(input_ids=input_ids, pixel_values=pixels, image_grid_thw=grids,
                                 mm_token_type_ids=mm, max_new_tokens=8, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True, eos_token_id=None,
                                 pad_token_id=0)
            # The reference's own f32 rounding: the same forward in float64.
            model.model.rope_deltas = None
            model.double()
            logits64 = model(input_ids=input_ids, pixel_values=pixels.double(), image_grid_thw=grids,
                             mm_token_type_ids=mm).logits[0]
            model.float()
            model.model.rope_deltas = None
        rounding = float((logits.double() - logits64).abs().max())
        gaps = [float(torch.topk(s[0], 2).values.diff().abs()) for s in gen.scores]
        greedy = gen.sequences[0, len(ids):].tolist()
        cases.append(dict(name=name, messages=messages, input_ids=ids, images=images, image_grid_thw=grids.tolist(),
                          positions=positions[:, 0, :].tolist(), next_position=int(delta[0, 0]) + len(ids),
                          merged_shape=list(merged.shape), merged_b64=b64(merged.numpy()),
                          logits_shape=list(logits.shape), logits_b64=b64(logits.numpy()),
                          greedy=greedy, greedy_min_gap=min(gaps), f32_vs_f64_max_abs=rounding))
        print(f"{name}: {len(ids)} tokens, merged {list(merged.shape)}, greedy {greedy}, "
              f"smallest top-2 gap {min(gaps):.2e}, f32 logits within {rounding:.2e} of f64")
    (out / "images-reference.json").write_text(json.dumps(dict(
        about=f"scripts/fixture_vision_models.py: transformers {transformers.__version__} "
              f"{fam['model'].__name__}, f32, eager attention; pixel values by Qwen2VLImageProcessorPil",
        cases=cases), indent=1) + "\n")


if __name__ == "__main__":
    main()
