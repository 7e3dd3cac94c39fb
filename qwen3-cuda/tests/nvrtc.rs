//! Every kernel compiles with NVRTC for every architecture the runtime supports, with no GPU.
//!
//! Needs libnvrtc on the dynamic loader's path (e.g. the `nvidia-cuda-nvrtc-cu12` wheel's lib/
//! directory on LD_LIBRARY_PATH; scripts/check_kernels.sh sets that up, and runs these tests with
//! `--include-ignored`). Each is `#[ignore]`d with that reason, so a plain `cargo test` reports it
//! as ignored, not passed; run without libnvrtc, it fails naming what is missing.
//! With QWEN3_PTX_DIR set, the PTX is written there as `<file>.<arch>.ptx` for ptxas to check.
#![cfg(feature = "cuda")]

use qwen3_cuda::cuda::{compile_kernel, nvrtc_present, nvrtc_supported_archs, nvrtc_version};
use qwen3_cuda::kernels::{KernelSource, ALL};

/// Volta (7.0), Turing (7.5), Ampere (8.0, 8.6), Ada (8.9), Hopper (9.0).
const ARCHS: [&str; 6] = [
    "compute_70",
    "compute_75",
    "compute_80",
    "compute_86",
    "compute_89",
    "compute_90",
];

/// Fails the test unless libnvrtc can be loaded.
fn require_nvrtc() {
    assert!(
        nvrtc_present(),
        "libnvrtc could not be loaded (check LD_LIBRARY_PATH; scripts/check_kernels.sh sets it)"
    );
}

#[test]
#[ignore = "needs libnvrtc: scripts/check_kernels.sh runs it"]
fn every_kernel_compiles_for_every_arch() {
    require_nvrtc();
    let (major, minor) = nvrtc_version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    // Each NVRTC compiles for its own range of architectures (NVRTC 13 starts at compute_75):
    // those of ours it lacks are named and left out, and at least one must remain.
    let supported = nvrtc_supported_archs().unwrap();
    let (archs, dropped): (Vec<&str>, Vec<&str>) = ARCHS.into_iter().partition(|a| {
        let cc: i32 = a.trim_start_matches("compute_").parse().unwrap();
        supported.contains(&cc)
    });
    if !dropped.is_empty() {
        eprintln!("NVRTC {major}.{minor} does not compile for {dropped:?}: left out");
    }
    assert!(
        !archs.is_empty(),
        "NVRTC {major}.{minor} supports none of {ARCHS:?}"
    );
    let out_dir = std::env::var_os("QWEN3_PTX_DIR").map(std::path::PathBuf::from);
    for k in ALL {
        for arch in archs.iter().copied() {
            let t = std::time::Instant::now();
            let ptx = compile_kernel(&k, arch)
                .unwrap_or_else(|e| panic!("{e:#}"))
                .to_src();
            eprintln!(
                "{} {arch}: {} bytes of PTX in {:?}",
                k.file,
                ptx.len(),
                t.elapsed()
            );
            for name in k.entry_points {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{}: no .entry {name} in PTX",
                    k.file
                );
            }
            if let Some(dir) = &out_dir {
                std::fs::write(dir.join(format!("{}.{arch}.ptx", k.file)), &ptx).unwrap();
            }
        }
    }
}

/// The check can fail: a kernel with an error is reported with NVRTC's log naming the file.
#[test]
#[ignore = "needs libnvrtc: scripts/check_kernels.sh runs it"]
fn a_broken_kernel_fails_with_the_log() {
    require_nvrtc();
    let broken = KernelSource {
        file: "broken.cu",
        source: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }",
        entry_points: &["broken"],
    };
    let err = compile_kernel(&broken, "compute_80")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("broken.cu") && err.contains("undefined_name"),
        "{err}"
    );
}

/// `--fmad=false` is in force: a product and a sum written separately (RoPE's `a*c - b*s`) stay
/// separate instructions, as the CPU reference computes them, while an explicit `fmaf` (matmul)
/// is one fused instruction.
#[test]
#[ignore = "needs libnvrtc: scripts/check_kernels.sh runs it"]
fn no_implicit_fma_in_rope() {
    require_nvrtc();
    let ptx = compile_kernel(&qwen3_cuda::kernels::ROPE, "compute_80")
        .unwrap()
        .to_src();
    assert!(
        !ptx.contains("fma.rn.f32"),
        "RoPE must not be contracted to fma:\n{ptx}"
    );
    assert!(
        ptx.contains("mul.rn.f32") || ptx.contains("mul.f32"),
        "{ptx}"
    );
}
