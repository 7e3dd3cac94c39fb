//! GGUF's Q4_K and Q6_K blocks in the kernels' own orders ([`KOrder`]): the AVX-512 kernels'
//! (`interleaved.rs`), sixteen groups of 32 weights side by side, lane `l` of a 512-bit vector
//! holding group `l`, so that a group's integer sum comes out of the byte products in one lane;
//! and AVX2's, eight rows side by side ("Eight rows" below).
//!
//! ## Why
//!
//! In the GGUF a Q4_K block's eight sub-blocks of 32 share their bytes in pairs (the low nibbles
//! of 32 bytes one sub-block, the high ones the next), and their 6-bit scales and minimums are
//! packed into 12 bytes. The kernels that read the blocks where the file holds them
//! (`x86/k_quants.rs`) take a sub-block's sums across vector lanes and unpack the scales with
//! scalar bit operations, block by block: about 30 vector and 20 scalar operations for 256
//! weights, which bounded a one-token product at 31-35 GMAC/s from the caches on a Zen 4 core,
//! where the q4 kernels on this order run about 70 (docs/kernels.md). Reordered once, when the
//! model is loaded, a Q4_K matrix runs on q4's tiles: the same eight `vpdpbusd` per 512
//! weights, each lane ending with its sub-block's whole integer sum.
//!
//! ## The order
//!
//! A row of `cols` weights (whole blocks of 256) is cut into *interleaved blocks* of 16 groups
//! of 32 (two GGUF blocks), the last one of 8 groups (one GGUF block) when the row has an odd
//! number of GGUF blocks. An interleaved block of `n` groups takes exactly the bytes of its
//! `n / 8` GGUF blocks, and the same place in the row: a row keeps its length, and rows are
//! sliced as in the file.
//!
//! ```text
//! Q4_K, n groups (sub-blocks of 32), 18n bytes:
//!   0 .. 16n       nibbles, q4's interleaved order (`put_q4_block`): group l's word k (its
//!                  values 4k.. in the low nibbles, 16 + 4k.. in the high) at 4nk + 4l
//!   16n .. 17n     byte l: sc_l | (m_l >> 4) << 6     (the 6-bit scale, the minimum's top bits)
//!   17n .. 17.5n   byte i: m_i & 15 | (m_(i + n/2) & 15) << 4     (the minimums' low nibbles)
//!   17.5n .. 18n   each GGUF block's d and dmin (f16), as the block holds them
//!
//! Q6_K, n groups (two sub-blocks of 16 each), 26.25n bytes:
//!   0 .. 24n       q + 32 (0..=63) in q6's interleaved order (`put_q6_block`): group l's low
//!                  nibbles hold sub-block 2l's values, its high nibbles sub-block 2l + 1's
//!   24n .. 25n     byte l: sub-block 2l's scale (i8)
//!   25n .. 26n     byte l: sub-block 2l + 1's scale
//!   26n .. 26.25n  each GGUF block's d (f16)
//! ```
//!
//! In q4's order the low nibbles of a group's four words are its values 0..16 and the high
//! ones 16..32: a Q6_K group's two sub-blocks of 16, each with its own scale, are the two
//! halves a q4 tile already sums apart (decode's two chains of `vpdpbusd`). Every scale is kept
//! as it is (d, dmin as f16, the integer scales as integers), so the kernels compute with the
//! GGUF's weights bit for bit; `x86/k_interleaved.rs` reads this order, tested against the
//! scalar reference on the GGUF's blocks (`k_quants.rs`). Q5_K is not reordered (its kernels
//! read the file's blocks).

//!
//! ## Eight rows (AVX2)
//!
//! AVX2 has neither `vpdpbusd` nor 16 lanes; its file-order kernels spend more of a block on
//! picking scales and adding across lanes than on products. In [`KOrder::Rows8`] a 32-bit lane
//! is a weight row: eight rows' blocks `b` lie together (the 1152 bytes of their eight GGUF
//! blocks), so that one broadcast of four activations meets the same four columns of eight
//! rows, every sum stays in its row's lane (no adding across lanes), and one `vpmaddwd` scales
//! a sub-block of all eight rows by their integer scales:
//!
//! ```text
//! Q4_K, 8 rows, block b (1152 bytes):
//!   0 .. 1024      pair p (0..4), word k (0..8): 32 bytes, row r's bytes 4k..4k + 4 of its
//!                  block's pair p at 4r (low nibbles: sub-block 2p's values 4k..; high: 2p + 1's)
//!   1024 .. 1120   the 12 scale bytes, as three vectors: bytes 4i..4i + 4 of row r at 32i + 4r
//!   1120 .. 1136   row r's d (f16) at 2r;   1136 .. 1152   row r's dmin
//!
//! Q6_K, 8 rows, block b (1680 bytes): each row's 52 words of 4 bytes (`ql`'s 32, `qh`'s 16,
//! the 16 scales' 4) in that order, word i of the eight rows at 32i (row r's at 32i + 4r); then
//! row r's d (f16) at 1664 + 2r.
//! ```
//!
//! Every byte is the GGUF's, moved: the 6-bit scales are unpacked for the eight rows at once in
//! the kernel (`x86/k_rows8.rs`), and Q6_K's values from their two parts. A matrix keeps its
//! length, and each set of 8 rows the bytes of its rows.

use super::interleaved::{blocks, put_q4_block, put_q6_block};
use crate::format::KQuant;
use crate::gguf::blocks::{q4_k_nibble, q6_k_int, q6_k_parts, scale_min};

/// Groups of 32 a GGUF block of 256 holds.
const BLOCK_GROUPS: usize = 8;

/// The orders a family's K-quant kernels read, one per family that has such kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KOrder {
    /// AVX-512's: sixteen groups of 32 of one row side by side (the text above).
    Groups,
    /// AVX2's: eight rows side by side, a 32-bit lane a row ("Eight rows" below).
    Rows8,
}

impl KOrder {
    /// Whether matrices of `kind` are reordered: Q4_K and Q6_K (Q5_K's kernels read the file's
    /// blocks).
    pub const fn takes(self, kind: KQuant) -> bool {
        matches!(kind, KQuant::Q4K | KQuant::Q6K)
    }

    /// The rows the order lays out together: a matrix (each of a stacked tensor's matrices)
    /// whose rows this does not divide keeps the file's order, so that every slice of whole
    /// matrices, and every part of one the threads take (whole multiples of 16 rows but the
    /// last, `kernels/matmul.rs`), holds whole sets of rows.
    pub const fn rows(self) -> usize {
        match self {
            KOrder::Groups => 1,
            KOrder::Rows8 => 8,
        }
    }
}

/// The interleaved blocks of a row of `cols` weights: `(first group, groups, first byte)`, the
/// byte in the row's bytes of `kind`.
pub fn k_blocks(kind: KQuant, cols: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    blocks(cols / 32).map(move |(g0, n)| (g0, n, g0 / BLOCK_GROUPS * kind.block_bytes()))
}

/// `w` (rows of `cols` weights, whole GGUF blocks of `kind`, one that `order` takes) in
/// `order`, into `out` (as long as `w`). For [`KOrder::Rows8`], `w` is whole sets of 8 rows.
pub fn interleave_k(order: KOrder, kind: KQuant, w: &[u8], cols: usize, out: &mut [u8]) {
    let row = kind.row_bytes(cols);
    assert!(order.takes(kind) && cols.is_multiple_of(256) && w.len() == out.len());
    assert!(w.len().is_multiple_of((order.rows() * row).max(1)));
    if order == KOrder::Rows8 {
        return put_rows8(kind, w, cols, out);
    }
    for (src, dst) in w.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        for (_, n, at) in k_blocks(kind, cols) {
            let len = n / BLOCK_GROUPS * kind.block_bytes();
            let (src, dst) = (&src[at..at + len], &mut dst[at..at + len]);
            match kind {
                KQuant::Q4K => put_q4_k(src, n, dst),
                _ => put_q6_k(src, n, dst),
            }
        }
    }
}

/// `n / 8` Q4_K blocks (`src`) as one interleaved block of `n` groups (`dst`).
fn put_q4_k(src: &[u8], n: usize, dst: &mut [u8]) {
    let bb = KQuant::Q4K.block_bytes();
    // Group l is sub-block l % 8 of GGUF block l / 8.
    let block = |l: usize| &src[l / BLOCK_GROUPS * bb..][..bb];
    let (values, rest) = dst.split_at_mut(16 * n);
    put_q4_block(values, n, |l, j| {
        q4_k_nibble(&block(l)[16..], l % BLOCK_GROUPS, j)
    });
    let (scales, rest) = rest.split_at_mut(n);
    let (mins, d) = rest.split_at_mut(n / 2);
    mins.fill(0);
    for l in 0..n {
        let (sc, m) = scale_min(&block(l)[4..16], l % BLOCK_GROUPS);
        scales[l] = sc | (m >> 4) << 6;
        mins[l % (n / 2)] |= (m & 15) << (4 * (l / (n / 2)));
    }
    for (i, d) in d.chunks_exact_mut(4).enumerate() {
        d.copy_from_slice(&src[i * bb..i * bb + 4]);
    }
}

/// Rows of `kind` (`src`, whole sets of 8 rows of `cols` weights) in [`KOrder::Rows8`] (`dst`):
/// each set's blocks `b` together, row `r`'s GGUF block put into them by its kind's rule.
fn put_rows8(kind: KQuant, src: &[u8], cols: usize, dst: &mut [u8]) {
    let (bb, blocks) = (kind.block_bytes(), cols / 256);
    let row = blocks * bb;
    for (src, dst) in src.chunks_exact(8 * row).zip(dst.chunks_exact_mut(8 * row)) {
        for (b, dst) in dst.chunks_exact_mut(8 * bb).enumerate() {
            for r in 0..8 {
                let block = &src[r * row + b * bb..][..bb];
                match kind {
                    KQuant::Q4K => put_q4_k_row8(block, r, dst),
                    _ => put_q6_k_row8(block, r, dst),
                }
            }
        }
    }
}

/// Row `r`'s Q4_K block into its set's 1152 bytes (`dst`).
fn put_q4_k_row8(block: &[u8], r: usize, dst: &mut [u8]) {
    // Word k of pair p: the row's bytes 4k.. of the pair's 32, at lane r.
    for (pk, word) in block[16..].chunks_exact(4).enumerate() {
        dst[32 * pk + 4 * r..][..4].copy_from_slice(word);
    }
    // The 12 scale bytes in three vectors of 4 a row, then d and dmin.
    for (i, four) in block[4..16].chunks_exact(4).enumerate() {
        dst[ROWS8_SCALES + 32 * i + 4 * r..][..4].copy_from_slice(four);
    }
    dst[ROWS8_D + 2 * r..][..2].copy_from_slice(&block[0..2]);
    dst[ROWS8_DMIN + 2 * r..][..2].copy_from_slice(&block[2..4]);
}

/// Row `r`'s Q6_K block into its set's 1680 bytes (`dst`).
fn put_q6_k_row8(block: &[u8], r: usize, dst: &mut [u8]) {
    // Word k of `ql`'s 32-byte pieces (half n, chunk c: 2n + c), then of `qh`'s (half n), then
    // the 16 scales as four words: row r's at 4r.
    for (i, word) in block[..208].chunks_exact(4).enumerate() {
        dst[32 * i + 4 * r..][..4].copy_from_slice(word);
    }
    dst[ROWS8_Q6_D + 2 * r..][..2].copy_from_slice(&block[208..210]);
}

/// Where, in a set of 8 Q6_K blocks in [`KOrder::Rows8`] (1680 bytes), their `d`s start (`ql`'s
/// words from 0, `qh`'s from 1024, the scales' from 1536).
pub(crate) const ROWS8_Q6_D: usize = 1664;

/// Where, in a set of 8 Q4_K blocks in [`KOrder::Rows8`] (1152 bytes), their scales' three
/// vectors start, their `d`s and their `dmin`s.
pub(crate) const ROWS8_SCALES: usize = 1024;
/// See [`ROWS8_SCALES`].
pub(crate) const ROWS8_D: usize = 1120;
/// See [`ROWS8_SCALES`].
pub(crate) const ROWS8_DMIN: usize = 1136;

/// `n / 8` Q6_K blocks (`src`) as one interleaved block of `n` groups (`dst`).
fn put_q6_k(src: &[u8], n: usize, dst: &mut [u8]) {
    let bb = KQuant::Q6K.block_bytes();
    let block = |l: usize| q6_k_parts(&src[l / BLOCK_GROUPS * bb..][..bb]);
    let (values, rest) = dst.split_at_mut(24 * n);
    put_q6_block(values, n, |l, j| {
        let (ql, qh, ..) = block(l);
        (q6_k_int(ql, qh, 32 * (l % BLOCK_GROUPS) + j) + 32) as u8
    });
    let (first, rest) = rest.split_at_mut(n);
    let (second, d) = rest.split_at_mut(n);
    for l in 0..n {
        let scales = block(l).2;
        first[l] = scales[2 * (l % BLOCK_GROUPS)];
        second[l] = scales[2 * (l % BLOCK_GROUPS) + 1];
    }
    for (i, d) in d.chunks_exact_mut(2).enumerate() {
        d.copy_from_slice(&src[i * bb + 208..i * bb + 210]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::blocks::k_quant_value;
    use half::f16;

    /// Weight `c` of an interleaved row, read back by the rule of the module's text.
    fn value(kind: KQuant, row: &[u8], cols: usize, c: usize) -> f32 {
        let (g, j) = (c / 32, c % 32);
        let (g0, n, at) = k_blocks(kind, cols).find(|&(g0, n, _)| g < g0 + n).unwrap();
        let b = &row[at..];
        let l = g - g0;
        let (k, byte) = ((j % 16) / 4, j % 4);
        let nibbles = b[k * 4 * n + 4 * l + byte];
        let nibble = if j < 16 { nibbles & 15 } else { nibbles >> 4 };
        let f16_at = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        match kind {
            KQuant::Q4K => {
                let scale = b[16 * n + l];
                let sc = scale & 63;
                let m = (b[17 * n + l % (n / 2)] >> (4 * (l / (n / 2)))) & 15 | (scale >> 6) << 4;
                let at = 35 * n / 2 + 4 * (l / 8);
                let (d, dmin) = (f16_at(at), f16_at(at + 2));
                (d * sc as f32) * nibble as f32 - dmin * m as f32
            }
            _ => {
                let high = b[16 * n + (k / 2) * 4 * n + 4 * l + byte];
                let shift = 4 * (k % 2) + if j < 16 { 0 } else { 2 };
                let q = (nibble | ((high >> shift) & 3) << 4) as i32 - 32;
                let sc = b[24 * n + if j < 16 { 0 } else { n } + l] as i8;
                let d = f16_at(26 * n + 2 * (l / 8));
                (d * sc as f32) * q as f32
            }
        }
    }

    /// Every byte of sets of eight Q4_K and Q6_K rows is where [`KOrder::Rows8`]'s text says.
    #[test]
    fn rows8_puts_every_byte_where_the_order_says() {
        let mut seed = 6u64;
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            let (bb, per_row) = (kind.block_bytes(), 3);
            let (rows, cols) = (16, 256 * per_row);
            let w = crate::kernels::dot::k_quants::tests::blocks(kind, rows * per_row, &mut seed);
            let mut out = vec![0u8; w.len()];
            interleave_k(KOrder::Rows8, kind, &w, cols, &mut out);
            let row = per_row * bb;
            for r in 0..rows {
                for b in 0..per_row {
                    let block = &w[r * row + b * bb..][..bb];
                    let set = &out[(r / 8) * 8 * row + b * 8 * bb..][..8 * bb];
                    let l = r % 8;
                    for (byte, &v) in block.iter().enumerate() {
                        let at = match (kind, byte) {
                            (KQuant::Q6K, 208..) => ROWS8_Q6_D + 2 * l + byte - 208,
                            (KQuant::Q6K, _) => 32 * (byte / 4) + 4 * l + byte % 4,
                            (_, 0..2) => ROWS8_D + 2 * l + byte,
                            (_, 2..4) => ROWS8_DMIN + 2 * l + byte - 2,
                            (_, 4..16) => {
                                ROWS8_SCALES + 32 * ((byte - 4) / 4) + 4 * l + (byte - 4) % 4
                            }
                            _ => {
                                let (p, k, i) = ((byte - 16) / 32, (byte - 16) % 32 / 4, byte % 4);
                                32 * (8 * p + k) + 4 * l + i
                            }
                        };
                        assert_eq!(set[at], v, "{kind:?} row {r}, block {b}, byte {byte}");
                    }
                }
            }
        }
    }

    /// Every weight of rows of one to five GGUF blocks (an odd number ends in a short block) is
    /// where the module's text says, with the value gguf-py's dequantization gives the GGUF's
    /// block (`blocks.rs`), bit for bit.
    #[test]
    fn every_weight_is_where_the_order_says() {
        let mut seed = 5u64;
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            for per_row in 1..=5 {
                let (rows, cols) = (2, 256 * per_row);
                let bb = kind.block_bytes();
                let w =
                    crate::kernels::dot::k_quants::tests::blocks(kind, rows * per_row, &mut seed);
                let mut out = vec![0u8; w.len()];
                interleave_k(KOrder::Groups, kind, &w, cols, &mut out);
                let row = kind.row_bytes(cols);
                for r in 0..rows {
                    for c in 0..cols {
                        let block = &w[r * row + c / 256 * bb..][..bb];
                        let want = k_quant_value(kind, block, c % 256);
                        let got = value(kind, &out[r * row..][..row], cols, c);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kind:?}, {per_row} blocks a row, ({r}, {c})"
                        );
                    }
                }
            }
        }
    }
}
