//! The interleaved order of q4, q6 and q8 weights that the AVX-512 kernels read
//! (`kernels/dot/x86/interleaved.rs`): sixteen groups
//! side by side, so that lane `l` of a 512-bit vector holds group `l` and a whole group's integer
//! sum comes out of the byte dot products in one lane, with no permute.
//!
//! ## Why another order
//!
//! In the file a group of 32 q4 weights is 16 consecutive bytes (`quant::quantize_q4`: byte `j`
//! holds value `j` in its low nibble and `j + 16` in its high one). A 512-bit load takes four
//! groups, and `vpdpbusd` adds four neighbouring byte products into each 32-bit lane, so a group's
//! sum lands in four lanes: the file order needs permutes and lane additions before its sums can
//! be scaled, about as many instructions as the dot products themselves. Decoding a token on one
//! Zen 4 core was bound by them, not by memory (measured: docs/kernels.md, "The interleaved
//! order"). Reordering the bytes once, when the model is loaded, removes them:
//!
//! ```text
//! file, one row:   [g0: w0 w1 w2 w3 | w4 .. w7 | w8 .. w11 | w12 .. w15] [g1: ..] .. [g15: ..]
//!                  (w_j: byte j of the group, values j and j + 16)
//! interleaved:     word 0 of g0, word 0 of g1, .. word 0 of g15     <- vector 0 (64 bytes)
//!                  word 1 of g0, .. word 1 of g15                   <- vector 1
//!                  word 2 .., word 3 ..                             <- vectors 2, 3
//! ```
//!
//! A *word* is 4 bytes (8 weights). Sixteen groups, 512 weights, are a *block*: 256 bytes of q4.
//! Vector `k` of a block holds word `k` of every group, lane `l` group `l`; its low nibbles meet
//! activations `4k .. 4k + 4` of each group and its high nibbles `16 + 4k ..`. The activations
//! are laid out to match (`kernels/dot/interleaved.rs`'s `lay_out`), so that each of the eight `vpdpbusd` of a block (four
//! vectors, low and high nibbles) adds into lane `l` products of group `l` only: after them the
//! lane holds the group's whole integer sum, which is scaled by the two scales (the weights'
//! scales are already 16 consecutive f16 values in the file) and added into a 16-lane
//! accumulator. The row's sum is the accumulator's lanes added at the end.
//!
//! A row whose groups are not a multiple of 16 ends in a shorter block of `n` groups, laid out
//! the same way with `n` words a vector (`4n` bytes); the kernels read it with masked loads.
//!
//! q6 weights (`quant::quantize_q6`: each value `q + 32`, 0..=63) are interleaved the same way:
//! a block is the four vectors of their low nibbles, as q4's, followed by two vectors of their
//! high bits, 384 bytes. Byte `b` of word `k` of a group has two 2-bit pieces in high vector `k /
//! 2`, at bits `4 (k % 2)` (the low value's) and `4 (k % 2) + 2` (the high value's), so that one
//! shift and one bitwise select put each in bits 4-5 of its nibble.
//!
//! Only groups of 32 are interleaved ([`interleaves`]); the kernels take other group sizes from
//! the file, on the reference. A row keeps its number of bytes, so rows are sliced as in the
//! file.
//!
//! ## q8
//!
//! q8 matrices in groups of 32 or 64 ([`interleaves_q8`]) are interleaved the same way, a group
//! being `gs / 4` words instead of four (8 or 16 vectors a block, 512 or 1024 bytes):
//!
//! ```text
//! interleaved:     word 0 of g0, word 0 of g1, .. word 0 of g15     <- vector 0
//!                  ..
//!                  word gs/4 - 1 of g0, .. of g15                   <- vector gs/4 - 1
//! ```
//!
//! Each value is stored plus 128, as an unsigned byte (`q ^ 0x80`, 1..=255), so that it takes
//! `vpdpbusd`'s unsigned side and the activations, as they are (signed), the other; each group's
//! products are then `128 * sum(x)` too large, which the activations' correction takes away,
//! as q4's does its offset of 8. Without this order the AVX-512 q8 kernel converts and scales
//! each group of each token on its own, four lanes of a vector a group (`x86/avx512.rs`); with
//! it, one conversion and one multiply-add serve 16 groups. The activations are laid out by the
//! same rule (`kernels/dot/interleaved.rs`'s `lay_out`): vector `m` of a block holds values `4m .. 4m + 4` of each group,
//! which for groups of 32 is q4's order exactly.

use super::{q6_unpack_block, Q6_BLOCK};

/// The group size of the interleaved q4 and q6 orders (q8's: also 64).
const GROUP: usize = 32;

/// Groups a block holds side by side: one per 32-bit lane of a 512-bit vector.
pub const GROUPS: usize = 16;

/// Whether q4 and q6 matrices in groups of `group_size` are interleaved: groups of 32 only.
pub const fn interleaves(group_size: usize) -> bool {
    group_size == GROUP
}

/// Whether q8 matrices in groups of `group_size` are interleaved where the CPU's kernels read
/// that order ([`super::Dots::q8_interleaved`]): groups of 32 and 64.
pub const fn interleaves_q8(group_size: usize) -> bool {
    group_size == 32 || group_size == 64
}

/// The blocks of a row of `groups` groups: `(first group, groups in it)`, 16 each but the last.
pub fn blocks(groups: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..groups.div_ceil(GROUPS)).map(move |b| (b * GROUPS, GROUPS.min(groups - b * GROUPS)))
}

/// `packed` (q4 rows of `cols` weights in groups of 32, as the file holds them) in the
/// interleaved order, into `out` (as long as `packed`).
pub fn interleave_q4(packed: &[u8], cols: usize, out: &mut [u8]) {
    let row_bytes = cols / 2;
    assert!(cols.is_multiple_of(GROUP) && packed.len() == out.len());
    assert!(packed.len().is_multiple_of(row_bytes.max(1)));
    for (src, dst) in packed
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        for (g0, n) in blocks(cols / GROUP) {
            // The block's bytes start where its first group's did.
            let at = g0 * 16;
            for l in 0..n {
                for k in 0..4 {
                    let from = at + 16 * l + 4 * k;
                    let to = at + k * 4 * n + 4 * l;
                    dst[to..to + 4].copy_from_slice(&src[from..from + 4]);
                }
            }
        }
    }
}

/// `packed` (q6 rows of `cols` weights in groups of 32, blocks of 128 values as
/// `quant::quantize_q6` writes them) in the interleaved order, into `out` (as long as `packed`).
pub fn interleave_q6(packed: &[u8], cols: usize, out: &mut [u8]) {
    let row_bytes = cols / 4 * 3;
    assert!(cols.is_multiple_of(GROUP) && packed.len() == out.len());
    assert!(packed.len().is_multiple_of(row_bytes.max(1)));
    let mut v = vec![0i8; cols];
    for (src, dst) in packed
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        // The row's values, `q` in -32..=31; stored here as `q + 32`.
        for (b, values) in v.chunks_mut(Q6_BLOCK).enumerate() {
            let n = values.len();
            let at = b * (Q6_BLOCK / 4 * 3);
            q6_unpack_block(&src[at..at + n / 4 * 3], values);
        }
        let value = |g: usize, j: usize| (v[g * GROUP + j] as i32 + 32) as u8;
        for (g0, n) in blocks(cols / GROUP) {
            let at = g0 * 24;
            put_q6_block(&mut dst[at..at + 24 * n], n, |l, j| value(g0 + l, j));
        }
    }
}

/// One block of `n` groups of 32 q4 values in the interleaved order, into `dst` (`16 n` bytes):
/// `value(l, j)` (0..=15) is value `j` of group `l`; byte `b` of word `k` of group `l` (values
/// `4k + b` in its low nibble and `16 + 4k + b` in its high one) at `4nk + 4l + b`.
pub fn put_q4_block(dst: &mut [u8], n: usize, value: impl Fn(usize, usize) -> u8) {
    assert!(dst.len() == 16 * n);
    for l in 0..n {
        for k in 0..4 {
            for b in 0..4 {
                let j = 4 * k + b;
                dst[k * 4 * n + 4 * l + b] = value(l, j) | value(l, 16 + j) << 4;
            }
        }
    }
}

/// One block of `n` groups of 32 q6 values in the interleaved order, into `dst` (`24 n` bytes):
/// `value(l, j)` (0..=63, `q + 32`) is value `j` of group `l`; their low nibbles as
/// [`put_q4_block`] puts q4's, then their two-bit high pieces (the module's text).
pub fn put_q6_block(dst: &mut [u8], n: usize, value: impl Fn(usize, usize) -> u8) {
    assert!(dst.len() == 24 * n);
    dst.fill(0);
    for l in 0..n {
        for k in 0..4 {
            for b in 0..4 {
                let j = 4 * k + b;
                let (lo, hi) = (value(l, j), value(l, 16 + j));
                dst[k * 4 * n + 4 * l + b] = (lo & 15) | (hi & 15) << 4;
                let shift = 4 * (k % 2);
                let high = 16 * n + (k / 2) * 4 * n + 4 * l + b;
                dst[high] |= (lo >> 4) << shift | (hi >> 4) << (shift + 2);
            }
        }
    }
}

/// One row of groups of `gs` bytes (a multiple of 4) in the interleaved order, into `dst` (as
/// long as `src`): word `k` (bytes `4k .. 4k + 4`) of group `l` of a block of `n` groups goes
/// to bytes `4nk + 4l ..` of the block. q8 weights and the interleaved kernels' activations
/// take this order ([`interleave_q8`], `kernels/dot/interleaved.rs`'s `lay_out`; AVX2's q8 prompt kernel reorders each block of weight
/// rows as it reads them, `x86/q8_lanes_avx2.rs`).
pub fn interleave_words(src: &[u8], gs: usize, dst: &mut [u8]) {
    assert!(gs.is_multiple_of(4) && src.len().is_multiple_of(gs) && src.len() == dst.len());
    for (g0, n) in blocks(src.len() / gs) {
        let at = g0 * gs;
        for l in 0..n {
            for k in 0..gs / 4 {
                let (from, to) = (at + gs * l + 4 * k, at + k * 4 * n + 4 * l);
                dst[to..to + 4].copy_from_slice(&src[from..from + 4]);
            }
        }
    }
}

/// `q` (the bytes of q8 rows of `cols` int8 values in groups of `gs`, as the file holds them)
/// in the interleaved order, each value plus 128 (`q ^ 0x80`), into `out` (as long as `q`).
pub fn interleave_q8(q: &[u8], cols: usize, gs: usize, out: &mut [u8]) {
    assert!(interleaves_q8(gs) && cols.is_multiple_of(gs) && q.len() == out.len());
    assert!(q.len().is_multiple_of(cols.max(1)));
    for (src, dst) in q.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        interleave_words(src, gs, dst);
        for b in dst {
            *b ^= 0x80;
        }
    }
}

/// Group `g`'s `gs` bytes of one row in the interleaved order ([`interleave_words`]) as the
/// file lays them out, into `out` (`gs` bytes): word `k` of group `l` of its block lies at
/// bytes `4nk + 4l ..` of the block, `n` the block's groups.
pub fn file_group(row: &[u8], gs: usize, g: usize, out: &mut [u8]) {
    let (l, g0) = (g % GROUPS, g - g % GROUPS);
    let n = GROUPS.min(row.len() / gs - g0);
    for (k, word) in out.chunks_exact_mut(4).enumerate() {
        let at = g0 * gs + k * 4 * n + 4 * l;
        word.copy_from_slice(&row[at..at + 4]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_q4, dequantize_q6_row, quantize_q4, quantize_q6};
    use crate::testing::next_values;

    /// The value of weight `c` of a row in the interleaved q4 order, read back by the rule of the
    /// module's text.
    fn q4_value(row: &[u8], c: usize) -> i32 {
        let (g, j) = (c / 32, c % 32);
        let (g0, n) = blocks(row.len() / 16).find(|&(g0, n)| g < g0 + n).unwrap();
        let (l, k, b) = (g - g0, (j % 16) / 4, j % 4);
        let byte = row[g0 * 16 + k * 4 * n + 4 * l + b];
        (if j < 16 { byte & 15 } else { byte >> 4 }) as i32 - 8
    }

    fn q6_value(row: &[u8], c: usize) -> i32 {
        let (g, j) = (c / 32, c % 32);
        let groups = row.len() / 24;
        let (g0, n) = blocks(groups).find(|&(g0, n)| g < g0 + n).unwrap();
        let (l, k, b) = (g - g0, (j % 16) / 4, j % 4);
        let at = g0 * 24;
        let nibbles = row[at + k * 4 * n + 4 * l + b];
        let high = row[at + 16 * n + (k / 2) * 4 * n + 4 * l + b];
        let (nib, two) = match j < 16 {
            true => (nibbles & 15, (high >> (4 * (k % 2))) & 3),
            false => (nibbles >> 4, (high >> (4 * (k % 2) + 2)) & 3),
        };
        (nib | two << 4) as i32 - 32
    }

    /// Every weight of rows with whole blocks and a short one is where the module's text says,
    /// with the value the file's order holds.
    #[test]
    fn every_weight_is_where_the_order_says() {
        let mut seed = 3;
        for groups in [1, 4, 16, 20, 35] {
            let (rows, cols) = (3, 32 * groups);
            let w = next_values(rows * cols, &mut seed);
            let mut scales = vec![0u16; rows * groups];
            // q4
            let mut p = vec![0u8; rows * cols / 2];
            quantize_q4(&w, 32, &mut p, &mut scales);
            let mut want = vec![0f32; rows * cols];
            dequantize_q4(&p, &scales, 32, &mut want);
            let mut out = vec![0u8; p.len()];
            interleave_q4(&p, cols, &mut out);
            for (r, row) in out.chunks_exact(cols / 2).enumerate() {
                for c in 0..cols {
                    let s = half::f16::from_bits(scales[r * groups + c / 32]).to_f32();
                    let got = q4_value(row, c) as f32 * s;
                    assert_eq!(got, want[r * cols + c], "q4 {groups} groups ({r}, {c})");
                }
            }
            // q6
            if !cols.is_multiple_of(4) {
                continue;
            }
            let mut p = vec![0u8; rows * cols / 4 * 3];
            quantize_q6(&w, cols, 32, &mut p, &mut scales);
            let mut out = vec![0u8; p.len()];
            interleave_q6(&p, cols, &mut out);
            let mut want = vec![0f32; cols];
            for (r, row) in out.chunks_exact(cols / 4 * 3).enumerate() {
                dequantize_q6_row(&p, &scales, cols, 32, r, &mut want);
                for (c, &want) in want.iter().enumerate() {
                    let s = half::f16::from_bits(scales[r * groups + c / 32]).to_f32();
                    let got = q6_value(row, c) as f32 * s;
                    assert_eq!(got, want, "q6 {groups} groups ({r}, {c})");
                }
            }
        }
    }

    /// Every q8 weight of rows with whole blocks and a short one is where the module's text
    /// says, plus 128: byte `b` of word `m` of group `l` of a block at `m * 4n + 4l + b`.
    #[test]
    fn q8_weights_are_where_the_order_says() {
        for (gs, groups) in [(32, 1), (32, 16), (32, 35), (64, 3), (64, 16), (64, 20)] {
            let (rows, cols) = (3, gs * groups);
            let q: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 256) as u8).collect();
            let mut out = vec![0u8; q.len()];
            interleave_q8(&q, cols, gs, &mut out);
            for (src, row) in q.chunks_exact(cols).zip(out.chunks_exact(cols)) {
                for (c, &v) in src.iter().enumerate() {
                    let (g, j) = (c / gs, c % gs);
                    let (g0, n) = blocks(groups).find(|&(g0, n)| g < g0 + n).unwrap();
                    let at = g0 * gs + (j / 4) * 4 * n + 4 * (g - g0) + j % 4;
                    assert_eq!(row[at], v ^ 0x80, "{gs}: {groups} groups, column {c}");
                }
            }
        }
    }
}
