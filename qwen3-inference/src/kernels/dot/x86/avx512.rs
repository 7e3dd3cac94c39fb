//! The AVX-512 kernels (F, BW, VL and VNNI; 512-bit vectors, `vpdpbusd` on 64 bytes).

use super::super::*;
use super::avx2::*;
use super::{prefetch_ahead, PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;

/// Groups of a multiple of 16 values; others take the AVX2 path.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_q8_f32_avx512(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
    if !gs.is_multiple_of(16) {
        return dot_q8_f32_avx2(w, ws, x, gs);
    }
    let groups = ws.len().min(w.len() / gs).min(x.len() / gs);
    let mut acc = _mm512_setzero_ps();
    for (g, &scale) in ws.iter().enumerate().take(groups) {
        let mut part = _mm512_setzero_ps();
        let mut k = g * gs;
        // SAFETY: reads w[k..k+16] (16 bytes) and x[k..k+16] with k + 16 <= (g+1)*gs <= len.
        while k < (g + 1) * gs {
            let wi = _mm512_cvtepi8_epi32(_mm_loadu_si128(w.as_ptr().add(k) as *const __m128i));
            part = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(wi),
                _mm512_loadu_ps(x.as_ptr().add(k)),
                part,
            );
            k += 16;
        }
        acc = _mm512_fmadd_ps(part, _mm512_set1_ps(scale), acc);
    }
    _mm512_reduce_add_ps(acc)
}

#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    // SAFETY: every load reads [i, i+32) with i + 32 <= n.
    while i + 32 <= n {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm512_fmadd_ps(
            _mm512_loadu_ps(pa.add(i + 16)),
            _mm512_loadu_ps(pb.add(i + 16)),
            acc1,
        );
        i += 32;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + dot_f32_scalar(&a[i..n], &b[i..n])
}

/// [`MatBf16`] on AVX-512: tiles of 4 weight rows by 4 tokens, each weight vector widened once
/// for four tokens and each activation vector loaded once for four rows, every (row, token)
/// summed in [`dot_bf16_avx512`]'s order (one accumulator over 16 columns a step, then its lanes
/// and the scalar tail), so a prompt gets decode's bits. Decode (one token), bound by memory,
/// streams one row at a time, as do rows whose length 16 does not divide.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn mat_bf16_avx512(w: &[u16], x: &[f32], t: usize, out: &mut [f32]) {
    let cols = x.len() / t.max(1);
    if t == 1 || cols == 0 || !cols.is_multiple_of(16) {
        // SAFETY: this function runs only where AVX-512F is present (its caller's promise).
        return bf16_rows_by_dot(|w, x| unsafe { dot_bf16_avx512(w, x) }, w, x, t, out);
    }
    let rows = w.len() / cols;
    assert!(w.len() == rows * cols && x.len() == t * cols && out.len() == rows * t);
    for_each_tile(rows, t, 4, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so) and
        // the lengths were asserted above.
        match (m, n) {
            (4, 4) => tile_bf16::<4, 4>(w, x, cols, t, out, r, i),
            (4, 3) => tile_bf16::<4, 3>(w, x, cols, t, out, r, i),
            (4, 2) => tile_bf16::<4, 2>(w, x, cols, t, out, r, i),
            (4, _) => tile_bf16::<4, 1>(w, x, cols, t, out, r, i),
            (_, 4) => tile_bf16::<1, 4>(w, x, cols, t, out, r, i),
            (_, 3) => tile_bf16::<1, 3>(w, x, cols, t, out, r, i),
            (_, 2) => tile_bf16::<1, 2>(w, x, cols, t, out, r, i),
            _ => tile_bf16::<1, 1>(w, x, cols, t, out, r, i),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
/// Caller guarantees they exist and that 16 divides `cols`.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
unsafe fn tile_bf16<const R: usize, const N: usize>(
    w: &[u16],
    x: &[f32],
    cols: usize,
    t: usize,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let w_row: [*const u16; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols));
    let x_row: [*const f32; N] = std::array::from_fn(|j| x.as_ptr().add((i + j) * cols));
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let mut k = 0;
    while k < cols {
        // bf16 is the upper half of an f32: widened by a 16-bit shift.
        let wf: [__m512; R] = std::array::from_fn(|a| {
            let b = _mm256_loadu_si256(w_row[a].add(k) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16))
        });
        for j in 0..N {
            let xv = _mm512_loadu_ps(x_row[j].add(k));
            for a in 0..R {
                acc[a][j] = _mm512_fmadd_ps(wf[a], xv, acc[a][j]);
            }
        }
        k += 16;
    }
    for a in 0..R {
        for j in 0..N {
            // As dot_bf16_avx512 ends: its lanes, plus its (here empty) scalar tail.
            *out.get_unchecked_mut((r + a) * t + i + j) =
                _mm512_reduce_add_ps(acc[a][j]) + dot_bf16_scalar(&[], &[]);
        }
    }
}

#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_bf16_avx512(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: reads w[i..i+16] (32 bytes) and x[i..i+16] with i + 16 <= n.
    while i + 16 <= n {
        let b = _mm256_loadu_si256(w.as_ptr().add(i) as *const __m256i);
        let f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        acc = _mm512_fmadd_ps(f, _mm512_loadu_ps(x.as_ptr().add(i)), acc);
        i += 16;
    }
    _mm512_reduce_add_ps(acc) + dot_bf16_scalar(&w[i..n], &x[i..n])
}

/// Groups of a multiple of 64 values use VNNI, as do groups of 32 (two a vector: `q8_pairs.rs`);
/// other multiples of 32 the AVX2 kernel; others scalar.
/// Prefetches the weights up to `REACH` bytes past the one it reads (see [`PREFETCH_NEAR`]): 0,
/// [`PREFETCH_NEAR`] or [`PREFETCH_FAR`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn dot_q8_avx512<const REACH: usize>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    if gs == 32 {
        return super::q8_pairs::dot_q8_pairs_avx512::<REACH>(w, ws, x, xs);
    }
    if !gs.is_multiple_of(64) {
        return dot_q8_avx2::<0, EVEX_VNNI>(w, ws, x, xs, gs);
    }
    let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    // Two accumulators, alternating between groups, so consecutive groups' multiply-adds do
    // not wait on each other (one chain is bound by the FMA latency, about 4 cycles a group, and
    // decode measured slower with one: docs/performance.md, "Not done yet"). tile_q8 adds in
    // the same order, so decode and prefill give the same bits.
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut g = 0;
    // SAFETY: group_at(g) reads w and x at [g*gs, (g+1)*gs) and ws[g], xs[g], for
    // g < groups, and `groups` is at most each slice's length in groups.
    while g + 2 <= groups {
        acc0 = _mm512_fmadd_ps(
            group_q8_avx512::<REACH>(wp, xp, g * gs, gs),
            scale_at(ws, xs, g),
            acc0,
        );
        let h = g + 1;
        acc1 = _mm512_fmadd_ps(
            group_q8_avx512::<REACH>(wp, xp, h * gs, gs),
            scale_at(ws, xs, h),
            acc1,
        );
        g += 2;
    }
    if g < groups {
        acc0 = _mm512_fmadd_ps(
            group_q8_avx512::<REACH>(wp, xp, g * gs, gs),
            scale_at(ws, xs, g),
            acc0,
        );
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

/// [`MatQ8`] on AVX-512 VNNI, for groups of a multiple of 64 values (others take one
/// [`DotQ8`] per pair).
///
/// Decode (`t = 1`) runs [`dot_q8_avx512`] row by row: it is bound by memory, not arithmetic.
/// Prefill is bound by arithmetic, so it is tiled: two weight rows against four tokens at a
/// time ([`tile_q8`]), each weight vector loaded once for four tokens and each activation
/// vector once for two rows. (Two rows by eight tokens measured slower: its sixteen
/// accumulators plus temporaries exceed the 32 vector registers, and the compiler spills;
/// docs/performance.md, "Prefill: a register-tiled block product".)
///
/// Decode prefetches the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes ahead of the row
/// it reads, within `w` and the `ahead` bytes after it (see [`MatQ8`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn mat_q8_avx512(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = x.check(w, ws, out);
    let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
    if !gs.is_multiple_of(64) && gs != 32 {
        // This CPU has AVX-512F, hence AVX2 and FMA (see `AVX512`).
        return mat_q8_avx2::<EVEX_VNNI>(w, ws, x, out, ahead);
    }
    if t == 1 {
        for (r, o) in out.iter_mut().enumerate() {
            let (w_r, ws_r) = (&w[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
            // Bytes this thread reads after row r: the prefetches of the row reach at most
            // REACH - 64 bytes past its end, so each is for a weight this thread reads soon.
            let after = (rows - r - 1) * cols + ahead;
            *o = if after >= PREFETCH_FAR {
                dot_q8_avx512::<PREFETCH_FAR>(w_r, ws_r, x.q, x.scales, gs)
            } else if after >= PREFETCH_NEAR {
                dot_q8_avx512::<PREFETCH_NEAR>(w_r, ws_r, x.q, x.scales, gs)
            } else {
                dot_q8_avx512::<0>(w_r, ws_r, x.q, x.scales, gs)
            };
        }
        return;
    }
    for_each_tile(rows, t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so),
        // and `check` proved every slice has the length of its shape.
        match (m, n) {
            (2, 4) => tile_q8::<2, 4>(w, ws, x, out, r, i),
            (2, 3) => tile_q8::<2, 3>(w, ws, x, out, r, i),
            (2, 2) => tile_q8::<2, 2>(w, ws, x, out, r, i),
            (2, _) => tile_q8::<2, 1>(w, ws, x, out, r, i),
            (_, 4) => tile_q8::<1, 4>(w, ws, x, out, r, i),
            (_, 3) => tile_q8::<1, 3>(w, ws, x, out, r, i),
            (_, 2) => tile_q8::<1, 2>(w, ws, x, out, r, i),
            _ => tile_q8::<1, 1>(w, ws, x, out, r, i),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
///
/// The integer product of a group uses the biased activations `x + 128` (unsigned, as
/// `vpdpbusd` wants its first operand) and removes the bias afterwards:
/// `sum(x * w) = sum((x + 128) * w) - 128 * sum(w)`. The correction `128 * sum(w)` depends on
/// the weights only, so it is computed once per 64 weights (one more `vpdpbusd`, against a
/// vector of 128s) and shared by all `N` tokens; each token then costs one `vpdpbusd` per 64
/// weights, and one conversion and one multiply-add per group. The sums are exact integers, so
/// the result equals [`dot_q8_scalar`] up to the order of the f32 additions, which is the
/// order of [`dot_q8_avx512`]: prefill and decode give the same bits.
///
/// Caller guarantees rows `r..r+R` and tokens `i..i+N` exist and that `x.check` passed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn tile_q8<const R: usize, const N: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    // The default group size is compiled on its own, so that a group's loop unrolls; groups of
    // 32 go two a vector.
    if x.group_size == 64 {
        tile_q8_gs::<R, N, 64>(w, ws, x, out, r, i)
    } else if x.group_size == 32 {
        super::q8_pairs::tile_q8_pairs::<R, N>(w, ws, x, out, r, i)
    } else {
        tile_q8_gs::<R, N, 0>(w, ws, x, out, r, i)
    }
}

/// [`tile_q8`] for a group size of `GS` values, or of `x.group_size` when `GS` is 0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn tile_q8_gs<const R: usize, const N: usize, const GS: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let (t, cols, per) = (x.t, x.cols, x.per());
    let gs = if GS > 0 { GS } else { x.group_size };
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(-128i8); // 0x80: 128 as an unsigned byte
    let w_row: [*const i8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols));
    let ws_row: [*const f32; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
    let x_row: [*const u8; N] = std::array::from_fn(|j| x.biased.as_ptr().add((i + j) * cols));
    let xs_row: [*const f32; N] = std::array::from_fn(|j| x.scales.as_ptr().add((i + j) * per));
    // Two accumulators per row and token, for the even and the odd groups, added in the order
    // dot_q8_avx512 (decode) adds them, so both give the same bits. With one per row and token
    // this kernel was slower (measured: docs/performance.md, "Prefill: a register-tiled block
    // product").
    let mut acc = [[[_mm512_setzero_ps(); 2]; N]; R];
    // Combined scales ws[r, g] * xs[i, g] of up to 16 groups, made 16 at a time with one
    // vector multiply; the multiply-adds below broadcast them from here.
    let mut scale = [[[0f32; 16]; N]; R];
    let mut g0 = 0;
    while g0 < per {
        let m = (per - g0).min(16);
        let mask: __mmask16 = if m == 16 { 0xffff } else { (1u16 << m) - 1 };
        for a in 0..R {
            let wsv = _mm512_maskz_loadu_ps(mask, ws_row[a].add(g0));
            for j in 0..N {
                let xsv = _mm512_maskz_loadu_ps(mask, xs_row[j].add(g0));
                _mm512_storeu_ps(scale[a][j].as_mut_ptr(), _mm512_mul_ps(wsv, xsv));
            }
        }
        // Adds group g into accumulator c of every row and token.
        let mut group = |g: usize, c: usize| {
            // The group's integer sums, 64 values at a time, as dot_q8_avx512 makes them
            // (exact, so the order within the group does not matter).
            let mut isum = [[zero; N]; R];
            for k in (g * gs..(g + 1) * gs).step_by(64) {
                // The weights ahead, as decode asks for them: with few tokens (a batch of
                // decoding sequences) this product too waits on DRAM without it.
                for w_a in w_row {
                    prefetch_ahead(w_a.wrapping_add(k), usize::MAX);
                }
                let wv: [__m512i; R] =
                    std::array::from_fn(|a| _mm512_loadu_si512(w_row[a].add(k) as *const __m512i));
                // -128 * sum(w) over these 64 weights, per lane, for each row.
                let neg_bias =
                    wv.map(|v| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, v)));
                for j in 0..N {
                    let xv = _mm512_loadu_si512(x_row[j].add(k) as *const __m512i);
                    for a in 0..R {
                        let start = _mm512_add_epi32(isum[a][j], neg_bias[a]);
                        isum[a][j] = _mm512_dpbusd_epi32(start, xv, wv[a]);
                    }
                }
            }
            for a in 0..R {
                for j in 0..N {
                    let sc = _mm512_set1_ps(*scale[a][j].get_unchecked(g - g0));
                    let v = _mm512_cvtepi32_ps(isum[a][j]);
                    acc[a][j][c] = _mm512_fmadd_ps(v, sc, acc[a][j][c]);
                }
            }
        };
        // g0 is a multiple of 16, so even groups go to chain 0 as in decode, and so does an
        // odd last group.
        let mut g = g0;
        while g + 2 <= g0 + m {
            group(g, 0);
            group(g + 1, 1);
            g += 2;
        }
        if g < g0 + m {
            group(g, 0);
        }
        g0 += m;
    }
    for (a, acc_a) in acc.iter().enumerate() {
        for (j, [even, odd]) in acc_a.iter().enumerate() {
            *out.get_unchecked_mut((r + a) * t + i + j) =
                _mm512_reduce_add_ps(_mm512_add_ps(*even, *odd));
        }
    }
}

/// `ws[g] * xs[g]` in every lane. Caller guarantees `g` is in bounds of both.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scale_at(ws: &[f32], xs: &[f32], g: usize) -> __m512 {
    _mm512_set1_ps(*ws.get_unchecked(g) * *xs.get_unchecked(g))
}

/// `sum(w[i] * x[i])` over the `n` values (a multiple of 64) at `w + at` and `x + at`, as 16
/// f32 partial sums. Caller guarantees both ranges are in bounds.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn group_q8_avx512<const REACH: usize>(
    w: *const i8,
    x: *const i8,
    at: usize,
    n: usize,
) -> __m512 {
    let zero = _mm512_setzero_si512();
    let mut isum = _mm512_setzero_si512();
    let mut k = at;
    while k < at + n {
        // Ask for the weights ahead now, so they arrive while this group computes (see
        // PREFETCH_NEAR).
        prefetch_ahead(w.wrapping_add(k), REACH);
        let wv = _mm512_loadu_si512(w.add(k) as *const __m512i);
        let xv = _mm512_loadu_si512(x.add(k) as *const __m512i);
        // vpdpbusd multiplies unsigned by signed bytes: use |w| and negate x where w < 0.
        // Quantized values lie in [-127, 127], so negation never overflows.
        let neg = _mm512_movepi8_mask(wv);
        let x_signed = _mm512_mask_sub_epi8(xv, neg, zero, xv);
        isum = _mm512_dpbusd_epi32(isum, _mm512_abs_epi8(wv), x_signed);
        k += 64;
    }
    _mm512_cvtepi32_ps(isum)
}

/// Same result as `quant::quantize_q8`, bit for bit: the scale is `max|x| / 127`, the quotient
/// `x / scale` is an IEEE division in both, and `vcvtps2dq` rounds to nearest-even under the
/// default MXCSR, like `round_ties_even`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_q8_avx512(x: &[f32], gs: usize, q: &mut [i8], scales: &mut [f32]) {
    if !gs.is_multiple_of(16) {
        return crate::quant::quantize_q8(x, gs, q, scales);
    }
    assert!(x.len().is_multiple_of(gs) && q.len() == x.len() && scales.len() == x.len() / gs);
    for (g, s_out) in scales.iter_mut().enumerate() {
        let base = g * gs;
        let mut m = _mm512_setzero_ps();
        // SAFETY: reads x[k..k+16] with k + 16 <= base + gs <= x.len().
        for k in (base..base + gs).step_by(16) {
            m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x.as_ptr().add(k))));
        }
        let s = _mm512_reduce_max_ps(m) / 127.0;
        *s_out = s;
        if s == 0.0 {
            q[base..base + gs].fill(0);
            continue;
        }
        let sv = _mm512_set1_ps(s);
        for k in (base..base + gs).step_by(16) {
            let v = _mm512_div_ps(_mm512_loadu_ps(x.as_ptr().add(k)), sv);
            let i = _mm512_cvtps_epi32(v);
            // Saturating narrow to i8; |v| <= 127 already, the saturation is a guard.
            // SAFETY: writes q[k..k+16] with k + 16 <= q.len().
            _mm_storeu_si128(
                q.as_mut_ptr().add(k) as *mut __m128i,
                _mm512_cvtsepi32_epi8(i),
            );
        }
    }
}
