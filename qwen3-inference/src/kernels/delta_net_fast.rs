//! The CPU backend's Gated DeltaNet steps: the math of `delta_net.rs` and `delta_rule.rs` (which
//! explain it, and which the plain backend runs), laid out for speed:
//!
//! - every loop runs along a row of values (a state row, a token's channels), so it vectorizes,
//!   and is compiled once per instruction set (`vectorized!`);
//! - sums are kept in lanes (`lanes.rs`), SiLU and the sigmoid take the vectorizable `exp`;
//! - the value heads run in parallel: on rayon's threads for a prompt, as parts of a job of the
//!   decode team for one token (`team.rs`);
//! - a prompt's buffers are made once per call and head, not per token or per chunk; a decode
//!   step makes none (each thread of the decode team keeps its scratch).
//!
//! The tokens take the same form as in the textbook version (whole aligned chunks chunked, the
//! rest recurrent: [`runs_by_form`]), so what the engine promises of them (batch invariance,
//! prompts cut anywhere) holds here too. The recurrence does the textbook's operations in its
//! order; the chunked form and the elementwise steps round differently (sums in lanes, the
//! polynomial `exp`, the chunk's products in fused multiply-adds where the instruction set has
//! them: `vectorized!`'s `fused` arm), within f32's rounding of the textbook's (the tests below).

use super::delta_net::{decay_and_strength, l2norm, runs_by_form, DeltaNetShape};
use super::delta_rule::{HeadInputs, CHUNK};
use super::exp::exp;
use super::lanes::{sum_of_squares, LANES};
use super::team::Team;
use super::tile::{self, row_blocks};
use rayon::prelude::*;
use std::sync::{Mutex, PoisonError};

/// `x * sigmoid(x)` from the vectorizable `exp` (`elementwise.rs`'s `silu_mul` explains the
/// two sides).
#[inline(always)]
fn silu(v: f32) -> f32 {
    v * sigmoid_fast(v)
}

/// `1 / (1 + e^-v)`, without overflow on either side.
#[inline(always)]
fn sigmoid_fast(v: f32) -> f32 {
    let e = exp(-v.abs());
    (if v >= 0.0 { 1.0 } else { e }) / (1.0 + e)
}

/// Values of a decode step's scratch kept on the stack: `q`, `k` (`dk` each), `u` and the head's
/// output (`dv` each) of every Qwen3.5 and Qwen3-Next head (128 each: 512 values) fit.
const SCRATCH_ON_STACK: usize = 1024;

thread_local! {
    /// A decode step's scratch where it does not fit [`SCRATCH_ON_STACK`], kept by each thread
    /// of the decode team between tokens.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `n` values of scratch: on the stack where they fit, so that no member of the
/// decode team allocates whichever parts it takes first (a member that was busy elsewhere for
/// the first tokens takes its first part later; a buffer of its thread would grow then).
fn with_scratch(n: usize, f: impl FnOnce(&mut [f32])) {
    if n <= SCRATCH_ON_STACK {
        let mut work = [0f32; SCRATCH_ON_STACK];
        return f(&mut work[..n]);
    }
    SCRATCH.with(|cell| {
        let mut work = cell.borrow_mut();
        work.resize(n, 0.0);
        f(&mut work)
    })
}

/// `y += a x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

vectorized! {
    /// [`super::delta_net::causal_conv_silu`]'s step for `x: [n, conv_dim]`, from `hist`: the
    /// last `K - 1` inputs and then this call's, `[K - 1 + n, conv_dim]`, and the filters by
    /// tap, `taps: [K, conv_dim]`.
    fn conv_rows(x: &mut [f32], hist: &[f32], taps: &[f32], k: usize) {
        let cd = taps.len() / k;
        for (t, y) in x.chunks_exact_mut(cd).enumerate() {
            // y = w[K-1] x_t + sum_j w[j] x_(t-K+1+j), in the textbook's order.
            let (newest, last) = (&hist[(t + k - 1) * cd..][..cd], &taps[(k - 1) * cd..][..cd]);
            for ((y, &v), &w) in y.iter_mut().zip(newest).zip(last) {
                *y = w * v;
            }
            for j in 0..k - 1 {
                let (p, w) = (&hist[(t + j) * cd..][..cd], &taps[j * cd..][..cd]);
                for ((y, &p), &w) in y.iter_mut().zip(p).zip(w) {
                    *y += w * p;
                }
            }
            y.iter_mut().for_each(|v| *v = silu(*v));
        }
    }
}

/// [`causal_conv_silu`] for one token, channel by channel in the window's own layout
/// (`[conv_dim, K - 1]`, filters `[conv_dim, K]`): the same operations in the same order as
/// [`conv_rows`], with nothing to lay out (a token is `K * conv_dim` multiply-adds), so a
/// decode step allocates nothing.
fn conv_one(x: &mut [f32], window: &mut [f32], w: &[f32], k: usize) {
    for ((y, win), taps) in x
        .iter_mut()
        .zip(window.chunks_exact_mut(k - 1))
        .zip(w.chunks_exact(k))
    {
        let input = *y;
        let mut acc = taps[k - 1] * input;
        for (&p, &wj) in win.iter().zip(taps) {
            acc += wj * p;
        }
        // The window moves along one input.
        win.copy_within(1.., 0);
        win[k - 2] = input;
        *y = silu(acc);
    }
}

/// Step 2: [`super::delta_net::causal_conv_silu`], channels side by side.
pub fn causal_conv_silu(x: &mut [f32], window: &mut [f32], w: &[f32], s: DeltaNetShape) {
    let (cd, k) = (s.conv_dim(), s.conv_kernel);
    let n = x.len() / cd;
    // (A kernel of 1 has no window: the general form below.)
    if n == 1 && k > 1 {
        return conv_one(x, window, w, k);
    }
    // The window is per channel ([conv_dim, K - 1]) and the filters too ([conv_dim, K]): turned
    // into rows by position and by tap, each step reads whole rows.
    let mut hist = vec![0f32; (k - 1 + n) * cd];
    let mut taps = vec![0f32; k * cd];
    for ch in 0..cd {
        for j in 0..k - 1 {
            hist[j * cd + ch] = window[ch * (k - 1) + j];
        }
        for j in 0..k {
            taps[j * cd + ch] = w[ch * k + j];
        }
    }
    hist[(k - 1) * cd..].copy_from_slice(x);
    conv_rows(x, &hist, &taps, k);
    // The window moves along: the last K - 1 inputs.
    for ch in 0..cd {
        for j in 0..k - 1 {
            window[ch * (k - 1) + j] = hist[(n + j) * cd + ch];
        }
    }
}

vectorized! {
    /// [`super::delta_net::gated_rmsnorm`]: `o = (w * (o / rms(o))) * silu(z)` by rows of `dv`.
    pub fn gated_rmsnorm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
        let dv = w.len();
        for (oh, zh) in o.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            let inv = 1.0 / (sum_of_squares(oh) / dv as f32 + eps).sqrt();
            for ((x, &wi), &zi) in oh.iter_mut().zip(w).zip(zh) {
                *x = wi * (*x * inv) * silu(zi);
            }
        }
    }
}

vectorized! {
    /// The attention output's gate: `x[i] *= sigmoid(gate[i])`.
    pub fn sigmoid_mul(x: &mut [f32], gate: &[f32]) {
        for (x, &g) in x.iter_mut().zip(gate) {
            *x *= sigmoid_fast(g);
        }
    }
}

vectorized! {
    /// One token of the recurrence for one value head (`delta_rule::recurrent`, the same
    /// operations in the same order): `s: [dk, dv]`, `o: [dv]`, `u: [dv]` scratch, `h` one
    /// token's inputs.
    fn step(s: &mut [f32], o: &mut [f32], u: &mut [f32], h: &HeadInputs<'_>) {
        let (q, k, v, g, beta) = (h.q, h.k, h.v, h.g[0], h.beta[0]);
        let dv = v.len();
        let decay = g.exp();
        // Forget and read what the memory holds for k, row by row: u = v - (e^g S)^T k.
        u.copy_from_slice(v);
        for (row, &ka) in s.chunks_exact_mut(dv).zip(k) {
            for (x, u) in row.iter_mut().zip(u.iter_mut()) {
                *x *= decay;
                *u -= *x * ka;
            }
        }
        u.iter_mut().for_each(|u| *u *= beta);
        // Write the correction and read for q: S += k u^T, o = S^T q.
        o.fill(0.0);
        for ((row, &ka), &qa) in s.chunks_exact_mut(dv).zip(k).zip(q) {
            for ((x, &ub), o) in row.iter_mut().zip(u.iter()).zip(o.iter_mut()) {
                *x += ka * ub;
                *o += *x * qa;
            }
        }
    }
}

/// `c[m, n] = a[m, kk] b[kk, n]`, or `c += a b` with `add`, all row-major: the small products
/// of the chunked form. Register tiles of 6 rows by [`LANES`] columns (`tile.rs`) are
/// summed over the whole of `kk`, so each value of `b` loaded serves all the tile's rows (a row
/// at a time, as `axpy`s, the loop waits on loads and stores instead of multiplying); each step
/// `madd::<F>`, one fused multiply-add in the AVX2 and AVX-512 versions (`KERNELS_BENCH=delta`,
/// one layer of Qwen3.5-0.8B's shape over 2048 tokens, Zen 4 VM: 154-163 to 127-138 ms with
/// AVX2's, 138-145 to 131-135 with AVX-512's; tiles of 6 rows instead of 4 left it level).
#[inline(always)]
fn gemm<const F: bool>(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    (m, kk, n): (usize, usize, usize),
    add: bool,
) {
    for (i, rows) in row_blocks(m) {
        let arows: [&[f32]; tile::ROWS] = std::array::from_fn(|r| match r < rows {
            true => &a[(i + r) * kk..][..kk],
            false => &[],
        });
        for j in (0..n).step_by(LANES) {
            let cols = LANES.min(n - j);
            // Row p of b from column j starts `n` values after row p - 1's.
            let mut put = |r: usize, sums: &[f32]| {
                let crow = &mut c[(i + r) * n + j..][..cols];
                for (x, &y) in crow.iter_mut().zip(sums) {
                    *x = if add { *x + y } else { y };
                }
            };
            match cols == LANES {
                true => tile::tile::<LANES, F>(&arows[..rows], &b[j..], n, |r, s| put(r, s)),
                false => tile::ragged::<LANES, F>(
                    (&a[i * kk..], kk, rows),
                    kk,
                    &b[j..],
                    n,
                    cols,
                    &mut put,
                ),
            }
        }
    }
}

/// `t[cols, rows] = x[rows, cols]^T`.
#[inline(always)]
fn transpose(t: &mut [f32], x: &[f32], rows: usize, cols: usize) {
    for (i, row) in x.chunks_exact(cols).take(rows).enumerate() {
        for (a, &v) in row.iter().enumerate() {
            t[a * rows + i] = v;
        }
    }
}

/// Scratch values [`chunk`] needs for `c` tokens.
fn chunk_work(c: usize, dk: usize, dv: usize) -> usize {
    c * (3 * dk + 2 * dv + 3 * c + 2)
}

vectorized! { fused<F>
    /// One whole chunk for one value head (`delta_rule::chunked` derives it), as products of
    /// small matrices: `s: [dk, dv]`, `o: [C, dv]`, `h` the chunk's inputs (`q`, `k: [C, dk]`,
    /// `v: [C, dv]`, `g`, `beta: [C]`); `work` holds [`chunk_work`] values.
    fn chunk(s: &mut [f32], o: &mut [f32], work: &mut [f32], h: &HeadInputs<'_>) {
        let (q, k, v, g, beta) = (h.q, h.k, h.v, h.g, h.beta);
        let c = g.len();
        let (dk, dv) = (k.len() / c, v.len() / c);
        let (kt, rest) = work.split_at_mut(dk * c);
        let (a, rest) = rest.split_at_mut(c * c);
        let (p, rest) = rest.split_at_mut(c * c);
        let (t, rest) = rest.split_at_mut(c * c);
        let (u, rest) = rest.split_at_mut(c * dv);
        let (bv, rest) = rest.split_at_mut(c * dv);
        let (w, rest) = rest.split_at_mut(c * dk);
        let (bk, rest) = rest.split_at_mut(c * dk);
        let (cum, rest) = rest.split_at_mut(c);
        let f = &mut rest[..c];
        // G_i, the decay's log from the chunk's start.
        let mut acc = 0.0f32;
        for (x, &gi) in cum.iter_mut().zip(g) {
            acc += gi;
            *x = acc;
        }

        // A[i, j] = beta_i (k_i . k_j) e^(G_i - G_j) (j < i) and P[i, j] = (q_i . k_j)
        // e^(G_i - G_j) (j <= i), from K K^T and Q K^T.                    [C, C]
        transpose(kt, k, c, dk);
        gemm::<F>(a, k, kt, (c, dk, c), false);
        gemm::<F>(p, q, kt, (c, dk, c), false);
        for i in 0..c {
            for j in 0..c {
                // G_i - G_j <= 0 for j <= i: the vectorizable exp's range.
                let decay = if j <= i { exp(cum[i] - cum[j]) } else { 0.0 };
                a[i * c + j] = if j < i { beta[i] * a[i * c + j] * decay } else { 0.0 };
                p[i * c + j] *= decay;
            }
        }

        // T = (I + A)^-1 by forward substitution (row i = e_i - sum_(j<i) A[i, j] row j), so
        // that U0 = T (beta v) and W = T (beta e^G k) are products.       T: [C, C]
        t.fill(0.0);
        for i in 0..c {
            let (done, ti) = t.split_at_mut(i * c);
            let ti = &mut ti[..c];
            ti[i] = 1.0;
            for j in 0..i {
                axpy(&mut ti[..j + 1], -a[i * c + j], &done[j * c..][..j + 1]);
            }
        }
        for i in 0..c {
            let (b, e) = (beta[i], beta[i] * cum[i].exp());
            for (x, &vi) in bv[i * dv..][..dv].iter_mut().zip(&v[i * dv..][..dv]) {
                *x = b * vi;
            }
            for (x, &ki) in bk[i * dk..][..dk].iter_mut().zip(&k[i * dk..][..dk]) {
                *x = e * ki;
            }
        }
        gemm::<F>(u, t, bv, (c, c, dv), false);
        gemm::<F>(w, t, bk, (c, c, dk), false);

        // U = U0 - W S0: the corrections, now that the state at the chunk's start is known.
        w.iter_mut().for_each(|x| *x = -*x);
        gemm::<F>(u, w, s, (c, dk, dv), true);

        // o_i = e^(G_i) S0^T q_i + sum_(j <= i) P[i, j] u_j.
        gemm::<F>(o, q, s, (c, dk, dv), false);
        for (oi, &gi) in o.chunks_exact_mut(dv).zip(cum.iter()) {
            let e = gi.exp();
            oi.iter_mut().for_each(|x| *x *= e);
        }
        gemm::<F>(o, p, u, (c, c, dv), true);

        // S = e^(G_C) S0 + sum_j e^(G_C - G_j) k_j u_j^T.             K^T scaled: [dk, C]
        let last = cum[c - 1];
        let e = last.exp();
        s.iter_mut().for_each(|x| *x *= e);
        for (fj, &gj) in f.iter_mut().zip(cum.iter()) {
            *fj = (last - gj).exp();
        }
        for row in kt.chunks_exact_mut(c) {
            for (x, &fj) in row.iter_mut().zip(f.iter()) {
                *x *= fj;
            }
        }
        gemm::<F>(s, kt, u, (dk, c, dv), true);
    }
}

/// One value head's inputs for token `t` of `qkv: [n, conv_dim]`, `a`, `b: [n, num_v_heads]`:
/// its key head's query and key, unit length (the query scaled by `1 / sqrt(dk)`), into `q`
/// and `k`; its values; and its decay's log and write strength.
#[allow(clippy::too_many_arguments)]
fn head_token<'x>(
    q: &mut [f32],
    k: &mut [f32],
    qkv: &'x [f32],
    a: &[f32],
    b: &[f32],
    (a_log, dt_bias): (f32, f32),
    t: usize,
    h: usize,
    s: DeltaNetShape,
) -> (&'x [f32], f32, f32) {
    let (dk, dv, vh, kd) = (s.head_k_dim, s.head_v_dim, s.num_v_heads, s.key_dim());
    let kh = s.key_head(h);
    let row = &qkv[t * s.conv_dim()..][..s.conv_dim()];
    q.copy_from_slice(&row[kh * dk..][..dk]);
    k.copy_from_slice(&row[kd + kh * dk..][..dk]);
    l2norm(q);
    l2norm(k);
    let scale = 1.0 / (dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    let v = &row[2 * kd + h * dv..][..dv];
    let (g, beta) = decay_and_strength(a[t * vh + h], b[t * vh + h], a_log, dt_bias);
    (v, g, beta)
}

/// Steps 3 to 5 ([`super::delta_net::gated_delta_rule`]'s contract): the value heads in
/// parallel, each through its own memory in `state: [vh, dk, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    o: &mut [f32],
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    pos0: usize,
    s: DeltaNetShape,
) {
    let (dk, dv, vh, vd) = (s.head_k_dim, s.head_v_dim, s.num_v_heads, s.value_dim());
    let n = qkv.len() / s.conv_dim();
    let params = |h: usize| (a_log[h], dt_bias[h]);
    if n == 1 {
        // Decode: the heads are parts of a job of the decode team (team.rs), as attention's
        // are, cut along the memories (whole heads), which each part owns. A part writes each
        // head's output through one lock on `o` (a copy of `dv` values a head; the math is
        // outside it). Its scratch is on the stack ([`with_scratch`]): a decode step allocates
        // nothing.
        let out = Mutex::new(o);
        Team::current().split([state], dk * dv, |_, start, part, _| {
            with_scratch(2 * dk + 2 * dv, |work| {
                let (q, rest) = work.split_at_mut(dk);
                let (k, rest) = rest.split_at_mut(dk);
                let (u, oh) = rest.split_at_mut(dv);
                for (j, sh) in part.chunks_exact_mut(dk * dv).enumerate() {
                    let h = start / (dk * dv) + j;
                    let (v, g, beta) = head_token(q, k, qkv, a, b, params(h), 0, h, s);
                    let one = HeadInputs {
                        q,
                        k,
                        v,
                        g: &[g],
                        beta: &[beta],
                    };
                    step(sh, oh, u, &one);
                    let mut o = out.lock().unwrap_or_else(PoisonError::into_inner);
                    o[h * dv..][..dv].copy_from_slice(oh);
                }
            })
        });
        return;
    }

    // A run of tokens: each head gathers its inputs, runs them in order, and writes its
    // outputs into its own block of `by_head: [vh, n, dv]`.
    let runs = runs_by_form(pos0, n);
    let mut by_head = vec![0f32; vh * n * dv];
    state
        .par_chunks_exact_mut(dk * dv)
        .zip(by_head.par_chunks_exact_mut(n * dv))
        .enumerate()
        .for_each(|(h, (sh, oh))| {
            let (mut q, mut k, mut v) =
                (vec![0f32; n * dk], vec![0f32; n * dk], vec![0f32; n * dv]);
            let (mut g, mut beta) = (vec![0f32; n], vec![0f32; n]);
            for t in 0..n {
                let (qt, kt) = (&mut q[t * dk..][..dk], &mut k[t * dk..][..dk]);
                let (vt, gt, bt) = head_token(qt, kt, qkv, a, b, params(h), t, h, s);
                v[t * dv..][..dv].copy_from_slice(vt);
                (g[t], beta[t]) = (gt, bt);
            }
            let mut u = vec![0f32; dv];
            let mut work = Vec::new();
            for &(first, end, whole) in &runs {
                if whole {
                    let c = CHUNK;
                    work.resize(chunk_work(c, dk, dv), 0.0);
                    let inputs = HeadInputs {
                        q: &q[first * dk..end * dk],
                        k: &k[first * dk..end * dk],
                        v: &v[first * dv..end * dv],
                        g: &g[first..end],
                        beta: &beta[first..end],
                    };
                    chunk(sh, &mut oh[first * dv..end * dv], &mut work, &inputs);
                    continue;
                }
                for t in first..end {
                    let one = HeadInputs {
                        q: &q[t * dk..][..dk],
                        k: &k[t * dk..][..dk],
                        v: &v[t * dv..][..dv],
                        g: &g[t..t + 1],
                        beta: &beta[t..t + 1],
                    };
                    step(sh, &mut oh[t * dv..][..dv], &mut u, &one);
                }
            }
        });
    for (t, row) in o.chunks_exact_mut(vd).enumerate() {
        for (h, out) in row.chunks_exact_mut(dv).enumerate() {
            out.copy_from_slice(&by_head[(h * n + t) * dv..][..dv]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::delta_net;
    use super::*;
    use crate::testing::next_values;

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        diff / scale
    }

    use crate::format::ValueHeads;

    const SHAPE: DeltaNetShape = DeltaNetShape {
        num_k_heads: 2,
        num_v_heads: 4,
        head_k_dim: 32,
        head_v_dim: 24,
        conv_kernel: 4,
        value_heads: ValueHeads::Grouped,
    };

    /// The fast steps against the textbook's (`delta_net.rs`) over a run of 150 tokens cut as
    /// a prompt of 70 at position 0 (a whole chunk, then the recurrence), a prompt of 70 more,
    /// and 10 single tokens, from zero states: every output and both states within f32
    /// rounding of the textbook's.
    #[test]
    fn equals_the_textbook_steps() {
        for value_heads in [ValueHeads::Grouped, ValueHeads::Tiled] {
            equals_the_textbook_steps_in(DeltaNetShape {
                value_heads,
                ..SHAPE
            });
        }
    }

    fn equals_the_textbook_steps_in(s: DeltaNetShape) {
        let (cd, vd, vh) = (s.conv_dim(), s.value_dim(), s.num_v_heads);
        let mut seed = 11;
        let n = 150;
        let x = next_values(n * cd, &mut seed);
        let a = next_values(n * vh, &mut seed);
        let b = next_values(n * vh, &mut seed);
        let z = next_values(n * vd, &mut seed);
        let conv_w = next_values(cd * s.conv_kernel, &mut seed);
        let norm_w: Vec<f32> = next_values(s.head_v_dim, &mut seed)
            .iter()
            .map(|v| 1.0 + v * 0.5)
            .collect();
        let a_log: Vec<f32> = (0..vh).map(|h| (0.05 + 0.1 * h as f32).ln()).collect();
        let dt_bias: Vec<f32> = (0..vh).map(|h| -2.0 - 0.25 * h as f32).collect();

        let mut states = [0, 1].map(|_| {
            (
                vec![0f32; s.conv_state_len()],
                vec![0f32; s.recurrent_state_len()],
            )
        });
        let mut outs = [vec![0f32; n * vd], vec![0f32; n * vd]];
        let mut pos = 0;
        for len in [70, 70].into_iter().chain([1; 10]) {
            for (fast, ((window, memory), out)) in
                states.iter_mut().zip(outs.iter_mut()).enumerate()
            {
                let mut qkv = x[pos * cd..(pos + len) * cd].to_vec();
                let (ar, br) = (
                    &a[pos * vh..(pos + len) * vh],
                    &b[pos * vh..(pos + len) * vh],
                );
                let o = &mut out[pos * vd..(pos + len) * vd];
                let zr = &z[pos * vd..(pos + len) * vd];
                if fast == 1 {
                    causal_conv_silu(&mut qkv, window, &conv_w, s);
                    gated_delta_rule(o, &qkv, ar, br, &a_log, &dt_bias, memory, pos, s);
                    gated_rmsnorm(o, zr, &norm_w, 1e-6);
                } else {
                    delta_net::causal_conv_silu(&mut qkv, window, &conv_w, s);
                    delta_net::gated_delta_rule(o, &qkv, ar, br, &a_log, &dt_bias, memory, pos, s);
                    delta_net::gated_rmsnorm(o, zr, &norm_w, 1e-6);
                }
            }
            pos += len;
        }
        let [(w0, m0), (w1, m1)] = &states;
        assert!(max_rel(w1, w0) == 0.0, "the window holds inputs, unrounded");
        assert!(max_rel(m1, m0) < 2e-6, "memory {}", max_rel(m1, m0));
        assert!(
            max_rel(&outs[1], &outs[0]) < 2e-6,
            "outputs {}",
            max_rel(&outs[1], &outs[0])
        );
    }

    /// A GGUF's tiled value heads (`ValueHeads::Tiled`) compute HF's grouped heads: the layer
    /// on inputs whose value heads the converter moved (grouped head `k r + j` of `r` a key head
    /// to `j kh + k`) gives the grouped layer's outputs moved the same way, bit for bit.
    #[test]
    fn tiled_value_heads_compute_the_grouped_ones() {
        let grouped = SHAPE;
        let tiled = DeltaNetShape {
            value_heads: ValueHeads::Tiled,
            ..SHAPE
        };
        let s = grouped;
        let (cd, kd, vd, vh, dv) = (
            s.conv_dim(),
            s.key_dim(),
            s.value_dim(),
            s.num_v_heads,
            s.head_v_dim,
        );
        let (kh, r) = (s.num_k_heads, vh / s.num_k_heads);
        assert!(r > 1, "the test needs key heads shared");
        // Runs of `each` values a head, from `first`, in rows of `width`: moved to the tiled order.
        let to_tiled = |v: &[f32], width: usize, first: usize, each: usize| -> Vec<f32> {
            let mut out = v.to_vec();
            for row in 0..v.len() / width {
                for g in 0..vh {
                    let t = ValueHeads::tiled_place(g, kh, vh);
                    let (from, to) = (
                        row * width + first + g * each,
                        row * width + first + t * each,
                    );
                    out[to..to + each].copy_from_slice(&v[from..from + each]);
                }
            }
            out
        };
        let mut seed = 23;
        let n = 80;
        let x = next_values(n * cd, &mut seed);
        let (a, b) = (
            next_values(n * vh, &mut seed),
            next_values(n * vh, &mut seed),
        );
        let z = next_values(n * vd, &mut seed);
        let conv_w = next_values(cd * s.conv_kernel, &mut seed);
        let norm_w = next_values(dv, &mut seed);
        let a_log: Vec<f32> = (0..vh).map(|h| (0.05 + 0.1 * h as f32).ln()).collect();
        let dt_bias: Vec<f32> = (0..vh).map(|h| -2.0 - 0.25 * h as f32).collect();
        let run = |s: DeltaNetShape,
                   x: &[f32],
                   a: &[f32],
                   b: &[f32],
                   z: &[f32],
                   w: &[f32],
                   al: &[f32],
                   dt: &[f32]| {
            let mut window = vec![0f32; s.conv_state_len()];
            let mut memory = vec![0f32; s.recurrent_state_len()];
            let mut qkv = x.to_vec();
            let mut o = vec![0f32; n * vd];
            causal_conv_silu(&mut qkv, &mut window, w, s);
            gated_delta_rule(&mut o, &qkv, a, b, al, dt, &mut memory, 0, s);
            gated_rmsnorm(&mut o, z, &norm_w, 1e-6);
            o
        };
        let want = run(grouped, &x, &a, &b, &z, &conv_w, &a_log, &dt_bias);
        let k = s.conv_kernel;
        let got = run(
            tiled,
            &to_tiled(&x, cd, 2 * kd, dv),
            &to_tiled(&a, vh, 0, 1),
            &to_tiled(&b, vh, 0, 1),
            &to_tiled(&z, vd, 0, dv),
            // The convolution's weights: a row of K a channel.
            &to_tiled(&conv_w, cd * k, 2 * kd * k, dv * k),
            &to_tiled(&a_log, vh, 0, 1),
            &to_tiled(&dt_bias, vh, 0, 1),
        );
        assert_eq!(got, to_tiled(&want, vd, 0, dv));
    }

    /// The recurrence takes the textbook's operations in its order: the same bits.
    #[test]
    fn the_recurrence_gives_the_textbooks_bits() {
        let (dk, dv) = (32, 24);
        let mut seed = 5;
        let mut unit = |n: usize| {
            let mut v = next_values(n, &mut seed);
            l2norm(&mut v);
            v
        };
        let (q, k) = (unit(dk), unit(dk));
        let v = next_values(dv, &mut seed);
        let s0 = next_values(dk * dv, &mut seed);
        let (mut s1, mut s2) = (s0.clone(), s0);
        let (mut o1, mut o2, mut u) = (vec![0f32; dv], vec![0f32; dv], vec![0f32; dv]);
        let head = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &[-0.3],
            beta: &[0.6],
        };
        step(&mut s1, &mut o1, &mut u, &head);
        super::super::delta_rule::recurrent(&head, &mut s2, &mut o2);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
    }
}
