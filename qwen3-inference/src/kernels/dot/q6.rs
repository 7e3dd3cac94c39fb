//! q6 weights against q8 activations: the scalar reference. The SIMD kernels are q4's
//! (`x86/q4.rs`, `aarch64.rs`) with one more step: q6 packs a row in blocks of 128 values, each
//! the 64 nibble bytes of a q4 chunk followed by 32 bytes of high bits (`quant::quantize_q6`),
//! so a kernel splits the nibbles as q4's does, reads the chunk's high bytes once, and ORs each
//! nibble's two high bits in above it:
//!
//! ```text
//! nibble bytes 0..32:   low values | (high & 3) << 4,   high values | (high & 12) << 2
//! nibble bytes 32..64:  low values | (high & 48),       high values | (high & 192) >> 2
//! ```
//!
//! The weights are then `q + 32` (0..=63) where q4's are `q + 8`, so the activations' per-lane
//! correction (`-8 * sum`, `q4::ActsQ4`) is taken four times. Everything else, the activations'
//! layout, the lanes, the scales, is q4's.

use super::q4::{self, CHUNK, SIMD_GROUP};
use super::ActsQ8;
use crate::quant::{f16_scale, q6_unpack_block, Q6_BLOCK};

/// Bytes of one chunk (128 weights) of q6: 64 nibble bytes, 32 high bytes.
pub const CHUNK_BYTES: usize = CHUNK / 4 * 3;

/// `sum_g ws[g] * xs[g] * sum_{j in g} q_w[j] * q_x[j]` over the values of `x` (a row, or its
/// part from a block boundary to the row's end): `w` their packed bytes, `ws` their f16 scales.
/// Each block is unpacked to its integers (`quant::q6_unpack_block`), then multiplied.
pub fn dot_q6_scalar(w: &[u8], ws: &[u16], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    let (mut sum, mut isum) = (0.0f32, 0i32);
    let mut q = [0i8; Q6_BLOCK];
    for (b, xb) in x.chunks(Q6_BLOCK).enumerate() {
        let n = xb.len();
        let block = &w[b * CHUNK_BYTES..b * CHUNK_BYTES + n / 4 * 3];
        q6_unpack_block(block, &mut q[..n]);
        // Runs of 32 (a group is a whole number of them): its sum goes to the group's scales
        // after the group's last run.
        for (k, (qr, xr)) in q[..n].chunks_exact(32).zip(xb.chunks_exact(32)).enumerate() {
            isum += qr
                .iter()
                .zip(xr)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum::<i32>();
            let end = b * Q6_BLOCK + 32 * (k + 1);
            if end.is_multiple_of(gs) {
                let g = end / gs - 1;
                sum += isum as f32 * (f16_scale(ws, g) * xs[g]);
                isum = 0;
            }
        }
    }
    sum
}

/// [`q4::check`] for q6 weights.
pub(crate) fn check(w: &[u8], ws: &[u16], x: &ActsQ8, out: &[f32]) -> usize {
    q4::check_packed(w, ws, x, out, x.cols / 4 * 3)
}

/// The reference product of the values after a row's last full chunk (one short block), which
/// the SIMD kernels leave to it; as [`q4::tail`].
pub(crate) fn tail(w_r: &[u8], ws_r: &[u16], x_r: &[i8], xs_r: &[f32], chunks: usize) -> f32 {
    let g = chunks * (CHUNK / SIMD_GROUP);
    if g == ws_r.len() {
        return 0.0;
    }
    let (b, c) = (chunks * CHUNK_BYTES, chunks * CHUNK);
    dot_q6_scalar(&w_r[b..], &ws_r[g..], &x_r[c..], &xs_r[g..], SIMD_GROUP)
}

/// `out[r, i]` (`[rows, t]`) = row `r` of the q6 weights against activation row `i`, one
/// [`dot_q6_scalar`] per pair.
pub fn mat_q6_scalar(w: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32], _ahead: usize) {
    check(w, ws, x, out);
    q4::rows_with(dot_q6_scalar, w, ws, x, out, x.cols / 4 * 3);
}

// The SIMD kernels take q4 and q6 alike, `SIX` saying which; these pick what differs. A q6
// block is exactly one q4 chunk, which the kernels rely on.
const _: () = assert!(crate::quant::Q6_BLOCK == CHUNK);

/// Bits a weight of the packing takes: 4 (q4) or 6 (q6, `SIX`).
pub(crate) const fn bits<const SIX: bool>() -> usize {
    if SIX {
        6
    } else {
        4
    }
}

/// Bytes of a row of `cols` weights: `cols / 2` (q4) or `3 * cols / 4` (q6).
pub(crate) const fn row_bytes<const SIX: bool>(cols: usize) -> usize {
    cols / 8 * bits::<SIX>()
}

/// `q4::check` or `q6::check`.
pub(crate) fn check_either<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &[f32],
) -> usize {
    match SIX {
        true => check(w, ws, x, out),
        false => q4::check(w, ws, x, out),
    }
}

/// The reference kernel of the packing.
pub(crate) fn reference_either<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    match SIX {
        true => mat_q6_scalar(w, ws, x, out, ahead),
        false => q4::mat_q4_scalar(w, ws, x, out, ahead),
    }
}

/// The reference product of a row's tail, as `q4::tail` / `q6::tail`.
pub(crate) fn tail_either<const SIX: bool>(
    w_r: &[u8],
    ws_r: &[u16],
    x_r: &[i8],
    xs_r: &[f32],
    chunks: usize,
) -> f32 {
    match SIX {
        true => tail(w_r, ws_r, x_r, xs_r, chunks),
        false => q4::tail(w_r, ws_r, x_r, xs_r, chunks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::quant::{dequantize_q6_row, quantize_q6};
    use crate::testing::next_values;

    /// The integer product equals the f64 product of the dequantized weights and activations,
    /// for rows of full blocks, a short block, and groups wider than a block.
    #[test]
    fn matches_the_dequantized_product() {
        let mut seed = 6;
        // Short last blocks of 32, 64 (320 = 2 * 128 + 64) and 96 values (224).
        for (gs, cols) in [(32, 128), (32, 160), (64, 320), (32, 224), (256, 256)] {
            let (rows, t) = (3, 2);
            let w = next_values(rows * cols, &mut seed);
            let x = next_values(t * cols, &mut seed);
            let mut packed = vec![0u8; rows * cols / 4 * 3];
            let mut scales = vec![0u16; rows * cols / gs];
            quantize_q6(&w, cols, gs, &mut packed, &mut scales);
            let mut buf = ActsQ8Buf::default();
            let acts = buf.quantize_for_q4(&x, t, cols, gs);
            let mut out = vec![0f32; rows * t];
            mat_q6_scalar(&packed, &scales, &acts, &mut out, 0);
            for r in 0..rows {
                let mut wd = vec![0f32; cols];
                dequantize_q6_row(&packed, &scales, cols, gs, r, &mut wd);
                for i in 0..t {
                    let want: f64 = (0..cols)
                        .map(|c| {
                            let xq = acts.q_row(i)[c] as f64 * acts.scales_row(i)[c / gs] as f64;
                            wd[c] as f64 * xq
                        })
                        .sum();
                    let got = out[r * t + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{gs} {cols} {r} {i}: {got} {want}"
                    );
                }
            }
        }
    }
}
