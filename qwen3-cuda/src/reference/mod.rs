//! CPU references of the kernels: the same math in the same order, in plain Rust.
//!
//! Each function here mirrors one kernel in `qwen3-cuda/kernels/` thread by thread: where a kernel
//! splits a sum across lanes and reduces it in a tree, the reference adds in that same order, and
//! where a kernel writes `fmaf` the reference writes `f32::mul_add`. Kernels built only from
//! +, *, fma, correctly rounded division and square root (matmul, RMSNorm, RoPE, embedding,
//! residual add) therefore have references that match them bit for bit; kernels that call `expf`
//! (attention, SiLU) match to a few ulp. The GPU tests compare kernels with these, and the unit
//! tests below each compare these with naive f64 math.
//!
//! [`ReferenceBackend`] puts them behind qwen3-inference's `Backend` trait, so the one forward pass
//! (`qwen3_inference::model::Session`) runs on them exactly as it runs on the GPU.

pub mod attention;
pub mod backend;
pub mod elementwise;
pub mod embed;
pub mod matmul;
pub mod reduce;
pub mod rmsnorm;
pub mod rope;

pub use backend::ReferenceBackend;

/// Deterministic pseudo-random values in [-1, 1) for tests (a 64-bit LCG; no crate needed).
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
