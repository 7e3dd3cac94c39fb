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
//! | [`silu_mul`], [`add`] | elementwise |
//!
//! The innermost loops, the dot products, are in [`dot`]: scalar references plus SIMD versions
//! chosen once at run time. The functions here keep their signatures whatever [`dot`] picks.
//! [`exp`] is the softmax's exponential, written so that loops over it vectorize; `lanes.rs` sums
//! in independent lanes for the same reason.

pub mod attention;
pub mod dot;
mod elementwise;
mod embedding;
pub mod exp;
pub(crate) mod lanes;
mod matmul;
mod rmsnorm;
mod rope;
pub(crate) mod team;

pub use attention::{attention, AttentionShape, KvType};
pub use elementwise::{add, silu_mul};
pub use embedding::embedding;
pub use matmul::{matmul, matmuls};
pub use rmsnorm::rmsnorm;
pub use rope::{rope, RopeTable};

/// The widest vectors this CPU has for the plain-Rust kernels written in lanes (attention's body,
/// the sampler's passes), detected once. Each such kernel has one wrapper per variant, compiled
/// with that instruction set enabled, and picks the wrapper from this.
#[derive(Clone, Copy)]
pub(crate) enum VectorIsa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// SSE2 or NEON, what the target always has.
    Baseline,
}

pub(crate) fn vector_isa() -> VectorIsa {
    static ISA: std::sync::OnceLock<VectorIsa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return VectorIsa::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return VectorIsa::Avx2;
            }
        }
        VectorIsa::Baseline
    })
}

/// Threads the kernels split work over (rayon's pool; set `RAYON_NUM_THREADS` to change it).
/// Decode uses no more of them than the cores the process may run on (`team.rs`).
pub fn threads() -> usize {
    rayon::current_num_threads()
}
