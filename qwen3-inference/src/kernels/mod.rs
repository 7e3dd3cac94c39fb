//! The numerical kernels of the forward pass on the CPU, parallel over output rows (or attention
//! heads) with rayon. [`crate::backend::CpuBackend`] is a thin layer over these functions; a GPU
//! backend implements the same operations with its own kernels (see `backend/mod.rs`).
//!
//! | op | shapes |
//! |---|---|
//! | [`embedding`] | one row of `[vocab, hidden]` -> `[hidden]` |
//! | [`matmul`], [`matmuls`] | `x: [t, cols]`, `w: [rows, cols]` -> `[t, rows]` (several `w` at once) |
//! | [`rmsnorm`] | rows of `[n, dim]`, weight `[dim]` |
//! | [`rope`] | rows of `[n, head_dim]` at given positions |
//! | [`attention`] | queries `[t, n_heads, head_dim]` over the KV cache |
//! | [`frame_attention`] | every row of `[n, heads * head_dim]` over every row (the vision tower's) |
//! | [`layer_norm`] | rows of `[n, dim]`, weight and bias `[dim]` (the vision tower's) |
//! | [`silu_mul`], [`gelu_tanh`], [`add`] | elementwise |
//!
//! The innermost loops, the dot products, are in [`dot`]: scalar references plus SIMD versions
//! chosen once at run time. The functions here keep their signatures whatever [`dot`] picks.
//! [`exp`] is the softmax's exponential, written so that loops over it vectorize; `lanes.rs` sums
//! in independent lanes for the same reason. The elementwise steps are plain loops compiled once
//! per instruction set by `vectorized!` (below), which runs the version of the chosen kernel
//! family ([`vector_isa`]).

/// Defines a kernel whose body is compiled once per instruction set and run in the version of
/// the chosen kernel family ([`vector_isa`]), for the small elementwise steps (RMSNorm, RoPE, SwiGLU,
/// the residual add) whose plain loops the compiler vectorizes. Decode runs these steps on the
/// calling thread while the other threads wait for it, so their time counts twice, and at the
/// target's baseline (SSE2) it showed (measured: docs/performance.md, "Smaller steps").
///
/// The body becomes an `#[inline(always)]` function, inlined into one wrapper per instruction set
/// compiled with that set enabled, so its loops take that width. Rust never fuses a multiply and
/// an add on its own, and sums written in lanes (`lanes.rs`) add in a fixed order, so every
/// version gives the same bits (`every_isa_gives_the_same_bits` below).
///
/// A kernel that is mostly multiply-adds (the tower's attention) is written `fused<F>`: see
/// that arm.
macro_rules! vectorized {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512($($arg: $ty),*) {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            unsafe fn avx2($($arg: $ty),*) {
                body($($arg),*)
            }
            match $crate::kernels::vector_isa() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only chosen when the CPU has AVX-512F.
                $crate::kernels::VectorIsa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only chosen when the CPU has AVX2.
                $crate::kernels::VectorIsa::Avx2 => unsafe { avx2($($arg),*) },
                $crate::kernels::VectorIsa::Baseline => body($($arg),*),
            }
        }
    };
    // `fused<F>`: the body takes a `const F: bool`, true where the instruction set multiplies and
    // adds in one rounding (AVX2's family checks for FMA, AVX-512 F includes it, NEON has it), so
    // its products may use [`madd`]. SSE2 has no such instruction (`f32::mul_add` there is a
    // library call), so the baseline x86 version multiplies, then adds: its bits differ from the
    // others' by the rounding of each product.
    (fused<$f:ident> $(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        vectorized! { fused<$f, _W> $(#[$attr])* $vis fn $name($($arg: $ty),*) $body }
    };
    // `fused<F, W>`: also a `const W: bool`, true in the AVX-512 version only, for a body whose
    // wider blocks only that version's 32 registers of 16 values hold (frame_attention.rs): with
    // `if W`, the other versions leave those blocks out of the binary.
    (fused<$f:ident, $w:ident> $(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body<const $f: bool, const $w: bool>($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,fma")]
            unsafe fn avx512($($arg: $ty),*) {
                body::<true, true>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) {
                body::<true, false>($($arg),*)
            }
            match $crate::kernels::vector_isa() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only chosen when the CPU has AVX-512F and FMA (`dot/x86/mod.rs`'s
                // `has_avx512`).
                $crate::kernels::VectorIsa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only chosen when the CPU has AVX2 and FMA (`has_avx2`).
                $crate::kernels::VectorIsa::Avx2 => unsafe { avx2($($arg),*) },
                $crate::kernels::VectorIsa::Baseline => {
                    body::<{ $crate::kernels::BASELINE_FUSES }, false>($($arg),*)
                }
            }
        }
    };
}

/// Whether the target's baseline has a fused multiply-add: aarch64's does (`fmadd`, `fmla`),
/// x86-64's SSE2 does not.
pub(crate) const BASELINE_FUSES: bool = cfg!(target_arch = "aarch64");

/// `a * b + c`, rounded once where `FUSED` (the instruction sets of `vectorized!`'s `fused`
/// kernels), else rounded after the product and after the sum.
#[inline(always)]
pub(crate) fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}
pub mod attention;
pub mod bandwidth;
pub mod delta_net;
pub mod delta_net_fast;
pub mod delta_rule;
pub mod dot;
mod elementwise;
mod embedding;
pub mod exp;
mod frame_attention;
pub(crate) mod lanes;
mod layer_norm;
mod matmul;
mod rmsnorm;
mod rope;
pub(crate) mod team;
pub mod textbook;
mod tile;
mod transpose;

pub use attention::{attention, AttentionShape, KvType};
pub use elementwise::{add, gelu_tanh, silu_mul};
pub use embedding::embedding;
pub use frame_attention::{frame_attention, FrameScratch};
pub use layer_norm::layer_norm;
pub use matmul::{matmul, matmuls};
pub use rmsnorm::rmsnorm;
pub use rope::{mrope_component, rope, rope_mrope, RopeTable};

/// The vectors the plain-Rust kernels written in lanes use (attention's body, the sampler's
/// passes, the elementwise steps of `vectorized!`). Each such kernel has one wrapper per variant,
/// compiled with that instruction set enabled, and picks the wrapper from this.
///
/// There is one detection of what the CPU has: the dot kernels' ([`dot::dots`], which also obeys
/// `QWEN3_KERNELS`). Each dot family says which variant goes with it ([`dot::Dots::lanes`]), set
/// beside its detection, so forcing a family forces every kernel, and a variant's instructions are
/// always among those its family was checked for. A CPU with AVX-512 F but no VNNI gets the
/// `avx2` family, and so AVX2 lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VectorIsa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// SSE2 or NEON, what the target always has.
    Baseline,
}

impl VectorIsa {
    /// Every variant, widest first (for tests that run each).
    #[cfg(test)]
    const ALL: &[VectorIsa] = &[
        #[cfg(target_arch = "x86_64")]
        VectorIsa::Avx512,
        #[cfg(target_arch = "x86_64")]
        VectorIsa::Avx2,
        VectorIsa::Baseline,
    ];

    /// Whether this CPU has a dot-kernel family of this variant (for a test's forced choice).
    #[cfg(test)]
    fn supported(self) -> bool {
        dot::available().iter().any(|d| d.lanes == self)
    }
}

/// The [`VectorIsa`] of the chosen dot-kernel family. The wrappers' `unsafe` calls rely on it:
/// it never names a variant the CPU lacks (a test's forced choice included).
pub(crate) fn vector_isa() -> VectorIsa {
    #[cfg(test)]
    if let Some(isa) = tests::FORCED_ISA.get() {
        assert!(isa.supported(), "{isa:?} is not supported here");
        return isa;
    }
    dot::dots().lanes
}

/// Threads the kernels split work over (rayon's pool; set `RAYON_NUM_THREADS` to change it).
/// Decode uses no more of them than the cores the process may run on ([`decode_threads`]).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Threads a decode step runs on: [`threads`], but no more than the cores this process may run
/// on. Decode is bound by memory, and a thread without a core of its own only makes the others
/// wait for it (team.rs).
pub fn decode_threads() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    threads().min(cores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Set by a test to run the kernels of this thread in one version ([`vector_isa`]).
        pub(super) static FORCED_ISA: Cell<Option<VectorIsa>> = const { Cell::new(None) };
    }

    /// The elementwise steps of [`vectorized`] in each version, on lengths with vector tails:
    /// the same bits as the baseline's.
    #[test]
    fn every_isa_gives_the_same_bits() {
        let x: Vec<f32> = (0..3 * 200 + 13)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.013)
            .collect();
        let w: Vec<f32> = (0..200).map(|i| 0.5 + (i % 13) as f32 * 0.07).collect();
        let table = RopeTable::new(200, 1_000_000.0, 8);
        let run = |isa: VectorIsa| {
            FORCED_ISA.set(Some(isa));
            let mut gate = x.clone();
            silu_mul(&mut gate, &x);
            let mut sum = x.clone();
            add(&mut sum, &gate);
            let mut norm = vec![0.0; 600];
            rmsnorm(&mut norm, &x[..600], &w, 1e-6);
            let mut rot = x[..600].to_vec();
            rope(&mut rot, &table, 5, 200);
            FORCED_ISA.set(None);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            [bits(&gate), bits(&sum), bits(&norm), bits(&rot)]
        };
        let base = run(VectorIsa::Baseline);
        for &isa in VectorIsa::ALL.iter().filter(|isa| isa.supported()) {
            assert_eq!(run(isa), base, "{isa:?}");
        }
    }
}
