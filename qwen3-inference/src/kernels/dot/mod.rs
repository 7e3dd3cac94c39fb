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
//! weights (`quant.rs`), so each group's contribution is `scale_w * scale_x * sum(q_w * q_x)`, an
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
/// them, the activations quantized per group of [`k_quants::GROUP`] with their sums of 16
/// ([`ActsQ8Buf::quantize_for_k`]). `ahead` as [`MatQ8`]'s: the AVX2 kernel prefetches, the
/// AVX-512 and scalar ones do not.
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
    /// q4 weights against q8 activations (W4A8): `q4.rs` has the scalar reference and the
    /// activations' layout the SIMD versions read.
    pub q4_rows: MatQ4,
    /// q6 weights against q8 activations: q4's kernels with two more bits a weight (`q6.rs`).
    pub q6_rows: MatQ4,
    /// The order of the activations `q4_rows` and `q6_rows` read (`q4.rs`).
    pub q4_layout: q4::Q4Layout,
    /// GGUF's K-quant blocks against q8 activations (`k_quants.rs`).
    pub k_rows: MatK,
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
    q4_rows: q4::mat_q4_scalar,
    q6_rows: q6::mat_q6_scalar,
    q4_layout: q4::Q4Layout::Halves,
    k_rows: |kind, w, x, out, _| k_quants::mat_k_scalar(kind, w, x, out),
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
pub use acts::{ActsQ8, ActsQ8Buf};
pub mod interleaved;
pub mod k_quants;
pub mod q4;
pub mod q6;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod aarch64;

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
        (0..n).map(|_| crate::testing::lcg(seed) * scale).collect()
    }

    /// Relative agreement with the scalar reference: different summation orders of n products of
    /// magnitude m differ by about n * eps * m, so compare against that scale, not exactly.
    fn close(a: f32, b: f32, n: usize, mag: f32) -> bool {
        (a - b).abs() <= 4.0 * n as f32 * f32::EPSILON * mag + 1e-6
    }

    #[test]
    fn every_isa_matches_scalar() {
        let mut seed = 42;
        for d in available() {
            for n in [0, 1, 7, 16, 31, 64, 100, 1024, 3072] {
                let a = rand_vec(n, &mut seed, 2.0);
                let b = rand_vec(n, &mut seed, 3.0);
                let (r, s) = ((d.f32)(&a, &b), dot_f32_scalar(&a, &b));
                assert!(close(r, s, n, 6.0), "{} f32 n={n}: {r} vs {s}", d.isa);
                let w: Vec<u16> = a.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                let (r, s) = ((d.bf16)(&w, &b), dot_bf16_scalar(&w, &b));
                assert!(close(r, s, n, 6.0), "{} bf16 n={n}: {r} vs {s}", d.isa);
            }
            for gs in [16, 32, 64, 96, 128] {
                for groups in [1, 3, 16] {
                    let n = gs * groups;
                    let a = rand_vec(n, &mut seed, 1.5);
                    let b = rand_vec(n, &mut seed, 4.0);
                    let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; groups]);
                    let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; groups]);
                    crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
                    (d.quantize_q8)(&b, gs, &mut qb, &mut sb);
                    // The SIMD quantizer must equal the reference bit for bit.
                    let (mut qr, mut sr) = (vec![0i8; n], vec![0f32; groups]);
                    crate::quant::quantize_q8(&b, gs, &mut qr, &mut sr);
                    assert_eq!(qb, qr, "{} quantize gs={gs}", d.isa);
                    assert_eq!(sb, sr, "{} quantize scales gs={gs}", d.isa);
                    let (r, s) = (
                        (d.q8_f32)(&qa, &sa, &b, gs),
                        dot_q8_f32_scalar(&qa, &sa, &b, gs),
                    );
                    assert!(close(r, s, n, 6.0), "{} q8_f32 gs={gs}: {r} vs {s}", d.isa);
                    let r = (d.q8)(&qa, &sa, &qb, &sb, gs);
                    let s = dot_q8_scalar(&qa, &sa, &qb, &sb, gs);
                    assert!(
                        close(r, s, groups, 6.0 * gs as f32),
                        "{} q8 gs={gs}: {r} vs {s}",
                        d.isa
                    );
                }
            }
        }
    }

    /// The bf16 rows product (a prompt's) gives every (row, token) the bits of that pair's dot
    /// product (decode's), over shapes that take each tile of the AVX-512 kernel and rows whose
    /// length 16 does not divide.
    #[test]
    fn bf16_rows_equal_their_dots() {
        let mut seed = 17;
        for d in available() {
            for (rows, t, cols) in [(1, 1, 16), (9, 7, 64), (4, 4, 1024), (6, 5, 48), (3, 3, 20)] {
                let w: Vec<u16> = rand_vec(rows * cols, &mut seed, 1.0)
                    .iter()
                    .map(|v| (v.to_bits() >> 16) as u16)
                    .collect();
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let mut out = vec![f32::NAN; rows * t];
                (d.bf16_rows)(&w, &x, t, &mut out);
                for r in 0..rows {
                    for i in 0..t {
                        let dot =
                            (d.bf16)(&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                        assert_eq!(
                            out[r * t + i].to_bits(),
                            dot.to_bits(),
                            "{} [{rows}x{cols}]x[{t}] ({r},{i})",
                            d.isa
                        );
                    }
                }
            }
        }
    }

    /// Every quantizer rounds exact ties to even, as the reference does: max|x| = 127 makes the
    /// scale exactly 1, so x / s = x.
    #[test]
    fn every_quantizer_rounds_ties_to_even() {
        let mut x = vec![0.0f32; 32];
        x[..8].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -2.5]);
        x[16..24].copy_from_slice(&[-127.0, 3.5, -3.5, 4.5, 0.25, -0.75, 100.5, 101.5]);
        let want: [i8; 16] = [
            127, 0, 2, 2, 0, -2, 126, -2, -127, 4, -4, 4, 0, -1, 100, 102,
        ];
        for d in available() {
            let (mut q, mut s) = (vec![0i8; 32], vec![0f32; 2]);
            (d.quantize_q8)(&x, 16, &mut q, &mut s);
            assert_eq!(s, [1.0, 1.0], "{}", d.isa);
            assert_eq!(&q[..8], &want[..8], "{}", d.isa);
            assert_eq!(&q[16..24], &want[8..], "{}", d.isa);
        }
    }

    /// `w` (`[rows, cols]`) packed as q4 or (`six`) q6 in groups of `gs`, with the kernel of
    /// `d` and the reference for that packing.
    fn packed(
        six: bool,
        w: &[f32],
        cols: usize,
        gs: usize,
        d: &Dots,
    ) -> (Vec<u8>, Vec<u16>, MatQ4, MatQ4) {
        let (p, ws, kernel, reference) = file_order(six, w, cols, gs, d);
        (
            interleaved::packed_for_kernels(d.q4_layout, six, &p, cols, gs),
            ws,
            kernel,
            reference,
        )
    }

    /// [`packed`] in the file's order, whatever the kernel reads.
    fn file_order(
        six: bool,
        w: &[f32],
        cols: usize,
        gs: usize,
        d: &Dots,
    ) -> (Vec<u8>, Vec<u16>, MatQ4, MatQ4) {
        let mut ws = vec![0u16; w.len() / gs];
        match six {
            true => {
                let mut p = vec![0u8; w.len() / 4 * 3];
                crate::quant::quantize_q6(w, cols, gs, &mut p, &mut ws);
                (p, ws, d.q6_rows, q6::mat_q6_scalar)
            }
            false => {
                let mut p = vec![0u8; w.len() / 2];
                crate::quant::quantize_q4(w, gs, &mut p, &mut ws);
                (p, ws, d.q4_rows, q4::mat_q4_scalar)
            }
        }
    }

    /// Every instruction set's q4 and q6 kernels against the scalar references (`q4.rs`,
    /// `q6.rs`), which are themselves checked against the dequantized product: group sizes the
    /// SIMD kernels take (32) and ones they hand back to the reference, rows of whole chunks
    /// and with a tail.
    #[test]
    fn q4_and_q6_rows_match_the_reference() {
        let mut seed = 9;
        for d in available() {
            for (six, gs) in [
                (false, 16),
                (false, 32),
                (false, 64),
                (false, 128),
                (true, 32),
                (true, 64),
                (true, 128),
            ] {
                let name = if six { "q6" } else { "q4" };
                for (rows, t, groups) in [
                    (1, 1, 3),
                    (3, 2, 1),
                    (5, 3, 17),
                    (2, 3, 2),
                    (3, 1, 32),
                    (2, 5, 22),
                    (2, 2, 7),
                    // The AVX2 kernel's prompt tiles of eight tokens, and 3, 4, 6 or 7 after.
                    (3, 11, 9),
                    (2, 12, 5),
                    (2, 14, 4),
                    (1, 15, 9),
                    // AVX-512's prompt tiles of two rows by four tokens and the smaller ones
                    // after, over blocks of 16 rows, rows of whole blocks of 16 groups and with a
                    // short block.
                    (37, 33, 17),
                    (16, 32, 8),
                    (19, 41, 7),
                    (3, 32, 9),
                    (5, 9, 32),
                    (3, 6, 48),
                ] {
                    let cols = gs * groups;
                    let w = rand_vec(rows * cols, &mut seed, 1.0);
                    let x = rand_vec(t * cols, &mut seed, 3.0);
                    let (p, ws, kernel, reference) = file_order(six, &w, cols, gs, &d);
                    let mut buf = ActsQ8Buf::default();
                    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout);
                    let (mut got, mut want) = (vec![f32::NAN; rows * t], vec![0f32; rows * t]);
                    kernel(
                        &interleaved::packed_for_kernels(d.q4_layout, six, &p, cols, gs),
                        &ws,
                        &acts,
                        &mut got,
                        0,
                    );
                    reference(&p, &ws, &acts, &mut want, 0);
                    for (k, (&r, &s)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            close(r, s, cols, 6.0),
                            "{} {name} gs={gs} [{k}]: {r} vs {s}",
                            d.isa
                        );
                    }
                }
            }
        }
    }

    /// Weights and activations at the ends of their ranges, where a kernel that sums products
    /// in 16 bits would overflow if it could: every stored weight at its top (q4 15, q6 63) or
    /// bottom (0) value, every activation at +127 or -127, for q4 and q6 and every instruction
    /// set. The sums are exact integers, `q * cols` with `q` the weight's level.
    #[test]
    fn q4_and_q6_rows_at_the_extremes() {
        let (gs, cols) = (32, 32 * 12);
        // A few rows and tokens (the step kernels), and a prompt's block (AVX-512's prompt
        // product).
        for (d, (rows, t)) in available()
            .into_iter()
            .flat_map(|d| [(d, (3, 2)), (d, (17, 33))])
        {
            for six in [false, true] {
                for byte in [0xffu8, 0x00] {
                    for sign in [1.0f32, -1.0] {
                        let len = match six {
                            true => rows * cols / 4 * 3,
                            false => rows * cols / 2,
                        };
                        let (p, ws) = (vec![byte; len], vec![0x3c00u16; rows * cols / gs]); // f16 1.0
                        let x = vec![sign; t * cols];
                        let mut buf = ActsQ8Buf::default();
                        let acts = buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout);
                        let (kernel, offset, top) = match six {
                            true => (d.q6_rows, 32.0, 63.0),
                            false => (d.q4_rows, 8.0, 15.0),
                        };
                        let level = if byte == 0 { -offset } else { top - offset };
                        let want = sign * level * cols as f32;
                        let mut got = vec![f32::NAN; rows * t];
                        kernel(&p, &ws, &acts, &mut got, 0);
                        for (k, &g) in got.iter().enumerate() {
                            assert!(
                                (g - want).abs() <= 1e-5 * want.abs(),
                                "{} six={six} byte={byte:#x} sign={sign} [{k}]: {g} vs {want}",
                                d.isa
                            );
                        }
                    }
                }
            }
        }
    }

    /// A SIMD q4 or q6 kernel handed activations in a layout other than its own panics, naming
    /// the layout, instead of reading the lanes wrong (or, for the AVX-512 and NEON kernels,
    /// past the end of the shorter `Pairs` arrays). The scalar references read the plain rows
    /// and take either.
    #[test]
    fn q4_kernels_refuse_a_foreign_layout() {
        let (rows, t, gs, cols) = (2, 3, 32, 256);
        let mut seed = 17;
        for d in available() {
            if matches!(d.isa, "scalar" | "neon") {
                continue; // their q4 and q6 products are the references
            }
            let other = match d.q4_layout {
                q4::Q4Layout::Halves | q4::Q4Layout::Interleaved => q4::Q4Layout::Pairs,
                q4::Q4Layout::Pairs => q4::Q4Layout::Halves,
            };
            for six in [false, true] {
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 1.0);
                let (p, ws, kernel, _) = packed(six, &w, cols, gs, &d);
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4_as(&x, t, cols, gs, other);
                let mut out = vec![0f32; rows * t];
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    kernel(&p, &ws, &acts, &mut out, 0)
                }));
                let msg = caught.expect_err("a foreign layout was accepted");
                // A formatted message is a String, a literal one a &str.
                let msg = match msg.downcast_ref::<&str>() {
                    Some(s) => s.to_string(),
                    None => msg.downcast_ref::<String>().cloned().unwrap_or_default(),
                };
                assert!(msg.contains("Q4Layout"), "{} six={six}: {msg}", d.isa);
            }
        }
    }

    /// The block kernel against one scalar dot product per (row, token), over shapes that take
    /// every tile of the AVX-512, AVX2 and NEON kernels (2 or 1 rows; 4, 3, 2 or 1 tokens) and every
    /// prefetch depth of their decode paths, and group sizes with one and several 64-byte
    /// chunks, a 32-byte tail (96), and ones a kernel does not handle itself (16, 32).
    #[test]
    fn q8_rows_matches_scalar_dots() {
        let mut seed = 7;
        for d in available() {
            for gs in [16, 32, 64, 96, 128] {
                for (rows, t, groups) in [
                    (1, 1, 3),
                    (3, 2, 1),
                    (2, 5, 17),
                    (5, 8, 2),
                    (3, 13, 20),
                    (4, 20, 16),
                    // Rows in several blocks of `for_each_tile`, the last one odd; tokens
                    // in a tile of 4 and one of 3.
                    (37, 7, 2),
                    // Decode over enough rows that the AVX-512 kernel takes each of its
                    // prefetch depths (32 KiB, 8 KiB, none) as the end of the rows nears.
                    (160, 1, 4),
                ] {
                    let cols = gs * groups;
                    let w = rand_vec(rows * cols, &mut seed, 1.0);
                    let x = rand_vec(t * cols, &mut seed, 3.0);
                    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                    crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                    let mut buf = ActsQ8Buf::default();
                    let acts = buf.quantize(&x, t, cols, gs);
                    let (xq, xs) = (acts.q, acts.scales);
                    let mut out = vec![f32::NAN; rows * t];
                    (d.q8_rows)(&wq, &ws, &acts, &mut out, 0);
                    // Prefetching further (as decode does when more rows follow) changes no
                    // value.
                    let mut ahead = vec![f32::NAN; rows * t];
                    (d.q8_rows)(&wq, &ws, &acts, &mut ahead, 1 << 20);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&ahead), bits(&out), "{} q8_rows ahead", d.isa);
                    let per = cols / gs;
                    for r in 0..rows {
                        let (w_r, ws_r) =
                            (&wq[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
                        for i in 0..t {
                            let (x_i, xs_i) =
                                (&xq[i * cols..(i + 1) * cols], &xs[i * per..(i + 1) * per]);
                            let want = dot_q8_scalar(w_r, ws_r, x_i, xs_i, gs);
                            let got = out[r * t + i];
                            if t == 1 {
                                // Decode: exactly the row's dot product.
                                let dot = (d.q8)(w_r, ws_r, x_i, xs_i, gs);
                                assert_eq!(got, dot, "{} decode gs={gs} row {r}", d.isa);
                            }
                            assert!(
                                close(got, want, groups, 3.0 * gs as f32),
                                "{} q8_rows gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) {got} vs {want}",
                                d.isa
                            );
                        }
                    }
                }
            }
        }
    }

    /// A prompt's tokens get the same bits from the block product (prefill) as one at a time
    /// (decode), so a prompt run in one pass leaves the same KV cache and logits as the same
    /// tokens run one by one (the parity tests check that end to end on tiny models).
    #[test]
    fn prefill_rows_equal_decode_rows() {
        let mut seed = 11;
        for d in available() {
            // 21 and 19 groups: a last block of 5 and of 3 groups, whose odd last group the
            // kernels of groups of 32 (q8_pairs.rs) add alone, into either accumulator.
            for (gs, groups) in [16, 32, 64, 128]
                .into_iter()
                .flat_map(|gs| [(gs, 21), (gs, 19)])
            {
                // Rows in three blocks of `for_each_tile`.
                let (rows, t, cols) = (39, 9, groups * gs);
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                let mut buf = ActsQ8Buf::default();
                let mut all = vec![f32::NAN; rows * t];
                (d.q8_rows)(&wq, &ws, &buf.quantize(&x, t, cols, gs), &mut all, 0);
                for i in 0..t {
                    let mut one = vec![f32::NAN; rows];
                    let acts = buf.quantize(&x[i * cols..(i + 1) * cols], 1, cols, gs);
                    (d.q8_rows)(&wq, &ws, &acts, &mut one, 0);
                    for r in 0..rows {
                        assert_eq!(
                            all[r * t + i].to_bits(),
                            one[r].to_bits(),
                            "{} gs={gs} row {r} token {i}",
                            d.isa
                        );
                    }
                }
            }
        }
    }

    /// The same for q4 and q6 weights, with rows of full chunks and a tail, and prefetching
    /// that reaches past the rows (as decode asks when more rows follow).
    #[test]
    fn q4_and_q6_prefill_rows_equal_decode_rows() {
        let mut seed = 13;
        for d in available() {
            for (six, groups) in [
                (false, 4),
                (false, 17),
                (false, 34),
                (true, 4),
                (true, 7),
                (true, 17),
                (true, 34),
            ] {
                let (rows, t, gs) = (39, 9, 32);
                let cols = groups * gs;
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let (p, ws, kernel, _) = packed(six, &w, cols, gs, &d);
                let mut buf = ActsQ8Buf::default();
                let mut all = vec![f32::NAN; rows * t];
                kernel(
                    &p,
                    &ws,
                    &buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout),
                    &mut all,
                    0,
                );
                for i in 0..t {
                    let mut one = vec![f32::NAN; rows];
                    let acts = buf.quantize_for_q4_as(
                        &x[i * cols..(i + 1) * cols],
                        1,
                        cols,
                        gs,
                        d.q4_layout,
                    );
                    kernel(&p, &ws, &acts, &mut one, 1 << 20);
                    for r in 0..rows {
                        assert_eq!(
                            all[r * t + i].to_bits(),
                            one[r].to_bits(),
                            "{} {} {groups} groups: row {r} token {i}",
                            d.isa,
                            if six { "q6" } else { "q4" }
                        );
                    }
                }
            }
        }
    }

    /// AVX-512's q8 kernel on interleaved weights (groups of 32 and 64) against one scalar dot
    /// product per (row, token), over shapes that take whole blocks of 16 groups and short ones,
    /// every tile (2 or 1 rows; 4, 3, 2 or 1 tokens), and prefetching past the rows; and a
    /// prompt's tokens get the bits each gets alone (decode).
    #[test]
    fn q8_interleaved_rows_match_scalar_dots() {
        let mut seed = 17;
        for d in available() {
            let Some(kernel) = d.q8_interleaved else {
                continue;
            };
            for gs in [32, 64] {
                for (rows, t, groups) in [
                    (1, 1, 3),
                    (3, 2, 16),
                    (2, 5, 17),
                    (5, 8, 2),
                    (5, 6, 17),
                    (3, 13, 20),
                    (37, 7, 35),
                    (160, 1, 4),
                ] {
                    let cols = gs * groups;
                    let w = rand_vec(rows * cols, &mut seed, 1.0);
                    let x = rand_vec(t * cols, &mut seed, 3.0);
                    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                    crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                    let wk = interleaved::q8_for_kernels(&d, &wq, cols, gs);
                    let layout = q4::Q4Layout::Interleaved;
                    let mut buf = ActsQ8Buf::default();
                    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, layout);
                    let mut out = vec![f32::NAN; rows * t];
                    kernel(&wk, &ws, &acts, &mut out, 1 << 20);
                    let per = cols / gs;
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for r in 0..rows {
                        let (w_r, ws_r) =
                            (&wq[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
                        for i in 0..t {
                            let want =
                                dot_q8_scalar(w_r, ws_r, acts.q_row(i), acts.scales_row(i), gs);
                            let got = out[r * t + i];
                            assert!(
                                close(got, want, groups, 3.0 * gs as f32),
                                "{} q8 interleaved gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) {got} vs {want}",
                                d.isa
                            );
                        }
                    }
                    let mut one_by_one = vec![f32::NAN; rows * t];
                    for i in 0..t {
                        let mut one = vec![f32::NAN; rows];
                        let x_i = &x[i * cols..(i + 1) * cols];
                        let acts = buf.quantize_for_q4_as(x_i, 1, cols, gs, layout);
                        kernel(&wk, &ws, &acts, &mut one, 0);
                        for r in 0..rows {
                            one_by_one[r * t + i] = one[r];
                        }
                    }
                    assert_eq!(
                        bits(&out),
                        bits(&one_by_one),
                        "{} q8 interleaved gs={gs} [{rows}x{cols}]x[{t}]: prompt vs decode",
                        d.isa
                    );
                }
            }
        }
    }

    #[test]
    fn q8_product_approximates_the_float_product() {
        // W8A8 error: each factor is within half a step of the truth, so the product of a group
        // is off by at most about (|w| * step_x + |x| * step_w) / 2 per element.
        let mut seed = 9;
        let (n, gs) = (1024, 64);
        let a = rand_vec(n, &mut seed, 1.0);
        let b = rand_vec(n, &mut seed, 1.0);
        let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; n / gs]);
        let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; n / gs]);
        crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
        crate::quant::quantize_q8(&b, gs, &mut qb, &mut sb);
        let exact: f32 = dot_f32_scalar(&a, &b);
        let approx = (dots().q8)(&qa, &sa, &qb, &sb, gs);
        let bound = n as f32 * (1.0 / 127.0);
        assert!((exact - approx).abs() < bound, "{exact} vs {approx}");
    }
}
