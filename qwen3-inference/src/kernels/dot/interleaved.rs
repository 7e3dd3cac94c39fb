//! The interleaved order of q4, q6 and q8 weights that the AVX-512 kernels read: sixteen groups
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
//! are laid out to match ([`lay_out`]), so that each of the eight `vpdpbusd` of a block (four
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
//! same rule ([`lay_out`]): vector `m` of a block holds values `4m .. 4m + 4` of each group,
//! which for groups of 32 is q4's order exactly.

use super::q4::{Q4Layout, SIMD_GROUP};
use crate::format::reader::Derived;
use crate::format::view::TensorData;
use crate::format::{DType, KQuant, ModelFile};
use crate::pages::HugePages;
use crate::quant::{q6_unpack_block, Q4, Q6_BLOCK, Q8};
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::collections::HashMap;

/// Groups a block holds side by side: one per 32-bit lane of a 512-bit vector.
pub const GROUPS: usize = 16;

/// Whether q4 and q6 matrices in groups of `group_size` are interleaved: groups of 32 only.
pub const fn interleaves(group_size: usize) -> bool {
    group_size == SIMD_GROUP
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
    assert!(cols.is_multiple_of(SIMD_GROUP) && packed.len() == out.len());
    assert!(packed.len().is_multiple_of(row_bytes.max(1)));
    for (src, dst) in packed
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        for (g0, n) in blocks(cols / SIMD_GROUP) {
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
    assert!(cols.is_multiple_of(SIMD_GROUP) && packed.len() == out.len());
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
        let value = |g: usize, j: usize| (v[g * SIMD_GROUP + j] as i32 + 32) as u8;
        for (g0, n) in blocks(cols / SIMD_GROUP) {
            let at = g0 * 24;
            put_q6_block(&mut dst[at..at + 24 * n], n, |l, j| value(g0 + l, j));
        }
    }
}

/// One block of `n` groups of 32 q4 values in the interleaved order, into `dst` (`16 n` bytes):
/// `value(l, j)` (0..=15) is value `j` of group `l`; byte `b` of word `k` of group `l` (values
/// `4k + b` in its low nibble and `16 + 4k + b` in its high one) at `4nk + 4l + b`.
pub(super) fn put_q4_block(dst: &mut [u8], n: usize, value: impl Fn(usize, usize) -> u8) {
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
pub(super) fn put_q6_block(dst: &mut [u8], n: usize, value: impl Fn(usize, usize) -> u8) {
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
/// take this order ([`interleave_q8`], [`lay_out`]; AVX2's q8 prompt kernel reorders each block of weight
/// rows as it reads them, `x86/q8_32_avx2.rs`).
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
fn file_group(row: &[u8], gs: usize, g: usize, out: &mut [u8]) {
    let (l, g0) = (g % GROUPS, g - g % GROUPS);
    let n = GROUPS.min(row.len() / gs - g0);
    for (k, word) in out.chunks_exact_mut(4).enumerate() {
        let at = g0 * gs + k * 4 * n + 4 * l;
        word.copy_from_slice(&row[at..at + 4]);
    }
}

/// Row `r` (`out.len()` values) of a q8 or q4 matrix in the interleaved order, as f32: each
/// group's bytes put back in the file's order, then read as the file's are (`Q8::row`,
/// `Q4::row`). For an embedding table that is also the classifier and lies in this order alone
/// (a GGUF opened for the CPU's kernels, `format::Reader::CpuKernels`): its rows are looked up
/// one token at a time, a copy in the file's order would be the table's size again.
pub fn interleaved_row(data: &TensorData, r: usize, out: &mut [f32]) {
    let cols = out.len();
    let gs = data.group_size().expect("a quantized matrix");
    let per = cols / gs;
    // One group's bytes in the file's order: at most 64 (q8 in groups of 64).
    let mut group = [0u8; 64];
    for (g, out) in out.chunks_exact_mut(gs).enumerate() {
        let scale = r * per + g..r * per + g + 1;
        match data.dtype() {
            DType::Q8 => {
                let Q8 { q, scales, .. } = data.q8();
                let row: &[u8] = bytemuck::cast_slice(&q[r * cols..(r + 1) * cols]);
                let group = &mut group[..gs];
                file_group(row, gs, g, group);
                // Stored plus 128 (`q ^ 0x80`, the module's text).
                group.iter_mut().for_each(|b| *b ^= 0x80);
                let q = bytemuck::cast_slice(group);
                let scales = &scales[scale];
                Q8 {
                    q,
                    scales,
                    group_size: gs,
                }
                .row(0, out);
            }
            DType::Q4 => {
                let Q4 { packed, scales, .. } = data.q4();
                let row = &packed[r * cols / 2..(r + 1) * cols / 2];
                // A group of 32 q4 values is 16 bytes, interleaved as q8's words are.
                let group = &mut group[..gs / 2];
                file_group(row, gs / 2, g, group);
                let scales = &scales[scale];
                Q4 {
                    packed: group,
                    scales,
                    group_size: gs,
                }
                .row(0, out);
            }
            d => panic!("{d} has no interleaved rows to read"),
        }
    }
}

/// Which order a matrix of [`interleave_file`] takes.
#[derive(Clone, Copy)]
enum Order {
    Q4,
    Q6,
    /// q8 in groups of this many.
    Q8(usize),
    /// GGUF's Q4_K or Q6_K (`k_interleaved.rs`).
    K(KQuant),
}

/// Every q4 and q6 matrix of `file` in groups of 32 (and, where `q8`, every q8 one in groups of
/// 32 or 64; where `k`, every Q4_K and Q6_K one, `k_interleaved.rs`), interleaved, in one buffer
/// of huge pages (each at a multiple of 64 bytes, laid out as in the file: its values, then its
/// scales), for [`ModelFile::derived`]. The rows are reordered in parallel; the file's bytes are
/// read once.
///
/// The embedding table is left out unless it is also the classifier (tied, in a model that
/// generates): otherwise only its rows are looked up, in the file's order, and a copy would be
/// memory for nothing (Qwen3-8B's untied q8 table: 622 MB).
pub fn interleave_file(file: &ModelFile, q8: bool, k: bool) -> Result<Derived> {
    let embedding_is_classifier = file.config().classifier_is_embedding();
    let mut jobs = Vec::new();
    let (mut at, mut len) = (HashMap::new(), 0usize);
    for info in &file.header().tensors {
        if info.name == "model.embed_tokens.weight" && !embedding_is_classifier {
            continue;
        }
        let t = file.tensor(&info.name)?;
        if t.interleaved.is_some() {
            // Laid out in this order at open (a GGUF's matrix, `format::Reader::CpuKernels`).
            continue;
        }
        // A GGUF's Q8_0 repacked at open for any reader is read in the file's order rather
        // than copied again, but for the embedding table that is also the classifier.
        let q8 = q8 && (!file.is_repacked(&info.name) || info.name == "model.embed_tokens.weight");
        // The values' bytes (the tensor's first ones) and their order.
        let (values, order) = match (t.data.dtype(), t.data.group_size()) {
            (DType::Q4, Some(gs)) if interleaves(gs) => (t.data.q4().packed.len(), Order::Q4),
            (DType::Q6, Some(gs)) if interleaves(gs) => (t.data.q6().packed.len(), Order::Q6),
            (DType::Q8, Some(gs)) if q8 && interleaves_q8(gs) => {
                (t.data.q8().q.len(), Order::Q8(gs))
            }
            (DType::K(kind), _) if k && super::k_interleaved::interleaves(kind) => {
                (t.data.k_quant().1.len(), Order::K(kind))
            }
            _ => continue,
        };
        let cols = *t.shape.last().context("a matrix without a shape")? as usize;
        // The tensor as the file lays it out (values, then its scales), the values reordered.
        let start = len.next_multiple_of(64);
        len = start + info.nbytes as usize;
        at.insert(info.name.clone(), start..len);
        let whole = file.tensor_bytes(&info.name)?;
        jobs.push((&whole[..values], whole, cols, order, start));
    }
    let mut bytes = HugePages::<u8>::zeroed(len).with_context(|| {
        format!(
            "cannot allocate {:.1} MiB for the quantized weights in the AVX-512 kernels' order",
            len as f64 / 1048576.0
        )
    })?;
    // Each matrix's own part of the buffer, then the parts filled in parallel, a few rows a task.
    let mut rest: &mut [u8] = &mut bytes;
    let mut done = 0;
    let mut parts = Vec::with_capacity(jobs.len());
    for (packed, whole, cols, order, start) in jobs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - done);
        let (dst, tail) = tail.split_at_mut(whole.len());
        (rest, done) = (tail, start + whole.len());
        // The scales (and the padding before them) as they are.
        let (dst, scales) = dst.split_at_mut(packed.len());
        scales.copy_from_slice(&whole[packed.len()..]);
        parts.push((packed, cols, order, dst));
    }
    parts
        .into_par_iter()
        .for_each(|(packed, cols, order, dst)| {
            let row_bytes = match order {
                Order::Q4 => cols / 2,
                Order::Q6 => cols / 4 * 3,
                Order::Q8(_) => cols,
                Order::K(kind) => kind.row_bytes(cols),
            };
            let piece = row_bytes * (65536 / row_bytes).max(1);
            dst.par_chunks_mut(piece)
                .zip(packed.par_chunks(piece))
                .for_each(|(d, s)| match order {
                    Order::Q4 => interleave_q4(s, cols, d),
                    Order::Q6 => interleave_q6(s, cols, d),
                    Order::Q8(gs) => interleave_q8(s, cols, gs, d),
                    Order::K(kind) => super::k_interleaved::interleave_k(kind, s, cols, d),
                });
        });
    Ok(Derived::new(bytes, at))
}

/// `packed` (q4 rows of `cols` weights, or q6 ones with `six`, in groups of `gs`, in the file's
/// order) in the order the kernels that read `layout` take: interleaved for groups of 32 when
/// `layout` says so, as it is otherwise. For tests and benchmarks, which make their weights in
/// the file's order.
pub fn packed_for_kernels(
    layout: Q4Layout,
    six: bool,
    packed: &[u8],
    cols: usize,
    gs: usize,
) -> Vec<u8> {
    if !(layout.interleaves() && interleaves(gs)) {
        return packed.to_vec();
    }
    let mut out = vec![0u8; packed.len()];
    match six {
        true => interleave_q6(packed, cols, &mut out),
        false => interleave_q4(packed, cols, &mut out),
    }
    out
}

/// q8 rows (`[rows, cols]`, groups of `gs`) as the kernels of `d` read them:
/// interleaved where `d` has [`super::Dots::q8_interleaved`] and the group size interleaves, as
/// they are otherwise. For tests and benchmarks, which make their weights in the file's order.
pub fn q8_for_kernels(d: &super::Dots, q: &[i8], cols: usize, gs: usize) -> Vec<i8> {
    if !(d.q8_interleaved.is_some() && interleaves_q8(gs)) {
        return q.to_vec();
    }
    let mut out = vec![0u8; q.len()];
    interleave_q8(bytemuck::cast_slice(q), cols, gs, &mut out);
    bytemuck::cast_slice(&out).to_vec()
}

/// One token's quantized activations `q` (a row, groups of `gs`: 32, or 64 for q8) in the order
/// the interleaved kernels read, into `x` (as long), and each group's correction `-8 * sum(q)` into
/// `corr` (one per group): q4 weights are stored as `q + 8`, so each lane's byte products are
/// `8 * sum(q)` too large (q6's `q + 32` and q8's `q + 128` take the correction 4 and 16 times,
/// in the kernel).
///
/// Block by block, as the weights: for vector `m` (`gs / 4` of them), for group `l`, the four
/// values `4m .. 4m + 4` of group `l`: in groups of 32, vectors 0-3 are the activations the low
/// nibbles of q4's four words meet and vectors 4-7 those the high ones meet; vector `m` is what
/// q8's word `m` meets.
pub fn lay_out(q: &[i8], gs: usize, x: &mut [i8], corr: &mut [i32]) {
    assert!(x.len() == q.len() && corr.len() == q.len() / gs);
    interleave_words(bytemuck::cast_slice(q), gs, bytemuck::cast_slice_mut(x));
    for (c, group) in corr.iter_mut().zip(q.chunks_exact(gs)) {
        *c = -8 * group.iter().map(|&v| v as i32).sum::<i32>();
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

    /// The activations meet the weights of the same column: position `p` of the laid-out row
    /// holds the activation that weight byte `p % (4n)` of its vector multiplies (for groups
    /// of 32, vectors 0-3 meet q4's low nibbles, values `4k ..`, and 4-7 its high ones, values
    /// `16 + 4k ..`).
    #[test]
    fn activations_meet_their_weights() {
        for (gs, groups) in [(32, 1), (32, 16), (32, 21), (64, 1), (64, 16), (64, 19)] {
            let cols = gs * groups;
            let q: Vec<i8> = (0..cols).map(|c| (c % 251) as i8).collect();
            let (mut x, mut corr) = (vec![0i8; cols], vec![0i32; groups]);
            lay_out(&q, gs, &mut x, &mut corr);
            for (g0, n) in blocks(groups) {
                for m in 0..gs / 4 {
                    for l in 0..n {
                        for b in 0..4 {
                            let at = g0 * gs + m * 4 * n + 4 * l + b;
                            let col = (g0 + l) * gs + 4 * m + b;
                            assert_eq!(x[at], q[col], "{gs}: {groups} groups, position {at}");
                        }
                    }
                }
            }
            for (g, &c) in corr.iter().enumerate() {
                let sum: i32 = q[g * gs..(g + 1) * gs].iter().map(|&v| v as i32).sum();
                assert_eq!(c, -8 * sum);
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

    /// A row of a q8 or q4 matrix in the interleaved order reads back, value for value, as the
    /// file's row does: rows of whole blocks and a short one, every row of three.
    #[test]
    fn interleaved_rows_read_back_as_the_files() {
        let mut seed = 11;
        for (gs, groups) in [
            (32, 1),
            (32, 16),
            (32, 20),
            (32, 35),
            (64, 3),
            (64, 16),
            (64, 19),
        ] {
            let (rows, cols) = (3, gs * groups);
            let w = next_values(rows * cols, &mut seed);
            let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
            // q8
            let (mut q, mut scales) = (vec![0i8; rows * cols], vec![0f32; rows * groups]);
            crate::quant::quantize_q8(&w, gs, &mut q, &mut scales);
            let mut out = vec![0u8; q.len()];
            interleave_q8(bytemuck::cast_slice(&q), cols, gs, &mut out);
            let file = Q8 {
                q: &q,
                scales: &scales,
                group_size: gs,
            };
            let q = bytemuck::cast_slice(&out);
            let interleaved = TensorData::from(Q8 {
                q,
                scales: &scales,
                group_size: gs,
            });
            for r in 0..rows {
                file.row(r, &mut want);
                interleaved_row(&interleaved, r, &mut got);
                assert_eq!(got, want, "q8 in groups of {gs}: {groups} groups, row {r}");
            }
            // q4, in groups of 32 only
            if gs != 32 {
                continue;
            }
            let (mut p, mut scales) = (vec![0u8; rows * cols / 2], vec![0u16; rows * groups]);
            quantize_q4(&w, gs, &mut p, &mut scales);
            let mut out = vec![0u8; p.len()];
            interleave_q4(&p, cols, &mut out);
            let file = Q4 {
                packed: &p,
                scales: &scales,
                group_size: gs,
            };
            let interleaved = TensorData::from(Q4 {
                packed: &out,
                scales: &scales,
                group_size: gs,
            });
            for r in 0..rows {
                file.row(r, &mut want);
                interleaved_row(&interleaved, r, &mut got);
                assert_eq!(got, want, "q4: {groups} groups, row {r}");
            }
        }
    }

    /// The embedding table is copied into the kernels' order only when it is also the classifier
    /// (tied): an untied table is only ever read a row at a time, in the file's order, and a copy
    /// of it would be memory for nothing. The matrices around it are copied either way.
    #[test]
    fn only_a_tied_embedding_is_interleaved() {
        for tied in [true, false] {
            let dir = std::env::temp_dir().join(format!("pq-interleaved-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("q8-tied-{tied}.bin"));
            let mut c = crate::testing::model::config(crate::format::DType::Q8);
            (c.group_size, c.hidden_size, c.intermediate_size) = (32, 64, 64);
            c.tie_word_embeddings = tied;
            crate::testing::model::write_random_config(&path, &c);
            let file = ModelFile::open(&path).unwrap();
            let derived = interleave_file(&file, true, true).unwrap();
            let has = |name: &str| derived.get(name).is_some();
            assert_eq!(has("model.embed_tokens.weight"), tied, "tied: {tied}");
            assert_eq!(has("lm_head.weight"), !tied, "tied: {tied}");
            assert!(has("model.layers.0.mlp.down_proj.weight"), "tied: {tied}");
            drop(file);
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}
