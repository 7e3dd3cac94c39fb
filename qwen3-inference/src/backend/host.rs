//! The memory side of a backend whose buffers are host vectors (`Vec<f32>`): the plain backend,
//! the CPU backend and qwen3-cuda's reference backend share these, so each of them implements
//! only its arithmetic. Every operation checks its ranges and answers a bad one with an error,
//! not a panic, as a device backend does.

use anyhow::{ensure, Result};

/// [`super::Backend::alloc`]: `len` zeros.
pub fn alloc(len: usize) -> Result<Vec<f32>> {
    Ok(vec![0.0; len])
}

/// [`super::Backend::copy`]: `dst[dst_offset..][..len] = src[src_offset..][..len]`.
pub fn copy(
    dst: &mut [f32],
    dst_offset: usize,
    src: &[f32],
    src_offset: usize,
    len: usize,
) -> Result<()> {
    ensure!(
        dst_offset + len <= dst.len() && src_offset + len <= src.len(),
        "copy out of bounds: {len} values from {src_offset} of {} to {dst_offset} of {}",
        src.len(),
        dst.len()
    );
    dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
    Ok(())
}

/// [`super::Backend::read`]: the first `len` values, borrowed (host memory needs no staging).
pub fn read(x: &[f32], len: usize) -> Result<&[f32]> {
    ensure!(len <= x.len(), "read out of bounds: {len} of {}", x.len());
    Ok(&x[..len])
}

/// [`super::Backend::zero`]: the first `n` values set to 0.
pub fn zero(x: &mut [f32], n: usize) -> Result<()> {
    ensure!(n <= x.len(), "zero out of bounds: {n} of {}", x.len());
    x[..n].fill(0.0);
    Ok(())
}

/// [`super::Backend::scatter_add_rows`]: `out[rows[i]] += weights[i] * y[i]`, row `i` of `y` being
/// `n` wide, in the order of `rows` (so each output row sums its experts in ascending order).
pub fn scatter_add_rows(
    out: &mut [f32],
    y: &[f32],
    rows: &[u32],
    weights: &[f32],
    n: usize,
) -> Result<()> {
    ensure!(
        y.len() >= rows.len() * n && weights.len() == rows.len(),
        "scatter_add_rows: {} rows of {n} with {} weights from {} values",
        rows.len(),
        weights.len(),
        y.len()
    );
    for ((&r, &w), yr) in rows.iter().zip(weights).zip(y.chunks_exact(n)) {
        let start = r as usize * n;
        let o = out
            .get_mut(start..start + n)
            .ok_or_else(|| anyhow::anyhow!("scatter_add_rows: row {r} out of bounds"))?;
        for (o, &v) in o.iter_mut().zip(yr) {
            *o += w * v;
        }
    }
    Ok(())
}
