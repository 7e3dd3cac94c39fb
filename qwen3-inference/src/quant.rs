//! Group-wise quantization: symmetric INT8 (the `q8` dtype of the model file) and symmetric
//! 4-bit (`q4`).
//!
//! A row of weights is cut into groups of `group_size` consecutive values. Each group `w` gets one
//! scale `s = max|w| / 127` and stores `q = round_half_even(w / s)`, an integer in [-127, 127];
//! the value it stands for is `q * s`. Because rounding moves a value by at most half a step, the
//! error of every dequantized value is at most `s / 2`. Symmetric (no zero point) keeps the dot
//! product a plain sum of `q_w * q_x` per group, which is what integer SIMD instructions compute.
//! See docs/quantization.md.

/// Quantizes `w` (a whole tensor, row-major, rows a multiple of `group_size` long) into `q` and
/// one scale per group in `scales`. An all-zero group gets scale 0 and zeros, not NaN.
pub fn quantize_q8(w: &[f32], group_size: usize, q: &mut [i8], scales: &mut [f32]) {
    assert!(group_size > 0 && w.len().is_multiple_of(group_size));
    assert_eq!(q.len(), w.len());
    assert_eq!(scales.len(), w.len() / group_size);
    for ((group, qg), scale) in w
        .chunks_exact(group_size)
        .zip(q.chunks_exact_mut(group_size))
        .zip(scales.iter_mut())
    {
        let max_abs = group.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let s = max_abs / 127.0;
        *scale = s;
        if s == 0.0 {
            qg.fill(0);
            continue;
        }
        for (qi, &x) in qg.iter_mut().zip(group) {
            // |x / s| <= 127 up to rounding of the division; clamp guards that last ulp.
            *qi = (x / s).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// Dequantizes one run of values: `out[i] = q[i] * scales[i / group_size]`, where `q` starts at
/// a group boundary.
pub fn dequantize_q8(q: &[i8], scales: &[f32], group_size: usize, out: &mut [f32]) {
    for ((qg, og), &s) in q
        .chunks(group_size)
        .zip(out.chunks_mut(group_size))
        .zip(scales)
    {
        for (o, &v) in og.iter_mut().zip(qg) {
            *o = v as f32 * s;
        }
    }
}

/// q4: group-wise symmetric 4-bit, llama.cpp's Q4_0 rule. A group's scale is `d = m / -8`, `m`
/// its value of largest magnitude with its sign, so `m` itself becomes -8 exactly and every other
/// value lies in [-8 d, 8 d]; `q = round_half_even(w / d)` clamped to [-8, 7] (sixteen levels,
/// one more step than a `/ 7` scale would give). The scale is stored as f16 (`half`), and the
/// values are rounded against that stored scale, so what is dequantized is what was chosen.
///
/// Packing: a group of `gs` values takes `gs / 2` bytes; byte `j` holds value `j` in its low
/// nibble and value `j + gs / 2` in its high one, each as `q + 8` (0..=15). Splitting a group's
/// bytes into low and high nibbles gives its two halves in order, which is how SIMD kernels
/// unpack it (docs/quantization.md).
pub fn quantize_q4(w: &[f32], group_size: usize, packed: &mut [u8], scales: &mut [u16]) {
    assert!(group_size > 0 && group_size.is_multiple_of(2));
    assert!(w.len().is_multiple_of(group_size));
    assert_eq!(packed.len(), w.len() / 2);
    assert_eq!(scales.len(), w.len() / group_size);
    let half = group_size / 2;
    for ((group, pg), scale) in w
        .chunks_exact(group_size)
        .zip(packed.chunks_exact_mut(half))
        .zip(scales.iter_mut())
    {
        let m = group
            .iter()
            .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        let d = half::f16::from_f32(if m == 0.0 { 0.0 } else { m / -8.0 });
        *scale = d.to_bits();
        let d = d.to_f32();
        let q = |x: f32| -> u8 {
            if d == 0.0 {
                8
            } else {
                ((x / d).round_ties_even().clamp(-8.0, 7.0) as i32 + 8) as u8
            }
        };
        for (j, byte) in pg.iter_mut().enumerate() {
            *byte = q(group[j]) | q(group[j + half]) << 4;
        }
    }
}

/// The q4 integer at flat index `i` (`nibble - 8`, in -8..=7) of values packed by
/// [`quantize_q4`].
#[inline]
pub fn q4_int(packed: &[u8], group_size: usize, i: usize) -> i32 {
    let (g, j) = (i / group_size, i % group_size);
    let half = group_size / 2;
    let byte = packed[g * half + j % half];
    let nibble = if j < half { byte & 15 } else { byte >> 4 };
    nibble as i32 - 8
}

/// Group `g`'s q4 scale (stored as f16 bits).
#[inline]
pub fn q4_scale(scales: &[u16], g: usize) -> f32 {
    half::f16::from_bits(scales[g]).to_f32()
}

/// The q4 value at flat index `i`: `(nibble - 8) * scale`.
#[inline]
pub fn q4_value(packed: &[u8], scales: &[u16], group_size: usize, i: usize) -> f32 {
    q4_int(packed, group_size, i) as f32 * q4_scale(scales, i / group_size)
}

/// Dequantizes `out.len()` q4 values starting at a group boundary of `packed`/`scales`.
pub fn dequantize_q4(packed: &[u8], scales: &[u16], group_size: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = q4_value(packed, scales, group_size, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::lcg;

    #[test]
    fn error_is_at_most_half_a_step() {
        let mut seed = 7;
        for gs in [32, 64, 128] {
            let w: Vec<f32> = (0..gs * 50)
                .map(|i| lcg(&mut seed) * (1.0 + (i / gs) as f32))
                .collect();
            let mut q = vec![0i8; w.len()];
            let mut s = vec![0f32; w.len() / gs];
            quantize_q8(&w, gs, &mut q, &mut s);
            let mut back = vec![0f32; w.len()];
            dequantize_q8(&q, &s, gs, &mut back);
            for (i, (&a, &b)) in w.iter().zip(&back).enumerate() {
                let step = s[i / gs];
                // Half a step, plus f32 rounding of the product q*s.
                assert!(
                    (a - b).abs() <= step * 0.5 * (1.0 + 1e-5) + f32::EPSILON * a.abs(),
                    "value {i}: {a} -> {b}, step {step}"
                );
            }
            // The largest value of each group maps to +-127 exactly.
            for (g, grp) in q.chunks(gs).enumerate() {
                assert_eq!(
                    grp.iter().map(|v| v.unsigned_abs()).max(),
                    Some(127),
                    "group {g}"
                );
            }
        }
    }

    #[test]
    fn zero_group_gives_zeros_not_nan() {
        let w = [0.0f32; 64];
        let mut q = [1i8; 64];
        let mut s = [1.0f32; 1];
        quantize_q8(&w, 64, &mut q, &mut s);
        assert_eq!(s[0], 0.0);
        assert!(q.iter().all(|&v| v == 0));
        let mut back = [1.0f32; 64];
        dequantize_q8(&q, &s, 64, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn ties_round_to_even() {
        // max|w| = 127 makes the scale exactly 1, so w / s = w and the ties are exact.
        let mut w = vec![0.0f32; 8];
        w[0] = 127.0;
        w[1] = 0.5;
        w[2] = 1.5;
        w[3] = 2.5;
        w[4] = -0.5;
        w[5] = -1.5;
        w[6] = 126.5;
        let mut q = vec![0i8; 8];
        let mut s = vec![0f32; 1];
        quantize_q8(&w, 8, &mut q, &mut s);
        assert_eq!(s[0], 1.0);
        assert_eq!(q, vec![127, 0, 2, 2, 0, -2, 126, 0]);
    }

    /// q4: every value within one step of the original (half a step except the values the
    /// clamp to 7 cuts, which lie above 7.5 steps), the largest magnitude exact up to the f16
    /// scale, the packing as documented.
    #[test]
    fn q4_error_and_packing() {
        let mut seed = 11;
        for gs in [32, 64, 128] {
            let w: Vec<f32> = (0..gs * 40)
                .map(|i| lcg(&mut seed) * (1.0 + (i / gs) as f32))
                .collect();
            let mut packed = vec![0u8; w.len() / 2];
            let mut s = vec![0u16; w.len() / gs];
            quantize_q4(&w, gs, &mut packed, &mut s);
            let mut back = vec![0f32; w.len()];
            dequantize_q4(&packed, &s, gs, &mut back);
            for (i, (&a, &b)) in w.iter().zip(&back).enumerate() {
                let d = half::f16::from_bits(s[i / gs]).to_f32().abs();
                let bound = if (a / d).abs() > 7.5 { d } else { d * 0.5 };
                assert!(
                    (a - b).abs() <= bound * (1.0 + 1e-3),
                    "{i}: {a} -> {b}, step {d}"
                );
            }
        }
        // Byte j: value j low, value j + 16 high, as q + 8.
        let mut w = [0.0f32; 32];
        (w[0], w[16], w[1], w[17]) = (-8.0, 7.0, 1.0, -3.0);
        let (mut p, mut s) = ([0u8; 16], [0u16; 1]);
        quantize_q4(&w, 32, &mut p, &mut s);
        assert_eq!(half::f16::from_bits(s[0]).to_f32(), 1.0);
        assert_eq!((p[0], p[1], p[2]), (15 << 4, 9 | 5 << 4, 8 | 8 << 4));
        // An all-zero group: scale 0, every value 0.
        quantize_q4(&[0.0; 32], 32, &mut p, &mut s);
        assert_eq!(s[0], 0);
        assert_eq!(q4_value(&p, &s, 32, 5), 0.0);
    }
}
