//! The weights of a HuggingFace checkpoint: one `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Each shard is mmap'd and its header validated up front (the
//! safetensors crate checks that the header's offsets cover the file exactly, so a truncated shard
//! is caught here); tensors are then read a few rows at a time, so the exporter's memory stays
//! far below the size of the largest tensor.

use super::config::read_json;
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::{SafeTensorError, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

struct Shard {
    path: PathBuf,
    /// Tensor bytes are read with positioned reads, not through a mapping, so pages of the
    /// checkpoint do not accumulate in our resident memory as the export proceeds.
    file: Mutex<File>,
    /// Bytes before the data section: the 8-byte length plus the JSON header.
    data_start: u64,
    metadata: Metadata,
}

/// A tensor's source dtype, as stored in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDType {
    F32,
    F16,
    Bf16,
}

impl SourceDType {
    pub fn name(self) -> &'static str {
        match self {
            SourceDType::F32 => "f32",
            SourceDType::F16 => "f16",
            SourceDType::Bf16 => "bf16",
        }
    }
}

/// Where a tensor is and what it holds.
#[derive(Debug, Clone)]
pub struct TensorMeta {
    pub dtype: SourceDType,
    pub shape: Vec<u64>,
    /// The shard holding it.
    pub file: PathBuf,
    /// Absolute byte offset of its first value in that shard.
    offset: u64,
    shard: usize,
}

impl TensorMeta {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Values per row (the last dimension; 1-D tensors are one row).
    pub fn row_len(&self) -> u64 {
        *self.shape.last().unwrap_or(&1)
    }

    pub fn bytes_per_value(&self) -> u64 {
        match self.dtype {
            SourceDType::F32 => 4,
            SourceDType::F16 | SourceDType::Bf16 => 2,
        }
    }
}

/// Converts little-endian source values to f32 (exact for every source dtype), appending to `out`.
pub fn to_f32(dtype: SourceDType, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        SourceDType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        // bf16 is the top half of an f32: shifting its bits up is the exact conversion.
        SourceDType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)),
        ),
        SourceDType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        ),
    }
}

/// Converts source values to bf16 bit patterns, appending to `out`: bf16 passes through
/// untouched, f32 and f16 are rounded to nearest-even (what `tensor.to(torch.bfloat16)` does).
pub fn to_bf16_bits(dtype: SourceDType, bytes: &[u8], out: &mut Vec<u16>) {
    match dtype {
        SourceDType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        ),
        _ => {
            let mut f = Vec::with_capacity(bytes.len() / 2);
            to_f32(dtype, bytes, &mut f);
            out.extend(f.into_iter().map(|v| half::bf16::from_f32(v).to_bits()));
        }
    }
}

/// All shards of a checkpoint and which shard holds each tensor.
pub struct Checkpoint {
    shards: Vec<Shard>,
    location: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens `hf_dir/model.safetensors.index.json` and its shards if the index exists, otherwise
    /// `hf_dir/model.safetensors`.
    pub fn open(hf_dir: &Path) -> Result<Checkpoint> {
        let index_path = hf_dir.join("model.safetensors.index.json");
        if index_path.exists() {
            return Self::open_sharded(hf_dir, &index_path);
        }
        let single = hf_dir.join("model.safetensors");
        if !single.exists() {
            bail!(
                "{}: no model.safetensors and no model.safetensors.index.json",
                hf_dir.display()
            );
        }
        let shard = open_shard(&single)?;
        let location = shard
            .metadata
            .tensors()
            .into_keys()
            .map(|name| (name, 0))
            .collect();
        Ok(Checkpoint {
            shards: vec![shard],
            location,
        })
    }

    fn open_sharded(hf_dir: &Path, index_path: &Path) -> Result<Checkpoint> {
        let index = read_json(index_path)?;
        let Some(map) = index.get("weight_map").and_then(|m| m.as_object()) else {
            bail!("{}: no weight_map object", index_path.display());
        };
        let mut shard_of_file: HashMap<String, usize> = HashMap::new();
        let mut shards = Vec::new();
        let mut location = HashMap::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                bail!(
                    "{}: weight_map[{tensor}] is not a file name",
                    index_path.display()
                );
            };
            // Shard names are plain file names inside the checkpoint directory.
            if file.contains('/') || file.contains('\\') || file == ".." {
                bail!(
                    "{}: shard name {file:?} is not a plain file name",
                    index_path.display()
                );
            }
            let i = match shard_of_file.get(file) {
                Some(&i) => i,
                None => {
                    let path = hf_dir.join(file);
                    if !path.exists() {
                        bail!(
                            "{}: names shard {file}, which does not exist",
                            index_path.display()
                        );
                    }
                    shards.push(open_shard(&path)?);
                    shard_of_file.insert(file.to_string(), shards.len() - 1);
                    shards.len() - 1
                }
            };
            if shards[i].metadata.info(tensor).is_none() {
                bail!(
                    "{}: says {tensor} is in {file}, but that shard does not hold it",
                    index_path.display()
                );
            }
            location.insert(tensor.clone(), i);
        }
        Ok(Checkpoint { shards, location })
    }

    /// Names of every tensor in the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(|s| s.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// Where tensor `name` is, its dtype and shape.
    pub fn tensor(&self, name: &str) -> Result<TensorMeta> {
        let Some(&i) = self.location.get(name) else {
            bail!("tensor {name} is missing from the checkpoint");
        };
        let shard = &self.shards[i];
        let info = shard
            .metadata
            .info(name)
            .with_context(|| format!("{}: tensor {name} vanished", shard.path.display()))?;
        let dtype = match info.dtype {
            Dtype::F32 => SourceDType::F32,
            Dtype::F16 => SourceDType::F16,
            Dtype::BF16 => SourceDType::Bf16,
            other => bail!(
                "{}: tensor {name} has dtype {other:?}; only F32, F16 and BF16 are supported",
                shard.path.display()
            ),
        };
        Ok(TensorMeta {
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            file: shard.path.clone(),
            offset: shard.data_start + info.data_offsets.0 as u64,
            shard: i,
        })
    }

    /// Reads rows `first..first + n` of tensor `t` into `buf` (replacing its contents).
    pub fn read_rows(&self, t: &TensorMeta, first: u64, n: u64, buf: &mut Vec<u8>) -> Result<()> {
        let row_bytes = t.row_len() * t.bytes_per_value();
        let len = (n * row_bytes) as usize;
        buf.resize(len, 0);
        let shard = &self.shards[t.shard];
        let mut f = shard
            .file
            .lock()
            .map_err(|_| anyhow::anyhow!("shard lock poisoned"))?;
        f.seek(SeekFrom::Start(t.offset + first * row_bytes))
            .and_then(|_| f.read_exact(buf))
            .with_context(|| format!("{}: read failed", shard.path.display()))
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // The safetensors crate validates a header against the whole file's bytes (its offsets must
    // tile the data section up to the file's end, which is how a truncated shard is caught), so
    // the file is mapped for that check only; tensor data is read later with positioned reads.
    // SAFETY: the mapping is read-only, lives only inside this function, and is only read
    // through `&[u8]` with bounds checks. It is sound as long as no other process truncates or
    // rewrites the checkpoint during the export, the usual condition for reading a file.
    let mmap =
        unsafe { Mmap::map(&file) }.with_context(|| format!("{}: cannot mmap", path.display()))?;
    let (n, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| match e {
        SafeTensorError::MetadataIncompleteBuffer => anyhow::anyhow!(
            "{}: not a valid safetensors file: truncated (its header describes more data than the file holds)",
            path.display()
        ),
        e => anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display()),
    })?;
    drop(mmap);
    Ok(Shard {
        path: path.to_path_buf(),
        file: Mutex::new(file),
        data_start: 8 + n as u64,
        metadata,
    })
}
