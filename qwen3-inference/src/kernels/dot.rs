//! Dot products, the innermost loop of every matrix product, in SIMD with run-time dispatch.
//!
//! Decoding a token reads every weight once and does one multiply-add per weight, so the speed of
//! these few functions is the speed of the runtime. Each has a scalar version, which is the
//! reference (and the fallback on CPUs without the instructions), and x86-64 versions for AVX2+FMA
//! and AVX-512 (with VNNI for the integer product). The best version is chosen once, at first use,
//! with `is_x86_feature_detected!`; after that a call is one indirect jump through [`Dots`].
//! (aarch64 runs the scalar versions, which LLVM auto-vectorizes partly; a NEON `sdot` kernel is
//! future work.)
//!
//! The q8 x q8 product (W8A8): the activation vector is quantized per group exactly like the
//! weights (`quant.rs`), so each group's contribution is `scale_w * scale_x * sum(q_w * q_x)`, an
//! integer sum of 8-bit products that AVX-512 VNNI computes 64 at a time (`vpdpbusd`).

use std::sync::OnceLock;

/// `sum(a[i] * b[i])` over f32.
pub type DotF32 = fn(a: &[f32], b: &[f32]) -> f32;
/// `sum(bf16(w[i]) * x[i])`, `w` as raw bf16 bit patterns.
pub type DotBf16 = fn(w: &[u16], x: &[f32]) -> f32;
/// `sum_g ws[g] * xs[g] * sum_{i in g} w[i] * x[i]` over groups of `group_size`.
pub type DotQ8 = fn(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], group_size: usize) -> f32;
/// `sum_g ws[g] * sum_{i in g} w[i] * x[i]`: int8 weights with per-group scales against f32
/// activations (W8A32), exactly the dequantized weights' product up to f32 rounding.
pub type DotQ8F32 = fn(w: &[i8], ws: &[f32], x: &[f32], group_size: usize) -> f32;
/// [`DotQ8`] of one weight row against four activation rows at once (prefill): the weight bytes
/// are loaded, and their signs handled, once for the four products.
pub type DotQ8x4 =
    fn(w: &[i8], ws: &[f32], x: [&[i8]; 4], xs: [&[f32]; 4], group_size: usize) -> [f32; 4];
/// Quantizes `x` per group into `q` and `scales` (same rule as [`crate::quant::quantize_q8`]).
pub type QuantizeQ8 = fn(x: &[f32], group_size: usize, q: &mut [i8], scales: &mut [f32]);

/// The dot products chosen for this CPU.
#[derive(Clone, Copy)]
pub struct Dots {
    pub f32: DotF32,
    pub bf16: DotBf16,
    pub q8: DotQ8,
    pub q8x4: DotQ8x4,
    pub q8_f32: DotQ8F32,
    pub quantize_q8: QuantizeQ8,
    /// Which instruction set was picked, for `--verbose` and the bench report.
    pub isa: &'static str,
}

/// The scalar reference versions.
pub const SCALAR: Dots = Dots {
    f32: dot_f32_scalar,
    bf16: dot_bf16_scalar,
    q8: dot_q8_scalar,
    q8x4: dot_q8x4_scalar,
    q8_f32: dot_q8_f32_scalar,
    quantize_q8: crate::quant::quantize_q8,
    isa: "scalar",
};

/// The fastest versions this CPU supports, detected once.
pub fn dots() -> &'static Dots {
    static DOTS: OnceLock<Dots> = OnceLock::new();
    DOTS.get_or_init(detect)
}

fn detect() -> Dots {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx512() {
            return x86::AVX512;
        }
        if x86::has_avx2() {
            return x86::AVX2;
        }
    }
    SCALAR
}

/// Every version available on this CPU (the scalar one first), for tests and benchmarks.
pub fn available() -> Vec<Dots> {
    let mut v = vec![SCALAR];
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx2() {
            v.push(x86::AVX2);
        }
        if x86::has_avx512() {
            v.push(x86::AVX512);
        }
    }
    v
}

pub fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// bf16 is the upper half of an f32, so widening is a 16-bit shift.
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

pub fn dot_bf16_scalar(w: &[u16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(&b, &v)| bf16_to_f32(b) * v).sum()
}

pub fn dot_q8_scalar(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(gs).zip(x.chunks_exact(gs)).enumerate() {
        let isum: i32 = wg.iter().zip(xg).map(|(&a, &b)| a as i32 * b as i32).sum();
        sum += isum as f32 * (ws[g] * xs[g]);
    }
    sum
}

pub fn dot_q8x4_scalar(
    w: &[i8],
    ws: &[f32],
    x: [&[i8]; 4],
    xs: [&[f32]; 4],
    gs: usize,
) -> [f32; 4] {
    [0, 1, 2, 3].map(|j| dot_q8_scalar(w, ws, x[j], xs[j], gs))
}

pub fn dot_q8_f32_scalar(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(gs).zip(x.chunks_exact(gs)).enumerate() {
        let part: f32 = wg.iter().zip(xg).map(|(&a, &b)| a as f32 * b).sum();
        sum += ws[g] * part;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86-64 kernels. Each `unsafe fn` with `#[target_feature]` may only run on a CPU that
    //! has those features; the safe wrappers in [`AVX2`] / [`AVX512`] are reachable only through
    //! `detect()`/`available()`, which hand them out only after `is_x86_feature_detected!` said
    //! yes. Slices are read with unaligned loads at indices checked against their lengths.
    use super::*;
    use std::arch::x86_64::*;

    pub fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    pub fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }

    pub const AVX2: Dots = Dots {
        // SAFETY (all four): only handed out after `has_avx2()` returned true.
        f32: |a, b| unsafe { dot_f32_avx2(a, b) },
        bf16: |w, x| unsafe { dot_bf16_avx2(w, x) },
        q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx2(w, ws, x, xs, gs) },
        q8x4: |w, ws, x, xs, gs| {
            [0, 1, 2, 3].map(|j| unsafe { dot_q8_avx2(w, ws, x[j], xs[j], gs) })
        },
        q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_avx2(w, ws, x, gs) },
        quantize_q8: crate::quant::quantize_q8,
        isa: "avx2",
    };

    pub const AVX512: Dots = Dots {
        // SAFETY (all four): only handed out after `has_avx512()` returned true; AVX-512F implies
        // AVX2 and FMA on every CPU that has it, and the AVX2 fallbacks inside check nothing more.
        f32: |a, b| unsafe { dot_f32_avx512(a, b) },
        bf16: |w, x| unsafe { dot_bf16_avx512(w, x) },
        q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx512(w, ws, x, xs, gs) },
        q8x4: |w, ws, x, xs, gs| unsafe { dot_q8x4_avx512(w, ws, x, xs, gs) },
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

    /// Groups of a multiple of 32 values; other group sizes take the scalar path.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_q8_avx2(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
        if !gs.is_multiple_of(32) {
            return dot_q8_scalar(w, ws, x, xs, gs);
        }
        let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for g in 0..groups {
            let mut isum = _mm256_setzero_si256();
            let mut k = g * gs;
            // SAFETY: reads [k, k+32) of w and x with k + 32 <= (g+1)*gs <= len.
            while k < (g + 1) * gs {
                let wv = _mm256_loadu_si256(w.as_ptr().add(k) as *const __m256i);
                let xv = _mm256_loadu_si256(x.as_ptr().add(k) as *const __m256i);
                // maddubs multiplies unsigned by signed bytes: move w's sign onto x.
                // |w| * (sign(w) x) = w x; pairs sum to at most 2*127*127 < 2^15, no saturation.
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, ones));
                k += 32;
            }
            let scale = _mm256_set1_ps(ws[g] * xs[g]);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
        }
        hsum256(acc)
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    unsafe fn dot_q8_avx512(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
        if !gs.is_multiple_of(64) {
            return dot_q8_avx2(w, ws, x, xs, gs);
        }
        let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        // Two accumulators, alternating between groups, so consecutive groups' multiply-adds do
        // not wait on each other (one chain is bound by the FMA latency, about 4 cycles a group).
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut g = 0;
        // SAFETY: group_at(g) reads w and x at [g*gs, (g+1)*gs) and ws[g], xs[g], for
        // g < groups, and `groups` is at most each slice's length in groups.
        while g + 2 <= groups {
            acc0 = _mm512_fmadd_ps(
                group_q8_avx512(wp, xp, g * gs, gs),
                scale_at(ws, xs, g),
                acc0,
            );
            let h = g + 1;
            acc1 = _mm512_fmadd_ps(
                group_q8_avx512(wp, xp, h * gs, gs),
                scale_at(ws, xs, h),
                acc1,
            );
            g += 2;
        }
        if g < groups {
            acc0 = _mm512_fmadd_ps(
                group_q8_avx512(wp, xp, g * gs, gs),
                scale_at(ws, xs, g),
                acc0,
            );
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// Four activation rows against one weight row; groups of a multiple of 64 values (others
    /// take four single products).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    unsafe fn dot_q8x4_avx512(
        w: &[i8],
        ws: &[f32],
        x: [&[i8]; 4],
        xs: [&[f32]; 4],
        gs: usize,
    ) -> [f32; 4] {
        if !gs.is_multiple_of(64) {
            return [0, 1, 2, 3].map(|j| dot_q8_avx512(w, ws, x[j], xs[j], gs));
        }
        let mut groups = ws.len().min(w.len() / gs);
        for j in 0..4 {
            groups = groups.min(xs[j].len()).min(x[j].len() / gs);
        }
        let zero = _mm512_setzero_si512();
        let xp = x.map(|r| r.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        for g in 0..groups {
            let mut isum = [_mm512_setzero_si512(); 4];
            let mut k = g * gs;
            // SAFETY: reads [k, k+64) of w and of each x[j], k + 64 <= (g+1)*gs <= every length;
            // ws[g] and xs[j][g] are in bounds since g < groups.
            while k < (g + 1) * gs {
                let wv = _mm512_loadu_si512(w.as_ptr().add(k) as *const __m512i);
                let neg = _mm512_movepi8_mask(wv);
                let wa = _mm512_abs_epi8(wv);
                for j in 0..4 {
                    let xv = _mm512_loadu_si512(xp[j].add(k) as *const __m512i);
                    let x_signed = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                    isum[j] = _mm512_dpbusd_epi32(isum[j], wa, x_signed);
                }
                k += 64;
            }
            let wsg = *ws.get_unchecked(g);
            for j in 0..4 {
                let scale = _mm512_set1_ps(wsg * *xs[j].get_unchecked(g));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), scale, acc[j]);
            }
        }
        acc.map(|a| _mm512_reduce_add_ps(a))
    }

    /// How far ahead of the current weight byte the decode kernel prefetches. Decode reads each
    /// weight once, so it waits on DRAM unless loads are in flight well ahead of use: the
    /// hardware prefetcher alone keeps too few in flight for a loop that also computes. 8 KiB
    /// (128 cache lines) was the best of 1, 4, 8, 16 and 32 KiB in a one-thread benchmark on a
    /// 256 MB matrix (AMD EPYC, AVX-512): 21-23 GB/s against 17-18 without.
    const PREFETCH_AHEAD: usize = 8192;

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
    unsafe fn group_q8_avx512(w: *const i8, x: *const i8, at: usize, n: usize) -> __m512 {
        let zero = _mm512_setzero_si512();
        let mut isum = _mm512_setzero_si512();
        let mut k = at;
        while k < at + n {
            // Ask for the weights PREFETCH_AHEAD bytes on now, so they arrive while this group
            // computes (see PREFETCH_AHEAD). A prefetch never faults and has no effect on the
            // program's meaning, and `wrapping_add` may point past the slice without UB.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(k + PREFETCH_AHEAD));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Relative agreement with the scalar reference: different summation orders of n products of
    /// magnitude m differ by about n * eps * m, so compare against that scale, not exactly.
    fn close(a: f32, b: f32, n: usize, mag: f32) -> bool {
        (a - b).abs() <= 4.0 * n as f32 * f32::EPSILON * mag + 1e-6
    }

    #[test]
    fn every_isa_matches_scalar() {
        let mut seed = 42;
        for d in available() {
            for n in [0, 1, 7, 16, 31, 64, 100, 1024, 3072] {
                let a = rand_vec(n, &mut seed, 2.0);
                let b = rand_vec(n, &mut seed, 3.0);
                let (r, s) = ((d.f32)(&a, &b), dot_f32_scalar(&a, &b));
                assert!(close(r, s, n, 6.0), "{} f32 n={n}: {r} vs {s}", d.isa);
                let w: Vec<u16> = a.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                let (r, s) = ((d.bf16)(&w, &b), dot_bf16_scalar(&w, &b));
                assert!(close(r, s, n, 6.0), "{} bf16 n={n}: {r} vs {s}", d.isa);
            }
            for gs in [16, 32, 64, 128] {
                for groups in [1, 3, 16] {
                    let n = gs * groups;
                    let a = rand_vec(n, &mut seed, 1.5);
                    let b = rand_vec(n, &mut seed, 4.0);
                    let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; groups]);
                    let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; groups]);
                    crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
                    (d.quantize_q8)(&b, gs, &mut qb, &mut sb);
                    // The SIMD quantizer must equal the reference bit for bit.
                    let (mut qr, mut sr) = (vec![0i8; n], vec![0f32; groups]);
                    crate::quant::quantize_q8(&b, gs, &mut qr, &mut sr);
                    assert_eq!(qb, qr, "{} quantize gs={gs}", d.isa);
                    assert_eq!(sb, sr, "{} quantize scales gs={gs}", d.isa);
                    let (r, s) = (
                        (d.q8_f32)(&qa, &sa, &b, gs),
                        dot_q8_f32_scalar(&qa, &sa, &b, gs),
                    );
                    assert!(close(r, s, n, 6.0), "{} q8_f32 gs={gs}: {r} vs {s}", d.isa);
                    let four = (d.q8x4)(&qa, &sa, [&qb, &qa, &qb, &qa], [&sb, &sa, &sb, &sa], gs);
                    for (j, (xq, xs)) in [(&qb, &sb), (&qa, &sa), (&qb, &sb), (&qa, &sa)]
                        .into_iter()
                        .enumerate()
                    {
                        let s = dot_q8_scalar(&qa, &sa, xq, xs, gs);
                        assert!(
                            close(four[j], s, groups, 6.0 * gs as f32),
                            "{} q8x4 gs={gs} row {j}: {} vs {s}",
                            d.isa,
                            four[j]
                        );
                    }
                    let r = (d.q8)(&qa, &sa, &qb, &sb, gs);
                    let s = dot_q8_scalar(&qa, &sa, &qb, &sb, gs);
                    assert!(
                        close(r, s, groups, 6.0 * gs as f32),
                        "{} q8 gs={gs}: {r} vs {s}",
                        d.isa
                    );
                }
            }
        }
    }

    #[test]
    fn q8_product_approximates_the_float_product() {
        // W8A8 error: each factor is within half a step of the truth, so the product of a group
        // is off by at most about (|w| * step_x + |x| * step_w) / 2 per element.
        let mut seed = 9;
        let (n, gs) = (1024, 64);
        let a = rand_vec(n, &mut seed, 1.0);
        let b = rand_vec(n, &mut seed, 1.0);
        let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; n / gs]);
        let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; n / gs]);
        crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
        crate::quant::quantize_q8(&b, gs, &mut qb, &mut sb);
        let exact: f32 = dot_f32_scalar(&a, &b);
        let approx = (dots().q8)(&qa, &sa, &qb, &sb, gs);
        let bound = n as f32 * (1.0 / 127.0);
        assert!((exact - approx).abs() < bound, "{exact} vs {approx}");
    }
}
