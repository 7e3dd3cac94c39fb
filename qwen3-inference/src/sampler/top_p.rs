//! top-p, or nucleus sampling (Holtzman et al. 2019): keep the smallest set of most likely tokens
//! whose probability reaches `top_p`, and draw from those alone.
//!
//! Two versions of one function. [`plain_nucleus`] is the definition, as llama2.c's `sample_topp`
//! writes it: sort every token by probability and walk the running sum. [`nucleus`] finds the
//! same set without sorting the vocabulary, and is tested against the plain one
//! (`sampler/tests.rs`).

use super::filter::{cut_to_nucleus, descending, max_value, NEGLIGIBLE};
use crate::kernels::exp::exp;
use crate::kernels::lanes;

/// The tokens top-p keeps, most likely first: the shortest prefix of the tokens sorted by
/// probability whose probabilities add up to at least `top_p` (the token that crosses `top_p` is
/// kept, as HuggingFace's `TopPLogitsWarper` keeps it). `scaled` holds the logits already divided
/// by the temperature, `[vocab]`; `top_p` is in (0, 1].
///
/// Sorting 151936 tokens is costly next to a decode step (measured: docs/sampling.md, "Making it
/// cheap"): the sampler runs [`nucleus`] instead. This one is the reference it is checked against.
pub fn plain_nucleus(scaled: &[f32], top_p: f64) -> Vec<u32> {
    // 1. Unnormalised probabilities: p_i ~ exp(l_i - max). Subtracting the largest logit keeps
    //    every exponential in (0, 1], so none overflows; it cancels in p_i / z.
    let max = scaled.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l)) as f64;
    let mut by_prob: Vec<(f64, u32)> = (scaled.iter().enumerate())
        .map(|(i, &l)| ((l as f64 - max).exp(), i as u32))
        .collect();
    let z: f64 = by_prob.iter().map(|&(p, _)| p).sum();
    // 2. Most likely first; the lower id first on ties.
    by_prob.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    // 3. Walk the running sum: keep a token while the mass before it is below top_p * z.
    let mut kept = Vec::new();
    let mut mass = 0.0;
    for (p, id) in by_prob {
        if mass >= top_p * z {
            break;
        }
        kept.push(id);
        mass += p;
    }
    kept
}

/// Tokens per block of top-p's passes: each block's largest logit is kept, so a pass skips the
/// blocks that hold no token it looks for with one comparison.
const TOP_P_BLOCK: usize = 256;
/// top-p's search for its cut stops when at most this many tokens lie between its bounds; those
/// are then sorted.
const FEW: usize = 1024;
/// Depth of top-p's first threshold below the top token, in (temperature-scaled) logits; each
/// next one goes twice as deep.
const FIRST_DEPTH: f32 = 0.5;

/// top-p's buffers, kept across tokens: their sizes follow the vocabulary, not the step.
#[derive(Default)]
pub(super) struct TopPBuffers {
    /// The largest scaled logit of each block of [`TOP_P_BLOCK`] tokens.
    pub(super) block_max: Vec<f32>,
    /// (scaled logit, token) of the tokens between the search's bounds.
    pub(super) between: Vec<(f32, u32)>,
}

/// What [`nucleus`] left for the draw.
pub(super) enum Nucleus {
    /// The kept tokens are in `candidates`.
    Listed,
    /// `weights` holds `exp(l - max)` for each of this many kept tokens and 0 for the others.
    Weighted(usize),
}

/// top-p without top-k, with min-p's floor when it is higher. A nucleus of at most [`FEW`]
/// tokens above the search's upper bound is listed in `candidates`; a larger one is left in
/// `weights` (`[vocab]`): `exp(l - max)` for every token kept, 0 for every other.
///
/// The nucleus can be a few tokens or most of the vocabulary. Sorting (or selecting among) the
/// 151936 tokens is costly next to a decode step, and so is any pass that handles the tokens one
/// at a time, as collecting them into a list does (measured: docs/sampling.md, "Making it
/// cheap"). So the vocabulary is only read in passes the compiler vectorizes, and only the
/// tokens around the cut are listed and sorted:
/// 1. The largest logit of each block of [`TOP_P_BLOCK`] tokens, and `z`, the sum of the
///    weights `exp(l - max)` of every token within reach of the top one (see [`NEGLIGIBLE`]).
/// 2. The search: [`above`] gives the mass `M(x)` of the tokens whose logit is at least `x`,
///    reading only the blocks that reach `x`. The cut lies between two bounds, `hi` with
///    `M(hi) < top_p * z` (every token at or above `hi` is kept: the mass before each is below
///    the target) and `lo` with `M(lo) >= top_p * z`. Thresholds go down from the top, 0.5, 1,
///    2, 4 ... below it, until one reaches the target; then `[lo, hi)` is halved until at most
///    [`FEW`] tokens lie in it.
///    Once a threshold reaches most blocks, the weights are written into `weights`, and the
///    passes after it read them instead of computing an exponential per token.
/// 3. Those tokens are listed and sorted, and the cut among them found as HF finds it
///    ([`cut_to_nucleus`]).
/// 4. A nucleus of many tokens: one pass zeroes the weights of the tokens below the cut (a list
///    of them would cost a pass that handles them one at a time).
///
/// Masses are f32 sums of a block's weights in lanes, added up in f64; the cut's walk adds
/// weights in f64. They agree to about 1e-7, as closely as `exp` itself matches the exact
/// exponential. The draw then walks the vocabulary in its own order ([`draw`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nucleus(
    src: &[f32],
    inv_t: f32,
    max: f32,
    top_p: f64,
    min_p_floor: f32,
    weights: &mut [f32],
    candidates: &mut Vec<(f32, u32)>,
    buffers: &mut TopPBuffers,
) -> Nucleus {
    let TopPBuffers { block_max, between } = buffers;
    // 1. The blocks' maxima, then z, the mass of every token within reach.
    let reach_floor = max - NEGLIGIBLE;
    block_max.clear();
    block_max.extend(src.chunks(TOP_P_BLOCK).map(|b| max_value(b) * inv_t));
    let z = above::<false>(src, inv_t, max, weights, block_max, reach_floor).0;
    let target = top_p * z;
    // The weights are written out once a threshold reaches most blocks (a high temperature):
    // from then on each pass reads them instead of computing an exponential per token. While
    // the thresholds stay near the top, few blocks are read, and writing the weights of the
    // whole vocabulary would cost more than the passes.
    let mut stored = false;
    let mut above = |x: f32, weights: &mut [f32]| {
        if !stored && block_max.iter().filter(|&&m| m >= x).count() * 2 > block_max.len() {
            store_weights(src, inv_t, max, block_max, weights, reach_floor);
            stored = true;
        }
        if stored {
            above::<true>(src, inv_t, max, weights, block_max, x)
        } else {
            above::<false>(src, inv_t, max, weights, block_max, x)
        }
    };

    // 2. The bounds. The cut falls at or above min-p's floor, when that is higher than the reach.
    let lowest = reach_floor.max(min_p_floor);
    let (mut hi, mut mass_hi, mut count_hi) = (f32::INFINITY, 0.0, 0);
    let mut depth = FIRST_DEPTH;
    let (mut lo, mut count_lo) = loop {
        let x = (max - depth).max(lowest);
        let (mass, count) = above(x, weights);
        if mass >= target {
            break (x, count);
        }
        if x <= lowest {
            // Even every token down to the floor does not reach the target (min-p's floor ends
            // the search first): all of them are kept.
            let (cut, last) = (lowest, u32::MAX);
            let kept = keep_above_cut(src, inv_t, max, block_max, weights, stored, cut, last);
            return Nucleus::Weighted(kept);
        }
        (hi, mass_hi, count_hi) = (x, mass, count);
        depth *= 2.0;
    };
    while count_lo - count_hi > FEW {
        // `hi` is infinite until a threshold has missed the target; no logit is above `max`.
        let top = hi.min(max);
        let mid = lo + (top - lo) / 2.0;
        if mid <= lo || mid >= top {
            break; // as narrow as f32 makes it: the tokens left share (nearly) one logit
        }
        let (mass, count) = above(mid, weights);
        if mass >= target {
            (lo, count_lo) = (mid, count);
        } else {
            (hi, mass_hi, count_hi) = (mid, mass, count);
        }
    }

    // 3. The tokens in [lo, hi), sorted, and the cut among them; when the tokens above `hi` are
    //    few, those too, into `candidates`. Most runs of 16 tokens hold none of either: a count
    //    over the run (vectorized) skips those.
    let list = count_hi <= FEW;
    let upper = if list { f32::INFINITY } else { hi };
    between.clear();
    candidates.clear();
    let inside = |raw: f32| {
        let l = raw * inv_t;
        l >= lo && l < upper
    };
    for (k, (block, &m)) in src.chunks(TOP_P_BLOCK).zip(block_max.iter()).enumerate() {
        if m < lo {
            continue;
        }
        for (c, run) in block.chunks(lanes::LANES).enumerate() {
            if run.iter().map(|&raw| inside(raw) as u32).sum::<u32>() == 0 {
                continue;
            }
            let first = k * TOP_P_BLOCK + c * lanes::LANES;
            for (j, &raw) in run.iter().enumerate() {
                let token = (raw * inv_t, (first + j) as u32);
                if token.0 >= hi {
                    if list {
                        candidates.push(token);
                    }
                } else if token.0 >= lo {
                    between.push(token);
                }
            }
        }
    }
    between.sort_unstable_by(descending);
    let kept = cut_to_nucleus(between, mass_hi, target, max);
    // The last token kept: every token above its logit stays, and of those equal to it the ones
    // with no larger id (the order `descending` gives ties).
    let (cut, last) = match between.get(kept.wrapping_sub(1)) {
        Some(&(l, id)) => (l, id),
        None => (lo, u32::MAX), // no token between the bounds: cannot happen, keep [lo, ..)
    };

    if list {
        candidates.extend_from_slice(&between[..kept]);
        return Nucleus::Listed;
    }

    // 4.
    Nucleus::Weighted(keep_above_cut(
        src, inv_t, max, block_max, weights, stored, cut, last,
    ))
}

/// The mass and the number of the tokens whose scaled logit is at least `x` (`x` within reach,
/// see [`NEGLIGIBLE`]), from the blocks whose largest logit reaches it. Their weights
/// `exp(l - max)` are read from `weights` if `STORED`, computed otherwise (the same values).
///
/// In lanes across blocks: each block's masked weights go into 16 f32 lanes, which are then added
/// into 16 f64 lanes. (A sum of each block on its own, its lanes added up before the next, kept
/// the compiler from vectorizing the loop, which made each pass several times slower; measured:
/// docs/sampling.md, "Making it cheap".)
#[inline(always)]
fn above<const STORED: bool>(
    src: &[f32],
    inv_t: f32,
    max: f32,
    weights: &[f32],
    block_max: &[f32],
    x: f32,
) -> (f64, usize) {
    const L: usize = lanes::LANES;
    let (mut mass, mut count) = ([0f64; L], [0u32; L]);
    let whole = src.len() / TOP_P_BLOCK * TOP_P_BLOCK;
    for ((block, w), &m) in src[..whole]
        .chunks_exact(TOP_P_BLOCK)
        .zip(weights.chunks_exact(TOP_P_BLOCK))
        .zip(block_max)
    {
        if m < x {
            continue;
        }
        let mut part = [0f32; L];
        for (l16, w16) in block.chunks_exact(L).zip(w.chunks_exact(L)) {
            for i in 0..L {
                let l = l16[i] * inv_t;
                let weight = if STORED { w16[i] } else { exp(l - max) };
                part[i] += lanes::select(l >= x, weight);
                count[i] += (l >= x) as u32;
            }
        }
        for i in 0..L {
            mass[i] += part[i] as f64;
        }
    }
    let (mut mass, mut count) = (mass.iter().sum::<f64>(), count.iter().sum::<u32>() as usize);
    // The last, shorter block.
    for &raw in &src[whole..] {
        let l = raw * inv_t;
        if l >= x {
            mass += exp(l - max) as f64;
            count += 1;
        }
    }
    (mass, count)
}

/// `weights[i] = exp(l_i - max)` for every token within reach, 0 for the others.
#[inline(always)]
fn store_weights(
    src: &[f32],
    inv_t: f32,
    max: f32,
    block_max: &[f32],
    weights: &mut [f32],
    reach_floor: f32,
) {
    const L: usize = lanes::LANES;
    for ((block, w), &m) in src
        .chunks(TOP_P_BLOCK)
        .zip(weights.chunks_mut(TOP_P_BLOCK))
        .zip(block_max)
    {
        if m < reach_floor {
            w.fill(0.0);
            continue;
        }
        // In runs of 16, as `above` (as one loop over the block it was not vectorized).
        let whole = block.len() / L * L;
        for (b16, w16) in block[..whole].chunks_exact(L).zip(w.chunks_exact_mut(L)) {
            for i in 0..L {
                let l = b16[i] * inv_t;
                w16[i] = lanes::select(l >= reach_floor, exp(l - max));
            }
        }
        for (wi, &raw) in w[whole..].iter_mut().zip(&block[whole..]) {
            let l = raw * inv_t;
            *wi = lanes::select(l >= reach_floor, exp(l - max));
        }
    }
}

/// Leaves in `weights` the weight `exp(l - max)` of each token whose scaled logit is above `cut`,
/// or equal to it with an id of at most `last`, and 0 for every other; returns how many are kept.
/// The weights are read back when `stored` (written by [`store_weights`]), computed otherwise.
/// `cut` is within reach (see [`NEGLIGIBLE`]), so the blocks that do not reach it keep nothing.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn keep_above_cut(
    src: &[f32],
    inv_t: f32,
    max: f32,
    block_max: &[f32],
    weights: &mut [f32],
    stored: bool,
    cut: f32,
    last: u32,
) -> usize {
    let mut kept = 0;
    for (k, ((block, w), &m)) in src
        .chunks(TOP_P_BLOCK)
        .zip(weights.chunks_mut(TOP_P_BLOCK))
        .zip(block_max)
        .enumerate()
    {
        if m < cut {
            w.fill(0.0);
            continue;
        }
        let first = (k * TOP_P_BLOCK) as u32;
        let mut n = 0;
        for (j, (wi, &raw)) in w.iter_mut().zip(block).enumerate() {
            let l = raw * inv_t;
            let keep = l > cut || (l == cut && first + j as u32 <= last);
            *wi = lanes::select(keep, if stored { *wi } else { exp(l - max) });
            n += keep as u32;
        }
        kept += n as usize;
    }
    kept
}
