//! The aarch64 kernels: NEON (Advanced SIMD, part of every ARMv8-A CPU) and, for the integer
//! product, the `sdot` instruction of the ARMv8.2 dot-product extension (`dotprod`: Cortex-A55,
//! A75, A76 and later, Neoverse N1 and later, Apple M1 and later). Each `unsafe fn` with
//! `#[target_feature]` may only run on a CPU that has those features; the safe wrappers in
//! [`NEON`] / [`NEON_DOTPROD`] are reachable only through `detect()`/`available()`, which hand
//! them out only after `is_aarch64_feature_detected!` said yes. Slices are read with `vld1q_*`
//! (which needs only the element type's alignment, which a slice has) at indices checked against
//! their lengths.
//!
//! `vdotq_s32`, the intrinsic for `sdot`, is still unstable in Rust (`stdarch_neon_dotprod`,
//! rust-lang/rust#117224), so [`sdot`] emits the one instruction with `asm!`, which is stable.

use super::*;
use std::arch::aarch64::*;
use std::arch::asm;

pub fn has_neon() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

pub fn has_dotprod() -> bool {
    has_neon() && std::arch::is_aarch64_feature_detected!("dotprod")
}

fn mat_q8_neon(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32], _ahead: usize) {
    mat_q8_with(
        // SAFETY: only reached through `NEON`, handed out after `has_neon()` returned true.
        |w, ws, x, xs, gs| unsafe { dot_q8_neon(w, ws, x, xs, gs) },
        w,
        ws,
        x,
        out,
    )
}

pub const NEON: Dots = Dots {
    // SAFETY (all): only handed out after `has_neon()` returned true.
    f32: |a, b| unsafe { dot_f32_neon(a, b) },
    bf16: |w, x| unsafe { dot_bf16_neon(w, x) },
    bf16_rows: |w, x, t, out| {
        super::bf16_rows_by_dot(|w, x| unsafe { dot_bf16_neon(w, x) }, w, x, t, out)
    },
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_neon(w, ws, x, xs, gs) },
    q8_rows: mat_q8_neon,
    q8_interleaved: None,
    q8_rows_lay_out: None,
    q4_rows: super::q4::mat_q4_scalar,
    q6_rows: super::q6::mat_q6_scalar,
    q4_layout: super::q4::Q4Layout::Halves,
    k_rows: |kind, w, x, out, _| super::k_quants::mat_k_scalar(kind, w, x, out),
    k_interleaved: None,
    q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_neon(w, ws, x, gs) },
    quantize_q8: |x, gs, q, s| unsafe { quantize_q8_neon(x, gs, q, s) },
    isa: "neon",
    lanes: crate::kernels::VectorIsa::Baseline,
};

/// [`NEON`] with the integer product on `sdot`; the float kernels are the same.
pub const NEON_DOTPROD: Dots = Dots {
    // SAFETY: only handed out after `has_dotprod()` returned true, which includes NEON.
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_dotprod(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, _| unsafe { mat_q8_dotprod(w, ws, x, out) },
    q4_rows: |w, ws, x, out, _| unsafe { mat_q4_dotprod::<false>(w, ws, x, out) },
    q6_rows: |w, ws, x, out, _| unsafe { mat_q4_dotprod::<true>(w, ws, x, out) },
    q4_layout: super::q4::Q4Layout::Halves,
    isa: "neon-dotprod",
    ..NEON
};

#[target_feature(enable = "neon")]
unsafe fn dot_f32_neon(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // Four accumulators: one chain of `fmla` would wait on its own latency (about 4 cycles)
    // every 4 values; four keep the two FMA pipes of a big core busy.
    let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let (mut acc2, mut acc3) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    // SAFETY: every load reads [i, i+16) with i + 16 <= n.
    while i + 16 <= n {
        acc0 = vfmaq_f32(acc0, vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
        acc1 = vfmaq_f32(acc1, vld1q_f32(pa.add(i + 4)), vld1q_f32(pb.add(i + 4)));
        acc2 = vfmaq_f32(acc2, vld1q_f32(pa.add(i + 8)), vld1q_f32(pb.add(i + 8)));
        acc3 = vfmaq_f32(acc3, vld1q_f32(pa.add(i + 12)), vld1q_f32(pb.add(i + 12)));
        i += 16;
    }
    let acc = vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3));
    vaddvq_f32(acc) + dot_f32_scalar(&a[i..n], &b[i..n])
}

#[target_feature(enable = "neon")]
unsafe fn dot_bf16_neon(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    // SAFETY: reads w[i..i+8] (16 bytes) and x[i..i+8] with i + 8 <= n.
    while i + 8 <= n {
        let b = vld1q_u16(w.as_ptr().add(i));
        // bf16 -> f32 is a 16-bit left shift into a 32-bit lane (`shll`, `shll2`).
        let lo = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(b)));
        let hi = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(b));
        acc0 = vfmaq_f32(acc0, lo, vld1q_f32(x.as_ptr().add(i)));
        acc1 = vfmaq_f32(acc1, hi, vld1q_f32(x.as_ptr().add(i + 4)));
        i += 8;
    }
    vaddvq_f32(vaddq_f32(acc0, acc1)) + dot_bf16_scalar(&w[i..n], &x[i..n])
}

/// Groups of a multiple of 16 values; other group sizes take the scalar path.
///
/// Without `sdot`, 16 byte products are two widening multiplies (`smull`, `smull2`: 8 x i16
/// each; |product| <= 128 * 128 = 2^14 fits) and two pairwise widening adds into 4 x i32
/// (`sadalp`). Any i8 values are summed exactly, like the scalar kernel.
#[target_feature(enable = "neon")]
unsafe fn dot_q8_neon(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    if !gs.is_multiple_of(16) {
        return dot_q8_scalar(w, ws, x, xs, gs);
    }
    let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
    let mut acc = vdupq_n_f32(0.0);
    for g in 0..groups {
        let (mut isum0, mut isum1) = (vdupq_n_s32(0), vdupq_n_s32(0));
        let mut k = g * gs;
        // SAFETY: reads [k, k+16) of w and x with k + 16 <= (g+1)*gs <= len.
        while k < (g + 1) * gs {
            let wv = vld1q_s8(w.as_ptr().add(k));
            let xv = vld1q_s8(x.as_ptr().add(k));
            isum0 = vpadalq_s16(isum0, vmull_s8(vget_low_s8(wv), vget_low_s8(xv)));
            isum1 = vpadalq_s16(isum1, vmull_high_s8(wv, xv));
            k += 16;
        }
        // Each lane holds a sum of gs / 4 products: |sum| <= gs / 4 * 2^14, exact in i32, and
        // in f32 too up to gs = 4096 (2^24).
        let isum = vcvtq_f32_s32(vaddq_s32(isum0, isum1));
        acc = vfmaq_n_f32(acc, isum, ws[g] * xs[g]);
    }
    vaddvq_f32(acc)
}

/// `acc[l] += sum_{j < 4} a[4l + j] * b[4l + j]` over signed bytes: one `sdot` instruction.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` only reads and writes these three vector registers (no memory, no flags,
    // no stack), and the caller's `dotprod` target feature guarantees the CPU has it.
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// Groups of a multiple of 16 values use `sdot` (16 byte products per instruction, summed
/// exactly into 4 x i32); others take the scalar path.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_q8_dotprod(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    if !gs.is_multiple_of(16) {
        return dot_q8_scalar(w, ws, x, xs, gs);
    }
    let groups = ws.len().min(xs.len()).min(w.len() / gs).min(x.len() / gs);
    let mut acc = vdupq_n_f32(0.0);
    for g in 0..groups {
        // Each group starts fresh integer sums, so the `sdot` chains of consecutive groups are
        // independent and the core overlaps them.
        let mut isum = vdupq_n_s32(0);
        let mut k = g * gs;
        // SAFETY: reads [k, k+16) of w and x with k + 16 <= (g+1)*gs <= len.
        while k < (g + 1) * gs {
            isum = sdot(
                isum,
                vld1q_s8(w.as_ptr().add(k)),
                vld1q_s8(x.as_ptr().add(k)),
            );
            k += 16;
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), ws[g] * xs[g]);
    }
    vaddvq_f32(acc)
}

/// [`MatQ8`] with `sdot`, for groups of a multiple of 16 values (others take one scalar
/// [`DotQ8`] per pair).
///
/// Decode (`t = 1`) runs [`dot_q8_dotprod`] row by row: it is bound by memory. Prefill is bound
/// by arithmetic, so it is tiled like the AVX-512 kernel (`mat_q8_avx512` in x86/avx512.rs): two weight
/// rows against four tokens at a time ([`tile_q8_dotprod`]), each 16-byte weight vector loaded
/// once for four tokens and each activation vector once for two rows, 6 loads for 8 `sdot`s
/// where one dot product per pair needs 16. (Its 8 integer sums, 8 float sums and 3 operands fit
/// the 32 vector registers. The tiling is chosen from the instruction counts; it has not been
/// timed on ARM hardware, see docs/performance.md.)
#[target_feature(enable = "neon,dotprod")]
unsafe fn mat_q8_dotprod(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]) {
    let rows = x.check(w, ws, out);
    let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
    if !gs.is_multiple_of(16) {
        return mat_q8_with(dot_q8_scalar, w, ws, x, out);
    }
    if t == 1 {
        for (r, o) in out.iter_mut().enumerate() {
            *o = dot_q8_dotprod(
                &w[r * cols..(r + 1) * cols],
                &ws[r * per..(r + 1) * per],
                x.q,
                x.scales,
                gs,
            );
        }
        return;
    }
    super::for_each_tile(rows, t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so),
        // and `check` proved every slice has the length of its shape.
        match (m, n) {
            (2, 4) => tile_q8_dotprod::<2, 4>(w, ws, x, out, r, i),
            (2, 3) => tile_q8_dotprod::<2, 3>(w, ws, x, out, r, i),
            (2, 2) => tile_q8_dotprod::<2, 2>(w, ws, x, out, r, i),
            (2, _) => tile_q8_dotprod::<2, 1>(w, ws, x, out, r, i),
            (_, 4) => tile_q8_dotprod::<1, 4>(w, ws, x, out, r, i),
            (_, 3) => tile_q8_dotprod::<1, 3>(w, ws, x, out, r, i),
            (_, 2) => tile_q8_dotprod::<1, 2>(w, ws, x, out, r, i),
            _ => tile_q8_dotprod::<1, 1>(w, ws, x, out, r, i),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`:
/// per group, the exact integer sums of `sdot`, then one conversion and one multiply-add by
/// `ws[r + a, g] * xs[i + j, g]`, the same operations in the same order as [`dot_q8_dotprod`].
///
/// Caller guarantees rows `r..r+R` and tokens `i..i+N` exist, that `x.check` passed and that
/// the group size is a multiple of 16.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_q8_dotprod<const R: usize, const N: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let (t, cols, gs, per) = (x.t, x.cols, x.group_size, x.per());
    // Row starts: every read below is at offset k + 16 <= cols from one of them.
    let w_row: [*const i8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * cols));
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q.as_ptr().add((i + j) * cols));
    let mut acc = [[vdupq_n_f32(0.0); N]; R];
    for g in 0..per {
        let mut isum = [[vdupq_n_s32(0); N]; R];
        for k in (g * gs..(g + 1) * gs).step_by(16) {
            let wv: [int8x16_t; R] = w_row.map(|p| vld1q_s8(p.add(k)));
            // Plain loops, not closures, around `sdot`: a closure does not inherit this
            // function's `dotprod` feature, so the call in it would not be inlined.
            for j in 0..N {
                let xv = vld1q_s8(x_row[j].add(k));
                for a in 0..R {
                    isum[a][j] = sdot(isum[a][j], wv[a], xv);
                }
            }
        }
        for a in 0..R {
            let w_scale = ws[(r + a) * per + g];
            for j in 0..N {
                let scale = w_scale * x.scales[(i + j) * per + g];
                acc[a][j] = vfmaq_n_f32(acc[a][j], vcvtq_f32_s32(isum[a][j]), scale);
            }
        }
    }
    for (a, acc_a) in acc.iter().enumerate() {
        for (j, &acc_aj) in acc_a.iter().enumerate() {
            out[(r + a) * t + i + j] = vaddvq_f32(acc_aj);
        }
    }
}

/// [`super::MatQ4`] with `sdot`, for groups of 32 (others take the reference), reading the
/// activations in the layout `q4.rs` describes (`Q4Layout::Halves`): a chunk of 64 packed
/// bytes in four quarters of 16, one group each, whose low and high nibbles `sdot` multiplies
/// by the group's two halves of activations into 4 lanes, starting from the lanes' correction
/// for the `+ 8`. Tiles of two
/// rows by four tokens, as the q8 kernel's; decode is the 1-token tile, so prefill and decode
/// give the same bits. With `SIX`, q6 weights: a chunk is 96 bytes, the 64 nibble bytes and 32
/// high bytes whose pairs of bits go above the nibbles, and the correction counts four times
/// (`q6.rs`).
#[target_feature(enable = "neon,dotprod")]
unsafe fn mat_q4_dotprod<const SIX: bool>(w: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32]) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.chunks == 0 {
        return q6::reference_either::<SIX>(w, ws, x, out, 0);
    }
    assert_eq!(
        x.q4.layout,
        q4::Q4Layout::Halves,
        "the NEON q4 kernel reads Q4Layout::Halves"
    );
    super::for_each_tile(rows, x.t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so),
        // `q6::check_either` proved every slice has the length of its shape, and the layout is
        // Halves (asserted above: 16 lanes a chunk, as the tile reads).
        match (m, n) {
            (2, 4) => tile_q4_dotprod::<2, 4, SIX>(w, ws, x, out, r, i),
            (2, 3) => tile_q4_dotprod::<2, 3, SIX>(w, ws, x, out, r, i),
            (2, 2) => tile_q4_dotprod::<2, 2, SIX>(w, ws, x, out, r, i),
            (2, _) => tile_q4_dotprod::<2, 1, SIX>(w, ws, x, out, r, i),
            (_, 4) => tile_q4_dotprod::<1, 4, SIX>(w, ws, x, out, r, i),
            (_, 3) => tile_q4_dotprod::<1, 3, SIX>(w, ws, x, out, r, i),
            (_, 2) => tile_q4_dotprod::<1, 2, SIX>(w, ws, x, out, r, i),
            _ => tile_q4_dotprod::<1, 1, SIX>(w, ws, x, out, r, i),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
/// Caller guarantees the rows and tokens exist, that `q6::check_either::<SIX>` passed, that
/// `x.q4.chunks > 0` and that the layout is `Q4Layout::Halves` (16 lanes of corrections and
/// scales a chunk).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_q4_dotprod<const R: usize, const N: usize, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * q4::LANES,
    );
    let chunk_bytes = q6::row_bytes::<SIX>(q4::CHUNK);
    let w_row: [*const u8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * row_bytes));
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols));
    let corr_row: [*const i32; N] =
        std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * lanes));
    let xs_row: [*const f32; N] =
        std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * lanes));
    let (nibble, bits_4_5) = (vdupq_n_u8(15), vdupq_n_u8(0x30));
    let mut acc = [[vdupq_n_f32(0.0); N]; R];
    for c in 0..chunks {
        for quarter in 0..4 {
            let g = 4 * c + quarter;
            let (wb, xb, lb) = (
                chunk_bytes * c + 16 * quarter,
                q4::CHUNK * c + 16 * quarter,
                16 * c + 4 * quarter,
            );
            let wv: [uint8x16_t; R] = w_row.map(|p| vld1q_u8(p.add(wb)));
            let mut lo = wv.map(|v| vandq_u8(v, nibble));
            let mut hi = wv.map(|v| vshrq_n_u8::<4>(v));
            if SIX {
                // Quarters 0 and 1 find their high pairs at bits 0-1 and 2-3 of the high bytes
                // 0..16 and 16..32, quarters 2 and 3 at bits 4-5 and 6-7 of the same bytes.
                for a in 0..R {
                    let h = vld1q_u8(w_row[a].add(chunk_bytes * c + 64 + 16 * (quarter % 2)));
                    let (h_lo, h_hi) = match quarter < 2 {
                        true => (vshlq_n_u8::<4>(h), vshlq_n_u8::<2>(h)),
                        false => (h, vshrq_n_u8::<2>(h)),
                    };
                    lo[a] = vorrq_u8(lo[a], vandq_u8(h_lo, bits_4_5));
                    hi[a] = vorrq_u8(hi[a], vandq_u8(h_hi, bits_4_5));
                }
            }
            // Weights are 0..=63, so as signed bytes they are the same values.
            let lo = lo.map(|v| vreinterpretq_s8_u8(v));
            let hi = hi.map(|v| vreinterpretq_s8_u8(v));
            let d: [f32; R] =
                std::array::from_fn(|a| half::f16::from_bits(ws[(r + a) * per + g]).to_f32());
            // Plain loops, not closures, around `sdot` (see tile_q8_dotprod).
            for j in 0..N {
                let x_lo = vld1q_s8(x_row[j].add(xb));
                let x_hi = vld1q_s8(x_row[j].add(xb + 64));
                let corr = vld1q_s32(corr_row[j].add(lb));
                // q6 weights are q + 32, four times q4's offset of 8.
                let corr = if SIX { vshlq_n_s32::<2>(corr) } else { corr };
                let xs = vld1q_f32(xs_row[j].add(lb));
                for a in 0..R {
                    let isum = sdot(sdot(corr, lo[a], x_lo), hi[a], x_hi);
                    let v = vmulq_f32(vcvtq_f32_s32(isum), xs);
                    acc[a][j] = vfmaq_n_f32(acc[a][j], v, d[a]);
                }
            }
        }
    }
    for a in 0..R {
        let (w_r, ws_r) = (
            &w[(r + a) * row_bytes..(r + a + 1) * row_bytes],
            &ws[(r + a) * per..(r + a + 1) * per],
        );
        for j in 0..N {
            let tail =
                q6::tail_either::<SIX>(w_r, ws_r, x.q_row(i + j), x.scales_row(i + j), chunks);
            out[(r + a) * t + i + j] = vaddvq_f32(acc[a][j]) + tail;
        }
    }
}

/// Groups of a multiple of 16 values; others take the scalar path.
#[target_feature(enable = "neon")]
unsafe fn dot_q8_f32_neon(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
    if !gs.is_multiple_of(16) {
        return dot_q8_f32_scalar(w, ws, x, gs);
    }
    let groups = ws.len().min(w.len() / gs).min(x.len() / gs);
    let mut acc = vdupq_n_f32(0.0);
    for (g, &scale) in ws.iter().enumerate().take(groups) {
        let (mut part0, mut part1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut k = g * gs;
        // SAFETY: reads w[k..k+16] (16 bytes) and x[k..k+16] with k + 16 <= (g+1)*gs <= len.
        while k < (g + 1) * gs {
            // i8 -> i16 -> i32 -> f32, four lanes at a time (exact: |w| <= 128).
            let wv = vld1q_s8(w.as_ptr().add(k));
            let (lo, hi) = (vmovl_s8(vget_low_s8(wv)), vmovl_high_s8(wv));
            let px = x.as_ptr().add(k);
            let f = |v: int32x4_t| vcvtq_f32_s32(v);
            part0 = vfmaq_f32(part0, f(vmovl_s16(vget_low_s16(lo))), vld1q_f32(px));
            part1 = vfmaq_f32(part1, f(vmovl_high_s16(lo)), vld1q_f32(px.add(4)));
            part0 = vfmaq_f32(part0, f(vmovl_s16(vget_low_s16(hi))), vld1q_f32(px.add(8)));
            part1 = vfmaq_f32(part1, f(vmovl_high_s16(hi)), vld1q_f32(px.add(12)));
            k += 16;
        }
        acc = vfmaq_n_f32(acc, vaddq_f32(part0, part1), scale);
    }
    vaddvq_f32(acc)
}

/// Same result as `quant::quantize_q8`, bit for bit, for groups of a multiple of 8 values
/// (others take the scalar path):
/// - the maximum is exact in any order; `fmaxnm` ignores a quiet NaN like `f32::max` (which
///   LLVM lowers to the same instruction on aarch64);
/// - the scale `max / 127` and the quotient `x / scale` are IEEE divisions in both;
/// - `fcvtns` rounds to nearest, ties to even, like `round_ties_even`, and gives 0 for NaN,
///   like the scalar `NaN as i8`;
/// - the clamp to [-127, 127] is the scalar one; the narrowing after it is exact.
#[target_feature(enable = "neon")]
unsafe fn quantize_q8_neon(x: &[f32], gs: usize, q: &mut [i8], scales: &mut [f32]) {
    if !gs.is_multiple_of(8) {
        return crate::quant::quantize_q8(x, gs, q, scales);
    }
    assert!(x.len().is_multiple_of(gs) && q.len() == x.len() && scales.len() == x.len() / gs);
    let (lo, hi) = (vdupq_n_s32(-127), vdupq_n_s32(127));
    for (g, s_out) in scales.iter_mut().enumerate() {
        let base = g * gs;
        let mut m = vdupq_n_f32(0.0);
        // SAFETY: reads x[k..k+4] with k + 4 <= base + gs <= x.len().
        for k in (base..base + gs).step_by(4) {
            m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x.as_ptr().add(k))));
        }
        let s = vmaxnmvq_f32(m) / 127.0;
        *s_out = s;
        if s == 0.0 {
            q[base..base + gs].fill(0);
            continue;
        }
        let sv = vdupq_n_f32(s);
        let to_i32 =
            |v: float32x4_t| vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vdivq_f32(v, sv)), lo), hi);
        for k in (base..base + gs).step_by(8) {
            // SAFETY: reads x[k..k+8] and writes q[k..k+8] with k + 8 <= base + gs <= len.
            let a = to_i32(vld1q_f32(x.as_ptr().add(k)));
            let b = to_i32(vld1q_f32(x.as_ptr().add(k + 4)));
            let q8 = vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
            vst1_s8(q.as_mut_ptr().add(k), q8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Says which versions the other tests compare with the scalar ones on this CPU (run with
    /// `--nocapture` to see it). `QWEN3_EXPECT_DOTPROD=1` (or `0`), set by
    /// scripts/check_aarch64.sh for each emulated CPU, makes sure the `sdot` kernel really was
    /// (or was not) among them.
    #[test]
    fn available_has_the_neon_versions() {
        let isas: Vec<&str> = available().iter().map(|d| d.isa).collect();
        println!("dot kernels on this CPU: {isas:?}; chosen: {}", dots().isa);
        assert!(isas.contains(&"neon"), "{isas:?}");
        assert_eq!(isas.contains(&"neon-dotprod"), has_dotprod(), "{isas:?}");
        match std::env::var("QWEN3_EXPECT_DOTPROD").as_deref() {
            Ok("1") => assert!(has_dotprod(), "expected a CPU with dotprod: {isas:?}"),
            Ok("0") => assert!(!has_dotprod(), "expected a CPU without dotprod: {isas:?}"),
            _ => {}
        }
    }

    /// The random vectors of `every_isa_matches_scalar` never hit the edge cases of the
    /// quantizer: all-zero groups, signed zeros, NaN, infinities, subnormals, exact ties
    /// (x / s = k + 0.5). Each must give the scalar result bit for bit.
    #[test]
    fn neon_quantize_matches_scalar_on_special_values() {
        assert!(has_neon(), "NEON is part of every aarch64 CPU");
        let tiny = f32::from_bits(1); // the smallest subnormal
        let groups: [[f32; 8]; 8] = [
            [0.0; 8],
            [-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0],
            [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5],
            [f32::NAN, 1.0, -2.0, 3.0, 0.0, 5.0, -6.0, 7.0],
            [f32::INFINITY, 1.0, -2.0, 3.0, 0.0, 5.0, -6.0, 7.0],
            [
                f32::NEG_INFINITY,
                f32::INFINITY,
                1.0,
                0.0,
                -1.0,
                2.0,
                3.0,
                4.0,
            ],
            [
                tiny,
                -tiny,
                0.0,
                tiny * 3.0,
                tiny * 100.0,
                -tiny * 127.0,
                tiny,
                0.0,
            ],
            [f32::MAX, -f32::MAX, 1e30, -1e-30, 0.0, 3e38, -2e38, 1.0],
        ];
        let x: Vec<f32> = groups.iter().flatten().copied().collect();
        for gs in [8, 16, 64] {
            let (mut qn, mut sn) = (vec![0i8; x.len()], vec![0f32; x.len() / gs]);
            let (mut qr, mut sr) = (vec![0i8; x.len()], vec![0f32; x.len() / gs]);
            (NEON.quantize_q8)(&x, gs, &mut qn, &mut sn);
            crate::quant::quantize_q8(&x, gs, &mut qr, &mut sr);
            assert_eq!(qn, qr, "gs={gs}");
            let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sn), bits(&sr), "gs={gs}");
        }
    }

    /// Extreme i8 values (-128 included, which the quantizer never makes) are summed exactly.
    #[test]
    fn q8_kernels_are_exact_on_extreme_bytes() {
        let n = 256;
        let w: Vec<i8> = (0..n)
            .map(|i| if i % 3 == 0 { -128 } else { 127 })
            .collect();
        let x: Vec<i8> = (0..n)
            .map(|i| if i % 5 == 0 { 127 } else { -128 })
            .collect();
        let (ws, xs) = (vec![1.0f32; n / 64], vec![1.0f32; n / 64]);
        let want = dot_q8_scalar(&w, &ws, &x, &xs, 64);
        let mut tested = 0;
        for d in available().iter().filter(|d| d.isa.starts_with("neon")) {
            assert_eq!((d.q8)(&w, &ws, &x, &xs, 64), want, "{}", d.isa);
            tested += 1;
        }
        assert!(tested >= 1);
    }
}
