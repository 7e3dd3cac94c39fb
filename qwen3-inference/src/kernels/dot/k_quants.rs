//! GGUF's K-quants (Q4_K, Q5_K, Q6_K) against q8 activations: the scalar reference, reading the
//! blocks where the GGUF holds them (`gguf/blocks.rs` draws each). A block is 256 weights whose
//! sub-blocks each have a small integer scale that the block's f16 `d` multiplies:
//!
//! ```text
//! Q4_K  sub-blocks of 32:  w = (d * sc) * q - dmin * m       q in 0..=15, sc and m in 0..=63
//! Q5_K  the same with a fifth bit:                          q in 0..=31
//! Q6_K  sub-blocks of 16:  w = (d * sc) * q                  q in -32..=31, sc an int8
//! ```
//!
//! The activations are quantized per block of 256 as well, one scale `xs` a block (llama.cpp's
//! Q8_K), so that a block's sub-blocks meet one activation scale and their products add up as
//! integers before any float operation:
//!
//! ```text
//! sum_l w_l x_l = xs * (d * sum_i sc_i sum_l q_l qx_l  -  dmin * sum_i m_i sum_l qx_l)
//! ```
//!
//! (Q6_K: the first term only.) Each block adds one rounded term to the row's f32 sum, where
//! activations in groups of 32 (q8's and q4's) would take a float multiply-add a sub-block: the
//! SIMD kernels (`x86/k_quants.rs`) keep a block's sums in integer lanes and convert them once.
//! The weights are the GGUF's, bit for bit (`blocks.rs` is checked against gguf-py); the
//! activations are rounded as llama.cpp rounds them, to the step of their block's largest value.

use super::ActsQ8;
use crate::format::KQuant;
use crate::gguf::blocks::{q4_k_nibble, q6_k_int, q6_k_parts, scale_min};
use half::f16;

/// Weights a block holds, and activations a scale covers.
pub const BLOCK: usize = crate::format::K_BLOCK as usize;
/// Values of a Q4_K sub-block (two of Q6_K's): the AVX2 kernels' pairs and the minimums' sums
/// go by it.
pub const GROUP: usize = 32;

/// Row `w` (whole Q4_K blocks, or with `FIVE` Q5_K ones) against one activation row (`x` its
/// int8 values, `xs` its scales, one a block).
pub fn dot_q4_k_scalar<const FIVE: bool>(w: &[u8], x: &[i8], xs: &[f32]) -> f32 {
    let bytes = match FIVE {
        true => KQuant::Q5K.block_bytes(),
        false => KQuant::Q4K.block_bytes(),
    };
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(bytes).enumerate() {
        let f16_at = |at: usize| f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
        let (d, dmin, scales) = (f16_at(0), f16_at(2), &block[4..16]);
        // Q5_K: 32 bytes of fifth bits (bit i of byte l: value l of sub-block i) before the
        // nibbles.
        let (qh, qs) = match FIVE {
            true => (&block[16..48], &block[48..]),
            false => (&block[0..0], &block[16..]),
        };
        // The block's two integer sums: the scaled products and the minimums' (at most
        // 8 * 63 * 32 * 31 * 128 in magnitude: an i32).
        let (mut dots, mut mins) = (0i32, 0i32);
        for i in 0..BLOCK / GROUP {
            let xg = &x[b * BLOCK + i * GROUP..][..GROUP];
            let (mut dot, mut xsum) = (0i32, 0i32);
            for (l, &xv) in xg.iter().enumerate() {
                let mut q = q4_k_nibble(qs, i, l) as i32;
                if FIVE {
                    q |= (((qh[l] >> i) & 1) as i32) << 4;
                }
                dot += q * xv as i32;
                xsum += xv as i32;
            }
            let (sc, m) = scale_min(scales, i);
            dots += sc as i32 * dot;
            mins += m as i32 * xsum;
        }
        sum += xs[b] * (d * dots as f32 - dmin * mins as f32);
    }
    sum
}

/// Row `w` (whole Q6_K blocks) against one activation row, as [`dot_q4_k_scalar`].
pub fn dot_q6_k_scalar(w: &[u8], x: &[i8], xs: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(KQuant::Q6K.block_bytes()).enumerate() {
        let (ql, qh, scales, d) = q6_k_parts(block);
        // At most 16 * 128 * 16 * 32 * 128 in magnitude: an i32.
        let dots: i32 = scales
            .iter()
            .enumerate()
            .map(|(s, &sc)| {
                let dot: i32 = (16 * s..16 * s + 16)
                    .map(|v| q6_k_int(ql, qh, v) * x[b * BLOCK + v] as i32)
                    .sum();
                sc as i8 as i32 * dot
            })
            .sum();
        sum += xs[b] * (d * dots as f32);
    }
    sum
}

/// The activations of a K-quant product: quantized per block of [`BLOCK`] (`q`, `scales`), the
/// sums of each 16 values (`sums16`, which Q4_K's minimums and Q6_K's offset of 32 take), and
/// the same values in the orders the AVX2 kernels read (`x86/k_quants.rs`), made once when they
/// are quantized, so that two groups of 32 whose weights share their bytes cost one widening
/// instead of two. Those pairs are Q4_K's (and Q5_K's) sub-blocks `2p` and `2p + 1` (the low
/// and high nibbles of the same 32 bytes), and Q6_K's groups `4m + c` and `4m + c + 2`, `c` 0 or
/// 1 (the low and high nibbles of its `ql` bytes).
///
/// The kernel takes the 32 bytes `v` a pair shares and makes two vectors of weights, each 32-bit
/// lane holding four values of one group: `A`, lane `l` shifted right by 0 (even `l`: the low
/// nibbles, the pair's first group) or 4 (odd `l`: the high ones, its second), and `B`, the same
/// after swapping neighbouring lanes. Lane `l` of both then holds the first group (even) or the
/// second (odd), so their byte products add up in 16 bits before one `vpmaddwd`:
///
/// ```text
/// lane l of   A                          B
/// even l      first group,  values 4l..  first group,  values 4(l + 1)..
/// odd l       second group, values 4l..  second group, values 4(l - 1)..
/// ```
///
/// `x` (Q4_K's pairs) and `x6` (Q6_K's) hold each pair's 64 activations in that order (32 for
/// `A`, then 32 for `B`), pair after pair; `mins` each group of 32's `xs sum(qx)`, the factor of
/// its Q4_K sub-block's minimum.
///
/// For the AVX-512 kernels on weights in the interleaved order (`k_interleaved.rs`): `xi`, the
/// values in that order (`interleaved::lay_out`'s, in groups of 32); `xs32`, each group's scale
/// (its block's); `corr6`, the correction of Q6_K's offset, `-32 sum(qx)` a sub-block of 16,
/// each interleaved block's first sub-blocks (`2l`, lane `l`) and then its second ones.
#[derive(Default, Clone, Copy)]
pub struct ActsK<'a> {
    /// `[t, cols]`: the int8 values, in order.
    pub q: &'a [i8],
    /// `[t, cols / 256]`: their scales, one a block.
    pub scales: &'a [f32],
    /// `[t, cols / 16]`: the sums of each 16 values (at most 16 * 127 in magnitude).
    pub sums16: &'a [i16],
    /// `[t, cols]`
    pub x: &'a [i8],
    /// `[t, cols]`
    pub x6: &'a [i8],
    /// `[t, cols / 32]`
    pub mins: &'a [f32],
    /// `[t, cols]`
    pub xi: &'a [i8],
    /// `[t, cols / 32]`
    pub xs32: &'a [f32],
    /// `[t, cols / 16]`
    pub corr6: &'a [i32],
}

/// The buffers behind an [`ActsK`], reused from one product to the next.
#[derive(Default)]
pub struct ActsKBuf {
    q: Vec<i8>,
    scales: Vec<f32>,
    sums16: Vec<i16>,
    x: Vec<i8>,
    x6: Vec<i8>,
    mins: Vec<f32>,
    xi: Vec<i8>,
    xs32: Vec<f32>,
    corr6: Vec<i32>,
}

impl ActsKBuf {
    /// Quantizes `x: [t, cols]` per block of [`BLOCK`] with `quantize` (the q8 rule, one scale
    /// a block) and makes the other forms [`ActsK`] holds; those of the interleaved order
    /// (`xi`, `xs32`, `corr6`) only where `interleaved` (else they are empty).
    pub fn quantize(
        &mut self,
        x: &[f32],
        t: usize,
        cols: usize,
        quantize: super::QuantizeQ8,
        interleaved: bool,
    ) -> ActsK<'_> {
        assert!(cols.is_multiple_of(BLOCK) && x.len() == t * cols);
        // Every form from a cache line's start (`acts::aligned`): the kernels load them a
        // vector at a time.
        use super::acts::aligned;
        let at = aligned(&mut self.q, t * cols);
        let q = &mut self.q[at..at + t * cols];
        let at = aligned(&mut self.scales, t * cols / BLOCK);
        let scales = &mut self.scales[at..at + t * cols / BLOCK];
        quantize(x, BLOCK, q, scales);
        let (q, scales) = (&*q, &*scales);
        // At most 16 * 127 in magnitude: an i16.
        let sum = |c: &[i8]| c.iter().fold(0i16, |s, &v| s + v as i16);
        let at = aligned(&mut self.sums16, t * cols / 16);
        let sums16 = at..at + t * cols / 16;
        for (s, c) in self.sums16[sums16.clone()]
            .iter_mut()
            .zip(q.chunks_exact(16))
        {
            *s = sum(c);
        }
        // Pair k's groups: Q4_K's 2k and 2k + 1; Q6_K's 4m + c and 4m + c + 2 (k = 2m + c).
        let at = aligned(&mut self.x, t * cols);
        let xr = at..at + t * cols;
        lay_out_pairs(q, |k| (2 * k, 2 * k + 1), &mut self.x[xr.clone()]);
        let q6 = |k: usize| (4 * (k / 2) + k % 2, 4 * (k / 2) + k % 2 + 2);
        let at = aligned(&mut self.x6, t * cols);
        let x6 = at..at + t * cols;
        lay_out_pairs(q, q6, &mut self.x6[x6.clone()]);
        // Each group of 32's `xs sum(qx)`, the factor of a Q4_K sub-block's minimum.
        let sums = self.sums16[sums16.clone()].chunks_exact(2).enumerate();
        let at = aligned(&mut self.mins, t * cols / GROUP);
        for (m, (g, two)) in self.mins[at..].iter_mut().zip(sums) {
            *m = scales[g * GROUP / BLOCK] * (two[0] as i32 + two[1] as i32) as f32;
        }
        let mins = at..at + t * cols / GROUP;
        // The interleaved kernels' forms, row by row (an interleaved block lies within a row).
        let groups = cols / GROUP;
        let (xi, xs32, corr6) = match interleaved {
            true => (q.len(), t * groups, t * cols / 16),
            false => (0, 0, 0),
        };
        let at = aligned(&mut self.xi, xi);
        let xi = at..at + xi;
        for (src, dst) in q
            .chunks_exact(cols)
            .zip(self.xi[xi.clone()].chunks_exact_mut(cols))
        {
            let (src, dst) = (bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst));
            super::interleaved::interleave_words(src, GROUP, dst);
        }
        let at = aligned(&mut self.xs32, xs32);
        for (g, v) in self.xs32[at..at + xs32].iter_mut().enumerate() {
            *v = scales[g * GROUP / BLOCK];
        }
        let xs32 = at..at + xs32;
        // (Without them the loops above and below go over nothing.)
        let at = aligned(&mut self.corr6, corr6);
        let corr6 = at..at + corr6;
        for (sums, corr) in self.sums16[sums16.clone()]
            .chunks_exact(cols / 16)
            .zip(self.corr6[corr6.clone()].chunks_exact_mut(cols / 16))
        {
            for (g0, n) in super::interleaved::blocks(groups) {
                for l in 0..n {
                    for half in 0..2 {
                        corr[2 * g0 + half * n + l] = -32 * sums[2 * (g0 + l) + half] as i32;
                    }
                }
            }
        }
        ActsK {
            q,
            scales,
            sums16: &self.sums16[sums16],
            x: &self.x[xr],
            x6: &self.x6[x6],
            mins: &self.mins[mins],
            xi: &self.xi[xi],
            xs32: &self.xs32[xs32],
            corr6: &self.corr6[corr6],
        }
    }
}

/// [`ActsK`]'s order of `q` into `out`, pair `k` of groups `groups(k)` (the same for every row of
/// 256: `q`'s rows are whole blocks).
fn lay_out_pairs(q: &[i8], groups: impl Fn(usize) -> (usize, usize), out: &mut [i8]) {
    assert_eq!(out.len(), q.len());
    let group = |g: usize| &q[GROUP * g..GROUP * (g + 1)];
    for k in 0..q.len() / (2 * GROUP) {
        let (g0, g1) = groups(k);
        let pair = &mut out[2 * GROUP * k..2 * GROUP * (k + 1)];
        for l in 0..8 {
            let (a, b) = match l % 2 {
                0 => (
                    &group(g0)[4 * l..4 * l + 4],
                    &group(g0)[4 * l + 4..4 * l + 8],
                ),
                _ => (&group(g1)[4 * l..4 * l + 4], &group(g1)[4 * l - 4..4 * l]),
            };
            pair[4 * l..4 * l + 4].copy_from_slice(a);
            pair[GROUP + 4 * l..GROUP + 4 * l + 4].copy_from_slice(b);
        }
    }
}

/// Checks a product's slices (`w: [rows]` of whole blocks of `kind`, `out: [rows, t]`, the
/// activations' K-quant forms, [`ActsK`]) and returns `rows`. Panics on a mismatch: a caller's
/// bug (the model file's shapes were checked when it was opened).
pub(crate) fn check(kind: KQuant, w: &[u8], x: &ActsQ8, out: &[f32]) -> usize {
    let (cols, t) = (x.cols, x.t);
    let rows = out.len() / t.max(1);
    assert!(
        cols.is_multiple_of(BLOCK),
        "K-quants: {cols} columns are not whole blocks of {BLOCK}"
    );
    let k = &x.k;
    assert!(
        out.len() == rows * t
            && w.len() == rows * kind.row_bytes(cols)
            && k.q.len() == t * cols
            && k.scales.len() == t * cols / BLOCK
            && k.sums16.len() == t * cols / 16
            && k.x.len() == t * cols
            && k.x6.len() == t * cols
            && k.mins.len() == t * cols / GROUP,
        "K-quants: slice lengths do not match [{rows}, {cols}] x [{t}, {cols}] (activations \
         quantized for K-quants?)"
    );
    rows
}

/// `out[r, i]` (`[rows, t]`) = weight row `r` (blocks of `kind`) against activation row `i`, one
/// scalar dot per pair.
pub fn mat_k_scalar(kind: KQuant, w: &[u8], x: &ActsQ8, out: &mut [f32]) {
    let rows = check(kind, w, x, out);
    let (t, cols, row) = (x.t, x.cols, kind.row_bytes(x.cols));
    for r in 0..rows {
        let w_r = &w[r * row..(r + 1) * row];
        for i in 0..t {
            let q = &x.k.q[i * cols..(i + 1) * cols];
            let xs = &x.k.scales[i * cols / BLOCK..(i + 1) * cols / BLOCK];
            out[r * t + i] = match kind {
                KQuant::Q4K => dot_q4_k_scalar::<false>(w_r, q, xs),
                KQuant::Q5K => dot_q4_k_scalar::<true>(w_r, q, xs),
                KQuant::Q6K => dot_q6_k_scalar(w_r, q, xs),
            };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::blocks::k_quant_value;
    use crate::kernels::dot::k_interleaved::{interleave_k, KOrder};
    use crate::kernels::dot::ActsQ8Buf;
    use crate::testing::next_values;

    const KINDS: [KQuant; 3] = [KQuant::Q4K, KQuant::Q5K, KQuant::Q6K];

    /// `n` random blocks of `kind` whose f16 scales are finite (any other byte is a valid block):
    /// each its own `d` and `dmin`, of either sign, every fifth `d` zero.
    pub(crate) fn blocks(kind: KQuant, n: usize, seed: &mut u64) -> Vec<u8> {
        let bytes = kind.block_bytes();
        let mut out: Vec<u8> = next_values(n * bytes, seed)
            .iter()
            .map(|v| (v * 1e4) as i64 as u8)
            .collect();
        let scales = next_values(2 * n, seed);
        for (i, block) in out.chunks_exact_mut(bytes).enumerate() {
            let mut put = |at: usize, v: f32| {
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
            };
            let d = if i % 5 == 3 {
                0.0
            } else {
                0.03 * scales[2 * i]
            };
            match kind {
                KQuant::Q6K => put(208, d),
                KQuant::Q4K | KQuant::Q5K => {
                    put(0, d);
                    put(2, 0.01 * scales[2 * i + 1])
                }
            }
        }
        out
    }

    /// Every family this CPU has (`QWEN3_KERNELS` forces each in a run of its own) gives the
    /// scalar reference's products within f32 rounding, and a prompt's products give each
    /// token's decode bits; so does each family's kernel on the interleaved order
    /// (`k_interleaved.rs`) on the same weights so reordered.
    #[test]
    fn every_family_matches_the_reference() {
        let mut seed = 8;
        // Tiles of 1 to 4 tokens; more rows than a prompt's tiles go over at once (AVX2: 16);
        // rows of one GGUF block and of three (the interleaved order's short block alone, and
        // after a whole one).
        for (rows, cols, t) in [
            (5, BLOCK, 1),
            (4, 4 * BLOCK, 3),
            (3, 2 * BLOCK, 10),
            (37, BLOCK, 6),
            (3, 3 * BLOCK, 5),
            (2, 3 * BLOCK, 1),
            // Sets of eight rows (AVX2's interleaved order), by tiles of 1 to 3 tokens.
            (8, BLOCK, 1),
            (16, 2 * BLOCK, 7),
            (24, 3 * BLOCK, 5),
        ] {
            let x = next_values(t * cols, &mut seed);
            for kind in KINDS {
                let w = blocks(kind, rows * cols / BLOCK, &mut seed);
                every_kernel_matches(kind, &w, &x, rows, cols, t);
            }
        }
    }

    /// At the bounds the kernels' 16-bit sums are sized for: every weight at its largest (Q4_K's
    /// and Q5_K's bytes all ones: values 15 or 31, scales and minimums 63; Q6_K's values 63, its
    /// scales -128 and 127) against activations all at +-127, every kernel still gives the
    /// reference's products (a sum that wrapped or saturated would be off by thousands).
    #[test]
    fn the_largest_weights_and_activations_stay_exact() {
        let (rows, cols, t) = (16, 2 * BLOCK, 2);
        // Token 0: every activation 127 (one scale); token 1: -127.
        let x: Vec<f32> = (0..t * cols)
            .map(|i| if i < cols { 1.0 } else { -1.0 })
            .collect();
        for kind in KINDS {
            let bytes = kind.block_bytes();
            let mut w = vec![0xffu8; rows * cols / BLOCK * bytes];
            let half = half::f16::from_f32(0.01).to_le_bytes();
            for (i, block) in w.chunks_exact_mut(bytes).enumerate() {
                match kind {
                    KQuant::Q6K => {
                        for (j, sc) in block[192..208].iter_mut().enumerate() {
                            *sc = if (i + j) % 2 == 0 { 0x80 } else { 0x7f };
                        }
                        block[208..210].copy_from_slice(&half);
                    }
                    _ => {
                        block[0..2].copy_from_slice(&half);
                        block[2..4].copy_from_slice(&half);
                    }
                }
            }
            every_kernel_matches(kind, &w, &x, rows, cols, t);
        }
    }

    /// Every family's kernels on `w` (`rows` x `cols` of `kind`, in the file's order and in each
    /// family's own order where it takes the kind and the rows) against `x` (`t` tokens): the
    /// scalar reference's products within f32 rounding, and each token's decode bits.
    fn every_kernel_matches(kind: KQuant, w: &[u8], x: &[f32], rows: usize, cols: usize, t: usize) {
        let mut buf = ActsQ8Buf::default();
        let acts = buf.quantize_for_k(x, t, cols, GROUP);
        let mut want = vec![0f32; rows * t];
        mat_k_scalar(kind, w, &acts, &mut want);
        // Each family's interleaved order, where it takes the kind and the rows.
        let reordered = |order: KOrder| {
            let mut out = vec![0u8; w.len()];
            interleave_k(order, kind, w, cols, &mut out);
            out
        };
        let families = crate::kernels::dot::available().into_iter();
        let kernels = families.flat_map(|d| {
            let interleaved = d
                .k_interleaved
                .filter(|(o, _)| o.takes(kind) && rows.is_multiple_of(o.rows()));
            let file = Some((d.isa, "file order", d.k_rows, w.to_vec()));
            [
                file,
                interleaved.map(|(o, k)| (d.isa, "interleaved", k, reordered(o))),
            ]
        });
        for (isa, order, kernel, w) in kernels.flatten() {
            let mut got = vec![0f32; rows * t];
            kernel(kind, &w, &acts, &mut got, 0);
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{isa} ({order}) {kind:?} [{rows}, {cols}] x {t}, {k}: {a} vs {b}",
                );
            }
            // Token by token, as decode runs them: the same bits.
            let mut one = ActsQ8Buf::default();
            for i in 0..t {
                let xi = one.quantize_for_k(&x[i * cols..(i + 1) * cols], 1, cols, GROUP);
                let mut alone = vec![0f32; rows];
                kernel(kind, &w, &xi, &mut alone, 0);
                for r in 0..rows {
                    let (a, b) = (alone[r], got[r * t + i]);
                    assert_eq!(a.to_bits(), b.to_bits(), "{isa} ({order})");
                }
            }
        }
    }

    /// Each kernel's product equals the f64 product of the dequantized weights (`blocks.rs`,
    /// gguf-py's values) and the dequantized activations.
    #[test]
    fn match_the_dequantized_product() {
        let mut seed = 7;
        let (rows, cols, t) = (3, 2 * BLOCK, 2);
        let x = next_values(t * cols, &mut seed);
        let mut buf = ActsQ8Buf::default();
        let acts = buf.quantize_for_k(&x, t, cols, GROUP);
        for kind in KINDS {
            let w = blocks(kind, rows * cols / BLOCK, &mut seed);
            let bytes = kind.block_bytes();
            let mut out = vec![0f32; rows * t];
            mat_k_scalar(kind, &w, &acts, &mut out);
            for r in 0..rows {
                for i in 0..t {
                    let want: f64 = (0..cols)
                        .map(|c| {
                            let k = r * cols + c;
                            let block = &w[k / BLOCK * bytes..][..bytes];
                            let wv = k_quant_value(kind, block, k % BLOCK) as f64;
                            let k = i * cols + c;
                            let xq = acts.k.q[k] as f64 * acts.k.scales[k / BLOCK] as f64;
                            wv * xq
                        })
                        .sum();
                    let got = out[r * t + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{kind:?}, row {r}, token {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
