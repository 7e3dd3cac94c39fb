//! GGUF, llama.cpp's model file: read and checked, mapped, never copied. This module reads the
//! container (its metadata and where each tensor lies); `model.rs` reads it as a model (a file
//! of F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K tensors opens as a model file:
//! `ModelFile::open`), `repack.rs` lays Q8_0, Q5_0 and Q4_0 out as the model file's q8 and
//! q4 and widens F16 to f32, `tokenizer.rs` reads its
//! tokenizer and chat template, `blocks.rs` dequantizes the quantized blocks (the K-quants'
//! kernels read theirs in place: `kernels/dot/k_quants.rs`).
//!
//! A GGUF file is, little-endian throughout (gguf-py's `GGUFReader`, ggml's `gguf.cpp`):
//!
//! ```text
//! magic "GGUF" | version u32 (2 or 3) | tensor count u64 | metadata count u64
//! metadata:  key (string) | value type u32 | value            one per key, in file order
//! tensors:   name (string) | n_dims u32 | dims u64 x n_dims | ggml type u32 | offset u64
//! padding to `general.alignment` (32 when absent), then the data: each tensor at its offset
//! ```
//!
//! A string is a u64 byte length and UTF-8 bytes; an array is an element type u32, a u64 count
//! and the elements. A tensor's `dims[0]` varies fastest (the row length, ggml's `ne0`), and its
//! values are blocks of its type: `dims[0]` must be a whole number of blocks. Every count and
//! length read here is checked against the bytes left before anything is allocated for it, so
//! a damaged file is refused in one line that names what is wrong, never a panic or a huge
//! allocation.

pub mod blocks;
pub mod model;
pub mod names;
pub mod repack;
pub mod tokenizer;

use crate::format::mapped::{MappedFile, MappedParts};
use anyhow::{bail, ensure, Context, Result};
use std::fs::File;
use std::path::Path;

/// A ggml tensor type: its id in the file, its name, and its blocks (values and bytes a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block_values: u64,
    pub block_bytes: u64,
}

/// Every type a GGUF file may hold (ggml.h's `ggml_type`; sizes as gguf-py's
/// `GGML_QUANT_SIZES`). Ids 4, 5 and 31-33, 36-38 were removed from ggml and are refused.
pub const GGML_TYPES: [GgmlType; 35] = {
    const fn t(id: u32, name: &'static str, block_values: u64, block_bytes: u64) -> GgmlType {
        GgmlType {
            id,
            name,
            block_values,
            block_bytes,
        }
    }
    [
        t(0, "F32", 1, 4),
        t(1, "F16", 1, 2),
        t(2, "Q4_0", 32, 18),
        t(3, "Q4_1", 32, 20),
        t(6, "Q5_0", 32, 22),
        t(7, "Q5_1", 32, 24),
        t(8, "Q8_0", 32, 34),
        t(9, "Q8_1", 32, 36),
        t(10, "Q2_K", 256, 84),
        t(11, "Q3_K", 256, 110),
        t(12, "Q4_K", 256, 144),
        t(13, "Q5_K", 256, 176),
        t(14, "Q6_K", 256, 210),
        t(15, "Q8_K", 256, 292),
        t(16, "IQ2_XXS", 256, 66),
        t(17, "IQ2_XS", 256, 74),
        t(18, "IQ3_XXS", 256, 98),
        t(19, "IQ1_S", 256, 50),
        t(20, "IQ4_NL", 32, 18),
        t(21, "IQ3_S", 256, 110),
        t(22, "IQ2_S", 256, 82),
        t(23, "IQ4_XS", 256, 136),
        t(24, "I8", 1, 1),
        t(25, "I16", 1, 2),
        t(26, "I32", 1, 4),
        t(27, "I64", 1, 8),
        t(28, "F64", 1, 8),
        t(29, "IQ1_M", 256, 56),
        t(30, "BF16", 1, 2),
        t(34, "TQ1_0", 256, 54),
        t(35, "TQ2_0", 256, 66),
        t(39, "MXFP4", 32, 17),
        t(40, "NVFP4", 64, 36),
        t(41, "Q1_0", 128, 18),
        t(42, "Q2_0", 64, 18),
    ]
};

impl GgmlType {
    /// The type with file id `id`, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().copied().find(|t| t.id == id)
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's entry: its name, shape (`dims[0]` fastest), type, and where its bytes lie in the
/// file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Bytes from the start of the file.
    pub start: u64,
    pub nbytes: u64,
}

/// What a GGUF file's header says: its version, metadata and tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    /// Keys and values in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<GgufTensor>,
    /// Where the data section starts (a multiple of the alignment).
    pub data_start: u64,
}

impl GgufHeader {
    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture` (`qwen3`, `qwen2`, `qwen3moe`, `qwen35`, ...).
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }
}

/// Whether `bytes` start like a GGUF file.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

/// A GGUF file (or every part of one split in parts), mapped, with its checked header.
pub struct GgufFile {
    map: MappedParts,
    header: GgufHeader,
}

impl GgufFile {
    /// Maps and checks `path` (and, for the first part of a split file, the other parts);
    /// errors name the file and the problem.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let inner = || -> Result<GgufFile> {
            let file = File::open(path).context("cannot open")?;
            let (header, map) = open_parts(path, MappedFile::map(&file)?)?;
            Ok(GgufFile { map, header })
        };
        inner().with_context(|| format!("{} (GGUF)", path.display()))
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The bytes of tensor `t` (one of this file's), borrowed from the mapping of its part.
    pub fn data(&self, t: &GgufTensor) -> &[u8] {
        self.map
            .get(t.start as usize..(t.start + t.nbytes) as usize)
            .expect("parse checked that each tensor lies within its part")
    }

    /// Its bytes (every part's, for a split file).
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// How many files it is (1, or a split file's parts).
    pub fn parts(&self) -> usize {
        self.map.count()
    }
}

/// The keys each part of a split GGUF file holds (llama.cpp's `gguf-split`, and gguf-py's writer
/// for `convert_hf_to_gguf.py --split-max-tensors` / `--split-max-size`): the part's number from
/// 0, how many parts, and how many tensors in all. The first part also holds every other key;
/// each part holds its own tensors.
const SPLIT_NO: &str = "split.no";
const SPLIT_COUNT: &str = "split.count";
const SPLIT_TENSORS: &str = "split.tensors.count";

/// The header and mappings of the GGUF file at `path`, whose mapping is `first`: the file
/// alone, or, when it is the first part of a split file, every part's tensors after the first
/// part's metadata, each tensor's `start` an offset in the parts' run of bytes
/// ([`MappedParts`]). The other parts are found as llama.cpp finds them (`llama_split_path`):
/// beside the first, named `PREFIX-0000K-of-0000N.gguf`.
pub fn open_parts(path: &Path, first: MappedFile) -> Result<(GgufHeader, MappedParts)> {
    let mut header = parse(&first)?;
    let mut parts = MappedParts::one(first);
    let int = |h: &GgufHeader, key: &str| -> Result<Option<u64>> {
        h.get(key)
            .map(|v| v.as_u64().with_context(|| format!("{key}: not an integer")))
            .transpose()
    };
    let count = int(&header, SPLIT_COUNT)?.unwrap_or(1);
    if count <= 1 {
        return Ok((header, parts));
    }
    // llama.cpp writes the count as a u16; a larger one is damage, refused before anything is
    // made for each part.
    ensure!(
        count <= u16::MAX as u64,
        "split.count {count}: more parts than a split GGUF file has (at most 65535)"
    );
    let no = int(&header, SPLIT_NO)?.context("a split file's part without split.no")?;
    ensure!(no < count, "split.no {no} of split.count {count}");
    let paths = split_paths(path, no + 1, count)?;
    ensure!(
        no == 0,
        "part {} of a GGUF file split in {count}: open its first part, {}",
        no + 1,
        paths[0].display()
    );
    // A tensor in two parts would be read from whichever came first: refused.
    let mut names: std::collections::HashSet<String> =
        header.tensors.iter().map(|t| t.name.clone()).collect();
    for (k, part) in paths.iter().enumerate().skip(1) {
        let inner = || -> Result<(GgufHeader, MappedFile)> {
            let file = File::open(part).context("cannot open")?;
            let map = MappedFile::map(&file)?;
            let h = parse(&map)?;
            let (got_no, got_count) = (int(&h, SPLIT_NO)?, int(&h, SPLIT_COUNT)?);
            ensure!(
                (got_no, got_count) == (Some(k as u64), Some(count)),
                "says it is part {} of {}, not part {} of {count}",
                got_no.map_or("?".into(), |n| n.saturating_add(1).to_string()),
                got_count.map_or("?".into(), |n| n.to_string()),
                k + 1
            );
            Ok((h, map))
        };
        let (h, map) = inner().with_context(|| {
            format!(
                "part {} of {count} of this split GGUF file, {}",
                k + 1,
                part.display()
            )
        })?;
        if let Some(t) = h.tensors.iter().find(|t| names.contains(&t.name)) {
            bail!(
                "tensor {} is in part {} of {count} of this split GGUF file, {}, and in an \
                 earlier part too",
                t.name,
                k + 1,
                part.display()
            );
        }
        names.extend(h.tensors.iter().map(|t| t.name.clone()));
        let start = parts.push(map) as u64;
        header
            .tensors
            .extend(h.tensors.into_iter().map(|t| GgufTensor {
                start: t.start + start,
                ..t
            }));
    }
    if let Some(n) = int(&header, SPLIT_TENSORS)? {
        ensure!(
            n == header.tensors.len() as u64,
            "split.tensors.count says {n} tensors, its {count} parts hold {}",
            header.tensors.len()
        );
    }
    Ok((header, parts))
}

/// The name of a part of a GGUF file split in parts, as llama.cpp names them
/// (`llama_split_path`'s `%s-%05d-of-%05d.gguf`): `PREFIX-00002-of-00003.gguf` is part 2 of 3.
/// The one rule for reading and writing such names, here for a file's parts beside it
/// ([`split_paths`]) and in the CLI for a hub repository's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitName<'a> {
    pub prefix: &'a str,
    /// From 1.
    pub part: u64,
    pub count: u64,
}

impl<'a> SplitName<'a> {
    /// `name` as a part's name, or `None` when it is not one (five digits each, `1 <= part <=
    /// count`, ending `.gguf`).
    pub fn parse(name: &'a str) -> Option<SplitName<'a>> {
        let stem = name.strip_suffix(".gguf")?;
        let number = |s: &str| {
            (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        match stem.rsplitn(4, '-').collect::<Vec<_>>().as_slice() {
            [count, "of", part, prefix] => Some(SplitName {
                prefix,
                part: number(part)?,
                count: number(count)?,
            })
            .filter(|s| 1 <= s.part && s.part <= s.count),
            _ => None,
        }
    }

    /// The name of part `part` of the same file.
    pub fn part_name(&self, part: u64) -> String {
        format!("{}-{part:05}-of-{:05}.gguf", self.prefix, self.count)
    }
}

/// The paths of the `count` parts of the split file of which `path` is part number `this`
/// (from 1): `PREFIX-00001-of-0000N.gguf` to `PREFIX-0000N-of-0000N.gguf` ([`SplitName`]),
/// beside it. A part named otherwise is refused: the others could not be found.
pub fn split_paths(path: &Path, this: u64, count: u64) -> Result<Vec<std::path::PathBuf>> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("a split GGUF file whose name is not UTF-8: its other parts cannot be named")?;
    let split = SplitName::parse(name)
        .filter(|s| s.part == this && s.count == count)
        .with_context(|| {
            format!(
                "part {this} of a GGUF file split in {count}, named {name}, not \
                 PREFIX-{this:05}-of-{count:05}.gguf as llama.cpp's gguf-split names it: its \
                 other parts cannot be found"
            )
        })?;
    Ok((1..=count)
        .map(|k| path.with_file_name(split.part_name(k)))
        .collect())
}

/// Reads the little-endian values of a GGUF header, each read checked against the bytes left.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            bail!(
                "truncated: {what} needs {n} bytes at offset {}, the file has {left} left",
                self.at
            );
        }
        let s = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| anyhow::anyhow!("{what}: not UTF-8"))
    }
    /// A count of items of at least `min_bytes` each: refused when they could not fit in what is
    /// left, so that a damaged count allocates nothing.
    fn count(&mut self, what: &str, min_bytes: u64) -> Result<u64> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        ensure!(
            n.saturating_mul(min_bytes) <= left,
            "{what} {n}: more than the {left} bytes left could hold (truncated or damaged)"
        );
        Ok(n)
    }
    fn value(&mut self, ty: u32, what: &str) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => bail!("{what}: bool byte {b}, expected 0 or 1"),
            },
            8 => Value::Str(self.string(what)?),
            9 => {
                let elem = self.u32(what)?;
                ensure!(
                    elem != 9,
                    "{what}: an array of arrays (not written by llama.cpp)"
                );
                // Every element takes a byte at least (a string, 8).
                let min = if elem == 8 { 8 } else { 1 };
                let n = self.count(what, min)?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, what)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => bail!("{what}: unknown value type {t}"),
        })
    }
}

/// Checks and reads the header of a GGUF file's bytes: every tensor's bytes lie within the file,
/// at an aligned offset, of a known type that tiles its rows.
pub fn parse(bytes: &[u8]) -> Result<GgufHeader> {
    let mut c = Cursor { bytes, at: 0 };
    ensure!(
        &c.array::<4>("the magic")? == b"GGUF",
        "not a GGUF file (no GGUF magic)"
    );
    let version = c.u32("the version")?;
    ensure!(
        version == 2 || version == 3,
        "GGUF version {version}: versions 2 and 3 are read (version 1 is llama.cpp's of 2023, before its counts were 64-bit)"
    );
    // A tensor entry takes at least 24 bytes, a metadata entry 12.
    let n_tensors = c.count("the tensor count", 24)?;
    let n_kv = c.count("the metadata count", 12)?;
    let mut metadata = Vec::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the type of {key}"))?;
        let value = c.value(ty, &key)?;
        ensure!(
            !metadata.iter().any(|(k, _)| k == &key),
            "metadata key {key} twice"
        );
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => 32,
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => bail!("general.alignment {v:?}: expected a u32 power of two"),
    };
    let mut entries = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor {i}'s name"))?;
        let n_dims = c.u32(&format!("{name}'s dimension count"))?;
        ensure!(
            (1..=4).contains(&n_dims),
            "{name}: {n_dims} dimensions (ggml has 1 to 4)"
        );
        let dims = (0..n_dims)
            .map(|_| c.u64(&format!("{name}'s shape")))
            .collect::<Result<Vec<u64>>>()?;
        let id = c.u32(&format!("{name}'s type"))?;
        let ty =
            GgmlType::from_id(id).with_context(|| format!("{name}: unknown ggml type {id}"))?;
        let offset = c.u64(&format!("{name}'s offset"))?;
        entries.push((name, dims, ty, offset));
    }
    let data_start = (c.at as u64).next_multiple_of(alignment);
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, dims, ty, offset) in entries {
        ensure!(
            !tensors.iter().any(|t: &GgufTensor| t.name == name),
            "tensor {name} twice"
        );
        ensure!(
            dims[0] % ty.block_values == 0,
            "{name}: rows of {} values, not a whole number of {}'s blocks of {}",
            dims[0],
            ty.name,
            ty.block_values
        );
        let nbytes = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| (n / ty.block_values).checked_mul(ty.block_bytes))
            .with_context(|| format!("{name}: shape {dims:?} overflows"))?;
        ensure!(
            offset % alignment == 0,
            "{name}: offset {offset} is not a multiple of the alignment {alignment}"
        );
        let start = data_start.checked_add(offset);
        let end = start.and_then(|s| s.checked_add(nbytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => tensors.push(GgufTensor {
                name,
                dims,
                ggml_type: ty,
                start,
                nbytes,
            }),
            _ => bail!(
                "truncated: {name} ({} {dims:?}, {nbytes} bytes at data offset {offset}) ends past the file's {file_len} bytes",
                ty.name
            ),
        }
    }
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        data_start,
    })
}

#[cfg(test)]
mod tests;
