//! The q4 (W4A8) kernels on x86-64: AVX-512 VNNI on 512-bit vectors, one chunk of four groups
//! per step, and AVX2 (with `vpmaddubsw`, AVX-VNNI's or AVX-512's `vpdpbusd`) on 256-bit ones,
//! a chunk in two vectors regrouped so that their lanes hold the same groups. They read the
//! activations in the layouts `dot/q4.rs` describes (`Q4Layout::Halves`, `Q4Layout::Pairs`),
//! for groups of 32; other group sizes take the reference.
//!
//! One step, for a chunk of 64 packed bytes (128 weights) of one row and one token:
//!
//! ```text
//! lo, hi   = bytes & 15, (bytes >> 4) & 15             the nibbles, q + 8, unsigned
//! isum     = corr + dot4(lo, x_lo) + dot4(hi, x_hi)    16 lanes, exact: sum(q * x) per 8 weights
//! acc     += float(isum) * x_scale * w_scale           each lane's group's scales
//! ```
//!
//! The weights' f16 scales are widened (`vcvtph2ps`: 16 at a time on AVX-512, a chunk's 4 on
//! AVX2) and spread to the lanes of their group by one permute (`Q4Layout::lane_group`). Each
//! (row, token) pair of a tile has its own accumulator, so a tile's multiply-adds do not wait on
//! each other. Every tile shape runs the same steps in the
//! same order for each pair, so decode (tiles of one token) and prefill give a prompt's tokens
//! the same bits.
//!
//! The AVX2 kernel does a chunk as two 256-bit vectors `A`, `B` of its weight bytes, regrouped
//! (`Q4Layout::Pairs`) so that lane `l` of both holds the same group; per chunk:
//!
//! ```text
//! A, B     = unpacklo64(bytes 0..32, bytes 32..64), unpackhi64(..)    lanes: groups 0 0 2 2 1 1 3 3
//! isum     = corr + dot(A lo, B lo, A hi, B hi; x)    8 lanes, exact: sum(q * x) per 16 weights
//! acc     += float(isum) * x_scale * w_scale          one conversion and scaling a chunk
//! ```
//!
//! For q4 the four byte products are added as i16 before one widening (`dot_pairs` of four: eight
//! products of at most 15 * 127 each fit); q6's larger weights take two widenings of two.
//!
//! The same kernels take q6 weights (`SIX`): a chunk is then 96 bytes, the nibbles as above and
//! 32 high bytes whose bits are ORed in above the nibbles, and the correction is taken four
//! times (`dot/q6.rs`).

use super::super::q4::{self, Q4Layout, CHUNK, LANES};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::avx2::{dot_pairs, hsum256};
use super::{PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;

/// [`super::super::MatQ4`] on AVX-512 VNNI, for q4 weights or (`SIX`) q6 ones (`dot/q6.rs`).
/// Decode (`t = 1`) takes four rows a tile, asking for the weights ahead as the q8 kernel does
/// (see [`PREFETCH_NEAR`]); prefill tiles are two weight rows against four tokens, each chunk of
/// weights unpacked once for four tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_q4_avx512<const SIX: bool>(
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
        Q4Layout::Halves,
        "the AVX-512 q4 kernel reads Q4Layout::Halves"
    );
    // Bytes this thread may prefetch, counted from the start of `w`. (A prompt's product, bound
    // by arithmetic, measured slower without the prefetches too.)
    let reach = w.len() + ahead;
    if x.t == 1 {
        // Decode: four rows a tile, the fixed costs of a tile (its setup, the sums across lanes)
        // shared by four rows' streams.
        return for_each_tile(rows, 1, 4, 1, |m, _, r, _| {
            // SAFETY: rows r..r+m exist (for_each_tile keeps them so), `check_either` passed
            // and the layout is Halves (asserted above: 16 lanes a chunk, as the tile reads).
            match m {
                4 => tile_avx512::<4, 1, SIX>(w, ws, x, out, r, 0, reach),
                _ => tile_avx512::<1, 1, SIX>(w, ws, x, out, r, 0, reach),
            }
        });
    }
    for_each_tile(rows, x.t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so), and
        // `q6::check_either` proved every slice has the length of its shape and the layout is for
        // groups of 32 and `chunks = cols / 128`, with 16 lanes a chunk (Halves, asserted above).
        match (m, n) {
            (2, 4) => tile_avx512::<2, 4, SIX>(w, ws, x, out, r, i, reach),
            (2, 3) => tile_avx512::<2, 3, SIX>(w, ws, x, out, r, i, reach),
            (2, 2) => tile_avx512::<2, 2, SIX>(w, ws, x, out, r, i, reach),
            (2, _) => tile_avx512::<2, 1, SIX>(w, ws, x, out, r, i, reach),
            (_, 4) => tile_avx512::<1, 4, SIX>(w, ws, x, out, r, i, reach),
            (_, 3) => tile_avx512::<1, 3, SIX>(w, ws, x, out, r, i, reach),
            (_, 2) => tile_avx512::<1, 2, SIX>(w, ws, x, out, r, i, reach),
            _ => tile_avx512::<1, 1, SIX>(w, ws, x, out, r, i, reach),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
/// Prefetches weights up to `reach` bytes from the start of `w`. Caller guarantees the rows and
/// tokens exist, that `q6::check_either::<SIX>` passed, that `x.q4.chunks > 0` and that the
/// layout is `Q4Layout::Halves` (16 lanes a chunk; `Pairs` has 8, and its corrections and scales
/// would be read past their end). Then every read is in bounds: chunk `c < chunks = cols / 128`
/// reads bytes `bc .. bc + b` of a weight row (`b` = 64 for q4, 96 for q6: the nibbles, then 32
/// high bytes), within its `cols / 128 * b` bytes, values `128c .. 128c + 128 <= cols` of a
/// token's laid-out row, lanes `16c .. 16c + 16 <= lanes` of its corrections and scales; the
/// weight scales are read by a masked load of `4 * n4` values from `4c`, which stays within
/// `4 * chunks <= per` (masked-off elements are not read and cannot fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_avx512<const R: usize, const N: usize, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: usize,
) {
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * LANES,
    );
    let chunk_bytes = q6::row_bytes::<SIX>(CHUNK);
    let w_at: [usize; R] = std::array::from_fn(|a| (r + a) * row_bytes);
    let w_row: [*const u8; R] = w_at.map(|at| w.as_ptr().add(at));
    let ws_row: [*const u16; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols));
    let corr_row: [*const i32; N] =
        std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * lanes));
    let xs_row: [*const f32; N] =
        std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * lanes));
    let (nibble, bits_4_5) = (_mm512_set1_epi8(15), _mm512_set1_epi8(0x30));
    // Lane l of chunk k (0..4) of a window of 16 groups has group 4k + l / 4.
    let groups: [i32; LANES] = std::array::from_fn(|l| Q4Layout::Halves.lane_group(l) as i32);
    let spread = _mm512_loadu_si512(groups.as_ptr() as *const __m512i);
    let idx: [__m512i; 4] =
        std::array::from_fn(|k| _mm512_add_epi32(spread, _mm512_set1_epi32(4 * k as i32)));
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    // Adds chunk c (the k-th of its window, whose weight scales are `d16`) into `acc`.
    let mut step = |c: usize, k: usize, d16: &[__m512; R]| {
        let off = chunk_bytes * c;
        // The tile's rows are consecutive in memory: its weights are one stream, of which
        // this step reads its share.
        prefetch_lines(w, w_at[0] + R * off, R * chunk_bytes, reach);
        let wv: [__m512i; R] =
            std::array::from_fn(|a| _mm512_loadu_si512(w_row[a].add(off) as *const __m512i));
        let mut lo = wv.map(|v| _mm512_and_si512(v, nibble));
        let mut hi = wv.map(|v| _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
        if SIX {
            // The 32 high bytes after the nibbles: for nibble bytes 0..32 their bits 0-3, for
            // 32..64 their bits 4-7; `h` holds both, each nibble byte's pair at bits 0-1 (low
            // value) and 2-3 (high value), and each pair goes to bits 4-5 of its value.
            for a in 0..R {
                let hb = _mm256_loadu_si256(w_row[a].add(off + 64) as *const __m256i);
                let h =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 4));
                let h_lo = _mm512_and_si512(_mm512_slli_epi16(h, 4), bits_4_5);
                let h_hi = _mm512_and_si512(_mm512_slli_epi16(h, 2), bits_4_5);
                lo[a] = _mm512_or_si512(lo[a], h_lo);
                hi[a] = _mm512_or_si512(hi[a], h_hi);
            }
        }
        let d = d16.map(|v| _mm512_permutexvar_ps(idx[k], v));
        for j in 0..N {
            let x_lo = _mm512_loadu_si512(x_row[j].add(CHUNK * c) as *const __m512i);
            let x_hi = _mm512_loadu_si512(x_row[j].add(CHUNK * c + 64) as *const __m512i);
            let corr = _mm512_loadu_si512(corr_row[j].add(LANES * c) as *const __m512i);
            // q6 weights are q + 32, four times q4's offset of 8.
            let corr = if SIX {
                _mm512_slli_epi32(corr, 2)
            } else {
                corr
            };
            let xs = _mm512_loadu_ps(xs_row[j].add(LANES * c));
            for a in 0..R {
                let isum = _mm512_dpbusd_epi32(corr, lo[a], x_lo);
                let isum = _mm512_dpbusd_epi32(isum, hi[a], x_hi);
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), xs);
                acc[a][j] = _mm512_fmadd_ps(v, d[a], acc[a][j]);
            }
        }
    };
    let mut c = 0;
    while c < chunks {
        // The weight scales of the next (up to) 16 groups, widened from f16; a masked load
        // reads no scale past the row's full chunks.
        let n4 = (chunks - c).min(4);
        let mask: __mmask16 = if n4 == 4 { 0xffff } else { (1 << (4 * n4)) - 1 };
        let d16: [__m512; R] = std::array::from_fn(|a| {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                ws_row[a].add(4 * c) as *const i16,
            ))
        });
        for k in 0..n4 {
            step(c + k, k, &d16);
        }
        c += n4;
    }
    for (a, acc_a) in acc.iter().enumerate() {
        let (w_r, ws_r) = (
            &w[w_at[a]..w_at[a] + row_bytes],
            &ws[(r + a) * per..(r + a + 1) * per],
        );
        for (j, &acc_aj) in acc_a.iter().enumerate() {
            let sum = _mm512_reduce_add_ps(acc_aj);
            let tail =
                q6::tail_either::<SIX>(w_r, ws_r, x.q_row(i + j), x.scales_row(i + j), chunks);
            *out.get_unchecked_mut((r + a) * t + i + j) = sum + tail;
        }
    }
}

/// Asks for the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes past `w[from .. from +
/// len]`, every 64-byte line of that range once per distance and none at or past `reach`.
///
/// A step asks for the lines of the bytes it reads, not for its first byte: a q6 chunk is 96
/// bytes, and a prefetch per chunk left every third line of a q6 matrix to the hardware, which
/// on one Zen 4 thread streamed q6 at half q4's rate (measured: docs/quantization.md, "AVX-512
/// on Zen 4").
#[inline(always)]
fn prefetch_lines(w: &[u8], from: usize, len: usize, reach: usize) {
    for dist in [PREFETCH_NEAR, PREFETCH_FAR] {
        let (first, last) = ((from + dist) / 64, (from + len - 1 + dist) / 64);
        for line in first..=last {
            if 64 * line < reach {
                // A prefetch never faults and has no effect on the program's meaning;
                // `wrapping_add` may point past `w` (into the `ahead` bytes) without UB.
                let p = w.as_ptr().wrapping_add(64 * line);
                // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has.
                unsafe { _mm_prefetch::<_MM_HINT_T2>(p as *const i8) };
            }
        }
    }
}

/// [`super::super::MatQ4`] on AVX2, multiplying bytes with the instructions `P` names (see
/// [`super::avx2::MADDUBS`]). As [`mat_q4_avx512`], reading the activations in
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
        // SAFETY: as in mat_q4_avx512 (and the CPU has what `P` names: the dispatch's word).
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

/// [`tile_avx512`] on 256-bit vectors for one weight row, with the activations in
/// [`Q4Layout::Pairs`]. Caller guarantees what [`tile_avx512`]'s does (with 8 lanes of
/// corrections and scales a chunk, from `8c`), and that the CPU has the instructions `P` names.
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
