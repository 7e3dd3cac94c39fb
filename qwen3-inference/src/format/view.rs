//! A tensor's values as the mapped file holds them: [`TensorData`], one variant per variant of
//! [`DType`], borrowed where the values lie, and the [`TensorView`] the model and the
//! kernels take. [`DType`]'s table says how many bytes a tensor takes; this says how those bytes
//! are read.

use super::mapped::MappedParts;
use super::reader::TensorInfo;
use super::{align_up, value_bytes, DType, KQuant};
use anyhow::{Context, Result};

/// The values of one tensor, borrowed from the mapped file.
#[derive(Debug, Clone, Copy)]
pub enum TensorData<'a> {
    F32(&'a [f32]),
    /// Raw bfloat16 bit patterns; value = `f32::from_bits((b as u32) << 16)`.
    Bf16(&'a [u16]),
    /// `q` row-major int8 values; `scales[i]` multiplies `q[i*group_size .. (i+1)*group_size]`.
    Q8 {
        q: &'a [i8],
        scales: &'a [f32],
        group_size: usize,
    },
    /// Two 4-bit values a byte, as `quant::quantize_q4` packs them; `scales[i]` (f16 bits) is
    /// group `i`'s.
    Q4 {
        packed: &'a [u8],
        scales: &'a [u16],
        group_size: usize,
    },
    /// Four 6-bit values in three bytes, in blocks of 128 of each row (`cols` wide) as
    /// `quant::quantize_q6` packs them; `scales[i]` (f16 bits) is group `i`'s.
    Q6 {
        packed: &'a [u8],
        scales: &'a [u16],
        group_size: usize,
        cols: usize,
    },
    /// GGUF K-quant blocks (each row whole blocks of 256 weights), as the GGUF holds them:
    /// `gguf/blocks.rs` draws each kind.
    K(KQuant, &'a [u8]),
}

/// A tensor: its shape and borrowed values.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub shape: &'a [u64],
    pub data: TensorData<'a>,
    /// For a q4, q6 or q8 matrix on a CPU whose kernels read their own order of its values
    /// (AVX-512: `kernels/dot/interleaved.rs`), the same tensor with its values in that order
    /// and its scales as they are, derived at load
    /// ([`ModelFile::derived`](super::ModelFile::derived)); `None` otherwise. `data` stays the
    /// file's order, which everything else (an embedding row, the plain backend, a GPU's upload)
    /// reads.
    pub interleaved: Option<TensorData<'a>>,
}

impl TensorData<'_> {
    /// The file dtype these values are stored as: each variant is one of [`DType`]'s.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::Bf16(_) => DType::Bf16,
            TensorData::Q8 { .. } => DType::Q8,
            TensorData::Q4 { .. } => DType::Q4,
            TensorData::Q6 { .. } => DType::Q6,
            TensorData::K(k, _) => DType::K(*k),
        }
    }
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
        DType::F32 => TensorData::F32(bytemuck::try_cast_slice(bytes).map_err(cast_err)?),
        DType::Bf16 => TensorData::Bf16(bytemuck::try_cast_slice(bytes).map_err(cast_err)?),
        DType::Q8 => {
            let numel = t.shape.iter().product::<u64>() as usize;
            let scales_at = align_up(numel as u64).context("overflow")? as usize;
            let q = bytemuck::try_cast_slice(&bytes[..numel]).map_err(cast_err)?;
            let scales = bytemuck::try_cast_slice(&bytes[scales_at..]).map_err(cast_err)?;
            TensorData::Q8 {
                q,
                scales,
                group_size: t.group_size as usize,
            }
        }
        // Blocks of bytes, read as they lie (no alignment needed).
        DType::K(k) => TensorData::K(k, bytes),
        DType::Q4 | DType::Q6 => {
            let numel = t.shape.iter().product::<u64>();
            let values = value_bytes(t.dtype, numel).context("overflow")? as usize;
            let scales_at = align_up(values as u64).context("overflow")? as usize;
            let (packed, group_size) = (&bytes[..values], t.group_size as usize);
            let scales = bytemuck::try_cast_slice(&bytes[scales_at..]).map_err(cast_err)?;
            match t.dtype {
                DType::Q4 => TensorData::Q4 {
                    packed,
                    scales,
                    group_size,
                },
                _ => TensorData::Q6 {
                    packed,
                    scales,
                    group_size,
                    cols: *t.shape.last().context("q6: a tensor without a shape")? as usize,
                },
            }
        }
    })
}
