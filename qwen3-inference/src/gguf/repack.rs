//! A GGUF's Q8_0 and Q4_0 matrices in the model file's q8 and q4 layouts, made once when the
//! file is opened.
//!
//! Q8_0 and our q8 with groups of 32 hold the same numbers: 32 int8 values and one scale,
//! `w = d q`; Q4_0 and our q4 with groups of 32 too: 16 bytes whose low nibbles are values 0..16
//! and high nibbles values 16..32, each `q + 8`, and one f16 scale, `w = d (nibble - 8)`. They
//! differ in where the bytes lie. The GGUF interleaves them, block after block:
//!
//! ```text
//! Q8_0 row:   [d f16][q i8 x 32] [d f16][q i8 x 32] ...       34 bytes a block
//! q8 tensor:  [q i8, every row's values in order] [pad to 64] [d f32, every group's]
//! Q4_0 row:   [d f16][16 bytes of nibbles] ...                 18 bytes a block
//! q4 tensor:  [nibble bytes, every row's in order] [pad to 64] [d f16, every group's]
//! ```
//!
//! The kernels read values as one contiguous run (whole AVX-512 vectors of them) and scales as
//! another, so the blocks are taken apart once, at open, into that layout: the values copied as
//! they are, each scale as it is (q8's widened to the f32 it stands for: exact, every f16 is an
//! f32).
//! Nothing is rounded again, so the model computes with the very weights the GGUF holds
//! (`gguf/tests.rs` checks every value against gguf-py's dequantization). The copy takes the
//! file's bytes of those tensors once more; the file's pages of them are released after it
//! (`MappedFile::release`), so the process holds them once.

use super::{model::hf_name, GgufHeader};
use crate::format::reader::{Derived, Header};
use crate::pages::HugePages;
use anyhow::{ensure, Context, Result};
use half::f16;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;

/// The ggml types taken apart at open.
pub const REPACKED: [&str; 2] = ["Q8_0", "Q4_0"];

/// The model file's layout of every Q8_0 and Q4_0 tensor of GGUF header `g` (whose bytes are
/// `file`), at the offsets and sizes `header` (its model file header, `model::model_header`)
/// gives them in the repacked bytes; `None` where the file has no such tensor. `release` is told
/// each tensor's range of `file` once it is copied, so that the file's pages can go while the
/// next are read (`MappedFile::release`), and the process never holds a tensor twice for long.
pub fn repack(
    g: &GgufHeader,
    header: &Header,
    file: &[u8],
    release: &(dyn Fn(Range<usize>) + Sync),
) -> Result<Option<Derived>> {
    let by_name: HashMap<&str, _> = header
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut jobs = Vec::new();
    for t in g.tensors.iter() {
        if !REPACKED.contains(&t.ggml_type.name) {
            continue;
        }
        let name = hf_name(&t.name).context("a tensor's name")?;
        let info = by_name
            .get(name.as_str())
            .with_context(|| format!("{name}: not in the model file's header"))?;
        let at = info.offset as usize..(info.offset + info.nbytes) as usize;
        let source = t.start as usize..(t.start + t.nbytes) as usize;
        jobs.push((name, source, at, t.ggml_type.name == "Q4_0"));
    }
    let Some(len) = jobs.iter().map(|(_, _, at, _)| at.end).max() else {
        return Ok(None);
    };
    let mut bytes = HugePages::<u8>::zeroed(len)
        .with_context(|| format!("cannot allocate {len} bytes for the Q8_0 and Q4_0 tensors"))?;
    // Each tensor's range of the buffer, handed to its own task.
    let mut parts: Vec<(Range<usize>, bool, &mut [u8])> = Vec::with_capacity(jobs.len());
    let mut rest: &mut [u8] = &mut bytes;
    let mut taken = 0;
    let mut order: Vec<&(String, Range<usize>, Range<usize>, bool)> = jobs.iter().collect();
    order.sort_by_key(|(_, _, at, _)| at.start);
    for (_, source, at, four) in order {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at.start - taken);
        let (mine, tail) = tail.split_at_mut(at.len());
        parts.push((source.clone(), *four, mine));
        rest = tail;
        taken = at.end;
    }
    parts.into_par_iter().try_for_each(|(source, four, out)| {
        take_apart(&file[source.clone()], four, out)?;
        release(source);
        Ok::<_, anyhow::Error>(())
    })?;
    let at = jobs
        .into_iter()
        .map(|(name, _, at, _)| (name, at))
        .collect();
    Ok(Some(Derived::new(bytes, at)))
}

/// One tensor's Q8_0 (or, `four`, Q4_0) blocks (`source`) into its model file bytes (`out`):
/// the values, then at the next multiple of 64 the scales (q8: f32, q4: f16 as they are).
fn take_apart(source: &[u8], four: bool, out: &mut [u8]) -> Result<()> {
    // A block's bytes of values (after its f16 scale), and a scale's bytes in the model file.
    let (values, scale) = match four {
        true => (16, 2),
        false => (32, 4),
    };
    ensure!(source.len().is_multiple_of(2 + values), "a partial block");
    let blocks = source.len() / (2 + values);
    let scales_at = (blocks * values).next_multiple_of(64);
    ensure!(out.len() == scales_at + scale * blocks, "the repacked size");
    let (q, rest) = out.split_at_mut(blocks * values);
    let scales = &mut rest[scales_at - blocks * values..];
    for (b, block) in source.chunks_exact(2 + values).enumerate() {
        match four {
            true => scales[2 * b..2 * b + 2].copy_from_slice(&block[..2]),
            false => {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                scales[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
        q[b * values..(b + 1) * values].copy_from_slice(&block[2..]);
    }
    Ok(())
}
