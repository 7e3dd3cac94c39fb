//! The pico-qwen GPU backend.
//!
//! What is here, and what needs a GPU:
//! - [`kernels`]: the CUDA C kernels (embedded sources) and their launch geometry. Always built.
//! - [`reference`](mod@reference): a CPU reference of every kernel, same math in the same order. Always built and
//!   tested on any machine.
//! - [`device`]: `--device cpu|cuda|cuda:N` parsing and the availability check. Always built.
//! - [`backend`]: the `Backend` trait (the ops a forward pass needs) and its CPU-reference
//!   implementation; [`forward`]: the Qwen3 forward pass written once over it. Always built, and
//!   tested against transformers on the fixtures (tests/hf_parity.rs).
//! - `cuda` (feature `cuda`): cudarc-based runtime: probes for the driver and NVRTC, compiles the
//!   kernels at load time, uploads the model file once, implements `Backend` with the kernels.
//!   Without the feature nothing here links to CUDA and cudarc is not compiled at all.
//!
//! docs/cuda.md explains how a decode step maps onto these kernels and what speed to expect.

pub mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod forward;
pub mod kernels;
pub mod reference;

pub use device::Device;
