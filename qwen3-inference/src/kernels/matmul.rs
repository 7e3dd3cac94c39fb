//! `out = x @ w^T` for a batch of `t` activation rows and a weight matrix stored as f32, bf16,
//! q8, q4, q6 or a GGUF K-quant (the layout PyTorch's `nn.Linear` uses: `w` is
//! `[out_features, in_features]`, row-major).
//!
//! Each weight row is read once for all `t` tokens: with `t > 1` (prefill) this is a
//! matrix-matrix product, with `t = 1` (decode) a matrix-vector product. Threads split the output
//! rows, so each thread streams its own contiguous slice of the weights.

use super::dot::{dots, interleaved, k_quants, ActsQ8, ActsQ8Buf, Forms, MatQ8};
use super::team::Team;
use crate::format::view::TensorView;
use crate::format::DType;
use crate::quant::{Q4, Q6, Q8};

/// Output rows of the smallest part of a product a thread takes (team.rs): large enough that
/// claiming a part costs nothing next to its dot products, small enough that two cores stay
/// balanced on the smallest matrices. A prompt's part is these rows for every token.
const ROWS_PER_TASK: usize = 16;

/// `out[i, r] = sum_c x[i, c] * w[r, c]`.
///
/// `x: [t, cols]` row-major, `w: [rows, cols]`, `out: [t, rows]` row-major.
/// Panics if the slice lengths do not match the shapes (a bug in the caller, not bad input: the
/// model file's shapes were validated when it was opened).
pub fn matmul(out: &mut [f32], x: &[f32], w: &TensorView, t: usize) {
    matmuls([out], x, [w], t)
}

/// Several products of the same activations, `outs[k] = x @ ws[k]^T`, for matrices of the same
/// input width whose quantized ones share one group size (q/k/v, or gate/up, of one layer; in a
/// q4 file some may be q6 or q8; in a GGUF one may be f32 or bf16 beside quantized ones).
///
/// They run as one parallel pass over all their rows: the activations are quantized once, and
/// the threads meet once instead of after every matrix.
pub fn matmuls<const N: usize>(outs: [&mut [f32]; N], x: &[f32], ws: [&TensorView; N], t: usize) {
    let cols = ws[0].shape[1] as usize;
    assert_eq!(
        x.len(),
        t * cols,
        "matmul {}: x is not [{t}, {cols}]",
        ws[0].name
    );
    for (out, w) in outs.iter().zip(ws) {
        let rows = w.shape[0] as usize;
        assert_eq!(
            w.shape[1] as usize, cols,
            "matmul {}: not {cols} columns",
            w.name
        );
        assert_eq!(
            out.len(),
            t * rows,
            "matmul {}: out is not [{t}, {rows}]",
            w.name
        );
    }
    with_activations(x, t, cols, &ws, |acts| {
        if t == 1 {
            // Decode: `[1, rows]` and `[rows, 1]` are the same layout, so each part writes its
            // rows of an output directly and streams the matching rows of the matrix. The
            // decode team (team.rs) gives each thread a contiguous run of every output's parts,
            // and the job ends once, after the last matrix. The kernel may prefetch the weight
            // rows up to the end of the part's run (the rows its thread does next), no further.
            Team::current().split(outs, ROWS_PER_TASK, |k, r0, part, run_end| {
                fill_block(ws[k], x, acts, 1, r0, part, run_end - r0 - part.len())
            });
        } else {
            tokens(outs, x, ws, acts, t);
        }
    })
}

/// A product of several tokens: a prompt's, or a serving step's (one token per decoding
/// sequence). Like decode, it runs all `N` products as one job of the thread team (team.rs),
/// each part filling weight rows `r0 ..` for every token into a buffer in `[rows, t]` order (the
/// kernel's: each block of weight rows is read from memory once, then from the caches for the
/// other tokens), then writing them to their places in the `[t, rows]` output.
///
/// The parts write the output themselves, in parallel, while the block is still in their cache:
/// done on one thread after the job, the copy showed in a profile of a serving step, with the
/// other core waiting (the classifier alone is 151936 rows x 8 tokens; measured:
/// docs/performance.md, "A few rows: a serving step"). A prompt's products went through rayon's
/// loops (one per matrix, and one more for the copy) until the team took them too: a prompt of
/// 128 tokens of the 0.6B shape then ran about 7% faster on two threads of an AVX-512 Xeon and as
/// fast on one (docs/kernels.md, "Prompts on AVX-512"). A caller that finds the team busy with
/// another's job (the server's image tower beside the engine) runs the same parts on rayon's
/// loops instead of waiting (team.rs).
fn tokens<const N: usize>(
    outs: [&mut [f32]; N],
    x: &[f32],
    ws: [&TensorView; N],
    acts: Option<&ActsQ8>,
    t: usize,
) {
    let rows: [usize; N] = ws.map(|w| w.shape[0] as usize);
    let scatter = outs.map(|o| Scatter::new(o, t));
    TRANSPOSED.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.resize(rows.iter().sum::<usize>() * t, 0.0);
        // One `[rows[k], t]` part of the buffer per product.
        let mut rest: &mut [f32] = &mut buf;
        let parts: [&mut [f32]; N] = std::array::from_fn(|k| {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(rows[k] * t);
            rest = tail;
            mine
        });
        // Parts start on multiples of ROWS_PER_TASK * t values: on a weight row. The kernel may
        // prefetch up to the end of the part's run, as in decode.
        Team::current().split(parts, ROWS_PER_TASK * t, |k, start, part, run_end| {
            let rows_ahead = (run_end - start - part.len()) / t;
            fill_block(ws[k], x, acts, t, start / t, part, rows_ahead);
            // SAFETY: this part is weight rows `start / t ..` of product k, and `split` gives
            // every part distinct rows (see `Scatter`).
            unsafe { scatter[k].put_rows(start / t, part) }
        });
    })
}

/// Writes blocks of `[n, t]` values (weight row, then token) into their places in an `[t, rows]`
/// output, from the parts of a team job. The output stays mutably borrowed for the lifetime `'a`,
/// so nothing else reads or writes it meanwhile.
struct Scatter<'a> {
    ptr: *mut f32,
    rows: usize,
    t: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: `Scatter` writes through its pointer only in `put_rows`, whose callers guarantee
// that no two calls write the same rows; so threads sharing it never touch the same value.
unsafe impl Sync for Scatter<'_> {}

impl<'a> Scatter<'a> {
    fn new(out: &'a mut [f32], t: usize) -> Self {
        Scatter {
            ptr: out.as_mut_ptr(),
            rows: out.len() / t,
            t,
            _out: std::marker::PhantomData,
        }
    }

    /// `out[i, r0 + j] = block[j, i]` for the `n = block.len() / t` rows of `block`
    /// (transpose.rs).
    ///
    /// # Safety
    /// No other call on this `Scatter` may run at the same time for any of rows `r0 .. r0 + n`.
    unsafe fn put_rows(&self, r0: usize, block: &[f32]) {
        let (t, rows) = (self.t, self.rows);
        let n = block.len() / t;
        assert!(
            block.len() == n * t && r0 + n <= rows,
            "block outside the output"
        );
        // SAFETY: from column r0, the `[t, rows]` output holds t rows of `rows` values, of which
        // this block's n columns are inside (asserted above); no other thread writes columns
        // r0 .. r0 + n (the caller's promise), and the borrow in `_out` keeps everyone else away.
        unsafe { super::transpose::transpose_into(block, t, self.ptr.add(r0), rows) }
    }
}

/// `block: [n, t]` (weight row, then token): weight rows `r0 .. r0 + n` of `w` against the `t`
/// activation rows, `x` as f32 or, for q8 weights, as quantized in `acts`. `rows_ahead`: how
/// many weight rows after the block this thread reads next (see `MatQ8`'s `ahead`).
fn fill_block(
    w: &TensorView,
    x: &[f32],
    acts: Option<&ActsQ8>,
    t: usize,
    r0: usize,
    block: &mut [f32],
    rows_ahead: usize,
) {
    let cols = w.shape[1] as usize;
    let n = block.len() / t;
    let dots = dots();
    let acts = || acts.expect("quantized weights without quantized activations");
    match w.data.dtype() {
        DType::F32 => {
            let v = w.data.f32();
            for (j, outs) in block.chunks_exact_mut(t).enumerate() {
                let w_r = &v[(r0 + j) * cols..(r0 + j + 1) * cols];
                for (i, o) in outs.iter_mut().enumerate() {
                    *o = (dots.f32)(w_r, &x[i * cols..(i + 1) * cols]);
                }
            }
        }
        DType::Bf16 => {
            let v = w.data.bf16();
            (dots.bf16_rows)(&v[r0 * cols..(r0 + n) * cols], &x[..t * cols], t, block);
        }
        DType::Q8 => {
            let gs = w.data.group_size().expect("q8 has groups");
            let per = cols / gs;
            let (kernel, q, scales) = match q8_interleaved(w) {
                Some(interleaved) => interleaved,
                None => {
                    let Q8 { q, scales, .. } = w.data.q8();
                    (dots.q8_rows, q, scales)
                }
            };
            kernel(
                &q[r0 * cols..(r0 + n) * cols],
                &scales[r0 * per..(r0 + n) * per],
                acts(),
                block,
                rows_ahead * cols,
            );
        }
        DType::Q4 => {
            let gs = w.data.group_size().expect("q4 has groups");
            let per = cols / gs;
            let (packed, scales) = in_kernel_order(w, gs, || {
                let Q4 { packed, scales, .. } = w.data.q4();
                (packed, scales)
            });
            (dots.q4_rows)(
                &packed[r0 * cols / 2..(r0 + n) * cols / 2],
                &scales[r0 * per..(r0 + n) * per],
                acts(),
                block,
                rows_ahead * cols / 2,
            );
        }
        DType::Q6 => {
            let gs = w.data.group_size().expect("q6 has groups");
            let (per, row_bytes) = (cols / gs, cols / 4 * 3);
            let (packed, scales) = in_kernel_order(w, gs, || {
                let Q6 { packed, scales, .. } = w.data.q6();
                (packed, scales)
            });
            (dots.q6_rows)(
                &packed[r0 * row_bytes..(r0 + n) * row_bytes],
                &scales[r0 * per..(r0 + n) * per],
                acts(),
                block,
                rows_ahead * row_bytes,
            );
        }
        // GGUF's K-quants, their blocks where the file holds them (`dot/k_quants.rs`).
        DType::K(_) => {
            let (kind, blocks) = w.data.k_quant();
            let row = kind.row_bytes(cols);
            // AVX-512 reads Q4_K and Q6_K in an interleaved order, AVX2 in another, a copy
            // made at load (`dot/k_interleaved.rs`); a view without it is read where the file
            // holds it. A part starts on a multiple of 16 rows (ROWS_PER_TASK), so on a set of
            // AVX2's eight.
            let (kernel, blocks) = match (dots.k_interleaved, w.interleaved) {
                (Some((_, kernel)), Some(i)) if i.dtype() == w.data.dtype() => {
                    (kernel, i.k_quant().1)
                }
                _ => (dots.k_rows, blocks),
            };
            kernel(
                kind,
                &blocks[r0 * row..(r0 + n) * row],
                acts(),
                block,
                rows_ahead * row,
            );
        }
    }
}

/// A q4 or q6 matrix's values and scales in the order this CPU's kernels read: the file's, or on
/// AVX-512 for groups of 32 the interleaved copy made at load (`dot/interleaved.rs`,
/// `Model::load`). Panics when the kernels read the interleaved order and the view has no such
/// copy (a view that did not come from `Model::load`: a caller's bug, which would otherwise read
/// the weights wrong).
fn in_kernel_order<'a>(
    w: &TensorView<'a>,
    gs: usize,
    file: impl FnOnce() -> (&'a [u8], &'a [u16]),
) -> (&'a [u8], &'a [u16]) {
    if !(dots().q4_layout.interleaves() && interleaved::interleaves(gs)) {
        return file();
    }
    match w.interleaved.map(|i| (i.dtype(), i)) {
        Some((DType::Q4, i)) => {
            let Q4 { packed, scales, .. } = i.q4();
            (packed, scales)
        }
        Some((DType::Q6, i)) => {
            let Q6 { packed, scales, .. } = i.q6();
            (packed, scales)
        }
        _ => panic!(
            "matmul {}: the AVX-512 kernels read q4 and q6 weights interleaved, and this view has \
             no interleaved copy (load the model with Model::load)",
            w.name
        ),
    }
}

/// A q8 matrix's kernel for the interleaved order and its values and scales in that order,
/// where this CPU has the kernel (AVX-512) and the view the copy `Model::load` makes (groups of
/// 32 or 64, `dot/interleaved.rs`; or a GGUF's Q8_0 laid out in that order at open,
/// `format::Reader::Interleaved`). `None` otherwise: q8, unlike q4, has kernels for the file's
/// order everywhere, so a view without that order (a matrix made by hand, a GGUF's Q8_0
/// opened for any reader) is read as it is, only slower.
fn q8_interleaved<'a>(w: &TensorView<'a>) -> Option<(MatQ8, &'a [i8], &'a [f32])> {
    match (dots().q8_interleaved, w.interleaved) {
        (Some(kernel), Some(i)) if i.dtype() == DType::Q8 => {
            let Q8 { q, scales, .. } = i.q8();
            Some((kernel, q, scales))
        }
        _ => None,
    }
}

/// Runs `f` with the activations quantized for the q8, q4, q6 or K-quant weights among `ws`
/// (`None` when every one is f32 or bf16).
///
/// W8A8: each activation row is quantized once, per group of `gs` like the weights (quant/q8.rs),
/// so every group's product is an integer dot product times two scales:
/// `sum_g ws[r,g] * xs[i,g] * sum_{c in g} q_w[r,c] * q_x[i,c]`. The activation rounding adds an
/// error of the same size as the weights' (half a step of the group's largest value); the
/// parity tests bound the total against HuggingFace.
fn with_activations<R>(
    x: &[f32],
    t: usize,
    cols: usize,
    ws: &[&TensorView],
    f: impl FnOnce(Option<&ActsQ8>) -> R,
) -> R {
    // A K-quant's kernels read their own quantization of `x`, one scale a block of 256 as
    // llama.cpp's Q8_K (`dot/k_quants.rs`); the plain one beside it is made in groups of 32, the
    // size of the GGUF's other quantized types (Q8_0, Q4_0) that may share its input.
    let group = |w: &TensorView| match w.data.dtype() {
        DType::K(_) => Some(k_quants::GROUP),
        _ => w.data.group_size(),
    };
    // An f32 or bf16 matrix reads `x` as it is, beside quantized ones that share its input (a
    // GGUF may keep one matrix of a layer in BF16); the quantized ones need one group size.
    let Some(gs) = ws.iter().find_map(|w| group(w)) else {
        return f(None);
    };
    for w in ws {
        assert!(
            group(w).is_none_or(|g| g == gs),
            "matmuls: {} is not quantized with activations in groups of {gs}",
            w.name
        );
    }
    // q4 and q6 kernels read the activations rearranged (dot/q4.rs); q8 kernels on
    // interleaved weights (AVX-512's) or reordering a prompt's weights as they read them
    // (AVX2's, in groups of 32 and 64) in the interleaved order (dot/interleaved.rs); the
    // K-quants their own, per block of 256 (dot/k_quants.rs). A GGUF may mix them in one
    // layer's products.
    let q4 = ws
        .iter()
        .any(|w| matches!(w.data.dtype(), DType::Q4 | DType::Q6));
    let reorders = dots()
        .q8_rows_lay_out
        .is_some_and(|from| interleaved::interleaves_q8(gs) && t >= from(gs));
    let q8 = ws
        .iter()
        .any(|w| q8_interleaved(w).is_some() || (reorders && w.data.dtype() == DType::Q8));
    let k = ws.iter().any(|w| w.data.dtype().is_k_quant());
    ACTIVATIONS.with(|cell| {
        let mut buf = cell.borrow_mut();
        let acts = buf.quantize_for_weights(x, t, cols, gs, Forms { q4, q8, k });
        f(Some(&acts))
    })
}

thread_local! {
    /// The quantized activations of the q8 path, kept between calls.
    static ACTIVATIONS: std::cell::RefCell<ActsQ8Buf> = std::cell::RefCell::new(ActsQ8Buf::default());
}

thread_local! {
    /// A product's results in `[rows, t]` order before they are written into `out`.
    static TRANSPOSED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::view::TensorData;
    use crate::quant::{dequantize_q8, quantize_q8};

    use crate::testing::lcg;

    /// Naive reference in f64: dequantize the weight to f32 first, then a plain dot product.
    fn reference(x: &[f32], w: &[f32], t: usize, rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0f32; t * rows];
        for i in 0..t {
            for r in 0..rows {
                out[i * rows + r] = (0..cols)
                    .map(|c| x[i * cols + c] as f64 * w[r * cols + c] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    fn check(t: usize, rows: usize, cols: usize) {
        let mut seed = (t * 1000 + rows * 10 + cols) as u64;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..t * cols).map(|_| lcg(&mut seed)).collect();
        let shape = [rows as u64, cols as u64];
        let close = |got: &[f32], want: &[f32], what: &str| {
            for (k, (a, b)) in got.iter().zip(want).enumerate() {
                // f32 sums of `cols` products of values in [-1, 1]: error well under 1e-5 * cols.
                assert!(
                    (a - b).abs() <= 1e-6 * cols as f32,
                    "{what} [{k}]: {a} vs {b}"
                );
            }
        };

        // f32
        let view = TensorView {
            name: "w",
            shape: &shape,
            data: TensorData::from_f32(&w),
            interleaved: None,
        };
        let mut out = vec![0f32; t * rows];
        matmul(&mut out, &x, &view, t);
        close(&out, &reference(&x, &w, t, rows, cols), "f32");

        // bf16: truncate the weights to bf16, the reference uses the same rounded values.
        let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let w_bf: Vec<f32> = bits
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect();
        let view = TensorView {
            name: "w",
            shape: &shape,
            data: TensorData::from_bf16(&bits),
            interleaved: None,
        };
        matmul(&mut out, &x, &view, t);
        close(&out, &reference(&x, &w_bf, t, rows, cols), "bf16");

        // q8 (W8A8): the reference multiplies the dequantized weights by the dequantized
        // activations, each activation row quantized per group exactly as the weights are.
        // Group sizes that divide `cols` (the model file guarantees this for real tensors).
        for gs in [8, 16, 64]
            .into_iter()
            .filter(|gs| (cols / gs) * gs == cols)
        {
            let mut q = vec![0i8; w.len()];
            let mut s = vec![0f32; w.len() / gs];
            quantize_q8(&w, gs, &mut q, &mut s);
            let mut w_q = vec![0f32; w.len()];
            dequantize_q8(&q, &s, gs, &mut w_q);
            let view = TensorView {
                name: "w",
                shape: &shape,
                data: TensorData::from(Q8 {
                    q: &q,
                    scales: &s,
                    group_size: gs,
                }),
                interleaved: None,
            };
            let mut x_q = vec![0f32; x.len()];
            for (row, out_row) in x.chunks(cols).zip(x_q.chunks_mut(cols)) {
                let (mut qx, mut sx) = (vec![0i8; cols], vec![0f32; cols / gs]);
                quantize_q8(row, gs, &mut qx, &mut sx);
                dequantize_q8(&qx, &sx, gs, out_row);
            }
            matmul(&mut out, &x, &view, t);
            close(&out, &reference(&x_q, &w_q, t, rows, cols), "q8");
        }
    }

    #[test]
    fn matches_dequantize_then_dot() {
        // Odd sizes exercise the lane remainders and a partial last task; 16 and 37 tokens, one
        // and several (the last partial) blocks of tokens copied back from `[rows, t]`.
        for (t, rows, cols) in [
            (1, 37, 48),
            (3, 37, 48),
            (1, 5, 13),
            (5, 70, 32),
            (2, 16, 80),
            (6, 9, 128),
            (16, 20, 64),
            (37, 53, 64),
        ] {
            check(t, rows, cols);
        }
    }

    /// A Q4_K or Q6_K matrix in this CPU's own order (`for_kernels`: AVX-512's groups side by
    /// side, AVX2's eight rows) gives the file order's products within f32 rounding through
    /// the matrix product, whose parts the threads take from multiples of 16 rows (40 rows: two
    /// whole parts and a short one), for decode and for prompts.
    #[test]
    fn k_quants_in_the_kernels_order_match_the_files() {
        use crate::format::KQuant;
        use crate::kernels::dot::interleaved::for_kernels;
        let (cols, rows) = (512usize, 40usize);
        let mut seed = 21;
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            let b =
                crate::kernels::dot::k_quants::tests::blocks(kind, rows * cols / 256, &mut seed);
            let shape = [rows as u64, cols as u64];
            let file = TensorView {
                name: "w",
                shape: &shape,
                data: TensorData::from_k_quant(kind, &b),
                interleaved: None,
            };
            // A CPU whose kernels read the file's order (NEON) has nothing to compare.
            let Some(own) = for_kernels(&file.data, cols) else {
                continue;
            };
            let view = TensorView {
                interleaved: Some(own.data()),
                ..file
            };
            for t in [1, 5, 20] {
                let x: Vec<f32> = (0..t * cols).map(|_| lcg(&mut seed)).collect();
                let (mut want, mut got) = (vec![0f32; t * rows], vec![0f32; t * rows]);
                matmul(&mut want, &x, &file, t);
                matmul(&mut got, &x, &view, t);
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                        "{kind:?}, t = {t}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// A GGUF mixes types in one layer's products (a Q4_0 file's q/k/v in q4 beside a Q6_K
    /// matrix; a Q4_K_M's Q4_K beside Q8_0 fallbacks): one pass over such a mix, whose
    /// activations carry both q4's layout and the K-quants' sums, gives exactly what separate
    /// calls give, for decode and for prompts.
    #[test]
    fn mixed_products_equal_separate_products() {
        use crate::format::KQuant;
        use crate::kernels::dot::{
            dots, interleaved::packed_for_kernels, interleaved::q8_for_kernels,
        };
        use crate::quant::quantize_q4;
        let (cols, rows) = (256usize, 24usize);
        let mut seed = 12;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        // q4 in groups of 32, in the order this CPU's kernels read (interleaved on AVX-512).
        let (mut p, mut sc) = (vec![0u8; w.len() / 2], vec![0u16; w.len() / 32]);
        quantize_q4(&w, 32, &mut p, &mut sc);
        let p_kernel = packed_for_kernels(dots().q4_layout, false, &p, cols, 32);
        // q8 in groups of 32, in the file's order, and in groups of 32 and 64 in the order
        // this CPU's kernels read as well (interleaved on AVX-512; a view carries both).
        let (mut q, mut s) = (vec![0i8; w.len()], vec![0f32; w.len() / 32]);
        quantize_q8(&w, 32, &mut q, &mut s);
        let q_kernel = q8_for_kernels(dots(), &q, cols, 32);
        let (mut q64, mut s64) = (vec![0i8; w.len()], vec![0f32; w.len() / 64]);
        quantize_q8(&w, 64, &mut q64, &mut s64);
        let q64_kernel = q8_for_kernels(dots(), &q64, cols, 64);
        // Q4_K, Q5_K and Q6_K blocks: random bytes, each block's f16 scales set finite.
        let mut k_blocks = |bytes: usize, scales: &[usize]| -> Vec<u8> {
            let mut b: Vec<u8> = (0..rows * bytes)
                .map(|_| (lcg(&mut seed) * 1e4) as i64 as u8)
                .collect();
            for block in b.chunks_exact_mut(bytes) {
                for &at in scales {
                    let v = half::f16::from_f32(0.01 * lcg(&mut seed));
                    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            b
        };
        let (q4k, q5k) = (k_blocks(144, &[0, 2]), k_blocks(176, &[0, 2]));
        let q6k = k_blocks(210, &[208]);
        let shape = [rows as u64, cols as u64];
        let view = |data| TensorView {
            name: "w",
            shape: &shape,
            data,
            interleaved: None,
        };
        let q4_view = TensorView {
            interleaved: Some(TensorData::from(Q4 {
                packed: &p_kernel,
                scales: &sc,
                group_size: 32,
            })),
            ..view(TensorData::from(Q4 {
                packed: &p,
                scales: &sc,
                group_size: 32,
            }))
        };
        let q8_view = view(TensorData::from(Q8 {
            q: &q,
            scales: &s,
            group_size: 32,
        }));
        let q8_32_view = TensorView {
            interleaved: Some(TensorData::from(Q8 {
                q: &q_kernel,
                scales: &s,
                group_size: 32,
            })),
            ..q8_view
        };
        let q8_64_file_view = view(TensorData::from(Q8 {
            q: &q64,
            scales: &s64,
            group_size: 64,
        }));
        let q8_64_view = TensorView {
            interleaved: Some(TensorData::from(Q8 {
                q: &q64_kernel,
                scales: &s64,
                group_size: 64,
            })),
            ..q8_64_file_view
        };
        let (q4k_view, q5k_view, q6k_view) = (
            view(TensorData::from_k_quant(KQuant::Q4K, &q4k)),
            view(TensorData::from_k_quant(KQuant::Q5K, &q5k)),
            view(TensorData::from_k_quant(KQuant::Q6K, &q6k)),
        );
        // 9 and 17 tokens: a prompt's products (AVX2 reorders q8 weights in groups of 32 from
        // 8 tokens, of 64 from 16).
        for t in [1, 3, 9, 17] {
            let x: Vec<f32> = (0..t * cols).map(|_| lcg(&mut seed)).collect();
            for mix in [
                [&q4_view, &q6k_view, &q4k_view],
                [&q8_view, &q5k_view, &q6k_view],
                // One pass shares one group size's activations.
                [&q4_view, &q8_32_view, &q8_view],
                [&q8_64_view, &q8_64_file_view, &q8_64_view],
            ] {
                let mut sep = vec![vec![0f32; t * rows]; 3];
                for (out, w) in sep.iter_mut().zip(mix) {
                    matmul(out, &x, w, t);
                }
                let mut fused = vec![vec![f32::NAN; t * rows]; 3];
                let [a, b, c] = &mut fused[..] else {
                    unreachable!()
                };
                matmuls([a, b, c], &x, mix, t);
                assert_eq!(fused, sep, "t = {t}");
            }
        }
    }

    /// Three products in one pass give exactly what three separate calls give (same kernels,
    /// same quantized activations), for decode and for a prompt.
    #[test]
    fn matmuls_equal_separate_products() {
        let (cols, gs) = (128, 64);
        let mut seed = 11;
        let shapes = [[40u64, cols], [16, cols], [16, cols]];
        let ws: Vec<(Vec<i8>, Vec<f32>)> = shapes
            .iter()
            .map(|s| {
                let w: Vec<f32> = (0..s[0] * s[1]).map(|_| lcg(&mut seed)).collect();
                let (mut q, mut sc) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                quantize_q8(&w, gs, &mut q, &mut sc);
                (q, sc)
            })
            .collect();
        let views: Vec<TensorView> = ws
            .iter()
            .zip(&shapes)
            .map(|((q, sc), shape)| TensorView {
                name: "w",
                shape,
                data: TensorData::from(Q8 {
                    q,
                    scales: sc,
                    group_size: gs,
                }),
                interleaved: None,
            })
            .collect();
        // 9 and 17 tokens: a prompt's products (AVX2 reorders q8 weights in groups of 32 from
        // 8 tokens, of 64 from 16).
        for t in [1, 3, 9, 17] {
            let x: Vec<f32> = (0..t * cols as usize).map(|_| lcg(&mut seed)).collect();
            let mut sep: Vec<Vec<f32>> = shapes
                .iter()
                .map(|s| vec![0.0; t * s[0] as usize])
                .collect();
            for (out, w) in sep.iter_mut().zip(&views) {
                matmul(out, &x, w, t);
            }
            let mut fused: Vec<Vec<f32>> = shapes
                .iter()
                .map(|s| vec![f32::NAN; t * s[0] as usize])
                .collect();
            let [a, b, c] = &mut fused[..] else {
                unreachable!()
            };
            matmuls([a, b, c], &x, [&views[0], &views[1], &views[2]], t);
            assert_eq!(fused, sep, "t = {t}");
        }
    }
}
