//! Reference of `kernels/matmul.cu` (`matmul_q8`, `matmul_q4`, `matmul_q6`, `matmul_bf16`,
//! `matmul_f32`).

use super::reduce::warp_sum;
use qwen3_inference::format::view::TensorData;
use qwen3_inference::format::DType;
use qwen3_inference::quant::{Q4, Q6, Q8};

/// Four consecutive weights of row `row` starting at column `c`, and the scale applying to them
/// (the group's scale for q8, q4 and q6, 1.0 otherwise): the kernels' `load4`.
fn load4(w: &TensorData<'_>, row: usize, cols: usize, c: usize) -> ([f32; 4], f32) {
    let i = row * cols + c;
    match w.dtype() {
        DType::Q8 => {
            let Q8 {
                q,
                scales,
                group_size,
            } = w.q8();
            (
                std::array::from_fn(|k| q[i + k] as f32),
                scales[row * (cols / group_size) + c / group_size],
            )
        }
        DType::Q4 => {
            use qwen3_inference::quant::{f16_scale, q4_int};
            let Q4 {
                packed,
                scales,
                group_size,
            } = w.q4();
            let q = |k: usize| q4_int(packed, group_size, i + k) as f32;
            let scale = f16_scale(scales, row * (cols / group_size) + c / group_size);
            (std::array::from_fn(q), scale)
        }
        DType::Q6 => {
            let Q6 {
                packed,
                scales,
                group_size,
                ..
            } = w.q6();
            // Q6Weights::load4, word for word: a 4-byte load of nibble bytes and one of high
            // bytes, each byte's high pair shifted into place.
            let (b, i) = (c / 128, c % 128);
            let n = (cols - 128 * b).min(128);
            let (m, p, second) = (n / 4, 16 * (i / 32) + i % 16, i % 32 >= 16);
            let block = &packed[row * (cols / 4 * 3) + b * 96..];
            let word = u32::from_le_bytes(block[p..p + 4].try_into().unwrap());
            let high = u32::from_le_bytes(block[n / 2 + p % m..][..4].try_into().unwrap());
            let shift = 4 * (p >= m) as u32 + 2 * second as u32;
            let v = ((if second { word >> 4 } else { word }) & 0x0f0f_0f0f)
                | ((high >> shift) & 0x0303_0303) << 4;
            let scale = qwen3_inference::quant::f16_scale(
                scales,
                row * (cols / group_size) + c / group_size,
            );
            (
                std::array::from_fn(|k| ((v >> (8 * k)) & 0xff) as f32 - 32.0),
                scale,
            )
        }
        DType::Bf16 => {
            let b = w.bf16();
            (
                std::array::from_fn(|k| f32::from_bits((b[i + k] as u32) << 16)),
                1.0,
            )
        }
        DType::F32 => {
            let f = w.f32();
            (std::array::from_fn(|k| f[i + k]), 1.0)
        }
        DType::K(_) => {
            panic!("the CUDA backend has no K-quant kernels (it refuses such files)")
        }
    }
}

/// `y[t, r] = sum_c W[r, c] * x[t, c]`; W: [rows, cols] as stored, x: [n_tok, cols],
/// y: [n_tok, rows]. Lane L of row r's warp accumulates columns 4L.. of each 128-column stripe:
/// `d` is the fma chain over its four columns, `acc = fma(d, scale, acc)`; the 32 lane sums are
/// added by `warp_sum`. The kernel's token tiling does not change any token's arithmetic.
pub fn matmul(y: &mut [f32], w: &TensorData<'_>, x: &[f32], rows: usize, cols: usize) {
    assert_eq!(cols % 4, 0);
    assert_eq!(x.len() % cols, 0);
    let n_tok = x.len() / cols;
    assert_eq!(y.len(), n_tok * rows);
    for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
        for (r, out) in yt.iter_mut().enumerate() {
            let mut acc = [0.0f32; 32];
            for stripe in (0..cols).step_by(128) {
                for (lane, a) in acc.iter_mut().enumerate() {
                    let c = stripe + 4 * lane;
                    if c >= cols {
                        break;
                    }
                    let (wv, s) = load4(w, r, cols, c);
                    let mut d = wv[0] * xt[c];
                    d = wv[1].mul_add(xt[c + 1], d);
                    d = wv[2].mul_add(xt[c + 2], d);
                    d = wv[3].mul_add(xt[c + 3], d);
                    *a = d.mul_add(s, *a);
                }
            }
            *out = warp_sum(&acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::test_values;
    use qwen3_inference::quant::{
        dequantize_q4, dequantize_q6_row, dequantize_q8, quantize_q4, quantize_q6, quantize_q8,
    };

    /// y = W x in f64 from the dequantized weights.
    fn naive(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
        let n_tok = x.len() / cols;
        let mut y = vec![0.0; n_tok * rows];
        for t in 0..n_tok {
            for r in 0..rows {
                y[t * rows + r] = (0..cols)
                    .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                    .sum();
            }
        }
        y
    }

    fn check(got: &[f32], want: &[f64], w: &[f32], x: &[f32], cols: usize) {
        // Error bound of an f32 sum of `cols` products: a few ulp of the sum of magnitudes.
        let mag: f64 = w[..cols]
            .iter()
            .zip(&x[..cols])
            .map(|(a, b)| (a * b).abs() as f64)
            .sum();
        for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - e).abs() <= 1e-6 * mag.max(1.0) * 4.0,
                "[{i}] {g} vs {e}"
            );
        }
    }

    /// q8 with group sizes 32/64/128 and widths that are and are not multiples of the 128-column
    /// stripe; the scales differ per group, so indexing the wrong scale fails.
    #[test]
    fn q8_matches_dequantized_f64() {
        for (rows, cols, gs) in [(5, 1024, 64), (3, 96, 32), (7, 384, 128), (4, 200, 8)] {
            let w: Vec<f32> = test_values(rows * cols, cols as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1 + (i / gs) % 5) as f32)
                .collect();
            let mut q = vec![0i8; w.len()];
            let mut scales = vec![0.0f32; w.len() / gs];
            quantize_q8(&w, gs, &mut q, &mut scales);
            let mut deq = vec![0.0f32; w.len()];
            dequantize_q8(&q, &scales, gs, &mut deq);
            let x = test_values(3 * cols, 99);
            let mut y = vec![0.0; 3 * rows];
            let data = TensorData::from(Q8 {
                q: &q,
                scales: &scales,
                group_size: gs,
            });
            matmul(&mut y, &data, &x, rows, cols);
            check(&y, &naive(&deq, &x, rows, cols), &deq, &x, cols);
        }
    }

    /// q4 (groups of 32, 64 and 8, the kernel's smallest) against the f64 product of the
    /// dequantized weights: a wrong nibble, half or scale fails.
    #[test]
    fn q4_matches_dequantized_f64() {
        for (rows, cols, gs) in [(5, 1024, 32), (3, 192, 64), (4, 200, 8)] {
            let w: Vec<f32> = test_values(rows * cols, cols as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1 + (i / gs) % 5) as f32)
                .collect();
            let mut packed = vec![0u8; w.len() / 2];
            let mut scales = vec![0u16; w.len() / gs];
            quantize_q4(&w, gs, &mut packed, &mut scales);
            let mut deq = vec![0.0f32; w.len()];
            dequantize_q4(&packed, &scales, gs, &mut deq);
            let x = test_values(3 * cols, 98);
            let mut y = vec![0.0; 3 * rows];
            let data = TensorData::from(Q4 {
                packed: &packed,
                scales: &scales,
                group_size: gs,
            });
            matmul(&mut y, &data, &x, rows, cols);
            check(&y, &naive(&deq, &x, rows, cols), &deq, &x, cols);
        }
    }

    /// q6 (rows of full blocks, a short last block, groups wider than a block) against the f64
    /// product of the dequantized weights: a wrong nibble, high pair or scale fails.
    #[test]
    fn q6_matches_dequantized_f64() {
        for (rows, cols, gs) in [
            (5, 1024, 32),
            (3, 160, 32),
            (4, 320, 64),
            (3, 224, 32),
            (2, 256, 256),
        ] {
            let w: Vec<f32> = test_values(rows * cols, cols as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1 + (i / gs) % 5) as f32)
                .collect();
            let mut packed = vec![0u8; w.len() / 4 * 3];
            let mut scales = vec![0u16; w.len() / gs];
            quantize_q6(&w, cols, gs, &mut packed, &mut scales);
            let mut deq = vec![0.0f32; w.len()];
            for (r, row) in deq.chunks_exact_mut(cols).enumerate() {
                dequantize_q6_row(&packed, &scales, cols, gs, r, row);
            }
            let x = test_values(3 * cols, 97);
            let mut y = vec![0.0; 3 * rows];
            let data = TensorData::from(Q6 {
                packed: &packed,
                scales: &scales,
                group_size: gs,
                cols,
            });
            matmul(&mut y, &data, &x, rows, cols);
            check(&y, &naive(&deq, &x, rows, cols), &deq, &x, cols);
        }
    }

    #[test]
    fn bf16_and_f32_match_f64() {
        let (rows, cols) = (6, 264);
        let w = test_values(rows * cols, 3);
        let x = test_values(2 * cols, 4);
        let mut y = vec![0.0; 2 * rows];
        matmul(&mut y, &TensorData::from_f32(&w), &x, rows, cols);
        check(&y, &naive(&w, &x, rows, cols), &w, &x, cols);

        let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let wb: Vec<f32> = bits
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect();
        matmul(&mut y, &TensorData::from_bf16(&bits), &x, rows, cols);
        check(&y, &naive(&wb, &x, rows, cols), &wb, &x, cols);
    }

    /// Prefill (many tokens at once) and decode (one at a time) give identical bits per token.
    #[test]
    fn batched_equals_one_token_at_a_time() {
        let (rows, cols) = (4, 256);
        let w = test_values(rows * cols, 5);
        let x = test_values(10 * cols, 6);
        let mut all = vec![0.0; 10 * rows];
        matmul(&mut all, &TensorData::from_f32(&w), &x, rows, cols);
        for t in 0..10 {
            let mut one = vec![0.0; rows];
            matmul(
                &mut one,
                &TensorData::from_f32(&w),
                &x[t * cols..(t + 1) * cols],
                rows,
                cols,
            );
            assert_eq!(one, all[t * rows..(t + 1) * rows]);
        }
    }
}
