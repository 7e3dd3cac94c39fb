//! Reads and validates a model file, then hands out zero-copy views of its tensors.
//!
//! The whole file is one read-only mmap. [`Header::parse`] checks every field against the file's
//! real length before anything is trusted, so a truncated or hostile file is an error, never an
//! out-of-bounds read or an unbounded allocation. Tensor views borrow from the [`ModelFile`]
//! (`&'a self`), so the borrow checker guarantees no view outlives the mapping.

use super::bytes::ByteReader;
use super::mapped::{MappedFile, MappedParts};
use super::view::{view_bytes, view_data, TensorData, TensorView};
use super::{
    align_up, expected_tensors, matrix_storage_ok, stays_bf16, tensor_nbytes, DType, ModelConfig,
    TensorKind, ALIGN, BYTE_ORDER_MARK, FORMAT_VERSION, MAGIC, OLDEST_READABLE_VERSION,
    PREAMBLE_LEN,
};
use crate::pages::{self, HugePages, PageShare};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One row of the tensor directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub group_size: u32,
    /// Byte offset of the tensor's first byte from the start of the file; for a GGUF file's
    /// tensor repacked at open (`gguf/repack.rs`), from the start of the repacked bytes instead
    /// ([`ModelFile::tensor_bytes`] knows which).
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    /// The spec a [`super::ModelWriter`] writes this tensor by (its name, dtype, shape and
    /// group size), to copy a file tensor by tensor.
    pub fn spec(&self) -> super::writer::TensorSpec {
        super::writer::TensorSpec {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            group_size: self.group_size,
        }
    }
}

/// The parsed and validated header.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub header_len: u64,
    pub file_len: u64,
    pub config: ModelConfig,
    pub tensors: Vec<TensorInfo>,
}

/// What one decoded token reads of the weights: parameters and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveWeights {
    pub params: u64,
    pub bytes: u64,
}

impl Header {
    /// The weights one token reads: every tensor, except that of a mixture of experts' experts
    /// only `num_experts_per_tok` (counted as that share of each sparse layer's experts, which
    /// all have one size and storage within a layer). A dense model reads every tensor.
    pub fn active_weights(&self) -> ActiveWeights {
        let share = self
            .config
            .moe
            .as_ref()
            .map_or(1.0, |m| m.num_experts_per_tok as f64 / m.num_experts as f64);
        let (mut params, mut bytes) = (0.0, 0.0);
        for t in &self.tensors {
            let f = if t.name.contains(".mlp.experts.") {
                share
            } else {
                1.0
            };
            params += f * t.shape.iter().product::<u64>() as f64;
            bytes += f * t.nbytes as f64;
        }
        ActiveWeights {
            params: params.round() as u64,
            bytes: bytes.round() as u64,
        }
    }

    /// Parses the header at the start of `file` (the whole file's bytes) and validates it against
    /// the file: lengths, alignment, bounds, and that the tensors are exactly those a Qwen3 model
    /// with this config needs, with the right shapes and dtypes.
    pub fn parse(file: &[u8]) -> Result<Header> {
        let mut r = ByteReader::new(file);
        let magic = r
            .bytes(8, "magic")
            .context("not a pico-qwen model file (shorter than its magic)")?;
        if magic.starts_with(b"GGUF") {
            bail!(
                "this is a GGUF file (llama.cpp's format), not a pico-qwen model file: export the HuggingFace checkpoint it was made from with `qwen3 export ORG/NAME model.bin` (or a checkpoint directory)"
            );
        }
        if magic != MAGIC {
            bail!("not a pico-qwen model file (wrong magic {magic:02x?})");
        }
        let version = r.u32("format version")?;
        if version > FORMAT_VERSION {
            bail!("format version {version} is newer than this build reads ({FORMAT_VERSION}); update pico-qwen");
        }
        if version < OLDEST_READABLE_VERSION {
            bail!("format version {version} is older than this build reads ({OLDEST_READABLE_VERSION} to {FORMAT_VERSION}); re-export the model");
        }
        let bom = r.u32("byte-order mark")?;
        if bom != BYTE_ORDER_MARK {
            bail!("byte-order mark {bom:#010x} is wrong: not a little-endian pico-qwen file");
        }
        let header_len = r.u64("header length")?;
        let file_len = r.u64("file length")?;
        let actual = file.len() as u64;
        if file_len != actual {
            bail!("file is {actual} bytes but its header says {file_len}: truncated or damaged");
        }
        if header_len < PREAMBLE_LEN || header_len > actual {
            bail!("header length {header_len} is outside the file ({actual} bytes)");
        }
        // From here on, read only inside the header.
        let mut r = ByteReader::new(&file[PREAMBLE_LEN as usize..header_len as usize]);
        let config = ModelConfig::decode(&mut r, version)?;
        // Smallest entry: empty name (4) + dtype (1) + rank (1) + group (4) + offset (8) + len (8).
        let n = r.count(26, "tensor count")?;
        let mut tensors = Vec::with_capacity(n);
        let data_start = align_up(header_len).context("header length overflows")?;
        for i in 0..n {
            let name = r.string("tensor name")?;
            let code = r.u8("tensor dtype")?;
            let Some(dtype) = DType::from_code(code) else {
                bail!("tensor {i} ({name}): unknown dtype code {code}");
            };
            if version < dtype.since_version() {
                bail!(
                    "tensor {name}: {dtype} in a format version {version} file ({dtype} came with version {})",
                    dtype.since_version()
                );
            }
            let rank = r.u8("tensor rank")? as usize;
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(r.u64("tensor dim")?);
            }
            let group_size = r.u32("tensor group size")?;
            let offset = r.u64("tensor offset")?;
            let nbytes = r.u64("tensor length")?;
            let Some(expect) = tensor_nbytes(dtype, &shape, group_size) else {
                bail!("tensor {name}: shape {shape:?} is invalid for {dtype} with group size {group_size}");
            };
            if nbytes != expect {
                bail!("tensor {name}: directory says {nbytes} bytes, its shape needs {expect}");
            }
            if offset % ALIGN != 0 {
                bail!("tensor {name}: offset {offset} is not {ALIGN}-byte aligned");
            }
            match offset.checked_add(nbytes) {
                Some(end) if offset >= data_start && end <= file_len => {}
                _ => bail!(
                    "tensor {name}: bytes {offset}..+{nbytes} lie outside the data section ({data_start}..{file_len})"
                ),
            }
            tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                group_size,
                offset,
                nbytes,
            });
        }
        if r.remaining() != 0 {
            bail!("header has {} unexplained trailing bytes", r.remaining());
        }
        let h = Header {
            version,
            header_len,
            file_len,
            config,
            tensors,
        };
        h.check_tensor_set()?;
        Ok(h)
    }

    /// The directory must hold exactly the tensors a Qwen3 model of this config needs.
    pub(crate) fn check_tensor_set(&self) -> Result<()> {
        let expected = expected_tensors(&self.config);
        if expected.len() != self.tensors.len() {
            bail!(
                "the directory has {} tensors; a model with this config has {}",
                self.tensors.len(),
                expected.len()
            );
        }
        let by_name: HashMap<&str, &TensorInfo> =
            self.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        for e in &expected {
            let Some(t) = by_name.get(e.name.as_str()) else {
                bail!("tensor {} is missing", e.name);
            };
            if t.shape != e.shape {
                bail!(
                    "tensor {}: shape {:?}, expected {:?}",
                    e.name,
                    t.shape,
                    e.shape
                );
            }
            // Norms and biases are f32; a matrix is in the file's dtype, or in a q4 file perhaps
            // q6 or q8 (whichever mix the export chose, `Q4Mix`).
            let ok = match e.kind {
                TensorKind::Norm | TensorKind::Bias | TensorKind::Router | TensorKind::Param => {
                    t.dtype == DType::F32 && t.group_size == 0
                }
                TensorKind::Matrix => {
                    matrix_storage_ok(&self.config, &e.name, &e.shape, t.dtype, t.group_size)
                }
            };
            if !ok {
                let bf16 = e.kind == TensorKind::Matrix && stays_bf16(&self.config, &e.shape);
                let k_mix = self.config.dtype.is_k_quant() || t.dtype.is_k_quant();
                let expected = match (e.kind, self.config.dtype) {
                    _ if bf16 => "bf16 (its rows are not a multiple of the group size)",
                    (TensorKind::Matrix, _) if k_mix => {
                        "Q4_K, Q5_K or Q6_K (256), q8 or q4 (32), or f32 or bf16 (0)"
                    }
                    (TensorKind::Matrix, DType::Q4) => "q4, q6 or q8",
                    (TensorKind::Matrix, d) => d.name(),
                    _ => "f32",
                };
                let group = match e.kind {
                    // A GGUF's mix names each type's group above.
                    TensorKind::Matrix if k_mix => String::new(),
                    TensorKind::Matrix if !bf16 => format!(" (group {})", self.config.group_size),
                    _ => " (group 0)".to_string(),
                };
                bail!(
                    "tensor {}: stored as {} (group {}), expected {expected}{group}",
                    e.name,
                    t.dtype,
                    t.group_size,
                );
            }
        }
        Ok(())
    }
}

/// Bytes derived once from the file's tensors that live as long as the file: the kernels' own
/// order of the q4, q6, q8 and K-quant matrices (`kernels/dot/interleaved.rs`), made when the
/// model is loaded ([`ModelFile::derived`]), or a GGUF file's Q8_0 tensors in this format's q8
/// layout (`gguf/repack.rs`), made when it is opened. Views into them borrow from the [`ModelFile`], as
/// the mapped tensors do, so none outlives it.
pub struct Derived {
    bytes: HugePages<u8>,
    at: HashMap<String, Range<usize>>,
}

impl Derived {
    /// `bytes`, of which tensor `name` holds `at[name]`. Panics if a range is outside `bytes`
    /// (a caller's bug).
    pub fn new(bytes: HugePages<u8>, at: HashMap<String, Range<usize>>) -> Derived {
        assert!(
            at.values()
                .all(|r| r.start <= r.end && r.end <= bytes.len()),
            "derived bytes: a range outside the buffer"
        );
        Derived { bytes, at }
    }

    /// Tensor `name`'s derived bytes, if it has any.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.at.get(name).map(|r| &self.bytes[r.clone()])
    }

    /// Tensor `name`'s derived bytes as a tensor of its dtype and shape (derived bytes are laid
    /// out as the file lays the tensor out), if it has any.
    pub fn view<'a>(&'a self, file: &ModelFile, name: &str) -> Result<Option<TensorData<'a>>> {
        let (Some(bytes), Some(&i)) = (self.get(name), file.index.get(name)) else {
            return Ok(None);
        };
        let info = &file.header.tensors[i];
        if bytes.len() as u64 != info.nbytes {
            bail!(
                "{name}: {} derived bytes for a tensor of {}",
                bytes.len(),
                info.nbytes
            );
        }
        Ok(Some(
            view_bytes(bytes, info).with_context(|| format!("{name} (derived)"))?,
        ))
    }
}

/// What will read an opened file's weights. A model file's tensors are mapped where they lie,
/// the same for every reader; a GGUF's Q8_0, Q5_0 and Q4_0 matrices are laid out afresh at open
/// (`gguf/repack.rs`), and that copy can be made in the order its reader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Anyone (the plain backend, a GPU's upload, `export`, a test): every tensor in this
    /// format's layout.
    Any,
    /// Kernels that read q8 (`q8`) and q4 (`q4`) in groups of 32 in the interleaved order
    /// (`quant::interleaved`; AVX-512's: `backend::CpuBackend::reader` says which this CPU's
    /// read): a GGUF's matrices of those types are laid out straight in it, rather than in this
    /// format's order and then copied once more by `Model::load` (or, for q8, read in the
    /// slower file order to spare that copy). Each such view's `data` is marked as in the
    /// kernels' order ([`super::view::TensorData`]), and its `interleaved` form is what the
    /// kernels read. An embedding table keeps the file's order unless it is also the classifier
    /// (tied): then its rows are looked up from the interleaved order (`kernels/embedding.rs`),
    /// rather than the table be held twice.
    Interleaved { q8: bool, q4: bool },
}

/// An open model file: its read-only mapping (a GGUF file split in parts: one a part) plus its
/// validated header.
pub struct ModelFile {
    path: PathBuf,
    mmap: MappedParts,
    header: Header,
    index: HashMap<String, usize>,
    /// See [`ModelFile::derived`].
    derived: OnceLock<std::result::Result<Derived, String>>,
    /// A GGUF file's tensors stored in another order of their bytes (Q8_0: `gguf/repack.rs`),
    /// laid out as this format lays them out, made at open; their [`TensorInfo`]s locate them
    /// here, not in the mapping.
    repacked: Option<Derived>,
    /// The repacked tensors laid out in the CPU kernels' order ([`Reader::Interleaved`]).
    kernels_order: std::collections::HashSet<String>,
}

impl ModelFile {
    /// Maps and validates `path`, for any reader. Errors name the file and the problem.
    pub fn open(path: &Path) -> Result<ModelFile> {
        Self::open_for(path, Reader::Any)
    }

    /// [`ModelFile::open`] for `reader`.
    pub fn open_for(path: &Path, reader: Reader) -> Result<ModelFile> {
        Self::open_inner(path, reader).with_context(|| format!("{}", path.display()))
    }

    fn open_inner(path: &Path, reader: Reader) -> Result<ModelFile> {
        if cfg!(target_endian = "big") {
            bail!("model files are little-endian; big-endian hosts are not supported");
        }
        if path.is_dir() {
            if path.join("config.json").is_file() {
                let stem = path.file_name().unwrap_or_default().to_string_lossy();
                bail!(
                    "a HuggingFace checkpoint directory, not a model file: convert it once with \
                     `qwen3 export {} {stem}.bin`, then run {stem}.bin",
                    path.display()
                );
            }
            bail!("a directory, not a model file (written by `qwen3 export`)");
        }
        let file = File::open(path).context("cannot open")?;
        // Mapped, never copied; every access below is bounds-checked against its length.
        let first = MappedFile::map(&file)?;
        // A GGUF file (llama.cpp's) is read through its own header, in place (gguf/model.rs),
        // with its other parts if it is the first part of a split file.
        let (mmap, header, repacked, kernels_order) = match crate::gguf::is_gguf(&first) {
            true => {
                let gguf = || -> Result<_> {
                    let (g, mmap) = crate::gguf::open_parts(path, first)?;
                    mmap.advise_huge_pages();
                    let layout = crate::gguf::model::layout(&g, mmap.len() as u64)?;
                    // The file's pages of the repacked tensors are read no more.
                    let release = |r: Range<usize>| mmap.release(r);
                    let (repacked, kernels_order) =
                        crate::gguf::repack::repack(&g, &layout, &mmap, &release, reader)?;
                    Ok((mmap, layout.header, repacked, kernels_order))
                };
                gguf().context("a GGUF file")?
            }
            false => {
                let header = Header::parse(&first)?;
                let mmap = MappedParts::one(first);
                // Decode streams every weight once a token; 2 MiB pages stream faster
                // (crate::pages).
                mmap.advise_huge_pages();
                (mmap, header, None, Default::default())
            }
        };
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(ModelFile {
            path: path.to_path_buf(),
            mmap,
            header,
            index,
            derived: OnceLock::new(),
            repacked,
            kernels_order,
        })
    }

    /// The bytes `build` derives from this file, built at the first call and kept as long as the
    /// file (the first call's `build` is the one that runs: a file has one kind of derived
    /// bytes, the CPU kernels' order of its matrices). An error from `build` is kept and
    /// returned again to later calls.
    ///
    /// The mapped pages of the tensors the derived bytes replace are then released from this
    /// process's resident memory ([`MappedFile::release`]): they are read again only where
    /// something reads a tensor in the file's order (an embedding row).
    pub fn derived(&self, build: impl FnOnce(&ModelFile) -> Result<Derived>) -> Result<&Derived> {
        self.derived
            .get_or_init(|| {
                let derived = build(self).map_err(|e| format!("{e:#}"))?;
                // (A repacked tensor's offset is not in the mapping: nothing to release there.)
                let repacked = |name: &str| {
                    self.repacked
                        .as_ref()
                        .is_some_and(|r| r.get(name).is_some())
                };
                for name in derived.at.keys().filter(|n| !repacked(n)) {
                    if let Some(&i) = self.index.get(name) {
                        let t = &self.header.tensors[i];
                        self.mmap
                            .release(t.offset as usize..(t.offset + t.nbytes) as usize);
                    }
                }
                Ok(derived)
            })
            .as_ref()
            .map_err(|e| anyhow!("{}: {e}", self.path.display()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether every tensor lies in the mapped file, at its offset, in this format's layout
    /// ([`ModelFile::bytes`] then holds them all, unless the file is a GGUF split in parts):
    /// false for a GGUF file whose Q8_0 tensors were repacked at open.
    pub fn in_place(&self) -> bool {
        self.repacked.is_none()
    }

    /// Whether tensor `name` was made at open (a GGUF's repacked tensor), not mapped in place.
    pub fn is_repacked(&self, name: &str) -> bool {
        self.repacked
            .as_ref()
            .is_some_and(|r| r.get(name).is_some())
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn config(&self) -> &ModelConfig {
        &self.header.config
    }

    /// How much of the mapped file (every part of a split GGUF file) is resident, and how much of
    /// it through 2 MiB pages (Linux).
    pub fn page_share(&self) -> Option<PageShare> {
        pages::huge_page_share_of(self.mmap.parts().map(<[u8]>::as_ptr))
    }

    /// The mapped bytes (every part's, for a split GGUF file).
    pub fn mapped_len(&self) -> usize {
        self.mmap.len()
    }

    /// The whole mapped file (for a GPU backend that uploads it in one copy); an error for a
    /// GGUF file split in parts, which are not one run of memory.
    pub fn bytes(&self) -> Result<&[u8]> {
        self.mmap.whole().with_context(|| {
            format!(
                "{}: a GGUF file split in {} parts, which this backend cannot upload as one; \
                 merge them first (llama-gguf-split --merge) or run it on the CPU",
                self.path.display(),
                self.mmap.count()
            )
        })
    }

    /// The bytes of the tensor called `name`, laid out as this format lays it out (its values,
    /// then for a quantized one its scales): from the mapping, or from a GGUF's repacked bytes.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let Some(&i) = self.index.get(name) else {
            bail!("{}: tensor {name} not in the file", self.path.display());
        };
        if let Some(bytes) = self.repacked.as_ref().and_then(|r| r.get(name)) {
            return Ok(bytes);
        }
        let t = &self.header.tensors[i];
        self.mmap
            .get(t.offset as usize..(t.offset + t.nbytes) as usize)
            .with_context(|| format!("{}: tensor {name} out of bounds", self.path.display()))
    }

    /// A borrowed view of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let Some(&i) = self.index.get(name) else {
            bail!("{}: tensor {name} not in the file", self.path.display());
        };
        let info = &self.header.tensors[i];
        let data = match self.repacked.as_ref().and_then(|r| r.get(name)) {
            Some(bytes) => view_bytes(bytes, info),
            None => view_data(&self.mmap, info),
        }
        .with_context(|| format!("{}: tensor {name}", self.path.display()))?;
        // A matrix laid out for the CPU's kernels is read in that order only (Reader::Interleaved).
        let (data, interleaved) = match self.kernels_order.contains(name) {
            true => (data.kernels_only(), Some(data)),
            false => (data, None),
        };
        Ok(TensorView {
            name: &info.name,
            shape: &info.shape,
            data,
            interleaved,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::config::tests::tiny_config;
    use crate::format::tensor_specs;
    use crate::format::writer::{self, ModelWriter};
    use crate::quant::Q8;

    /// Writes a tiny model file whose every value is distinct, so views can be checked.
    pub(crate) fn write_tiny(path: &Path, dtype: DType) -> ModelConfig {
        write_tiny_as(path, dtype, |_| {})
    }

    /// [`write_tiny`] with its tensor specs changed by `edit` first.
    fn write_tiny_as(
        path: &Path,
        dtype: DType,
        edit: impl Fn(&mut writer::TensorSpec),
    ) -> ModelConfig {
        let c = tiny_config(dtype);
        let mut specs = tensor_specs(&c);
        specs.iter_mut().for_each(edit);
        let mut w = ModelWriter::create(path, &c, specs.clone()).unwrap();
        for s in &specs {
            let n = s.shape.iter().product::<u64>() as usize;
            match s.dtype {
                DType::F32 => w
                    .write_f32(&s.name, &(0..n).map(|i| i as f32).collect::<Vec<_>>())
                    .unwrap(),
                DType::Bf16 => w
                    .write_bf16(&s.name, &(0..n).map(|i| i as u16).collect::<Vec<_>>())
                    .unwrap(),
                DType::Q8 => {
                    let q: Vec<i8> = (0..n).map(|i| (i % 251) as i8).collect();
                    let sc: Vec<f32> = (0..n / s.group_size as usize).map(|i| i as f32).collect();
                    w.write_q8(&s.name, &q, &sc).unwrap()
                }
                DType::Q4 => {
                    let p: Vec<u8> = (0..n / 2).map(|i| (i % 251) as u8).collect();
                    let sc: Vec<u16> = (0..n / s.group_size as usize).map(|i| i as u16).collect();
                    w.write_q4(&s.name, &p, &sc).unwrap()
                }
                DType::Q6 => {
                    let p: Vec<u8> = (0..n / 4 * 3).map(|i| (i % 251) as u8).collect();
                    let sc: Vec<u16> = (0..n / s.group_size as usize).map(|i| i as u16).collect();
                    w.write_q6(&s.name, &p, &sc).unwrap()
                }
                DType::K(_) => unreachable!("not a model file's dtype"),
            }
        }
        w.finish().unwrap();
        c
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pq-reader-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join("m.bin")
    }

    /// A q4 file's matrices may be q4, q6 or q8 at the file's group size (any mix, not only the ones
    /// the export writes), its tables also q8 in groups of 64; a layer matrix in q8
    /// at another group size, or in bf16, is refused, naming the tensor.
    #[test]
    fn q4_files_take_any_mix_of_q4_q6_and_q8() {
        // Each case stores the tensors whose names end with its suffix as (dtype, group size).
        let cases = [
            ("default", "", None, true),
            (
                "tables-q4",
                "embed_tokens.weight",
                Some((DType::Q4, 32)),
                true,
            ),
            (
                "tables-q8-32",
                "embed_tokens.weight",
                Some((DType::Q8, 32)),
                true,
            ),
            ("down-q4", "down_proj.weight", Some((DType::Q4, 32)), true),
            ("q-proj-q8", "q_proj.weight", Some((DType::Q8, 32)), true),
            ("down-q6", "down_proj.weight", Some((DType::Q6, 32)), true),
            (
                "tables-q6",
                "embed_tokens.weight",
                Some((DType::Q6, 32)),
                true,
            ),
            (
                "down-q6-64",
                "down_proj.weight",
                Some((DType::Q6, 64)),
                false,
            ),
            (
                "down-q8-64",
                "down_proj.weight",
                Some((DType::Q8, 64)),
                false,
            ),
            (
                "down-bf16",
                "down_proj.weight",
                Some((DType::Bf16, 0)),
                false,
            ),
        ];
        for (name, suffix, storage, ok) in cases {
            let p = tmp(&format!("q4-tables-{name}"));
            let edit = |s: &mut writer::TensorSpec| match storage {
                Some((dtype, gs)) if s.name.ends_with(suffix) => {
                    (s.dtype, s.group_size) = (dtype, gs)
                }
                _ => {}
            };
            let c = write_tiny_as(&p, DType::Q4, edit);
            assert_eq!(c.group_size, 32);
            let opened = ModelFile::open(&p).map(|_| ());
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
            match opened {
                Ok(()) => assert!(ok, "{name}: accepted"),
                Err(e) => assert!(
                    !ok && format!("{e:#}").contains("down_proj"),
                    "{name}: {e:#}"
                ),
            }
        }
    }

    /// A q6 tensor in a file that says it is older than q6 is refused, naming both.
    #[test]
    fn q6_needs_version_4() {
        let p = tmp("q6-version");
        let c = write_tiny(&p, DType::Q4);
        assert!(tensor_specs(&c).iter().any(|s| s.dtype == DType::Q6));
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let err = format!("{:#}", ModelFile::open(&p).err().unwrap());
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        assert!(err.contains("q6 in a format version 3 file"), "{err}");
    }

    /// A file is written with the oldest version that holds its tensors: 2 without q4 or q6
    /// (a build from before q4 reads it), 3 with q4 and no q6, 4 with q6; and a q4 tensor in a
    /// file that says it is older than q4 is refused, as q6 is.
    #[test]
    fn files_are_written_with_the_oldest_version_that_holds_them() {
        // (dtype, whether the q4 file keeps its q6 tensors or stores them in q8, version)
        let cases = [
            (DType::F32, true, 2),
            (DType::Bf16, true, 2),
            (DType::Q8, true, 2),
            (DType::Q4, false, 3),
            (DType::Q4, true, 4),
        ];
        for (k, (dt, keep_q6, want)) in cases.into_iter().enumerate() {
            let p = tmp(&format!("version-{k}"));
            write_tiny_as(&p, dt, |s| {
                if s.dtype == DType::Q6 && !keep_q6 {
                    s.dtype = DType::Q8;
                }
            });
            let version = ModelFile::open(&p).unwrap().header().version;
            assert_eq!(version, want, "{dt} file, case {k}");
            if dt == DType::Q4 && want == 3 {
                let mut bytes = std::fs::read(&p).unwrap();
                bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
                std::fs::write(&p, &bytes).unwrap();
                let err = format!("{:#}", ModelFile::open(&p).err().unwrap());
                assert!(
                    err.contains("q4 in a format version 2 file (q4 came with version 3)"),
                    "{err}"
                );
            }
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn round_trip_every_dtype() {
        for dt in [DType::F32, DType::Bf16, DType::Q8] {
            let p = tmp(dt.name());
            let c = write_tiny(&p, dt);
            let f = ModelFile::open(&p).unwrap();
            assert_eq!(f.config(), &c);
            let t = f.tensor("model.layers.1.mlp.down_proj.weight").unwrap();
            assert_eq!(t.shape, &[64, 128]);
            assert_eq!(t.data.dtype(), dt);
            match dt {
                DType::F32 => assert_eq!(t.data.f32()[77], 77.0),
                DType::Bf16 => assert_eq!(t.data.bf16()[77], 77),
                _ => {
                    let Q8 {
                        q,
                        scales,
                        group_size,
                    } = t.data.q8();
                    assert_eq!(q.len(), 64 * 128);
                    assert_eq!(scales.len(), 64 * 128 / 32);
                    assert_eq!(group_size, 32);
                    assert_eq!(q[300], (300 % 251) as i8);
                    assert_eq!(scales[5], 5.0);
                }
            }
            let n = f.tensor("model.norm.weight").unwrap();
            let v = n.data.f32();
            assert!(v.len() == 64 && v[3] == 3.0);
            for t in &f.header().tensors {
                assert_eq!(t.offset % ALIGN, 0);
                // Each view is read as the dtype the tensor table names.
                assert_eq!(f.tensor(&t.name).unwrap().data.dtype(), t.dtype);
            }
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn damaged_files_are_refused() {
        let p = tmp("damaged");
        write_tiny(&p, DType::Q8);
        let good = std::fs::read(&p).unwrap();
        let check = |bytes: &[u8], want: &str| {
            let e = format!("{:#}", Header::parse(bytes).unwrap_err());
            assert!(e.contains(want), "expected {want:?} in {e:?}");
        };
        let mut b = good.clone();
        b[0] = b'X';
        check(&b, "wrong magic");
        let mut b = good.clone();
        b[..4].copy_from_slice(b"GGUF");
        check(&b, "this is a GGUF file");
        let mut b = good.clone();
        b[8] = FORMAT_VERSION as u8 + 1;
        check(&b, "newer");
        b[8] = 0;
        check(&b, "older");
        check(&good[..good.len() - 1], "truncated");
        check(&good[..20], "truncated");
        // Point the first tensor's offset past the end of the file.
        let h = Header::parse(&good).unwrap();
        let first = &h.tensors[0];
        let mut b = good.clone();
        let needle: Vec<u8> = first
            .offset
            .to_le_bytes()
            .iter()
            .chain(first.nbytes.to_le_bytes().iter())
            .copied()
            .collect();
        let at = b.windows(16).position(|w| w == needle.as_slice()).unwrap();
        b[at..at + 8].copy_from_slice(&(align_up(good.len() as u64).unwrap() + 64).to_le_bytes());
        check(&b, "outside the data section");
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }
}
