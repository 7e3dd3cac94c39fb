//! Mixture-of-experts routing (Qwen3-MoE's `Qwen3MoeTopKRouter`, transformers'
//! `modeling_qwen3_moe.py`): which experts each token goes to, and with what weight.
//!
//! For each token (row) `t` of a step, the router's logits `z = x W_gate^T` (`[num_experts]`,
//! computed by the backend in f32) become probabilities and a choice:
//!
//! ```text
//! p = softmax(z)                            in f32, as torch's softmax(dtype=float)
//! (w, e) = top-k of p                       the k largest, the lower expert id first on a tie
//! w = w / sum(w)                            only with norm_topk_prob
//! moe(x) = sum over chosen e, by ascending e, of w_e * expert_e(x)
//! ```
//!
//! The forward pass then runs each expert once for all the rows that chose it (a grouped
//! product: its weights are read once a step, not once a row), and adds each row's weighted
//! outputs back in ascending expert order, as transformers' loop over `expert_hit` does. A row's
//! numbers depend on its own routing only, never on its neighbours', so batching stays
//! invariant.

/// One step's routing, grouped by expert: expert `e` runs on `rows[e]` with `weights[e]`
/// (parallel lists, rows ascending). Reused from step to step: [`Routes::route`] refills it.
#[derive(Debug, Default, Clone)]
pub struct Routes {
    pub rows: Vec<Vec<u32>>,
    pub weights: Vec<Vec<f32>>,
    /// One row's probabilities and its ranking (scratch).
    probs: Vec<f32>,
    order: Vec<u32>,
}

impl Routes {
    /// Routes the `t` rows of `logits` (`[t, num_experts]`) to their top `k` experts.
    pub fn route(&mut self, logits: &[f32], t: usize, num_experts: usize, k: usize, norm: bool) {
        self.rows.resize_with(num_experts, Vec::new);
        self.weights.resize_with(num_experts, Vec::new);
        for e in 0..num_experts {
            self.rows[e].clear();
            self.weights[e].clear();
        }
        for (row, z) in logits[..t * num_experts]
            .chunks_exact(num_experts)
            .enumerate()
        {
            // 1. softmax, in f32: exp(z - max) / sum.
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            self.probs.clear();
            self.probs
                .extend(z.iter().map(|&v| ((v - max) as f64).exp() as f32));
            let sum: f32 = self.probs.iter().sum();
            for p in &mut self.probs {
                *p /= sum;
            }
            // 2. top-k: the k largest probabilities, ties to the lower expert id.
            self.order.clear();
            self.order.extend(0..num_experts as u32);
            let probs = &self.probs;
            let rank = |a: &u32, b: &u32| {
                probs[*b as usize]
                    .total_cmp(&probs[*a as usize])
                    .then(a.cmp(b))
            };
            if k < num_experts {
                self.order.select_nth_unstable_by(k - 1, rank);
            }
            let chosen = &mut self.order[..k];
            chosen.sort_unstable_by(rank);
            // 3. renormalised over the chosen ones (norm_topk_prob), in f32; the sum in
            //    descending order, as torch sums topk's values.
            let total: f32 = chosen.iter().map(|&e| probs[e as usize]).sum();
            for &e in chosen.iter() {
                let p = probs[e as usize];
                self.rows[e as usize].push(row as u32);
                self.weights[e as usize].push(if norm { p / total } else { p });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routing of two rows, worked by hand: softmax, top-2, renormalised or not, grouped by
    /// expert with rows ascending.
    #[test]
    fn routes_by_softmax_top_k() {
        // row 0 prefers experts 2 then 0; row 1 prefers 3 then 2.
        let logits = [1.0, -1.0, 2.0, 0.0, 0.0, -2.0, 1.0, 3.0];
        let mut r = Routes::default();
        r.route(&logits, 2, 4, 2, false);
        let softmax = |z: &[f32]| -> Vec<f32> {
            let s: f64 = z.iter().map(|&v| (v as f64).exp()).sum();
            z.iter().map(|&v| ((v as f64).exp() / s) as f32).collect()
        };
        let (p0, p1) = (softmax(&logits[..4]), softmax(&logits[4..]));
        assert_eq!(r.rows, vec![vec![0], vec![], vec![0, 1], vec![1]]);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        assert!(close(r.weights[0][0], p0[0]) && close(r.weights[2][0], p0[2]));
        assert!(close(r.weights[2][1], p1[2]) && close(r.weights[3][0], p1[3]));
        r.route(&logits, 2, 4, 2, true);
        assert!(close(r.weights[2][0], p0[2] / (p0[2] + p0[0])));
        assert!(close(r.weights[3][0] + r.weights[2][1], 1.0));
    }

    /// Ties go to the lower expert id; k = num_experts takes every expert.
    #[test]
    fn ties_and_every_expert() {
        let mut r = Routes::default();
        r.route(&[0.5, 0.5, 0.5], 1, 3, 2, true);
        assert_eq!(r.rows, vec![vec![0], vec![0], vec![]]);
        assert_eq!(r.weights[0], vec![0.5]);
        r.route(&[3.0, 1.0, 2.0], 1, 3, 3, false);
        assert_eq!(r.rows, vec![vec![0], vec![0], vec![0]]);
        let sum: f32 = r.weights.iter().flatten().sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}
