//! Causal grouped-query attention over the KV cache, as HF's `eager_attention_forward` computes it:
//! `softmax(q k^T * head_dim^-0.5 + causal_mask) v`, softmax in f32.
//!
//! Grouped-query attention (Ainslie et al. 2023): `n_heads` query heads share `n_kv_heads` key and
//! value heads; query head `h` reads kv head `h / (n_heads / n_kv_heads)` (HF's `repeat_kv`
//! repeats each kv head that many times, consecutively).

use super::dot::dots;
use rayon::prelude::*;

/// The sizes attention needs.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions one kv head holds in the cache (its stride, in rows of `head_dim`).
    pub context_len: usize,
}

/// Attention for `t` query tokens at positions `start_pos .. start_pos + t`.
///
/// - `q`, `out`: `[t, n_heads, head_dim]`
/// - `k_cache`, `v_cache`: one layer's cache, `[n_kv_heads, context_len, head_dim]`, already
///   holding the keys and values of positions `0 .. start_pos + t` (these tokens included)
/// - `scores`: scratch, `[n_heads, context_len]`
///
/// Query `i` sees cache positions `0 ..= start_pos + i` (the causal mask: never a later token).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    out: &mut [f32],
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    s: AttentionShape,
    start_pos: usize,
    t: usize,
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let width = s.n_heads * hd;
    assert_eq!(q.len(), t * width);
    assert_eq!(out.len(), t * width);
    assert!(start_pos + t <= s.context_len);
    assert_eq!(scores.len(), s.n_heads * s.context_len);
    let scale = (hd as f32).powf(-0.5);
    let dot = dots().f32;
    for i in 0..t {
        let n_keys = start_pos + i + 1;
        let q_row = &q[i * width..(i + 1) * width];
        out[i * width..(i + 1) * width]
            .par_chunks_mut(hd)
            .zip(scores.par_chunks_mut(s.context_len))
            .enumerate()
            .for_each(|(h, (out_h, scores_h))| {
                let q_h = &q_row[h * hd..(h + 1) * hd];
                let kv = (h / group) * s.context_len * hd;
                let keys = &k_cache[kv..kv + n_keys * hd];
                let values = &v_cache[kv..kv + n_keys * hd];
                // 1. scores[j] = (q . k_j) * head_dim^-0.5      scores: [n_keys]
                let scores_h = &mut scores_h[..n_keys];
                for (sc, k) in scores_h.iter_mut().zip(keys.chunks_exact(hd)) {
                    *sc = dot(q_h, k) * scale;
                }
                // 2. softmax, subtracting the max so exp never overflows.
                let max = scores_h.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let mut sum = 0f32;
                for sc in scores_h.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                let inv = 1.0 / sum;
                // 3. out = sum_j p_j v_j                        out: [head_dim]
                out_h.fill(0.0);
                for (&p, v) in scores_h.iter().zip(values.chunks_exact(hd)) {
                    let p = p * inv;
                    for (o, &vv) in out_h.iter_mut().zip(v) {
                        *o += p * vv;
                    }
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Textbook attention in f64: per query head, the full softmax over keys 0..=pos of its kv
    /// head (found by repeating kv heads as HF's repeat_kv does).
    #[test]
    fn matches_naive_softmax_attention() {
        let s = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            context_len: 10,
        };
        let mut seed = 3;
        let kv_len = s.n_kv_heads * s.context_len * s.head_dim;
        let k: Vec<f32> = (0..kv_len).map(|_| lcg(&mut seed) * 2.0).collect();
        let v: Vec<f32> = (0..kv_len).map(|_| lcg(&mut seed)).collect();
        let (start, t) = (4, 3);
        let width = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..t * width).map(|_| lcg(&mut seed) * 2.0).collect();
        let mut out = vec![0f32; t * width];
        let mut scores = vec![0f32; s.n_heads * s.context_len];
        attention(&mut out, &q, &k, &v, &mut scores, s, start, t);

        let hd = s.head_dim;
        for i in 0..t {
            let pos = start + i;
            for h in 0..s.n_heads {
                // repeat_kv: kv head for query head h.
                let kvh = h * s.n_kv_heads / s.n_heads;
                let key = |j: usize, c: usize| k[(kvh * s.context_len + j) * hd + c] as f64;
                let val = |j: usize, c: usize| v[(kvh * s.context_len + j) * hd + c] as f64;
                let qv = |c: usize| q[i * width + h * hd + c] as f64;
                let logits: Vec<f64> = (0..=pos)
                    .map(|j| (0..hd).map(|c| qv(c) * key(j, c)).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let z: f64 = logits.iter().map(|l| l.exp()).sum();
                for c in 0..hd {
                    let want: f64 = (0..=pos).map(|j| logits[j].exp() / z * val(j, c)).sum();
                    let got = out[i * width + h * hd + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "token {i} head {h} [{c}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
