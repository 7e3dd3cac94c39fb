//! The draw: one token, chosen with probability proportional to its weight.

use crate::kernels::lanes;

/// Weights the draw sums at a time before it walks one by one.
pub(super) const DRAW_BLOCK: usize = 64;

/// The index where the running sum of `weights` passes `u` times their total (`u` uniform in
/// [0, 1)): index i with probability `weights[i] / total`.
///
/// A walk that subtracts one weight at a time is a chain of dependent f64 subtractions, about
/// four cycles a weight, slow over the whole vocabulary (measured: docs/sampling.md, "Making it
/// cheap"). So the weights are summed [`DRAW_BLOCK`] at a time in independent lanes
/// (vectorized), the total is the sum of those block sums, and the walk goes block by block,
/// then one by one inside the block where `u` falls. `block_sums` is the caller's buffer, reused
/// across tokens.
#[inline(always)]
pub(super) fn draw(weights: &[f32], u: f64, block_sums: &mut Vec<f64>) -> usize {
    block_sums.resize(weights.len().div_ceil(DRAW_BLOCK), 0.0);
    let mut total = 0.0;
    for (s, b) in block_sums.iter_mut().zip(weights.chunks(DRAW_BLOCK)) {
        *s = lanes::sum(b) as f64;
        total += *s;
    }
    let mut r = u * total;
    for (b, &s) in block_sums.iter().enumerate() {
        if r < s {
            let block = &weights[b * DRAW_BLOCK..(b * DRAW_BLOCK + DRAW_BLOCK).min(weights.len())];
            for (j, &w) in block.iter().enumerate() {
                r -= w as f64;
                if r < 0.0 {
                    return b * DRAW_BLOCK + j;
                }
            }
            // The lanes summed in another order than this walk: the sliver of rounding left
            // belongs to the block's last token with a weight (a zero weight is a token the
            // filters dropped; this block's sum is positive, so it has one).
            let last = block
                .iter()
                .rposition(|&w| w > 0.0)
                .unwrap_or(block.len() - 1);
            return b * DRAW_BLOCK + last;
        }
        r -= s;
    }
    // Rounding left a sliver of mass past the end: it belongs to the last token with a weight.
    weights
        .iter()
        .rposition(|&w| w > 0.0)
        .unwrap_or(weights.len().saturating_sub(1))
}
