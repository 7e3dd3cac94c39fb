//! config.json as the hub and transformers 5 write it, for each family: read, defaulted, refused.

use super::*;
use qwen3_inference::format::MoeConfig;
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
            json!({"rope_type": "linear", "factor": 4.0}),
            "linear",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor",
        ),
        ("num_experts", json!(8), "Qwen3MoeForCausalLM"),
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

/// YaRN as Qwen3's model card documents it: frequencies and the attention factor resolved
/// as transformers resolves them, and the context it opens (4 x 32768).
#[test]
fn yarn_is_read_from_either_block() {
    let mut j = qwen3_06b();
    j.as_object_mut().unwrap().insert(
        "rope_scaling".into(),
        json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    );
    let c = parse_config(&j).unwrap();
    let want = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 32768,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 0.1 * 4f64.ln() + 1.0,
        truncate: true,
    };
    assert_eq!(c.rope_scaling, want);
    assert_eq!(
        (c.max_position_embeddings, c.max_context()),
        (40960, 131072)
    );
    // transformers 5's rope_parameters, old `type` key, mscale ratio, no original given
    // (then max_position_embeddings), betas given.
    let mut j = qwen3_06b();
    let o = j.as_object_mut().unwrap();
    o.remove("rope_scaling");
    o.insert(
        "rope_parameters".into(),
        json!({"type": "yarn", "rope_theta": 1e6, "factor": 2.0, "mscale": 2.0,
               "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": false}),
    );
    let c = parse_config(&j).unwrap();
    let m = |mscale: f64| 0.1 * mscale * 2f64.ln() + 1.0;
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Yarn {
            factor: 2.0,
            original_max_position_embeddings: 40960,
            beta_fast: 16.0,
            beta_slow: 2.0,
            attention_factor: m(2.0) / m(1.0),
            truncate: false,
        }
    );
    // the default type stays unscaled
    assert_eq!(
        parse_config(&qwen3_06b()).unwrap().rope_scaling,
        RopeScaling::None
    );
}

/// The real config.json of Qwen/Qwen3-30B-A3B (hub dialect), as published on the hub.
fn qwen3_30b_a3b() -> Value {
    json!({
      "architectures": ["Qwen3MoeForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
      "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
      "initializer_range": 0.02, "intermediate_size": 6144,
      "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
      "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
      "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
      "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
      "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
      "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
      "use_sliding_window": false, "vocab_size": 151936
    })
}

#[test]
fn qwen3_moe_config_is_read() {
    let c = parse_config(&qwen3_30b_a3b()).unwrap();
    assert_eq!(c.architecture, "Qwen3MoeForCausalLM");
    assert!(c.qk_norm && !c.attention_bias);
    assert_eq!((c.head_dim, c.num_key_value_heads), (128, 4));
    let want = MoeConfig {
        num_experts: 128,
        num_experts_per_tok: 8,
        moe_intermediate_size: 768,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        shared_expert_intermediate_size: 0,
    };
    assert_eq!(c.moe.as_ref(), Some(&want));
    // transformers 5 names the count num_local_experts; dense layers among sparse ones
    let mut j = qwen3_30b_a3b();
    let o = j.as_object_mut().unwrap();
    o.remove("num_experts");
    o.insert("num_local_experts".into(), json!(64));
    o.insert("mlp_only_layers".into(), json!([0, 47]));
    let m = parse_config(&j).unwrap().moe.unwrap();
    assert_eq!((m.num_experts, m.mlp_only_layers), (64, vec![0, 47]));
    // other families' options are refused by name
    for (k, v) in [
        ("shared_expert_intermediate_size", json!(5632)),
        ("n_shared_experts", json!(1)),
        ("scoring_func", json!("sigmoid")),
        ("topk_method", json!("noaux_tc")),
        ("routed_scaling_factor", json!(2.5)),
    ] {
        let mut j = qwen3_30b_a3b();
        j.as_object_mut().unwrap().insert(k.into(), v);
        let e = format!("{:#}", parse_config(&j).unwrap_err());
        assert!(e.contains(k), "{k}: {e}");
    }
    let mut j = qwen3_30b_a3b();
    j.as_object_mut()
        .unwrap()
        .insert("num_local_experts".into(), json!(64));
    assert!(format!("{:#}", parse_config(&j).unwrap_err()).contains("disagree"));
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

/// A Qwen3-VL checkpoint: its text model is a Qwen3 under `text_config` (rope_theta
/// defaulting to Qwen3VLTextConfig's 500000); the one with experts as Qwen3-MoE.
#[test]
fn qwen3_vl_exports_its_text_model_as_qwen3() {
    let mut text = qwen3_06b();
    let t = text.as_object_mut().unwrap();
    for k in [
        "architectures",
        "rope_theta",
        "rope_scaling",
        "tie_word_embeddings",
    ] {
        t.remove(k);
    }
    t.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}),
    );
    let vl = json!({
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": text, "tie_word_embeddings": true, "image_token_id": 151655
    });
    let c = parse_config(&vl).unwrap();
    assert_eq!(c.architecture, "Qwen3ForCausalLM");
    assert_eq!((c.hidden_size, c.head_dim, c.rope_theta), (1024, 128, 5e5));
    assert!(c.qk_norm && c.tie_word_embeddings);
    // The one with experts: Qwen3-MoE's text model, whose router always renormalises
    // (`Qwen3VLMoeTextTopKRouter`) where Qwen3MoeConfig's `norm_topk_prob` defaults to false,
    // and whose head_dim defaults to hidden / heads.
    let mut moe = vl.clone();
    moe["architectures"] = json!(["Qwen3VLMoeForConditionalGeneration"]);
    moe["model_type"] = json!("qwen3_vl_moe");
    let t = moe["text_config"].as_object_mut().unwrap();
    t.remove("head_dim");
    t.insert("num_experts".into(), json!(128));
    t.insert("moe_intermediate_size".into(), json!(768));
    let c = parse_config(&moe).unwrap();
    assert_eq!(c.architecture, "Qwen3MoeForCausalLM");
    assert_eq!((c.head_dim, c.rope_theta), (1024 / 16, 5e5));
    let m = c.moe.unwrap();
    assert_eq!((m.num_experts, m.moe_intermediate_size), (128, 768));
    assert!(m.norm_topk_prob);
    // Keys left out: Qwen3VLMoeTextConfig's defaults, not Qwen3MoeConfig's.
    let t = moe["text_config"].as_object_mut().unwrap();
    for k in [
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
    ] {
        t.remove(k);
    }
    let m = parse_config(&moe).unwrap().moe.unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (60, 4, 1408)
    );
}
