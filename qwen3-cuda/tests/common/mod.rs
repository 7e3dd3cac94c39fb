//! A tiny random-weight Qwen3 model file for the forward-pass tests (its oracle is the plain
//! backend, `qwen3_inference::backend::PlainBackend`).
#![allow(dead_code)]

use qwen3_inference::format::{DType, GenerationDefaults, ModelConfig};
use std::path::{Path, PathBuf};

// Not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use qwen3_inference::testing::values;

/// head_dim (32) differs from hidden / heads (16), GQA ratio 2, untied or tied classifier.
pub fn tiny_config(dtype: DType, tied: bool) -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3ForCausalLM".into(),
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        vocab_size: 100,
        max_position_embeddings: 64,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: tied,
        bos_token_id: None,
        eos_token_ids: vec![1],
        generation: GenerationDefaults::default(),
        dtype,
        group_size: if matches!(dtype, DType::Q8 | DType::Q4) {
            32
        } else {
            0
        },
        attention_bias: false,
        qk_norm: true,
        rope_scaling: qwen3_inference::format::RopeScaling::None,
        moe: None,
        embedding: None,
        partial_rotary_factor: 1.0,
        attn_output_gate: false,
        linear_attention: None,
        vision: None,
    }
}

/// [`tiny_config`] as a Qwen3-MoE with YaRN: 8 experts of width 32, top 2 renormalised, the
/// middle one of 3 layers dense, YaRN's factor 4 over 16 original positions.
pub fn tiny_moe_config(dtype: DType) -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3MoeForCausalLM".into(),
        num_hidden_layers: 3,
        rope_scaling: qwen3_inference::format::RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        },
        moe: Some(qwen3_inference::format::MoeConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![1],
            shared_expert_intermediate_size: 0,
        }),
        ..tiny_config(dtype, false)
    }
}

pub fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("qwen3-cuda-test-{}-{name}", std::process::id()))
}

/// Writes a model file with random weights (the library's one test-model writer).
pub fn write_model(path: &Path, c: &ModelConfig) {
    qwen3_inference::testing::model::write_random_config(path, c)
}
