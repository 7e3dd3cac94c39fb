//! The tokenizer file (`<model>.tokenizer.bin`): everything the encoder and decoder need, as bytes.
//!
//! tokenizer.json is an 11 MB JSON document whose tokens are written in the GPT-2 byte-level
//! alphabet. The exporter parses it once and writes this file, which loads in a few milliseconds:
//! token bytes are stored raw (the byte-level mapping undone), merges as token id triples.
//!
//! Layout (all integers little-endian; strings are a u32 byte length then UTF-8 bytes):
//!
//! ```text
//! magic           8 bytes  "PQWTOKEN"
//! version         u32      FORMAT_VERSION; bumped on any layout change
//! normalizer      string   "none" or "NFC"
//! split_pattern   string   the pre-tokenizer regex: QWEN2_SPLIT_PATTERN or QWEN35_SPLIT_PATTERN
//! bos_id, eos_id  u32 each NO_ID when absent
//! model_vocab     u32      the model's vocab_size (>= n): rows n.. of its embedding have no token
//! token_count     u32      n; ids are 0..n
//! token_ends      n x u32  token i is blob[ends[i-1]..ends[i]] (ends[-1] = 0), non-decreasing
//! blob            u32 length, then the bytes of every token, concatenated
//! byte_ids        256 x u32  id of the single-byte BPE token of each byte, or NO_ID
//! merge_count     u32      m
//! merge_starts    (n+1) x u32  merges with left token i are entries[starts[i]..starts[i+1]]
//! merge entries   m x (right u32, rank u32, merged u32), sorted by right within each left
//! added_count     u32
//! added tokens    each: id u32, flags u8 (FLAG_*), content string
//! prefix          u32 count, then ids: what the post-processor puts before a text's ids
//! suffix          u32 count, then ids: what it puts after them   (prefix and suffix: version 2)
//! ```
//!
//! A version 1 file has no prefix or suffix (Qwen's post-processor adds nothing), and loads as
//! one with both empty.
//!
//! The merges are stored grouped by left token (the rank is explicit) so that loading builds no
//! hash table: the lookup is a binary search in the left token's group (see `bpe::MergeTable`).
//!
//! The reader checks every count against the bytes that remain, every id against n, and that
//! each merge's result is the concatenation of its two parts, so a hostile file gives an error,
//! never a panic or an allocation larger than the file.

use super::bpe::MergeTable;
use super::pretokenize::SplitPattern;
use crate::format::bytes::{ByteReader, ByteWriter};
use anyhow::{bail, Result};

pub const MAGIC: &[u8; 8] = b"PQWTOKEN";
pub const FORMAT_VERSION: u32 = 2;
/// Marks an absent id in the file (no BOS, no single-byte token for a byte): BPE's own marker.
pub use super::bpe::NO_ID;

/// The Qwen2/Qwen3 pre-tokenizer pattern, as tokenizer.json writes it. The splitter in
/// `pretokenize.rs` implements exactly this regex; any other pattern is refused.
pub const QWEN2_SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's split regex (`PRETOKENIZE_REGEX` of transformers' `tokenization_qwen3_5.py`):
/// Qwen2's with combining marks joined to letters (`pretokenize.rs`).
pub const QWEN35_SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub const FLAG_SPECIAL: u8 = 1;
pub const FLAG_SINGLE_WORD: u8 = 2;
pub const FLAG_LSTRIP: u8 = 4;
pub const FLAG_RSTRIP: u8 = 8;
pub const FLAG_NORMALIZED: u8 = 16;

/// The normalizers we implement (tokenizer.json `normalizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalizer {
    None,
    Nfc,
}

impl Normalizer {
    pub fn name(self) -> &'static str {
        match self {
            Normalizer::None => "none",
            Normalizer::Nfc => "NFC",
        }
    }
}

/// An added token of tokenizer.json (`added_tokens`), with the flags HF's matching uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    pub special: bool,
    pub single_word: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub normalized: bool,
}

/// The decoded contents of a tokenizer file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerData {
    pub normalizer: Normalizer,
    pub split_pattern: SplitPattern,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// The model's `vocab_size` (config.json); ids in `len()..model_vocab` are padding rows of
    /// the embedding with no token.
    pub model_vocab: u32,
    /// `token_ends[i]` is the end of token i in `blob`; token i starts where token i-1 ends.
    pub token_ends: Vec<u32>,
    pub blob: Vec<u8>,
    /// The single-byte BPE token of each byte (NO_ID if the vocabulary lacks it).
    pub byte_ids: [u32; 256],
    /// The merges, grouped by left token.
    pub merges: MergeTable,
    pub added: Vec<AddedToken>,
    /// Ids tokenizer.json's post-processor puts before the ids of a text, and after them
    /// (`TemplateProcessing`'s `single` template; DeepSeek-R1-Distill-Qwen: its BOS first). Empty
    /// for Qwen, whose `ByteLevel` post-processor adds nothing.
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
}

impl TokenizerData {
    /// Number of tokens (ids are `0..len`).
    pub fn len(&self) -> usize {
        self.token_ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ends.is_empty()
    }

    /// The bytes of token `id`, if it exists.
    pub fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.token_ends.get(i)? as usize;
        let start = if i == 0 {
            0
        } else {
            self.token_ends[i - 1] as usize
        };
        self.blob.get(start..end)
    }

    /// Builds the data from token byte strings (index = id).
    pub fn token_table(tokens: &[Vec<u8>]) -> (Vec<u32>, Vec<u8>) {
        let mut blob = Vec::new();
        let mut ends = Vec::with_capacity(tokens.len());
        for t in tokens {
            blob.extend_from_slice(t);
            ends.push(blob.len() as u32);
        }
        (ends, blob)
    }

    /// Serializes to the file layout described in the module docs.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = ByteWriter::default();
        w.bytes(MAGIC);
        w.u32(FORMAT_VERSION);
        w.string(self.normalizer.name());
        w.string(self.split_pattern.regex());
        w.u32(self.bos_id.unwrap_or(NO_ID));
        w.u32(self.eos_id.unwrap_or(NO_ID));
        w.u32(self.model_vocab);
        w.u32(self.token_ends.len() as u32);
        for &e in &self.token_ends {
            w.u32(e);
        }
        w.u32(self.blob.len() as u32);
        w.bytes(&self.blob);
        for &id in &self.byte_ids {
            w.u32(id);
        }
        w.u32(self.merges.len() as u32);
        for &s in &self.merges.starts {
            w.u32(s);
        }
        for e in &self.merges.entries {
            for &x in e {
                w.u32(x);
            }
        }
        w.u32(self.added.len() as u32);
        for a in &self.added {
            w.u32(a.id);
            let flags = (a.special as u8 * FLAG_SPECIAL)
                | (a.single_word as u8 * FLAG_SINGLE_WORD)
                | (a.lstrip as u8 * FLAG_LSTRIP)
                | (a.rstrip as u8 * FLAG_RSTRIP)
                | (a.normalized as u8 * FLAG_NORMALIZED);
            w.u8(flags);
            w.string(&a.content);
        }
        for ids in [&self.prefix, &self.suffix] {
            w.u32(ids.len() as u32);
            for &id in ids {
                w.u32(id);
            }
        }
        w.buf
    }

    /// Parses and validates a tokenizer file's bytes. Errors say which field is wrong; the
    /// caller adds the file name.
    pub fn from_bytes(buf: &[u8]) -> Result<TokenizerData> {
        let mut r = ByteReader::new(buf);
        let magic = r.bytes(8, "magic")?;
        if magic != MAGIC {
            bail!("not a pico-qwen tokenizer file (bad magic)");
        }
        let version = r.u32("version")?;
        if !(1..=FORMAT_VERSION).contains(&version) {
            bail!(
                "tokenizer file version {version} is not supported (this build reads versions 1 \
                 to {FORMAT_VERSION}); re-export the model, or update pico-qwen"
            );
        }
        let normalizer = match r.string("normalizer")?.as_str() {
            "none" => Normalizer::None,
            "NFC" => Normalizer::Nfc,
            other => bail!("unknown normalizer {other:?}"),
        };
        let regex = r.string("split pattern")?;
        let Some(split_pattern) = SplitPattern::from_regex(&regex) else {
            bail!("unsupported pre-tokenizer pattern {regex:?}");
        };
        let opt = |v: u32| (v != NO_ID).then_some(v);
        let bos_id = opt(r.u32("bos id")?);
        let eos_id = opt(r.u32("eos id")?);
        let model_vocab = r.u32("model vocab size")?;

        let n = r.count(4, "token count")?;
        let token_ends = u32_array(&mut r, n, "token ends")?;
        let blob_len = r.count(1, "token bytes length")?;
        let blob = r.bytes(blob_len, "token bytes")?.to_vec();
        if (model_vocab as usize) < n {
            bail!("model vocab size {model_vocab} is below the token count {n}");
        }
        let mut prev = 0u32;
        for (i, &e) in token_ends.iter().enumerate() {
            if e < prev || e as usize > blob.len() {
                bail!("token {i} has a bad end offset {e}");
            }
            prev = e;
        }
        let check_id = |id: u32, what: &str| -> Result<()> {
            if id as usize >= n {
                bail!("{what} {id} is not below the token count {n}");
            }
            Ok(())
        };
        for (id, what) in [(bos_id, "bos id"), (eos_id, "eos id")] {
            if let Some(id) = id {
                check_id(id, what)?;
            }
        }

        let mut byte_ids = [NO_ID; 256];
        for slot in byte_ids.iter_mut() {
            let id = r.u32("byte ids")?;
            if id != NO_ID {
                check_id(id, "byte token id")?;
            }
            *slot = id;
        }

        let mut data = TokenizerData {
            normalizer,
            split_pattern,
            bos_id,
            eos_id,
            model_vocab,
            token_ends,
            blob,
            byte_ids,
            merges: MergeTable::default(),
            added: Vec::new(),
            prefix: Vec::new(),
            suffix: Vec::new(),
        };
        for (b, &id) in data.byte_ids.iter().enumerate() {
            if id != NO_ID && data.token(id) != Some(&[b as u8][..]) {
                bail!("byte token id {id} does not hold the byte {b:#04x}");
            }
        }

        let m = r.count(12, "merge count")?;
        let starts = u32_array(&mut r, n + 1, "merge starts")?;
        if starts[0] != 0 || starts[n] as usize != m || starts.windows(2).any(|w| w[0] > w[1]) {
            bail!("merge starts are not an increasing split of the {m} merges");
        }
        let entries: Vec<[u32; 3]> = r
            .bytes(12 * m, "merges")?
            .chunks_exact(12)
            .map(|e| {
                let w = |k: usize| u32::from_le_bytes([e[k], e[k + 1], e[k + 2], e[k + 3]]);
                [w(0), w(4), w(8)]
            })
            .collect();
        for left in 0..n {
            let group = &entries[starts[left] as usize..starts[left + 1] as usize];
            for (k, &[right, rank, merged]) in group.iter().enumerate() {
                check_id(right, "merge token id")?;
                check_id(merged, "merge token id")?;
                if rank as usize >= m || (k > 0 && group[k - 1][0] >= right) {
                    bail!("merge group of token {left} is not sorted or has a bad rank");
                }
                // Ids checked above, so `token` returns Some.
                let l = data.token(left as u32).unwrap_or_default();
                let rt = data.token(right).unwrap_or_default();
                let mg = data.token(merged).unwrap_or_default();
                if mg.len() != l.len() + rt.len() || !mg.starts_with(l) || !mg.ends_with(rt) {
                    bail!("merge {rank} ({left} + {right} -> {merged}) does not concatenate");
                }
            }
        }
        data.merges = MergeTable { starts, entries };

        let a = r.count(9, "added token count")?;
        for _ in 0..a {
            let id = r.u32("added token id")?;
            check_id(id, "added token id")?;
            let flags = r.u8("added token flags")?;
            if flags >= 32 {
                bail!("added token {id} has unknown flags {flags:#x}");
            }
            let content = r.string("added token content")?;
            data.added.push(AddedToken {
                id,
                content,
                special: flags & FLAG_SPECIAL != 0,
                single_word: flags & FLAG_SINGLE_WORD != 0,
                lstrip: flags & FLAG_LSTRIP != 0,
                rstrip: flags & FLAG_RSTRIP != 0,
                normalized: flags & FLAG_NORMALIZED != 0,
            });
        }
        if version >= 2 {
            for what in ["prefix", "suffix"] {
                let k = r.count(4, what)?;
                let ids = u32_array(&mut r, k, what)?;
                for &id in &ids {
                    check_id(id, what)?;
                }
                match what {
                    "prefix" => data.prefix = ids,
                    _ => data.suffix = ids,
                }
            }
        }
        if r.remaining() != 0 {
            bail!("{} unexpected bytes at the end", r.remaining());
        }
        Ok(data)
    }
}

/// `n` little-endian u32s in one bounds check (loading reads ~750k of them).
fn u32_array(r: &mut ByteReader, n: usize, what: &str) -> Result<Vec<u32>> {
    let len = n
        .checked_mul(4)
        .ok_or_else(|| anyhow::anyhow!("{what}: count {n} is too large"))?;
    let bytes = r.bytes(len, what)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
