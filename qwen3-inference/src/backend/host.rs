//! The memory side of a backend whose buffers are host vectors (`Vec<f32>`): the plain backend,
//! the CPU backend and qwen3-cuda's reference backend share these, so each of them implements
//! only its arithmetic. Every operation checks its ranges and answers a bad one with an error,
//! not a panic, as a device backend does.

use anyhow::{bail, ensure, Result};

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
