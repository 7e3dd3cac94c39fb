//! A GGUF's matrices of ggml's legacy types (Q8_0, Q4_0, Q5_0) in the model file's q8 and q4
//! layouts, and its F16 tensors as f32, made once when the file is opened.
//!
//! Q8_0 and our q8 with groups of 32 hold the same numbers: 32 int8 values and one scale,
//! `w = d q`; Q4_0 and our q4 with groups of 32 too: 16 bytes whose low nibbles are values 0..16
//! and high nibbles values 16..32, each `q + 8`, and one f16 scale, `w = d (nibble - 8)`. Q5_0's
//! `w = d (q - 16)` with 5-bit `q` is q8 whose values are `q - 16` (-16..=15). They differ in
//! where the bytes lie. The GGUF interleaves them, block after block:
//!
//! ```text
//! Q8_0 row:   [d f16][q i8 x 32] [d f16][q i8 x 32] ...       34 bytes a block
//! q8 tensor:  [q i8, every row's values in order] [pad to 64] [d f32, every group's]
//! Q4_0 row:   [d f16][16 bytes of nibbles] ...                 18 bytes a block
//! q4 tensor:  [nibble bytes, every row's in order] [pad to 64] [d f16, every group's]
//! Q5_0 row:   [d f16][qh u32: bit 4 of each value][16 bytes of nibbles] ...   22 bytes
//! ```
//!
//! The kernels read values as one contiguous run (whole AVX-512 vectors of them) and scales as
//! another, so the blocks are taken apart once, at open, into that layout: the values copied as
//! they are (Q5_0's put together from their nibble and fifth bit), each scale as it is (q8's
//! widened to the f32 it stands for: exact, every f16 is an f32).
//! Nothing is rounded again, so the model computes with the very weights the GGUF holds
//! (`gguf/tests/` checks every value against gguf-py's dequantization).
//!
//! F16 (ollama's `fp16` tags, the converter's `--outtype f16`) has no kernels of its own here: each
//! value is widened to the f32 it stands for (exact), so an F16 file runs as an f32 model file
//! does, at twice its bytes in memory. The copy takes the
//! file's bytes of those tensors once more; the file's pages of them are released after it
//! (`MappedFile::release`), so the process holds them once.

use super::model::Layout;
use super::names::Take;
use super::GgufHeader;
use crate::format::mapped::MappedParts;
use crate::format::reader::Derived;
use crate::format::Reader;
use crate::pages::HugePages;
use anyhow::{ensure, Context, Result};
use half::f16;
use rayon::prelude::*;
use std::collections::HashSet;
use std::ops::Range;

/// The ggml types taken apart at open, and what each becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legacy {
    /// Q8_0: q8 in groups of 32.
    Q8_0,
    /// Q4_0: q4 in groups of 32.
    Q4_0,
    /// Q5_0: q8 in groups of 32, values -16..=15.
    Q5_0,
    /// F16: f32, value by value.
    F16,
}

impl Legacy {
    /// The kind of ggml type `name`, if it is taken apart at open.
    pub fn of(name: &str) -> Option<Legacy> {
        match name {
            "Q8_0" => Some(Legacy::Q8_0),
            "Q4_0" => Some(Legacy::Q4_0),
            "Q5_0" => Some(Legacy::Q5_0),
            "F16" => Some(Legacy::F16),
            _ => None,
        }
    }

    /// Bytes of a block in the GGUF (32 weights; F16: one).
    fn block_bytes(self) -> usize {
        match self {
            Legacy::Q8_0 => 34,
            Legacy::Q4_0 => 18,
            Legacy::Q5_0 => 22,
            Legacy::F16 => 2,
        }
    }

    /// Bytes a block's values and its scale take in the model file's layout.
    fn out_bytes(self) -> (usize, usize) {
        match self {
            Legacy::Q4_0 => (16, 2),
            Legacy::Q8_0 | Legacy::Q5_0 => (32, 4),
            Legacy::F16 => (4, 0),
        }
    }
}

/// Whether a matrix of `kind` is laid out at open in the interleaved order for `reader`
/// ([`Reader::Interleaved`]: q8 from Q8_0 and Q5_0, q4 from Q4_0).
fn reorders(reader: Reader, kind: Legacy) -> bool {
    match (reader, kind) {
        (Reader::Any, _) | (_, Legacy::F16) => false,
        (Reader::Interleaved { q8, .. }, Legacy::Q8_0 | Legacy::Q5_0) => q8,
        (Reader::Interleaved { q4, .. }, Legacy::Q4_0) => q4,
    }
}

/// What is made at open of one model-file tensor: its GGUF bytes' ranges, and what they become.
struct Job {
    source: Vec<Range<usize>>,
    make: Make,
    /// For a matrix laid out in the interleaved order ([`Reader::Interleaved`]): its rows and
    /// columns.
    reorder: Option<(usize, usize)>,
}

/// What a tensor's gathered GGUF bytes become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Make {
    /// Taken apart into the model file's q8 or q4 layout, or widened (`take_apart`).
    Legacy(Legacy),
    /// The bytes as they are (rows gathered from a Qwen3.5 `attn_q`).
    Copy,
    /// F32 `a` to `ln(-a)` (`names::Take::ALog`).
    ALog,
}

/// The tensors of GGUF header `g` (whose bytes are `file`) that its model file `layout`
/// (`model::layout`) does not read in place: every Q8_0, Q5_0, Q4_0 and F16 tensor in the model
/// file's layouts, gathered rows, `A_log`; each at the offset and size the layout gives it in
/// the repacked bytes. `None` where the file has no such tensor. `release` is told each source
/// range of `file` once it is copied, so that the file's pages can go while the next are read
/// (`MappedFile::release`), and the process never holds a tensor twice for long.
///
/// With [`Reader::Interleaved`], the q8 and q4 matrices its kernels read in that order are
/// laid out in it (all but an embedding table that is not also the classifier: its rows are
/// only looked up, in the file's order); their names are returned beside the bytes.
pub fn repack(
    g: &GgufHeader,
    layout: &Layout,
    file: &MappedParts,
    release: &(dyn Fn(Range<usize>) + Sync),
    reader: Reader,
) -> Result<(Option<Derived>, HashSet<String>)> {
    let mut jobs: Vec<(String, Range<usize>, Job)> = Vec::new();
    for (info, (i, piece)) in layout.header.tensors.iter().zip(&layout.pieces) {
        let t = &g.tensors[*i];
        let make = match (Legacy::of(t.ggml_type.name), &piece.take) {
            // (`names::pieces` maps only an F32 `ssm_a`; checked again, as the sum depends on it.)
            (_, Take::ALog) => {
                ensure!(
                    t.ggml_type.name == "F32",
                    "tensor {}: {}, not F32",
                    t.name,
                    t.ggml_type.name
                );
                Make::ALog
            }
            (Some(kind), _) => Make::Legacy(kind),
            (None, Take::Bytes { .. }) => continue,
            (None, Take::Rows { .. }) => Make::Copy,
        };
        let source = piece
            .take
            .ranges(t)
            .into_iter()
            .map(|r| r.start as usize..r.end as usize)
            .collect();
        let at = info.offset as usize..(info.offset + info.nbytes) as usize;
        // An embedding table only looked up keeps the file's order; one that is the classifier
        // too is multiplied as the others are, and looked up from their order.
        let looked_up_only = info.name == "model.embed_tokens.weight"
            && !layout.header.config.classifier_is_embedding();
        let reorder = match make {
            Make::Legacy(kind)
                if reorders(reader, kind) && info.shape.len() == 2 && !looked_up_only =>
            {
                Some((info.shape[0] as usize, info.shape[1] as usize))
            }
            _ => None,
        };
        let job = Job {
            source,
            make,
            reorder,
        };
        jobs.push((info.name.clone(), at, job));
    }
    let Some(len) = jobs.iter().map(|(_, at, _)| at.end).max() else {
        return Ok((None, HashSet::new()));
    };
    let mut bytes = HugePages::<u8>::zeroed(len)
        .with_context(|| format!("cannot allocate {len} bytes for the repacked tensors"))?;
    // Each tensor's range of the buffer, handed to its own task.
    let mut parts: Vec<(&Job, &mut [u8])> = Vec::with_capacity(jobs.len());
    let mut rest: &mut [u8] = &mut bytes;
    let mut taken = 0;
    let mut order: Vec<&(String, Range<usize>, Job)> = jobs.iter().collect();
    order.sort_by_key(|(_, at, _)| at.start);
    for (_, at, job) in order {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at.start - taken);
        let (mine, tail) = tail.split_at_mut(at.len());
        parts.push((job, mine));
        rest = tail;
        taken = at.end;
    }
    parts.into_par_iter().try_for_each(|(job, out)| {
        make(job, file, out)?;
        for r in &job.source {
            release(r.clone());
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let reordered = jobs.iter().filter(|(_, _, job)| job.reorder.is_some());
    let reordered = reordered.map(|(name, _, _)| name.clone()).collect();
    let at = jobs.into_iter().map(|(name, at, _)| (name, at)).collect();
    Ok((Some(Derived::new(bytes, at)), reordered))
}

/// One tensor's model-file bytes (`out`) from its ranges of `file`.
fn make(job: &Job, file: &MappedParts, out: &mut [u8]) -> Result<()> {
    match job.make {
        // Gathered rows, each range straight into its place.
        Make::Copy => {
            let len: usize = job.source.iter().map(|r| r.len()).sum();
            ensure!(out.len() == len, "the gathered size");
            let mut at = 0;
            for r in &job.source {
                out[at..at + r.len()].copy_from_slice(bytes(file, r)?);
                at += r.len();
            }
            Ok(())
        }
        Make::Legacy(kind) => {
            take_apart(&gather(job, file)?, kind, out)?;
            if let Some((rows, cols)) = job.reorder {
                reorder(kind, rows, cols, out)?;
            }
            Ok(())
        }
        Make::ALog => {
            let source = gather(job, file)?;
            ensure!(out.len() == source.len(), "A_log's size");
            for (a, o) in source.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
                let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
                o.copy_from_slice(&(-a).ln().to_le_bytes());
            }
            Ok(())
        }
    }
}

/// A job's bytes of `file`: where they lie when they are one range, else gathered.
fn gather<'f>(job: &Job, file: &'f MappedParts) -> Result<std::borrow::Cow<'f, [u8]>> {
    Ok(match &job.source[..] {
        [one] => std::borrow::Cow::Borrowed(bytes(file, one)?),
        many => {
            let mut all = Vec::with_capacity(many.iter().map(|r| r.len()).sum());
            for r in many {
                all.extend_from_slice(bytes(file, r)?);
            }
            all.into()
        }
    })
}

/// Bytes `r` of `file` (a range of one tensor, so of one part: `gguf::parse` checked it).
fn bytes<'f>(file: &'f MappedParts, r: &Range<usize>) -> Result<&'f [u8]> {
    file.get(r.clone())
        .with_context(|| format!("bytes {r:?}: not within one part of the file"))
}

/// One tensor's blocks of `kind` (`source`) into its model file bytes (`out`): the values, then
/// at the next multiple of 64 the scales (q8: f32, q4: f16 as they are).
fn take_apart(source: &[u8], kind: Legacy, out: &mut [u8]) -> Result<()> {
    if kind == Legacy::F16 {
        // No scales: each f16 widened to its f32 (exact).
        ensure!(out.len() == 2 * source.len(), "the widened size");
        for (h, f) in source.chunks_exact(2).zip(out.chunks_exact_mut(4)) {
            f.copy_from_slice(&f16::from_le_bytes([h[0], h[1]]).to_f32().to_le_bytes());
        }
        return Ok(());
    }
    let block_bytes = kind.block_bytes();
    // A block's bytes of values, and a scale's bytes, in the model file.
    let (values, scale) = kind.out_bytes();
    ensure!(source.len().is_multiple_of(block_bytes), "a partial block");
    let blocks = source.len() / block_bytes;
    let scales_at = (blocks * values).next_multiple_of(64);
    ensure!(out.len() == scales_at + scale * blocks, "the repacked size");
    let (q, rest) = out.split_at_mut(blocks * values);
    let scales = &mut rest[scales_at - blocks * values..];
    for (b, (block, q)) in source
        .chunks_exact(block_bytes)
        .zip(q.chunks_exact_mut(values))
        .enumerate()
    {
        let d = [block[0], block[1]];
        match kind {
            Legacy::Q4_0 => scales[2 * b..2 * b + 2].copy_from_slice(&d),
            Legacy::F16 => unreachable!("widened above"),
            Legacy::Q8_0 | Legacy::Q5_0 => {
                let d = f16::from_le_bytes(d).to_f32();
                scales[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
        match kind {
            Legacy::F16 => unreachable!("widened above"),
            Legacy::Q8_0 | Legacy::Q4_0 => q.copy_from_slice(&block[2..]),
            // Value j's low 4 bits in byte j % 16 of the nibbles (low nibble for j < 16), its
            // fifth in bit j of qh (`blocks.rs`'s `q5_0`).
            Legacy::Q5_0 => {
                let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                for (j, v) in q.iter_mut().enumerate() {
                    let nibble = (block[6 + j % 16] >> (4 * (j / 16))) & 15;
                    let fifth = ((qh >> j) & 1) as u8;
                    *v = ((nibble | (fifth << 4)) as i8 - 16) as u8;
                }
            }
        }
    }
    Ok(())
}

/// A taken-apart q8 or q4 matrix (`out`, `rows` rows of `cols` values) with its values
/// rearranged, row by row, into the CPU kernels' order (`kernels/dot/interleaved.rs`); its
/// scales stay where they are.
fn reorder(kind: Legacy, rows: usize, cols: usize, out: &mut [u8]) -> Result<()> {
    use crate::quant::interleaved::{interleave_q4, interleave_q8};
    ensure!(
        cols.is_multiple_of(32),
        "rows of {cols} values, not whole blocks"
    );
    let (values, _) = kind.out_bytes();
    let row_bytes = cols / 32 * values;
    ensure!(rows * row_bytes <= out.len(), "the reordered size");
    let mut row = vec![0u8; row_bytes];
    for dst in out[..rows * row_bytes].chunks_exact_mut(row_bytes) {
        row.copy_from_slice(dst);
        match kind {
            Legacy::Q4_0 => interleave_q4(&row, cols, dst),
            _ => interleave_q8(&row, cols, 32, dst),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_q4, dequantize_q8};

    /// Blocks gguf-py quantized (fixtures/gguf/dequant-reference.json) taken apart into the
    /// model file's q8 and q4 layouts dequantize to gguf-py's f32 bits, for each legacy type;
    /// F16 values widen to gguf-py's f32 bits.
    #[test]
    fn taken_apart_blocks_keep_gguf_pys_values() {
        let mut checked = 0;
        for (name, bytes, want) in crate::gguf::tests::dequant_reference_cases() {
            let Some(kind) = Legacy::of(&name) else {
                continue;
            };
            let blocks = bytes.len() / kind.block_bytes();
            if kind == Legacy::F16 {
                // Widened: the f32 values themselves.
                let mut out = vec![0u8; 2 * bytes.len()];
                take_apart(&bytes, kind, &mut out).unwrap();
                let bits: Vec<u32> = out
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                assert_eq!(bits, want, "{kind:?}");
                checked += 1;
                continue;
            }
            let (values, scale) = kind.out_bytes();
            let scales_at = (blocks * values).next_multiple_of(64);
            let mut out = vec![0u8; scales_at + scale * blocks];
            take_apart(&bytes, kind, &mut out).unwrap();
            let mut got = vec![0f32; blocks * 32];
            let (v, s) = (&out[..blocks * values], &out[scales_at..]);
            match kind {
                Legacy::Q4_0 => {
                    let s: Vec<u16> = s
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    dequantize_q4(v, &s, 32, &mut got)
                }
                _ => {
                    let s: Vec<f32> = s
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    dequantize_q8(bytemuck::cast_slice(v), &s, 32, &mut got)
                }
            }
            let bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
            assert_eq!(bits, want, "{kind:?}");
            checked += 1;
        }
        assert_eq!(checked, 4);
    }
}
