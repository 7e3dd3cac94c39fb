//! config.json and generation_config.json -> [`ModelConfig`].
//!
//! Two dialects exist. Checkpoints on the hub (written by transformers 4.x) carry a top-level
//! `rope_theta` and `torch_dtype`; transformers 5 writes `rope_parameters: {rope_type, rope_theta}`,
//! `dtype` and `layer_types`. Both are accepted. Defaults for absent keys are those of
//! `Qwen3Config` and `Qwen2Config` in transformers' `configuration_qwen3.py` and
//! `configuration_qwen2.py`. Any key that would change the math in a way we do not implement is
//! refused, never ignored.
//!
//! The families (family.rs) differ where config.json is silent and in a few flags: Qwen2's q/k/v
//! projections always have biases and it has no q/k norms; Qwen3 has q/k norms and biases only if
//! `attention_bias` says so (`modeling_qwen2.py`, `modeling_qwen3.py`). Qwen2's head_dim
//! defaults to hidden / heads, Qwen3's to 128.

mod experts;

use super::family::{self, HeadDim};
use super::qwen3_5;
use anyhow::{bail, Context, Result};
use experts::moe_config;
use qwen3_inference::format::{DType, GenerationDefaults, ModelConfig, RopeScaling};
use serde_json::{Map, Value};
use std::path::Path;

/// Reads and parses a JSON file, with errors naming the file.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: malformed JSON", path.display()))
}

/// The parts of config.json + generation_config.json we keep. The storage dtype and group size are
/// filled in by the exporter.
pub fn load_config(hf_dir: &Path) -> Result<ModelConfig> {
    let path = hf_dir.join("config.json");
    let json = read_json(&path)?;
    let mut config = parse_config(&json).with_context(|| format!("{}", path.display()))?;
    config.embedding = super::sentence_transformers::embedding_config(hf_dir)?;
    config.vision = super::vision::vision_input(hf_dir, &json, &config)
        .with_context(|| format!("{}", path.display()))?;
    let gen_path = hf_dir.join("generation_config.json");
    if gen_path.exists() {
        let g = read_json(&gen_path)?;
        apply_generation_config(&mut config, &g)
            .with_context(|| format!("{}", gen_path.display()))?;
    }
    config
        .validate()
        .with_context(|| format!("{}", path.display()))?;
    Ok(config)
}

pub(crate) fn get_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= u32::MAX as u64 => Ok(Some(n as u32)),
            _ => bail!("{key} must be a non-negative integer, got {v}"),
        },
    }
}

fn require_u32(obj: &Map<String, Value>, key: &str) -> Result<u32> {
    get_u32(obj, key)?.with_context(|| format!("{key} is missing"))
}

fn get_f64(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .with_context(|| format!("{key} must be a number, got {v}")),
    }
}

fn get_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .with_context(|| format!("{key} must be true or false, got {v}")),
    }
}

/// A token id field that may be an integer or a list of integers (config.json and
/// generation_config.json allow both for `eos_token_id`).
fn get_ids(obj: &Map<String, Value>, key: &str) -> Result<Vec<u32>> {
    let one = |v: &Value| -> Result<u32> {
        match v.as_u64() {
            Some(n) if n <= u32::MAX as u64 => Ok(n as u32),
            _ => bail!("{key} must hold non-negative integers, got {v}"),
        }
    };
    match obj.get(key) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// Parses a config.json object (either dialect).
pub fn parse_config(json: &Value) -> Result<ModelConfig> {
    let Some(top) = json.as_object() else {
        bail!("not a JSON object");
    };
    let mut obj = top;

    // 1. Architecture: which family (family.rs), and where its text model's keys are. One
    //    forward pass for all; the family's differences are data in the config.
    let archs: Vec<&str> = match obj.get("architectures") {
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
        _ => vec![],
    };
    let family = match archs.first() {
        Some(&a) => family::by_checkpoint(a).with_context(|| {
            format!(
                "architecture {a} is not supported (supported: {})",
                family::supported().join(", ")
            )
        })?,
        None => obj
            .get("model_type")
            .and_then(|v| v.as_str())
            .and_then(family::by_model_type)
            .context(
                "no `architectures` and no `model_type` qwen3 or qwen2; not a Qwen checkpoint",
            )?,
    };
    if family.text_config {
        obj = qwen3_5::text_config(top)?;
    }
    let architecture = family.architecture.name.to_string();
    // Qwen2's attention (`Qwen2Attention`): q/k/v biases always, no q/k norms.
    let (hybrid, qwen2) = (
        family.architecture.linear_attention,
        !family.architecture.qk_norm,
    );
    let hybrid_moe = hybrid && family.architecture.experts;

    // 2. Sizes. When config.json has no head_dim, transformers' Qwen3Config uses its own default,
    //    128 (`head_dim=128` in configuration_qwen3.py; checked with transformers 5.23.0 while
    //    building fixtures/models/tiny-bf16-untied-mha), NOT hidden_size / num_attention_heads.
    //    Real Qwen3 checkpoints state it, and it usually differs from that ratio (0.6B: 1024/16 =
    //    64, head_dim 128). Qwen2Attention takes `getattr(config, "head_dim", hidden / heads)`:
    //    the ratio, which is what every Qwen2 checkpoint means (none states head_dim).
    let hidden_size = require_u32(obj, "hidden_size")?;
    let num_attention_heads = require_u32(obj, "num_attention_heads")?;
    if num_attention_heads == 0 {
        bail!("num_attention_heads is 0");
    }
    let head_dim = match (get_u32(obj, "head_dim")?, family.head_dim) {
        (Some(h), _) => h,
        // Qwen3MoeConfig has no head_dim default of its own: Qwen3MoeAttention takes
        // `getattr(config, "head_dim", hidden // heads)`, as Qwen2 does (modeling_qwen3_moe.py).
        (None, HeadDim::Ratio) => {
            if !hidden_size.is_multiple_of(num_attention_heads) {
                bail!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}, and there is no head_dim");
            }
            hidden_size / num_attention_heads
        }
        (None, HeadDim::Default(h)) => h,
    };
    let num_key_value_heads = get_u32(obj, "num_key_value_heads")?.unwrap_or(num_attention_heads);

    // 3. Rotary embeddings: theta from the top level (hub) or rope_parameters (transformers 5),
    //    and their scaling from either block: the default rotary type or YaRN; other scaled
    //    variants (linear, dynamic, longrope, llama3) change the frequencies and are refused.
    let max_position_embeddings = get_u32(obj, "max_position_embeddings")?.unwrap_or(32768);
    let mut rope_theta = get_f64(obj, "rope_theta")?;
    let mut rope_scaling = RopeScaling::None;
    let mut partial_rotary_factor = get_f64(obj, "partial_rotary_factor")?;
    for key in ["rope_parameters", "rope_scaling"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(p)) => {
                let kind = p
                    .get("rope_type")
                    .or_else(|| p.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                match kind {
                    "default" => {}
                    "yarn" => {
                        rope_scaling = yarn(p, obj, max_position_embeddings)
                            .with_context(|| format!("{key} (yarn)"))?
                    }
                    _ => bail!("{key} with rope_type {kind:?} is not supported (implemented: the default rotary embedding and yarn)"),
                }
                if let Some(t) = get_f64(p, "rope_theta")? {
                    rope_theta = Some(t);
                }
                if let Some(f) = get_f64(p, "partial_rotary_factor")? {
                    partial_rotary_factor = Some(f);
                }
            }
            Some(v) => bail!("{key} must be an object or null, got {v}"),
        }
    }
    // The config class's default: Qwen3Config's and Qwen2Config's 10000, Qwen3VLTextConfig's
    // 500000.
    let rope_theta = rope_theta.unwrap_or(family.rope_theta);
    let partial_rotary_factor = match (partial_rotary_factor, hybrid) {
        (Some(f), true) => f,
        (None, true) => qwen3_5::DEFAULT_PARTIAL_ROTARY_FACTOR,
        (Some(f), false) if f != 1.0 => bail!(
            "partial_rotary_factor {f} in a {architecture}: only Qwen3.5 rotates part of each head"
        ),
        _ => 1.0,
    };

    // 4. The attention's variant: Qwen2Attention always has q/k/v biases (`bias=True`) and no
    //    q/k norms; Qwen3Attention has the norms, and biases when `attention_bias` is true.
    let (attention_bias, qk_norm) = if qwen2 {
        (true, false)
    } else {
        (get_bool(obj, "attention_bias")?.unwrap_or(false), true)
    };

    // 5. Options that change the math and are not implemented: refuse loudly.
    if get_bool(obj, "use_sliding_window")?.unwrap_or(false) {
        bail!("use_sliding_window: true is not supported (sliding-window attention is not implemented; every released Qwen2/Qwen3 checkpoint has it off)");
    }
    let num_hidden_layers = require_u32(obj, "num_hidden_layers")?;
    let linear_attention = match hybrid {
        true => Some(qwen3_5::linear_attention(obj, num_hidden_layers)?),
        false => {
            if let Some(Value::Array(types)) = obj.get("layer_types") {
                if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                    bail!("layer_types contains {t}; only full_attention layers are supported in a {architecture}");
                }
            }
            None
        }
    };
    if hybrid && attention_bias {
        bail!("attention_bias: true in a Qwen3.5 model is not supported (its gated q_proj has no bias in any release)");
    }
    if let Some(act) = obj.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            bail!("hidden_act {act:?} is not supported (Qwen2 and Qwen3 use silu)");
        }
    }
    let moe = if family.architecture.experts {
        Some(moe_config(obj, family)?)
    } else {
        for key in ["num_experts", "num_local_experts"] {
            if get_u32(obj, key)?.unwrap_or(0) > 0 {
                bail!("{key} > 0 in a {architecture}: experts belong to Qwen3MoeForCausalLM");
            }
        }
        None
    };

    let eos_token_ids = get_ids(obj, "eos_token_id")?;
    let bos_token_id = get_ids(obj, "bos_token_id")?.first().copied();

    Ok(ModelConfig {
        architecture,
        hidden_size,
        // Qwen3.5-MoE has no dense MLP, and no intermediate_size: its experts' width stands in.
        intermediate_size: match (get_u32(obj, "intermediate_size")?, &moe) {
            (Some(n), _) => n,
            (None, Some(m)) if hybrid_moe => m.moe_intermediate_size,
            (None, _) => require_u32(obj, "intermediate_size")?,
        },
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: require_u32(obj, "vocab_size")?,
        max_position_embeddings,
        rope_theta,
        rms_norm_eps: get_f64(obj, "rms_norm_eps")?.unwrap_or(1e-6),
        // Qwen3Config's and Qwen2Config's default is False; real checkpoints state it (Qwen3.5's
        // at the top and in text_config).
        tie_word_embeddings: match get_bool(obj, "tie_word_embeddings")? {
            Some(t) => t,
            None => get_bool(top, "tie_word_embeddings")?.unwrap_or(false),
        },
        bos_token_id,
        eos_token_ids,
        generation: GenerationDefaults::default(),
        dtype: DType::F32,
        group_size: 0,
        attention_bias,
        qk_norm,
        rope_scaling,
        moe,
        embedding: None,
        partial_rotary_factor,
        attn_output_gate: hybrid,
        linear_attention,
        vision: None,
    })
}

/// YaRN's parameters from a `rope_scaling` / `rope_parameters` block `p`, resolved as
/// transformers' `_compute_yarn_parameters` and `standardize_rope_params` resolve them
/// (modeling_rope_utils.py): `original_max_position_embeddings` from the block, else the
/// config's top level, else `max_position_embeddings`; `factor`, else max / original;
/// `beta_fast` 32 and `beta_slow` 1 when absent (or 0: transformers reads them with `or`);
/// `attention_factor`, else `0.1 ln(factor) + 1`, or with both `mscale` and `mscale_all_dim`
/// the ratio of that formula at each; `truncate` true when absent.
fn yarn(p: &Map<String, Value>, top: &Map<String, Value>, max_pos: u32) -> Result<RopeScaling> {
    let original = match get_u32(p, "original_max_position_embeddings")? {
        Some(o) => o,
        None => get_u32(top, "original_max_position_embeddings")?.unwrap_or(max_pos),
    };
    if original == 0 {
        bail!("original_max_position_embeddings is 0");
    }
    let factor = get_f64(p, "factor")?.unwrap_or(max_pos as f64 / original as f64);
    if !(factor.is_finite() && factor > 0.0) {
        bail!("factor {factor} is not a positive number");
    }
    let nonzero = |key: &str, default: f64| -> Result<f64> {
        Ok(get_f64(p, key)?.filter(|&v| v != 0.0).unwrap_or(default))
    };
    let mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention_factor = match get_f64(p, "attention_factor")? {
        Some(a) => a,
        None => match (nonzero("mscale", 0.0)?, nonzero("mscale_all_dim", 0.0)?) {
            (m, all) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
            _ => mscale(factor, 1.0),
        },
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: nonzero("beta_fast", 32.0)?,
        beta_slow: nonzero("beta_slow", 1.0)?,
        attention_factor,
        truncate: get_bool(p, "truncate")?.unwrap_or(true),
    })
}

/// Merges generation_config.json: its EOS ids join config.json's (HF `generate` stops on the
/// generation config's list), and its sampling defaults are kept.
pub fn apply_generation_config(config: &mut ModelConfig, json: &Value) -> Result<()> {
    let Some(obj) = json.as_object() else {
        bail!("not a JSON object");
    };
    for id in get_ids(obj, "eos_token_id")? {
        if !config.eos_token_ids.contains(&id) {
            config.eos_token_ids.push(id);
        }
    }
    if config.bos_token_id.is_none() {
        config.bos_token_id = get_ids(obj, "bos_token_id")?.first().copied();
    }
    let f32_of = |k: &str| -> Result<Option<f32>> { Ok(get_f64(obj, k)?.map(|v| v as f32)) };
    config.generation = GenerationDefaults {
        temperature: f32_of("temperature")?,
        top_p: f32_of("top_p")?,
        top_k: get_u32(obj, "top_k")?,
        min_p: f32_of("min_p")?,
        repetition_penalty: f32_of("repetition_penalty")?,
        do_sample: get_bool(obj, "do_sample")?,
    };
    Ok(())
}

#[cfg(test)]
mod tests;
