//! The gated delta rule, step 5 of a Gated DeltaNet layer (`gated_delta_net.rs`), for one value
//! head over a run of tokens: token by token ([`recurrent`], what decode runs) and in chunks as
//! products of matrices ([`chunked`], what a prompt runs). transformers has both
//! (`torch_recurrent_gated_delta_rule`, `torch_chunk_gated_delta_rule` in
//! `models/qwen3_5/modeling_qwen3_5.py`), and so does flash-linear-attention, whose chunked form
//! theirs follows.
//!
//! ## The recurrence
//!
//! The head's memory `S: [dk, dv]` maps keys to values. Token `t` (unit-length `q_t`, `k_t` of
//! `dk`, `v_t` of `dv`, decay `g_t < 0`, write strength `beta_t` in (0, 1)):
//!
//! ```text
//! S   = exp(g_t) S                          forget
//! u_t = beta_t (v_t - S^T k_t)              the correction: what S gets wrong about k_t
//! S   = S + k_t u_t^T                       write it
//! o_t = S^T q_t                             read
//! ```
//!
//! ## The same in chunks
//!
//! One token at a time, a prompt is a loop of thin vector steps. The chunked form gets the same
//! numbers from matrix products over chunks of `C` tokens (64), the state touched once a chunk.
//! Within a chunk, with `G_i = g_1 + .. + g_i` (the log of the decay from the chunk's start to
//! token `i`) and `S0` the state at its start, unrolling the recurrence gives each token's
//! correction in terms of the earlier ones':
//!
//! ```text
//! u_i = beta_i (v_i - exp(G_i) S0^T k_i - sum_{j<i} exp(G_i - G_j) (k_j . k_i) u_j)
//! ```
//!
//! a lower-triangular system `(I + A) U = B`, with `A[i, j] = beta_i (k_i . k_j) exp(G_i - G_j)`
//! for `j < i`, solved by forward substitution. Its right-hand side is linear in `S0`, so the
//! solve is done once for `beta_i v_i` (giving `U0`) and once for `beta_i exp(G_i) k_i` (giving
//! `W`), and `U = U0 - W S0`. Then
//!
//! ```text
//! o_i = exp(G_i) S0^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) u_j
//! S   = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j u_j^T
//! ```
//!
//! Every step is exact algebra; only the order of the f32 additions differs from the recurrence,
//! so the two agree to rounding (the tests: 1e-5 of the largest output over 150 tokens).

use super::textbook::dot;

/// Tokens a chunk of [`chunked`] (transformers' and flash-linear-attention's `chunk_size`).
pub const CHUNK: usize = 64;

/// One value head's inputs over `t` tokens: `q`, `k: [t, dk]` (unit length, `q` scaled by
/// `1 / sqrt(dk)`), `v: [t, dv]`, and per token the decay's log `g` and the write strength
/// `beta`.
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl HeadInputs<'_> {
    fn tokens(&self) -> usize {
        self.g.len()
    }
}

/// The recurrence, token by token: `s: [dk, dv]` the state, in and out; `o: [t, dv]`.
pub fn recurrent(h: &HeadInputs, s: &mut [f32], o: &mut [f32]) {
    let t = h.tokens();
    let (dk, dv) = (h.q.len() / t, h.v.len() / t);
    for i in 0..t {
        let (q, k, v) = (
            &h.q[i * dk..(i + 1) * dk],
            &h.k[i * dk..(i + 1) * dk],
            &h.v[i * dv..(i + 1) * dv],
        );
        // Forget.
        let decay = h.g[i].exp();
        s.iter_mut().for_each(|x| *x *= decay);
        // u = beta (v - S^T k)
        let mut u = v.to_vec();
        for (a, &ka) in k.iter().enumerate() {
            for (u, &sab) in u.iter_mut().zip(&s[a * dv..(a + 1) * dv]) {
                *u -= sab * ka;
            }
        }
        u.iter_mut().for_each(|u| *u *= h.beta[i]);
        // S += k u^T, then o = S^T q.
        let o = &mut o[i * dv..(i + 1) * dv];
        o.fill(0.0);
        for (a, (&ka, &qa)) in k.iter().zip(q).enumerate() {
            let row = &mut s[a * dv..(a + 1) * dv];
            for ((sab, &ub), o) in row.iter_mut().zip(&u).zip(o.iter_mut()) {
                *sab += ka * ub;
                *o += *sab * qa;
            }
        }
    }
}

/// The chunked form (the module's text), chunks of `chunk` tokens: `s: [dk, dv]` the state, in
/// and out; `o: [t, dv]`.
pub fn chunked(h: &HeadInputs, s: &mut [f32], o: &mut [f32], chunk: usize) {
    let t = h.tokens();
    let (dk, dv) = (h.q.len() / t, h.v.len() / t);
    for c0 in (0..t).step_by(chunk) {
        let n = chunk.min(t - c0);
        let q = |i: usize| &h.q[(c0 + i) * dk..(c0 + i + 1) * dk];
        let k = |i: usize| &h.k[(c0 + i) * dk..(c0 + i + 1) * dk];
        let v = |i: usize| &h.v[(c0 + i) * dv..(c0 + i + 1) * dv];
        let beta = &h.beta[c0..c0 + n];
        // G_i: the decay's log from the chunk's start to token i.
        let cum: Vec<f32> = h.g[c0..c0 + n]
            .iter()
            .scan(0.0f32, |acc, &g| {
                *acc += g;
                Some(*acc)
            })
            .collect();

        // (I + A) U0 = beta v and (I + A) W = beta exp(G) k, A strictly lower-triangular, by
        // forward substitution: row i takes away A[i, j] times the rows j < i already solved.
        let mut u0 = vec![0.0f32; n * dv];
        let mut w = vec![0.0f32; n * dk];
        for i in 0..n {
            for (x, &vi) in u0[i * dv..(i + 1) * dv].iter_mut().zip(v(i)) {
                *x = beta[i] * vi;
            }
            let e = cum[i].exp();
            for (x, &ki) in w[i * dk..(i + 1) * dk].iter_mut().zip(k(i)) {
                *x = beta[i] * e * ki;
            }
            for j in 0..i {
                let a = beta[i] * dot(k(i), k(j)) * (cum[i] - cum[j]).exp();
                let (done, row) = u0.split_at_mut(i * dv);
                for (x, &y) in row[..dv].iter_mut().zip(&done[j * dv..(j + 1) * dv]) {
                    *x -= a * y;
                }
                let (done, row) = w.split_at_mut(i * dk);
                for (x, &y) in row[..dk].iter_mut().zip(&done[j * dk..(j + 1) * dk]) {
                    *x -= a * y;
                }
            }
        }

        // U = U0 - W S0: the corrections, now that the state at the chunk's start is known.
        let mut u = u0;
        for i in 0..n {
            for (a, &wa) in w[i * dk..(i + 1) * dk].iter().enumerate() {
                for (x, &sab) in u[i * dv..(i + 1) * dv]
                    .iter_mut()
                    .zip(&s[a * dv..(a + 1) * dv])
                {
                    *x -= wa * sab;
                }
            }
        }

        // o_i = exp(G_i) S0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) u_j
        for i in 0..n {
            let o_i = &mut o[(c0 + i) * dv..(c0 + i + 1) * dv];
            o_i.fill(0.0);
            let e = cum[i].exp();
            for (a, &qa) in q(i).iter().enumerate() {
                for (x, &sab) in o_i.iter_mut().zip(&s[a * dv..(a + 1) * dv]) {
                    *x += e * qa * sab;
                }
            }
            for j in 0..=i {
                let a = dot(q(i), k(j)) * (cum[i] - cum[j]).exp();
                for (x, &y) in o_i.iter_mut().zip(&u[j * dv..(j + 1) * dv]) {
                    *x += a * y;
                }
            }
        }

        // S = exp(G_n) S0 + sum_j exp(G_n - G_j) k_j u_j^T
        let last = cum[n - 1];
        let e = last.exp();
        s.iter_mut().for_each(|x| *x *= e);
        for j in 0..n {
            let f = (last - cum[j]).exp();
            for (a, &ka) in k(j).iter().enumerate() {
                for (x, &y) in s[a * dv..(a + 1) * dv]
                    .iter_mut()
                    .zip(&u[j * dv..(j + 1) * dv])
                {
                    *x += f * ka * y;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::next_values;

    /// Random unit-length keys and queries, decays and strengths of a trained layer's range.
    fn inputs(t: usize, dk: usize, dv: usize, seed: &mut u64) -> [Vec<f32>; 5] {
        let unit = |v: Vec<f32>| -> Vec<f32> {
            v.chunks_exact(dk)
                .flat_map(|r| {
                    let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
                    r.iter().map(move |x| x / n).collect::<Vec<_>>()
                })
                .collect()
        };
        let q = unit(next_values(t * dk, seed))
            .iter()
            .map(|x| x / (dk as f32).sqrt())
            .collect();
        let k = unit(next_values(t * dk, seed));
        let v = next_values(t * dv, seed);
        // g in (-2, 0), beta in (0, 1).
        let g = next_values(t, seed)
            .iter()
            .map(|x| -(x.abs() * 2.0))
            .collect();
        let beta = next_values(t, seed)
            .iter()
            .map(|x| 0.5 + 0.49 * x.clamp(-1.0, 1.0))
            .collect();
        [q, k, v, g, beta]
    }

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
            / scale
    }

    /// The chunked form equals the recurrence, outputs and final state, over several chunks and
    /// a last partial one, from a non-zero state, for chunks of 64 and of 7.
    #[test]
    fn chunked_equals_the_recurrence() {
        let mut seed = 3;
        let (t, dk, dv) = (150, 16, 8);
        let [q, k, v, g, beta] = inputs(t, dk, dv, &mut seed);
        let h = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let s0 = next_values(dk * dv, &mut seed);
        let (mut s_rec, mut o_rec) = (s0.clone(), vec![f32::NAN; t * dv]);
        recurrent(&h, &mut s_rec, &mut o_rec);
        for chunk in [CHUNK, 7] {
            let (mut s, mut o) = (s0.clone(), vec![f32::NAN; t * dv]);
            chunked(&h, &mut s, &mut o, chunk);
            assert!(
                max_rel(&o, &o_rec) < 1e-5,
                "{chunk}: outputs {}",
                max_rel(&o, &o_rec)
            );
            assert!(
                max_rel(&s, &s_rec) < 1e-5,
                "{chunk}: state {}",
                max_rel(&s, &s_rec)
            );
        }
        // The state matters (the test can fail).
        let (mut s, mut o) = (vec![0.0; dk * dv], vec![0.0; t * dv]);
        chunked(&h, &mut s, &mut o, CHUNK);
        assert!(max_rel(&o, &o_rec) > 1e-3);
    }
}
