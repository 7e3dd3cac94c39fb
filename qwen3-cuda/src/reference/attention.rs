//! Reference of `kernels/attention.cu`.

use super::reduce::{block_max, block_sum, warp_sum};
use crate::kernels::ATTENTION_BLOCK_DIM;

/// The shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    /// Positions the cache holds (its first dimension).
    pub ctx: usize,
    /// Position of the first query token.
    pub pos0: usize,
}

/// `out = softmax(q k^T * scale, causal) v` per query head, GQA over kv heads.
/// q, out: [n_tok, n_heads, head_dim]; k_cache, v_cache: [ctx, n_kv, head_dim], holding keys and
/// values of positions 0 .. pos0 + n_tok. The order of every sum follows the kernel (128 threads,
/// 4 warps: key j goes to warp j % 4; softmax sums strided by thread; values summed in key order).
pub fn attention(out: &mut [f32], q: &[f32], k_cache: &[f32], v_cache: &[f32], s: AttentionShape) {
    let AttentionShape {
        n_heads,
        n_kv,
        head_dim: hd,
        ctx,
        pos0,
    } = s;
    let threads = ATTENTION_BLOCK_DIM;
    let scale = (hd as f64).powf(-0.5) as f32;
    let n_tok = q.len() / (n_heads * hd);
    assert!(pos0 + n_tok <= ctx);
    let mut scores = vec![0.0f32; ctx];
    let mut per_thread = vec![0.0f32; threads];
    for t in 0..n_tok {
        let n_keys = pos0 + t + 1;
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv);
            let qh = &q[(t * n_heads + h) * hd..][..hd];
            // 1. scores: lane-strided fma over head_dim, butterfly sum, times scale
            for (j, sj) in scores.iter_mut().enumerate().take(n_keys) {
                let kj = &k_cache[(j * n_kv + kvh) * hd..][..hd];
                let mut lanes = [0.0f32; 32];
                for (lane, l) in lanes.iter_mut().enumerate() {
                    for i in (lane..hd).step_by(32) {
                        *l = qh[i].mul_add(kj[i], *l);
                    }
                }
                *sj = warp_sum(&lanes) * scale;
            }
            // 2. softmax: thread-strided max and sum, then exp / sum
            for (tid, m) in per_thread.iter_mut().enumerate() {
                *m = scores[..n_keys]
                    .iter()
                    .skip(tid)
                    .step_by(threads)
                    .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            }
            let m = block_max(&per_thread);
            for (tid, acc) in per_thread.iter_mut().enumerate() {
                *acc = 0.0;
                for j in (tid..n_keys).step_by(threads) {
                    let e = (scores[j] - m).exp();
                    scores[j] = e;
                    *acc += e;
                }
            }
            let sum = block_sum(&per_thread);
            for sj in &mut scores[..n_keys] {
                *sj /= sum;
            }
            // 3. out[i] = sum over keys in order of prob[j] * v[j, i]
            let oh = &mut out[(t * n_heads + h) * hd..][..hd];
            for (i, o) in oh.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for (j, &p) in scores[..n_keys].iter().enumerate() {
                    acc = p.mul_add(v_cache[(j * n_kv + kvh) * hd + i], acc);
                }
                *o = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::test_values;

    /// Attention in f64, HF style: repeat_kv, scores with -inf above the diagonal, softmax, @ v.
    fn naive(q: &[f32], k: &[f32], v: &[f32], s: AttentionShape) -> Vec<f64> {
        let hd = s.head_dim;
        let n_tok = q.len() / (s.n_heads * hd);
        let mut out = vec![0.0; q.len()];
        for t in 0..n_tok {
            for h in 0..s.n_heads {
                let kvh = h * s.n_kv / s.n_heads;
                let qh = &q[(t * s.n_heads + h) * hd..][..hd];
                let sc: Vec<f64> = (0..s.ctx)
                    .map(|j| {
                        if j > s.pos0 + t {
                            return f64::NEG_INFINITY; // causal mask
                        }
                        let kj = &k[(j * s.n_kv + kvh) * hd..][..hd];
                        qh.iter()
                            .zip(kj)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hd {
                    out[(t * s.n_heads + h) * hd + i] = (0..s.ctx)
                        .map(|j| e[j] / z * v[(j * s.n_kv + kvh) * hd + i] as f64)
                        .sum();
                }
            }
        }
        out
    }

    /// GQA ratios 1, 2 and 4; prefill (several query tokens, causal) and decode (one token late in
    /// the context). The cache holds junk past the last position, which must never be read.
    #[test]
    fn matches_naive_f64() {
        for (n_heads, n_kv, n_tok, pos0) in
            [(4, 4, 5, 0), (4, 2, 1, 9), (8, 2, 3, 4), (16, 4, 6, 0)]
        {
            let (hd, ctx) = (64, 12);
            let s = AttentionShape {
                n_heads,
                n_kv,
                head_dim: hd,
                ctx,
                pos0,
            };
            let q: Vec<f32> = test_values(n_tok * n_heads * hd, 1)
                .iter()
                .map(|v| 3.0 * v)
                .collect();
            let mut k = test_values(ctx * n_kv * hd, 2);
            let mut v = test_values(ctx * n_kv * hd, 3);
            for x in k[(pos0 + n_tok) * n_kv * hd..]
                .iter_mut()
                .chain(&mut v[(pos0 + n_tok) * n_kv * hd..])
            {
                *x = 1e6; // beyond the causal horizon
            }
            let mut out = vec![0.0; q.len()];
            attention(&mut out, &q, &k, &v, s);
            let want = naive(
                &q,
                &k,
                &v,
                AttentionShape {
                    ctx: pos0 + n_tok,
                    ..s
                },
            );
            for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() < 1e-5, "{s:?} [{i}] {g} vs {w}");
            }
        }
    }
}
