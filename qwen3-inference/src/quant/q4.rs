//! q4: group-wise symmetric 4-bit, one f16 scale a group, two values a byte.

use super::{f16_scale, level, scale_for};
use rayon::prelude::*;

/// q4: group-wise symmetric 4-bit. Each group stores one scale `d` (as f16, `half`) and
/// sixteen levels `q * d`, `q` in [-8, 7], `q = round_half_even(w / d)` clamped: two values a
/// byte. The values are rounded against the stored f16 scale, so what is dequantized is what
/// was chosen.
///
/// The scale: llama.cpp's Q4_0 takes `d = m / -8`, `m` the group's value of largest magnitude
/// with its sign, so `m` becomes -8 exactly and nothing is clipped. That is rarely the `d` with
/// the smallest error: a slightly larger step may place the levels better for the other 31
/// values, a slightly smaller one may clip `m` a little and round everything else finer. So
/// each group tries the divisors `-6.5, -6.75, ..., -9.5` in place of -8, refits each one's
/// scale by least squares (for fixed integers `q`, `sum (w - d q)^2` is smallest at
/// `d = sum(w q) / sum(q q)`), and keeps the scale with the smallest squared error after f16
/// rounding; Q4_0's own scale is among those compared, so no group is worse than Q4_0's (the
/// search is the idea of llama.cpp's `make_qx_quants`; measured: docs/quantization.md). It
/// changes only the export, not the format or the kernels.
///
/// Packing: a group of `gs` values takes `gs / 2` bytes; byte `j` holds value `j` in its low
/// nibble and value `j + gs / 2` in its high one, each as `q + 8` (0..=15). Splitting a group's
/// bytes into low and high nibbles gives its two halves in order, which is how SIMD kernels
/// unpack it (docs/kernels.md, "The q4 kernels").
pub fn quantize_q4(w: &[f32], group_size: usize, packed: &mut [u8], scales: &mut [u16]) {
    assert!(group_size > 0 && group_size.is_multiple_of(2));
    assert!(w.len().is_multiple_of(group_size));
    assert_eq!(packed.len(), w.len() / 2);
    assert_eq!(scales.len(), w.len() / group_size);
    let half = group_size / 2;
    // Groups are independent: quantize them in parallel (the search is most of an export's
    // arithmetic).
    w.par_chunks_exact(group_size)
        .zip(packed.par_chunks_exact_mut(half))
        .zip(scales.par_iter_mut())
        .with_min_len(64)
        .for_each(|((group, pg), scale)| {
            let d = scale_for::<8>(group);
            *scale = d.to_bits();
            let d = d.to_f32();
            for (j, byte) in pg.iter_mut().enumerate() {
                *byte = q4_nibble(group[j], d) | q4_nibble(group[j + half], d) << 4;
            }
        });
}

/// [`level`] `::<8>` of `x / d`, plus 8: the nibble q4 stores for `x` (8, the value 0, when
/// `d` is 0).
fn q4_nibble(x: f32, d: f32) -> u8 {
    if d == 0.0 {
        return 8;
    }
    (level::<8>(x / d) as i32 + 8) as u8
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

/// The q4 value at flat index `i`: `(nibble - 8) * scale`.
#[inline]
pub fn q4_value(packed: &[u8], scales: &[u16], group_size: usize, i: usize) -> f32 {
    q4_int(packed, group_size, i) as f32 * f16_scale(scales, i / group_size)
}

/// Dequantizes `out.len()` q4 values starting at a group boundary of `packed`/`scales`.
pub fn dequantize_q4(packed: &[u8], scales: &[u16], group_size: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = q4_value(packed, scales, group_size, i);
    }
}

/// A q4 tensor as a model file holds it, borrowed: values packed by [`quantize_q4`], `scales[g]`
/// (f16 bits) group `g`'s.
#[derive(Debug, Clone, Copy)]
pub struct Q4<'a> {
    pub packed: &'a [u8],
    pub scales: &'a [u16],
    pub group_size: usize,
}

impl Q4<'_> {
    /// The value at row-major index `i`.
    #[inline]
    pub fn value(&self, i: usize) -> f32 {
        q4_value(self.packed, self.scales, self.group_size, i)
    }

    /// Row `r` of a tensor `out.len()` wide, dequantized into `out`.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let (cols, gs) = (out.len(), self.group_size);
        let (packed, scales) = (&self.packed[r * cols / 2..], &self.scales[r * cols / gs..]);
        dequantize_q4(packed, scales, gs, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::lcg;

    /// q4: every value rounded to its nearest level of the stored scale (half a step, or the
    /// clamp), each group's squared error at most Q4_0's (`d = m / -8`), and over many groups
    /// clearly less; the packing as documented.
    #[test]
    fn q4_error_and_packing() {
        let mut seed = 11;
        for gs in [32, 64, 128] {
            let w: Vec<f32> = (0..gs * 400)
                .map(|i| (0..4).map(|_| lcg(&mut seed)).sum::<f32>() * (1.0 + (i / gs % 7) as f32))
                .collect();
            let mut packed = vec![0u8; w.len() / 2];
            let mut s = vec![0u16; w.len() / gs];
            quantize_q4(&w, gs, &mut packed, &mut s);
            let mut back = vec![0f32; w.len()];
            dequantize_q4(&packed, &s, gs, &mut back);
            let (mut ours, mut q4_0) = (0.0f64, 0.0f64);
            for (g, (wg, bg)) in w.chunks(gs).zip(back.chunks(gs)).enumerate() {
                let d = f16_scale(&s, g);
                let mut e = 0.0f64;
                for (i, (&a, &b)) in wg.iter().zip(bg).enumerate() {
                    let nearest = (a / d).round().clamp(-8.0, 7.0) * d;
                    assert!(
                        (a - b).abs() <= (a - nearest).abs() + d.abs() * 1e-4,
                        "group {g} value {i}: {a} -> {b}, step {d}"
                    );
                    e += ((a - b) as f64).powi(2);
                }
                // Q4_0's rule, written out here.
                let m = wg
                    .iter()
                    .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                let d0 = half::f16::from_f32(m / -8.0).to_f32();
                let e0: f64 = wg
                    .iter()
                    .map(|&x| ((x - (x / d0).round().clamp(-8.0, 7.0) * d0) as f64).powi(2))
                    .sum();
                assert!(e <= e0 * (1.0 + 1e-6), "group {g}: {e} > Q4_0's {e0}");
                (ours, q4_0) = (ours + e, q4_0 + e0);
            }
            assert!(
                ours < 0.9 * q4_0,
                "group size {gs}: {ours} vs Q4_0's {q4_0}"
            );
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
