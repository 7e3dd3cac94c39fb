//! config.json and generation_config.json -> [`ModelConfig`].
//!
//! Two dialects exist. Checkpoints on the hub (written by transformers 4.x) carry a top-level
//! `rope_theta` and `torch_dtype`; transformers 5 writes `rope_parameters: {rope_type, rope_theta}`,
//! `dtype` and `layer_types`. Both are accepted. Defaults for absent keys are those of
//! `Qwen3Config` and `Qwen2Config` in transformers' `configuration_qwen3.py` and
//! `configuration_qwen2.py`. Any key that would change the math in a way we do not implement is
//! refused, never ignored.
//!
//! The two families differ in their attention only (`modeling_qwen2.py`, `modeling_qwen3.py`):
//! Qwen2's q/k/v projections always have biases and it has no q/k norms; Qwen3 has q/k norms and
//! biases only if `attention_bias` says so. Qwen2's head_dim defaults to hidden / heads, Qwen3's
//! to 128.

use anyhow::{bail, Context, Result};
use qwen3_inference::format::{DType, GenerationDefaults, ModelConfig, ARCHITECTURES};
use serde_json::{Map, Value};
use std::path::Path;

/// `Qwen3Config`'s default head_dim, used when config.json does not give one.
const QWEN3_DEFAULT_HEAD_DIM: u32 = 128;

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

fn get_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>> {
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
    let Some(obj) = json.as_object() else {
        bail!("not a JSON object");
    };

    // 1. Architecture: Qwen3ForCausalLM or Qwen2ForCausalLM, one forward pass.
    let archs: Vec<&str> = match obj.get("architectures") {
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
        _ => vec![],
    };
    let architecture = match archs.first() {
        Some(a) => a.to_string(),
        None => match obj.get("model_type").and_then(|v| v.as_str()) {
            Some("qwen3") => "Qwen3ForCausalLM".to_string(),
            Some("qwen2") => "Qwen2ForCausalLM".to_string(),
            _ => bail!(
                "no `architectures` and no `model_type` qwen3 or qwen2; not a Qwen checkpoint"
            ),
        },
    };
    if !ARCHITECTURES.contains(&architecture.as_str()) {
        bail!(
            "architecture {architecture} is not supported (supported: {})",
            ARCHITECTURES.join(", ")
        );
    }
    let qwen2 = architecture == "Qwen2ForCausalLM";

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
    let head_dim = match get_u32(obj, "head_dim")? {
        Some(h) => h,
        None if qwen2 => {
            if !hidden_size.is_multiple_of(num_attention_heads) {
                bail!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}, and there is no head_dim");
            }
            hidden_size / num_attention_heads
        }
        None => QWEN3_DEFAULT_HEAD_DIM,
    };
    let num_key_value_heads = get_u32(obj, "num_key_value_heads")?.unwrap_or(num_attention_heads);

    // 3. Rotary embeddings: theta from the top level (hub) or rope_parameters (transformers 5).
    //    Only the default rotary type is implemented; scaled variants (yarn, linear, dynamic...)
    //    change the frequencies and are refused.
    let mut rope_theta = get_f64(obj, "rope_theta")?;
    for key in ["rope_parameters", "rope_scaling"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(p)) => {
                let kind = p
                    .get("rope_type")
                    .or_else(|| p.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                if kind != "default" {
                    bail!("{key} with rope_type {kind:?} is not supported (only the default rotary embedding is implemented)");
                }
                if let Some(t) = get_f64(p, "rope_theta")? {
                    rope_theta = Some(t);
                }
            }
            Some(v) => bail!("{key} must be an object or null, got {v}"),
        }
    }
    let rope_theta = rope_theta.unwrap_or(10_000.0);

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
    if let Some(Value::Array(types)) = obj.get("layer_types") {
        if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            bail!("layer_types contains {t}; only full_attention layers are supported");
        }
    }
    if let Some(act) = obj.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            bail!("hidden_act {act:?} is not supported (Qwen2 and Qwen3 use silu)");
        }
    }
    if get_u32(obj, "num_experts")?.unwrap_or(0) > 0 {
        bail!("mixture-of-experts checkpoints (num_experts > 0) are not supported");
    }

    let eos_token_ids = get_ids(obj, "eos_token_id")?;
    let bos_token_id = get_ids(obj, "bos_token_id")?.first().copied();

    Ok(ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: require_u32(obj, "intermediate_size")?,
        num_hidden_layers: require_u32(obj, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: require_u32(obj, "vocab_size")?,
        max_position_embeddings: get_u32(obj, "max_position_embeddings")?.unwrap_or(32768),
        rope_theta,
        rms_norm_eps: get_f64(obj, "rms_norm_eps")?.unwrap_or(1e-6),
        // Qwen3Config's and Qwen2Config's default is False; real checkpoints state it.
        tie_word_embeddings: get_bool(obj, "tie_word_embeddings")?.unwrap_or(false),
        bos_token_id,
        eos_token_ids,
        generation: GenerationDefaults::default(),
        dtype: DType::F32,
        group_size: 0,
        attention_bias,
        qk_norm,
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
mod tests {
    use super::*;
    use serde_json::json;

    /// The real config.json of Qwen/Qwen3-0.6B (hub dialect), as published on the hub.
    fn qwen3_06b() -> Value {
        json!({
          "architectures": ["Qwen3ForCausalLM"],
          "attention_bias": false, "attention_dropout": 0.0,
          "bos_token_id": 151643, "eos_token_id": 151645,
          "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
          "initializer_range": 0.02, "intermediate_size": 3072,
          "max_position_embeddings": 40960, "max_window_layers": 28,
          "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
          "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
          "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
          "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
          "use_sliding_window": false, "vocab_size": 151936
        })
    }

    #[test]
    fn hub_dialect() {
        let c = parse_config(&qwen3_06b()).unwrap();
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.hidden_size, 1024);
        assert_eq!(c.num_key_value_heads, 8);
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![151645]);
        assert_eq!(c.bos_token_id, Some(151643));
    }

    #[test]
    fn transformers5_dialect() {
        let mut j = qwen3_06b();
        let o = j.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("torch_dtype");
        o.remove("rope_scaling");
        o.insert("dtype".into(), json!("bfloat16"));
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 500000.0}),
        );
        o.insert("layer_types".into(), json!(vec!["full_attention"; 28]));
        let c = parse_config(&j).unwrap();
        assert_eq!(c.rope_theta, 5e5);
    }

    #[test]
    fn head_dim_defaults_to_qwen3config_default_not_hidden_over_heads() {
        let mut j = qwen3_06b();
        j.as_object_mut().unwrap().remove("head_dim");
        assert_eq!(parse_config(&j).unwrap().head_dim, 128);
    }

    #[test]
    fn unsupported_options_are_refused() {
        let cases = [
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 4.0}),
                "yarn",
            ),
            ("use_sliding_window", json!(true), "sliding"),
            (
                "architectures",
                json!(["LlamaForCausalLM"]),
                "LlamaForCausalLM",
            ),
            ("hidden_act", json!("gelu"), "gelu"),
            (
                "layer_types",
                json!(["sliding_attention"]),
                "sliding_attention",
            ),
        ];
        for (k, v, want) in cases {
            let mut j = qwen3_06b();
            j.as_object_mut().unwrap().insert(k.into(), v);
            let e = format!("{:#}", parse_config(&j).unwrap_err());
            assert!(e.contains(want), "{k}: {e}");
        }
        let mut j = qwen3_06b();
        j.as_object_mut().unwrap().remove("hidden_size");
        assert!(format!("{:#}", parse_config(&j).unwrap_err()).contains("hidden_size is missing"));
    }

    /// The real config.json of Qwen/Qwen2.5-0.5B-Instruct (hub dialect), as published on the hub.
    fn qwen25_05b() -> Value {
        json!({
          "architectures": ["Qwen2ForCausalLM"],
          "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
          "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
          "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
          "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
          "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
          "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
          "vocab_size": 151936
        })
    }

    #[test]
    fn qwen2_has_biases_no_qk_norm_and_head_dim_hidden_over_heads() {
        let c = parse_config(&qwen25_05b()).unwrap();
        assert_eq!(c.architecture, "Qwen2ForCausalLM");
        assert!(c.attention_bias && !c.qk_norm);
        assert_eq!(c.head_dim, 896 / 14);
        assert_eq!((c.rope_theta, c.num_key_value_heads), (1e6, 2));
        // Qwen3: norms, and biases only when attention_bias says so.
        let c = parse_config(&qwen3_06b()).unwrap();
        assert!(!c.attention_bias && c.qk_norm);
        let mut j = qwen3_06b();
        j.as_object_mut()
            .unwrap()
            .insert("attention_bias".into(), json!(true));
        assert!(parse_config(&j).unwrap().attention_bias);
        // A Qwen2 config with sliding windows on is refused; model_type alone is enough.
        let mut j = qwen25_05b();
        j.as_object_mut()
            .unwrap()
            .insert("use_sliding_window".into(), json!(true));
        assert!(format!("{:#}", parse_config(&j).unwrap_err()).contains("use_sliding_window"));
        let mut j = qwen25_05b();
        j.as_object_mut().unwrap().remove("architectures");
        assert_eq!(parse_config(&j).unwrap().architecture, "Qwen2ForCausalLM");
    }

    #[test]
    fn generation_config_merges_eos_and_defaults() {
        let mut c = parse_config(&qwen3_06b()).unwrap();
        // Qwen3-0.6B's generation_config.json.
        let g = json!({"bos_token_id": 151643, "do_sample": true,
                       "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                       "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                       "transformers_version": "4.51.0"});
        apply_generation_config(&mut c, &g).unwrap();
        assert_eq!(c.eos_token_ids, vec![151645, 151643]);
        assert_eq!(c.generation.temperature, Some(0.6));
        assert_eq!(c.generation.top_k, Some(20));
        assert_eq!(c.generation.top_p, Some(0.95));
        assert_eq!(c.generation.min_p, None);
        assert_eq!(c.generation.do_sample, Some(true));
    }
}
