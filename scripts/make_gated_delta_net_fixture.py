#!/usr/bin/env python3
"""Write fixtures/gated_delta_net/reference.json: one Qwen3.5 Gated DeltaNet layer
(transformers' `Qwen3_5GatedDeltaNet`) with small random weights, its input, and what
transformers computes from it, for the plain Rust layer's test (`model/gated_delta_net.rs`).

Run once by a developer (never by CI; CI has no PyTorch):

    ../venv-torch/bin/python scripts/make_gated_delta_net_fixture.py

The layer runs as transformers runs it in generation, with a `DynamicCache`: a prompt of
PROMPT tokens in one call (the chunked delta rule, `torch_chunk_gated_delta_rule`, and the
causal convolution over the whole prompt), then DECODE tokens one call each (the recurrent rule,
`torch_recurrent_gated_delta_rule`, and the convolution's one-step update). The file holds the
outputs of both, and the cache's convolution and recurrent states after the prompt and at the
end. Everything is float32.

The value heads are twice the key heads (as in every Qwen3.5 checkpoint: each query/key head
serves consecutive value heads), and the key and value head sizes differ, so that a mix-up of
the two shows.
"""

import json
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

PROMPT, DECODE = 70, 3
SEED = 5
OUT = Path(__file__).resolve().parent.parent / "fixtures" / "gated_delta_net" / "reference.json"


def main():
    torch.manual_seed(SEED)
    config = Qwen3_5TextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=32,
    )
    layer = Qwen3_5GatedDeltaNet(config, layer_idx=0).float().eval()
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
    x = torch.randn(1, PROMPT + DECODE, config.hidden_size)

    cache = DynamicCache(config=config)
    with torch.no_grad():
        prompt_out = layer(x[:, :PROMPT], cache=cache)
        after_prompt = (
            cache.get_conv_state(0).clone(),
            cache.get_recurrent_state(0).clone(),
        )
        decode_out = [layer(x[:, PROMPT + i : PROMPT + i + 1], cache=cache) for i in range(DECODE)]
        # The whole sequence in one call without a cache: the chunked rule alone.
        whole = layer(x, cache=None)
    out = torch.cat([prompt_out] + decode_out, dim=1)
    # The two ways agree up to f32 rounding (the chunked and recurrent rules add in other orders).
    assert torch.allclose(out, whole, atol=1e-5, rtol=1e-4), (out - whole).abs().max()

    def flat(t):
        return [round(float(v), 9) for v in t.detach().reshape(-1)]

    k = config.linear_conv_kernel_dim
    ref = {
        "_comment": "written by scripts/make_gated_delta_net_fixture.py from transformers "
        "Qwen3_5GatedDeltaNet; row-major float32 values",
        "transformers_version": __import__("transformers").__version__,
        "config": {
            "hidden_size": config.hidden_size,
            "linear_num_key_heads": config.linear_num_key_heads,
            "linear_num_value_heads": config.linear_num_value_heads,
            "linear_key_head_dim": config.linear_key_head_dim,
            "linear_value_head_dim": config.linear_value_head_dim,
            "linear_conv_kernel_dim": k,
            "rms_norm_eps": config.rms_norm_eps,
        },
        "weights": {name: {"shape": list(p.shape), "values": flat(p)} for name, p in layer.named_parameters()},
        "prompt_tokens": PROMPT,
        "decode_tokens": DECODE,
        "input": flat(x[0]),
        "output": flat(out[0]),
        # transformers keeps the last `k` convolution inputs ([conv_dim, k]); the newest is last.
        "conv_state_after_prompt": flat(after_prompt[0][0]),
        "recurrent_state_after_prompt": flat(after_prompt[1][0]),
        "conv_state": flat(cache.get_conv_state(0)[0]),
        "recurrent_state": flat(cache.get_recurrent_state(0)[0]),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(ref, indent=None) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
