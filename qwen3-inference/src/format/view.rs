//! A tensor's values as the mapped file holds them: [`TensorData`], a [`DType`] and the bytes it
//! reads, borrowed where the values lie, and the [`TensorView`] the model and the kernels take.
//! [`DType`] is the one list of dtypes: each quantized dtype's borrowed form lives in its own
//! module ([`Q8`], [`Q4`] and [`Q6`] in `quant/`, a K-quant's blocks in `gguf/blocks.rs`), and
//! `TensorData` hands a reader the form its dtype says (adding a dtype: ARCHITECTURE.md, "A
//! dtype").

use super::mapped::MappedParts;
use super::reader::TensorInfo;
use super::{align_up, value_bytes, DType, KQuant, K_BLOCK};
use crate::quant::{Q4, Q6, Q8};
use anyhow::{Context, Result};

/// The values of one tensor, borrowed from the mapped file (or, in tests and the vision tower's
/// owned copies, from vectors): its dtype and its bytes. Built only from slices of the dtype's
/// own element types (or checked casts of the file's bytes to them), so the accessors' casts
/// back to those types cannot fail.
#[derive(Debug, Clone, Copy)]
pub struct TensorData<'a> {
    dtype: DType,
    /// The values' bytes: f32s, bf16 bit patterns, i8s, packed q4 or q6 values, K-quant blocks.
    values: &'a [u8],
    /// The group scales' bytes: f32s (q8) or f16 bit patterns (q4, q6); empty for the rest.
    scales: &'a [u8],
    /// Values a scale covers (q8, q4, q6); 0 for the rest.
    group_size: usize,
    /// Values a row (q6 packs each row on its own); 0 for the rest.
    cols: usize,
    /// The values lie in the CPU kernels' own order, not the file's: a GGUF's matrix laid out
    /// at open for those kernels alone ([`super::Reader::Interleaved`]). Such data is read only
    /// through its view's `interleaved` form; reading it here as the file's order is a bug, and
    /// every accessor below says so rather than hand back values in the wrong places.
    kernels_only: bool,
}

impl<'a> TensorData<'a> {
    /// f32 values.
    pub fn from_f32(values: &'a [f32]) -> Self {
        Self::plain(DType::F32, bytemuck::cast_slice(values))
    }

    /// bfloat16 values as raw bit patterns; value = `f32::from_bits((b as u32) << 16)`.
    pub fn from_bf16(bits: &'a [u16]) -> Self {
        Self::plain(DType::Bf16, bytemuck::cast_slice(bits))
    }

    /// Whole blocks of GGUF K-quant `kind` (each row whole blocks of 256 weights), as the GGUF
    /// holds them: `gguf/blocks.rs` draws each kind.
    pub fn from_k_quant(kind: KQuant, blocks: &'a [u8]) -> Self {
        Self::plain(DType::K(kind), blocks)
    }

    fn plain(dtype: DType, values: &'a [u8]) -> Self {
        TensorData {
            dtype,
            values,
            scales: &[],
            group_size: 0,
            cols: 0,
            kernels_only: false,
        }
    }

    /// The file dtype these values are stored as.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Values one scale covers: q8's, q4's and q6's group, a K-quant's block of 256; `None` for
    /// f32 and bf16.
    pub fn group_size(&self) -> Option<usize> {
        match self.dtype {
            DType::K(_) => Some(K_BLOCK as usize),
            d => d.grouped().then_some(self.group_size),
        }
    }

    /// The same values marked as lying in the CPU kernels' order (see `kernels_only`).
    pub(crate) fn kernels_only(self) -> Self {
        TensorData {
            kernels_only: true,
            ..self
        }
    }

    /// Whether the values lie in the CPU kernels' order alone (see `kernels_only`).
    pub fn is_kernels_only(&self) -> bool {
        self.kernels_only
    }

    /// A caller reads the form of the dtype it matched, in the file's order: another is a bug,
    /// named here.
    fn expect(&self, dtype: DType) {
        assert_eq!(self.dtype, dtype, "{} values read as {}", self.dtype, dtype);
        assert!(
            !self.kernels_only,
            "{} values laid out for the CPU's kernels read in the file's order (a file opened \
             with Reader::Interleaved is read through each view's `interleaved` form)",
            self.dtype
        );
    }

    /// The values' bytes as they lie, whatever the dtype (a copy of them reordered for the
    /// kernels: `kernels/dot/interleaved.rs`).
    pub(crate) fn value_bytes(&self) -> &'a [u8] {
        self.values
    }

    /// The f32 values (panics on another dtype: match on [`dtype`](Self::dtype) first).
    pub fn f32(&self) -> &'a [f32] {
        self.expect(DType::F32);
        bytemuck::cast_slice(self.values)
    }

    /// The bf16 bit patterns (panics on another dtype).
    pub fn bf16(&self) -> &'a [u16] {
        self.expect(DType::Bf16);
        bytemuck::cast_slice(self.values)
    }

    /// The q8 values and scales (panics on another dtype).
    pub fn q8(&self) -> Q8<'a> {
        self.expect(DType::Q8);
        Q8 {
            q: bytemuck::cast_slice(self.values),
            scales: bytemuck::cast_slice(self.scales),
            group_size: self.group_size,
        }
    }

    /// The packed q4 values and their f16 scales (panics on another dtype).
    pub fn q4(&self) -> Q4<'a> {
        self.expect(DType::Q4);
        Q4 {
            packed: self.values,
            scales: bytemuck::cast_slice(self.scales),
            group_size: self.group_size,
        }
    }

    /// The packed q6 rows and their f16 scales (panics on another dtype).
    pub fn q6(&self) -> Q6<'a> {
        self.expect(DType::Q6);
        Q6 {
            packed: self.values,
            scales: bytemuck::cast_slice(self.scales),
            group_size: self.group_size,
            cols: self.cols,
        }
    }

    /// A K-quant's kind and its blocks (panics on another dtype).
    pub fn k_quant(&self) -> (KQuant, &'a [u8]) {
        match self.dtype {
            DType::K(kind) => (kind, self.values),
            other => panic!("{other} values read as a K-quant"),
        }
    }

    /// Value `i` (row-major) as f32: bf16 widened, q8, q4 and q6 times their group's scale, a
    /// K-quant's as its block says (`gguf/blocks.rs`). The textbook reading, one value at a time.
    pub fn value(&self, i: usize) -> f32 {
        match self.dtype {
            DType::F32 => self.f32()[i],
            DType::Bf16 => f32::from_bits((self.bf16()[i] as u32) << 16),
            DType::Q8 => self.q8().value(i),
            DType::Q4 => self.q4().value(i),
            DType::Q6 => self.q6().value(i),
            DType::K(kind) => {
                let (block, v) = (i / K_BLOCK as usize, i % K_BLOCK as usize);
                let at = block * kind.block_bytes();
                crate::gguf::blocks::k_quant_value(kind, &self.values[at..], v)
            }
        }
    }

    /// Row `r` of a matrix `out.len()` wide, as f32 (an embedding's row, a dequantized matrix).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let cols = out.len();
        let span = r * cols..(r + 1) * cols;
        match self.dtype {
            DType::F32 => out.copy_from_slice(&self.f32()[span]),
            DType::Bf16 => {
                for (o, &b) in out.iter_mut().zip(&self.bf16()[span]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
            DType::Q8 => self.q8().row(r, out),
            DType::Q4 => self.q4().row(r, out),
            DType::Q6 => self.q6().row(r, out),
            DType::K(kind) => {
                let row = kind.row_bytes(cols);
                let blocks = &self.values[r * row..(r + 1) * row];
                crate::gguf::blocks::k_quant_blocks(kind, blocks, out)
            }
        }
    }
}

impl<'a> From<Q8<'a>> for TensorData<'a> {
    fn from(v: Q8<'a>) -> Self {
        TensorData {
            dtype: DType::Q8,
            values: bytemuck::cast_slice(v.q),
            scales: bytemuck::cast_slice(v.scales),
            group_size: v.group_size,
            cols: 0,
            kernels_only: false,
        }
    }
}

impl<'a> From<Q4<'a>> for TensorData<'a> {
    fn from(v: Q4<'a>) -> Self {
        TensorData {
            dtype: DType::Q4,
            values: v.packed,
            scales: bytemuck::cast_slice(v.scales),
            group_size: v.group_size,
            cols: 0,
            kernels_only: false,
        }
    }
}

impl<'a> From<Q6<'a>> for TensorData<'a> {
    fn from(v: Q6<'a>) -> Self {
        TensorData {
            dtype: DType::Q6,
            values: v.packed,
            scales: bytemuck::cast_slice(v.scales),
            group_size: v.group_size,
            cols: v.cols,
            kernels_only: false,
        }
    }
}

/// A tensor's values copied out of the file: the parts of a [`TensorData`], owned, for what
/// must outlive the mapping (the vision tower's matrices). Whatever the dtype, one copy of its
/// bytes: a new dtype needs nothing here.
#[derive(Clone, Debug)]
pub struct OwnedTensorData {
    dtype: DType,
    /// The values' and the scales' bytes, each in 4-byte words so that their casts to f32s,
    /// u16s and i8s are aligned, with the number of bytes in use.
    values: (Vec<u32>, usize),
    scales: (Vec<u32>, usize),
    group_size: usize,
    cols: usize,
    kernels_only: bool,
}

/// `bytes` in 4-byte words (the last one padded with zeros), and their count.
fn words(bytes: &[u8]) -> (Vec<u32>, usize) {
    let mut w = vec![0u32; bytes.len().div_ceil(4)];
    bytemuck::cast_slice_mut::<u32, u8>(&mut w)[..bytes.len()].copy_from_slice(bytes);
    (w, bytes.len())
}

impl TensorData<'_> {
    /// A copy of these values that owns its bytes.
    pub fn to_owned_data(&self) -> OwnedTensorData {
        OwnedTensorData {
            dtype: self.dtype,
            values: words(self.values),
            scales: words(self.scales),
            group_size: self.group_size,
            cols: self.cols,
            kernels_only: self.kernels_only,
        }
    }
}

impl OwnedTensorData {
    /// The values, borrowed as the kernels and readers take them.
    pub fn data(&self) -> TensorData<'_> {
        fn bytes((w, n): &(Vec<u32>, usize)) -> &[u8] {
            &bytemuck::cast_slice::<u32, u8>(w)[..*n]
        }
        TensorData {
            dtype: self.dtype,
            values: bytes(&self.values),
            scales: bytes(&self.scales),
            group_size: self.group_size,
            cols: self.cols,
            kernels_only: self.kernels_only,
        }
    }

    /// The values' bytes, to be rewritten in another order of the same values (the kernels'
    /// copy of a matrix: `kernels/dot/interleaved.rs`).
    pub(crate) fn values_mut(&mut self) -> &mut [u8] {
        let (w, n) = &mut self.values;
        &mut bytemuck::cast_slice_mut::<u32, u8>(w)[..*n]
    }
}

/// A tensor: its shape and borrowed values.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub shape: &'a [u64],
    pub data: TensorData<'a>,
    /// For a q4, q6, q8, Q4_K or Q6_K matrix on a CPU whose kernels read their own order of its
    /// values (AVX-512's, AVX2's K-quants: `kernels/dot/interleaved.rs`,
    /// `kernels/dot/k_interleaved.rs`), the same tensor with its values in that order
    /// and its scales as they are, derived at load
    /// ([`ModelFile::derived`](super::ModelFile::derived)); `None` otherwise. `data` stays the
    /// file's order, which everything else (an embedding row, the plain backend, a GPU's upload)
    /// reads.
    pub interleaved: Option<TensorData<'a>>,
}

/// Reinterprets a tensor's bytes in place. Bounds were validated by
/// [`Header::parse`](super::reader::Header::parse); alignment holds because each mapping is
/// page-aligned and offsets within it are multiples of 64 (a GGUF's, of its alignment), and
/// `try_cast_slice` checks both again rather than trusting that.
pub(super) fn view_data<'a>(file: &'a MappedParts, t: &TensorInfo) -> Result<TensorData<'a>> {
    let start = usize::try_from(t.offset)?;
    let end = usize::try_from(t.offset + t.nbytes)?;
    view_bytes(file.get(start..end).context("out of bounds")?, t)
}

/// [`view_data`] of the tensor's own bytes (`t.nbytes` of them, 64-byte aligned).
pub(super) fn view_bytes<'a>(bytes: &'a [u8], t: &TensorInfo) -> Result<TensorData<'a>> {
    let cast_err = |e: bytemuck::PodCastError| anyhow::anyhow!("misaligned data: {e:?}");
    Ok(match t.dtype {
        DType::F32 => TensorData::from_f32(bytemuck::try_cast_slice(bytes).map_err(cast_err)?),
        DType::Bf16 => TensorData::from_bf16(bytemuck::try_cast_slice(bytes).map_err(cast_err)?),
        DType::Q8 => {
            let numel = t.shape.iter().product::<u64>() as usize;
            let scales_at = align_up(numel as u64).context("overflow")? as usize;
            let q = bytemuck::try_cast_slice(&bytes[..numel]).map_err(cast_err)?;
            let scales = bytemuck::try_cast_slice(&bytes[scales_at..]).map_err(cast_err)?;
            TensorData::from(Q8 {
                q,
                scales,
                group_size: t.group_size as usize,
            })
        }
        // Blocks of bytes, read as they lie (no alignment needed).
        DType::K(k) => TensorData::from_k_quant(k, bytes),
        DType::Q4 | DType::Q6 => {
            let numel = t.shape.iter().product::<u64>();
            let values = value_bytes(t.dtype, numel).context("overflow")? as usize;
            let scales_at = align_up(values as u64).context("overflow")? as usize;
            let (packed, group_size) = (&bytes[..values], t.group_size as usize);
            let scales = bytemuck::try_cast_slice(&bytes[scales_at..]).map_err(cast_err)?;
            match t.dtype {
                DType::Q4 => Q4 {
                    packed,
                    scales,
                    group_size,
                }
                .into(),
                _ => Q6 {
                    packed,
                    scales,
                    group_size,
                    cols: *t.shape.last().context("q6: a tensor without a shape")? as usize,
                }
                .into(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_q4, dequantize_q6_row, dequantize_q8};
    use crate::quant::{quantize_q4, quantize_q6, quantize_q8};
    use crate::testing::lcg;

    /// Every dtype's data, read one value at a time and a row at a time, gives the same values,
    /// and those are what the dtype's own dequantization gives (the whole tensor at once).
    #[test]
    fn a_value_and_a_row_read_alike_in_every_dtype() {
        let (rows, cols, gs) = (3, 160, 32);
        let mut seed = 5;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let (mut q8, mut s8) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
        quantize_q8(&w, gs, &mut q8, &mut s8);
        let (mut p4, mut s4) = (vec![0u8; w.len() / 2], vec![0u16; w.len() / gs]);
        quantize_q4(&w, gs, &mut p4, &mut s4);
        let (mut p6, mut s6) = (vec![0u8; w.len() / 4 * 3], vec![0u16; w.len() / gs]);
        quantize_q6(&w, cols, gs, &mut p6, &mut s6);
        // Each dtype's values as its own dequantization gives them, whole tensors at once.
        let mut d8 = vec![0f32; w.len()];
        dequantize_q8(&q8, &s8, gs, &mut d8);
        let mut d4 = vec![0f32; w.len()];
        dequantize_q4(&p4, &s4, gs, &mut d4);
        let mut d6 = vec![0f32; w.len()];
        for (r, row) in d6.chunks_exact_mut(cols).enumerate() {
            dequantize_q6_row(&p6, &s6, cols, gs, r, row);
        }
        let q8 = Q8 {
            q: &q8,
            scales: &s8,
            group_size: gs,
        };
        let q4 = Q4 {
            packed: &p4,
            scales: &s4,
            group_size: gs,
        };
        let q6 = Q6 {
            packed: &p6,
            scales: &s6,
            group_size: gs,
            cols,
        };
        let widened: Vec<f32> = bits
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect();
        let all: [(TensorData, &[f32]); 5] = [
            (TensorData::from_f32(&w), &w),
            (TensorData::from_bf16(&bits), &widened),
            (q8.into(), &d8),
            (q4.into(), &d4),
            (q6.into(), &d6),
        ];
        for (data, own) in all {
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                data.row(r, &mut row);
                for (c, &v) in row.iter().enumerate() {
                    let i = r * cols + c;
                    assert_eq!(v, data.value(i), "{} {i}", data.dtype());
                    assert_eq!(v, own[i], "{} {i}", data.dtype());
                }
            }
            let grouped = !matches!(data.dtype(), DType::F32 | DType::Bf16);
            assert_eq!(data.group_size(), grouped.then_some(gs));
        }
    }

    /// A reader that matched one dtype and asks for another's form is a bug, named loudly.
    #[test]
    #[should_panic(expected = "q8 values read as q4")]
    fn reading_another_dtypes_form_panics() {
        let (q, scales) = ([0i8; 32], [1.0f32]);
        let data = TensorData::from(Q8 {
            q: &q,
            scales: &scales,
            group_size: 32,
        });
        data.q4();
    }
}
