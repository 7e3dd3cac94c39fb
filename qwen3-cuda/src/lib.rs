//! The pico-qwen GPU backend.
//!
//! What is here, and what needs a GPU:
//! - [`kernels`]: the CUDA C kernels (embedded sources) and their launch geometry. Always built.
//! - [`reference`](mod@reference): a CPU reference of every kernel, same math in the same order. Always built and
//!   tested on any machine.
//! - [`device`]: `--device cpu|cuda|cuda:N` parsing and the availability check. Always built.
//! - [`ReferenceBackend`](reference::ReferenceBackend): the references behind qwen3-inference's
//!   `Backend` trait, so the model's forward pass (`qwen3_inference::model::Forward`) runs on them as
//!   it runs on the GPU. Always built, and tested against transformers on the fixtures
//!   (tests/hf_parity.rs).
//! - `cuda` (feature `cuda`): cudarc-based runtime: probes for the driver and NVRTC, compiles the
//!   kernels at load time, uploads the model file once, implements qwen3-inference's `Backend`
//!   with the kernels (`CudaBackend`).
//!   Without the feature nothing here links to CUDA and cudarc is not compiled at all.
//!
//! docs/cuda.md explains how a decode step maps onto these kernels and what speed to expect.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod kernels;
pub mod reference;

pub use device::Device;
