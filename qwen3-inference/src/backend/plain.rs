//! The math of a Qwen3 forward pass in textbook loops: start reading here.
//!
//! [`PlainBackend`] implements every operation of [`Backend`] the way a textbook writes it: one
//! loop per formula, no SIMD, no threads, no `unsafe`, weights converted to f32 as they are read
//! ("dequantize on read"). [`crate::model::Session`] runs on it unchanged (`--device plain` in
//! the CLI). It is slow (a few tokens a second on Qwen3-0.6B) and it is the oracle: the fast CPU
//! backend (`cpu.rs` over `crate::kernels`) is tested against it, and with an f32 model it gives
//! HuggingFace's logits to 1e-4 like the fast one.
//!
//! Shapes are row-major, as in the trait's comments. The KV cache is the plainest layout:
//! `keys[layer][pos][kv_head][head_dim]`, and the same for values.

use super::host::HostMemory;
use super::{AttentionShape, Backend, DeltaNetShape, KvType, RopeTable};
use crate::format::view::TensorView;
use crate::format::DType;
use anyhow::{bail, Result};
use std::marker::PhantomData;

/// See the module's comment. It holds nothing; `'a` is the lifetime of the mapped model file its
/// tensors borrow from.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainBackend<'a>(PhantomData<&'a ()>);

impl PlainBackend<'_> {
    pub const fn new() -> Self {
        PlainBackend(PhantomData)
    }
}

/// Keys and values of every layer: `[layers][context_len * n_kv_heads * head_dim]` each.
pub struct PlainKvCache {
    shape: AttentionShape,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// An f32 tensor's values (norm weights and the DeltaNets' parameters are f32 in every file).
fn f32_weights<'t>(t: &TensorView<'t>) -> Result<&'t [f32]> {
    match t.data.dtype() {
        DType::F32 => Ok(t.data.f32()),
        _ => bail!("{} is not stored as f32", t.name),
    }
}

/// Weight `i` (row-major index) of a tensor, as f32: bf16 widened, q8, q4 and q6 times their
/// group's scale, a K-quant's as its block says ([`TensorData::value`](crate::format::view::TensorData::value)).
pub fn weight(t: &TensorView, i: usize) -> f32 {
    t.data.value(i)
}

/// Its buffers are host vectors: [`host`](super::host)'s memory.
impl HostMemory for PlainBackend<'_> {}

impl<'a> Backend for PlainBackend<'a> {
    type Tensor = TensorView<'a>;
    type Rope = RopeTable;
    type KvCache = PlainKvCache;

    fn rope_table(&self, table: RopeTable) -> Result<RopeTable> {
        Ok(table)
    }

    fn kv_cache(
        &self,
        layers: usize,
        shape: AttentionShape,
        _max_batch: usize,
        kv: KvType,
    ) -> Result<PlainKvCache> {
        if kv != KvType::F32 {
            bail!("the plain backend keeps its KV cache in f32 (--kv-cache f32)");
        }
        let len = shape.context_len * shape.n_kv_heads * shape.head_dim;
        Ok(PlainKvCache {
            shape,
            keys: vec![vec![0.0; len]; layers],
            values: vec![vec![0.0; len]; layers],
        })
    }

    /// `x[i][c] = table[tokens[i]][c]`.
    fn embed(
        &self,
        x: &mut Vec<f32>,
        table: &TensorView<'a>,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<()> {
        for (i, &tok) in tokens.iter().enumerate() {
            for c in 0..hidden {
                x[i * hidden + c] = weight(table, tok as usize * hidden + c);
            }
        }
        Ok(())
    }

    /// `out[r][c] = w[c] * x[r][c] / sqrt(mean_c(x[r][c]^2) + eps)`.
    fn rmsnorm(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        w: &TensorView<'a>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
            let inv_rms = 1.0 / (mean_sq + eps).sqrt();
            for c in 0..n {
                out[r * n + c] = weight(w, c) * (row[c] * inv_rms);
            }
        }
        Ok(())
    }

    /// `y[t][r] = sum_c x[t][c] * w[r][c]`.
    fn matmul(
        &self,
        y: &mut Vec<f32>,
        w: &TensorView<'a>,
        x: &Vec<f32>,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        for t in 0..n_tok {
            for r in 0..rows {
                let mut sum = 0.0f32;
                for c in 0..cols {
                    sum += x[t * cols + c] * weight(w, r * cols + c);
                }
                y[t * rows + r] = sum;
            }
        }
        Ok(())
    }

    /// `x[t][j] += bias[j]`.
    fn add_bias(
        &self,
        x: &mut Vec<f32>,
        bias: &TensorView<'a>,
        n_tok: usize,
        n: usize,
    ) -> Result<()> {
        for t in 0..n_tok {
            for j in 0..n {
                x[t * n + j] += weight(bias, j);
            }
        }
        Ok(())
    }

    /// Each frequency `i` of token `t` turned by the angle of its component's position
    /// `positions[t][components[i]]`, the halves as in `rope`.
    fn rope_mrope(
        &self,
        x: &mut Vec<f32>,
        table: &RopeTable,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        positions: &[[u32; 3]],
        components: &[u8],
    ) -> Result<()> {
        let half = table.rotary_dim() / 2;
        super::host::check_mrope(table, n_tok, positions, components)?;
        for t in 0..n_tok {
            for h in 0..n_heads {
                let head = &mut x[(t * n_heads + h) * head_dim..][..head_dim];
                for i in 0..half {
                    let pos = positions[t][components[i] as usize] as usize;
                    let (cos, sin) = (table.cos()[pos * half + i], table.sin()[pos * half + i]);
                    let (lo, hi) = (head[i], head[i + half]);
                    head[i] = lo * cos - hi * sin;
                    head[i + half] = hi * cos + lo * sin;
                }
            }
        }
        Ok(())
    }

    const TAKES_IMAGES: bool = true;

    /// Each head's halves rotated by the angles of its token's position (HF's `rotate_half`):
    /// `lo' = lo cos - hi sin`, `hi' = hi cos + lo sin`.
    fn rope(
        &self,
        x: &mut Vec<f32>,
        table: &RopeTable,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        // The first `rotary_dim` values of each head rotate (all of them but in Qwen3.5).
        let half = table.rotary_dim() / 2;
        for t in 0..n_tok {
            let pos = pos0 + t;
            let cos = &table.cos()[pos * half..(pos + 1) * half];
            let sin = &table.sin()[pos * half..(pos + 1) * half];
            for h in 0..n_heads {
                let head = &mut x[(t * n_heads + h) * head_dim..][..head_dim];
                for i in 0..half {
                    let (lo, hi) = (head[i], head[i + half]);
                    head[i] = lo * cos[i] - hi * sin[i];
                    head[i + half] = hi * cos[i] + lo * sin[i];
                }
            }
        }
        Ok(())
    }

    fn store_kv(
        &self,
        cache: &mut PlainKvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let row = cache.shape.n_kv_heads * cache.shape.head_dim;
        if pos0 + n_tok > cache.shape.context_len {
            bail!("the KV cache holds {} positions", cache.shape.context_len);
        }
        let at = pos0 * row..(pos0 + n_tok) * row;
        cache.keys[layer][at.clone()].copy_from_slice(&k[..n_tok * row]);
        cache.values[layer][at].copy_from_slice(&v[..n_tok * row]);
        Ok(())
    }

    /// For each query head: scores `q . k_p / sqrt(head_dim)` for positions `p = 0 ..= pos`,
    /// softmax over them, and the values' weighted sum. Query head `h` reads kv head
    /// `h / (n_heads / n_kv_heads)` (grouped-query attention, HF's `repeat_kv`).
    fn attention(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        cache: &mut PlainKvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            ..
        } = cache.shape;
        let group = n_heads / n_kv_heads;
        let (keys, values) = (&cache.keys[layer], &cache.values[layer]);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut scores = vec![0.0f32; pos0 + n_tok];
        for t in 0..n_tok {
            let n_keys = pos0 + t + 1;
            for h in 0..n_heads {
                let kv = h / group;
                let qh = &q[(t * n_heads + h) * head_dim..][..head_dim];
                let at = |p: usize| (p * n_kv_heads + kv) * head_dim;
                for (p, s) in scores[..n_keys].iter_mut().enumerate() {
                    let k = &keys[at(p)..at(p) + head_dim];
                    *s = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                // Softmax, the largest score subtracted first so that exp cannot overflow.
                let max = scores[..n_keys]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0f32;
                for s in &mut scores[..n_keys] {
                    *s = (*s - max).exp();
                    total += *s;
                }
                let o = &mut out[(t * n_heads + h) * head_dim..][..head_dim];
                o.fill(0.0);
                for (p, &s) in scores[..n_keys].iter().enumerate() {
                    let v = &values[at(p)..at(p) + head_dim];
                    for (o, &v) in o.iter_mut().zip(v) {
                        *o += (s / total) * v;
                    }
                }
            }
        }
        Ok(())
    }

    /// `gate[i] = gate[i] * sigmoid(gate[i]) * up[i]` (SwiGLU: SiLU of the gate times the up).
    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        for i in 0..n {
            let g = gate[i];
            gate[i] = g / (1.0 + (-g).exp()) * up[i];
        }
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        for i in 0..n {
            x[i] += y[i];
        }
        Ok(())
    }

    fn check_layers(&self, _config: &crate::format::ModelConfig) -> Result<()> {
        // Every layer kind: Qwen3.5's through `kernels/delta_net.rs`.
        Ok(())
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, n: usize) -> Result<()> {
        super::hybrid_steps::sigmoid_mul(&super::hybrid_steps::TEXTBOOK, x, gate, n)
    }

    fn causal_conv_silu(
        &self,
        x: &mut Vec<f32>,
        window: &mut Vec<f32>,
        w: &TensorView<'a>,
        rows: std::ops::Range<usize>,
        shape: DeltaNetShape,
    ) -> Result<()> {
        super::hybrid_steps::causal_conv_silu(
            &super::hybrid_steps::TEXTBOOK,
            x,
            window,
            f32_weights(w)?,
            rows,
            shape,
        )
    }

    fn gated_delta_rule(
        &self,
        o: &mut Vec<f32>,
        qkv: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_log: &TensorView<'a>,
        dt_bias: &TensorView<'a>,
        state: &mut Vec<f32>,
        rows: std::ops::Range<usize>,
        pos0: usize,
        shape: DeltaNetShape,
    ) -> Result<()> {
        let (a_log, dt_bias) = (f32_weights(a_log)?, f32_weights(dt_bias)?);
        super::hybrid_steps::gated_delta_rule(
            &super::hybrid_steps::TEXTBOOK,
            o,
            qkv,
            a,
            b,
            a_log,
            dt_bias,
            state,
            rows,
            pos0,
            shape,
        )
    }

    fn gated_rmsnorm(
        &self,
        o: &mut Vec<f32>,
        z: &Vec<f32>,
        w: &TensorView<'a>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        super::hybrid_steps::gated_rmsnorm(
            &super::hybrid_steps::TEXTBOOK,
            o,
            z,
            f32_weights(w)?,
            rows,
            n,
            eps,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CpuBackend, KvType};
    use crate::format::view::TensorData;
    use crate::format::ModelFile;
    use crate::model::{Model, Session};
    use crate::testing::model::{moe_config, write_random, write_random_config};

    /// The fast CPU backend against the plain one, on random models of each storage: the same
    /// greedy tokens and logits within what their different orders of summation (and, for q8,
    /// q4 and q6, the CPU's quantized activations) allow.
    #[test]
    fn the_cpu_backend_computes_the_plain_math() {
        let cases = [
            (DType::F32, 1e-5),
            (DType::Bf16, 1e-5),
            (DType::Q8, 0.05),
            (DType::Q4, 0.05),
            // A q4 file with every matrix in q6.
            (DType::Q6, 0.05),
        ];
        for (dt, tol) in cases {
            let d = std::env::temp_dir().join(format!("pq-plain-{}-{dt:?}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("m.bin");
            write_random(&p, dt);
            let exact = !dt.grouped();
            let worst = plain_against_cpu(&p, 32, vec![3, 17, 5, 9, 1, 22], exact);
            eprintln!(
                "{dt:?}: largest logit difference {worst:.2e} (relative to the largest logit)"
            );
            assert!(worst < tol, "{dt:?}: logits differ by {worst} (relative)");
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    /// The same for a Qwen3.5 (three Gated DeltaNets, then gated attention over a quarter of
    /// each head): a 70-token prompt (a whole chunk of the delta rule, then six tokens by the
    /// recurrence), then decode. The CPU backend's Gated DeltaNet steps sum in lanes, in
    /// products of small matrices, with the polynomial `exp` (`kernels/delta_net_fast.rs`), so
    /// the two differ by more rounding than in a Qwen3 (1.0e-5 measured in f32).
    #[test]
    fn the_cpu_backend_computes_the_plain_math_of_hybrid_layers() {
        for (dt, tol) in [(DType::F32, 2e-5), (DType::Bf16, 2e-5), (DType::Q8, 0.15)] {
            let d =
                std::env::temp_dir().join(format!("pq-plain-hybrid-{}-{dt:?}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("m.bin");
            let c = crate::format::ModelConfig {
                max_position_embeddings: 128,
                ..crate::testing::model::qwen3_5_config(dt)
            };
            write_random_config(&p, &c);
            let prompt = (0..70).map(|i| (i * 7 + 3) % 40).collect();
            let worst = plain_against_cpu(&p, 96, prompt, dt != DType::Q8);
            eprintln!("{dt:?} hybrid: largest logit difference {worst:.2e} (relative)");
            assert!(worst < tol, "{dt:?}: logits differ by {worst} (relative)");
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    /// The model at `path` on the plain and the CPU backend: `prompt` in one pass, then five
    /// greedy tokens one at a time (the plain backend's choices), the same greedy choice on both
    /// when `same_greedy`. Returns the largest logit difference relative to the largest logit.
    fn plain_against_cpu(
        path: &std::path::Path,
        ctx: usize,
        prompt: Vec<u32>,
        same_greedy: bool,
    ) -> f32 {
        let f = ModelFile::open(path).unwrap();
        let model = Model::load(&f).unwrap();
        let (plain, cpu) = (PlainBackend::new(), CpuBackend::new());
        let mut a = Session::new(&plain, &model, ctx, KvType::F32).unwrap();
        let mut b = Session::new(&cpu, &model, ctx, KvType::F32).unwrap();
        let mut tokens = prompt;
        let mut worst = 0.0f32;
        for step in 0..6 {
            let (la, lb) = (
                a.forward(&tokens).unwrap().to_vec(),
                b.forward(&tokens).unwrap().to_vec(),
            );
            let scale = la.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (x, y) in la.iter().zip(&lb) {
                worst = worst.max((x - y).abs() / scale.max(1.0));
            }
            let next = crate::sampler::argmax(&la) as u32;
            if same_greedy {
                assert_eq!(next, crate::sampler::argmax(&lb) as u32, "step {step}");
            }
            tokens = vec![next];
        }
        worst
    }

    /// The same for a Qwen3-MoE with YaRN (a dense layer between two sparse ones): the fast
    /// backend's grouped experts against the plain loops, prefill and decode. (Against
    /// transformers: qwen3-cli/tests/parity.rs.)
    #[test]
    fn the_cpu_backend_computes_the_plain_math_of_experts() {
        // q8: the CPU's W8A8 against the plain W8A32 differs by 0.06 here with every expert
        // chosen (three layers), and choosing 2 of 8 moves a token's output further where its
        // router scores two experts alike: a loose bound that still catches a wrong expert.
        for (dt, tol) in [(DType::F32, 1e-5), (DType::Bf16, 1e-5), (DType::Q8, 0.15)] {
            let d =
                std::env::temp_dir().join(format!("pq-plain-moe-{}-{dt:?}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("m.bin");
            write_random_config(&p, &moe_config(dt));
            // 20 prompt tokens: beyond YaRN's 16 original positions, and every expert chosen.
            let prompt = (0..20).map(|i| (i * 7 + 3) % 40).collect();
            let worst = plain_against_cpu(&p, 48, prompt, dt != DType::Q8);
            eprintln!("{dt:?} experts: largest logit difference {worst:.2e} (relative)");
            assert!(worst < tol, "{dt:?}: logits differ by {worst} (relative)");
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    /// The gated norm composed of other ops (the default for a backend without it) gives the
    /// fused form's values: on the CPU backend bit for bit (the same norm and `silu`, one
    /// product's factors swapped); on the plain one within an ulp or two, its `silu_mul` dividing
    /// by `1 + exp(-g)` where its fused norm multiplies by the reciprocal.
    #[test]
    fn the_composed_gated_norm_is_the_fused_one() {
        fn both<'a, B: Backend<Buf = Vec<f32>, Tensor = TensorView<'a>>>(
            b: &B,
            gain: &TensorView<'a>,
            o: &[f32],
            z: &Vec<f32>,
            rows: usize,
        ) -> (Vec<f32>, Vec<f32>) {
            let n = o.len() / rows;
            let (mut fused, mut composed) = (o.to_vec(), o.to_vec());
            b.gated_rmsnorm(&mut fused, z, gain, rows, n, 1e-6).unwrap();
            super::super::gated_rmsnorm_composed(b, &mut composed, z, gain, rows, n, 1e-6).unwrap();
            assert_ne!(fused, o, "the norm changed nothing");
            (fused, composed)
        }
        let (rows, n) = (3, 16);
        let mut seed = 5;
        let mut rand = |k: usize, scale: f32| -> Vec<f32> {
            (0..k)
                .map(|_| crate::testing::lcg(&mut seed) * scale)
                .collect()
        };
        let (o, z, w) = (rand(rows * n, 3.0), rand(rows * n, 4.0), rand(n, 2.0));
        let shape = [n as u64];
        let gain = TensorView {
            name: "norm",
            shape: &shape,
            data: TensorData::from_f32(&w),
            interleaved: None,
        };
        let (fused, composed) = both(&PlainBackend::new(), &gain, &o, &z, rows);
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
            assert!((f - c).abs() <= 1e-6 * f.abs().max(1.0), "{i}: {f} vs {c}");
        }
        let (fused, composed) = both(&CpuBackend::new(), &gain, &o, &z, rows);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&composed));
    }
}
