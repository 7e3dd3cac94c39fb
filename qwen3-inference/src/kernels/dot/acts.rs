//! The activations of a quantized product: each input row quantized once, per group, like the
//! weights (`quant/q8.rs`), and kept in the forms the kernels read: the int8 values, the same values
//! as unsigned bytes (AVX-512's `vpdpbusd` form), and for q4 and q6 weights a layout per
//! instruction set (`q4.rs`). The buffers are reused from one product to the next, so a decode
//! step allocates nothing.

use super::k_interleaved::KOrder;
use super::{dots, k_quants, q4};

/// `t` activation rows of `cols` values, quantized per group of `group_size` for the q8 kernels
/// (the same rule as the weights, `quant/q8.rs`).
pub struct ActsQ8<'a> {
    pub t: usize,
    pub cols: usize,
    pub group_size: usize,
    /// `[t, cols]`: the int8 values.
    pub q: &'a [i8],
    /// `[t, cols]`: the same values plus 128, as unsigned bytes (`q as u8 ^ 0x80`). `vpdpbusd`
    /// multiplies unsigned by signed bytes; this form lets the AVX-512 prefill kernel use it
    /// without per-token sign fix-ups (see `mat_q8_avx512`).
    pub biased: &'a [u8],
    /// `[t, cols / group_size]`
    pub scales: &'a [f32],
    /// The same values laid out for the q4 kernels (`q4.rs`), which AVX-512's q8 kernel on
    /// interleaved weights reads too; empty unless made by [`ActsQ8Buf::quantize_for_q4`] (or
    /// `quantize_for_q4_as`, `quantize_for_weights`) with groups of 32 (or, interleaved, 64).
    pub q4: q4::ActsQ4<'a>,
    /// The same values in [`q4::Q4Layout::Interleaved`] for the q8 kernels that read that
    /// order (AVX2's on a prompt in groups of 32 or 64, which reorders the weights as it reads
    /// them, [`super::Dots::q8_rows_lay_out`]), where this CPU's q4 kernels read another layout
    /// (AVX2's `Pairs`) and `q4` cannot serve them; empty otherwise ([`ActsQ8::interleaved`]
    /// picks the one laid out so).
    pub q8: q4::ActsQ4<'a>,
    /// For GGUF's K-quants, the same input quantized again, per block of 256 as llama.cpp's
    /// Q8_K (one scale for a block's sub-blocks), with the sums and layouts their kernels read
    /// ([`k_quants::ActsK`]); empty unless made by [`ActsQ8Buf::quantize_for_k`] (or
    /// `quantize_for_weights` with `k`).
    pub k: k_quants::ActsK<'a>,
}

/// The buffers behind an [`ActsQ8`], reused from one product to the next.
#[derive(Default)]
pub struct ActsQ8Buf {
    q: Vec<i8>,
    biased: Vec<u8>,
    scales: Vec<f32>,
    q4: q4::ActsQ4Buf,
    q8: q4::ActsQ4Buf,
    k: k_quants::ActsKBuf,
}

/// The forms of the activations the weights of one product read, besides the int8 values and
/// their scales ([`ActsQ8Buf::quantize_for_weights`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Forms {
    /// For q4 or q6 weights: the layout of this CPU's q4 kernels.
    pub q4: bool,
    /// For q8 weights read in the interleaved order: that layout.
    pub q8: bool,
    /// For GGUF's K-quants: the input quantized per block of 256, with its sums and layouts.
    pub k: bool,
}

/// The layouts [`ActsQ8Buf::quantize_with`] makes: `q4` in the given one, the interleaved one
/// for q8 (`q8`), the K-quants' forms (`k`), with those of their interleaved order
/// (`k_interleaved`: only where a kernel reads them).
#[derive(Clone, Copy, Default)]
struct Layouts {
    q4: Option<q4::Q4Layout>,
    q8: bool,
    k: bool,
    k_interleaved: bool,
}

impl ActsQ8Buf {
    /// Quantizes `x: [t, cols]` per group of `gs` and derives the other forms, for q8 weights
    /// (no q4 layout: `q4` is empty). The buffers grow to the largest size seen and are then
    /// reused: no allocation per token.
    pub fn quantize(&mut self, x: &[f32], t: usize, cols: usize, gs: usize) -> ActsQ8<'_> {
        self.quantize_with(x, t, cols, gs, Layouts::default())
    }

    /// [`ActsQ8Buf::quantize`] plus the K-quants' forms ([`ActsQ8::k`]), for GGUF's K-quants,
    /// those of the interleaved order among them (for every family's kernels).
    pub fn quantize_for_k(&mut self, x: &[f32], t: usize, cols: usize, gs: usize) -> ActsQ8<'_> {
        self.quantize_with(
            x,
            t,
            cols,
            gs,
            Layouts {
                k: true,
                k_interleaved: true,
                ..Layouts::default()
            },
        )
    }

    /// [`ActsQ8Buf::quantize`] with the forms the weights of one product need: the q4 layout
    /// of this CPU's kernels for q4 or q6 weights (`q4`), the interleaved one for q8 weights
    /// read in that order (`q8`: [`super::Dots::q8_interleaved`], AVX-512's on a copy of the
    /// weights, or [`super::Dots::q8_rows_lay_out`], AVX2's on a prompt; one form serves both
    /// where the q4 layout is that one, as on AVX-512); the K-quants' own quantization (`k`). A GGUF may
    /// mix them in one layer's products.
    pub fn quantize_for_weights(
        &mut self,
        x: &[f32],
        t: usize,
        cols: usize,
        gs: usize,
        forms: Forms,
    ) -> ActsQ8<'_> {
        let own = dots().q4_layout;
        let (q4, q8) = match own.interleaves() {
            true => (forms.q4 || forms.q8, false),
            false => (forms.q4, forms.q8),
        };
        let with = Layouts {
            q4: q4.then_some(own),
            q8,
            k: forms.k,
            // AVX-512's groups side by side read the values in their own order; AVX2's eight
            // rows read them as they are.
            k_interleaved: forms.k
                && dots()
                    .k_interleaved
                    .is_some_and(|(order, _)| order == KOrder::Groups),
        };
        self.quantize_with(x, t, cols, gs, with)
    }

    /// [`ActsQ8Buf::quantize`] plus the layout the q4 kernels of this CPU ([`dots`]) read
    /// ([`q4::ActsQ4`]).
    pub fn quantize_for_q4(&mut self, x: &[f32], t: usize, cols: usize, gs: usize) -> ActsQ8<'_> {
        self.quantize_with(
            x,
            t,
            cols,
            gs,
            Layouts {
                q4: Some(dots().q4_layout),
                ..Layouts::default()
            },
        )
    }

    /// [`ActsQ8Buf::quantize_for_q4`] in a given layout: for a kernel other than this CPU's
    /// choice (`d.q4_layout` of one of [`available`]).
    pub fn quantize_for_q4_as(
        &mut self,
        x: &[f32],
        t: usize,
        cols: usize,
        gs: usize,
        layout: q4::Q4Layout,
    ) -> ActsQ8<'_> {
        self.quantize_with(
            x,
            t,
            cols,
            gs,
            Layouts {
                q4: Some(layout),
                ..Layouts::default()
            },
        )
    }

    fn quantize_with(
        &mut self,
        x: &[f32],
        t: usize,
        cols: usize,
        gs: usize,
        with: Layouts,
    ) -> ActsQ8<'_> {
        let Layouts {
            q4: for_q4,
            q8: for_q8,
            k: for_k,
            k_interleaved,
        } = with;
        assert!(gs > 0 && cols.is_multiple_of(gs) && x.len() == t * cols);
        let per = cols / gs;
        // Each from a cache line's start, as the forms below (`aligned`).
        let at = aligned(&mut self.q, t * cols);
        let q = at..at + t * cols;
        let at = aligned(&mut self.biased, t * cols);
        let biased = at..at + t * cols;
        let at = aligned(&mut self.scales, t * per);
        let scales = at..at + t * per;
        let quantize = dots().quantize_q8;
        let (q_all, s_all) = (&mut self.q[q.clone()], &mut self.scales[scales.clone()]);
        for i in 0..t {
            let (qi, si) = (i * cols..(i + 1) * cols, i * per..(i + 1) * per);
            quantize(&x[qi.clone()], gs, &mut q_all[qi], &mut s_all[si]);
        }
        for (b, &v) in self.biased[biased.clone()]
            .iter_mut()
            .zip(&self.q[q.clone()])
        {
            *b = v as u8 ^ 0x80;
        }
        let (q, biased, scales) = (&self.q[q], &self.biased[biased], &self.scales[scales]);
        let k = match for_k && cols.is_multiple_of(k_quants::BLOCK) {
            true => self.k.quantize(x, t, cols, quantize, k_interleaved),
            false => k_quants::ActsK::default(),
        };
        let q4 = match for_q4 {
            Some(layout) => self.q4.lay_out(q, scales, t, cols, gs, layout),
            None => q4::ActsQ4::default(),
        };
        let q8 = match for_q8 {
            true => {
                let interleaved = q4::Q4Layout::Interleaved;
                self.q8.lay_out(q, scales, t, cols, gs, interleaved)
            }
            false => q4::ActsQ4::default(),
        };
        ActsQ8 {
            t,
            cols,
            group_size: gs,
            q,
            biased,
            scales,
            q4,
            q8,
            k,
        }
    }
}

/// `v` grown to hold `len` values from a cache line's start; returns that value's index. Every
/// activation form the kernels load a vector at a time lies there: a `Vec`'s start is only as
/// aligned as the allocator makes it (16 bytes with glibc), and from 16 bytes into a line every
/// 512-bit load straddled two lines, twice the work for the cache (an Emerald Rapids core's
/// 128-token Q6_K product ran at 113-117 GMAC/s so, 141-150 aligned; docs/gguf-benchmarks.md).
pub(super) fn aligned<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> usize {
    v.resize(len + 64 / std::mem::size_of::<T>(), T::default());
    v.as_ptr().align_offset(64)
}

impl ActsQ8<'_> {
    pub(super) fn per(&self) -> usize {
        self.cols / self.group_size
    }
    /// The values laid out whole in [`q4::Q4Layout::Interleaved`], for q8 weights in that
    /// order: `q4` where it is so laid out (AVX-512's), else `q8`; `None` when neither is.
    // Read by x86's kernels only (no other family reads q8 in that order).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn interleaved(&self) -> Option<&q4::ActsQ4<'_>> {
        let groups = self.t * self.per();
        let whole = |a: &q4::ActsQ4| {
            a.layout == q4::Q4Layout::Interleaved
                && a.x.len() == self.t * self.cols
                && a.corr.len() == groups
                && a.scales.len() == groups
        };
        [&self.q4, &self.q8].into_iter().find(|a| whole(a))
    }
    pub(crate) fn q_row(&self, i: usize) -> &[i8] {
        &self.q[i * self.cols..(i + 1) * self.cols]
    }
    pub(crate) fn scales_row(&self, i: usize) -> &[f32] {
        &self.scales[i * self.per()..(i + 1) * self.per()]
    }
    /// Panics unless every slice has the length the sizes say (a caller's bug, not bad input).
    pub(super) fn check(&self, w: &[i8], ws: &[f32], out: &[f32]) -> usize {
        let (t, cols, gs) = (self.t, self.cols, self.group_size);
        assert!(
            gs > 0 && cols > 0 && cols.is_multiple_of(gs),
            "q8: bad group size"
        );
        let rows = w.len() / cols;
        assert!(
            w.len() == rows * cols
                && ws.len() == rows * (cols / gs)
                && out.len() == rows * t
                && self.q.len() == t * cols
                && self.biased.len() == t * cols
                && self.scales.len() == t * (cols / gs),
            "q8: slice lengths do not match [{rows}, {cols}] x [{t}, {cols}]"
        );
        rows
    }
}
