"""The Qwen3.5 and Qwen3-Next parts of scripts/make_fixtures.py: a `Qwen3_5ForConditionalGeneration`
checkpoint in the hub's layout (config.json with `text_config` and `vision_config`; the text
model under `model.language_model.`, a tiny vision tower under `model.visual.`, and `mtp.*`
tensors as the hub's checkpoints carry them), and how transformers loads it.

The vision tower's weights are transformers' own initialisation of a tiny tower; the text
model's are drawn here as make_fixtures.py draws Qwen3's, with the Gated DeltaNet's own: its
decays in a range where the memory spans tens of tokens (so a prompt longer than a 64-token
chunk depends on the chunked form's carry between chunks), write strengths around 0.5.

A `Qwen3NextForCausalLM` (arch `qwen3_next`) is the same text model in Qwen3-Next's layout: its
config flat, each Gated DeltaNet's projections fused per key head (`in_proj_qkvz`,
`in_proj_ba`: `next_layout`), its experts under per-expert names as the hub's checkpoints store
them, and the MTP layer's tensors (no vision tower).
"""

import math

import torch
import transformers

# The spec `arch`s this module makes checkpoints of.
ARCHS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")

# The MTP layer's tensors as Qwen3.5's hub checkpoints name them (one decoder layer and its
# fusing projection; transformers does not load them: Qwen3_5ForConditionalGeneration ignores
# `mtp.` on load). Shapes in units of the hidden size `h` (fc: [h, 2h]).
MTP_TENSORS = ["mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
               "mtp.pre_fc_norm_hidden.weight"]


def layer_types(spec: dict) -> list:
    return spec["layer_types"]


def next_config(spec: dict, bos: int, eos) -> dict:
    """config.json of a Qwen3-Next checkpoint on the hub (Qwen3-Next-80B-A3B's keys), flat."""
    la, moe = spec["linear"], spec["moe"]
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": moe["decoder_sparse_step"],
        "eos_token_id": eos,
        "full_attention_interval": 4,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "linear_conv_kernel_dim": la["conv_kernel"],
        "linear_key_head_dim": la["key_head_dim"],
        "linear_num_key_heads": la["key_heads"],
        "linear_num_value_heads": la["value_heads"],
        "linear_value_head_dim": la["value_head_dim"],
        "max_position_embeddings": spec["max_pos"],
        "mlp_only_layers": moe["mlp_only_layers"],
        "model_type": "qwen3_next",
        "moe_intermediate_size": moe["moe_intermediate"],
        "norm_topk_prob": moe["norm_topk_prob"],
        "num_attention_heads": spec["heads"],
        "num_experts": moe["num_experts"],
        "num_experts_per_tok": moe["top_k"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "output_router_logits": False,
        "partial_rotary_factor": spec["partial_rotary_factor"],
        "rms_norm_eps": spec["eps"],
        "rope_scaling": None,
        "rope_theta": spec["rope_theta"],
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": moe["shared_intermediate"],
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }


def next_layout(spec: dict, text: dict) -> dict:
    """Qwen3-Next's names for the text model's weights: per key head, its query, key, value and
    z rows fused into `in_proj_qkvz`, its b and a rows into `in_proj_ba`
    (`Qwen3NextGatedDeltaNet.fix_query_key_value_ordering` splits them back); the experts under
    per-expert names (`mlp.experts.E.gate_proj.weight`, ...), as the hub stores them."""
    la = spec["linear"]
    kh, dk, dv = la["key_heads"], la["key_head_dim"], la["value_head_dim"]
    g = la["value_heads"] // kh
    kd = kh * dk
    out = {}
    for name, t in text.items():
        if name.endswith("linear_attn.in_proj_qkv.weight"):
            p = name[: -len("in_proj_qkv.weight")]
            z = text[p + "in_proj_z.weight"]
            q, k, v = t[:kd], t[kd:2 * kd], t[2 * kd:]
            out[p + "in_proj_qkvz.weight"] = torch.cat([
                torch.cat([q[h * dk:(h + 1) * dk], k[h * dk:(h + 1) * dk],
                           v[h * g * dv:(h + 1) * g * dv], z[h * g * dv:(h + 1) * g * dv]])
                for h in range(kh)])
        elif name.endswith("linear_attn.in_proj_b.weight"):
            p = name[: -len("in_proj_b.weight")]
            a = text[p + "in_proj_a.weight"]
            out[p + "in_proj_ba.weight"] = torch.cat([
                torch.cat([t[h * g:(h + 1) * g], a[h * g:(h + 1) * g]]) for h in range(kh)])
        elif name.endswith(("linear_attn.in_proj_z.weight", "linear_attn.in_proj_a.weight")):
            continue
        elif name.endswith("mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            mi = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = t[e, :mi]
                out[f"{p}{e}.up_proj.weight"] = t[e, mi:]
        elif name.endswith("mlp.experts.down_proj"):
            p = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json of a Qwen3.5 checkpoint on the hub: its keys, text and vision nested; with
    `moe` in the spec, a Qwen3.5-MoE's (the experts' keys, no `intermediate_size`)."""
    la = spec["linear"]
    moe = spec.get("moe")
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": bos,
        "dtype": spec["dtype"],
        "eos_token_id": eos,
        "full_attention_interval": 4,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "layer_types": layer_types(spec),
        "linear_conv_kernel_dim": la["conv_kernel"],
        "linear_key_head_dim": la["key_head_dim"],
        "linear_num_key_heads": la["key_heads"],
        "linear_num_value_heads": la["value_heads"],
        "linear_value_head_dim": la["value_head_dim"],
        "max_position_embeddings": spec["max_pos"],
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": spec["eps"],
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": spec["mrope_section"],
            "partial_rotary_factor": spec["partial_rotary_factor"],
            "rope_theta": spec["rope_theta"],
            "rope_type": "default",
        },
        "tie_word_embeddings": spec["tied"],
        "use_cache": True,
        "vocab_size": spec["vocab"],
    }
    if moe:
        del text["intermediate_size"]
        text.update({
            "model_type": "qwen3_5_moe_text",
            "moe_intermediate_size": moe["moe_intermediate"],
            "num_experts": moe["num_experts"],
            "num_experts_per_tok": moe["top_k"],
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": moe["shared_intermediate"],
        })
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "image_token_id": spec["vocab"] - 3,
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": spec["tied"],
        "transformers_version": transformers.__version__,
        "video_token_id": spec["vocab"] - 2,
        "vision_config": {
            "depth": 1,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision",
            "num_heads": 2,
            "num_position_embeddings": 16,
            "out_hidden_size": spec["hidden"],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": spec["vocab"] - 4,
        "vision_start_token_id": spec["vocab"] - 5,
    }


def text_weights(spec: dict, seed: int) -> dict:
    """Random f32 weights of the text model under `Qwen3_5ForCausalLM`'s names (`model.`).

    As make_fixtures.make_weights: matrices N(0, (gain / sqrt(fan_in))^2), embeddings
    N(0, 0.35^2). `Qwen3_5RMSNorm` multiplies by 1 + w: w is drawn in U(-0.5, 0.5), so a port
    that multiplies by w alone fails. The Gated DeltaNet: `A_log` = log U(0.05, 0.5) and
    `dt_bias` U(-3, -2), so each token keeps exp(-A softplus(a + dt_bias)) of the memory, 0.97
    to 0.998 for a = 0 (a memory of a few tokens makes a head's normalised output the sign of
    q . k, which any rounding flips); the convolution's filters N(0, 0.5^2); its norm's gain
    U(0.5, 1.5).
    """
    g = torch.Generator().manual_seed(seed)
    h, hd, nh, nkv, inter, V = (spec[k] for k in ("hidden", "head_dim", "heads", "kv_heads", "intermediate", "vocab"))
    la = spec["linear"]
    kd = la["key_heads"] * la["key_head_dim"]
    vd = la["value_heads"] * la["value_head_dim"]
    vh, cd = la["value_heads"], 2 * kd + vd

    def mat(out_f, in_f, gain=2.0):
        return torch.randn(out_f, in_f, generator=g) * (gain / math.sqrt(in_f))

    def zero_centred(n):
        return torch.rand(n, generator=g) - 0.5

    w = {"model.embed_tokens.weight": torch.randn(V, h, generator=g) * 0.35}
    for l, kind in enumerate(layer_types(spec)):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = zero_centred(h)
        if kind == "linear_attention":
            q = p + "linear_attn."
            w[q + "in_proj_qkv.weight"] = mat(cd, h, gain=2.0)
            w[q + "in_proj_z.weight"] = mat(vd, h, gain=1.5)
            w[q + "in_proj_b.weight"] = mat(vh, h, gain=1.0)
            w[q + "in_proj_a.weight"] = mat(vh, h, gain=1.0)
            w[q + "conv1d.weight"] = torch.randn(cd, 1, la["conv_kernel"], generator=g) * 0.5
            w[q + "dt_bias"] = torch.rand(vh, generator=g) - 3
            w[q + "A_log"] = torch.log(torch.rand(vh, generator=g) * 0.45 + 0.05)
            w[q + "norm.weight"] = torch.rand(la["value_head_dim"], generator=g) + 0.5
            w[q + "out_proj.weight"] = mat(h, vd, gain=1.0)
        else:
            # q_proj: per head, head_dim query rows then head_dim gate rows.
            w[p + "self_attn.q_proj.weight"] = mat(nh * hd * 2, h, gain=2.0)
            w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h, gain=2.0)
            w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h, gain=1.0)
            w[p + "self_attn.o_proj.weight"] = mat(h, nh * hd, gain=1.0)
            w[p + "self_attn.q_norm.weight"] = zero_centred(hd)
            w[p + "self_attn.k_norm.weight"] = zero_centred(hd)
        w[p + "post_attention_layernorm.weight"] = zero_centred(h)
        moe = spec.get("moe")
        if moe and l not in moe["mlp_only_layers"]:
            # Qwen3_5MoeSparseMoeBlock: the router, the experts fused as transformers 5 holds
            # them (gate_up_proj [E, 2I, H]: each expert's gate rows, then its up rows), the
            # shared expert and its gate.
            e, mi, si = moe["num_experts"], moe["moe_intermediate"], moe["shared_intermediate"]
            w[p + "mlp.gate.weight"] = mat(e, h, gain=moe["router_gain"])
            w[p + "mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([mat(mi, h, gain=1.5), mat(mi, h, gain=1.5)]) for _ in range(e)])
            w[p + "mlp.experts.down_proj"] = torch.stack([mat(h, mi, gain=1.0) for _ in range(e)])
            w[p + "mlp.shared_expert.gate_proj.weight"] = mat(si, h, gain=1.5)
            w[p + "mlp.shared_expert.up_proj.weight"] = mat(si, h, gain=1.5)
            w[p + "mlp.shared_expert.down_proj.weight"] = mat(h, si, gain=1.0)
            w[p + "mlp.shared_expert_gate.weight"] = mat(1, h, gain=1.0)
        else:
            w[p + "mlp.gate_proj.weight"] = mat(inter, h, gain=1.5)
            w[p + "mlp.up_proj.weight"] = mat(inter, h, gain=1.5)
            w[p + "mlp.down_proj.weight"] = mat(h, inter, gain=1.0)
    w["model.norm.weight"] = zero_centred(h)
    if not spec["tied"]:
        w["lm_head.weight"] = mat(V, h, gain=2.5)
    return w


def checkpoint_weights(spec: dict, config: dict, seed: int) -> dict:
    """Every tensor of the checkpoint, under the hub's names: the text model's
    ([`text_weights`]) under `model.language_model.`, a tiny vision tower as transformers
    initialises it (seeded), and the MTP layer's few tensors."""
    text = text_weights(spec, seed)
    g = torch.Generator().manual_seed(seed + 1)
    h = spec["hidden"]
    mtp = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g) * 0.1}
    mtp.update({name: torch.zeros(h) for name in MTP_TENSORS[1:]})
    if spec["arch"] == "qwen3_next":
        return {**next_layout(spec, text), **mtp}
    out = {}
    for name, t in text.items():
        out[name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name] = t
    torch.manual_seed(seed)
    kwargs = {k: v for k, v in config.items() if k != "architectures"}
    if spec.get("moe"):
        cfg = transformers.Qwen3_5MoeConfig(**kwargs)
        tower = transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeVisionModel
    else:
        cfg = transformers.Qwen3_5Config(**kwargs)
        tower = transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5VisionModel
    vision = tower(cfg.vision_config)
    for name, t in vision.state_dict().items():
        out["model.visual." + name] = t.detach().clone().float()
    return {**out, **mtp}


def load_reference_model(ckpt, dtype, spec):
    """The checkpoint as transformers runs it: `Qwen3_5ForConditionalGeneration` (or its MoE,
    whose experts run transformers' own loop: `experts_implementation="eager"`, as
    make_fixtures.reference_load_kwargs says), eager attention, text in (no image), the `mtp.`
    tensors left unloaded as transformers leaves them."""
    kw = {"attn_implementation": "eager", "output_loading_info": True}
    if spec["arch"] == "qwen3_next":
        cls = transformers.Qwen3NextForCausalLM
        kw["experts_implementation"] = "eager"
    elif spec.get("moe"):
        cls = transformers.Qwen3_5MoeForConditionalGeneration
        kw["experts_implementation"] = "eager"
    else:
        cls = transformers.Qwen3_5ForConditionalGeneration
    model, info = cls.from_pretrained(str(ckpt), dtype=dtype, **kw)
    if spec.get("moe"):
        text_config = getattr(model.config, "text_config", model.config)
        assert text_config._experts_implementation == "eager"
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")]
    bad = {k: v for k, v in info.items() if v and k != "unexpected_keys"}
    assert not bad and not unexpected, f"{ckpt}: loading problems {bad} {unexpected}"
    return model.eval()
