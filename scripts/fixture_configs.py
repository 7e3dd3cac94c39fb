"""The config.json and generation_config.json of the tiny checkpoints scripts/make_fixtures.py
builds, in each dialect a real checkpoint writes them: the hub's (the exact keys and key order of
Qwen3-0.6B, Qwen3-30B-A3B and Qwen2.5-0.5B-Instruct) and transformers 5's (what
`save_pretrained` writes).
"""

import json
from pathlib import Path

import torch
import transformers

from fixture_specs import QWEN3_GENERATION

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen3-0.6B's hub config.json."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "model_type": "qwen3",
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": spec["eps"],
        # null in Qwen3-0.6B; a YaRN dict where Qwen3's model cards say to add one.
        "rope_scaling": spec.get("rope_scaling"),
        "rope_theta": spec["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }


def qwen3moe_hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen3-30B-A3B's hub config.json:
    Qwen3-0.6B's plus the MoE keys, `num_experts` (not transformers 5's num_local_experts),
    output_router_logits and router_aux_loss_coef (training-only, but present)."""
    moe = spec["moe"]
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": moe["decoder_sparse_step"],
        "eos_token_id": eos,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "mlp_only_layers": moe["mlp_only_layers"],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": moe["moe_intermediate"],
        "norm_topk_prob": moe["norm_topk_prob"],
        "num_attention_heads": spec["heads"],
        "num_experts": moe["num_experts"],
        "num_experts_per_tok": moe["top_k"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "output_router_logits": False,
        "rms_norm_eps": spec["eps"],
        "rope_scaling": spec.get("rope_scaling"),
        "rope_theta": spec["rope_theta"],
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }


def qwen2_hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen2.5-0.5B-Instruct's hub
    config.json (no head_dim: Qwen2 takes hidden / heads). Qwen2.5's config.json has no
    rope_scaling key at all (not even null); a spec with one gets the dict its model cards say to
    add for long context, placed in sorted position (before rope_theta) like every other key of
    that file, which save_pretrained writes sorted. JSON readers ignore key order."""
    assert spec["head_dim"] == spec["hidden"] // spec["heads"] and not spec["write_head_dim"]
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "model_type": "qwen2",
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": spec["eps"],
        "rope_theta": spec["rope_theta"],
        "sliding_window": spec["max_pos"],
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }
    assert list(cfg) == sorted(cfg)
    if spec.get("rope_scaling") is not None:
        cfg["rope_scaling"] = dict(spec["rope_scaling"])
        cfg = dict(sorted(cfg.items()))
    return cfg


def transformers5_config(spec: dict, bos: int, eos) -> dict:
    """config.json as transformers 5 writes it (Qwen3Config, Qwen2Config or
    Qwen3MoeConfig.save_pretrained), minus head_dim when the spec says so (Qwen2 states none:
    hidden / heads)."""
    if spec.get("arch") == "qwen3_moe":
        return qwen3moe_transformers5_config(spec, bos, eos)
    qwen2 = spec.get("arch") == "qwen2"
    kwargs = dict(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=spec["max_pos"],
        rms_norm_eps=spec["eps"],
        tie_word_embeddings=spec["tied"],
        rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
        bos_token_id=bos,
        eos_token_id=eos,
        max_window_layers=spec["layers"],
    )
    if qwen2:
        assert spec["head_dim"] == spec["hidden"] // spec["heads"] and not spec["write_head_dim"]
        cfg = transformers.Qwen2Config(**kwargs)
        cfg.architectures = ["Qwen2ForCausalLM"]
    else:
        cfg = transformers.Qwen3Config(head_dim=spec["head_dim"], **kwargs)
        cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = TORCH_DTYPES[spec["dtype"]]
    d = json.loads(cfg.to_json_string(use_diff=True))  # what save_pretrained writes
    if not spec["write_head_dim"]:
        d.pop("head_dim", None)
    assert "rope_theta" not in d and "torch_dtype" not in d and d["dtype"] == spec["dtype"]
    return d


def qwen3moe_transformers5_config(spec: dict, bos: int, eos) -> dict:
    """config.json as Qwen3MoeConfig.save_pretrained writes it in transformers 5.23.0. Its
    attribute_map sends num_experts to num_local_experts, so that is the key it writes (it reads
    either). It has no max_window_layers or layer_types. head_dim is kept: without it
    Qwen3MoeAttention falls back to hidden / heads (no class default of 128, unlike Qwen3Config)."""
    moe = spec["moe"]
    assert spec["write_head_dim"]
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_pos"],
        rms_norm_eps=spec["eps"],
        tie_word_embeddings=spec["tied"],
        # A copy: the config standardises the dict it is given in place.
        rope_parameters=dict(spec.get("rope_parameters") or {"rope_type": "default", "rope_theta": spec["rope_theta"]}),
        num_experts=moe["num_experts"],
        num_experts_per_tok=moe["top_k"],
        moe_intermediate_size=moe["moe_intermediate"],
        norm_topk_prob=moe["norm_topk_prob"],
        decoder_sparse_step=moe["decoder_sparse_step"],
        mlp_only_layers=list(moe["mlp_only_layers"]),
        bos_token_id=bos,
        eos_token_id=eos,
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.dtype = TORCH_DTYPES[spec["dtype"]]
    d = json.loads(cfg.to_json_string(use_diff=True))  # what save_pretrained writes
    assert "rope_theta" not in d and "torch_dtype" not in d and d["dtype"] == spec["dtype"]
    assert d["num_local_experts"] == moe["num_experts"] and "num_experts" not in d
    assert d["rope_parameters"]["rope_theta"] == spec["rope_theta"]
    return d


def generation_config(bos: int, eos_list: list) -> dict:
    """Shaped like Qwen3-0.6B's generation_config.json."""
    return {
        "bos_token_id": bos,
        "do_sample": QWEN3_GENERATION["do_sample"],
        "eos_token_id": eos_list,
        "pad_token_id": bos,
        "temperature": QWEN3_GENERATION["temperature"],
        "top_k": QWEN3_GENERATION["top_k"],
        "top_p": QWEN3_GENERATION["top_p"],
        "transformers_version": "4.51.0",
    }


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
