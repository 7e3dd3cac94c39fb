//! q6: group-wise symmetric 6-bit, one f16 scale a group, four values in three bytes.

use super::{f16_scale, level, scale_for};
use rayon::prelude::*;

/// q6: group-wise symmetric 6-bit, for the tensors a q4 file keeps finer (`format::Q4Mix`).
/// Each group stores one f16 scale `d` and 64 levels `q * d`, `q` in [-32, 31], the scale
/// chosen as q4's is ([`scale_for`]): 6.5 bits a weight in groups of 32, against q8's 9 (f32
/// scales) and llama.cpp Q6_K's 6.56.
///
/// Packing: each row is cut into *blocks* of 128 values (the last may be shorter, a multiple of
/// 32), and a block of `n` values takes `n / 2` nibble bytes then `n / 4` high bytes, so the
/// values of `u = q + 32` (0..=63) split into a low nibble and two high bits:
///
/// ```text
/// nibble byte p  (32 values a run of 16 bytes, as q4 packs a group of 32):
///     low nibble of value 32 (p / 16) + p % 16, high nibble of that value + 16
/// high byte k    (m = n / 4 of them): bits 0-1 and 2-3 the high bits of nibble byte k's low and
///     high values, bits 4-5 and 6-7 those of nibble byte k + m's
/// ```
///
/// A SIMD kernel splits the nibble bytes as it does q4's, and finds each nibble's two high bits
/// at the same byte of the high bytes for the first half of the nibble bytes, and four bits up
/// for the second half: one load of the high bytes, a shift and a mask each (`dot/q6.rs`).
/// Rows are blocked on their own, so a row is `3 * cols / 4` bytes from `3 * cols / 4 * r`.
pub fn quantize_q6(
    w: &[f32],
    cols: usize,
    group_size: usize,
    packed: &mut [u8],
    scales: &mut [u16],
) {
    assert!(group_size > 0 && group_size.is_multiple_of(32) && cols.is_multiple_of(group_size));
    assert!(w.len().is_multiple_of(cols));
    assert_eq!(packed.len(), w.len() / 4 * 3);
    assert_eq!(scales.len(), w.len() / group_size);
    let per = cols / group_size;
    w.par_chunks_exact(cols)
        .zip(packed.par_chunks_exact_mut(cols / 4 * 3))
        .zip(scales.par_chunks_exact_mut(per))
        .for_each_init(Vec::new, |u, ((row, out), scales)| {
            // u = q + 32 of every value of the row, then packed block by block.
            u.resize(cols, 0);
            for ((group, ug), scale) in row
                .chunks_exact(group_size)
                .zip(u.chunks_exact_mut(group_size))
                .zip(scales.iter_mut())
            {
                let d = scale_for::<32>(group);
                *scale = d.to_bits();
                let d = d.to_f32();
                for (v, &x) in ug.iter_mut().zip(group) {
                    *v = match d == 0.0 {
                        true => 32,
                        false => (level::<32>(x / d) as i32 + 32) as u8,
                    };
                }
            }
            for (block, out) in u.chunks(Q6_BLOCK).zip(out.chunks_mut(Q6_BLOCK / 4 * 3)) {
                q6_pack_block(block, out);
            }
        });
}

/// Values a q6 block holds (see [`quantize_q6`]).
pub const Q6_BLOCK: usize = 128;

/// Packs one block of `u = q + 32` values (`n`, a multiple of 32, at most [`Q6_BLOCK`]) into
/// `3 n / 4` bytes, as [`quantize_q6`] describes.
fn q6_pack_block(u: &[u8], out: &mut [u8]) {
    let (nibbles, high) = out.split_at_mut(u.len() / 2);
    let m = high.len();
    // Nibble byte p's two values: p's run of 32, its place in the first 16, and 16 on.
    let first = |p: usize| u[32 * (p / 16) + p % 16];
    let second = |p: usize| u[32 * (p / 16) + p % 16 + 16];
    for (p, b) in nibbles.iter_mut().enumerate() {
        *b = first(p) & 15 | (second(p) & 15) << 4;
    }
    for (k, b) in high.iter_mut().enumerate() {
        *b = first(k) >> 4
            | (second(k) >> 4) << 2
            | (first(k + m) >> 4) << 4
            | (second(k + m) >> 4) << 6;
    }
}

/// Unpacks one block of `q.len()` values (a multiple of 32, at most [`Q6_BLOCK`]) packed by
/// [`quantize_q6`] from `block` (`3 * q.len() / 4` bytes) into their integers `u - 32`.
pub fn q6_unpack_block(block: &[u8], q: &mut [i8]) {
    let (nibbles, high) = block.split_at(q.len() / 2);
    let m = high.len();
    for (p, &byte) in nibbles.iter().enumerate() {
        // Nibble byte p's high pairs: in high byte p % m, bits 0-3 for the first m bytes.
        let h = high[p % m] >> (4 * (p >= m) as u32);
        let at = 32 * (p / 16) + p % 16;
        q[at] = ((byte & 15) | (h & 3) << 4) as i8 - 32;
        q[at + 16] = ((byte >> 4) | (h >> 2 & 3) << 4) as i8 - 32;
    }
}

/// The q6 integer (`u - 32`, in -32..=31) at index `c` of a row packed by [`quantize_q6`]
/// (`row` its `3 * cols / 4` bytes).
#[inline]
pub fn q6_int(row: &[u8], cols: usize, c: usize) -> i32 {
    let (b, i) = (c / Q6_BLOCK, c % Q6_BLOCK);
    let n = (cols - b * Q6_BLOCK).min(Q6_BLOCK);
    let block = &row[b * Q6_BLOCK / 4 * 3..];
    let (nibbles, m) = (n / 2, n / 4);
    let (p, second) = (16 * (i / 32) + i % 16, i % 32 >= 16);
    let nibble = match second {
        false => block[p] & 15,
        true => block[p] >> 4,
    };
    let shift = 4 * (p >= m) as u32 + 2 * second as u32;
    let high = (block[nibbles + p % m] >> shift) & 3;
    (nibble | high << 4) as i32 - 32
}

/// The q6 value at row-major index `i` of a tensor `cols` wide: `q * scale`.
#[inline]
pub fn q6_value(packed: &[u8], scales: &[u16], cols: usize, group_size: usize, i: usize) -> f32 {
    let (r, c) = (i / cols, i % cols);
    let row = &packed[r * cols / 4 * 3..(r + 1) * cols / 4 * 3];
    q6_int(row, cols, c) as f32 * f16_scale(scales, i / group_size)
}

/// Dequantizes row `r` of a q6 tensor `cols` wide into `out` (`cols` values).
pub fn dequantize_q6_row(
    packed: &[u8],
    scales: &[u16],
    cols: usize,
    gs: usize,
    r: usize,
    out: &mut [f32],
) {
    for (c, o) in out.iter_mut().enumerate() {
        *o = q6_value(packed, scales, cols, gs, r * cols + c);
    }
}

/// A q6 tensor as a model file holds it, borrowed: rows `cols` wide packed by [`quantize_q6`],
/// `scales[g]` (f16 bits) group `g`'s.
#[derive(Debug, Clone, Copy)]
pub struct Q6<'a> {
    pub packed: &'a [u8],
    pub scales: &'a [u16],
    pub group_size: usize,
    pub cols: usize,
}

impl Q6<'_> {
    /// The value at row-major index `i`.
    #[inline]
    pub fn value(&self, i: usize) -> f32 {
        q6_value(self.packed, self.scales, self.cols, self.group_size, i)
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        dequantize_q6_row(self.packed, self.scales, self.cols, self.group_size, r, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::quant::{q4_value, quantize_q4};
    use crate::testing::lcg;

    /// q6: every value within half a step of its stored level (or clamped), the error well
    /// below q4's, and the packing as documented, for a row of a full and a short block.
    #[test]
    fn q6_error_and_packing() {
        let mut seed = 13;
        for (gs, cols) in [(32, 160), (64, 256), (32, 32), (32, 224)] {
            let w: Vec<f32> = (0..cols * 40)
                .map(|i| (0..4).map(|_| lcg(&mut seed)).sum::<f32>() * (1.0 + (i / gs % 7) as f32))
                .collect();
            let mut p6 = vec![0u8; w.len() / 4 * 3];
            let mut s6 = vec![0u16; w.len() / gs];
            quantize_q6(&w, cols, gs, &mut p6, &mut s6);
            let (mut p4, mut s4) = (vec![0u8; w.len() / 2], vec![0u16; w.len() / gs]);
            quantize_q4(&w, gs, &mut p4, &mut s4);
            let (mut e6, mut e4) = (0.0f64, 0.0f64);
            for (i, &x) in w.iter().enumerate() {
                let d = f16_scale(&s6, i / gs);
                let q = q6_value(&p6, &s6, cols, gs, i);
                let nearest = (x / d).round().clamp(-32.0, 31.0) * d;
                assert!(
                    (x - q).abs() <= (x - nearest).abs() + d.abs() * 1e-4,
                    "{i}: {x} -> {q}"
                );
                e6 += ((x - q) as f64).powi(2);
                e4 += ((x - q4_value(&p4, &s4, gs, i)) as f64).powi(2);
            }
            // Four times finer steps: about a sixteenth of the squared error.
            assert!(e6 < e4 / 10.0, "{gs} {cols}: q6 {e6} vs q4 {e4}");
        }
        // The layout, by hand: a row of 32 (one short block: 16 nibble bytes, 8 high bytes).
        let mut w = [0.0f32; 32];
        // d = 1 (m = -32); u = q + 32: value 0 -> 0, value 16 -> 63, value 8 -> 32 + 5 = 37.
        (w[0], w[16], w[8], w[24]) = (-32.0, 31.0, 5.0, -17.0);
        let (mut p, mut s) = ([0u8; 24], [0u16; 1]);
        quantize_q6(&w, 32, 32, &mut p, &mut s);
        assert_eq!(half::f16::from_bits(s[0]).to_f32(), 1.0);
        // Byte 0: value 0 (u 0) low, value 16 (u 63: nibble 15) high.
        assert_eq!(p[0], 15 << 4);
        // Byte 8: value 8 (u 37 = 0b10_0101) low, value 24 (u 15) high.
        assert_eq!(p[8], 5 | 15 << 4);
        // m = 8 high bytes: byte 0 holds byte 0's (0, 3) and byte 8's (2, 0) high bits.
        assert_eq!(p[16], 3 << 2 | 2 << 4);
        let mut q = [0i8; 32];
        q6_unpack_block(&p, &mut q);
        assert_eq!((q[0], q[16], q[8], q[24]), (-32, 31, 5, -17));
        assert!((0..32).all(|i| q[i] as i32 == q6_int(&p, 32, i)));
        assert_eq!(q6_int(&p, 32, 8), 5);
        assert_eq!(q6_int(&p, 32, 24), -17);
        assert_eq!(q6_int(&p, 32, 16), 31);
    }
}
