//! q4 weights against q8 activations (W4A8): the scalar reference. Each group of `gs` weights is
//! `gs / 2` packed bytes and an f16 scale (`quant::quantize_q4`: byte `j` holds value `j` in its
//! low nibble and value `j + gs / 2` in its high one, each as `q + 8`), so a group's product is
//! the integer sum `sum_j (nibble_j - 8) * q_x[j]` times the two scales, as q8's is.

use super::ActsQ8;

/// `sum_g ws[g] * xs[g] * sum_{j in g} q_w[j] * q_x[j]` over one row: `w` its packed bytes
/// (`cols / 2`), `ws` its f16 scales, `x`/`xs` one activation row quantized per group of `gs`.
pub fn dot_q4_scalar(w: &[u8], ws: &[u16], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    let half = gs / 2;
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(half).zip(x.chunks_exact(gs)).enumerate() {
        let mut isum = 0i32;
        for (j, &b) in wg.iter().enumerate() {
            isum += ((b & 15) as i32 - 8) * xg[j] as i32;
            isum += ((b >> 4) as i32 - 8) * xg[j + half] as i32;
        }
        sum += isum as f32 * (half::f16::from_bits(ws[g]).to_f32() * xs[g]);
    }
    sum
}

/// `out[r, i]` (`[rows, t]`) = row `r` of the packed weights against activation row `i`, one
/// [`dot_q4_scalar`] per pair. `_ahead` is the prefetch hint the SIMD kernels take.
pub fn mat_q4_scalar(w: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32], _ahead: usize) {
    let (cols, gs, t) = (x.cols, x.group_size, x.t);
    let per = cols / gs;
    assert!(w.len() * 2 == out.len() / t * cols && ws.len() == out.len() / t * per);
    for (r, out_r) in out.chunks_exact_mut(t).enumerate() {
        let (w_r, ws_r) = (
            &w[r * cols / 2..(r + 1) * cols / 2],
            &ws[r * per..(r + 1) * per],
        );
        for (i, o) in out_r.iter_mut().enumerate() {
            *o = dot_q4_scalar(w_r, ws_r, x.q_row(i), x.scales_row(i), gs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::quant::{dequantize_q4, quantize_q4};
    use crate::testing::next_values;

    /// The integer product equals the f64 product of the dequantized weights and activations.
    #[test]
    fn matches_the_dequantized_product() {
        let mut seed = 5;
        for gs in [32, 64, 128] {
            let (rows, cols, t) = (3, gs * 4, 2);
            let w = next_values(rows * cols, &mut seed);
            let x = next_values(t * cols, &mut seed);
            let mut packed = vec![0u8; rows * cols / 2];
            let mut scales = vec![0u16; rows * cols / gs];
            quantize_q4(&w, gs, &mut packed, &mut scales);
            let mut wd = vec![0f32; rows * cols];
            dequantize_q4(&packed, &scales, gs, &mut wd);
            let mut buf = ActsQ8Buf::default();
            let acts = buf.quantize_for_q4(&x, t, cols, gs);
            let mut out = vec![0f32; rows * t];
            mat_q4_scalar(&packed, &scales, &acts, &mut out, 0);
            for r in 0..rows {
                for i in 0..t {
                    let xq: Vec<f64> = (0..cols)
                        .map(|c| acts.q_row(i)[c] as f64 * acts.scales_row(i)[c / gs] as f64)
                        .collect();
                    let want: f64 = (0..cols).map(|c| wd[r * cols + c] as f64 * xq[c]).sum();
                    let got = out[r * t + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{gs} {r} {i}: {got} {want}"
                    );
                }
            }
        }
    }
}
