//! The AVX2 + FMA kernels (256-bit vectors), and the same q8 kernels with AVX-VNNI's
//! `vpdpbusd` for the byte products. The AVX-512 kernels reuse some of them (`avx512.rs`).

use super::super::*;
use super::{prefetch_ahead, PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::asm;
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hmax256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_max_ps(lo, hi);
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY: every load reads [i, i+16) with i + 16 <= n.
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            acc1,
        );
        i += 16;
    }
    hsum256(_mm256_add_ps(acc0, acc1)) + dot_f32_scalar(&a[i..n], &b[i..n])
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: reads w[i..i+8] (16 bytes) and x[i..i+8] with i + 8 <= n.
    while i + 8 <= n {
        let b = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
        let f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
        acc = _mm256_fmadd_ps(f, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
        i += 8;
    }
    hsum256(acc) + dot_bf16_scalar(&w[i..n], &x[i..n])
}

/// Groups of a multiple of 32 values; other group sizes take the scalar path. Prefetches the
/// weights up to `REACH` bytes past the one it reads, as [`dot_q8_avx512`] does; multiplies
/// bytes with the instructions `P` names (see [`MADDUBS`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_q8_avx2<const REACH: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    // Groups of 32 (a GGUF's Q8_0, a q4 file's q8 matrices) and 64 (a q8 file's) add eight
    // groups' sums a vector (`q8_lanes_avx2.rs`); other multiples of 32 a group at a time.
    // (AVX-512 hands only the other multiples to `EVEX_VNNI`: its code for 32 and 64 is never
    // compiled, which keeps the binary smaller.)
    match gs {
        64 if P != EVEX_VNNI => {
            super::q8_lanes_avx2::dot_q8_lanes_avx2::<REACH, 64, P>(w, ws, x, xs)
        }
        32 if P != EVEX_VNNI => {
            super::q8_lanes_avx2::dot_q8_lanes_avx2::<REACH, 32, P>(w, ws, x, xs)
        }
        _ if gs.is_multiple_of(32) => dot_q8_avx2_by_group::<REACH, P>(w, ws, x, xs, gs),
        _ => dot_q8_scalar(w, ws, x, xs, gs),
    }
}

/// [`dot_q8_avx2`] a group at a time, for groups of `gs` values, a multiple of 32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_avx2_by_group<const REACH: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    // One chain of multiply-adds, group after group, in the order tile_q8_avx2 adds them, so
    // decode and prefill give the same bits.
    let mut acc = _mm256_setzero_ps();
    // SAFETY: group_q8_avx2 reads w and x at [g*gs, (g+1)*gs) and scale_at256 ws[g], xs[g],
    // for g < groups, and `groups` is at most each slice's length in groups.
    for g in 0..groups {
        let isum = group_q8_avx2::<REACH, P>(wp, xp, g * gs, gs);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale_at256(ws, xs, g), acc);
    }
    hsum256(acc)
}

/// `ws[g] * xs[g]` in every lane. Caller guarantees `g` is in bounds of both.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scale_at256(ws: &[f32], xs: &[f32], g: usize) -> __m256 {
    _mm256_set1_ps(*ws.get_unchecked(g) * *xs.get_unchecked(g))
}

/// The sum `sum(w[i] * x[i])` over the `n` values (a multiple of 32) at `w + at` and `x + at`,
/// as 8 i32 partial sums. Prefetches the weights up to `REACH` bytes ahead, once per 64 bytes
/// (see [`PREFETCH_NEAR`]). Caller guarantees both ranges are in bounds.
///
/// The byte products ([`dot4`]) take unsigned by signed bytes, so the sign of `w` moves onto
/// `x`: `|w| * (sign(w) x) = w x`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn group_q8_avx2<const REACH: usize, const P: u8>(
    w: *const i8,
    x: *const i8,
    at: usize,
    n: usize,
) -> __m256i {
    let product = |isum: __m256i, k: usize| {
        let wv = _mm256_loadu_si256(w.add(k) as *const __m256i);
        let xv = _mm256_loadu_si256(x.add(k) as *const __m256i);
        dot4::<P>(isum, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
    };
    let mut isum = _mm256_setzero_si256();
    let mut k = at;
    // 64 bytes (one cache line of weights) at a time, and 32 for an odd tail.
    while k + 64 <= at + n {
        prefetch_ahead(w.wrapping_add(k), REACH);
        isum = product(product(isum, k), k + 32);
        k += 64;
    }
    if k < at + n {
        // Groups of 32 (or an odd 32 of a larger group) come here without passing the loop's
        // prefetches: ask for them here too, once per 64 bytes of the row.
        if k.is_multiple_of(64) {
            prefetch_ahead(w.wrapping_add(k), REACH);
        }
        isum = product(isum, k);
    }
    isum
}

/// Which instructions the AVX2 kernels multiply bytes with: their const parameter `P`. Each
/// of the three adds to every i32 lane the four products of its neighbouring bytes, unsigned by
/// signed; the sums are the same exact integers. AVX2 alone takes two instructions and an add:
/// `vpmaddubsw` multiplies into i16 pairs, `vpmaddwd` against ones widens them to i32.
pub(super) const MADDUBS: u8 = 0;
/// `vpdpbusd` with a VEX encoding (AVX-VNNI): one instruction for the three of [`MADDUBS`].
pub(super) const VEX_VNNI: u8 = 1;
/// `vpdpbusd` on 256 bits with an EVEX encoding (AVX512-VNNI with AVX512-VL): the AVX-512
/// kernel's path for group sizes that are a multiple of 32 but not of 64. It is the AVX-VNNI
/// path with another encoding of the same instruction, so the tests run that path's code on
/// AVX-512 machines, which have no VEX `vpdpbusd`.
pub(super) const EVEX_VNNI: u8 = 2;

/// `isum` plus, in each i32 lane `l`, `sum(u[4l + b] * s[4l + b])` over `b` in 0..4, for
/// unsigned bytes `u` and signed bytes `s`, with the instructions `P` names (see [`MADDUBS`]).
/// Caller guarantees `u <= 127` and `-127 <= s <= 127` in every byte (quantized values lie in
/// [-127, 127]): then a pair of products sums to at most 2 * 127 * 127 < 2^15 and
/// `vpmaddubsw` never saturates, so all three forms give the exact sum. It guarantees as well
/// that the CPU has the instructions (`P` comes from the dispatch: `has_avx2`,
/// `has_avx_vnni`, `has_avx512`).
///
/// `vpdpbusd` is written as inline assembly: the `std::arch` intrinsics for it may only be
/// inlined into functions compiled with AVX-VNNI or AVX512-VNNI enabled, and the kernels around
/// this call are compiled once for AVX2 and reused for all three forms.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot4<const P: u8>(isum: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = isum;
    // SAFETY (both asm blocks): the caller guarantees the CPU has the instruction; it reads
    // the three registers and writes `acc`, and touches no memory, stack or flags.
    match P {
        VEX_VNNI => asm!(
            "{{vex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        ),
        EVEX_VNNI => asm!(
            "{{evex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        ),
        _ => {
            let p16 = _mm256_maddubs_epi16(u, s);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        }
    }
    acc
}

/// `isum` plus, in each i32 lane, the `4K` products `u[k] * s[k]` of its four bytes in each of
/// the `K` pairs: [`dot4`] `K` times, for q4 and q6 weights. Caller guarantees `u[k] <= max_u`
/// and `-127 <= s[k] <= 127` in every byte with `2 * K * max_u * 127 < 2^15`, and that the CPU
/// has what `P` names. With `vpmaddubsw` the `K` products are added as i16 before one
/// `vpmaddwd` widens them: an i16 lane then holds `2K` products, so the bound keeps the sum exact,
/// and `K - 1` widenings (and adds) are saved against `K` [`dot4`]s. Used with `K = 2` for q6
/// (`max_u` = 63: 4 * 63 * 127 = 32004) and `K = 4` for q4 (15: 8 * 15 * 127 = 15240).
/// `vpdpbusd` widens as it multiplies.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_pairs<const P: u8, const K: usize>(
    isum: __m256i,
    u: [__m256i; K],
    s: [__m256i; K],
) -> __m256i {
    match P {
        MADDUBS => {
            let mut p16 = _mm256_maddubs_epi16(u[0], s[0]);
            for k in 1..K {
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(u[k], s[k]));
            }
            _mm256_add_epi32(isum, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
        }
        _ => (0..K).fold(isum, |acc, k| dot4::<P>(acc, u[k], s[k])),
    }
}

/// [`MatQ8`] on AVX2, for groups of a multiple of 32 values (others take the scalar product):
/// groups of 32 and 64 in `q8_lanes_avx2.rs`, the other multiples here.
///
/// Decode (`t = 1`) runs [`dot_q8_avx2`] row by row, prefetching as [`mat_q8_avx512`] does.
/// Prefill is tiled: `R` weight rows against `N` tokens at a time ([`tile_q8_avx2`]).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn mat_q8_avx2<const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = x.check(w, ws, out);
    let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
    if !gs.is_multiple_of(32) {
        return mat_q8_with(dot_q8_scalar, w, ws, x, out);
    }
    match gs {
        // A GGUF's Q8_0, a q4 file's q8 matrices: eight groups a vector (`q8_lanes_avx2.rs`).
        // (AVX-512 hands only the other multiples to `EVEX_VNNI`, as in `dot_q8_avx2`.)
        32 if P != EVEX_VNNI => {
            return super::q8_lanes_avx2::mat_q8_lanes_avx2::<32, P>(w, ws, x, out, rows, ahead)
        }
        // A q8 file's matrices, likewise.
        64 if P != EVEX_VNNI => {
            return super::q8_lanes_avx2::mat_q8_lanes_avx2::<64, P>(w, ws, x, out, rows, ahead)
        }
        _ => {}
    }
    if t == 1 {
        for (r, o) in out.iter_mut().enumerate() {
            let (w_r, ws_r) = (&w[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
            // As in mat_q8_avx512: prefetch no further than the bytes this thread reads next.
            let after = (rows - r - 1) * cols + ahead;
            *o = if after >= PREFETCH_FAR {
                dot_q8_avx2::<PREFETCH_FAR, P>(w_r, ws_r, x.q, x.scales, gs)
            } else if after >= PREFETCH_NEAR {
                dot_q8_avx2::<PREFETCH_NEAR, P>(w_r, ws_r, x.q, x.scales, gs)
            } else {
                dot_q8_avx2::<0, P>(w_r, ws_r, x.q, x.scales, gs)
            };
        }
        return;
    }
    for_each_tile(rows, t, TILE_R_AVX2, TILE_N_AVX2, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so),
        // and `check` proved every slice has the length of its shape.
        match (m, n) {
            (2, 4) => tile_q8_avx2::<2, 4, P>(w, ws, x, out, r, i),
            (2, 3) => tile_q8_avx2::<2, 3, P>(w, ws, x, out, r, i),
            (2, 2) => tile_q8_avx2::<2, 2, P>(w, ws, x, out, r, i),
            (2, _) => tile_q8_avx2::<2, 1, P>(w, ws, x, out, r, i),
            (_, 4) => tile_q8_avx2::<1, 4, P>(w, ws, x, out, r, i),
            (_, 3) => tile_q8_avx2::<1, 3, P>(w, ws, x, out, r, i),
            (_, 2) => tile_q8_avx2::<1, 2, P>(w, ws, x, out, r, i),
            _ => tile_q8_avx2::<1, 1, P>(w, ws, x, out, r, i),
        }
    });
}

/// The largest tile of [`tile_q8_avx2`]: 2 weight rows by 4 tokens (the arms above match it).
pub(super) const TILE_R_AVX2: usize = 2;
pub(super) const TILE_N_AVX2: usize = 4;

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`, on
/// AVX2: each weight vector and its absolute value are loaded and made once for `N` tokens,
/// each activation vector loaded once for `R` rows. Per 32 weights and token: the sign
/// fix-up and the byte products ([`dot4`]; see [`group_q8_avx2`]).
///
/// Caller guarantees rows `r..r+R` and tokens `i..i+N` exist, that `x.check` passed and that
/// the group size is a multiple of 32.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_q8_avx2<const R: usize, const N: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    // Groups of 32 and 64 take `q8_lanes_avx2.rs`; this tile serves the other multiples of 32.
    let (t, cols, per, gs) = (x.t, x.cols, x.per(), x.group_size);
    let w_row: [*const i8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols));
    let ws_row: [*const f32; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q.as_ptr().add((i + j) * cols));
    let xs_row: [*const f32; N] = std::array::from_fn(|j| x.scales.as_ptr().add((i + j) * per));
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    // Combined scales ws[r, g] * xs[i, g] of up to 8 groups, made 8 at a time with one vector
    // multiply (the same f32 products as decode's scalar ones); the multiply-adds below
    // broadcast them from here.
    let mut scale = [[[0f32; 8]; N]; R];
    let mut g0 = 0;
    while g0 < per {
        let m = (per - g0).min(8);
        for a in 0..R {
            for j in 0..N {
                if m == 8 {
                    let v = _mm256_mul_ps(
                        _mm256_loadu_ps(ws_row[a].add(g0)),
                        _mm256_loadu_ps(xs_row[j].add(g0)),
                    );
                    _mm256_storeu_ps(scale[a][j].as_mut_ptr(), v);
                } else {
                    for (gg, s) in scale[a][j].iter_mut().enumerate().take(m) {
                        *s = *ws_row[a].add(g0 + gg) * *xs_row[j].add(g0 + gg);
                    }
                }
            }
        }
        for g in g0..g0 + m {
            let mut isum = [[_mm256_setzero_si256(); N]; R];
            // 32 weights of each row at k against 32 activations of each token.
            let mut chunk = |k: usize| {
                let wv: [__m256i; R] =
                    std::array::from_fn(|a| _mm256_loadu_si256(w_row[a].add(k) as *const __m256i));
                let aw = wv.map(|v| _mm256_sign_epi8(v, v));
                for j in 0..N {
                    let xv = _mm256_loadu_si256(x_row[j].add(k) as *const __m256i);
                    for a in 0..R {
                        isum[a][j] = dot4::<P>(isum[a][j], aw[a], _mm256_sign_epi8(xv, wv[a]));
                    }
                }
            };
            let mut k = g * gs;
            while k + 64 <= (g + 1) * gs {
                // The weights ahead, as the AVX-512 tile asks for them (see PREFETCH_NEAR):
                // with a few tokens this product too waits on DRAM without it.
                for w_a in w_row {
                    prefetch_ahead(w_a.wrapping_add(k), usize::MAX);
                }
                chunk(k);
                chunk(k + 32);
                k += 64;
            }
            if k < (g + 1) * gs {
                chunk(k);
            }
            for a in 0..R {
                for j in 0..N {
                    let sc = _mm256_broadcast_ss(scale[a][j].get_unchecked(g - g0));
                    acc[a][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[a][j]), sc, acc[a][j]);
                }
            }
        }
        g0 += m;
    }
    for (a, acc_a) in acc.iter().enumerate() {
        for (j, &acc_aj) in acc_a.iter().enumerate() {
            *out.get_unchecked_mut((r + a) * t + i + j) = hsum256(acc_aj);
        }
    }
}

/// Groups of a multiple of 8 values; others take the scalar path.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_q8_f32_avx2(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
    if !gs.is_multiple_of(8) {
        return dot_q8_f32_scalar(w, ws, x, gs);
    }
    let groups = ws.len().min(w.len() / gs).min(x.len() / gs);
    let mut acc = _mm256_setzero_ps();
    for (g, &scale) in ws.iter().enumerate().take(groups) {
        let mut part = _mm256_setzero_ps();
        let mut k = g * gs;
        // SAFETY: reads w[k..k+8] (8 bytes) and x[k..k+8] with k + 8 <= (g+1)*gs <= len.
        while k < (g + 1) * gs {
            let wi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(w.as_ptr().add(k) as *const __m128i));
            part = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(wi),
                _mm256_loadu_ps(x.as_ptr().add(k)),
                part,
            );
            k += 8;
        }
        acc = _mm256_fmadd_ps(part, _mm256_set1_ps(scale), acc);
    }
    hsum256(acc)
}

/// [`quantize_q8_avx512`] on AVX2, the same bits as `quant::quantize_q8` by the same argument.
/// (Without it the reference's `round_ties_even` is a call to libm's `rintf` per value, as
/// x86-64's baseline has no rounding instruction, and those calls show in a one-thread prefill's
/// profile; measured: docs/performance.md, "Integer dot products (W8A8)".)
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_q8_avx2(x: &[f32], gs: usize, q: &mut [i8], scales: &mut [f32]) {
    if !gs.is_multiple_of(8) {
        return crate::quant::quantize_q8(x, gs, q, scales);
    }
    assert!(x.len().is_multiple_of(gs) && q.len() == x.len() && scales.len() == x.len() / gs);
    let sign = _mm256_set1_ps(-0.0);
    for (g, s_out) in scales.iter_mut().enumerate() {
        let base = g * gs;
        let mut m = _mm256_setzero_ps();
        // SAFETY: reads x[k..k+8] with k + 8 <= base + gs <= x.len().
        for k in (base..base + gs).step_by(8) {
            m = _mm256_max_ps(
                m,
                _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(k))),
            );
        }
        let s = hmax256(m) / 127.0;
        *s_out = s;
        if s == 0.0 {
            q[base..base + gs].fill(0);
            continue;
        }
        let sv = _mm256_set1_ps(s);
        for k in (base..base + gs).step_by(8) {
            let i = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(k)), sv));
            // Saturating narrow to i8 (|v| <= 127 already, the saturation is a guard): eight
            // i32 to eight i16, then to eight i8 in the low 8 bytes.
            let i16s = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
            // SAFETY: writes q[k..k+8] with k + 8 <= q.len().
            _mm_storel_epi64(
                q.as_mut_ptr().add(k) as *mut __m128i,
                _mm_packs_epi16(i16s, i16s),
            );
        }
    }
}
