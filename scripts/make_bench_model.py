#!/usr/bin/env python3
"""Write a random-weight checkpoint with the exact shapes of Qwen3-0.6B, Qwen3-1.7B, Qwen3-30B-A3B,
Qwen3.5-0.8B, Qwen3.5-2B, Qwen3.5-35B-A3B or Qwen3-VL-2B.

For benchmarks (speed and memory need the real shapes, not the real weights) on machines without
the real checkpoint:

    ../venv-torch/bin/python scripts/make_bench_model.py --shape 0.6b OUT_DIR [--check]
    ../venv-torch/bin/python scripts/make_bench_model.py --shape 30b-a3b --layers 8 OUT_DIR [--check]
    ../venv-torch/bin/python scripts/make_bench_model.py --shape qwen3.5-0.8b OUT_DIR [--check]

OUT_DIR gets config.json and generation_config.json (the hub keys and values of that model),
model.safetensors (bf16, like the hub checkpoints), and the real Qwen3 tokenizer.json and
tokenizer_config.json copied from --qwen3-tokenizer. Do not commit the output (1.2 GB / 3.4 GB;
30b-a3b: 61 GB for all 48 layers, 11.2 GB with --layers 8).

30b-a3b is Qwen3-MoE (model_type qwen3_moe): 128 experts per layer, 8 routed per token, with the
hub's per-expert tensor names (model.layers.N.mlp.gate.weight is the router,
model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight the experts). The router weights get a
larger gain than the other matrices so that different tokens pick clearly different experts.
qwen3.5-35b-a3b is Qwen3.5-35B-A3B's text model the same way (`Qwen3_5MoeForCausalLM`, the experts
fused as the hub stores them: `mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`), with
--layers 8 for a disk of tens of GB.
qwen3.5-0.8b is the text model of Qwen3.5-0.8B as a `Qwen3_5ForCausalLM` (model_type qwen3_5_text):
24 layers, every fourth gated attention (8 query heads of 256, 2 KV heads, RoPE on a quarter of each
head), the others Gated DeltaNets (16 key and 16 value heads of 128, a convolution of width 4), an
MLP of 3584, tied embeddings of Qwen3.5's 248,320 rows. Its decays and write strengths are drawn in
a trained layer's range, its (1 + w) norms around zero. The tokenizer is still Qwen3's (the hub is
out of reach): the rows past it are padding, which changes no layer's work. qwen3.5-2b is the same
at hidden 2048 with an MLP of 6144.
qwen3-vl-2b is Qwen3-VL-2B-Instruct as a `Qwen3VLForConditionalGeneration`: Qwen3-1.7B's text model
(interleaved M-RoPE sections [24, 20, 20], tied) under `model.language_model.`, and the vision tower
under `model.visual.`: 24 blocks of 1024 (16 heads, MLP 4096, LayerNorms and biases), patches of 16
merged 2x2 into tokens of 2048, a 48 x 48 position table, DeepStack after blocks 5, 11 and 17. It
also gets the hub's `preprocessor_config.json` and, in tokenizer_config.json, the Qwen3.5 chat
template (Qwen3's has no image parts; fixtures/chat/qwen3.5.chat_template.jinja).
--layers N writes only the first N decoder layers (config num_hidden_layers = N; each layer's work
is unchanged), so that a model too big for the disk can still be benchmarked per layer.
--zero-experts leaves every expert weight zero and writes it as a hole in a sparse file: the full
48-layer 30b-a3b checkpoint then takes about 3 GB of disk instead of 61 GB, for measuring the memory
and speed of the full-size file (the router and attention stay random, so routing still varies from
token to token; the experts' products are zero, which costs the same to compute).

Streaming: the safetensors header is computed from the shapes alone and written first, then each
tensor is drawn in row chunks, converted to bf16 and appended, so peak memory is one chunk, not the
model. Needs no GPU. The file is written under a temporary name and renamed when complete.
--check then loads the result with transformers (bf16, CPU) and runs one short forward.
"""

import argparse
import json
import math
import os
import shutil
import struct
from pathlib import Path

import torch

# The real Qwen3 tokenizer files, in `shared/` beside the repository.
DEFAULT_QWEN3_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "qwen3-tokenizer"

# Shapes from the hub config.json of Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B and Qwen/Qwen3-30B-A3B.
SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    # Qwen3-MoE: intermediate_size is in the hub config but unused (no dense layers: decoder_sparse_step
    # 1, mlp_only_layers []); every layer's MLP is 128 experts of moe_intermediate_size, top-8 routed.
    "30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, num_experts=128, moe_intermediate_size=768,
                    num_experts_per_tok=8),
    # Qwen3.5: the text model's shape (hub config's text_config); layer kinds every fourth attention.
    "qwen3.5-0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                         linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                         vocab_size=248320),
    # Qwen3.5-2B's text model: Qwen3.5-0.8B's layer kinds at hidden 2048 with an MLP of 6144, tied.
    # (The hub is out of reach here: these are the text_config values public configs of the model
    # give, and a tied 2048-wide model of this shape at Q4_K_M is the 1.28 GB that the published
    # GGUF of Qwen3.5-2B is; untied, its classifier in Q6_K would add 0.42 GB.)
    "qwen3.5-2b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                       linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                       vocab_size=248320),
    # Qwen3.5-35B-A3B's text model: 40 layers (every fourth attention), 16 query and 2 KV heads of
    # 256, Gated DeltaNets of 16 key and 32 value heads of 128; every MLP 256 experts of 512, top
    # 8, and a shared expert of 512; untied.
    "qwen3.5-35b-a3b": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                            linear_conv_kernel_dim=4, vocab_size=248320, num_experts=256,
                            num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512),
    # Qwen3-VL-2B: Qwen3-1.7B's text model and the tower (hub config's vision_config).
    "qwen3-vl-2b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128,
                        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                                    out_hidden_size=2048, num_position_embeddings=2304, patch_size=16,
                                    spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                                    hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[5, 11, 17],
                                    initializer_range=0.02, model_type="qwen3_vl")),
}
ROUTER_GAIN = 3.0  # router logits with std about 3: softmax spread, top-8 varies from token to token
VOCAB = 151936
BOS, IM_END = 151643, 151645
CHUNK_ELEMS = 1 << 24  # 16M values (64 MB of f32) per generated chunk


def hub_config(shape: dict) -> dict:
    """The hub config.json's keys, in their order (Qwen3-0.6B/1.7B, or Qwen3-30B-A3B for MoE shapes)."""
    if "vision" in shape:
        return hub_config_vl(shape)
    if "linear_num_key_heads" in shape:
        return hub_config_qwen3_5(shape)
    if "num_experts" in shape:
        return hub_config_moe(shape)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "eos_token_id": IM_END,
        "head_dim": shape["head_dim"],
        "hidden_act": "silu",
        "hidden_size": shape["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": shape["intermediate_size"],
        "max_position_embeddings": 40960,
        "max_window_layers": shape["num_hidden_layers"],
        "model_type": "qwen3",
        "num_attention_heads": shape["num_attention_heads"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def hub_config_moe(shape: dict) -> dict:
    """Qwen3-30B-A3B's config.json keys and values, in their order."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "decoder_sparse_step": 1,
        "eos_token_id": IM_END,
        "head_dim": shape["head_dim"],
        "hidden_act": "silu",
        "hidden_size": shape["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": shape["intermediate_size"],
        "max_position_embeddings": 40960,
        "max_window_layers": shape["num_hidden_layers"],
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": shape["moe_intermediate_size"],
        "norm_topk_prob": True,
        "num_attention_heads": shape["num_attention_heads"],
        "num_experts": shape["num_experts"],
        "num_experts_per_tok": shape["num_experts_per_tok"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def hub_config_vl(shape: dict) -> dict:
    """Qwen3-VL-2B-Instruct's config.json: the Qwen3 text model under text_config, the tower's
    vision_config, the image token ids of Qwen3's vocabulary."""
    text = {k: v for k, v in hub_config({k: v for k, v in shape.items() if k != "vision"}).items()
            if k not in ("architectures", "rope_scaling", "rope_theta", "torch_dtype", "transformers_version",
                         "sliding_window", "use_sliding_window", "max_window_layers", "tie_word_embeddings")}
    text.update(model_type="qwen3_vl_text", dtype="bfloat16", max_position_embeddings=262144,
                rope_parameters={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                                 "rope_theta": 5000000})
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": 151655,
        "model_type": "qwen3_vl",
        "text_config": text,
        "tie_word_embeddings": True,
        "transformers_version": "5.24.0",
        "video_token_id": 151656,
        "vision_config": shape["vision"],
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    }


# Qwen3-VL's preprocessor_config.json on the hub.
PREPROCESSOR_VL = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}


def tensor_specs_vision(v: dict):
    """The tower's tensors under model.visual.: (name, shape, kind, gain). Biases small, LayerNorm
    gains around 1, the position table like an embedding."""
    d, i, e = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    m4 = d * v["spatial_merge_size"] ** 2
    p, t = v["patch_size"], v["temporal_patch_size"]
    specs = []

    def linear(name, out, inp, gain=1.0):
        specs.extend([(name + ".weight", [out, inp], "mat", gain), (name + ".bias", [out], "bias", 0.02)])

    def norm(name, width):
        specs.extend([(name + ".weight", [width], "norm", 0), (name + ".bias", [width], "bias", 0.02)])

    specs += [("patch_embed.proj.weight", [d, v["in_channels"], t, p, p], "mat", 1.0),
              ("patch_embed.proj.bias", [d], "bias", 0.02),
              ("pos_embed.weight", [v["num_position_embeddings"], d], "embed", 0.5)]
    for l in range(v["depth"]):
        b = f"blocks.{l}."
        norm(b + "norm1", d)
        norm(b + "norm2", d)
        linear(b + "attn.qkv", 3 * d, d)
        linear(b + "attn.proj", d, d)
        linear(b + "mlp.linear_fc1", i, d)
        linear(b + "mlp.linear_fc2", d, i)
    norm("merger.norm", d)
    linear("merger.linear_fc1", m4, m4)
    linear("merger.linear_fc2", e, m4)
    for j in range(len(v["deepstack_visual_indexes"])):
        norm(f"deepstack_merger_list.{j}.norm", m4)
        linear(f"deepstack_merger_list.{j}.linear_fc1", m4, m4)
        linear(f"deepstack_merger_list.{j}.linear_fc2", e, m4)
    return [("model.visual." + n, s, k, g) for n, s, k, g in specs]


def layer_types(shape: dict) -> list:
    """Qwen3.5's layer kinds: every fourth layer attention (full_attention_interval 4)."""
    return ["full_attention" if (l + 1) % 4 == 0 else "linear_attention" for l in range(shape["num_hidden_layers"])]


def hub_config_qwen3_5(shape: dict) -> dict:
    """Qwen3.5-0.8B's text_config keys and values, as a text-only Qwen3_5ForCausalLM."""
    keys = ("head_dim", "hidden_size", "intermediate_size", "linear_conv_kernel_dim", "linear_key_head_dim",
            "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim", "num_attention_heads",
            "num_hidden_layers", "num_key_value_heads", "vocab_size", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size")
    moe = "num_experts" in shape
    return {
        "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": BOS,
        "dtype": "bfloat16",
        "eos_token_id": IM_END,
        "full_attention_interval": 4,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "layer_types": layer_types(shape),
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": not moe,
        "use_cache": True,
        **{k: shape[k] for k in keys if k in shape},
    }


GENERATION_CONFIG = {
    "bos_token_id": BOS,
    "do_sample": True,
    "eos_token_id": [IM_END, BOS],
    "pad_token_id": BOS,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}


def tensor_specs(shape: dict):
    """(name, shape, kind, gain) for every tensor. Dense shapes tie the embeddings (no lm_head.weight);
    MoE shapes have an lm_head.weight and a router plus per-expert projections instead of a dense MLP."""
    if "linear_num_key_heads" in shape:
        return tensor_specs_qwen3_5(shape)
    if "vision" in shape:
        text = tensor_specs({k: v for k, v in shape.items() if k != "vision"})
        text = [(n.replace("model.", "model.language_model.", 1), s, k, g) for n, s, k, g in text]
        return sorted(text + tensor_specs_vision(shape["vision"]), key=lambda s: s[0])
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    hd, nh, nkv = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]
    moe = "num_experts" in shape
    specs = [("model.embed_tokens.weight", [VOCAB, h], "embed", 0.35)]
    if moe:
        specs.append(("lm_head.weight", [VOCAB, h], "mat", 1.0))
    for l in range(shape["num_hidden_layers"]):
        p = f"model.layers.{l}."
        if moe:
            ne, mi = shape["num_experts"], shape["moe_intermediate_size"]
            mlp = [(p + "mlp.gate.weight", [ne, h], "mat", ROUTER_GAIN)]
            for e in range(ne):
                q = f"{p}mlp.experts.{e}."
                mlp += [
                    (q + "down_proj.weight", [h, mi], "mat", 1.0),
                    (q + "gate_proj.weight", [mi, h], "mat", 1.5),
                    (q + "up_proj.weight", [mi, h], "mat", 1.5),
                ]
        else:
            mlp = [
                (p + "mlp.down_proj.weight", [h, inter], "mat", 1.0),
                (p + "mlp.gate_proj.weight", [inter, h], "mat", 1.5),
                (p + "mlp.up_proj.weight", [inter, h], "mat", 1.5),
            ]
        specs += mlp + [
            (p + "input_layernorm.weight", [h], "norm", 0),
            (p + "post_attention_layernorm.weight", [h], "norm", 0),
            (p + "self_attn.k_norm.weight", [hd], "norm", 0),
            (p + "self_attn.k_proj.weight", [nkv * hd, h], "mat", 2.0),
            (p + "self_attn.o_proj.weight", [h, nh * hd], "mat", 1.0),
            (p + "self_attn.q_norm.weight", [hd], "norm", 0),
            (p + "self_attn.q_proj.weight", [nh * hd, h], "mat", 2.0),
            (p + "self_attn.v_proj.weight", [nkv * hd, h], "mat", 1.0),
        ]
    specs.append(("model.norm.weight", [h], "norm", 0))
    return sorted(specs, key=lambda s: s[0])


def tensor_specs_qwen3_5(shape: dict):
    """Qwen3_5ForCausalLM's tensors: (name, shape, kind, gain). Kinds past the Qwen3 ones: `centred`
    (a (1 + w) norm's w, U(-0.5, 0.5)), `a_log` (log U(0.05, 0.5)), `dt_bias` (U(-3, -2)): a memory
    of tens of tokens, as the fixtures draw it (scripts/fixture_qwen3_5.py)."""
    h, inter, V = shape["hidden_size"], shape.get("intermediate_size"), shape["vocab_size"]
    hd, nh, nkv = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]
    kd = shape["linear_num_key_heads"] * shape["linear_key_head_dim"]
    vh, dv = shape["linear_num_value_heads"], shape["linear_value_head_dim"]
    cd, kc = 2 * kd + vh * dv, shape["linear_conv_kernel_dim"]
    specs = [("model.embed_tokens.weight", [V, h], "embed", 0.35), ("model.norm.weight", [h], "centred", 0)]
    moe = "num_experts" in shape
    if moe:
        specs.append(("lm_head.weight", [V, h], "mat", 1.0))
    for l, kind in enumerate(layer_types(shape)):
        p = f"model.layers.{l}."
        specs += [
            (p + "input_layernorm.weight", [h], "centred", 0),
            (p + "post_attention_layernorm.weight", [h], "centred", 0),
        ]
        if moe:
            e, mi, si = shape["num_experts"], shape["moe_intermediate_size"], shape["shared_expert_intermediate_size"]
            specs += [
                (p + "mlp.gate.weight", [e, h], "mat", ROUTER_GAIN),
                (p + "mlp.experts.gate_up_proj", [e, 2 * mi, h], "experts", 1.5),
                (p + "mlp.experts.down_proj", [e, h, mi], "experts", 1.0),
                (p + "mlp.shared_expert.down_proj.weight", [h, si], "mat", 1.0),
                (p + "mlp.shared_expert.gate_proj.weight", [si, h], "mat", 1.5),
                (p + "mlp.shared_expert.up_proj.weight", [si, h], "mat", 1.5),
                (p + "mlp.shared_expert_gate.weight", [1, h], "mat", 1.0),
            ]
        else:
            specs += [
                (p + "mlp.down_proj.weight", [h, inter], "mat", 1.0),
                (p + "mlp.gate_proj.weight", [inter, h], "mat", 1.5),
                (p + "mlp.up_proj.weight", [inter, h], "mat", 1.5),
            ]
        if kind == "linear_attention":
            q = p + "linear_attn."
            specs += [
                (q + "in_proj_qkv.weight", [cd, h], "mat", 2.0),
                (q + "in_proj_z.weight", [vh * dv, h], "mat", 1.0),
                (q + "in_proj_b.weight", [vh, h], "mat", 1.0),
                (q + "in_proj_a.weight", [vh, h], "mat", 1.0),
                (q + "conv1d.weight", [cd, 1, kc], "embed", 0.5),
                (q + "A_log", [vh], "a_log", 0),
                (q + "dt_bias", [vh], "dt_bias", 0),
                (q + "norm.weight", [dv], "norm", 0),
                (q + "out_proj.weight", [h, vh * dv], "mat", 1.0),
            ]
        else:
            q = p + "self_attn."
            specs += [
                (q + "q_proj.weight", [2 * nh * hd, h], "mat", 2.0),
                (q + "k_proj.weight", [nkv * hd, h], "mat", 2.0),
                (q + "v_proj.weight", [nkv * hd, h], "mat", 1.0),
                (q + "o_proj.weight", [h, nh * hd], "mat", 1.0),
                (q + "q_norm.weight", [hd], "centred", 0),
                (q + "k_norm.weight", [hd], "centred", 0),
            ]
    return sorted(specs, key=lambda s: s[0])


def header_bytes(specs) -> bytes:
    """safetensors header: u64 LE length, then JSON padded with spaces to a multiple of 8."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _, _ in specs:
        n = math.prod(shape) * 2  # bf16
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


def write_tensor(f, gen: torch.Generator, shape, kind: str, gain: float) -> None:
    if kind == "zero":
        f.seek(math.prod(shape) * 2, os.SEEK_CUR)  # a hole: reads back as zeros, takes no disk
        return
    rows = shape[0]
    cols = math.prod(shape[1:])
    step = max(1, CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if kind == "norm":
            x = torch.rand(n * cols, generator=gen) + 0.5  # U(0.5, 1.5)
        elif kind == "centred":
            x = torch.rand(n * cols, generator=gen) - 0.5  # U(-0.5, 0.5)
        elif kind == "a_log":
            x = (torch.rand(n * cols, generator=gen) * 0.45 + 0.05).log()
        elif kind == "dt_bias":
            x = -2.0 - torch.rand(n * cols, generator=gen)
        elif kind == "bias":
            x = torch.randn(n * cols, generator=gen) * gain
        elif kind == "embed":
            x = torch.randn(n * cols, generator=gen) * gain
        elif kind == "experts":
            # [E, rows, cols]: each expert's matrix scaled by its own fan-in (the last axis).
            x = torch.randn(n * cols, generator=gen) * (gain / math.sqrt(shape[-1]))
        else:
            x = torch.randn(n * cols, generator=gen) * (gain / math.sqrt(cols))
        f.write(x.to(torch.bfloat16).view(torch.int16).numpy().tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--layers", type=int, help="write only this many decoder layers (default: all of the shape's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zero-experts", action="store_true",
                    help="expert weights all zero, written as holes of a sparse file (MoE shapes)")
    ap.add_argument("--qwen3-tokenizer", type=Path, default=DEFAULT_QWEN3_TOKENIZER)
    ap.add_argument("--check", action="store_true", help="load the result with transformers and run a forward")
    args = ap.parse_args()

    shape = dict(SHAPES[args.shape])
    if args.layers is not None:
        if not 1 <= args.layers <= shape["num_hidden_layers"]:
            ap.error(f"--layers must be 1..{shape['num_hidden_layers']} for {args.shape}")
        shape["num_hidden_layers"] = args.layers
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    specs = tensor_specs(shape)
    if args.zero_experts:
        if "num_experts" not in shape:
            ap.error("--zero-experts needs an MoE shape")
        specs = [(n, s, "zero" if ".mlp.experts." in n else k, g) for n, s, k, g in specs]
    total = sum(math.prod(s[1]) for s in specs)
    print(f"{args.shape}, {shape['num_hidden_layers']} layers: {len(specs)} tensors, {total} parameters, "
          f"{total * 2} bytes of bf16", flush=True)
    every = max(50, len(specs) // 20)

    gen = torch.Generator().manual_seed(args.seed)
    final = out / "model.safetensors"
    tmp = out / "model.safetensors.partial"
    with open(tmp, "wb") as f:
        f.write(header_bytes(specs))
        for i, (name, tshape, kind, gain) in enumerate(specs):
            write_tensor(f, gen, tshape, kind, gain)
            if (i + 1) % every == 0 or i + 1 == len(specs):
                print(f"  tensor {i + 1}/{len(specs)}", flush=True)
        f.truncate(f.tell())  # a hole at the very end still needs the file to reach its length
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)

    for fname, obj in (("config.json", hub_config(shape)), ("generation_config.json", GENERATION_CONFIG)):
        (out / fname).write_text(json.dumps(obj, indent=2) + "\n")
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(args.qwen3_tokenizer / fname, out / fname)
    if "vision" in shape:
        (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_VL, indent=2) + "\n")
        tcfg = json.loads((out / "tokenizer_config.json").read_text())
        root = Path(__file__).resolve().parent.parent
        tcfg["chat_template"] = (root / "fixtures/chat/qwen3.5.chat_template.jinja").read_text()
        (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}", flush=True)

    if args.check:
        import transformers

        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(out), dtype=torch.bfloat16, output_loading_info=True
        )
        bad = {k: v for k, v in info.items() if v}
        assert not bad, f"loading problems: {bad}"
        ids = torch.tensor([[785, 6722, 315, 9625, 374]])
        moe = "num_experts" in shape
        with torch.no_grad():
            res = model(input_ids=ids, output_router_logits=True) if moe else model(input_ids=ids)
        logits = res.logits
        assert torch.isfinite(logits).all()
        print(f"check: loaded, logits {tuple(logits.shape)}, argmax {logits[0, -1].argmax().item()}")
        if moe and getattr(res, "router_logits", None):
            # Distinct experts picked per layer over the 5 tokens (at most 40 = 5 x 8).
            k = shape["num_experts_per_tok"]
            used = [r.reshape(-1, shape["num_experts"]).topk(k, dim=-1).indices.unique().numel()
                    for r in res.router_logits]
            print(f"check: distinct experts per layer over {ids.shape[1]} tokens (top-{k}): {used}")


if __name__ == "__main__":
    main()
