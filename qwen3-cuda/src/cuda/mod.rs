//! The CUDA runtime (feature `cuda`): find the driver and NVRTC, compile the kernels, upload the
//! model file once, launch kernels.
//!
//! cudarc is built with `dynamic-loading`: nothing links to libcuda or libnvrtc at build time; they
//! are opened on first use, and cudarc panics if they are missing. [`CudaRuntime::open`] therefore
//! probes for both first and turns their absence into a one-line error.

mod backend;
mod compile;
mod runtime;
mod weights;

pub use backend::CudaBackend;
pub use compile::{compile_kernel, nvrtc_present, nvrtc_supported_archs, nvrtc_version};
pub use runtime::{device_count, driver_present, CudaRuntime};
pub use weights::{DeviceTensor, DeviceWeights};
