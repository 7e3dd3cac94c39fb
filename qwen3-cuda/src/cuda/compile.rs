//! Kernel sources to PTX with NVRTC.

use crate::kernels::{KernelSource, NVRTC_OPTIONS};
use anyhow::{bail, Result};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

/// Whether libnvrtc can be loaded (it comes with the CUDA toolkit or the `nvidia-cuda-nvrtc-cu12`
/// wheel, not with the driver). cudarc looks for `libnvrtc.so`, `libnvrtc.so.12`, ... through the
/// dynamic loader, so a wheel's `lib/` directory must be on `LD_LIBRARY_PATH`.
pub fn nvrtc_present() -> bool {
    // SAFETY: `is_culib_present` is unsafe because it dlopen()s candidate library names, which
    // runs their initialisers; the only candidates are NVIDIA's libnvrtc, which we mean to load.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The loaded NVRTC's version, e.g. (12, 9). Errors (never panics) when libnvrtc is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        bail!("libnvrtc not found");
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is present (checked above, so cudarc's loader does not panic), and
    // nvrtcVersion only writes one int through each of two pointers to live locals.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| anyhow::anyhow!("nvrtcVersion: {e:?}"))?;
    Ok((major, minor))
}

/// The virtual architectures the loaded NVRTC can compile for, as compute capability x 10 (75 for
/// `compute_75`). They change with the toolkit: NVRTC 12.x takes 50 to 120, NVRTC 13 dropped
/// Maxwell, Pascal and Volta and starts at 75. Errors (never panics) when libnvrtc is missing.
pub fn nvrtc_supported_archs() -> Result<Vec<i32>> {
    if !nvrtc_present() {
        bail!("libnvrtc not found");
    }
    let mut n: std::ffi::c_int = 0;
    // SAFETY: libnvrtc is present (checked above); the call writes one int through a pointer to a
    // live local.
    unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| anyhow::anyhow!("nvrtcGetNumSupportedArchs: {e:?}"))?;
    let mut archs = vec![0; n.max(0) as usize];
    // SAFETY: NVRTC writes exactly the `n` ints it just counted, and `archs` holds `n`.
    unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| anyhow::anyhow!("nvrtcGetSupportedArchs: {e:?}"))?;
    Ok(archs)
}

/// Compiles one kernel file for `arch` (`compute_80` for PTX the driver JIT-compiles for any GPU of
/// compute capability 8.0 or newer; `sm_90` for a specific architecture). The error carries
/// NVRTC's log, which names the file and line.
pub fn compile_kernel(kernel: &KernelSource, arch: &str) -> Result<Ptx> {
    if !nvrtc_present() {
        bail!("libnvrtc not found (install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and add its lib/ directory to LD_LIBRARY_PATH)");
    }
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    let opts = CompileOptions {
        options,
        name: Some(kernel.file.to_string()),
        ..Default::default()
    };
    match compile_ptx_with_opts(kernel.program(), opts) {
        Ok(ptx) => Ok(ptx),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            bail!(
                "NVRTC failed to compile {} for {arch}:\n{}",
                kernel.file,
                log.to_string_lossy()
            )
        }
        Err(e) => bail!("NVRTC failed on {} for {arch}: {e:?}", kernel.file),
    }
}
