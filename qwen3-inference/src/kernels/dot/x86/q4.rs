//! The q4 (W4A8) kernels on AVX2 (with `vpmaddubsw`, AVX-VNNI's or AVX-512's `vpdpbusd`) on
//! 256-bit vectors: a chunk of four groups in two vectors regrouped so that their lanes hold the
//! same groups. They read the activations in the layout `dot/q4.rs` describes
//! (`Q4Layout::Pairs`), for groups of 32; other group sizes take the reference. (AVX-512 reads
//! the weights in its own order: `interleaved.rs`.)
//!
//! The kernel does a chunk (64 packed bytes, 128 weights) of one row and one token as two
//! 256-bit vectors `A`, `B` of its weight bytes, regrouped (`Q4Layout::Pairs`) so that lane `l`
//! of both holds the same group:
//!
//! ```text
//! A, B     = unpacklo64(bytes 0..32, bytes 32..64), unpackhi64(..)    lanes: groups 0 0 2 2 1 1 3 3
//! lo, hi   = A & 15, (A >> 4) & 15 (and B's)          the nibbles, q + 8, unsigned
//! isum     = corr + dot(A lo, B lo, A hi, B hi; x)    8 lanes, exact: sum(q * x) per 16 weights
//! acc     += float(isum) * x_scale * w_scale          one conversion and scaling a chunk
//! ```
//!
//! For q4 the four byte products are added as i16 before one widening (`dot_pairs` of four: eight
//! products of at most 15 * 127 each fit); q6's larger weights take two widenings of two.
//!
//! The weights' f16 scales are widened (`vcvtph2ps`, a chunk's 4) and spread to the lanes of
//! their group by one permute (`Q4Layout::lane_group`). Each token of a tile has its own
//! accumulator, so a tile's multiply-adds do not wait on each other. Every tile shape runs the
//! same steps in the same order for each (row, token) pair, so decode (tiles of one token) and a
//! prompt give a prompt's tokens the same bits.
//!
//! The same kernel takes q6 weights (`SIX`): a chunk is then 96 bytes, the nibbles as above and
//! 32 high bytes whose bits are ORed in above the nibbles, and the correction is taken four
//! times (`dot/q6.rs`).

use super::super::q4::{self, Q4Layout, CHUNK};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::avx2::{dot_pairs, hsum256};
use super::{PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;

/// Asks for the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes past `w[from .. from +
/// len]`: one prefetch per 64 bytes of that range and distance, none at or past `reach`. Steps
/// that read consecutive ranges so ask for every line once (a range's last line when it is not
/// aligned is the next range's first).
///
/// A step asks for the lines of the bytes it reads, not for its first byte: a q6 chunk is 96
/// bytes, and a prefetch per chunk left every third line of a q6 matrix to the hardware, which
/// on one Zen 4 thread streamed q6 at half q4's rate (measured: docs/kernels.md, "AVX-512
/// on Zen 4").
#[inline(always)]
pub(super) fn prefetch_lines(w: &[u8], from: usize, len: usize, reach: usize) {
    let lines = len.div_ceil(64);
    for dist in [PREFETCH_NEAR, PREFETCH_FAR] {
        let at = from + dist;
        // Far from the end of what this thread reads (nearly always), no check per line.
        let clear = at + 64 * lines <= reach;
        for k in 0..lines {
            if clear || at + 64 * k < reach {
                // A prefetch never faults and has no effect on the program's meaning;
                // `wrapping_add` may point past `w` (into the `ahead` bytes) without UB.
                let p = w.as_ptr().wrapping_add(at + 64 * k);
                // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has.
                unsafe { _mm_prefetch::<_MM_HINT_T2>(p as *const i8) };
            }
        }
    }
}

/// [`super::super::MatQ4`] on AVX2, multiplying bytes with the instructions `P` names (see
/// [`super::avx2::MADDUBS`]), for q4 weights or (`SIX`) q6 ones, reading the activations in
/// [`Q4Layout::Pairs`]: each chunk's weight bytes regrouped into two 256-bit vectors whose lanes
/// hold the same groups, so that one conversion and one scaling serve the whole chunk; tiles of
/// one row by up to eight tokens (an accumulator each; the row's unpacked weights take four
/// registers, its scales one).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat_q4_avx2<const P: u8, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.chunks == 0 {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    assert_eq!(
        x.q4.layout,
        Q4Layout::Pairs,
        "the AVX2 q4 kernel reads Q4Layout::Pairs"
    );
    let reach = w.len() + ahead;
    for_each_tile(rows, x.t, 1, 8, |_, n, r, i| {
        // SAFETY: row r and tokens i..i+n are in range (for_each_tile keeps them so), and
        // `q6::check_either` proved every slice has the length of its shape and the layout is for
        // groups of 32 and `chunks = cols / 128`; the layout is Pairs (asserted above); the CPU
        // has what `P` names (the dispatch's word).
        match n {
            8 => tile_avx2::<8, P, SIX>(w, ws, x, out, r, i, reach),
            7 => tile_avx2::<7, P, SIX>(w, ws, x, out, r, i, reach),
            6 => tile_avx2::<6, P, SIX>(w, ws, x, out, r, i, reach),
            5 => tile_avx2::<5, P, SIX>(w, ws, x, out, r, i, reach),
            4 => tile_avx2::<4, P, SIX>(w, ws, x, out, r, i, reach),
            3 => tile_avx2::<3, P, SIX>(w, ws, x, out, r, i, reach),
            2 => tile_avx2::<2, P, SIX>(w, ws, x, out, r, i, reach),
            _ => tile_avx2::<1, P, SIX>(w, ws, x, out, r, i, reach),
        }
    });
}

/// `out[r * t + i + j]` for weight row `r` and the `N` tokens from `i`, prefetching weights up to
/// `reach` bytes from the start of `w`.
///
/// Caller guarantees the row and tokens exist, that `q6::check_either::<SIX>` passed, that
/// `x.q4.chunks > 0`, that the layout is `Q4Layout::Pairs` (8 lanes a chunk) and that the CPU has
/// the instructions `P` names. Then every read is in bounds: chunk `c` reads bytes `bc .. b(c +
/// 1)` of the weight row (`b` = 64 for q4, 96 for q6: the nibbles, then 32 high bytes), within
/// its `cols / 128 * b` bytes; values `128c .. 128(c + 1) <= cols` of a token's laid-out row;
/// lanes `8c .. 8(c + 1)` of its corrections and scales; the weight scales `4c .. 4c + 4`, within
/// `4 * chunks <= per`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const N: usize, const P: u8, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: usize,
) {
    const L: usize = Q4Layout::Pairs.lanes();
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * L,
    );
    let chunk_bytes = q6::row_bytes::<SIX>(CHUNK);
    let w_at = r * row_bytes;
    let (w_row, ws_row) = (w.as_ptr().add(w_at), &ws[r * per..(r + 1) * per]);
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols));
    let corr_row: [*const i32; N] =
        std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * lanes));
    let xs_row: [*const f32; N] =
        std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * lanes));
    let (nibble, bits_4_5) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
    // The lanes of both vectors hold groups 0, 0, 2, 2, 1, 1, 3, 3 of the chunk (`q4.rs`).
    let groups: [i32; L] = std::array::from_fn(|l| Q4Layout::Pairs.lane_group(l) as i32);
    let spread = _mm256_loadu_si256(groups.as_ptr() as *const __m256i);
    let mut acc = [_mm256_setzero_ps(); N];
    for c in 0..chunks {
        let off = chunk_bytes * c;
        prefetch_lines(w, w_at + off, chunk_bytes, reach);
        // The chunk's four weight scales, widened from f16 (8 bytes from 4c: within `per`) and
        // spread to the lanes of their groups.
        let d4 = _mm_cvtph_ps(_mm_loadl_epi64(ws_row.as_ptr().add(4 * c) as *const __m128i));
        let d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d4), spread);
        // The two halves of the chunk's nibble bytes, regrouped: A = their 64-bit pieces 0 and
        // 2 of each 128-bit lane, B = pieces 1 and 3.
        let h0 = _mm256_loadu_si256(w_row.add(off) as *const __m256i);
        let h1 = _mm256_loadu_si256(w_row.add(off + 32) as *const __m256i);
        let v = [_mm256_unpacklo_epi64(h0, h1), _mm256_unpackhi_epi64(h0, h1)];
        let mut lo = v.map(|v| _mm256_and_si256(v, nibble));
        let mut hi = v.map(|v| _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
        if SIX {
            // High byte k holds the top bits of nibble byte k (bits 0-3) and k + 32 (4-7):
            // regrouped as the nibbles, with the second half's moved down to bits 0-3, each
            // nibble byte's pair is at bits 0-1 (low value) and 2-3 (high value); each pair
            // goes to bits 4-5 of its value.
            let hb = _mm256_loadu_si256(w_row.add(off + 64) as *const __m256i);
            let hb4 = _mm256_srli_epi16(hb, 4);
            let hv = [
                _mm256_unpacklo_epi64(hb, hb4),
                _mm256_unpackhi_epi64(hb, hb4),
            ];
            for k in 0..2 {
                let h_lo = _mm256_and_si256(_mm256_slli_epi16(hv[k], 4), bits_4_5);
                let h_hi = _mm256_and_si256(_mm256_slli_epi16(hv[k], 2), bits_4_5);
                lo[k] = _mm256_or_si256(lo[k], h_lo);
                hi[k] = _mm256_or_si256(hi[k], h_hi);
            }
        }
        for j in 0..N {
            let xv =
                |k: usize| _mm256_loadu_si256(x_row[j].add(CHUNK * c + 32 * k) as *const __m256i);
            let corr = _mm256_loadu_si256(corr_row[j].add(L * c) as *const __m256i);
            // Activations A-low, B-low, A-high, B-high; weights at most 15 (q4) or 63 (q6) and
            // activations in [-127, 127], within dot_pairs's bound for the number of pairs.
            let isum = match SIX {
                // q6 weights are q + 32, four times q4's offset of 8.
                true => {
                    let corr = _mm256_slli_epi32(corr, 2);
                    let isum = dot_pairs::<P, 2>(corr, [lo[0], hi[0]], [xv(0), xv(2)]);
                    dot_pairs::<P, 2>(isum, [lo[1], hi[1]], [xv(1), xv(3)])
                }
                false => dot_pairs::<P, 4>(
                    corr,
                    [lo[0], lo[1], hi[0], hi[1]],
                    [xv(0), xv(1), xv(2), xv(3)],
                ),
            };
            let xs = _mm256_loadu_ps(xs_row[j].add(L * c));
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), xs);
            acc[j] = _mm256_fmadd_ps(v, d, acc[j]);
        }
    }
    let w_r = &w[w_at..w_at + row_bytes];
    for (j, &acc_j) in acc.iter().enumerate() {
        let sum = hsum256(acc_j);
        let tail = q6::tail_either::<SIX>(w_r, ws_row, x.q_row(i + j), x.scales_row(i + j), chunks);
        *out.get_unchecked_mut(r * t + i + j) = sum + tail;
    }
}

#[cfg(test)]
mod tests {
    use super::super::avx2::EVEX_VNNI;
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::testing::next_values;

    /// The AVX2 kernel with `vpdpbusd` for its byte products (AVX-VNNI's form, here in its EVEX
    /// encoding, which AVX-512 machines run) against the reference: `dots()` hands that path out
    /// only on AVX-VNNI CPUs, which no machine here has.
    #[test]
    fn avx2_kernel_with_vnni_matches_the_reference() {
        if !(super::super::has_avx512() && super::super::has_avx2()) {
            eprintln!("no AVX-512 VNNI: skipping the EVEX form of the AVX2 q4 and q6 kernels");
            return;
        }
        let mut seed = 21;
        for six in [false, true] {
            for (rows, t, groups) in [(5, 1, 17), (3, 6, 8), (2, 2, 3), (2, 3, 7)] {
                let (gs, cols) = (32, 32 * groups);
                let w = next_values(rows * cols, &mut seed);
                let x = next_values(t * cols, &mut seed);
                let mut ws = vec![0u16; w.len() / gs];
                let packed = match six {
                    true => {
                        let mut p = vec![0u8; w.len() / 4 * 3];
                        crate::quant::quantize_q6(&w, cols, gs, &mut p, &mut ws);
                        p
                    }
                    false => {
                        let mut p = vec![0u8; w.len() / 2];
                        crate::quant::quantize_q4(&w, gs, &mut p, &mut ws);
                        p
                    }
                };
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4_as(&x, t, cols, gs, Q4Layout::Pairs);
                let (mut got, mut want) = (vec![f32::NAN; rows * t], vec![0f32; rows * t]);
                // SAFETY: the CPU has AVX-512 VNNI with VL (has_avx512) and AVX2, FMA, F16C
                // (has_avx2), all that this form of the kernel uses.
                match six {
                    true => unsafe {
                        mat_q4_avx2::<EVEX_VNNI, true>(&packed, &ws, &acts, &mut got, 0)
                    },
                    false => unsafe {
                        mat_q4_avx2::<EVEX_VNNI, false>(&packed, &ws, &acts, &mut got, 0)
                    },
                }
                match six {
                    true => q6::mat_q6_scalar(&packed, &ws, &acts, &mut want, 0),
                    false => q4::mat_q4_scalar(&packed, &ws, &acts, &mut want, 0),
                }
                for (k, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                        "{six} [{k}] {g} vs {e}"
                    );
                }
            }
        }
    }
}
