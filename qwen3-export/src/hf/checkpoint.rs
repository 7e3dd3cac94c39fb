//! The weights of a HuggingFace checkpoint: one `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Each shard is mmap'd and its header validated up front (the
//! safetensors crate checks that the header's offsets cover the file exactly, so a truncated shard
//! is caught here); tensors are then converted to f32 one at a time, so the exporter's memory
//! stays near the size of the largest tensor.

use super::config::read_json;
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Bytes before the data section: the 8-byte length plus the JSON header.
    data_start: usize,
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

/// A tensor's raw bytes in the checkpoint (little-endian, row-major).
pub struct RawTensor<'a> {
    pub dtype: SourceDType,
    pub shape: Vec<u64>,
    pub bytes: &'a [u8],
    pub file: &'a Path,
}

impl RawTensor<'_> {
    /// The values as f32 (exact for every source dtype).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            SourceDType::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            // bf16 is the top half of an f32: shifting its bits up is the exact conversion.
            SourceDType::Bf16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                .collect(),
            SourceDType::F16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }

    /// The values as bf16 bit patterns: bf16 sources pass through untouched, others are rounded
    /// to nearest-even (what `tensor.to(torch.bfloat16)` does).
    pub fn to_bf16_bits(&self) -> Vec<u16> {
        match self.dtype {
            SourceDType::Bf16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect(),
            _ => self
                .to_f32()
                .into_iter()
                .map(|v| half::bf16::from_f32(v).to_bits())
                .collect(),
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

    /// The raw bytes of tensor `name`, with its dtype and shape.
    pub fn tensor(&self, name: &str) -> Result<RawTensor<'_>> {
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
        let (a, b) = info.data_offsets;
        // read_metadata validated that the offsets tile the data section, which ends at the end of
        // the file; `get` keeps this a checked access all the same.
        let bytes = shard
            .mmap
            .get(shard.data_start + a..shard.data_start + b)
            .with_context(|| {
                format!(
                    "{}: tensor {name} lies outside the file",
                    shard.path.display()
                )
            })?;
        Ok(RawTensor {
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            bytes,
            file: &shard.path,
        })
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // SAFETY: the mapping is read-only and only read through `&[u8]`, bounds-checked. It is sound
    // as long as no other process truncates or rewrites the checkpoint while we export it; that is
    // the usual, documented condition for exporting from a file.
    let mmap =
        unsafe { Mmap::map(&file) }.with_context(|| format!("{}: cannot mmap", path.display()))?;
    let (n, metadata) = SafeTensors::read_metadata(&mmap)
        .map_err(|e| anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
    Ok(Shard {
        path: path.to_path_buf(),
        data_start: 8 + n,
        mmap,
        metadata,
    })
}
