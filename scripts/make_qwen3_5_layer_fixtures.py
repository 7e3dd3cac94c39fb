#!/usr/bin/env python3
"""Write fixtures/qwen3_5_layers/: Qwen3.5's two token mixers, each with small random weights,
an input, and what transformers computes from it, for the plain Rust layers' tests.

- gated_delta_net.json: `Qwen3_5GatedDeltaNet` (qwen3-inference/src/model/gated_delta_net.rs);
- attention.json: `Qwen3_5Attention`, the gated attention of every fourth layer, with its
  rotary embedding on the first quarter of each head (`partial_rotary_factor` 0.25) and the
  zero-centred q/k norms (qwen3-inference/src/model/gated_attention.rs).

Run once by a developer (never by CI; CI has no PyTorch):

    ../venv-torch/bin/python scripts/make_qwen3_5_layer_fixtures.py

Each layer runs as transformers runs it in generation, with a `DynamicCache`: a prompt of
PROMPT tokens in one call (for the DeltaNet: the chunked delta rule,
`torch_chunk_gated_delta_rule`, two chunks of 64 and 6, and the causal convolution over the whole
prompt), then DECODE tokens one call each (the recurrent rule, `torch_recurrent_gated_delta_rule`,
and the convolution's one-step update; for attention: one query against the cache). The files
hold the outputs of both, and for the DeltaNet the cache's convolution and recurrent states
after the prompt and at the end. Everything is float32; eager attention.
"""

import json
from pathlib import Path

import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5Attention,
    Qwen3_5GatedDeltaNet,
    Qwen3_5TextRotaryEmbedding,
)

PROMPT, DECODE = 70, 3
SEED = 5
OUT = Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_5_layers"


def config(layer_type):
    """A small config whose sizes tell its dimensions apart: 2 key heads of 16 and 4 value heads
    of 8 for the DeltaNet (each key head serves two value heads), 2 query heads and 1 KV head of
    32 for attention (a rotary part of 8)."""
    return Qwen3_5TextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        layer_types=[layer_type],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=64,
        vocab_size=32,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        attn_implementation="eager",
    )


def flat(t):
    return [round(float(v), 9) for v in t.detach().reshape(-1)]


def weights(layer):
    return {name: {"shape": list(p.shape), "values": flat(p)} for name, p in layer.named_parameters()}


def write(name, ref):
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    ref = {
        "_comment": "written by scripts/make_qwen3_5_layer_fixtures.py; row-major float32 values",
        "transformers_version": transformers.__version__,
        **ref,
    }
    path.write_text(json.dumps(ref, indent=None) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def gated_delta_net():
    c = config("linear_attention")
    layer = Qwen3_5GatedDeltaNet(c, layer_idx=0).float().eval()
    # Random weights of a trained model's sizes: projections N(0, 0.2^2); A in (0.5, 8) and
    # dt_bias around 0 as Qwen3.5's are, so that the decays exp(g) spread over (0, 1); the norm's
    # gain around 1.
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 8.0)))
            elif name == "dt_bias":
                p.copy_(torch.randn_like(p) * 0.5)
            elif name == "norm.weight":
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name == "conv1d.weight":
                p.copy_(torch.randn_like(p) * 0.4)
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    x = torch.randn(1, PROMPT + DECODE, c.hidden_size)

    cache = DynamicCache(config=c)
    with torch.no_grad():
        prompt_out = layer(x[:, :PROMPT], cache=cache)
        after_prompt = (cache.get_conv_state(0).clone(), cache.get_recurrent_state(0).clone())
        decode_out = [layer(x[:, PROMPT + i : PROMPT + i + 1], cache=cache) for i in range(DECODE)]
        # The whole sequence in one call without a cache: the chunked rule alone.
        whole = layer(x, cache=None)
    out = torch.cat([prompt_out] + decode_out, dim=1)
    # The two ways agree up to f32 rounding (the chunked and recurrent rules add in other orders).
    assert torch.allclose(out, whole, atol=1e-5, rtol=1e-4), (out - whole).abs().max()

    write(
        "gated_delta_net.json",
        {
            "config": {
                "hidden_size": c.hidden_size,
                "linear_num_key_heads": c.linear_num_key_heads,
                "linear_num_value_heads": c.linear_num_value_heads,
                "linear_key_head_dim": c.linear_key_head_dim,
                "linear_value_head_dim": c.linear_value_head_dim,
                "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
                "rms_norm_eps": c.rms_norm_eps,
            },
            "weights": weights(layer),
            "prompt_tokens": PROMPT,
            "decode_tokens": DECODE,
            "input": flat(x[0]),
            "output": flat(out[0]),
            # transformers keeps the last `k` convolution inputs ([conv_dim, k]); the newest last.
            "conv_state_after_prompt": flat(after_prompt[0][0]),
            "recurrent_state_after_prompt": flat(after_prompt[1][0]),
            "conv_state": flat(cache.get_conv_state(0)[0]),
            "recurrent_state": flat(cache.get_recurrent_state(0)[0]),
        },
    )


def attention():
    c = config("full_attention")
    layer = Qwen3_5Attention(c, layer_idx=0).float().eval()
    rotary = Qwen3_5TextRotaryEmbedding(c)
    # Projections N(0, 0.2^2); the zero-centred norms' weights around 0 (their gain is 1 + w).
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 0.3 if "norm" in name else 0.2
            p.copy_(torch.randn_like(p) * scale)
    # Inputs of a normalised residual stream's size (1), and so attention scores of a few units.
    x = torch.randn(1, PROMPT + DECODE, c.hidden_size)

    def run(x_part, start, cache):
        n = x_part.shape[1]
        positions = torch.arange(start, start + n)[None]
        cos_sin = rotary(x_part, positions)
        # The causal mask of the new rows against every cached position (none above the diagonal).
        total = start + n
        mask = torch.full((n, total), float("-inf")).triu(start + 1)[None, None]
        out, _ = layer(x_part, position_embeddings=cos_sin, attention_mask=mask, cache=cache)
        return out

    cache = DynamicCache(config=c)
    with torch.no_grad():
        outs = [run(x[:, :PROMPT], 0, cache)]
        outs += [run(x[:, PROMPT + i : PROMPT + i + 1], PROMPT + i, cache) for i in range(DECODE)]
        whole = run(x, 0, None)
    out = torch.cat(outs, dim=1)
    assert torch.allclose(out, whole, atol=1e-5, rtol=1e-4), (out - whole).abs().max()
    # With text only, M-RoPE's three position components are equal, and its cos/sin are plain
    # RoPE's over the rotary dims (the rest of each head passes through): shown here against
    # the textbook formula, which the Rust layer implements.
    positions = torch.arange(PROMPT + DECODE)[None]
    cos, sin = rotary(x, positions)
    rot = int(c.head_dim * c.rope_parameters["partial_rotary_factor"])
    inv_freq = 1.0 / (c.rope_parameters["rope_theta"] ** (torch.arange(0, rot, 2).float() / rot))
    freqs = positions[0, :, None].float() * inv_freq
    assert torch.allclose(cos[0], torch.cat([freqs.cos(), freqs.cos()], -1))
    assert torch.allclose(sin[0], torch.cat([freqs.sin(), freqs.sin()], -1))

    write(
        "attention.json",
        {
            "config": {
                "hidden_size": c.hidden_size,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads,
                "head_dim": c.head_dim,
                "rms_norm_eps": c.rms_norm_eps,
                "rope_theta": c.rope_parameters["rope_theta"],
                "partial_rotary_factor": c.rope_parameters["partial_rotary_factor"],
            },
            "weights": weights(layer),
            "prompt_tokens": PROMPT,
            "decode_tokens": DECODE,
            "input": flat(x[0]),
            "output": flat(out[0]),
        },
    )


def main():
    torch.manual_seed(SEED)
    gated_delta_net()
    torch.manual_seed(SEED + 1)
    attention()


if __name__ == "__main__":
    main()
