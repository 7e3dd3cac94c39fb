//! Step 2a of a decoder layer for a Gated DeltaNet layer (Qwen3.5's linear attention): the
//! projections on every row of the step at once, then each sequence's rows through its own
//! convolution window and memory (`model/gated_delta_net.rs` explains the steps).

use super::{Cache, Dims, Forward, Segment};
use crate::backend::Backend;
use crate::model::LinearAttention;
use anyhow::{bail, Result};

impl<'m, B: Backend> Forward<'m, B> {
    /// `Qwen3_5GatedDeltaNet.forward` on the normalised input in `xb` (`[t, hidden]`); leaves
    /// the output (after out_proj) in `xb`. The steps are `model/gated_delta_net.rs`'s, which
    /// explains them; each sequence's rows run through its own state.
    pub(super) fn linear_attention(
        &mut self,
        l: usize,
        la: &LinearAttention<B::Tensor>,
        t: usize,
        segments: &[Segment],
        caches: &mut [Cache<B>],
    ) -> Result<()> {
        let b = self.backend;
        let Dims { d, eps, .. } = self.dims;
        let Some(shape) = self.dims.linear else {
            bail!("layer {l} is a Gated DeltaNet in a model without them");
        };
        let (cd, vd, vh, dv) = (
            shape.conv_dim(),
            shape.value_dim(),
            shape.num_v_heads,
            shape.head_v_dim,
        );
        let s = &mut self.s;

        // i. Projections, the four in one pass over xb.
        //    qkv: [t, conv_dim]   z: [t, value_dim]   beta, decay (b, a): [t, num_v_heads]
        b.matmuls(
            [&mut s.qkv, &mut s.z, &mut s.beta, &mut s.decay],
            [&la.in_proj_qkv, &la.in_proj_z, &la.in_proj_b, &la.in_proj_a],
            &s.xb,
            t,
            [cd, vd, vh, vh],
            d,
        )?;

        // ii-iii. Per sequence, its rows in order through its state: the causal convolution
        //     and SiLU (the window moves along), then the gated delta rule (the memory is
        //     updated and read).                                         o: [t, value_dim]
        let mut r0 = 0;
        for seg in segments {
            let rows = r0..r0 + seg.len;
            let [window, memory] = &mut caches[seg.seq].linear[self.slot[l]];
            b.causal_conv_silu(&mut s.qkv, window, &la.conv1d, rows.clone(), shape)?;
            b.gated_delta_rule(
                &mut s.o,
                &s.qkv,
                &s.decay,
                &s.beta,
                &la.a_log,
                &la.dt_bias,
                memory,
                rows,
                seg.pos,
                shape,
            )?;
            r0 += seg.len;
        }

        // iv. The gated RMSNorm of each value head's output.    o = norm(o) * w * silu(z)
        b.gated_rmsnorm(&mut s.o, &s.z, &la.norm, t * vh, dv, eps)?;

        // v. Output projection back to the residual width.      xb: [t, hidden]
        b.matmul(&mut s.xb, &la.out_proj, &s.o, t, d, vd)
    }
}
