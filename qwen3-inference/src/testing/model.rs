//! Tiny model files with random weights, for the tests of the forward pass, generation, the CLI
//! and the GPU backend: the one writer they all use. (Exactness against HuggingFace is tested on
//! real exported checkpoints in qwen3-cli/tests/parity.rs; these only need a valid model.)

use crate::format::writer::ModelWriter;
use crate::format::writer::TensorSpec;
use crate::format::{tensor_specs, DType, GenerationDefaults, ModelConfig, MoeConfig, RopeScaling};
use crate::quant::{quantize_q4, quantize_q6, quantize_q8};
use std::path::Path;

pub fn config(dtype: DType) -> ModelConfig {
    ModelConfig {
        architecture: crate::format::architecture::QWEN3.name.into(),
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        vocab_size: 40,
        max_position_embeddings: 64,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: dtype != DType::Bf16,
        bos_token_id: None,
        eos_token_ids: vec![0],
        generation: GenerationDefaults::default(),
        dtype,
        group_size: if matches!(dtype, DType::Q8 | DType::Q4) {
            16
        } else {
            0
        },
        attention_bias: false,
        qk_norm: true,
        rope_scaling: crate::format::RopeScaling::None,
        moe: None,
        embedding: None,
        partial_rotary_factor: 1.0,
        attn_output_gate: false,
        linear_attention: None,
        vision: None,
    }
}

/// [`config`] as a Qwen3.5: three Gated DeltaNet layers, then gated attention rotating a quarter
/// of each head (4 of 16 dimensions).
pub fn qwen3_5_config(dtype: DType) -> ModelConfig {
    use crate::format::{LayerType::*, LinearAttentionConfig};
    ModelConfig {
        architecture: crate::format::architecture::QWEN3_5.name.into(),
        num_hidden_layers: 4,
        partial_rotary_factor: 0.25,
        attn_output_gate: true,
        linear_attention: Some(LinearAttentionConfig {
            layer_types: vec![
                LinearAttention,
                LinearAttention,
                LinearAttention,
                FullAttention,
            ],
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 8,
            linear_value_head_dim: 8,
            linear_conv_kernel_dim: 4,
            value_heads: Default::default(),
        }),
        ..config(dtype)
    }
}

/// [`config`] as a Qwen3-MoE: 8 experts of width 32, top 2 renormalised, layer 1 of 3 dense;
/// with YaRN (factor 4 over 16 original positions) so the tables differ from plain RoPE's.
pub fn moe_config(dtype: DType) -> ModelConfig {
    ModelConfig {
        architecture: crate::format::architecture::QWEN3_MOE.name.into(),
        num_hidden_layers: 3,
        rope_scaling: RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        },
        moe: Some(MoeConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![1],
            shared_expert_intermediate_size: 0,
        }),
        ..config(dtype)
    }
}

/// A model file with random weights (norm weights drawn in 0.5..1.5). `DType::Q6`, not a file's
/// dtype, asks for a q4 file (groups of 32, rows a multiple of 32 wide) whose every matrix is
/// stored in q6.
pub fn write_random(path: &Path, dtype: DType) {
    let (c, specs) = match dtype {
        DType::Q6 => {
            let mut c = config(DType::Q4);
            (c.group_size, c.intermediate_size) = (32, 64);
            let mut specs = tensor_specs(&c);
            for s in specs.iter_mut().filter(|s| s.shape.len() == 2) {
                s.dtype = DType::Q6;
            }
            (c, specs)
        }
        _ => (config(dtype), tensor_specs(&config(dtype))),
    };
    write_random_specs(path, &c, &specs)
}

/// A model file of config `c` with random weights, stored as [`tensor_specs`] says (a q4
/// file keeps some matrices finer: `Q4Mix`).
pub fn write_random_config(path: &Path, c: &ModelConfig) {
    write_random_specs(path, c, &tensor_specs(c))
}

fn write_random_specs(path: &Path, c: &ModelConfig, specs: &[TensorSpec]) {
    let mut w = ModelWriter::create(path, c, specs.to_vec()).unwrap();
    let mut seed = 11u64;
    let mut rnd = || super::lcg(&mut seed);
    for s in specs {
        let n = s.shape.iter().product::<u64>() as usize;
        let norm = s.dtype == DType::F32 && s.shape.len() == 1;
        // A router's logits spread by a few units, so that top-k picks are clear.
        let gain = if s.name.ends_with(".mlp.gate.weight") {
            8.0
        } else {
            0.3
        };
        // A Gated DeltaNet's decay: A = exp(A_log) about 0.4 and softplus(a + dt_bias) about
        // 0.13, so each token keeps about 95% of the memory, which then spans tens of tokens
        // (with a memory of one token, a head's normalised output is the sign of q . k, which
        // any rounding flips).
        let decay = match () {
            _ if s.name.ends_with(".A_log") => Some(-1.0),
            _ if s.name.ends_with(".dt_bias") => Some(-2.0),
            _ => None,
        };
        let v: Vec<f32> = (0..n)
            .map(|_| match decay {
                Some(centre) => centre + 0.3 * rnd(),
                None if norm => 1.0 + 0.5 * rnd(),
                None => gain * rnd(),
            })
            .collect();
        match s.dtype {
            DType::F32 => w.write_f32(&s.name, &v).unwrap(),
            DType::Bf16 => {
                let bits: Vec<u16> = v.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                w.write_bf16(&s.name, &bits).unwrap()
            }
            DType::Q8 => {
                let gs = s.group_size as usize;
                let mut q = vec![0i8; n];
                let mut sc = vec![0f32; n / gs];
                quantize_q8(&v, gs, &mut q, &mut sc);
                w.write_q8(&s.name, &q, &sc).unwrap()
            }
            DType::Q4 => {
                let gs = s.group_size as usize;
                let mut p = vec![0u8; n / 2];
                let mut sc = vec![0u16; n / gs];
                quantize_q4(&v, gs, &mut p, &mut sc);
                w.write_q4(&s.name, &p, &sc).unwrap()
            }
            DType::Q6 => {
                let (gs, cols) = (s.group_size as usize, s.shape[1] as usize);
                let mut p = vec![0u8; n / 4 * 3];
                let mut sc = vec![0u16; n / gs];
                quantize_q6(&v, cols, gs, &mut p, &mut sc);
                w.write_q6(&s.name, &p, &sc).unwrap()
            }
            DType::K(_) => {
                panic!("{}: K-quants come only from GGUF files", s.dtype)
            }
        }
    }
    w.finish().unwrap();
}
