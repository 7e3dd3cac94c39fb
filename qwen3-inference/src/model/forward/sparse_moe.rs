//! Step 2b of a decoder layer for a sparse layer (Qwen3-MoE's and Qwen3.5-MoE's
//! `SparseMoeBlock`): the router's choice for every row, each expert run once on the rows that
//! chose it, and the weighted outputs added back in ascending expert order
//! (`model/moe.rs` has the routing's math).

use super::{Dims, Forward};
use crate::backend::Backend;
use crate::model::Qwen3MoeSparseMoeBlock;
use anyhow::Result;

impl<'m, B: Backend> Forward<'m, B> {
    /// `Qwen3MoeSparseMoeBlock.forward` on the normalised input in `xb` (`[t, hidden]`); leaves
    /// the weighted sum of each row's chosen experts in `xb`. The routing math is in
    /// [`super::moe`].
    pub(super) fn sparse_moe(
        &mut self,
        moe: &Qwen3MoeSparseMoeBlock<B::Tensor>,
        t: usize,
    ) -> Result<()> {
        let b = self.backend;
        let Dims {
            d,
            experts,
            top_k,
            moe_ff: mff,
            norm_topk,
            ..
        } = self.dims;
        let s = &mut self.s;

        // i. The router's logits, f32 weights and f32 activations: z = xb @ gate^T.
        //    router: [t, num_experts]
        b.matmul(&mut s.router, &moe.gate, &s.xb, t, experts, d)?;

        // ii. Routing on the host: softmax, top-k, renormalised; grouped by expert.
        let logits = b.read(&s.router, t * experts, &mut self.router_host)?;
        self.routes.route(logits, t, experts, top_k, norm_topk);
        if let Some(log) = &mut self.route_log {
            // Row r's experts, ascending: each expert's rows are ascending, so a pass over the
            // experts in order lists each row's choices in order.
            let start = log.len();
            log.resize(start + t * top_k, 0);
            let mut filled = vec![0usize; t];
            for (e, rows) in self.routes.rows.iter().enumerate() {
                for &r in rows {
                    let r = r as usize;
                    log[start + r * top_k + filled[r]] = e as u32;
                    filled[r] += 1;
                }
            }
        }

        // iii. Each chosen expert once, on all the rows that chose it, its weighted output
        //      added to those rows, experts in ascending order.      moe_out: [t, hidden]
        b.zero(&mut s.moe_out, t * d)?;
        for (e, expert) in moe.experts.iter().enumerate() {
            let (rows, weights) = (&self.routes.rows[e], &self.routes.weights[e]);
            let n = rows.len();
            if n == 0 {
                continue;
            }
            b.gather_rows(&mut s.expert_in, &s.xb, rows, d)?; //      expert_in: [n, hidden]
            b.matmuls(
                [&mut s.gate, &mut s.up],
                [&expert.gate_proj, &expert.up_proj],
                &s.expert_in,
                n,
                [mff, mff],
                d,
            )?;
            b.silu_mul(&mut s.gate, &s.up, n * mff)?; //         gate = silu(gate) * up
            b.matmul(&mut s.expert_out, &expert.down_proj, &s.gate, n, d, mff)?;
            b.scatter_add_rows(&mut s.moe_out, &s.expert_out, rows, weights, d)?;
        }

        // iv. Qwen3.5-MoE: the shared expert on every row, weighted by its gate and added after
        //     the routed experts (`Qwen3_5MoeSparseMoeBlock`):
        //     moe_out += sigmoid(xb . shared_expert_gate) * shared_expert(xb)
        if let Some((shared, gate)) = &moe.shared_expert {
            let sff = self.dims.shared_ff;
            b.matmuls(
                [&mut s.gate, &mut s.up],
                [&shared.gate_proj, &shared.up_proj],
                &s.xb,
                t,
                [sff, sff],
                d,
            )?;
            b.silu_mul(&mut s.gate, &s.up, t * sff)?;
            b.matmul(&mut s.expert_out, &shared.down_proj, &s.gate, t, d, sff)?;
            //   The gate's logit per row, [t, 1], on the host as the router's are.
            b.matmul(&mut s.router, gate, &s.xb, t, 1, d)?;
            let g = b.read(&s.router, t, &mut self.router_host)?;
            self.shared_weights.clear();
            self.shared_weights
                .extend(g.iter().map(|&z| crate::kernels::textbook::sigmoid(z)));
            self.shared_rows.clear();
            self.shared_rows.extend(0..t as u32);
            b.scatter_add_rows(
                &mut s.moe_out,
                &s.expert_out,
                &self.shared_rows,
                &self.shared_weights,
                d,
            )?;
        }
        b.copy(&mut s.xb, 0, &s.moe_out, 0, t * d)
    }
}
