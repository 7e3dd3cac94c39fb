//! Dot products, the innermost loop of every matrix product, in SIMD with run-time dispatch.
//!
//! Decoding a token reads every weight once and does one multiply-add per weight, so the speed of
//! these few functions is the speed of the runtime. Each has a scalar version, which is the
//! reference (and the fallback on CPUs without the instructions), and x86-64 versions for AVX2+FMA
//! and AVX-512 (with VNNI for the integer product), and aarch64 versions for NEON (with `sdot`
//! for the integer product where the CPU has the dot-product extension). The best version is
//! chosen once, at first use, with `is_x86_feature_detected!` / `is_aarch64_feature_detected!`;
//! after that a call is one indirect jump through [`Dots`].
//!
//! The q8 x q8 product (W8A8): the activation vector is quantized per group exactly like the
//! weights (`quant/q8.rs`), so each group's contribution is `scale_w * scale_x * sum(q_w * q_x)`, an
//! integer sum of 8-bit products that AVX-512 VNNI computes 64 at a time (`vpdpbusd`).

use std::sync::OnceLock;

/// `sum(a[i] * b[i])` over f32.
pub type DotF32 = fn(a: &[f32], b: &[f32]) -> f32;
/// `sum(bf16(w[i]) * x[i])`, `w` as raw bf16 bit patterns.
pub type DotBf16 = fn(w: &[u16], x: &[f32]) -> f32;
/// bf16 weight rows against `t` f32 activation rows: `out[r * t + i]` is [`DotBf16`] of weight
/// row `r` (`w: [rows, cols]`) with token `i` of `x` (`[t, cols]`), bit for bit, so that a
/// prompt gets decode's bits. A family that tiles it reads each weight once for several tokens.
pub type MatBf16 = fn(w: &[u16], x: &[f32], t: usize, out: &mut [f32]);
/// `sum_g ws[g] * xs[g] * sum_{i in g} w[i] * x[i]` over groups of `group_size`.
pub type DotQ8 = fn(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], group_size: usize) -> f32;
/// `sum_g ws[g] * sum_{i in g} w[i] * x[i]`: int8 weights with per-group scales against f32
/// activations (W8A32), exactly the dequantized weights' product up to f32 rounding.
pub type DotQ8F32 = fn(w: &[i8], ws: &[f32], x: &[f32], group_size: usize) -> f32;
/// A block of weight rows against a batch of activation rows: `out[r * t + i]` is
/// [`DotQ8`] of weight row `r` (`w: [rows, cols]`, `ws: [rows, cols / gs]`) with token `i` of
/// `x`. Prefill calls it with every token of the prompt chunk, so each block of weights is read
/// from memory once and reused from cache for all of them.
///
/// `ahead`: how many bytes of weights follow `w` in memory that the same thread reads next (in
/// decode, the rest of its run of rows, see `team.rs`). A kernel may prefetch them and nothing
/// further; 0 confines prefetching to `w`. The AVX-512 and AVX2 decode kernels prefetch.
pub type MatQ8 = fn(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32], ahead: usize);
/// [`MatQ8`] for q4 weights (and q6 ones): `w` the rows' packed bytes, `ws` their f16 scales
/// (`q4.rs`, `q6.rs`). The activations must be laid out in the [`Dots::q4_layout`] of the
/// `Dots` the kernel came from ([`ActsQ8Buf::quantize_for_q4`] for this CPU's,
/// [`ActsQ8Buf::quantize_for_q4_as`] for another); a SIMD kernel panics on another layout.
pub type MatQ4 = fn(w: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32], ahead: usize);

/// [`MatQ8`] for GGUF's K-quant weights (`k_quants.rs`): `w` the rows' blocks as the GGUF holds
/// them, the activations with their K-quant forms (per block of 256, [`k_quants::ActsK`]:
/// [`ActsQ8Buf::quantize_for_k`]). `ahead` as [`MatQ8`]'s: the AVX2 and AVX-512 kernels
/// prefetch, the scalar one does not.
pub type MatK =
    fn(kind: crate::format::KQuant, w: &[u8], x: &ActsQ8, out: &mut [f32], ahead: usize);

/// Quantizes `x` per group into `q` and `scales` (same rule as [`crate::quant::quantize_q8`]).
pub type QuantizeQ8 = fn(x: &[f32], group_size: usize, q: &mut [i8], scales: &mut [f32]);

/// The dot products chosen for this CPU.
#[derive(Clone, Copy)]
pub struct Dots {
    pub f32: DotF32,
    pub bf16: DotBf16,
    pub bf16_rows: MatBf16,
    pub q8: DotQ8,
    pub q8_rows: MatQ8,
    /// `q8_rows` on q8 weights in the interleaved order (`interleaved.rs`, groups of 32 or 64)
    /// with the activations laid out to match ([`ActsQ8::q4`] in [`q4::Q4Layout::Interleaved`]),
    /// where this family has such a kernel (AVX-512); `Model::load` then makes the copy.
    pub q8_interleaved: Option<MatQ8>,
    /// Where `q8_rows` on weights in the file's order reads the activations laid out in the
    /// interleaved order too ([`ActsQ8::interleaved`]), for the group sizes that order takes
    /// (`interleaved::interleaves_q8`): from how many tokens on, for a group size. AVX2's
    /// kernel reorders a prompt's weight rows as it reads them (`x86/q8_lanes_avx2.rs`); the
    /// matrix product lays the activations out for it. Without them it takes a slower path
    /// with the same bits.
    pub q8_rows_lay_out: Option<fn(usize) -> usize>,
    /// q4 weights against q8 activations (W4A8): `q4.rs` has the scalar reference and the
    /// activations' layout the SIMD versions read.
    pub q4_rows: MatQ4,
    /// q6 weights against q8 activations: q4's kernels with two more bits a weight (`q6.rs`).
    pub q6_rows: MatQ4,
    /// The order of the activations `q4_rows` and `q6_rows` read (`q4.rs`).
    pub q4_layout: q4::Q4Layout,
    /// GGUF's K-quant blocks against q8 activations (`k_quants.rs`).
    pub k_rows: MatK,
    /// `k_rows` on K-quant blocks in an interleaved order of this family's
    /// (`k_interleaved.rs`: AVX-512's groups side by side, AVX2's eight rows), for the kinds the
    /// order takes; `Model::load` then makes the copy.
    pub k_interleaved: Option<(k_interleaved::KOrder, MatK)>,
    pub q8_f32: DotQ8F32,
    pub quantize_q8: QuantizeQ8,
    /// Which instruction set was picked, for `--verbose` and the bench report.
    pub isa: &'static str,
    /// The vectors the lane kernels (attention, sampler, elementwise) use with this family: set
    /// beside the family's detection, so it never names instructions the family was not checked
    /// for ([`crate::kernels::VectorIsa`]).
    pub(crate) lanes: crate::kernels::VectorIsa,
}

/// The scalar reference versions.
pub const SCALAR: Dots = Dots {
    f32: dot_f32_scalar,
    bf16: dot_bf16_scalar,
    bf16_rows: |w, x, t, out| bf16_rows_by_dot(dot_bf16_scalar, w, x, t, out),
    q8: dot_q8_scalar,
    q8_rows: mat_q8_scalar,
    q8_interleaved: None,
    q8_rows_lay_out: None,
    q4_rows: q4::mat_q4_scalar,
    q6_rows: q6::mat_q6_scalar,
    q4_layout: q4::Q4Layout::Halves,
    k_rows: |kind, w, x, out, _| k_quants::mat_k_scalar(kind, w, x, out),
    k_interleaved: None,
    q8_f32: dot_q8_f32_scalar,
    quantize_q8: crate::quant::quantize_q8,
    isa: "scalar",
    lanes: crate::kernels::VectorIsa::Baseline,
};

/// The fastest versions this CPU supports, detected once; or the family `QWEN3_KERNELS` names
/// ([`requested`]).
pub fn dots() -> &'static Dots {
    static DOTS: OnceLock<Dots> = OnceLock::new();
    DOTS.get_or_init(|| match requested() {
        Ok(Some(d)) => d,
        // Unset, or a family this CPU lacks: the CLI refuses the latter before any work
        // (`requested` at start-up); a library caller gets the detected kernels.
        _ => detect(),
    })
}

/// The kernel family forced by the environment variable `QWEN3_KERNELS`, to measure every
/// instruction set a machine has on that machine (docs/benchmarks.md, "Measuring"): `scalar`,
/// `avx2`, `avx-vnni`, `avx512`, `neon` or `neon-dotprod`, each matching the [`Dots::isa`] of
/// that name or starting with it (`avx512` is `avx512-vnni`). `Ok(None)` when unset or empty; an error
/// naming the family and what this CPU has when it has no such kernels.
pub fn requested() -> Result<Option<Dots>, String> {
    let want = match std::env::var("QWEN3_KERNELS") {
        Ok(w) if !w.is_empty() => w,
        _ => return Ok(None),
    };
    let all = available();
    let found = all
        .iter()
        .find(|d| d.isa == want)
        .or_else(|| all.iter().find(|d| d.isa.starts_with(&format!("{want}-"))));
    match found {
        Some(d) => Ok(Some(*d)),
        None => {
            let have: Vec<&str> = all.iter().map(|d| d.isa).collect();
            Err(format!(
                "QWEN3_KERNELS={want}: this CPU has no such kernels (it has {}; the families are scalar, avx2, avx-vnni, avx512, neon, neon-dotprod)",
                have.join(", ")
            ))
        }
    }
}

fn detect() -> Dots {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx512() {
            return x86::AVX512;
        }
        if x86::has_avx_vnni() {
            return x86::AVX_VNNI;
        }
        if x86::has_avx2() {
            return x86::AVX2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if aarch64::has_dotprod() {
            return aarch64::NEON_DOTPROD;
        }
        if aarch64::has_neon() {
            return aarch64::NEON;
        }
    }
    SCALAR
}

/// Every version available on this CPU (the scalar one first), for tests and benchmarks.
pub fn available() -> Vec<Dots> {
    let mut v = vec![SCALAR];
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx2() {
            v.push(x86::AVX2);
        }
        if x86::has_avx_vnni() {
            v.push(x86::AVX_VNNI);
        }
        if x86::has_avx512() {
            v.push(x86::AVX512);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if aarch64::has_neon() {
            v.push(aarch64::NEON);
        }
        if aarch64::has_dotprod() {
            v.push(aarch64::NEON_DOTPROD);
        }
    }
    v
}

pub fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// bf16 is the upper half of an f32, so widening is a 16-bit shift.
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

pub fn dot_bf16_scalar(w: &[u16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(&b, &v)| bf16_to_f32(b) * v).sum()
}

pub fn dot_q8_scalar(w: &[i8], ws: &[f32], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(gs).zip(x.chunks_exact(gs)).enumerate() {
        let isum: i32 = wg.iter().zip(xg).map(|(&a, &b)| a as i32 * b as i32).sum();
        sum += isum as f32 * (ws[g] * xs[g]);
    }
    sum
}

pub fn mat_q8_scalar(w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32], _ahead: usize) {
    mat_q8_with(dot_q8_scalar, w, ws, x, out)
}

/// [`MatQ8`] as one [`DotQ8`] per (row, token) pair.
fn mat_q8_with(dot: DotQ8, w: &[i8], ws: &[f32], x: &ActsQ8, out: &mut [f32]) {
    x.check(w, ws, out);
    let (cols, per, t) = (x.cols, x.per(), x.t);
    for (r, out_r) in out.chunks_exact_mut(t).enumerate() {
        let (w_r, ws_r) = (&w[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
        for (i, o) in out_r.iter_mut().enumerate() {
            *o = dot(w_r, ws_r, x.q_row(i), x.scales_row(i), x.group_size);
        }
    }
}

/// Weight rows per block of [`for_each_tile`]: the tiles of a block run for every token before
/// the next block starts, so its weights (16 KiB at 1024 columns) are read from memory once and
/// from the cache for the other tokens. (Prefill's tasks are 16 rows already, matmul.rs.)
const TILE_BLOCK_ROWS: usize = 16;

/// [`MatBf16`] as one [`DotBf16`] per (row, token), for the families without a tiled kernel.
pub fn bf16_rows_by_dot(dot: DotBf16, w: &[u16], x: &[f32], t: usize, out: &mut [f32]) {
    let cols = x.len() / t.max(1);
    for (r, w_r) in w.chunks_exact(cols.max(1)).enumerate() {
        for (i, x_i) in x.chunks_exact(cols.max(1)).enumerate() {
            out[r * t + i] = dot(w_r, x_i);
        }
    }
}

/// The order in which a tiled [`MatQ8`] with `t > 1` visits its tiles: `f(m, n, r, i)` computes
/// rows `r .. r + m` against tokens `i .. i + n`, where `m` is `tile_r` or 1 (the last row of an
/// odd block) and `n` is `tile_n` or what is left of the tokens (a step of 2, 3, 6 sequences
/// takes a tile of 2, 3 or 4 and 2 tokens, each weight vector loaded once for all of them);
/// together the calls cover every (row, token) once.
///
/// Rows are the outer loop, in blocks of [`TILE_BLOCK_ROWS`], and tokens the inner one. With
/// tokens outside, a product of a few tokens over many rows (a serving step's classifier: 8
/// tokens, 4700 rows a part) read its weights from DRAM once per four tokens, and a step of 8
/// sequences was slower than a prefill of 8 tokens, which computes only one classifier row
/// (measured: docs/performance.md, "A few rows: a serving step"). Each tile makes the same bits
/// whatever the order, so results do not change.
fn for_each_tile(
    rows: usize,
    t: usize,
    tile_r: usize,
    tile_n: usize,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    for r0 in (0..rows).step_by(TILE_BLOCK_ROWS) {
        let r1 = (r0 + TILE_BLOCK_ROWS).min(rows);
        let mut i = 0;
        while i < t {
            let n = (t - i).min(tile_n);
            let mut r = r0;
            while r < r1 {
                let m = if r1 - r >= tile_r { tile_r } else { 1 };
                f(m, n, r, i);
                r += m;
            }
            i += n;
        }
    }
}

pub fn dot_q8_f32_scalar(w: &[i8], ws: &[f32], x: &[f32], gs: usize) -> f32 {
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(gs).zip(x.chunks_exact(gs)).enumerate() {
        let part: f32 = wg.iter().zip(xg).map(|(&a, &b)| a as f32 * b).sum();
        sum += ws[g] * part;
    }
    sum
}

/// Why matrices of `dtype` in groups of `gs` would run on the scalar reference kernels, many
/// times slower than the SIMD ones, or `None` when the SIMD kernels take them. q4 (and the q6 in
/// its files) in groups of [`q4::SIMD_GROUP`] only: their layout is built around groups of 32
/// (`q4.rs`). q8 in groups of a multiple of 32 on x86 (AVX2's step; AVX-512's VNNI path takes
/// multiples of 64, and 32 two groups a vector, `x86/q8_pairs.rs`, and hands other multiples of
/// 32 to AVX2's), of 16 on NEON. f32 and bf16 have no groups.
pub fn scalar_only(dtype: crate::format::DType, gs: usize) -> Option<String> {
    use crate::format::DType;
    match dtype {
        DType::Q4 | DType::Q6 if gs != q4::SIMD_GROUP => Some(format!(
            "the {dtype} kernels are vectorized for groups of {}: groups of {gs} run on the scalar reference",
            q4::SIMD_GROUP
        )),
        // Vectorized on x86 (AVX2, `x86/k_quants.rs`) only.
        DType::K(_) if !cfg!(target_arch = "x86_64") => Some(format!(
            "GGUF's {dtype} blocks are vectorized on x86 only: here they run on the scalar reference"
        )),
        DType::Q8 if !gs.is_multiple_of(32) => Some(format!(
            "the q8 kernels are vectorized for groups of a multiple of 32: groups of {gs} run on the scalar reference on x86"
        )),
        _ => None,
    }
}

mod acts;
pub use acts::{ActsQ8, ActsQ8Buf, Forms};
pub mod interleaved;
pub mod k_interleaved;
pub mod k_quants;
pub mod q4;
pub mod q6;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod aarch64;

#[cfg(test)]
mod tests;
