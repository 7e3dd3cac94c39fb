//! The tower's fast form ([`Math::Fast`](super::Math)): the products of tower.rs on the matmul
//! kernels with the weights in the file's dtype (`matrix.rs`), attention within each image on
//! `kernels::frame_attention`, GELU, the biases, the split of q, k and v with their RoPE, and the
//! residual sums on all threads (on one, they left the other thread waiting: docs/vision.md,
//! "Speed beside llama.cpp"). The steps and their order are tower.rs's; only
//! how the sums are taken differs (f32 on the kernels, or the file's bf16 or q8 products; f64
//! there), so the two agree to f32 rounding in an f32 file (`tests/vision_tower.rs` and
//! qwen3-cli's `tests/vision.rs` check both against transformers).

use super::Linear;
use crate::kernels;
use rayon::prelude::*;
use std::ops::Range;

/// `x W^T + b` on the matmul kernels: `x` [n, in] -> `y` [n, out] (every value written).
pub(super) fn linear(l: &Linear, x: &[f32], y: &mut [f32]) {
    let n = x.len() / l.inp;
    let shape = [l.out as u64, l.inp as u64];
    kernels::matmul(y, x, &l.weight.view(&shape), n);
    y.par_chunks_exact_mut(l.out)
        .for_each(|row| kernels::add(row, &l.bias));
}

/// `o = softmax(q k^T * scale) v` within each frame, per head, every patch seeing every patch of
/// its frame (`kernels::frame_attention`: the products as sums of scaled rows, in registers, on
/// all threads).
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &mut [f32],
    frames: &[Range<usize>],
    heads: usize,
    hd: usize,
    scale: f32,
    scratch: &mut kernels::FrameScratch,
) {
    let d = heads * hd;
    for frame in frames {
        let rows = frame.start * d..frame.end * d;
        kernels::frame_attention(
            &q[rows.clone()],
            &k[rows.clone()],
            &v[rows.clone()],
            &mut o[rows],
            frame.len(),
            heads,
            hd,
            scale,
            scratch,
        );
    }
}

/// `f(row of x, row of y)` for every row of `width` values, on all threads.
pub(super) fn rows(x: &[f32], y: &mut [f32], width: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    x.par_chunks_exact(width)
        .zip(y.par_chunks_exact_mut(width))
        .for_each(|(xi, yi)| f(xi, yi));
}

/// `f(p, q row, k row, v row)` for every patch `p` of `q`, `k` and `v` (rows of `width`
/// values), on all threads.
pub(super) fn patches(
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
    width: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32], &mut [f32]) + Sync,
) {
    q.par_chunks_exact_mut(width)
        .zip(k.par_chunks_exact_mut(width))
        .zip(v.par_chunks_exact_mut(width))
        .enumerate()
        .for_each(|(p, ((qp, kp), vp))| f(p, qp, kp, vp));
}

/// `x += y`, value by value, on all threads.
pub(super) fn add(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(1 << 14)
        .zip(y.par_chunks(1 << 14))
        .for_each(|(a, b)| kernels::add(a, b));
}

/// `v = f(v)` for every value of `h`, on all threads.
pub(super) fn each(h: &mut [f32], f: impl Fn(f32) -> f32 + Sync) {
    h.par_chunks_mut(1 << 12)
        .for_each(|chunk| chunk.iter_mut().for_each(|v| *v = f(*v)));
}

/// GELU, tanh form, over `h` in place on all threads ([`kernels::gelu_tanh`]: within f32
/// rounding of tower.rs's f64 form).
pub(super) fn gelu_tanh(h: &mut [f32]) {
    h.par_chunks_mut(1 << 14).for_each(kernels::gelu_tanh);
}
