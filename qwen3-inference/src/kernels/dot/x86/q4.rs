//! The q4 (W4A8) kernels on x86-64: AVX2 (with `vpmaddubsw`, AVX-VNNI's or AVX-512's
//! `vpdpbusd`) on 256-bit vectors, a chunk of four groups in two vectors regrouped so that their
//! lanes hold the same groups, and AVX-512 VNNI on 512-bit ones, the same regrouping for two
//! chunks at a time. They read the activations in the layouts `dot/q4.rs` describes
//! (`Q4Layout::Pairs`, `Q4Layout::PairsWide`), for groups of 32; other group sizes take the
//! reference.
//!
//! The AVX2 kernel does a chunk (64 packed bytes, 128 weights) of one row and one token as two
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
//! The AVX-512 kernel takes two chunks a step: one two-source permute (`vpermt2q`) of their 128
//! bytes gives `[A(c) | A(c+1)]`, another `[B(c) | B(c+1)]`, and four `vpdpbusd` give 16 lanes of
//! 16 weights each; neighbouring lanes (halves of one group) are added as integers, so one
//! conversion and one scaling serve 256 weights of a row and a token, each even lane a whole
//! group's (`Q4Layout::PairsWide` lays the activations out to match). A prompt's products take
//! the rows product (`q4_rows.rs`), which repeats this arithmetic with 16 rows in the lanes.
//!
//! The weights' f16 scales are widened (`vcvtph2ps`: 16 at a time on AVX-512, a chunk's 4 on
//! AVX2) and spread to the lanes of their group by one permute (`Q4Layout::lane_group`). Each
//! (row, token) pair of a tile has its own accumulator, so a tile's multiply-adds do not wait on
//! each other. Every tile shape runs the same steps in the same order for each pair, so decode
//! (tiles of one token), a serving step's few tokens and (on AVX-512) the rows product of a
//! prompt give a prompt's tokens the same bits.
//!
//! The same kernels take q6 weights (`SIX`): a chunk is then 96 bytes, the nibbles as above and
//! 32 high bytes whose bits are ORed in above the nibbles, and the correction is taken four
//! times (`dot/q6.rs`).

use super::super::q4::{self, Q4Layout, CHUNK};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::avx2::{dot_pairs, hsum256};
use super::q4_rows::{rows_product, step_requested, ROWS_FROM};
use super::{PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;

/// [`super::super::MatQ4`] on AVX-512 VNNI, for q4 weights or (`SIX`) q6 ones (`dot/q6.rs`),
/// reading the activations in [`Q4Layout::PairsWide`]: two chunks a step, each 512-bit vector of
/// weights holding `A` (or `B`) of both, as the AVX2 kernel holds one chunk's in 256 bits.
/// Decode (`t = 1`) takes four rows a tile, asking for the weights ahead as the q8 kernel does
/// (see [`PREFETCH_NEAR`]); prefill tiles are two weight rows against four tokens, each step's
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
        Q4Layout::PairsWide,
        "the AVX-512 q4 kernel reads Q4Layout::PairsWide"
    );
    if x.t >= ROWS_FROM && !step_requested() {
        // A prompt: the rows product, which gives every (row, token) the bits this kernel would.
        // SAFETY: `check_either` passed, chunks > 0 and the layout is PairsWide (checked
        // above), and the CPU has what this function's caller vouched for.
        return rows_product::<SIX>(w, ws, x, out);
    }
    // Bytes this thread may prefetch, counted from the start of `w`. (A prompt's product, bound
    // by arithmetic, measured slower without the prefetches too.)
    let reach = w.len() + ahead;
    if x.t == 1 {
        // Decode: four rows a tile, the fixed costs of a tile (its setup, the sums across lanes)
        // shared by four rows' streams.
        return for_each_tile(rows, 1, 4, 1, |m, _, r, _| {
            // SAFETY: rows r..r+m exist (for_each_tile keeps them so), `check_either` passed
            // and the layout is PairsWide (asserted above), as the tile reads.
            match m {
                4 => tile_avx512::<4, 1, SIX>(w, ws, x, out, r, 0, reach),
                _ => tile_avx512::<1, 1, SIX>(w, ws, x, out, r, 0, reach),
            }
        });
    }
    for_each_tile(rows, x.t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so), and
        // `q6::check_either` proved every slice has the length of its shape and the layout is for
        // groups of 32 and `chunks = cols / 128`; the layout is PairsWide (asserted above).
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
/// Prefetches weights up to `reach` bytes from the start of `w`.
///
/// One step takes chunks `c` and `c + 1` (`PAIR`), or a row's last chunk alone when it has an
/// odd number. Per weight row, the two chunks' 64 nibble bytes `v0`, `v1` are regrouped with one
/// two-source permute each into `A = [A(c) | A(c+1)]` and `B = [B(c) | B(c+1)]` (the 64-bit
/// pieces `Q4Layout::Pairs` takes, `pairs_byte`); per row and token:
///
/// ```text
/// isum = corr + dot4(A lo, x0) + dot4(B lo, x1) + dot4(A hi, x2) + dot4(B hi, x3)   16 lanes, exact
/// isum += isum, neighbouring lanes swapped         even lanes: whole groups' sums
/// acc += float(isum) * x_scale * w_scale           once per 256 weights (odd lanes: x_scale 0)
/// ```
///
/// Caller guarantees the rows and tokens exist, that `q6::check_either::<SIX>` passed, that
/// `x.q4.chunks > 0` and that the layout is `Q4Layout::PairsWide` (8 lanes a chunk). Then every
/// read is in bounds: a step at chunk `c` reads bytes `bc .. b(c + n)` of a weight row (`b` = 64
/// for q4, 96 for q6: the nibbles, then 32 high bytes; `n` = 2, or 1 for a last odd chunk), within
/// its `cols / 128 * b` bytes; values `128c .. 128(c + n) <= cols` of a token's laid-out row;
/// lanes `8c .. 8(c + n)` of its corrections and scales (a lone chunk's by masked loads, which
/// neither read nor fault past their mask); the weight scales by a masked load of `4 * n4` values
/// from `4c`, within `4 * chunks <= per`.
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
    const L: usize = Q4Layout::PairsWide.lanes();
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * L,
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
    // Lane l of a step holds group `lane_group(l % 8)` of its chunk `l / 8`: of the window of 16
    // groups whose scales are widened together, group 4p + that for the step at chunk p (0..4).
    let groups: [i32; 16] =
        std::array::from_fn(|l| (Q4Layout::PairsWide.lane_group(l % L) + 4 * (l / L)) as i32);
    let spread = _mm512_loadu_si512(groups.as_ptr() as *const __m512i);
    let tile = Tile {
        w,
        w_at,
        w_row,
        x_row,
        corr_row,
        xs_row,
        chunk_bytes,
        reach,
        spread,
    };
    let mut acc = [[_mm512_setzero_ps(); N]; R];
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
        let mut p = 0;
        while p + 2 <= n4 {
            tile.step::<SIX, true>(&mut acc, c + p, p, &d16);
            p += 2;
        }
        if p < n4 {
            tile.step::<SIX, false>(&mut acc, c + p, p, &d16);
        }
        c += n4;
    }
    for (a, acc_a) in acc.iter().enumerate() {
        let (w_r, ws_r) = (
            &w[w_at[a]..w_at[a] + row_bytes],
            &ws[(r + a) * per..(r + a + 1) * per],
        );
        for (j, &acc_aj) in acc_a.iter().enumerate() {
            let sum = sum16(acc_aj);
            let tail =
                q6::tail_either::<SIX>(w_r, ws_r, x.q_row(i + j), x.scales_row(i + j), chunks);
            *out.get_unchecked_mut((r + a) * t + i + j) = sum + tail;
        }
    }
}

/// The sum of a (row, token) pair's 16 lanes of partial sums, in a fixed order: lanes `l` and
/// `l + 8`, then `l` and `l + 4`, then `l` and `l + 2`, then the last two. The rows product
/// (`q4_rows.rs`, [`sum16_across`]) adds its 16 vectors of partial sums in this order too, which
/// is part of why the two give the same bits.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sum16(v: __m512) -> f32 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let v8 = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
    // movehl: lanes 2, 3 moved down.
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(v2) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(v2, v2))
}

/// [`sum16`] lane by lane across 16 vectors: lane `a` of the result is the sum of lane `a` of
/// `p[0..16]`, added in [`sum16`]'s order.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum16_across(p: &[__m512; 16]) -> __m512 {
    let s8: [__m512; 8] = std::array::from_fn(|k| _mm512_add_ps(p[k], p[k + 8]));
    let s4: [__m512; 4] = std::array::from_fn(|k| _mm512_add_ps(s8[k], s8[k + 4]));
    let s2: [__m512; 2] = std::array::from_fn(|k| _mm512_add_ps(s4[k], s4[k + 2]));
    _mm512_add_ps(s2[0], s2[1])
}

/// What the steps of one [`tile_avx512`] read: its rows' weights, its tokens' activations.
struct Tile<'a, const R: usize, const N: usize> {
    w: &'a [u8],
    w_at: [usize; R],
    w_row: [*const u8; R],
    x_row: [*const i8; N],
    corr_row: [*const i32; N],
    xs_row: [*const f32; N],
    chunk_bytes: usize,
    reach: usize,
    /// Lane l's group among the 16 of a window (see `tile_avx512`).
    spread: __m512i,
}

impl<const R: usize, const N: usize> Tile<'_, R, N> {
    /// Adds the step at chunk `c` (at `p` of its window of four chunks, whose weight scales are
    /// `d16`) into `acc`: chunks `c` and `c + 1` when `PAIR`, chunk `c` alone otherwise. Caller
    /// guarantees what [`tile_avx512`]'s caller does, and that the step's chunks exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step<const SIX: bool, const PAIR: bool>(
        &self,
        acc: &mut [[__m512; N]; R],
        c: usize,
        p: usize,
        d16: &[__m512; R],
    ) {
        const L: usize = Q4Layout::PairsWide.lanes();
        let n = if PAIR { 2 } else { 1 };
        let off = self.chunk_bytes * c;
        // The tile's rows are consecutive in memory: its weights are one stream, of which this
        // step reads its share.
        prefetch_lines(
            self.w,
            self.w_at[0] + R * off,
            R * n * self.chunk_bytes,
            self.reach,
        );
        let idx = _mm512_add_epi32(self.spread, _mm512_set1_epi32(4 * p as i32));
        let d = d16.map(|v| _mm512_permutexvar_ps(idx, v));
        // A lone chunk's upper lanes: zero weights, and zero activations, corrections and scales
        // (masked and zero-extended loads).
        let lane_mask: __mmask16 = if PAIR { 0xffff } else { 0x00ff };
        // Token j's activations: four runs of 32 of each chunk, interleaved for a pair
        // (PairsWide), as they are for a lone chunk; and its corrections and scales.
        let acts = |j: usize| {
            let base = self.x_row[j].add(CHUNK * c);
            let xv: [__m512i; 4] = std::array::from_fn(|k| match PAIR {
                true => _mm512_loadu_si512(base.add(64 * k) as *const __m512i),
                false => {
                    _mm512_zextsi256_si512(_mm256_loadu_si256(base.add(32 * k) as *const __m256i))
                }
            });
            let corr = _mm512_maskz_loadu_epi32(lane_mask, self.corr_row[j].add(L * c));
            // q6 weights are q + 32, four times q4's offset of 8.
            let corr = if SIX {
                _mm512_slli_epi32(corr, 2)
            } else {
                corr
            };
            let xs = _mm512_maskz_loadu_ps(lane_mask, self.xs_row[j].add(L * c));
            (xv, corr, xs)
        };
        // One (row, token) pair: `acc += float(corr + the four byte products) * xs * d`.
        let dot =
            |acc: &mut __m512, wv: &[__m512i; 4], act: &([__m512i; 4], __m512i, __m512), d| {
                let (xv, corr, xs) = act;
                let mut isum = *corr;
                for k in 0..4 {
                    isum = _mm512_dpbusd_epi32(isum, wv[k], xv[k]);
                }
                // Lanes 2k and 2k + 1 hold halves of one group: the even lane takes the whole
                // group's sum (the odd lane's scale is 0, `Q4Layout::PairsWide`).
                let isum = _mm512_add_epi32(isum, _mm512_shuffle_epi32::<0xb1>(isum));
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), *xs);
                *acc = _mm512_fmadd_ps(v, d, *acc);
            };
        if N == 1 {
            // Decode: the token's activations stay in registers while each row is unpacked and
            // used at once (all four rows' unpacked weights would not fit beside them).
            let act = acts(0);
            for a in 0..R {
                let wv = self.weights::<SIX, PAIR>(a, off);
                dot(&mut acc[a][0], &wv, &act, d[a]);
            }
        } else {
            // Prefill: every row unpacked once, then each token against all of them.
            let wv: [[__m512i; 4]; R] = std::array::from_fn(|a| self.weights::<SIX, PAIR>(a, off));
            // `j` picks the token in `acts` and the column of `acc`, rows the inner loop.
            #[allow(clippy::needless_range_loop)]
            for j in 0..N {
                let act = acts(j);
                for a in 0..R {
                    dot(&mut acc[a][j], &wv[a], &act, d[a]);
                }
            }
        }
    }

    /// Row `a`'s weights of the step whose chunks start at byte `off`, unpacked to bytes:
    /// `[A lo, B lo, A hi, B hi]` (q4: `q + 8`, 0..=15; q6: `q + 32`, 0..=63).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn weights<const SIX: bool, const PAIR: bool>(
        &self,
        a: usize,
        off: usize,
    ) -> [__m512i; 4] {
        let nibble = _mm512_set1_epi8(15);
        // The 64-bit pieces of A and B: vpermt2q's indices, 0..8 from v0 and 8..16 from v1.
        let pick_a = _mm512_setr_epi64(0, 4, 2, 6, 8, 12, 10, 14);
        let pick_b = _mm512_setr_epi64(1, 5, 3, 7, 9, 13, 11, 15);
        let row = self.w_row[a];
        let v0 = _mm512_loadu_si512(row.add(off) as *const __m512i);
        // Chunk c + 1's nibble bytes, or zeros for a lone chunk.
        let v1 = match PAIR {
            true => _mm512_loadu_si512(row.add(off + self.chunk_bytes) as *const __m512i),
            false => _mm512_setzero_si512(),
        };
        let ab = [
            _mm512_permutex2var_epi64(v0, pick_a, v1),
            _mm512_permutex2var_epi64(v0, pick_b, v1),
        ];
        let mut wv = [
            _mm512_and_si512(ab[0], nibble),
            _mm512_and_si512(ab[1], nibble),
            _mm512_and_si512(_mm512_srli_epi16(ab[0], 4), nibble),
            _mm512_and_si512(_mm512_srli_epi16(ab[1], 4), nibble),
        ];
        if SIX {
            // Each chunk's 32 high bytes after its nibbles: for nibble bytes 0..32 their bits
            // 0-3, for 32..64 their bits 4-7. With the second half's moved down (`h4`), the
            // pieces A and B take (as the AVX2 kernel takes them) put each nibble byte's pair at
            // bits 0-1 (low value) and 2-3 (high value); each pair goes to bits 4-5 of its value.
            let bits_4_5 = _mm512_set1_epi8(0x30);
            let h0 = _mm256_loadu_si256(row.add(off + 64) as *const __m256i);
            let h1 = match PAIR {
                true => _mm256_loadu_si256(row.add(off + self.chunk_bytes + 64) as *const __m256i),
                false => _mm256_setzero_si256(),
            };
            let h = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h0), h1);
            let h4 = _mm512_srli_epi16(h, 4);
            let hv = [_mm512_unpacklo_epi64(h, h4), _mm512_unpackhi_epi64(h, h4)];
            for k in 0..2 {
                // lo |= (hv << 4) & 0x30; hi |= (hv << 2) & 0x30 (vpternlogd 0xf8: A | B & C)
                wv[k] =
                    _mm512_ternarylogic_epi32::<0xf8>(wv[k], _mm512_slli_epi16(hv[k], 4), bits_4_5);
                wv[k + 2] = _mm512_ternarylogic_epi32::<0xf8>(
                    wv[k + 2],
                    _mm512_slli_epi16(hv[k], 2),
                    bits_4_5,
                );
            }
        }
        wv
    }
}

/// Asks for the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes past `w[from .. from +
/// len]`: one prefetch per 64 bytes of that range and distance, none at or past `reach`. Steps
/// that read consecutive ranges so ask for every line once (a range's last line when it is not
/// aligned is the next range's first).
///
/// A step asks for the lines of the bytes it reads, not for its first byte: a q6 chunk is 96
/// bytes, and a prefetch per chunk left every third line of a q6 matrix to the hardware, which
/// on one Zen 4 thread streamed q6 at half q4's rate (measured: docs/quantization.md, "AVX-512
/// on Zen 4").
#[inline(always)]
fn prefetch_lines(w: &[u8], from: usize, len: usize, reach: usize) {
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
