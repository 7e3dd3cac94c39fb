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
/// A block of weight rows against a batch of activation rows: `out[r * t + i]` is
/// [`DotQ8`] of weight row `r` (`w: [rows, cols]`, `ws: [rows, cols / gs]`) with token `i` of
/// `x`. Prefill calls it with every token of the prompt chunk, so each block of weights is read
/// from memory once and reused from cache for all of them.
pub type MatQ8 = fn(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]);

/// `t` activation rows of `cols` values, quantized per group of `group_size` for the q8 kernels
/// (the same rule as the weights, `quant.rs`).
pub struct ActsQ8<'a> {
    pub t: usize,
    pub cols: usize,
    pub group_size: usize,
    /// `[t, cols]`: the int8 values.
    pub q: &'a [i8],
    /// `[t, cols]`: the same values plus 128, as unsigned bytes (`q as u8 ^ 0x80`). `vpdpbusd`
    /// multiplies unsigned by signed bytes; this form lets the AVX-512 prefill kernel use it
    /// without per-token sign fix-ups (see `mat_q8_avx512`).
    pub biased: &'a [u8],
    /// `[t, cols / group_size]`
    pub scales: &'a [f32],
}

impl ActsQ8<'_> {
    fn per(&self) -> usize {
        self.cols / self.group_size
    }
    fn q_row(&self, i: usize) -> &[i8] {
        &self.q[i * self.cols..(i + 1) * self.cols]
    }
    fn scales_row(&self, i: usize) -> &[f32] {
        &self.scales[i * self.per()..(i + 1) * self.per()]
    }
    /// Panics unless every slice has the length the sizes say (a caller's bug, not bad input).
    fn check(&self, w: &[i8], ws: &[f32], out: &[f32]) -> usize {
        let (t, cols, gs) = (self.t, self.cols, self.group_size);
        assert!(
            gs > 0 && cols > 0 && cols.is_multiple_of(gs),
            "q8: bad group size"
        );
        let rows = w.len() / cols;
        assert!(
            w.len() == rows * cols
                && ws.len() == rows * (cols / gs)
                && out.len() == rows * t
                && self.q.len() == t * cols
                && self.biased.len() == t * cols
                && self.scales.len() == t * (cols / gs),
            "q8: slice lengths do not match [{rows}, {cols}] x [{t}, {cols}]"
        );
        rows
    }
}
/// Quantizes `x` per group into `q` and `scales` (same rule as [`crate::quant::quantize_q8`]).
pub type QuantizeQ8 = fn(x: &[f32], group_size: usize, q: &mut [i8], scales: &mut [f32]);

/// The dot products chosen for this CPU.
#[derive(Clone, Copy)]
pub struct Dots {
    pub f32: DotF32,
    pub bf16: DotBf16,
    pub q8: DotQ8,
    pub q8_rows: MatQ8,
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
    q8_rows: mat_q8_scalar,
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

pub fn mat_q8_scalar(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]) {
    mat_q8_with(dot_q8_scalar, w, ws, x, out)
}

/// [`MatQ8`] as one [`DotQ8`] per (row, token) pair.
fn mat_q8_with(dot: DotQ8, w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]) {
    x.check(w, ws, out);
    let (cols, per, t) = (x.cols, x.per(), x.t);
    for (r, out_r) in out.chunks_exact_mut(t).enumerate() {
        let (w_r, ws_r) = (&w[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
        for (i, o) in out_r.iter_mut().enumerate() {
            *o = dot(w_r, ws_r, x.q_row(i), x.scales_row(i), x.group_size);
        }
    }
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
        q8_rows: |w, ws, x, out| {
            mat_q8_with(
                |w, ws, x, xs, gs| unsafe { dot_q8_avx2(w, ws, x, xs, gs) },
                w,
                ws,
                x,
                out,
            )
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
        q8_rows: |w, ws, x, out| unsafe { mat_q8_avx512(w, ws, x, out) },
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

    /// [`MatQ8`] on AVX-512 VNNI, for groups of a multiple of 64 values (others take one
    /// [`DotQ8`] per pair).
    ///
    /// Decode (`t = 1`) runs [`dot_q8_avx512`] row by row: it is bound by memory, not arithmetic.
    /// Prefill is bound by arithmetic, so it is tiled: two weight rows against four tokens at a
    /// time ([`tile_q8`]), each weight vector loaded once for four tokens and each activation
    /// vector once for two rows. (Two rows by eight tokens measured slower: its sixteen
    /// accumulators plus temporaries exceed the 32 vector registers, and the compiler spills.)
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    unsafe fn mat_q8_avx512(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]) {
        let rows = x.check(w, ws, out);
        let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
        if !gs.is_multiple_of(64) {
            return mat_q8_with(
                // SAFETY: this CPU has AVX-512F, hence AVX2 and FMA (see `AVX512`).
                |w, ws, x, xs, gs| dot_q8_avx2(w, ws, x, xs, gs),
                w,
                ws,
                x,
                out,
            );
        }
        if t == 1 {
            for (r, o) in out.iter_mut().enumerate() {
                *o = dot_q8_avx512(
                    &w[r * cols..(r + 1) * cols],
                    &ws[r * per..(r + 1) * per],
                    x.q,
                    x.scales,
                    gs,
                );
            }
            return;
        }
        let mut i = 0;
        while i < t {
            let n = if t - i >= 4 { 4 } else { 1 };
            let mut r = 0;
            while r < rows {
                let m = if rows - r >= 2 { 2 } else { 1 };
                // SAFETY: rows r..r+m and tokens i..i+n are in range (m <= rows - r,
                // n <= t - i), and `check` proved every slice has the length of its shape.
                match (m, n) {
                    (2, 4) => tile_q8::<2, 4>(w, ws, x, out, r, i),
                    (2, _) => tile_q8::<2, 1>(w, ws, x, out, r, i),
                    (_, 4) => tile_q8::<1, 4>(w, ws, x, out, r, i),
                    _ => tile_q8::<1, 1>(w, ws, x, out, r, i),
                }
                r += m;
            }
            i += n;
        }
    }

    /// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
    ///
    /// The integer product of a group uses the biased activations `x + 128` (unsigned, as
    /// `vpdpbusd` wants its first operand) and removes the bias afterwards:
    /// `sum(x * w) = sum((x + 128) * w) - 128 * sum(w)`. The correction `128 * sum(w)` depends on
    /// the weights only, so it is computed once per group (one more `vpdpbusd`, against a vector
    /// of 128s) and shared by all `N` tokens; each token then costs one `vpdpbusd`, one
    /// conversion and one multiply-add per 64 weights. The sums are exact integers, so the result
    /// equals [`dot_q8_scalar`] up to the order of the f32 additions.
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
        let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
        let zero = _mm512_setzero_si512();
        let bias = _mm512_set1_epi8(-128i8); // 0x80: 128 as an unsigned byte
        let w_row: [*const i8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols));
        let ws_row: [*const f32; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
        let x_row: [*const u8; N] = std::array::from_fn(|j| x.biased.as_ptr().add((i + j) * cols));
        let xs_row: [*const f32; N] = std::array::from_fn(|j| x.scales.as_ptr().add((i + j) * per));
        let mut acc = [[_mm512_setzero_ps(); N]; R];
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
            for g in g0..g0 + m {
                // A group of more than 64 values is taken 64 at a time, each part scaled by the
                // group's scale: the same sum, as the integer parts convert to f32 exactly.
                for k in (g * gs..(g + 1) * gs).step_by(64) {
                    let wv: [__m512i; R] = std::array::from_fn(|a| {
                        _mm512_loadu_si512(w_row[a].add(k) as *const __m512i)
                    });
                    // -128 * sum(w) over these 64 weights, per lane, for each row.
                    let neg_bias =
                        wv.map(|v| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, v)));
                    for j in 0..N {
                        let xv = _mm512_loadu_si512(x_row[j].add(k) as *const __m512i);
                        for a in 0..R {
                            let isum = _mm512_dpbusd_epi32(neg_bias[a], xv, wv[a]);
                            let sc = _mm512_set1_ps(*scale[a][j].get_unchecked(g - g0));
                            acc[a][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[a][j]);
                        }
                    }
                }
            }
            g0 += m;
        }
        for (a, acc_a) in acc.iter().enumerate() {
            for (j, &acc_aj) in acc_a.iter().enumerate() {
                *out.get_unchecked_mut((r + a) * t + i + j) = _mm512_reduce_add_ps(acc_aj);
            }
        }
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

    /// The block kernel against one scalar dot product per (row, token), over shapes that take
    /// every tile of the AVX-512 kernel (2 or 1 rows; 8, 4 or 1 tokens) and group sizes with one
    /// and several 64-byte chunks, and ones it does not handle itself (16, 32).
    #[test]
    fn q8_rows_matches_scalar_dots() {
        let mut seed = 7;
        for d in available() {
            for gs in [16, 32, 64, 128] {
                for (rows, t, groups) in [
                    (1, 1, 3),
                    (3, 2, 1),
                    (2, 5, 17),
                    (5, 8, 2),
                    (3, 13, 20),
                    (4, 20, 16),
                ] {
                    let cols = gs * groups;
                    let w = rand_vec(rows * cols, &mut seed, 1.0);
                    let x = rand_vec(t * cols, &mut seed, 3.0);
                    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                    crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                    let (mut xq, mut xs) = (vec![0i8; x.len()], vec![0f32; x.len() / gs]);
                    crate::quant::quantize_q8(&x, gs, &mut xq, &mut xs);
                    let biased: Vec<u8> = xq.iter().map(|&v| v as u8 ^ 0x80).collect();
                    let acts = ActsQ8 {
                        t,
                        cols,
                        group_size: gs,
                        q: &xq,
                        biased: &biased,
                        scales: &xs,
                    };
                    let mut out = vec![f32::NAN; rows * t];
                    (d.q8_rows)(&wq, &ws, &acts, &mut out);
                    let per = cols / gs;
                    for r in 0..rows {
                        for i in 0..t {
                            let want = dot_q8_scalar(
                                &wq[r * cols..(r + 1) * cols],
                                &ws[r * per..(r + 1) * per],
                                &xq[i * cols..(i + 1) * cols],
                                &xs[i * per..(i + 1) * per],
                                gs,
                            );
                            let got = out[r * t + i];
                            assert!(
                                close(got, want, groups, 3.0 * gs as f32),
                                "{} q8_rows gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) {got} vs {want}",
                                d.isa
                            );
                        }
                    }
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
