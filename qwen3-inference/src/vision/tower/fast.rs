//! The tower's fast form ([`Math::Fast`](super::Math)): the products of tower.rs on the matmul
//! kernels, and attention within each image as two products per head. The steps and their order
//! are tower.rs's; only how the sums are taken differs (f32 on the kernels, f64 there), so the two
//! agree to f32 rounding (`tests/vision_tower.rs` checks both against transformers).

use super::Linear;
use crate::format::reader::{TensorData, TensorView};
use crate::kernels;
use std::ops::Range;

/// Query rows of one head's scores at a time: `[ROWS, n]` scores stay small (a 4096-patch image:
/// 4 MiB) whatever the image's size.
const ROWS: usize = 256;

/// An f32 matrix `[rows, cols]` as the kernels take a weight.
fn view<'a>(data: &'a [f32], shape: &'a [u64; 2]) -> TensorView<'a> {
    TensorView {
        name: "vision tower",
        shape,
        data: TensorData::F32(data),
        interleaved: None,
    }
}

/// `x W^T + b` on the matmul kernels: `x` [n, in] -> [n, out].
pub(super) fn linear(l: &Linear, x: &[f32]) -> Vec<f32> {
    let n = x.len() / l.inp;
    let shape = [l.out as u64, l.inp as u64];
    let mut y = vec![0f32; n * l.out];
    kernels::matmul(&mut y, x, &view(&l.weight, &shape), n);
    for row in y.chunks_exact_mut(l.out) {
        row.iter_mut().zip(&l.bias).for_each(|(v, b)| *v += b);
    }
    y
}

/// `o = softmax(q k^T * scale) v` within each frame, per head, every patch seeing every patch of
/// its frame: for each head, its q and k `[n, hd]` and v transposed `[hd, n]` gathered, then
/// `scores = q k^T` and `o = scores v` as products, ROWS query rows at a time.
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
) {
    let d = heads * hd;
    for frame in frames {
        let n = frame.len();
        for head in 0..heads {
            let gather = |t: &[f32]| -> Vec<f32> {
                frame
                    .clone()
                    .flat_map(|i| t[i * d + head * hd..][..hd].iter().copied())
                    .collect()
            };
            let (qh, kh) = (gather(q), gather(k));
            let mut vt = vec![0f32; hd * n];
            for (j, i) in frame.clone().enumerate() {
                for c in 0..hd {
                    vt[c * n + j] = v[i * d + head * hd + c];
                }
            }
            let (k_shape, v_shape) = ([n as u64, hd as u64], [hd as u64, n as u64]);
            let (kv, vv) = (view(&kh, &k_shape), view(&vt, &v_shape));
            for r0 in (0..n).step_by(ROWS) {
                let rows = ROWS.min(n - r0);
                let mut scores = vec![0f32; rows * n];
                kernels::matmul(&mut scores, &qh[r0 * hd..(r0 + rows) * hd], &kv, rows);
                for row in scores.chunks_exact_mut(n) {
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
                    let mut total = 0f32;
                    for s in row.iter_mut() {
                        *s = (*s * scale - max).exp();
                        total += *s;
                    }
                    row.iter_mut().for_each(|s| *s /= total);
                }
                let mut out = vec![0f32; rows * hd];
                kernels::matmul(&mut out, &scores, &vv, rows);
                for (j, row) in out.chunks_exact(hd).enumerate() {
                    let i = frame.start + r0 + j;
                    o[i * d + head * hd..][..hd].copy_from_slice(row);
                }
            }
        }
    }
}
