//! The block types of the hub's Qwen GGUF files, dequantized: the scalar reference that the
//! kernels which run these types are tested against (`kernels/dot/k_quants.rs`), and the values
//! an embedding row and the plain backend read. Each follows ggml's
//! `dequantize_row_*` (ggml-quants.c) and gguf-py's `quants.py`, with their operations in their
//! order, so that the values are theirs bit for bit (`tests.rs` compares against gguf-py's).
//!
//! A block holds `block_values` weights in `block_bytes` bytes (`super::GGML_TYPES`). The
//! "legacy" types have one f16 scale `d` per 32 weights; the K-quants group 256 weights into
//! sub-blocks of 16 or 32, each with a small integer scale (and, for Q4_K and Q5_K, a minimum)
//! that the block's f16 `d` (and `dmin`) multiply:
//!
//! ```text
//! Q8_0  [d f16][q i8 x 32]                                   w = d * q
//! Q4_0  [d f16][16 bytes: q in low nibbles, then high]      w = d * (q - 8)
//! Q5_0  [d f16][qh u32: bit 4 of each][16 bytes of nibbles]  w = d * (q - 16)
//! Q4_K  [d f16][dmin f16][12 bytes: 8 6-bit scales, 8 mins][128 bytes of nibbles]
//!       w = (d * sc) * q - dmin * m, per sub-block of 32
//! Q5_K  as Q4_K, with [32 bytes: bit 4 of each] before the nibbles
//! Q6_K  [128 bytes: low 4 bits][64 bytes: high 2 bits][16 i8 scales][d f16]
//!       w = (d * sc) * (q - 32), per sub-block of 16
//! ```

use super::GgmlType;
use crate::format::KQuant;
use anyhow::{bail, ensure, Result};
use half::{bf16, f16};

/// The types [`dequantize`] reads.
pub const DEQUANTIZED: [&str; 10] = [
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "I8",
];

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Writes the values of `bytes`, whole blocks of `ty`, into `out` (`bytes.len() /
/// ty.block_bytes * ty.block_values` of them).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (bv, bb) = (ty.block_values as usize, ty.block_bytes as usize);
    ensure!(
        bytes.len().is_multiple_of(bb) && out.len() == bytes.len() / bb * bv,
        "{}: {} bytes for {} values",
        ty.name,
        bytes.len(),
        out.len()
    );
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bv));
    match ty.name {
        "F32" => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        "F16" => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        "BF16" => blocks.for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        "I8" => blocks.for_each(|(b, y)| y[0] = b[0] as i8 as f32),
        "Q8_0" => blocks.for_each(|(b, y)| q8_0(b, y)),
        "Q4_0" => blocks.for_each(|(b, y)| q4_0(b, y)),
        "Q5_0" => blocks.for_each(|(b, y)| q5_0(b, y)),
        "Q4_K" => blocks.for_each(|(b, y)| q4_k(b, y)),
        "Q5_K" => blocks.for_each(|(b, y)| q5_k(b, y)),
        "Q6_K" => blocks.for_each(|(b, y)| q6_k(b, y)),
        other => bail!(
            "GGUF type {other} is not read yet; these are: {}",
            DEQUANTIZED.join(", ")
        ),
    }
    Ok(())
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = q as i8 as f32 * d;
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let (d, qs) = (f16_at(b, 0), &b[2..18]);
    for (j, &q) in qs.iter().enumerate() {
        y[j] = d * ((q & 15) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let (d, qh, qs) = (
        f16_at(b, 0),
        u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
        &b[6..22],
    );
    for (j, &q) in qs.iter().enumerate() {
        let high = |k: usize| (((qh >> k) & 1) << 4) as i32;
        y[j] = d * (((q & 15) as i32 | high(j)) - 16) as f32;
        y[j + 16] = d * (((q >> 4) as i32 | high(j + 16)) - 16) as f32;
    }
}

/// The eight 6-bit scales and eight minimums of a K-quant's 12 scale bytes (ggml's
/// `get_scale_min_k4`), as the bytes of two words: sub-blocks 0..4 whole in the low 6 bits of
/// bytes 0..4 (scales) and 4..8 (minimums); sub-blocks 4..8 split between the nibbles of bytes
/// 8..12 (scale low, minimum high) and the top two bits of bytes 0..4 (scales) and 4..8
/// (minimums). Byte `j` of the first word is sub-block `j`'s scale, of the second its minimum.
#[inline(always)]
pub(crate) fn scales_mins(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (s0, s1, s2) = (word(0), word(4), word(8));
    let (six, four, two) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let sc_high = (s2 & four) | (((s0 >> 6) & two) << 4);
    let m_high = ((s2 >> 4) & four) | (((s1 >> 6) & two) << 4);
    (
        (s0 & six) as u64 | (sc_high as u64) << 32,
        (s1 & six) as u64 | (m_high as u64) << 32,
    )
}

/// Sub-block `j`'s (0..8) scale and minimum ([`scales_mins`]).
pub(crate) fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    let (sc, m) = scales_mins(s);
    ((sc >> (8 * j)) as u8, (m >> (8 * j)) as u8)
}

/// Value `l` (0..32) of sub-block `i` (0..8) of a Q4_K block's nibbles: pairs of sub-blocks
/// share 32 bytes, the first in the low nibbles, the second in the high ones.
pub(crate) fn q4_k_nibble(qs: &[u8], i: usize, l: usize) -> u8 {
    (qs[(i / 2) * 32 + l] >> (4 * (i % 2))) & 15
}

/// Q4_K and (`FIVE`) Q5_K: sub-blocks of 32, pairs of them sharing 32 bytes of nibbles (low
/// nibbles the first, high the second); Q5_K's bit 4 of value `l` of sub-block `i` is bit `i`
/// of its `qh[l]`.
fn k_quant<const FIVE: bool>(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    let (qh, qs) = match FIVE {
        true => (&b[16..48], &b[48..176]),
        false => (&b[0..0], &b[16..144]),
    };
    for (i, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(scales, i);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        for (l, y) in y.iter_mut().enumerate() {
            let mut q = q4_k_nibble(qs, i, l);
            if FIVE {
                q |= ((qh[l] >> i) & 1) << 4;
            }
            *y = d1 * q as f32 - m1;
        }
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    k_quant::<false>(b, y)
}

/// Whole blocks of K-quant `kind` (`bytes`) into their values (`out`, 256 a block).
pub(crate) fn k_quant_blocks(kind: KQuant, bytes: &[u8], out: &mut [f32]) {
    let block: fn(&[u8], &mut [f32]) = match kind {
        KQuant::Q4K => q4_k,
        KQuant::Q5K => q5_k,
        KQuant::Q6K => q6_k,
    };
    for (b, y) in bytes
        .chunks_exact(kind.block_bytes())
        .zip(out.chunks_exact_mut(256))
    {
        block(b, y)
    }
}

/// Weight `v` (0..256) of a block of K-quant `kind`, as [`dequantize`] gives it.
pub(crate) fn k_quant_value(kind: KQuant, b: &[u8], v: usize) -> f32 {
    match kind {
        KQuant::Q4K => q4_k_value(b, v),
        KQuant::Q5K => q5_k_value(b, v),
        KQuant::Q6K => q6_k_value(b, v),
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    k_quant::<true>(b, y)
}

/// Weight `v` (0..256) of Q4_K block `b`, as [`dequantize`] gives it.
pub(crate) fn q4_k_value(b: &[u8], v: usize) -> f32 {
    let (d, dmin, scales, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..144]);
    let (i, l) = (v / 32, v % 32);
    let (sc, m) = scale_min(scales, i);
    let (d1, m1) = (d * sc as f32, dmin * m as f32);
    d1 * q4_k_nibble(qs, i, l) as f32 - m1
}

/// Weight `v` (0..256) of Q5_K block `b`, as [`dequantize`] gives it: Q4_K's, with bit `i` of
/// `qh[l]` as the fifth bit of value `l` of sub-block `i`.
pub(crate) fn q5_k_value(b: &[u8], v: usize) -> f32 {
    let (d, dmin, scales, qh, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..48], &b[48..]);
    let (i, l) = (v / 32, v % 32);
    let (sc, m) = scale_min(scales, i);
    let (d1, m1) = (d * sc as f32, dmin * m as f32);
    let q = q4_k_nibble(qs, i, l) | (((qh[l] >> i) & 1) << 4);
    d1 * q as f32 - m1
}

/// A Q6_K block's (210 bytes) low bits, high bits, 16 scales and `d`.
pub(crate) fn q6_k_parts(b: &[u8]) -> (&[u8], &[u8], &[u8], f32) {
    (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208))
}

/// Weight `v` (0..256) of a Q6_K block as its integer `q - 32` (-32..=31): two halves of 128
/// values; in half `n`, value `v` takes its low 4 bits from byte `v % 64` of the half's 64 `ql`
/// bytes (low nibble for `v < 64`) and its high 2 bits from byte `v % 32` of the half's 32 `qh`
/// bytes (bits `2 * (v / 32)`).
pub(crate) fn q6_k_int(ql: &[u8], qh: &[u8], v: usize) -> i32 {
    let (n, v) = (v / 128, v % 128);
    let (ql, qh) = (&ql[64 * n..][..64], &qh[32 * n..][..32]);
    let low = (ql[v % 64] >> (4 * (v / 64))) & 15;
    let high = (qh[v % 32] >> (2 * (v / 32))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// Weight `v` (0..256) of Q6_K block `b`, as [`dequantize`] gives it: sub-blocks of 16, each
/// with its int8 scale.
pub(crate) fn q6_k_value(b: &[u8], v: usize) -> f32 {
    let (ql, qh, scales, d) = q6_k_parts(b);
    let sc = scales[v / 16] as i8 as f32;
    (d * sc) * q6_k_int(ql, qh, v) as f32
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    for (v, y) in y.iter_mut().enumerate() {
        *y = q6_k_value(b, v);
    }
}
