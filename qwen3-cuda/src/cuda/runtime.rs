//! One CUDA device, ready to run the kernels: context, stream, loaded functions.

use super::compile::{compile_kernel, nvrtc_present, nvrtc_supported_archs, nvrtc_version};
use crate::kernels;
use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use std::sync::Arc;
use std::time::Instant;

/// Whether the CUDA driver library (libcuda, installed with the NVIDIA driver) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` is unsafe because it dlopen()s candidate library names, which
    // runs their initialisers; the only candidates are NVIDIA's libcuda, which we mean to load.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// How many CUDA devices the driver sees; an error (not a panic) when there is no driver.
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        bail!("no CUDA driver found (libcuda.so could not be loaded; is the NVIDIA driver installed?)");
    }
    let n = CudaContext::device_count()
        .map_err(|e| anyhow::anyhow!("CUDA driver failed to initialise: {e}"))?;
    Ok(n.max(0) as usize)
}

/// The kernels' entry points, loaded into the device's context.
pub struct Functions {
    pub rmsnorm_f32: CudaFunction,
    pub matmul_q8: CudaFunction,
    pub matmul_q4: CudaFunction,
    pub matmul_q6: CudaFunction,
    pub matmul_bf16: CudaFunction,
    pub matmul_f32: CudaFunction,
    pub embed_q8: CudaFunction,
    pub embed_q6: CudaFunction,
    pub embed_bf16: CudaFunction,
    pub embed_f32: CudaFunction,
    pub rope: CudaFunction,
    pub attention: CudaFunction,
    pub silu_mul: CudaFunction,
    pub add_assign: CudaFunction,
    pub add_bias: CudaFunction,
    pub scatter_add_rows: CudaFunction,
}

/// A CUDA device with the kernels compiled for it and one stream every launch goes to (so launches
/// run in order and the host only waits when it copies logits back).
pub struct CudaRuntime {
    pub stream: Arc<CudaStream>,
    pub functions: Functions,
    /// e.g. "NVIDIA GeForce RTX 4090 (compute 8.9)", for `--verbose` output.
    pub description: String,
}

impl CudaRuntime {
    /// Opens device `ordinal`. Every missing piece is a one-line error, checked before cudarc
    /// touches it: no driver library, no device of that number, no NVRTC.
    pub fn open(ordinal: usize) -> Result<CudaRuntime> {
        let count = device_count()?;
        if ordinal >= count {
            bail!("no CUDA device cuda:{ordinal} (this machine has {count})");
        }
        if !nvrtc_present() {
            bail!("libnvrtc not found: the kernels are compiled at load time and need NVRTC (install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and add its lib/ directory to LD_LIBRARY_PATH)");
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow::anyhow!("cannot open cuda:{ordinal}: {e}"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| anyhow::anyhow!("cuda:{ordinal}: {e}"))?;
        if major < 7 {
            bail!("cuda:{ordinal} has compute capability {major}.{minor}; these kernels need 7.0 or newer");
        }
        // NVRTC 13 no longer compiles for Volta (7.0, 7.2): say so, rather than NVRTC's "invalid
        // value for --gpu-architecture" from inside the first kernel file.
        let cc = major * 10 + minor;
        if !nvrtc_supported_archs()?.contains(&cc) {
            let (v0, v1) = nvrtc_version()?;
            bail!("cuda:{ordinal} has compute capability {major}.{minor}, which NVRTC {v0}.{v1} cannot compile for (use a CUDA 12 NVRTC)");
        }
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        // PTX for the device's own virtual architecture: the driver compiles it to machine code
        // once at load.
        let arch = format!("compute_{major}{minor}");
        let load = |k: &kernels::KernelSource| -> Result<Vec<CudaFunction>> {
            let ptx = compile_kernel(k, &arch)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| anyhow::anyhow!("cuda:{ordinal}: loading {}: {e}", k.file))?;
            k.entry_points
                .iter()
                .map(|name| {
                    module
                        .load_function(name)
                        .map_err(|e| anyhow::anyhow!("{}: {name}: {e}", k.file))
                })
                .collect()
        };
        let mut loaded = Vec::new();
        for k in kernels::ALL {
            let functions = load(&k).with_context(|| format!("cuda:{ordinal}"))?;
            loaded.extend(k.entry_points.iter().copied().zip(functions));
        }
        let mut take = |name: &str| -> Result<CudaFunction> {
            let i = loaded.iter().position(|(n, _)| *n == name);
            Ok(loaded
                .swap_remove(i.with_context(|| format!("no kernel {name}"))?)
                .1)
        };
        let functions = Functions {
            rmsnorm_f32: take("rmsnorm_f32")?,
            matmul_q8: take("matmul_q8")?,
            matmul_q4: take("matmul_q4")?,
            matmul_q6: take("matmul_q6")?,
            matmul_bf16: take("matmul_bf16")?,
            matmul_f32: take("matmul_f32")?,
            embed_q8: take("embed_q8")?,
            embed_q6: take("embed_q6")?,
            embed_bf16: take("embed_bf16")?,
            embed_f32: take("embed_f32")?,
            rope: take("rope")?,
            attention: take("attention")?,
            silu_mul: take("silu_mul")?,
            add_assign: take("add_assign")?,
            add_bias: take("add_bias")?,
            scatter_add_rows: take("scatter_add_rows")?,
        };
        Ok(CudaRuntime {
            stream: ctx.default_stream(),
            functions,
            description: format!("{name} (compute {major}.{minor})"),
        })
    }
}

impl CudaRuntime {
    /// The device memory's bandwidth as a plain copy reaches it, in bytes per second: `bytes`
    /// copied device to device (each byte read once and written once, so 2 x `bytes` cross the
    /// memory bus), the median of five timed copies after one untimed. `qwen3 bench --device cuda`
    /// divides it by the bytes a decoded token reads for its ceiling: a copy is the simplest kernel
    /// that streams memory, so what it reaches is what a memory-bound kernel can hope for (on an
    /// H100 or H200 about 85-90% of the datasheet's figure).
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let e = |e: cudarc::driver::DriverError| anyhow::anyhow!("CUDA: {e}");
        let src = self.stream.alloc_zeros::<u8>(bytes).map_err(e)?;
        let mut dst = self.stream.alloc_zeros::<u8>(bytes).map_err(e)?;
        let mut samples = Vec::new();
        for i in 0..6 {
            self.stream.synchronize().map_err(e)?;
            let start = Instant::now();
            self.stream.memcpy_dtod(&src, &mut dst).map_err(e)?;
            self.stream.synchronize().map_err(e)?;
            if i > 0 {
                samples.push(2.0 * bytes as f64 / start.elapsed().as_secs_f64());
            }
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        Ok(samples[samples.len() / 2])
    }
}
