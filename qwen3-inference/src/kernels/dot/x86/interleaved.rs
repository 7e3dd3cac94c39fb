//! The AVX-512 VNNI q4 and q6 kernels, on weights in the interleaved order (`dot/interleaved.rs`):
//! a block of 16 groups is four 512-bit vectors (q6: six) whose lane `l` holds group `l`, so per
//! weight row, token and block:
//!
//! ```text
//! lo_k, hi_k = v_k & 15, (v_k >> 4) & 15          k = 0..4, the nibbles (q6: | two high bits << 4)
//! isum       = corr + sum_k dot4(lo_k, x_k) + dot4(hi_k, x_4+k)     16 lanes, lane l: group l, exact
//! acc       += float(isum) * x_scale * w_scale                       16 groups a conversion
//! ```
//!
//! and the row's value is `acc`'s 16 lanes added (`sum16`) after its last block. No permute, no
//! lane addition: eight `vpdpbusd` and eight (q6: sixteen) bitwise operations per 512 weights.
//!
//! Decode (one token) takes four rows a tile, the token's activations held in registers while
//! each row is unpacked and used; it asks for the weights ahead as the q8 kernel does
//! ([`PREFETCH_NEAR`]). A prompt's products (and a serving step's) take tiles of two rows by four
//! tokens: each row's block unpacked once for the four tokens, each vector of a token's
//! activations loaded once for both rows. Every (row, token) pair runs the same operations in the
//! same order in both, so a prompt's tokens get decode's bits.

use super::super::interleaved::GROUPS;
use super::super::q4::{Q4Layout, SIMD_GROUP};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::q4::prefetch_lines;
use super::PREFETCH_NEAR;
use std::arch::x86_64::*;

/// Tokens a prompt tile takes (two weight rows against up to this many).
const TOKENS: usize = 4;

/// [`super::super::MatQ4`] on AVX-512 VNNI for interleaved q4 weights or (`SIX`) q6 ones,
/// reading the activations in [`Q4Layout::Interleaved`]. Groups of other sizes than 32 are not
/// interleaved and take the reference (the activations are then not laid out).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_interleaved_avx512<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.x.is_empty() {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    assert_eq!(
        x.q4.layout,
        Q4Layout::Interleaved,
        "the AVX-512 q4 kernel reads Q4Layout::Interleaved"
    );
    // Bytes this thread may prefetch, counted from the start of `w`.
    let reach = w.len() + ahead;
    if x.t == 1 {
        return for_each_tile(rows, 1, 4, 1, |m, _, r, _| {
            // SAFETY: rows r..r+m exist (for_each_tile keeps them so); `check_either` passed and
            // the activations are laid out (checked above), as `tile` requires.
            match m {
                4 => tile::<4, 1, SIX>(w, ws, x, out, r, 0, reach),
                _ => tile::<1, 1, SIX>(w, ws, x, out, r, 0, reach),
            }
        });
    }
    for_each_tile(rows, x.t, 2, TOKENS, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n exist (for_each_tile keeps them so); as above.
        match (m, n) {
            (2, 4) => tile::<2, 4, SIX>(w, ws, x, out, r, i, reach),
            (2, 3) => tile::<2, 3, SIX>(w, ws, x, out, r, i, reach),
            (2, 2) => tile::<2, 2, SIX>(w, ws, x, out, r, i, reach),
            (2, _) => tile::<2, 1, SIX>(w, ws, x, out, r, i, reach),
            (_, 4) => tile::<1, 4, SIX>(w, ws, x, out, r, i, reach),
            (_, 3) => tile::<1, 3, SIX>(w, ws, x, out, r, i, reach),
            (_, 2) => tile::<1, 2, SIX>(w, ws, x, out, r, i, reach),
            _ => tile::<1, 1, SIX>(w, ws, x, out, r, i, reach),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`,
/// prefetching weights up to `reach` bytes from the start of `w`.
///
/// Caller guarantees the rows and tokens exist, that `q6::check_either::<SIX>` passed and that
/// the activations are laid out in [`Q4Layout::Interleaved`] (groups of 32). Then every read is
/// in bounds: a row is `per = cols / 32` groups of 16 bytes (q6: 24), and a block of `n` groups
/// from group `g0` reads bytes `16 g0 .. 16 (g0 + n)` of its row (q6: 24), values `32 g0 .. 32
/// (g0 + n)` of a token's laid-out row and entries `g0 .. g0 + n` of its corrections and scales
/// and of the row's weight scales; the short block's loads are masked to its `n` lanes (words),
/// and a masked load neither reads nor faults past its mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const R: usize, const N: usize, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: usize,
) {
    let (t, cols) = (x.t, x.cols);
    let per = cols / SIMD_GROUP;
    let row_bytes = q6::row_bytes::<SIX>(cols);
    let group_bytes = q6::row_bytes::<SIX>(SIMD_GROUP);
    let rows = Rows::<R> {
        w: std::array::from_fn(|a| w.as_ptr().add((r + a) * row_bytes)),
        ws: std::array::from_fn(|a| ws.as_ptr().add((r + a) * per)),
    };
    let tokens = Tokens::<N> {
        x: std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols)),
        corr: std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * per)),
        scale: std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * per)),
    };
    // The weight scales are a stream of their own, 2 bytes a group (1/8 of q4's bytes, 1/12 of
    // q6's): the tile's scales asked for at once, `PREFETCH_NEAR / 16` bytes ahead in their
    // stream (as far ahead as 4 KiB of q4 weights); a few lines for a tile of rows of the 0.6B
    // shape, against the weights' 32 (see `block`).
    let from = r * per * 2 + PREFETCH_NEAR / 16;
    for line in (from..from + R * per * 2).step_by(64) {
        // A prefetch never faults; `wrapping_add` may point past `ws` without UB.
        _mm_prefetch::<_MM_HINT_T2>((ws.as_ptr() as *const i8).wrapping_add(line));
    }
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let full = per / GROUPS;
    for b in 0..full {
        let g0 = b * GROUPS;
        // The tile's rows are consecutive in memory: its weights are one stream, of which this
        // block reads its share, asked for ahead a row's piece at a time (`block`).
        let share = R * GROUPS * group_bytes;
        let from = r * row_bytes + b * share;
        block::<R, N, SIX, true>(&mut acc, &rows, &tokens, g0, GROUPS, |a| {
            let piece = share / R;
            prefetch_lines(w, from + a * piece, piece, reach);
        });
    }
    let n = per - full * GROUPS;
    if n > 0 {
        let g0 = full * GROUPS;
        let from = r * row_bytes + R * g0 * group_bytes;
        block::<R, N, SIX, false>(&mut acc, &rows, &tokens, g0, n, |a| {
            let piece = n * group_bytes;
            prefetch_lines(w, from + a * piece, piece, reach);
        });
    }
    for (a, acc_a) in acc.iter().enumerate() {
        for (j, &v) in acc_a.iter().enumerate() {
            *out.get_unchecked_mut((r + a) * t + i + j) = sum16(v);
        }
    }
}

/// Where a tile's weight rows start: their bytes and their f16 scales.
struct Rows<const R: usize> {
    w: [*const u8; R],
    ws: [*const u16; R],
}

/// Where a tile's tokens start: their laid-out values, corrections and scales.
struct Tokens<const N: usize> {
    x: [*const i8; N],
    corr: [*const i32; N],
    scale: [*const f32; N],
}

/// `n` 32-bit words from `p` (16 when `FULL`, the others zero): a vector of a block whose
/// vectors are `4n` bytes apart.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn words<const FULL: bool>(p: *const u8, n: usize) -> __m512i {
    match FULL {
        true => _mm512_loadu_si512(p as *const __m512i),
        false => _mm512_maskz_loadu_epi32(((1u32 << n) - 1) as __mmask16, p as *const i32),
    }
}

/// Adds the block of `n` groups from `g0` (16 when `FULL`) into `acc`, calling `prefetch(a)`
/// before row `a`'s weights are read. Caller guarantees what [`tile`]'s caller does.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// The indices pick a row's or token's pointers, weights and accumulator together.
#[allow(clippy::needless_range_loop)]
unsafe fn block<const R: usize, const N: usize, const SIX: bool, const FULL: bool>(
    acc: &mut [[__m512; N]; R],
    rows: &Rows<R>,
    tokens: &Tokens<N>,
    g0: usize,
    n: usize,
    prefetch: impl Fn(usize),
) {
    let group_bytes = q6::row_bytes::<SIX>(SIMD_GROUP);
    // `prefetch(a)` asks for a piece of the weights ahead just before row `a`'s block is read,
    // so the prefetches (two per 64 bytes) are spread among the arithmetic. Asked for all at once
    // before the block (32 prefetches in a row for a decode tile), they made one Zen 5 thread
    // decode the 0.6B shape's q4 file 8% slower (measured: docs/quantization.md, "AVX-512 on
    // Zen 5"); the AVX2 kernels already ask a chunk at a time.
    // Decode's q4 leaves the high nibbles in place (16 times their value) and shifts their
    // integer sum once instead (`split`): a row's four shifts become one a token, which is less
    // work only for one token; q6's high bits would not fit above them. The integer sum is the
    // same, so the bits are too.
    let split = !SIX && N == 1;
    if N == 1 {
        // Decode: the token's activations stay in registers while each row is unpacked and used
        // at once.
        let act = acts::<N, SIX, FULL>(tokens, 0, g0, n);
        for a in 0..R {
            prefetch(a);
            let wv = weights::<SIX, FULL>(rows.w[a].add(g0 * group_bytes), n, split);
            let d = weight_scales::<FULL>(rows.ws[a].add(g0), n);
            dot(&mut acc[a][0], &wv, &act, d, split);
        }
    } else {
        // A prompt: the rows unpacked once, then each token against all of them, each vector of
        // its activations loaded once for every row (loads, not the products, bound a tile
        // that loads a token's activations for one row).
        let wv: [[__m512i; 8]; R] = std::array::from_fn(|a| {
            prefetch(a);
            weights::<SIX, FULL>(rows.w[a].add(g0 * group_bytes), n, false)
        });
        let d: [__m512; R] = std::array::from_fn(|a| weight_scales::<FULL>(rows.ws[a].add(g0), n));
        for j in 0..N {
            let base = tokens.x[j].add(g0 * SIMD_GROUP) as *const u8;
            let corr = words::<FULL>(tokens.corr[j].add(g0) as *const u8, n);
            let corr = if SIX {
                _mm512_slli_epi32(corr, 2)
            } else {
                corr
            };
            let mut isum = [corr; R];
            for k in 0..8 {
                let xk = words::<FULL>(base.add(k * 4 * n), n);
                for a in 0..R {
                    isum[a] = _mm512_dpbusd_epi32(isum[a], wv[a][k], xk);
                }
            }
            let scale = _mm512_castsi512_ps(words::<FULL>(tokens.scale[j].add(g0) as *const u8, n));
            for a in 0..R {
                // As `dot` does it.
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[a]), scale);
                acc[a][j] = _mm512_fmadd_ps(v, d[a], acc[a][j]);
            }
        }
    }
}

/// One token's activations for one block: the eight vectors the nibbles meet, the lanes'
/// corrections (already times four for q6) and scales.
struct Acts {
    x: [__m512i; 8],
    corr: __m512i,
    scale: __m512,
}

/// Token `j`'s activations for the block of `n` groups from `g0`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn acts<const N: usize, const SIX: bool, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> Acts {
    let base = tokens.x[j].add(g0 * SIMD_GROUP) as *const u8;
    let corr = words::<FULL>(tokens.corr[j].add(g0) as *const u8, n);
    Acts {
        x: std::array::from_fn(|k| words::<FULL>(base.add(k * 4 * n), n)),
        // q6 weights are q + 32, four times q4's offset of 8.
        corr: if SIX {
            _mm512_slli_epi32(corr, 2)
        } else {
            corr
        },
        scale: _mm512_castsi512_ps(words::<FULL>(tokens.scale[j].add(g0) as *const u8, n)),
    }
}

/// The f16 weight scales of the `n` groups at `p`, widened.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn weight_scales<const FULL: bool>(p: *const u16, n: usize) -> __m512 {
    _mm512_cvtph_ps(match FULL {
        true => _mm256_loadu_si256(p as *const __m256i),
        false => _mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, p as *const i16),
    })
}

/// A row's block of `n` groups at `p`, unpacked to bytes: the low nibbles of its four vectors,
/// then the high ones (q4: q + 8, 0..=15; q6: q + 32, 0..=63); with `split` (q4 only), the high
/// nibbles left in place, 16 times their value.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn weights<const SIX: bool, const FULL: bool>(
    p: *const u8,
    n: usize,
    split: bool,
) -> [__m512i; 8] {
    let nibble = _mm512_set1_epi8(15);
    let v: [__m512i; 4] = std::array::from_fn(|k| words::<FULL>(p.add(k * 4 * n), n));
    let mut wv: [__m512i; 8] = std::array::from_fn(|k| match (k < 4, split) {
        (true, _) => _mm512_and_si512(v[k], nibble),
        (false, true) => _mm512_andnot_si512(nibble, v[k - 4]),
        (false, false) => _mm512_and_si512(_mm512_srli_epi16(v[k - 4], 4), nibble),
    });
    if SIX {
        // High vector k / 2 holds word k's two-bit pieces at bits 4 (k % 2) (the low values')
        // and 4 (k % 2) + 2 (the high values'): each goes to bits 4-5 of its nibble,
        // `nibble | shifted & 0x30` (vpternlogd 0xf8: A | B & C).
        let bits_4_5 = _mm512_set1_epi8(0x30);
        let high: [__m512i; 2] = std::array::from_fn(|m| words::<FULL>(p.add((4 + m) * 4 * n), n));
        for k in 0..4 {
            let h = high[k / 2];
            let (lo, hi) = match k % 2 {
                0 => (_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2)),
                _ => (h, _mm512_srli_epi16(h, 2)),
            };
            wv[k] = _mm512_ternarylogic_epi32::<0xf8>(wv[k], lo, bits_4_5);
            wv[k + 4] = _mm512_ternarylogic_epi32::<0xf8>(wv[k + 4], hi, bits_4_5);
        }
    }
    wv
}

/// One (row, token) pair: `acc += float(corr + the eight byte products) * xs * d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// `k` picks a weight vector and the activations it meets.
#[allow(clippy::needless_range_loop)]
unsafe fn dot(acc: &mut __m512, wv: &[__m512i; 8], act: &Acts, d: __m512, split: bool) {
    let mut isum = act.corr;
    for k in 0..4 {
        isum = _mm512_dpbusd_epi32(isum, wv[k], act.x[k]);
    }
    if split {
        let mut high = _mm512_setzero_si512();
        for k in 4..8 {
            high = _mm512_dpbusd_epi32(high, wv[k], act.x[k]);
        }
        // Exact: every product in `high` is a multiple of 16.
        isum = _mm512_add_epi32(isum, _mm512_srai_epi32(high, 4));
    } else {
        for k in 4..8 {
            isum = _mm512_dpbusd_epi32(isum, wv[k], act.x[k]);
        }
    }
    let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), act.scale);
    *acc = _mm512_fmadd_ps(v, d, *acc);
}

/// The sum of a (row, token) pair's 16 lanes of partial sums, in a fixed order: lanes `l` and
/// `l + 8`, then `l` and `l + 4`, then `l` and `l + 2`, then the last two.
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
