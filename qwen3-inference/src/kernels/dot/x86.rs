//! The x86-64 kernels. Each `unsafe fn` with `#[target_feature]` may only run on a CPU that
//! has those features; the safe wrappers in [`AVX2`] / [`AVX512`] are reachable only through
//! `detect()`/`available()`, which hand them out only after `is_x86_feature_detected!` said
//! yes. Slices are read with unaligned loads at indices checked against their lengths.

use super::*;
use std::arch::asm;
use std::arch::x86_64::*;

pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// AVX-VNNI: `vpdpbusd` on 256 bits with a VEX encoding, on CPUs that may lack AVX-512 (Intel's
/// client cores since Alder Lake).
pub fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

pub fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

pub const AVX2: Dots = Dots {
    // SAFETY (all): only handed out after `has_avx2()` returned true.
    f32: |a, b| unsafe { dot_f32_avx2(a, b) },
    bf16: |w, x| unsafe { dot_bf16_avx2(w, x) },
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx2::<0, MADDUBS>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx2::<MADDUBS>(w, ws, x, out, ahead) },
    q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_avx2(w, ws, x, gs) },
    quantize_q8: |x, gs, q, s| unsafe { quantize_q8_avx2(x, gs, q, s) },
    isa: "avx2",
};

/// The AVX2 kernels with AVX-VNNI's `vpdpbusd` for the integer products.
pub const AVX_VNNI: Dots = Dots {
    // SAFETY (both): only handed out after `has_avx_vnni()` returned true, which implies
    // `has_avx2()`.
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx2::<0, VEX_VNNI>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx2::<VEX_VNNI>(w, ws, x, out, ahead) },
    isa: "avx-vnni",
    ..AVX2
};

pub const AVX512: Dots = Dots {
    // SAFETY (all): only handed out after `has_avx512()` returned true; AVX-512F implies
    // AVX2 and FMA on every CPU that has it, and the AVX2 fallbacks inside need nothing more
    // (their EVEX `vpdpbusd` needs AVX512-VNNI and AVX512-VL, which `has_avx512()` checks).
    f32: |a, b| unsafe { dot_f32_avx512(a, b) },
    bf16: |w, x| unsafe { dot_bf16_avx512(w, x) },
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx512::<0>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx512(w, ws, x, out, ahead) },
    q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_avx512(w, ws, x, gs) },
    quantize_q8: |x, gs, q, s| unsafe { quantize_q8_avx512(x, gs, q, s) },
    isa: "avx512-vnni",
};

#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn hmax256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_max_ps(lo, hi);
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
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
unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
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
unsafe fn dot_q8_avx2<const REACH: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    // The default group size is compiled on its own, so that a group's loop unrolls.
    match gs {
        64 => dot_q8_avx2_gs::<REACH, 64, P>(w, ws, x, xs, gs),
        _ if gs.is_multiple_of(32) => dot_q8_avx2_gs::<REACH, 0, P>(w, ws, x, xs, gs),
        _ => dot_q8_scalar(w, ws, x, xs, gs),
    }
}

/// [`dot_q8_avx2`] for a group size of `GS` values, or of `gs` when `GS` is 0; a multiple of 32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_avx2_gs<const REACH: usize, const GS: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    let gs = if GS > 0 { GS } else { gs };
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
unsafe fn scale_at256(ws: &[f32], xs: &[f32], g: usize) -> __m256 {
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
unsafe fn group_q8_avx2<const REACH: usize, const P: u8>(
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
        // See group_q8_avx512: a prefetch never faults, and `wrapping_add` may point past the
        // slice without UB.
        if REACH >= PREFETCH_NEAR {
            _mm_prefetch::<_MM_HINT_T2>(w.wrapping_add(k + PREFETCH_NEAR));
        }
        if REACH >= PREFETCH_FAR {
            _mm_prefetch::<_MM_HINT_T2>(w.wrapping_add(k + PREFETCH_FAR));
        }
        isum = product(product(isum, k), k + 32);
        k += 64;
    }
    if k < at + n {
        isum = product(isum, k);
    }
    isum
}

/// Which instructions the AVX2 kernels multiply bytes with: their const parameter `P`. Each
/// of the three adds to every i32 lane the four products of its neighbouring bytes, unsigned by
/// signed; the sums are the same exact integers. AVX2 alone takes two instructions and an add:
/// `vpmaddubsw` multiplies into i16 pairs, `vpmaddwd` against ones widens them to i32.
const MADDUBS: u8 = 0;
/// `vpdpbusd` with a VEX encoding (AVX-VNNI): one instruction for the three of [`MADDUBS`].
const VEX_VNNI: u8 = 1;
/// `vpdpbusd` on 256 bits with an EVEX encoding (AVX512-VNNI with AVX512-VL): the AVX-512
/// kernel's path for group sizes that are a multiple of 32 but not of 64. It is the AVX-VNNI
/// path with another encoding of the same instruction, so the tests run that path's code on
/// AVX-512 machines, which have no VEX `vpdpbusd`.
const EVEX_VNNI: u8 = 2;

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
unsafe fn dot4<const P: u8>(isum: __m256i, u: __m256i, s: __m256i) -> __m256i {
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

/// [`MatQ8`] on AVX2, for groups of a multiple of 32 values (others take the scalar product).
///
/// Decode (`t = 1`) runs [`dot_q8_avx2`] row by row, prefetching as [`mat_q8_avx512`] does.
/// Prefill is tiled: `R` weight rows against `N` tokens at a time ([`tile_q8_avx2`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn mat_q8_avx2<const P: u8>(
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
    super::for_each_tile(rows, t, TILE_R_AVX2, TILE_N_AVX2, |m, n, r, i| {
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
const TILE_R_AVX2: usize = 2;
const TILE_N_AVX2: usize = 4;

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`, on
/// AVX2: each weight vector and its absolute value are loaded and made once for `N` tokens,
/// each activation vector loaded once for `R` rows. Per 32 weights and token: the sign
/// fix-up and the byte products ([`dot4`]; see [`group_q8_avx2`]).
///
/// Caller guarantees rows `r..r+R` and tokens `i..i+N` exist, that `x.check` passed and that
/// the group size is a multiple of 32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_q8_avx2<const R: usize, const N: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    // The default group size is compiled on its own, so that a group's loop unrolls.
    if x.group_size == 64 {
        tile_q8_avx2_gs::<R, N, 64, P>(w, ws, x, out, r, i)
    } else {
        tile_q8_avx2_gs::<R, N, 0, P>(w, ws, x, out, r, i)
    }
}

/// [`tile_q8_avx2`] for a group size of `GS` values, or of the activations' when `GS` is 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_q8_avx2_gs<const R: usize, const N: usize, const GS: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let (t, cols, per) = (x.t, x.cols, x.per());
    let gs = if GS > 0 { GS } else { x.group_size };
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
                    _mm_prefetch::<_MM_HINT_T2>(w_a.wrapping_add(k + PREFETCH_NEAR));
                    _mm_prefetch::<_MM_HINT_T2>(w_a.wrapping_add(k + PREFETCH_FAR));
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
unsafe fn dot_q8_f32_avx2(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
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

/// Groups of a multiple of 16 values; others take the AVX2 path.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_q8_f32_avx512(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
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
unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
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

#[target_feature(enable = "avx512f")]
unsafe fn dot_bf16_avx512(w: &[u16], x: &[f32]) -> f32 {
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

/// Groups of a multiple of 64 values use VNNI; multiples of 32 the AVX2 kernel; others scalar.
/// Prefetches the weights up to `REACH` bytes past the one it reads (see [`PREFETCH_NEAR`]): 0,
/// [`PREFETCH_NEAR`] or [`PREFETCH_FAR`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn dot_q8_avx512<const REACH: usize>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
    gs: usize,
) -> f32 {
    if !gs.is_multiple_of(64) {
        return dot_q8_avx2::<0, EVEX_VNNI>(w, ws, x, xs, gs);
    }
    let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    // Two accumulators, alternating between groups, so consecutive groups' multiply-adds do
    // not wait on each other (one chain is bound by the FMA latency, about 4 cycles a group:
    // decode measured 4-5% slower with one). tile_q8 adds in the same order,
    // so decode and prefill give the same bits.
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
/// accumulators plus temporaries exceed the 32 vector registers, and the compiler spills.)
///
/// Decode prefetches the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes ahead of the row
/// it reads, within `w` and the `ahead` bytes after it (see [`MatQ8`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn mat_q8_avx512(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32], ahead: usize) {
    let rows = x.check(w, ws, out);
    let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
    if !gs.is_multiple_of(64) {
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
    super::for_each_tile(rows, t, 2, 4, |m, n, r, i| {
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
unsafe fn tile_q8<const R: usize, const N: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    // The default group size is compiled on its own, so that a group's loop unrolls.
    if x.group_size == 64 {
        tile_q8_gs::<R, N, 64>(w, ws, x, out, r, i)
    } else {
        tile_q8_gs::<R, N, 0>(w, ws, x, out, r, i)
    }
}

/// [`tile_q8`] for a group size of `GS` values, or of `x.group_size` when `GS` is 0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn tile_q8_gs<const R: usize, const N: usize, const GS: usize>(
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
    // this kernel did 75-78 GMAC/s, with two 85-86 (`cargo bench`).
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
                    _mm_prefetch::<_MM_HINT_T2>(w_a.wrapping_add(k + PREFETCH_NEAR));
                    _mm_prefetch::<_MM_HINT_T2>(w_a.wrapping_add(k + PREFETCH_FAR));
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

/// How far ahead of the weight byte it reads the decode kernel asks for the weights, twice:
/// [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes on, both with `prefetcht2` (into the outer
/// caches). Decode reads each weight once, so it waits on DRAM unless loads are in flight well
/// ahead of use, and the hardware prefetcher alone keeps too few in flight for a loop that also
/// computes (one thread on a 256 MB matrix: 21-23 GB/s with an 8 KiB prefetch against 17-18
/// without).
///
/// Measured on the classifier of the 0.6B shape, two threads, variants alternated call by call
/// (performance.md): against one `prefetcht0` 8 KiB on, this form streamed
/// 1.06-1.09 times as fast when the machine's memory was fast (probe above 45 GB/s) and
/// 0.99-1.01 times otherwise; no prefetch at all 0.77 and 0.92; `prefetchnta` 8 KiB 1.02 and
/// 1.01; other pairs of distances (8+24, 8+48, 16+32, 16+48, 24+48 KiB) within 0.01-0.02 of
/// this one. On one thread, whole decode steps took 0.93-0.97 times as long with this form as
/// with the single `prefetcht0`.
///
/// The prefetches stop at the end of the rows this thread reads next (the `ahead` of
/// [`MatQ8`]): past it, the lines belong to another thread, which has already read them, and
/// each is a wasted read of DRAM. Unbounded, the far prefetch made a two-thread decode step
/// 1.5% slower (it costs up to 40 KiB at each of the ~400 ends of a thread's rows in a step);
/// bounded, the step took 0.94 times as long in fast moments and 1.00 otherwise.
const PREFETCH_NEAR: usize = 8192;

/// See [`PREFETCH_NEAR`].
const PREFETCH_FAR: usize = 32768;

/// `ws[g] * xs[g]` in every lane. Caller guarantees `g` is in bounds of both.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scale_at(ws: &[f32], xs: &[f32], g: usize) -> __m512 {
    _mm512_set1_ps(*ws.get_unchecked(g) * *xs.get_unchecked(g))
}

/// `sum(w[i] * x[i])` over the `n` values (a multiple of 64) at `w + at` and `x + at`, as 16
/// f32 partial sums. Caller guarantees both ranges are in bounds.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group_q8_avx512<const REACH: usize>(
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
        // PREFETCH_NEAR). A prefetch never faults and has no effect on the program's meaning,
        // and `wrapping_add` may point past the slice without UB.
        if REACH >= PREFETCH_NEAR {
            _mm_prefetch::<_MM_HINT_T2>(w.wrapping_add(k + PREFETCH_NEAR));
        }
        if REACH >= PREFETCH_FAR {
            _mm_prefetch::<_MM_HINT_T2>(w.wrapping_add(k + PREFETCH_FAR));
        }
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
unsafe fn quantize_q8_avx512(x: &[f32], gs: usize, q: &mut [i8], scales: &mut [f32]) {
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

/// [`quantize_q8_avx512`] on AVX2, the same bits as `quant::quantize_q8` by the same argument.
/// (Without it the reference's `round_ties_even` is a call to libm's `rintf` per value, as
/// x86-64's baseline has no rounding instruction: 6% of a one-thread prefill on AVX2.)
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_q8_avx2(x: &[f32], gs: usize, q: &mut [i8], scales: &mut [f32]) {
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
