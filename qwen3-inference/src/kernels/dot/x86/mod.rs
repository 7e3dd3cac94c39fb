//! The x86-64 kernels. Each `unsafe fn` with `#[target_feature]` may only run on a CPU that
//! has those features; the safe wrappers in [`AVX2`] / [`AVX512`] are reachable only through
//! `detect()`/`available()`, which hand them out only after `is_x86_feature_detected!` said
//! yes. Slices are read with unaligned loads at indices checked against their lengths.
//!
//! One file per instruction set: `avx2.rs` (AVX2 and FMA, with AVX-VNNI's `vpdpbusd` as an
//! option) and `avx512.rs` (AVX-512 F, BW, VL and VNNI), each tested against the scalar
//! kernels of `dot/mod.rs`; `q4.rs`, AVX2's q4 and q6 kernels, and `interleaved.rs`, AVX-512's
//! (on the weights in the order `dot/interleaved.rs` describes), tested against `dot/q4.rs` and
//! `dot/q6.rs`, and its q8 ones on interleaved weights; `q8_pairs.rs`, AVX-512's q8 products
//! for groups of 32 (two groups a vector) in the file's order; `q8_lanes_avx2.rs`, AVX2's for
//! groups of 32 and 64 (eight groups a vector); `k_quants.rs`, every family's product of GGUF's K-quant blocks, tested against
//! `dot/k_quants.rs`, and `k_interleaved.rs`, AVX-512's on Q4_K and Q6_K blocks in the
//! interleaved order (`dot/k_interleaved.rs`), and `k_rows8.rs`, AVX2's on them eight rows side
//! by side (the same file's `KOrder::Rows8`), tested against the same.

mod avx2;
mod avx512;
mod interleaved;
mod k_interleaved;
mod k_quants;
mod k_rows8;
mod q4;
mod q8_lanes_avx2;
mod q8_pairs;

use super::k_interleaved::KOrder;
use super::Dots;
use avx2::*;
use avx512::*;
use interleaved::*;
use k_interleaved::*;
use k_quants::*;
use k_rows8::*;
use q4::*;
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T2};

/// AVX2 and FMA, and F16C for the q4 kernels' f16 scales (every CPU with AVX2 has it).
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-VNNI: `vpdpbusd` on 256 bits with a VEX encoding, on CPUs that may lack AVX-512 (Intel's
/// client cores since Alder Lake).
pub fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

/// AVX-512 F, BW, VL and VNNI, with F16C and FMA (which every such CPU has; `vectorized!`'s
/// fused kernels use it).
pub fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma")
}

pub const AVX2: Dots = Dots {
    // SAFETY (all): only handed out after `has_avx2()` returned true.
    f32: |a, b| unsafe { dot_f32_avx2(a, b) },
    bf16: |w, x| unsafe { dot_bf16_avx2(w, x) },
    bf16_rows: |w, x, t, out| {
        super::bf16_rows_by_dot(|w, x| unsafe { dot_bf16_avx2(w, x) }, w, x, t, out)
    },
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx2::<0, MADDUBS>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx2::<MADDUBS>(w, ws, x, out, ahead) },
    q8_interleaved: None,
    q8_rows_lay_out: Some(q8_lanes_avx2::reorder_from),
    q4_rows: |w, ws, x, out, ahead| unsafe { mat_q4_avx2::<MADDUBS, false>(w, ws, x, out, ahead) },
    q6_rows: |w, ws, x, out, ahead| unsafe { mat_q4_avx2::<MADDUBS, true>(w, ws, x, out, ahead) },
    q4_layout: super::q4::Q4Layout::Pairs,
    k_rows: |kind, w, x, out, ahead| unsafe { mat_k_avx2(kind, w, x, out, ahead) },
    k_interleaved: Some((KOrder::Rows8, |kind, w, x, out, ahead| unsafe {
        mat_k_rows8_avx2(kind, w, x, out, ahead)
    })),
    q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_avx2(w, ws, x, gs) },
    quantize_q8: |x, gs, q, s| unsafe { quantize_q8_avx2(x, gs, q, s) },
    isa: "avx2",
    // `has_avx2()` checked AVX2 (with FMA and F16C): the lane kernels' AVX2 wrappers need AVX2.
    lanes: crate::kernels::VectorIsa::Avx2,
};

/// The AVX2 kernels with AVX-VNNI's `vpdpbusd` for the integer products.
pub const AVX_VNNI: Dots = Dots {
    // SAFETY (all): only handed out after `has_avx_vnni()` returned true, which implies
    // `has_avx2()`.
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx2::<0, VEX_VNNI>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx2::<VEX_VNNI>(w, ws, x, out, ahead) },
    q4_rows: |w, ws, x, out, ahead| unsafe { mat_q4_avx2::<VEX_VNNI, false>(w, ws, x, out, ahead) },
    q6_rows: |w, ws, x, out, ahead| unsafe { mat_q4_avx2::<VEX_VNNI, true>(w, ws, x, out, ahead) },
    q4_layout: super::q4::Q4Layout::Pairs,
    isa: "avx-vnni",
    ..AVX2
};

pub const AVX512: Dots = Dots {
    // SAFETY (all): only handed out after `has_avx512()` returned true; AVX-512F implies
    // AVX2 and FMA on every CPU that has it, and the AVX2 fallbacks inside need nothing more
    // (their EVEX `vpdpbusd` needs AVX512-VNNI and AVX512-VL, which `has_avx512()` checks).
    f32: |a, b| unsafe { dot_f32_avx512(a, b) },
    bf16: |w, x| unsafe { dot_bf16_avx512(w, x) },
    bf16_rows: |w, x, t, out| unsafe { mat_bf16_avx512(w, x, t, out) },
    q8: |w, ws, x, xs, gs| unsafe { dot_q8_avx512::<0>(w, ws, x, xs, gs) },
    q8_rows: |w, ws, x, out, ahead| unsafe { mat_q8_avx512(w, ws, x, out, ahead) },
    q8_interleaved: Some(|w, ws, x, out, ahead| unsafe {
        mat_q8_interleaved_avx512(w, ws, x, out, ahead)
    }),
    q8_rows_lay_out: None,
    q4_rows: |w, ws, x, out, ahead| unsafe {
        mat_interleaved_avx512::<false>(w, ws, x, out, ahead)
    },
    q6_rows: |w, ws, x, out, ahead| unsafe { mat_interleaved_avx512::<true>(w, ws, x, out, ahead) },
    q4_layout: super::q4::Q4Layout::Interleaved,
    k_rows: |kind, w, x, out, ahead| unsafe { mat_k_avx512(kind, w, x, out, ahead) },
    k_interleaved: Some((KOrder::Groups, |kind, w, x, out, ahead| unsafe {
        mat_k_interleaved_avx512(kind, w, x, out, ahead)
    })),
    q8_f32: |w, ws, x, gs| unsafe { dot_q8_f32_avx512(w, ws, x, gs) },
    quantize_q8: |x, gs, q, s| unsafe { quantize_q8_avx512(x, gs, q, s) },
    isa: "avx512-vnni",
    // `has_avx512()` checked AVX-512 F (with BW, VL, VNNI): the lane wrappers need F.
    lanes: crate::kernels::VectorIsa::Avx512,
};

/// How far ahead of the weight byte it reads the decode kernel asks for the weights, twice:
/// [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes on, both with `prefetcht2` (into the outer
/// caches). Decode reads each weight once, so it waits on DRAM unless loads are in flight well
/// ahead of use, and the hardware prefetcher alone keeps too few in flight for a loop that also
/// computes: without a prefetch, one thread streams a large matrix markedly slower.
///
/// Against a single `prefetcht0` 8 KiB on, this form streams faster when the machine's memory is
/// fast and as fast when it is slow, where the memory is the limit whatever the kernel does;
/// `prefetchnta` and other pairs of distances were no better, and whole one-thread decode steps
/// are shorter with this form (measured: docs/performance.md, "Decode: software prefetch").
///
/// The prefetches stop at the end of the rows this thread reads next (the `ahead` of
/// [`MatQ8`]): past it, the lines belong to another thread, which has already read them, and
/// each is a wasted read of DRAM. Unbounded, the far prefetch made a two-thread decode step
/// slower (it costs up to 40 KiB at each of the ~400 ends of a thread's rows in a step); bounded,
/// the step is faster in fast moments and no slower otherwise (same section).
pub(super) const PREFETCH_NEAR: usize = 8192;

/// See [`PREFETCH_NEAR`].
pub(super) const PREFETCH_FAR: usize = 32768;

/// Asks for the weights [`PREFETCH_NEAR`] and [`PREFETCH_FAR`] bytes past `p` (`prefetcht2`),
/// each only where `reach`, the bytes this thread may still read from `p` on, covers it: 0,
/// [`PREFETCH_NEAR`] or [`PREFETCH_FAR`] (a constant in decode's kernels, so the branches fold
/// away), or `usize::MAX` for both.
#[inline(always)]
pub(super) fn prefetch_ahead(p: *const i8, reach: usize) {
    // SAFETY: `prefetcht2` needs only SSE (x86-64's baseline), never faults and has no effect
    // on the program's meaning; `wrapping_add` may point past the allocation without UB.
    unsafe {
        if reach >= PREFETCH_NEAR {
            _mm_prefetch::<_MM_HINT_T2>(p.wrapping_add(PREFETCH_NEAR));
        }
        if reach >= PREFETCH_FAR {
            _mm_prefetch::<_MM_HINT_T2>(p.wrapping_add(PREFETCH_FAR));
        }
    }
}
