//! The memory side of a backend whose buffers are host vectors (`Vec<f32>`): the plain backend,
//! the CPU backend and qwen3-cuda's reference backend say [`HostMemory`] and get their whole
//! [`Memory`] from here, so each of them implements only its arithmetic. Every operation checks
//! its ranges and answers a bad one with an error, not a panic, as a device backend does. The
//! hybrid layers' steps the plain and CPU backends share are `hybrid_steps.rs`'s.

use super::Memory;
use anyhow::{bail, ensure, Result};

/// A backend whose buffers are host vectors: saying so (`impl HostMemory for MyBackend {}`)
/// gives it this module's [`Memory`], and it implements only [`super::Backend`]'s arithmetic.
pub trait HostMemory {}

impl<T: HostMemory> Memory for T {
    type Buf = Vec<f32>;

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        alloc(len)
    }
    fn copy(
        &self,
        dst: &mut Vec<f32>,
        dst_offset: usize,
        src: &Vec<f32>,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        copy(dst, dst_offset, src, src_offset, len)
    }
    fn read<'s>(
        &self,
        x: &'s Vec<f32>,
        len: usize,
        _staging: &'s mut Vec<f32>,
    ) -> Result<&'s [f32]> {
        read(x, len)
    }
    fn write(&self, x: &mut Vec<f32>, offset: usize, src: &[f32]) -> Result<()> {
        write(x, offset, src)
    }
    fn zero(&self, x: &mut Vec<f32>, n: usize) -> Result<()> {
        zero(x, n)
    }
    fn scatter_add_rows(
        &self,
        out: &mut Vec<f32>,
        y: &Vec<f32>,
        rows: &[u32],
        weights: &[f32],
        n: usize,
    ) -> Result<()> {
        scatter_add_rows(out, y, rows, weights, n)
    }
}

/// [`Memory::alloc`]: `len` zeros.
pub fn alloc(len: usize) -> Result<Vec<f32>> {
    Ok(vec![0.0; len])
}

/// [`Memory::copy`]: `dst[dst_offset..][..len] = src[src_offset..][..len]`.
pub fn copy(
    dst: &mut [f32],
    dst_offset: usize,
    src: &[f32],
    src_offset: usize,
    len: usize,
) -> Result<()> {
    let (dst_len, src_len) = (dst.len(), src.len());
    let to = dst_offset
        .checked_add(len)
        .and_then(|end| dst.get_mut(dst_offset..end));
    let from = src_offset
        .checked_add(len)
        .and_then(|end| src.get(src_offset..end));
    let (Some(to), Some(from)) = (to, from) else {
        bail!("copy out of bounds: {len} values from {src_offset} of {src_len} to {dst_offset} of {dst_len}");
    };
    to.copy_from_slice(from);
    Ok(())
}

/// [`Memory::write`]: `x[offset..][..src.len()] = src`.
pub fn write(x: &mut [f32], offset: usize, src: &[f32]) -> Result<()> {
    let len = x.len();
    let to = offset
        .checked_add(src.len())
        .and_then(|end| x.get_mut(offset..end));
    let Some(to) = to else {
        bail!(
            "write out of bounds: {} values at {offset} of {len}",
            src.len()
        );
    };
    to.copy_from_slice(src);
    Ok(())
}

/// What [`super::Backend::rope_mrope`] needs of its arguments: a triple per token, a component
/// (0, 1 or 2) per rotated frequency, every position inside the table.
pub fn check_mrope(
    table: &crate::kernels::RopeTable,
    n_tok: usize,
    positions: &[[u32; 3]],
    components: &[u8],
) -> Result<()> {
    ensure!(
        positions.len() >= n_tok,
        "M-RoPE: {} positions for {n_tok} tokens",
        positions.len()
    );
    ensure!(
        components.len() == table.rotary_dim() / 2 && components.iter().all(|&c| c < 3),
        "M-RoPE: {} components for {} rotated frequencies",
        components.len(),
        table.rotary_dim() / 2
    );
    let max = table.max_pos();
    if let Some(p) = positions[..n_tok]
        .iter()
        .flatten()
        .find(|&&p| p as usize >= max)
    {
        bail!("M-RoPE: position {p} is past the table's {max}");
    }
    Ok(())
}

/// [`Memory::read`]: the first `len` values, borrowed (host memory needs no staging).
pub fn read(x: &[f32], len: usize) -> Result<&[f32]> {
    ensure!(len <= x.len(), "read out of bounds: {len} of {}", x.len());
    Ok(&x[..len])
}

/// [`Memory::zero`]: the first `n` values set to 0.
pub fn zero(x: &mut [f32], n: usize) -> Result<()> {
    ensure!(n <= x.len(), "zero out of bounds: {n} of {}", x.len());
    x[..n].fill(0.0);
    Ok(())
}

/// [`Memory::scatter_add_rows`]: `out[rows[i]] += weights[i] * y[i]`, row `i` of `y` being
/// `n` wide, in the order of `rows` (so each output row sums its experts in ascending order).
/// Every row is checked before any is added, so an error leaves `out` as it was.
pub fn scatter_add_rows(
    out: &mut [f32],
    y: &[f32],
    rows: &[u32],
    weights: &[f32],
    n: usize,
) -> Result<()> {
    let needed = rows.len().checked_mul(n);
    ensure!(
        n > 0 && needed.is_some_and(|v| v <= y.len()) && weights.len() == rows.len(),
        "scatter_add_rows: {} rows of {n} with {} weights from {} values",
        rows.len(),
        weights.len(),
        y.len()
    );
    let out_rows = out.len() / n;
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= out_rows) {
        bail!("scatter_add_rows: row {r} out of bounds ({out_rows} rows)");
    }
    for ((&r, &w), yr) in rows.iter().zip(weights).zip(y.chunks_exact(n)) {
        let o = &mut out[r as usize * n..][..n];
        for (o, &v) in o.iter_mut().zip(yr) {
            *o += w * v;
        }
    }
    Ok(())
}
