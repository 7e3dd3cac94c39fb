//! A GGUF's Q8_0 matrices in the model file's q8 layout, made once when the file is opened.
//!
//! Q8_0 and our q8 with groups of 32 hold the same numbers: 32 int8 values and one scale, `w = d
//! * q`. They differ in where the bytes lie. Q8_0 interleaves them, block after block:
//!
//! ```text
//! Q8_0 row:   [d f16][q i8 x 32] [d f16][q i8 x 32] ...       34 bytes a block
//! q8 tensor:  [q i8, every row's values in order] [pad to 64] [d f32, every group's]
//! ```
//!
//! The q8 kernels read values as one contiguous run (whole AVX-512 vectors of them) and scales
//! as another, so the blocks are taken apart once, at open, into that layout: the values copied
//! as they are, each f16 scale widened to the f32 it stands for (exact: every f16 is an f32).
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

/// Values a Q8_0 block holds, and its bytes (a f16 scale, then the values).
const BLOCK: usize = 32;
const BLOCK_BYTES: usize = 34;

/// The q8 layout of every Q8_0 tensor of GGUF header `g` (whose bytes are `file`), at the
/// offsets and sizes `header` (its model file header, `model::model_header`) gives them in the
/// repacked bytes; `None` where the file has no Q8_0 tensor. `release` is told each tensor's
/// range of `file` once it is copied, so that the file's pages can go while the next are read
/// (`MappedFile::release`), and the process never holds a tensor twice for long.
pub fn q8_0(
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
    for t in g.tensors.iter().filter(|t| t.ggml_type.name == "Q8_0") {
        let name = hf_name(&t.name).context("a tensor's name")?;
        let info = by_name
            .get(name.as_str())
            .with_context(|| format!("{name}: not in the model file's header"))?;
        let at = info.offset as usize..(info.offset + info.nbytes) as usize;
        jobs.push((name, t.start as usize..(t.start + t.nbytes) as usize, at));
    }
    let Some(len) = jobs.iter().map(|(_, _, at)| at.end).max() else {
        return Ok(None);
    };
    let mut bytes = HugePages::<u8>::zeroed(len)
        .with_context(|| format!("cannot allocate {len} bytes for the Q8_0 tensors"))?;
    // Each tensor's range of the buffer, handed to its own task.
    let mut parts: Vec<(Range<usize>, &mut [u8])> = Vec::with_capacity(jobs.len());
    let mut rest: &mut [u8] = &mut bytes;
    let mut taken = 0;
    let mut order: Vec<&(String, Range<usize>, Range<usize>)> = jobs.iter().collect();
    order.sort_by_key(|(_, _, at)| at.start);
    for (_, source, at) in order {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at.start - taken);
        let (mine, tail) = tail.split_at_mut(at.len());
        parts.push((source.clone(), mine));
        rest = tail;
        taken = at.end;
    }
    parts.into_par_iter().try_for_each(|(source, out)| {
        take_apart(&file[source.clone()], out)?;
        release(source);
        Ok::<_, anyhow::Error>(())
    })?;
    let at = jobs.into_iter().map(|(name, _, at)| (name, at)).collect();
    Ok(Some(Derived::new(bytes, at)))
}

/// One tensor's Q8_0 blocks (`source`) into its q8 bytes (`out`): the values, then at the next
/// multiple of 64 the scales as f32.
fn take_apart(source: &[u8], out: &mut [u8]) -> Result<()> {
    ensure!(
        source.len().is_multiple_of(BLOCK_BYTES),
        "Q8_0: a partial block"
    );
    let blocks = source.len() / BLOCK_BYTES;
    let values = blocks * BLOCK;
    let scales_at = values.next_multiple_of(64);
    ensure!(out.len() == scales_at + 4 * blocks, "Q8_0: the q8 size");
    let (q, rest) = out.split_at_mut(values);
    let scales = &mut rest[scales_at - values..];
    for (b, block) in source.chunks_exact(BLOCK_BYTES).enumerate() {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        scales[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
        q[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&block[2..]);
    }
    Ok(())
}
