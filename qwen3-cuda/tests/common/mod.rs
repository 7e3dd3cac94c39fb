//! A tiny random-weight Qwen3 model file for the forward-pass tests (its oracle is the plain
//! backend, `qwen3_inference::backend::PlainBackend`).
#![allow(dead_code)]

use qwen3_inference::format::TensorKind;
use qwen3_inference::format::{
    expected_tensors, tensor_specs, DType, GenerationDefaults, ModelConfig, ModelWriter,
};
use qwen3_inference::quant::{quantize_q4, quantize_q6, quantize_q8};
use std::path::{Path, PathBuf};

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
        }),
        ..tiny_config(dtype, false)
    }
}

pub fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("qwen3-cuda-test-{}-{name}", std::process::id()))
}

/// Writes a model file with random weights.
pub fn write_model(path: &Path, c: &ModelConfig) {
    let expected = expected_tensors(c);
    let specs = tensor_specs(c);
    let mut w = ModelWriter::create(path, c, specs.clone()).unwrap();
    for (i, t) in expected.iter().enumerate() {
        let n: usize = t.shape.iter().product::<u64>() as usize;
        let v = values(n, 1000 + i as u64);
        if t.kind == TensorKind::Router {
            // logits a few units apart, so that top-k picks are clear
            let v: Vec<f32> = v.iter().map(|x| 2.0 * x).collect();
            w.write_f32(&t.name, &v).unwrap();
            continue;
        }
        if t.kind != TensorKind::Matrix {
            // away from 1.0 so a forward pass that drops the weight (or uses 1 + w) fails
            let v: Vec<f32> = v.iter().map(|x| 1.0 + 0.5 * x).collect();
            w.write_f32(&t.name, &v).unwrap();
            continue;
        }
        let v: Vec<f32> = v.iter().map(|x| 0.4 * x).collect();
        // Each tensor as the file format stores it (a q4 file keeps some matrices finer: Q4Mix).
        let gs = specs[i].group_size as usize;
        match specs[i].dtype {
            DType::F32 => w.write_f32(&t.name, &v).unwrap(),
            DType::Bf16 => {
                let bits: Vec<u16> = v.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                w.write_bf16(&t.name, &bits).unwrap();
            }
            DType::Q8 => {
                let mut q = vec![0i8; n];
                let mut s = vec![0.0f32; n / gs];
                quantize_q8(&v, gs, &mut q, &mut s);
                w.write_q8(&t.name, &q, &s).unwrap();
            }
            DType::Q4 => {
                let mut packed = vec![0u8; n / 2];
                let mut s = vec![0u16; n / gs];
                quantize_q4(&v, gs, &mut packed, &mut s);
                w.write_q4(&t.name, &packed, &s).unwrap();
            }
            DType::Q6 => {
                let cols = t.shape[1] as usize;
                let mut packed = vec![0u8; n / 4 * 3];
                let mut s = vec![0u16; n / gs];
                quantize_q6(&v, cols, gs, &mut packed, &mut s);
                w.write_q6(&t.name, &packed, &s).unwrap();
            }
        }
    }
    w.finish().unwrap();
}
