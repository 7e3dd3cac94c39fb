//! The CUDA C kernel sources, embedded in the binary, and the launch geometry the host uses for
//! each (shared with the CPU references, whose summation order depends on it).
//!
//! Each `.cu` file is compiled as its own NVRTC program with [`COMMON`] prepended; the kernel
//! names listed here are the `extern "C"` entry points the launch code loads.

use qwen3_inference::format::DType;

/// Reductions shared by every kernel (`warp_sum`, `block_sum`, `block_max`).
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// One kernel source file and the entry points it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name under `qwen3-cuda/kernels/`; also the NVRTC program name in error logs.
    pub file: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
}

impl KernelSource {
    /// The full program NVRTC compiles: the common reductions, then this file. The `#line`
    /// directive makes NVRTC's error messages give the line in the `.cu` file itself.
    pub fn program(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}\"\n{}", self.file, self.source)
    }
}

pub const RMSNORM: KernelSource = KernelSource {
    file: "rmsnorm.cu",
    source: include_str!("../kernels/rmsnorm.cu"),
    entry_points: &["rmsnorm_f32"],
};
pub const MATMUL: KernelSource = KernelSource {
    file: "matmul.cu",
    source: include_str!("../kernels/matmul.cu"),
    entry_points: &[
        "matmul_q8",
        "matmul_q4",
        "matmul_q6",
        "matmul_bf16",
        "matmul_f32",
    ],
};
pub const EMBED: KernelSource = KernelSource {
    file: "embed.cu",
    source: include_str!("../kernels/embed.cu"),
    entry_points: &["embed_q8", "embed_q6", "embed_bf16", "embed_f32"],
};
pub const ROPE: KernelSource = KernelSource {
    file: "rope.cu",
    source: include_str!("../kernels/rope.cu"),
    entry_points: &["rope"],
};
pub const ATTENTION: KernelSource = KernelSource {
    file: "attention.cu",
    source: include_str!("../kernels/attention.cu"),
    entry_points: &["attention"],
};
pub const ELEMENTWISE: KernelSource = KernelSource {
    file: "elementwise.cu",
    source: include_str!("../kernels/elementwise.cu"),
    entry_points: &["silu_mul", "add_assign", "add_bias", "scatter_add_rows"],
};

/// Every kernel source, in the order a layer uses them.
pub const ALL: [KernelSource; 6] = [EMBED, RMSNORM, MATMUL, ROPE, ATTENTION, ELEMENTWISE];

/// NVRTC options every kernel is compiled with. `--fmad=false` forbids the compiler from fusing a
/// multiply and an add behind our back (kernels write `fmaf` where they want one), so the CPU
/// references can reproduce each kernel's rounding exactly. Precise division and square root are
/// NVRTC's defaults and are relied on (RMSNorm's `1 / sqrtf`).
pub const NVRTC_OPTIONS: [&str; 1] = ["--fmad=false"];

/// Threads per block of `rmsnorm_f32` for rows of `n` values: `n` rounded up to a whole warp, at
/// most 256 (so a 1024-wide hidden norm has 4 values a thread and a 128-wide head norm 1).
pub fn rmsnorm_block_dim(n: usize) -> usize {
    n.div_ceil(32).clamp(1, 8) * 32
}

/// Rows (one warp each) per block of the `matmul_*` kernels; must match `ROWS_PER_BLOCK`.
pub const MATMUL_ROWS_PER_BLOCK: usize = 8;
/// Tokens per block of the `matmul_*` kernels; must match `TOK_TILE` in matmul.cu.
pub const MATMUL_TOK_TILE: usize = 8;
/// Threads per block of `attention` (4 warps).
pub const ATTENTION_BLOCK_DIM: usize = 128;
/// Threads per block of the element-wise, embedding and RoPE kernels.
pub const ELEMENTWISE_BLOCK_DIM: usize = 256;

/// Checks what the `matmul_*` kernels assume of a weight matrix: four columns per lane load, and
/// groups that four-column loads never straddle (q8: a multiple of 4; q4: of 8, so that the four
/// also lie in one half of a group; q6: of 32, the runs its blocks pack). `quant`: the dtype and
/// group size of q8, q4 and q6 weights.
/// Returns a one-line reason otherwise.
pub fn check_matmul_shape(cols: usize, quant: Option<(DType, usize)>) -> Result<(), String> {
    if cols == 0 || !cols.is_multiple_of(4) {
        return Err(format!(
            "the CUDA matmul needs a column count that is a multiple of 4, got {cols}"
        ));
    }
    if let Some((dtype, gs)) = quant {
        let m = match dtype {
            DType::Q4 => 8,
            DType::Q6 => 32,
            _ => 4,
        };
        if gs == 0 || !gs.is_multiple_of(m) || !cols.is_multiple_of(gs) {
            return Err(format!(
                "the CUDA {dtype} matmul needs a group size that is a multiple of {m} and divides {cols}, got {gs}"
            ));
        }
    }
    Ok(())
}

/// The dtype and group size [`check_matmul_shape`] takes, for a tensor of `dtype`.
pub fn quant_of(dtype: DType, group_size: usize) -> Option<(DType, usize)> {
    dtype.grouped().then_some((dtype, group_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each entry point named here must be defined `extern "C" __global__` in its file, so the
    /// loader never asks a module for a function it does not have.
    #[test]
    fn entry_points_are_defined_in_their_sources() {
        for k in ALL {
            for name in k.entry_points {
                let decl = format!("extern \"C\" __global__ void {name}(");
                assert!(k.source.contains(&decl), "{} lacks {decl}", k.file);
            }
            let defined = k.source.matches("extern \"C\" __global__ void ").count();
            assert_eq!(
                defined,
                k.entry_points.len(),
                "{}: unlisted entry point",
                k.file
            );
        }
    }

    /// The tile sizes are stated twice (CUDA and Rust); they must agree.
    #[test]
    fn tile_constants_match_the_cuda_source() {
        let m = MATMUL.source;
        assert!(m.contains(&format!("#define TOK_TILE {MATMUL_TOK_TILE}\n")));
        assert!(m.contains(&format!("#define ROWS_PER_BLOCK {MATMUL_ROWS_PER_BLOCK}\n")));
    }

    #[test]
    fn rmsnorm_block_dims() {
        assert_eq!(rmsnorm_block_dim(128), 128);
        assert_eq!(rmsnorm_block_dim(1024), 256);
        assert_eq!(rmsnorm_block_dim(40), 64);
        assert_eq!(rmsnorm_block_dim(1), 32);
    }

    #[test]
    fn matmul_shape_checks() {
        assert!(check_matmul_shape(1024, Some((DType::Q8, 64))).is_ok());
        assert!(check_matmul_shape(1024, None).is_ok());
        assert!(check_matmul_shape(1022, None).is_err());
        assert!(check_matmul_shape(1024, Some((DType::Q8, 6))).is_err());
        assert!(check_matmul_shape(96, Some((DType::Q8, 64))).is_err());
        assert!(check_matmul_shape(1024, Some((DType::Q4, 32))).is_ok());
        assert!(check_matmul_shape(1024, Some((DType::Q4, 4))).is_err());
        assert!(check_matmul_shape(1024, Some((DType::Q6, 32))).is_ok());
        assert!(check_matmul_shape(1024, Some((DType::Q6, 16))).is_err());
    }
}
