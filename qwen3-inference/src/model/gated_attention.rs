//! Qwen3.5's gated attention in textbook loops: the softmax attention of every fourth Qwen3.5
//! and Qwen3.6 layer (and Qwen3-Next's), `Qwen3_5Attention` in transformers'
//! `models/qwen3_5/modeling_qwen3_5.py`.
//!
//! It is Qwen3's attention (`Qwen3Attention`: q/k norms per head, GQA, RoPE, a KV cache) with
//! three differences, which this file holds in plain f32 loops for one sequence, the oracle the
//! backends' versions are to be tested against (its test: transformers' outputs,
//! `fixtures/qwen3_5_layers/attention.json`):
//!
//! 1. **An output gate.** `q_proj` gives each head its query and, beside it, a gate of the same
//!    size (`[heads, 2, head_dim]`: the query first); the head's attention output is multiplied
//!    by `sigmoid(gate)` before `o_proj`. The gate lets a head write nothing, where softmax
//!    weights must sum to 1 and so always write something.
//! 2. **Partial rotary.** RoPE turns only the first `partial_rotary_factor` (a quarter) of each
//!    head's dimensions; the rest carry position-free content. transformers computes M-RoPE's
//!    cos and sin (three position components, for images); with text only the three are equal
//!    and M-RoPE is plain RoPE on those dimensions (the fixture's script checks it).
//! 3. **Zero-centred norms.** `Qwen3_5RMSNorm` scales by `1 + w` where Qwen3's scales by `w`
//!    (weights stored around 0). The q/k norms here, and the layers' input norms, take it.
//!
//! For token `t` at position `p` (`x: [hidden]`; `h` query heads, `kv` KV heads, `d` head_dim):
//!
//! ```text
//! 1. [q_i, gate_i] = q_proj x    per head i, [d] each;  k = k_proj x, v = v_proj x  [kv, d]
//! 2. q_i, k_j = rmsnorm(.) * (1 + w) per head
//! 3. RoPE at p on the first r = d * partial_rotary_factor dims of q_i and k_j (rotate_half)
//! 4. append k, v to the cache
//! 5. o_i = softmax(q_i . K_j / sqrt(d)) V_j over positions 0..=p, j = i / (h / kv)
//! 6. o_i = o_i * sigmoid(gate_i)
//! 7. out = o_proj [o_1 .. o_h]
//! ```

use crate::kernels::textbook::{dot, inv_rms, matvec, sigmoid};
use anyhow::{bail, Result};

/// The sizes and constants of a gated attention layer, from the config's keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatedAttentionConfig {
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_attention_heads`.
    pub num_heads: usize,
    /// `num_key_value_heads`: a divisor of the heads.
    pub num_kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub eps: f32,
    /// `rope_parameters.rope_theta`.
    pub rope_theta: f64,
    /// `head_dim * partial_rotary_factor`: the dimensions RoPE turns, even.
    pub rotary_dim: usize,
}

impl GatedAttentionConfig {
    /// Refuses sizes the layer cannot run.
    pub fn check(&self) -> Result<()> {
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_heads,
                self.num_kv_heads
            );
        }
        if !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            bail!(
                "the rotary dimensions ({}) must be even and at most head_dim ({})",
                self.rotary_dim,
                self.head_dim
            );
        }
        Ok(())
    }
}

/// The weights of one layer (`self_attn.*` in a checkpoint), row-major f32.
pub struct GatedAttention<'a> {
    pub config: GatedAttentionConfig,
    /// `q_proj.weight`: `[heads * 2 * head_dim, hidden]`, each head's query rows then its gate's.
    pub q_proj: &'a [f32],
    /// `k_proj.weight`: `[kv_heads * head_dim, hidden]`.
    pub k_proj: &'a [f32],
    /// `v_proj.weight`: `[kv_heads * head_dim, hidden]`.
    pub v_proj: &'a [f32],
    /// `o_proj.weight`: `[hidden, heads * head_dim]`.
    pub o_proj: &'a [f32],
    /// `q_norm.weight`: `[head_dim]`, zero-centred (the gain is `1 + w`).
    pub q_norm: &'a [f32],
    /// `k_norm.weight`: `[head_dim]`, zero-centred.
    pub k_norm: &'a [f32],
}

/// One sequence's keys and values for one layer: `[positions, kv_heads, head_dim]` each.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

impl GatedAttention<'_> {
    /// Checks that every weight has its shape's length.
    pub fn check(&self) -> Result<()> {
        let c = &self.config;
        c.check()?;
        let (h, d) = (c.hidden_size, c.head_dim);
        for (name, len, want) in [
            ("q_proj", self.q_proj.len(), c.num_heads * 2 * d * h),
            ("k_proj", self.k_proj.len(), c.num_kv_heads * d * h),
            ("v_proj", self.v_proj.len(), c.num_kv_heads * d * h),
            ("o_proj", self.o_proj.len(), h * c.num_heads * d),
            ("q_norm", self.q_norm.len(), d),
            ("k_norm", self.k_norm.len(), d),
        ] {
            if len != want {
                bail!("self_attn.{name}: {len} values, expected {want}");
            }
        }
        Ok(())
    }

    /// Runs the tokens `x: [t, hidden]` through the layer at the positions after those in
    /// `cache`, appending theirs; `out: [t, hidden]`.
    pub fn forward(&self, cache: &mut KvCache, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.check()?;
        let c = &self.config;
        let (hidden, d) = (c.hidden_size, c.head_dim);
        if !x.len().is_multiple_of(hidden) || out.len() != x.len() {
            bail!(
                "gated attention: input of {} and output of {} values for hidden size {hidden}",
                x.len(),
                out.len()
            );
        }
        let kv_width = c.num_kv_heads * d;
        for (x, out) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
            let p = cache.keys.len() / kv_width;

            // 1. Projections: each head's query and gate side by side.
            let qg = matvec(self.q_proj, x);
            let mut k = matvec(self.k_proj, x);
            let v = matvec(self.v_proj, x);
            let mut q: Vec<f32> = qg
                .chunks_exact(2 * d)
                .flat_map(|h| h[..d].to_vec())
                .collect();
            let gate: Vec<f32> = qg
                .chunks_exact(2 * d)
                .flat_map(|h| h[d..].to_vec())
                .collect();

            // 2-3. Zero-centred RMSNorm per head, then RoPE on the rotary dimensions.
            for qh in q.chunks_exact_mut(d) {
                rmsnorm_1p(qh, self.q_norm, c.eps);
                rope(qh, p, c);
            }
            for kh in k.chunks_exact_mut(d) {
                rmsnorm_1p(kh, self.k_norm, c.eps);
                rope(kh, p, c);
            }

            // 4. The cache grows by this position.
            cache.keys.extend_from_slice(&k);
            cache.values.extend_from_slice(&v);

            // 5-6. Each head's softmax over positions 0..=p, then its gate.
            let group = c.num_heads / c.num_kv_heads;
            let mut o = vec![0.0f32; c.num_heads * d];
            for (i, (oh, qh)) in o.chunks_exact_mut(d).zip(q.chunks_exact(d)).enumerate() {
                let j = i / group;
                let at = |pos: usize| pos * kv_width + j * d;
                let scale = 1.0 / (d as f32).sqrt();
                let scores: Vec<f32> = (0..=p)
                    .map(|pos| dot(qh, &cache.keys[at(pos)..at(pos) + d]) * scale)
                    .collect();
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                for (pos, w) in weights.iter().enumerate() {
                    for (o, &v) in oh.iter_mut().zip(&cache.values[at(pos)..at(pos) + d]) {
                        *o += (w / total) * v;
                    }
                }
                for (o, &g) in oh.iter_mut().zip(&gate[i * d..(i + 1) * d]) {
                    *o *= sigmoid(g);
                }
            }

            // 7. Back to the residual stream.
            out.copy_from_slice(&matvec(self.o_proj, &o));
        }
        Ok(())
    }
}

/// `Qwen3_5RMSNorm`: `x / sqrt(mean(x^2) + eps) * (1 + w)`.
fn rmsnorm_1p(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = inv_rms(x, eps);
    for (v, &w) in x.iter_mut().zip(w) {
        *v = *v * inv * (1.0 + w);
    }
}

/// RoPE at position `p` on the first `rotary_dim` dimensions of a head, in rotate_half's
/// pairing (dimension `j` with `j + r / 2`, frequency `theta^(-2j / r)`); the others unchanged.
fn rope(x: &mut [f32], p: usize, c: &GatedAttentionConfig) {
    let half = c.rotary_dim / 2;
    for j in 0..half {
        // transformers computes the frequencies and angles in f32.
        let inv_freq = 1.0 / (c.rope_theta as f32).powf((2 * j) as f32 / c.rotary_dim as f32);
        let angle = p as f32 * inv_freq;
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (x[j], x[j + half]);
        x[j] = a * cos - b * sin;
        x[j + half] = b * cos + a * sin;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::reference_json::{floats, max_rel_diff, read};

    /// The 70-token prompt in one call and 3 decoded tokens one call each give transformers'
    /// outputs (its prompt in one call with a causal mask, its decode against its cache).
    #[test]
    fn matches_transformers() {
        let r = read("qwen3_5_layers/attention.json");
        let cfg = &r["config"];
        let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
        let head_dim = n("head_dim");
        let c = GatedAttentionConfig {
            hidden_size: n("hidden_size"),
            num_heads: n("num_attention_heads"),
            num_kv_heads: n("num_key_value_heads"),
            head_dim,
            eps: cfg["rms_norm_eps"].as_f64().unwrap() as f32,
            rope_theta: cfg["rope_theta"].as_f64().unwrap(),
            rotary_dim: (head_dim as f64 * cfg["partial_rotary_factor"].as_f64().unwrap()) as usize,
        };
        let w = |name: &str| floats(&r["weights"][name]["values"]);
        let weights = [
            "q_proj.weight",
            "k_proj.weight",
            "v_proj.weight",
            "o_proj.weight",
            "q_norm.weight",
            "k_norm.weight",
        ]
        .map(w);
        let layer = GatedAttention {
            config: c,
            q_proj: &weights[0],
            k_proj: &weights[1],
            v_proj: &weights[2],
            o_proj: &weights[3],
            q_norm: &weights[4],
            k_norm: &weights[5],
        };
        let (x, want) = (floats(&r["input"]), floats(&r["output"]));
        let (h, prompt) = (c.hidden_size, r["prompt_tokens"].as_u64().unwrap() as usize);
        let mut cache = KvCache::default();
        let mut out = vec![f32::NAN; x.len()];
        layer
            .forward(&mut cache, &x[..prompt * h], &mut out[..prompt * h])
            .unwrap();
        for t in prompt..x.len() / h {
            let (x_t, out_t) = (&x[t * h..(t + 1) * h], &mut out[t * h..(t + 1) * h]);
            layer.forward(&mut cache, x_t, out_t).unwrap();
        }
        let d = max_rel_diff(&out, &want);
        assert!(d < 1e-5, "outputs: {d}");

        // The test can fail: RoPE on every dimension moves the outputs.
        let full = GatedAttention {
            config: GatedAttentionConfig {
                rotary_dim: head_dim,
                ..c
            },
            ..layer
        };
        let mut other = vec![0.0; x.len()];
        full.forward(&mut KvCache::default(), &x, &mut other)
            .unwrap();
        assert!(max_rel_diff(&other, &want) > 1e-2);
    }

    /// Sizes that do not fit are errors that name them.
    #[test]
    fn bad_sizes_are_errors() {
        let c = GatedAttentionConfig {
            hidden_size: 8,
            num_heads: 3,
            num_kv_heads: 2,
            head_dim: 4,
            eps: 1e-6,
            rope_theta: 1e4,
            rotary_dim: 2,
        };
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("multiple of num_key_value_heads"), "{e}");
        let e = GatedAttentionConfig {
            num_heads: 4,
            rotary_dim: 3,
            ..c
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("must be even"), "{e}");
    }
}
