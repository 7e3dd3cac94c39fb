//! The experts of a mixture-of-experts config.json (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next).

use super::{get_bool, get_f64, get_u32};
use crate::hf::family::Family;
use anyhow::{bail, Result};
use qwen3_inference::format::architecture::{QWEN3_5_MOE, QWEN3_NEXT};
use qwen3_inference::format::MoeConfig;
use serde_json::{Map, Value};

/// The experts of a `Qwen3MoeForCausalLM` config, with `Qwen3MoeConfig`'s defaults
/// (configuration_qwen3_moe.py) for absent keys. Options of other mixture-of-experts families
/// (shared experts, grouped or biased routers) would change the math: refused by name.
pub(super) fn moe_config(obj: &Map<String, Value>, family: &Family) -> Result<MoeConfig> {
    let next = *family.architecture == QWEN3_NEXT;
    let hybrid = next || *family.architecture == QWEN3_5_MOE;
    // Qwen2-MoE's shared expert (Qwen3.5-MoE's is read below), DeepSeek's shared experts and
    // grouped top-k, sigmoid routers.
    // Qwen3NextConfig's default is 512; Qwen3.5-MoE's configs always say.
    let shared = match hybrid {
        true => {
            get_u32(obj, "shared_expert_intermediate_size")?.unwrap_or(if next { 512 } else { 0 })
        }
        false => 0,
    };
    for key in [
        "shared_expert_intermediate_size",
        "n_shared_experts",
        "num_shared_experts",
        "n_group",
        "topk_group",
    ] {
        if get_f64(obj, key)?.unwrap_or(0.0) != 0.0 && !(hybrid && key.starts_with("shared")) {
            bail!("{key} is set: this mixture-of-experts option is not implemented (Qwen3-MoE has none)");
        }
    }
    if let Some(f) = obj.get("scoring_func").and_then(|v| v.as_str()) {
        if f != "softmax" {
            bail!("scoring_func {f:?} is not implemented (Qwen3-MoE's router is a softmax)");
        }
    }
    if let Some(m) = obj.get("topk_method").and_then(|v| v.as_str()) {
        if m != "greedy" {
            bail!("topk_method {m:?} is not implemented (Qwen3-MoE takes the plain top-k)");
        }
    }
    if get_f64(obj, "routed_scaling_factor")?.is_some_and(|f| f != 1.0) {
        bail!("routed_scaling_factor is not implemented (Qwen3-MoE's router weights are used as they are)");
    }
    // The hub's configs say num_experts; transformers 5 writes num_local_experts.
    let num_experts = match (
        get_u32(obj, "num_experts")?,
        get_u32(obj, "num_local_experts")?,
    ) {
        (Some(a), Some(b)) if a != b => {
            bail!("num_experts {a} and num_local_experts {b} disagree")
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => family.expert_defaults[0],
    };
    let [_, per_token, width] = family.expert_defaults;
    let mlp_only_layers = match obj.get("mlp_only_layers") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Ok(n as u32),
                _ => bail!("mlp_only_layers must hold layer numbers, got {v}"),
            })
            .collect::<Result<_>>()?,
        Some(v) => bail!("mlp_only_layers must be a list, got {v}"),
    };
    if next {
        // Qwen3-Next (`Qwen3NextSparseMoeBlock`): Qwen3-MoE's options, Qwen3NextConfig's
        // defaults, the shared expert in every sparse layer.
        return Ok(MoeConfig {
            num_experts,
            num_experts_per_tok: get_u32(obj, "num_experts_per_tok")?.unwrap_or(per_token),
            moe_intermediate_size: get_u32(obj, "moe_intermediate_size")?.unwrap_or(width),
            norm_topk_prob: get_bool(obj, "norm_topk_prob")?.unwrap_or(true),
            decoder_sparse_step: get_u32(obj, "decoder_sparse_step")?.unwrap_or(1),
            mlp_only_layers,
            shared_expert_intermediate_size: shared,
        });
    }
    if hybrid {
        // Qwen3.5-MoE (`Qwen3_5MoeSparseMoeBlock`): every layer sparse, the chosen
        // probabilities always renormalised (`Qwen3_5MoeTopKRouter`), whatever the config says.
        return Ok(MoeConfig {
            num_experts,
            num_experts_per_tok: get_u32(obj, "num_experts_per_tok")?.unwrap_or(per_token),
            moe_intermediate_size: get_u32(obj, "moe_intermediate_size")?.unwrap_or(width),
            norm_topk_prob: family.renormalises,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: shared,
        });
    }
    Ok(MoeConfig {
        num_experts,
        num_experts_per_tok: get_u32(obj, "num_experts_per_tok")?.unwrap_or(per_token),
        moe_intermediate_size: get_u32(obj, "moe_intermediate_size")?.unwrap_or(width),
        norm_topk_prob: family.renormalises || get_bool(obj, "norm_topk_prob")?.unwrap_or(false),
        decoder_sparse_step: get_u32(obj, "decoder_sparse_step")?.unwrap_or(1),
        mlp_only_layers,
        shared_expert_intermediate_size: 0,
    })
}
