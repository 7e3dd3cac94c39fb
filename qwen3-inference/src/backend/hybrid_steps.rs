//! The hybrid layers' steps (Qwen3.5's Gated DeltaNet and gated attention) as a backend over host
//! vectors runs them: each [`Backend`](super::Backend) method's checks of its ranges, answered
//! with an error naming the operation, then the kernels the backend chose ([`HybridKernels`]:
//! the plain backend [`TEXTBOOK`], the CPU backend [`FAST`]).

use crate::kernels::delta_net::{self, DeltaNetShape};
use crate::kernels::delta_net_fast;
use anyhow::{ensure, Result};
use std::ops::Range;

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
