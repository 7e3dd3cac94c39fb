//! The memory side of a backend whose buffers are host vectors (`Vec<f32>`): the plain backend,
//! the CPU backend and qwen3-cuda's reference backend say [`HostMemory`] and get their whole
//! [`Memory`] from here, so each of them implements only its arithmetic. Every operation checks
//! its ranges and answers a bad one with an error, not a panic, as a device backend does. Below
//! them, the hybrid layers' host steps those backends share (in textbook and fast kernels).

use super::Memory;
use crate::kernels::delta_net::{self, DeltaNetShape};
use crate::kernels::delta_net_fast;
use anyhow::{bail, ensure, Result};
use std::ops::Range;

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

/// `x[..n]` and `y[..n]`, or an error naming `op` when either is shorter.
fn first<'x>(op: &str, x: &'x [f32], n: usize) -> Result<&'x [f32]> {
    x.get(..n)
        .ok_or_else(|| anyhow::anyhow!("{op}: {n} values of {}", x.len()))
}

/// The kernels a host backend runs the hybrid layers' steps with: the plain backend the
/// textbook's, the CPU backend the fast ones (`kernels/delta_net_fast.rs`, tested against them).
pub struct HybridKernels {
    pub sigmoid_mul: fn(&mut [f32], &[f32]),
    pub causal_conv_silu: fn(&mut [f32], &mut [f32], &[f32], DeltaNetShape),
    #[allow(clippy::type_complexity)]
    pub gated_delta_rule:
        fn(&mut [f32], &[f32], &[f32], &[f32], &[f32], &[f32], &mut [f32], usize, DeltaNetShape),
    pub gated_rmsnorm: fn(&mut [f32], &[f32], &[f32], f32),
}

/// The textbook steps (`kernels/delta_net.rs`).
pub const TEXTBOOK: HybridKernels = HybridKernels {
    sigmoid_mul: |x, gate| {
        for (x, &g) in x.iter_mut().zip(gate) {
            *x *= crate::kernels::textbook::sigmoid(g);
        }
    },
    causal_conv_silu: delta_net::causal_conv_silu,
    gated_delta_rule: delta_net::gated_delta_rule,
    gated_rmsnorm: delta_net::gated_rmsnorm,
};

/// The fast steps (`kernels/delta_net_fast.rs`).
pub const FAST: HybridKernels = HybridKernels {
    sigmoid_mul: delta_net_fast::sigmoid_mul,
    causal_conv_silu: delta_net_fast::causal_conv_silu,
    gated_delta_rule: delta_net_fast::gated_delta_rule,
    gated_rmsnorm: delta_net_fast::gated_rmsnorm,
};

/// [`super::Backend::sigmoid_mul`]: `x[i] *= sigmoid(gate[i])`.
pub fn sigmoid_mul(k: &HybridKernels, x: &mut [f32], gate: &[f32], n: usize) -> Result<()> {
    let gate = first("sigmoid_mul", gate, n)?;
    ensure!(n <= x.len(), "sigmoid_mul: {n} values of {}", x.len());
    (k.sigmoid_mul)(&mut x[..n], gate);
    Ok(())
}

/// [`super::Backend::causal_conv_silu`] on host memory, its ranges checked.
pub fn causal_conv_silu(
    k: &HybridKernels,
    x: &mut [f32],
    window: &mut [f32],
    w: &[f32],
    rows: Range<usize>,
    s: DeltaNetShape,
) -> Result<()> {
    let cd = s.conv_dim();
    ensure!(
        rows.end * cd <= x.len()
            && window.len() == s.conv_state_len()
            && w.len() == cd * s.conv_kernel,
        "causal_conv_silu: rows {rows:?} of {} values, a window of {}, filters of {}",
        x.len(),
        window.len(),
        w.len()
    );
    (k.causal_conv_silu)(&mut x[rows.start * cd..rows.end * cd], window, w, s);
    Ok(())
}

/// [`super::Backend::gated_delta_rule`] on host memory, its ranges checked.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    k: &HybridKernels,
    o: &mut [f32],
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    rows: Range<usize>,
    pos0: usize,
    s: DeltaNetShape,
) -> Result<()> {
    let (cd, vd, vh) = (s.conv_dim(), s.value_dim(), s.num_v_heads);
    ensure!(
        rows.end * cd <= qkv.len()
            && rows.end * vd <= o.len()
            && rows.end * vh <= a.len().min(b.len())
            && a_log.len() == vh
            && dt_bias.len() == vh
            && state.len() == s.recurrent_state_len(),
        "gated_delta_rule: rows {rows:?} do not fit its buffers, or a state or parameter of \
         another shape"
    );
    let (r0, r1) = (rows.start, rows.end);
    (k.gated_delta_rule)(
        &mut o[r0 * vd..r1 * vd],
        &qkv[r0 * cd..r1 * cd],
        &a[r0 * vh..r1 * vh],
        &b[r0 * vh..r1 * vh],
        a_log,
        dt_bias,
        state,
        pos0,
        s,
    );
    Ok(())
}

/// [`super::Backend::gated_rmsnorm`] on host memory, its ranges checked.
#[allow(clippy::too_many_arguments)]
pub fn gated_rmsnorm(
    k: &HybridKernels,
    o: &mut [f32],
    z: &[f32],
    w: &[f32],
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    ensure!(
        w.len() == n,
        "gated_rmsnorm: a gain of {} for rows of {n}",
        w.len()
    );
    let len = rows * w.len();
    let z = first("gated_rmsnorm", z, len)?;
    ensure!(len <= o.len(), "gated_rmsnorm: {len} values of {}", o.len());
    (k.gated_rmsnorm)(&mut o[..len], z, w, eps);
    Ok(())
}
