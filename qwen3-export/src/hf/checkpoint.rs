//! The weights of a HuggingFace checkpoint: one `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Each shard is mmap'd and its header validated up front (the
//! safetensors crate checks that the header's offsets cover the file exactly, so a truncated shard
//! is caught here); tensors are then read a few rows at a time, so the exporter's memory stays
//! far below the size of the largest tensor.

use super::config::read_json;
use anyhow::{bail, Context, Result};
use qwen3_inference::format::mapped::MappedFile;
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
    /// Its rows are runs of `run` rows, one every `stride` rows of the stored tensor (the query
    /// or gate half of each head of Qwen3.5's `q_proj`); `None`: consecutive rows.
    runs: Option<RowRuns>,
    /// `(own, rest)`: this tensor's first `own` rows are its own, the ones after them are
    /// `rest`'s (Qwen3-Next's query, key and value rows, each gathered from its fused
    /// `in_proj_qkvz`: [`Checkpoint::concat_rows`]).
    then: Option<(u64, Box<TensorMeta>)>,
    /// Its rows are columns of the stored matrix at `offset` (an expert's matrix in a fused
    /// tensor the hub stores transposed: [`Checkpoint::fused_part`]); `None`: rows are rows.
    columns: Option<Columns>,
}

/// A matrix stored transposed: row `r` is column `first + r` of a stored matrix of `stored_cols`
/// columns and as many rows as this matrix has columns.
#[derive(Debug, Clone, Copy)]
struct Columns {
    first: u64,
    stored_cols: u64,
}

/// Rows taken in runs from a stored tensor: `run` rows, then `stride - run` skipped, and so on.
#[derive(Debug, Clone, Copy)]
struct RowRuns {
    run: u64,
    stride: u64,
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
    /// By the name `Qwen3ForCausalLM` gives the tensor (`model.layers.0...`).
    location: HashMap<String, usize>,
    /// What the files call the text model that `location` calls `model.`: `model.` itself;
    /// nothing, for a bare `Qwen3Model` (Qwen3-Embedding, saved by sentence-transformers); or
    /// `model.language_model.`, for a multimodal checkpoint (Qwen3.5's
    /// `Qwen3_5ForConditionalGeneration`, whose vision tower is `model.visual.`).
    stored_prefix: &'static str,
    /// `(hidden_size, moe_intermediate_size)` of a mixture of experts, which tells a fused expert
    /// tensor in transformers 5's layout from one the hub stores transposed
    /// ([`Checkpoint::expect_experts`]).
    experts: Option<(u64, u64)>,
}

/// The prefix of a multimodal checkpoint's text model.
pub const LANGUAGE_MODEL: &str = "model.language_model.";

/// Whether the tensor names are a bare `Qwen3Model`'s: its embedding table without `model.`.
fn is_bare(names: &HashMap<String, usize>) -> bool {
    names.contains_key("embed_tokens.weight") && !names.contains_key("model.embed_tokens.weight")
}

/// `location` keyed by `Qwen3ForCausalLM`'s names, and the prefix the files use for `model.`.
fn canonical(location: HashMap<String, usize>) -> (HashMap<String, usize>, &'static str) {
    let multimodal = location.contains_key(&format!("{LANGUAGE_MODEL}embed_tokens.weight"));
    let stored_prefix = match (is_bare(&location), multimodal) {
        (true, _) => "",
        (false, true) => LANGUAGE_MODEL,
        (false, false) => return (location, "model."),
    };
    let renamed = location
        .into_iter()
        .map(|(name, i)| {
            let name = match name.strip_prefix(stored_prefix) {
                // The text model's tensors; another part's (`model.visual.`, `mtp.`) or the
                // classifier keep their names.
                Some(rest) if multimodal || !name.starts_with("lm_head.") => {
                    format!("model.{rest}")
                }
                _ => name,
            };
            (name, i)
        })
        .collect();
    (renamed, stored_prefix)
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
        let (location, stored_prefix) = canonical(location);
        Ok(Checkpoint {
            shards: vec![shard],
            location,
            stored_prefix,
            experts: None,
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
        let (location, stored_prefix) = canonical(location);
        Ok(Checkpoint {
            shards,
            location,
            stored_prefix,
            experts: None,
        })
    }

    /// The experts' widths, from the config: a fused expert tensor is then read in the layout
    /// its shape says, as transformers 5 loads it (core_model_loading.py's `Transpose` with
    /// `check_dims`: its own layout `[E, 2I, H]` / `[E, H, I]` as it is, the hub's Qwen3-VL-MoE
    /// layout `[E, H, 2I]` / `[E, I, H]` transposed).
    pub fn expect_experts(&mut self, hidden_size: u64, moe_intermediate_size: u64) {
        self.experts = Some((hidden_size, moe_intermediate_size));
    }

    /// Whether `name` is stored as it is named (a multimodal checkpoint's `model.visual.`).
    fn location_is_kept(&self, name: &str) -> bool {
        self.stored_prefix == LANGUAGE_MODEL && name.starts_with("model.visual.")
    }

    /// Names of every tensor in the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(|s| s.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// Where tensor `name` is, its dtype and shape. An expert's matrix that the checkpoint holds
    /// only inside transformers 5's fused tensors is found there ([`fused_expert_source`]).
    pub fn tensor(&self, name: &str) -> Result<TensorMeta> {
        let Some(&i) = self.location.get(name) else {
            if let Some((fused, part)) = fused_expert_source(name) {
                if let Some(src) = fused
                    .iter()
                    .find(|f| self.location.contains_key(f.as_str()))
                {
                    return self.fused_part(src, part, name);
                }
            }
            bail!("tensor {name} is missing from the checkpoint");
        };
        let shard = &self.shards[i];
        // The name in the files.
        let stored = match name.strip_prefix("model.") {
            Some(rest) if !self.location_is_kept(name) => format!("{}{rest}", self.stored_prefix),
            _ => name.to_string(),
        };
        let stored = stored.as_str();
        let info = shard
            .metadata
            .info(stored)
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
            runs: None,
            then: None,
            columns: None,
        })
    }

    /// The rows of `t` (a matrix `[rows, cols]`) that are runs of `run` rows from `first`, one
    /// every `stride` rows: `[rows / stride * run, cols]` (Qwen3.5's `q_proj` holds each head's
    /// query rows and then its gate rows: `run` = head_dim, `stride` = 2 head_dim, `first` 0 or
    /// head_dim).
    pub fn row_runs(t: &TensorMeta, first: u64, run: u64, stride: u64) -> Result<TensorMeta> {
        if t.columns.is_some() {
            bail!("{}: rows in runs of a transposed tensor", t.file.display());
        }
        let [rows, cols] = t.shape[..] else {
            bail!(
                "{}: a matrix was expected, got shape {:?}",
                t.file.display(),
                t.shape
            );
        };
        if t.runs.is_some()
            || t.then.is_some()
            || stride == 0
            || first + run > stride
            || rows % stride != 0
        {
            bail!(
                "{}: {rows} rows are not runs of {run} every {stride}",
                t.file.display()
            );
        }
        Ok(TensorMeta {
            shape: vec![rows / stride * run, cols],
            offset: t.offset + first * cols * t.bytes_per_value(),
            runs: Some(RowRuns { run, stride }),
            ..t.clone()
        })
    }

    /// The rows of `parts` one after the other, as one matrix (`[sum of rows, cols]`): each part
    /// a matrix of the same width and dtype.
    pub fn concat_rows(parts: Vec<TensorMeta>) -> Result<TensorMeta> {
        let mut parts = parts.into_iter().rev();
        let Some(mut whole) = parts.next() else {
            bail!("no tensors to concatenate");
        };
        for mut head in parts {
            let (&[rows, cols], &[tail_rows, tail_cols]) = (&head.shape[..], &whole.shape[..])
            else {
                bail!("{}: only matrices can be concatenated", head.file.display());
            };
            if head.then.is_some() {
                bail!("{}: a concatenation goes last", head.file.display());
            }
            if head.dtype != whole.dtype || cols != tail_cols {
                bail!(
                    "{}: rows of {cols} {} values cannot go before rows of {tail_cols} {}",
                    head.file.display(),
                    head.dtype.name(),
                    whole.dtype.name()
                );
            }
            head.shape = vec![rows + tail_rows, cols];
            head.then = Some((rows, Box::new(whole)));
            whole = head;
        }
        Ok(whole)
    }

    /// Expert `part.expert`'s matrix inside fused tensor `src`: in transformers 5's layout
    /// (`[E, rows, cols]`) a run of whole rows, so a [`TensorMeta`] of its own whose reads go
    /// straight to those bytes; in the hub's transposed layout (`[E, cols, rows]`, Qwen3-VL-MoE)
    /// a run of columns, read as rows ([`Columns`]).
    fn fused_part(&self, src: &str, part: FusedPart, name: &str) -> Result<TensorMeta> {
        let t = self.tensor(src)?;
        let [e, a, b] = t.shape[..] else {
            bail!(
                "{}: {src} has shape {:?}, not [experts, rows, cols]",
                t.file.display(),
                t.shape
            );
        };
        // The expert's matrix as the forward pass takes it: gate_up `[2I, H]`, down `[H, I]`.
        let expected = self.experts.map(|(h, i)| match part.half {
            Some(_) => (2 * i, h),
            None => (h, i),
        });
        let transposed = match expected {
            // transformers' rule: a tensor already in its own layout stays as it is. (So a
            // square one, H = 2I for gate_up or H = I for down, is never transposed: transformers
            // reads such a hub file the same way, and we compute what it computes.)
            None => false,
            Some(x) if x == (a, b) => false,
            Some(x) if x == (b, a) => true,
            Some((rows, cols)) => bail!(
                "{}: {src} has shape {:?}: neither [experts, {rows}, {cols}] nor the transposed \
                 [experts, {cols}, {rows}] that the config's hidden_size and \
                 moe_intermediate_size make it",
                t.file.display(),
                t.shape
            ),
        };
        let (rows, cols) = if transposed { (b, a) } else { (a, b) };
        let (first, n) = match part.half {
            // gate_up_proj: the expert's gate rows, then its up rows (modeling_qwen3_moe.py:
            // `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`).
            Some(h) => {
                if rows % 2 != 0 {
                    bail!(
                        "{}: {src} has an odd number of rows ({rows}): not gate and up halves",
                        t.file.display()
                    );
                }
                (h * rows / 2, rows / 2)
            }
            None => (0, rows),
        };
        if part.expert >= e {
            bail!("tensor {name} is missing: {src} holds {e} experts");
        }
        let slab = t.offset + part.expert * rows * cols * t.bytes_per_value();
        if transposed {
            return Ok(TensorMeta {
                shape: vec![n, cols],
                offset: slab,
                columns: Some(Columns {
                    first,
                    stored_cols: rows,
                }),
                ..t
            });
        }
        Ok(TensorMeta {
            shape: vec![n, cols],
            offset: slab + first * cols * t.bytes_per_value(),
            ..t
        })
    }

    /// Reads rows `first..first + n` of tensor `t` into `buf` (replacing its contents).
    pub fn read_rows(&self, t: &TensorMeta, first: u64, n: u64, buf: &mut Vec<u8>) -> Result<()> {
        if let Some((own, tail)) = &t.then {
            // Rows past `own` are the next tensor's: read each side into its part of `buf`.
            let mine = own.saturating_sub(first).min(n);
            let mut rest = Vec::new();
            if mine < n {
                self.read_rows(
                    tail,
                    (first + mine).saturating_sub(*own),
                    n - mine,
                    &mut rest,
                )?;
            }
            self.read_own_rows(t, first, mine, buf)?;
            buf.extend_from_slice(&rest);
            return Ok(());
        }
        self.read_own_rows(t, first, n, buf)
    }

    /// [`Self::read_rows`] within `t`'s own rows (not those of a concatenated tensor after it).
    fn read_own_rows(&self, t: &TensorMeta, first: u64, n: u64, buf: &mut Vec<u8>) -> Result<()> {
        let row_bytes = t.row_len() * t.bytes_per_value();
        let len = (n * row_bytes) as usize;
        buf.resize(len, 0);
        let shard = &self.shards[t.shard];
        let mut f = shard
            .file
            .lock()
            .map_err(|_| anyhow::anyhow!("shard lock poisoned"))?;
        if let Some(Columns {
            first: c0,
            stored_cols,
        }) = t.columns
        {
            // Rows `first..first + n` are columns `c0 + first ..` of the stored matrix, whose
            // rows are our columns: one read of the stored span from the first row's column to
            // the last row's (an expert's matrix, a few MB: one read rather than one a row),
            // then each stored row's `n` values to their rows of `buf`.
            let (v, stored_rows) = (t.bytes_per_value(), t.row_len());
            if n == 0 {
                return Ok(());
            }
            let span = ((stored_rows - 1) * stored_cols + n) * v;
            let mut stored = vec![0u8; span as usize];
            f.seek(SeekFrom::Start(t.offset + (c0 + first) * v))
                .and_then(|_| f.read_exact(&mut stored))
                .with_context(|| format!("{}: read failed", shard.path.display()))?;
            let (v, n) = (v as usize, n as usize);
            for s in 0..stored_rows as usize {
                let from = s * stored_cols as usize * v;
                for (r, value) in stored[from..from + n * v].chunks_exact(v).enumerate() {
                    let to = r * row_bytes as usize + s * v;
                    buf[to..to + v].copy_from_slice(value);
                }
            }
            return Ok(());
        }
        let RowRuns { run, stride } = t.runs.unwrap_or(RowRuns {
            run: u64::MAX,
            stride: u64::MAX,
        });
        // Logical row r is stored row (r / run) * stride + r % run; read run by run.
        let mut done = 0;
        while done < n {
            let r = first + done;
            let take = (run - r % run).min(n - done);
            let stored = match t.runs {
                Some(_) => (r / run) * stride + r % run,
                None => r,
            };
            let to = &mut buf[(done * row_bytes) as usize..((done + take) * row_bytes) as usize];
            f.seek(SeekFrom::Start(t.offset + stored * row_bytes))
                .and_then(|_| f.read_exact(to))
                .with_context(|| format!("{}: read failed", shard.path.display()))?;
            done += take;
        }
        Ok(())
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // The safetensors crate validates a header against the whole file's bytes (its offsets must
    // tile the data section up to the file's end, which is how a truncated shard is caught), so
    // the file is mapped for that check only; tensor data is read later with positioned reads.
    let mmap = MappedFile::map(&file).with_context(|| format!("{}", path.display()))?;
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

/// Which part of a fused expert tensor one expert's matrix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedPart {
    pub expert: u64,
    /// In `gate_up_proj`: 0 for gate_proj, 1 for up_proj; `None` for `down_proj`.
    pub half: Option<u64>,
}

/// For an expert's matrix under the hub's per-expert name
/// (`model.layers.3.mlp.experts.17.up_proj.weight`), the names transformers 5 stores it under,
/// fused with the other experts' (`model.layers.3.mlp.experts.gate_up_proj` `[E, 2I, H]`, or
/// `...experts.down_proj` `[E, H, I]`, with or without `.weight`), and which part it is.
pub fn fused_expert_source(name: &str) -> Option<([String; 2], FusedPart)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once(".mlp.experts.")?;
    layer.parse::<u32>().ok()?;
    let (expert, proj) = rest.split_once('.')?;
    let expert: u64 = expert.parse().ok()?;
    let (fused, half) = match proj {
        "gate_proj.weight" => ("gate_up_proj", Some(0)),
        "up_proj.weight" => ("gate_up_proj", Some(1)),
        "down_proj.weight" => ("down_proj", None),
        _ => return None,
    };
    let base = format!("model.layers.{layer}.mlp.experts.{fused}");
    Some(([format!("{base}.weight"), base], FusedPart { expert, half }))
}

/// Whether `name` is one of transformers 5's fused expert tensors
/// (`model.layers.N.mlp.experts.gate_up_proj` or `.down_proj`, with or without `.weight`).
pub fn is_fused_expert_tensor(name: &str) -> bool {
    let Some((layer, rest)) = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once(".mlp.experts."))
    else {
        return false;
    };
    layer.parse::<u32>().is_ok()
        && matches!(
            rest,
            "gate_up_proj" | "down_proj" | "gate_up_proj.weight" | "down_proj.weight"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_expert_names_map_to_fused_parts() {
        let (names, part) =
            fused_expert_source("model.layers.3.mlp.experts.17.up_proj.weight").unwrap();
        assert_eq!(names[1], "model.layers.3.mlp.experts.gate_up_proj");
        assert_eq!(
            part,
            FusedPart {
                expert: 17,
                half: Some(1)
            }
        );
        let (names, part) =
            fused_expert_source("model.layers.0.mlp.experts.2.down_proj.weight").unwrap();
        assert_eq!(names[0], "model.layers.0.mlp.experts.down_proj.weight");
        assert_eq!(
            part,
            FusedPart {
                expert: 2,
                half: None
            }
        );
        assert!(fused_expert_source("model.layers.0.mlp.down_proj.weight").is_none());
        assert!(fused_expert_source("model.layers.0.mlp.experts.x.down_proj.weight").is_none());
        assert!(is_fused_expert_tensor(
            "model.layers.12.mlp.experts.gate_up_proj"
        ));
        assert!(!is_fused_expert_tensor(
            "model.layers.12.mlp.experts.0.gate_proj.weight"
        ));
    }

    /// An expert's matrices read from the hub's transposed fused tensors (Qwen3-VL-MoE's
    /// `gate_up_proj` `[E, H, 2I]`, `down_proj` `[E, I, H]`), bf16, in chunks of rows: each value
    /// where the transposed layout puts it.
    #[test]
    fn transposed_fused_experts_read_as_rows() {
        use safetensors::tensor::{serialize_to_file, TensorView};
        let (e, h, i) = (3usize, 5usize, 3usize);
        // Value at [expert][row][col] of a stored tensor: distinct bf16 bits.
        let bits =
            |t: usize, x: usize, r: usize, c: usize| (1000 * t + 100 * x + 10 * r + c) as u16;
        let stored = |t: usize, rows: usize, cols: usize| -> Vec<u8> {
            (0..e)
                .flat_map(|x| (0..rows).flat_map(move |r| (0..cols).map(move |c| (x, r, c))))
                .flat_map(|(x, r, c)| bits(t, x, r, c).to_le_bytes())
                .collect()
        };
        let (gate_up, down) = (stored(1, h, 2 * i), stored(2, i, h));
        let dir = std::env::temp_dir().join(format!("pq-columns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let views = [
            (
                "model.layers.0.mlp.experts.gate_up_proj",
                TensorView::new(Dtype::BF16, vec![e, h, 2 * i], &gate_up).unwrap(),
            ),
            (
                "model.layers.0.mlp.experts.down_proj",
                TensorView::new(Dtype::BF16, vec![e, i, h], &down).unwrap(),
            ),
        ];
        serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
        let mut ckpt = Checkpoint::open(&dir).unwrap();
        ckpt.expect_experts(h as u64, i as u64);
        // (name, logical shape, the stored value behind logical [r][c]).
        type At = Box<dyn Fn(usize, usize) -> u16>;
        let cases: [(&str, [usize; 2], At); 3] = [
            ("gate_proj", [i, h], Box::new(move |r, c| bits(1, 1, c, r))),
            (
                "up_proj",
                [i, h],
                Box::new(move |r, c| bits(1, 1, c, i + r)),
            ),
            ("down_proj", [h, i], Box::new(move |r, c| bits(2, 1, c, r))),
        ];
        for (proj, [rows, cols], at) in cases {
            let t = ckpt
                .tensor(&format!("model.layers.0.mlp.experts.1.{proj}.weight"))
                .unwrap();
            assert_eq!(t.shape, vec![rows as u64, cols as u64], "{proj}");
            // In chunks of two rows (the last may be one), as the export reads them.
            let mut got = Vec::new();
            let mut buf = Vec::new();
            for first in (0..rows).step_by(2) {
                let n = 2.min(rows - first);
                ckpt.read_rows(&t, first as u64, n as u64, &mut buf)
                    .unwrap();
                got.extend(
                    buf.chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]])),
                );
            }
            let want: Vec<u16> = (0..rows)
                .flat_map(|r| (0..cols).map(move |c| (r, c)))
                .map(|(r, c)| at(r, c))
                .collect();
            assert_eq!(got, want, "{proj}");
        }
        // A fused tensor of neither layout is refused by name.
        ckpt.expect_experts(h as u64, 4);
        let e = ckpt
            .tensor("model.layers.0.mlp.experts.0.gate_proj.weight")
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither [experts, 8, 5]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
