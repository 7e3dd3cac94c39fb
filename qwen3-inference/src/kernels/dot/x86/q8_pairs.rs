//! AVX-512 q8 products for groups of 32 values: a GGUF's Q8_0 (`gguf/repack.rs`) and a q4 file's
//! q8 tables. One 64-byte vector holds two groups, and `vpdpbusd` leaves each 32-bit lane the
//! sum of four products, so lanes 0-7 of a vector's integer sums belong to its first group and
//! lanes 8-15 to its second: one multiply-add by the vector of the two groups' scales (each in
//! its eight lanes) takes both into the f32 sums, where the groups-of-64 kernels (`avx512.rs`)
//! take one group a vector.
//!
//! Decode and prefill add in the same order (pairs alternating between two accumulators, an odd
//! last group alone, its upper lanes zero), and their integer sums are exact, so a prompt's
//! tokens get decode's bits (`prefill_rows_equal_decode_rows`).

use super::super::ActsQ8;
use super::prefetch_ahead;
use std::arch::x86_64::*;

/// Values a group holds here.
const GS: usize = 32;

/// For each pair `p` of a block of 16 groups: the lanes of its two groups' scales, `2p` in
/// lanes 0-7 and `2p + 1` in lanes 8-15 (`vpermps` indices into the block's 16 scales).
static PAIR_LANES: [[i32; 16]; 8] = {
    let mut idx = [[0i32; 16]; 8];
    let mut p = 0;
    while p < 8 {
        let mut l = 0;
        while l < 16 {
            idx[p][l] = (2 * p + l / 8) as i32;
            l += 1;
        }
        p += 1;
    }
    idx
};

/// The products `ws[g] xs[g]` of the (up to 16) groups from `g0`, zero past the `m`-th.
/// Caller guarantees `min(m, 16)` floats are readable at `ws` and at `xs` (the masked loads
/// read no others and cannot fault past their mask).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block_scales(ws: *const f32, xs: *const f32, m: usize) -> __m512 {
    let mask: __mmask16 = if m >= 16 { 0xffff } else { (1u16 << m) - 1 };
    _mm512_mul_ps(
        _mm512_maskz_loadu_ps(mask, ws),
        _mm512_maskz_loadu_ps(mask, xs),
    )
}

/// Pair `p`'s scales out of its block's (`block_scales`): each group's in its eight lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_scales(block: __m512, p: usize) -> __m512 {
    let idx = _mm512_loadu_si512(PAIR_LANES[p].as_ptr() as *const __m512i);
    _mm512_permutexvar_ps(idx, block)
}

/// The 64 bytes at `p` (`FULL`), or the 32 there and zeros. Caller guarantees those 64 (or 32)
/// bytes are readable; the masked load reads no others and cannot fault past its mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load<const FULL: bool>(p: *const u8) -> __m512i {
    match FULL {
        true => _mm512_loadu_si512(p as *const __m512i),
        false => _mm512_maskz_loadu_epi8(u32::MAX as u64, p as *const i8),
    }
}

/// The integer sums of `w` and `x` (64 bytes at `k`, or 32 unless `FULL`), as f32 (exact: at
/// most 4 * 128 * 127 in a lane), prefetching the weights up to `REACH` bytes on. Caller
/// guarantees what [`load`] needs at `w + k` and `x + k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sums<const REACH: usize, const FULL: bool>(
    w: *const u8,
    x: *const u8,
    k: usize,
) -> __m512 {
    prefetch_ahead(w.wrapping_add(k) as *const i8, REACH);
    let (wv, xv) = (load::<FULL>(w.add(k)), load::<FULL>(x.add(k)));
    // vpdpbusd multiplies unsigned by signed bytes: |w| against x negated where w < 0 (|-128|
    // is 128 as an unsigned byte, and x lies in [-127, 127]).
    let neg = _mm512_movepi8_mask(wv);
    let x_signed = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
    let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), x_signed);
    _mm512_cvtepi32_ps(isum)
}

/// `sum_g ws[g] xs[g] sum(w x)` over the groups of 32 of one row and one token, as
/// `DotQ8` (decode). Prefetches the weights up to `REACH` bytes past the one it reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn dot_q8_pairs_avx512<const REACH: usize>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
) -> f32 {
    let groups = ws.len().min(xs.len()).min(w.len() / GS).min(x.len() / GS);
    let (wp, xp) = (w.as_ptr() as *const u8, x.as_ptr() as *const u8);
    // Pairs alternate between two accumulators (even pairs, odd pairs), so consecutive
    // multiply-adds do not wait on each other.
    let (mut even, mut odd) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut g0 = 0;
    // SAFETY: every group read is below `groups`, which each slice holds.
    while g0 < groups {
        let m = (groups - g0).min(16);
        let scales = block_scales(ws.as_ptr().add(g0), xs.as_ptr().add(g0), m);
        for p in 0..m / 2 {
            let v = sums::<REACH, true>(wp, xp, (g0 + 2 * p) * GS);
            let s = pair_scales(scales, p);
            match p % 2 {
                0 => even = _mm512_fmadd_ps(v, s, even),
                _ => odd = _mm512_fmadd_ps(v, s, odd),
            }
        }
        if m % 2 == 1 {
            // The last group alone: its second group's lanes are zero, and so is their scale.
            let p = m / 2;
            let v = sums::<REACH, false>(wp, xp, (g0 + 2 * p) * GS);
            let s = pair_scales(scales, p);
            match p % 2 {
                0 => even = _mm512_fmadd_ps(v, s, even),
                _ => odd = _mm512_fmadd_ps(v, s, odd),
            }
        }
        g0 += m;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(even, odd))
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`, with
/// groups of 32: as `avx512::tile_q8` (the biased activations, the weights' correction shared by
/// the tokens), two groups a vector, adding in [`dot_q8_pairs_avx512`]'s order.
///
/// Caller guarantees rows `r..r+R` and tokens `i..i+N` exist, that `x.check` passed and that
/// `x.group_size` is 32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn tile_q8_pairs<const R: usize, const N: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let (t, cols, per) = (x.t, x.cols, x.per());
    let w_row: [*const u8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols) as _);
    let ws_row: [*const f32; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
    let x_row: [*const u8; N] = std::array::from_fn(|j| x.biased.as_ptr().add((i + j) * cols));
    let xs_row: [*const f32; N] = std::array::from_fn(|j| x.scales.as_ptr().add((i + j) * per));
    let mut even = [[_mm512_setzero_ps(); N]; R];
    let mut odd = [[_mm512_setzero_ps(); N]; R];
    let mut g0 = 0;
    while g0 < per {
        let m = (per - g0).min(16);
        let scales: [[__m512; N]; R] = std::array::from_fn(|a| {
            std::array::from_fn(|j| block_scales(ws_row[a].add(g0), xs_row[j].add(g0), m))
        });
        for p in 0..m / 2 {
            pair::<R, N, true>(
                &mut even,
                &mut odd,
                &w_row,
                &x_row,
                &scales,
                (g0 + 2 * p) * GS,
                p,
            );
        }
        if m % 2 == 1 {
            let p = m / 2;
            pair::<R, N, false>(
                &mut even,
                &mut odd,
                &w_row,
                &x_row,
                &scales,
                (g0 + 2 * p) * GS,
                p,
            );
        }
        g0 += m;
    }
    for a in 0..R {
        for j in 0..N {
            *out.get_unchecked_mut((r + a) * t + i + j) =
                _mm512_reduce_add_ps(_mm512_add_ps(even[a][j], odd[a][j]));
        }
    }
}

/// Adds pair `p` of its block (bytes `k..k + 64` of each row, or the last group alone unless
/// `FULL`) into the even or odd accumulators of every row and token of a tile. Caller
/// guarantees what [`load`] needs at byte `k` of every row and token, and that `p` is below 8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn pair<const R: usize, const N: usize, const FULL: bool>(
    even: &mut [[__m512; N]; R],
    odd: &mut [[__m512; N]; R],
    w_row: &[*const u8; R],
    x_row: &[*const u8; N],
    scales: &[[__m512; N]; R],
    k: usize,
    p: usize,
) {
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(-128i8); // 0x80: 128 as an unsigned byte
    for w_a in w_row {
        prefetch_ahead(w_a.wrapping_add(k) as *const i8, usize::MAX);
    }
    let wv: [__m512i; R] = std::array::from_fn(|a| load::<FULL>(w_row[a].add(k)));
    // -128 * sum(w) per lane, for each row (zero where the lanes hold no group).
    let neg_bias = wv.map(|v| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, v)));
    let acc = match p % 2 {
        0 => even,
        _ => odd,
    };
    for j in 0..N {
        // Zeros past a last group alone: their products with zero weights add nothing.
        let xv = load::<FULL>(x_row[j].add(k));
        for a in 0..R {
            let isum = _mm512_dpbusd_epi32(neg_bias[a], xv, wv[a]);
            let s = pair_scales(scales[a][j], p);
            acc[a][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[a][j]);
        }
    }
}
