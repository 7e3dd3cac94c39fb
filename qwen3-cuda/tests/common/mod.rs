//! A tiny random-weight Qwen3 model file for the forward-pass tests, and a naive f64 forward pass
//! of HuggingFace's Qwen3 math to check it against.
#![allow(dead_code)]

use qwen3_inference::format::TensorKind;
use qwen3_inference::format::{
    expected_tensors, tensor_specs, DType, GenerationDefaults, ModelConfig, ModelWriter,
};
use qwen3_inference::quant::quantize_q8;
use std::collections::HashMap;
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
        group_size: if dtype == DType::Q8 { 32 } else { 0 },
    }
}

pub fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("qwen3-cuda-test-{}-{name}", std::process::id()))
}

/// Writes a model file with random weights; returns the f32 values each tensor stands for
/// (dequantized for q8, rounded for bf16), by name.
pub fn write_model(path: &Path, c: &ModelConfig) -> HashMap<String, Vec<f32>> {
    let expected = expected_tensors(c);
    let specs = tensor_specs(c);
    let mut w = ModelWriter::create(path, c, specs).unwrap();
    let mut out = HashMap::new();
    for (i, t) in expected.iter().enumerate() {
        let n: usize = t.shape.iter().product::<u64>() as usize;
        let v = values(n, 1000 + i as u64);
        let vals: Vec<f32> = if t.kind == TensorKind::Norm {
            // away from 1.0 so a forward pass that drops the weight (or uses 1 + w) fails
            let v: Vec<f32> = v.iter().map(|x| 1.0 + 0.5 * x).collect();
            w.write_f32(&t.name, &v).unwrap();
            v
        } else {
            let v: Vec<f32> = v.iter().map(|x| 0.4 * x).collect();
            match c.dtype {
                DType::F32 => {
                    w.write_f32(&t.name, &v).unwrap();
                    v
                }
                DType::Bf16 => {
                    let bits: Vec<u16> = v.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                    w.write_bf16(&t.name, &bits).unwrap();
                    bits.iter()
                        .map(|&b| f32::from_bits((b as u32) << 16))
                        .collect()
                }
                DType::Q8 => {
                    let gs = c.group_size as usize;
                    let mut q = vec![0i8; n];
                    let mut s = vec![0.0f32; n / gs];
                    quantize_q8(&v, gs, &mut q, &mut s);
                    w.write_q8(&t.name, &q, &s).unwrap();
                    q.iter()
                        .enumerate()
                        .map(|(i, &qi)| qi as f32 * s[i / gs])
                        .collect()
                }
            }
        };
        out.insert(t.name.clone(), vals);
    }
    w.finish().unwrap();
    out
}

fn rmsnorm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, &wi)| v * r * wi as f64).collect()
}

fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

/// HuggingFace's Qwen3 forward in f64 over the whole sequence; logits of every position.
pub fn naive_forward(
    c: &ModelConfig,
    w: &HashMap<String, Vec<f32>>,
    tokens: &[u32],
) -> Vec<Vec<f64>> {
    let (d, nq, nkv, hd) = (
        c.hidden_size as usize,
        c.num_attention_heads as usize,
        c.num_key_value_heads as usize,
        c.head_dim as usize,
    );
    let eps = c.rms_norm_eps;
    let emb = &w["model.embed_tokens.weight"];
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            emb[t as usize * d..][..d]
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    let rope = |v: &mut [f64], pos: usize| {
        let h = hd / 2;
        for i in 0..h {
            let angle = pos as f64 / c.rope_theta.powf((2 * i) as f64 / hd as f64);
            let (a, b) = (v[i], v[i + h]);
            v[i] = a * angle.cos() - b * angle.sin();
            v[i + h] = b * angle.cos() + a * angle.sin();
        }
    };
    for l in 0..c.num_hidden_layers {
        let p = |n: &str| &w[&format!("model.layers.{l}.{n}.weight")];
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = rmsnorm(x, p("input_layernorm"), eps);
            let mut q = matvec(p("self_attn.q_proj"), &xn);
            let mut k = matvec(p("self_attn.k_proj"), &xn);
            for head in q.chunks_mut(hd) {
                let n = rmsnorm(head, p("self_attn.q_norm"), eps);
                head.copy_from_slice(&n);
                rope(head, pos);
            }
            for head in k.chunks_mut(hd) {
                let n = rmsnorm(head, p("self_attn.k_norm"), eps);
                head.copy_from_slice(&n);
                rope(head, pos);
            }
            qs.push(q);
            ks.push(k);
            vs.push(matvec(p("self_attn.v_proj"), &xn));
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0.0; nq * hd];
            for h in 0..nq {
                let kvh = h / (nq / nkv);
                let qh = &qs[pos][h * hd..][..hd];
                let sc: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let kj = &ks[j][kvh * hd..][..hd];
                        qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hd {
                    att[h * hd + i] = (0..=pos).map(|j| e[j] / z * vs[j][kvh * hd + i]).sum();
                }
            }
            let o = matvec(p("self_attn.o_proj"), &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let xn = rmsnorm(x, p("post_attention_layernorm"), eps);
            let g = matvec(p("mlp.gate_proj"), &xn);
            let u = matvec(p("mlp.up_proj"), &xn);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = matvec(p("mlp.down_proj"), &act);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
    }
    let head = if c.tie_word_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    xs.iter()
        .map(|x| matvec(&w[head], &rmsnorm(x, &w["model.norm.weight"], eps)))
        .collect()
}
