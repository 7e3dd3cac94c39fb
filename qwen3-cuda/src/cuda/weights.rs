//! The model's weights on the device: the whole model file uploaded in one copy, and each tensor
//! as a byte range of that one allocation.
//!
//! The model file puts every tensor (and every q8, q4 or q6 scale array) on a 64-byte boundary, and device
//! allocations are at least 256-byte aligned, so every range below is aligned for the kernels'
//! 16-byte loads without any repacking.

use crate::kernels::{check_matmul_shape, quant_of};
use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use qwen3_inference::format::{align_up, value_bytes, DType, ModelFile};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// Where one tensor's values (and, for q8, scales) sit in the uploaded file.
#[derive(Debug, Clone)]
pub struct DeviceTensor {
    pub dtype: DType,
    /// [rows, cols] for matrices, [n] for norm weights.
    pub shape: Vec<usize>,
    pub values: Range<usize>,
    /// q8 and q4 only.
    pub scales: Range<usize>,
    pub group_size: usize,
}

impl DeviceTensor {
    pub fn rows(&self) -> usize {
        self.shape[0]
    }
    pub fn cols(&self) -> usize {
        *self.shape.last().expect("validated shape")
    }
}

/// The uploaded model file.
pub struct DeviceWeights {
    pub bytes: CudaSlice<u8>,
    tensors: HashMap<String, DeviceTensor>,
}

impl DeviceWeights {
    /// Uploads `file` (one host-to-device copy of the whole mapped file) and records each tensor's
    /// byte ranges. Shapes the kernels cannot take are refused here, before any launch.
    pub fn upload(stream: &Arc<CudaStream>, file: &ModelFile) -> Result<DeviceWeights> {
        let name = file.path().display().to_string();
        // The upload is the mapped file, one run of memory (not a GGUF split in parts)...
        let whole = file.bytes()?;
        // ... holding every tensor: a GGUF's Q8_0, Q5_0, Q4_0 and F16 tensors, repacked at
        // open, are not in it.
        if !file.in_place() {
            bail!(
                "{name}: a GGUF file with Q8_0, Q5_0, Q4_0 or F16 tensors, which the CUDA backend does not read yet: use --device cpu"
            );
        }
        if let Some(t) = file.header().tensors.iter().find(|t| t.dtype.is_k_quant()) {
            bail!(
                "{name}: tensor {} is GGUF's {}, which the CUDA backend has no kernels for: use --device cpu",
                t.name,
                t.dtype
            );
        }
        let mut tensors = HashMap::new();
        for t in &file.header().tensors {
            let start = usize::try_from(t.offset)?;
            let numel = t.shape.iter().product::<u64>() as usize;
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            let cols = *shape.last().context("empty shape")?;
            if start % 64 != 0 {
                bail!(
                    "{name}: tensor {} is not 64-byte aligned (a GGUF file aligns its tensors to 32 bytes), which the CUDA backend reads in place: use --device cpu",
                    t.name
                );
            }
            // No CUDA kernel reads a q4 embedding row (q4 files keep the table finer unless
            // exported with --tables q4).
            if t.dtype == DType::Q4 && t.name == "model.embed_tokens.weight" {
                bail!(
                    "{name}: its embedding table is q4, which the CUDA backend does not read: use --device cpu, or export with --tables q6 or q8"
                );
            }
            // The values; for q8, q4 and q6 then (64-byte aligned) their scales.
            let n_values = value_bytes(t.dtype, numel as u64).context("overflow")? as usize;
            let values = start..start + n_values;
            let scales = match t.dtype.grouped() {
                true => {
                    let at = start + align_up(n_values as u64).context("overflow")? as usize;
                    at..start + usize::try_from(t.nbytes)?
                }
                // f32, bf16 (the K-quants were refused above).
                false => 0..0,
            };
            if shape.len() == 2 {
                check_matmul_shape(cols, quant_of(t.dtype, t.group_size as usize))
                    .map_err(|e| anyhow::anyhow!("{name}: {}: {e}", t.name))?;
            }
            let tensor = DeviceTensor {
                dtype: t.dtype,
                shape,
                values,
                scales,
                group_size: t.group_size as usize,
            };
            tensors.insert(t.name.clone(), tensor);
        }
        let bytes = stream.clone_htod(whole).map_err(|e| {
            anyhow::anyhow!("{name}: uploading {} bytes to the GPU: {e}", whole.len())
        })?;
        Ok(DeviceWeights { bytes, tensors })
    }

    pub fn tensor(&self, name: &str) -> Result<DeviceTensor> {
        self.tensors
            .get(name)
            .cloned()
            .with_context(|| format!("tensor {name} not in the model file"))
    }

    /// A view of a byte range of the upload (a tensor's values or scales).
    pub fn view(&self, range: &Range<usize>) -> CudaView<'_, u8> {
        self.bytes.slice(range.clone())
    }
}
