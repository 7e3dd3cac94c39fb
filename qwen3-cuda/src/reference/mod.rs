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
//! [`ReferenceBackend`] puts them behind qwen3-inference's `Backend` trait, so the model's forward pass
//! (`qwen3_inference::model::Forward`, under a `Session` or the engine) runs on them exactly as it
//! runs on the GPU.

pub mod attention;
pub mod backend;
pub mod elementwise;
pub mod embed;
pub mod matmul;
pub mod reduce;
pub mod rmsnorm;
pub mod rope;

pub use backend::ReferenceBackend;

/// Deterministic pseudo-random values in [-1, 1) for tests.
#[cfg(test)]
pub(crate) use qwen3_inference::testing::values as test_values;
