//! Group-wise quantization: symmetric INT8 (the `q8` dtype of the model file) and symmetric
//! 4-bit (`q4`).
//!
//! A row of weights is cut into groups of `group_size` consecutive values. Each group `w` gets one
//! scale `s = max|w| / 127` and stores `q = round_half_even(w / s)`, an integer in [-127, 127];
//! the value it stands for is `q * s`. Because rounding moves a value by at most half a step, the
//! error of every dequantized value is at most `s / 2`. Symmetric (no zero point) keeps the dot
//! product a plain sum of `q_w * q_x` per group, which is what integer SIMD instructions compute.
//! See docs/quantization.md.

use rayon::prelude::*;

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

/// `round_half_even(v)` clamped to [-N, N - 1], the integers of a symmetric grid of `2N` levels
/// (q4: N = 8, q6: N = 32), in a form the compiler vectorizes (the scale search runs it 27 times
/// a value): adding and subtracting 1.5 * 2^23 rounds to an integer in the default
/// round-to-nearest-even mode, exactly for |v| < 2^22; larger values land far outside the grid
/// and are clamped as they would be. (`f32::round_ties_even` is a library call on baseline
/// x86-64, which made the export more than twice as slow.)
#[inline]
fn level<const N: i32>(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    ((v + MAGIC) - MAGIC).clamp(-N as f32, (N - 1) as f32)
}

/// The f16 scale of a group on the grid [-N, N - 1] (`N` = 8 for q4, 32 for q6): of `m / -N`
/// (`m` the value of largest magnitude, which lands on -N exactly) and the least-squares refits
/// of the divisors `-(N - 1.5), -(N - 1.25), ..., -(N + 1.5)`, the one with the smallest squared
/// error after f16 rounding. See [`quantize_q4`].
fn scale_for<const N: i32>(group: &[f32]) -> half::f16 {
    let m = group
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    if m == 0.0 {
        return half::f16::ZERO;
    }
    // The squared error of scale `d`, each value rounded to its nearest level.
    let error = |d: f32| lanes_sum(group, |x| (x - level::<N>(x / d) * d).powi(2));
    let mut best = half::f16::from_f32(m / -(N as f32));
    let mut best_error = error(best.to_f32());
    for step in 0..=12 {
        let d = m / -(N as f32 - 1.5 + 0.25 * step as f32);
        // Least squares for the integers this `d` gives.
        let wq = lanes_sum(group, |x| x * level::<N>(x / d));
        let qq = lanes_sum(group, |x| level::<N>(x / d).powi(2));
        let fitted = half::f16::from_f32(wq / qq);
        let e = error(fitted.to_f32());
        if fitted.to_f32() != 0.0 && e < best_error {
            (best, best_error) = (fitted, e);
        }
    }
    best
}

/// `sum f(x)` over `values`, in eight running sums (one vector's lanes) added at the end: with a
/// single running sum every addition waits for the one before (the compiler may not reorder
/// float additions), which made a 1.7B-shaped q4 export take 68 s instead of 43.
#[inline]
fn lanes_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut eights = values.chunks_exact(8);
    for e in &mut eights {
        for (l, &x) in lanes.iter_mut().zip(e) {
            *l += f(x);
        }
    }
    let tail: f32 = eights.remainder().iter().map(|&x| f(x)).sum();
    lanes.iter().sum::<f32>() + tail
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

/// Group `g`'s scale in a q4 or q6 tensor (stored as f16 bits).
#[inline]
pub fn f16_scale(scales: &[u16], g: usize) -> f32 {
    half::f16::from_bits(scales[g]).to_f32()
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
