//! The filters besides top-p: top-k (keep the k most likely tokens) and min-p (drop the tokens
//! less likely than `min_p` times the most likely one), and the helpers every filter shares.

use super::SamplerConfig;
use crate::kernels::exp::exp;

/// A token whose (temperature-scaled) logit is this far below the maximum has probability below
/// `e^-40 = 4e-18` of the top token's; all 151936 such tokens together hold less than 1e-12 of
/// it. Top-p ignores them (their mass cannot move its cut by more than f32 rounding of the logits
/// does), and min-p drops them anyway unless min_p < 4e-18.
pub(super) const NEGLIGIBLE: f32 = 40.0;

/// Leaves in `candidates` the tokens top-k, top-p and min-p keep (the argmax always among them),
/// except for top-p without top-k, which [`nucleus`] does; `max` is the largest scaled logit.
/// Each filter keeps a prefix of the tokens sorted by probability, so the result is the shortest
/// of the three prefixes. Nothing sorts the whole vocabulary: top-k keeps its k in order as it
/// scans. Works on `src * inv_t` (the temperature applied) without writing it out.
#[inline(always)]
pub(super) fn filter(
    cfg: &SamplerConfig,
    src: &[f32],
    inv_t: f32,
    max: f32,
    candidates: &mut Vec<(f32, u32)>,
) {
    let (top_k, top_p, min_p) = (cfg.top_k, cfg.top_p as f64, cfg.min_p);
    // Scaled logit of token i: src[i] * inv_t, computed where a candidate is kept.
    if !max.is_finite() {
        // A temperature so small that the scaled logits overflow (or no finite logit at all):
        // the limit of T -> 0 is greedy.
        candidates.clear();
        candidates.push((0.0, argmax(src) as u32));
        return;
    }
    let min_p_floor = min_p_floor(min_p, max);
    candidates.clear();

    if top_k > 0 && top_k < src.len() {
        top_k_sorted(src, inv_t, top_k, candidates);
        // top-p is measured against the distribution top-k left (HF renormalises after top-k).
        let z: f64 = if top_p < 1.0 {
            candidates.iter().map(|&(l, _)| weight(l, max)).sum()
        } else {
            0.0
        };
        candidates.retain(|&(l, _)| l >= min_p_floor);
        if top_p < 1.0 {
            let kept = cut_to_nucleus(candidates, 0.0, top_p * z, max);
            candidates.truncate(kept);
        }
        return;
    }

    debug_assert!(top_p >= 1.0, "top-p without top-k is `nucleus`'s");
    // min-p alone: tokens more than NEGLIGIBLE below the maximum cannot pass (see the
    // constant), so the floor is at least that. With no filter at all every token stays.
    if min_p > 0.0 {
        collect(src, inv_t, min_p_floor.max(max - NEGLIGIBLE), candidates);
    } else {
        collect(src, inv_t, f32::NEG_INFINITY, candidates);
    }
}

/// min-p: `p_i >= min_p * p_max`  <=>  `l_i >= l_max + ln(min_p)`, the floor on scaled logits
/// (none when min-p is off). Dropping the tokens below it before top-p's cut is safe: min-p would
/// drop them after it anyway, and top-p's cut only depends on the mass of the tokens above it,
/// which min-p never removes.
#[inline(always)]
pub(super) fn min_p_floor(min_p: f32, max: f32) -> f32 {
    if min_p > 0.0 {
        max + min_p.ln()
    } else {
        f32::NEG_INFINITY
    }
}

/// Unnormalised probability of scaled logit `l`: `exp(l - max)`, summed in f64.
#[inline(always)]
pub(super) fn weight(l: f32, max: f32) -> f64 {
    exp(l - max) as f64
}

/// `candidates` = (scaled logit, token) of every token whose scaled logit is at least `floor`.
#[inline(always)]
fn collect(src: &[f32], inv_t: f32, floor: f32, candidates: &mut Vec<(f32, u32)>) {
    candidates.clear();
    candidates.extend(
        src.iter()
            .enumerate()
            .map(|(i, &raw)| (raw * inv_t, i as u32))
            .filter(|&(l, _)| l >= floor),
    );
}

/// Order of candidates: the most likely first, the lower id first on ties.
pub(super) fn descending(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// top-k: the k largest scaled logits, sorted. One pass that keeps the best k seen so far in a
/// small sorted array: after the first few hundred tokens almost every logit fails the
/// comparison with the k-th best. So the pass goes a block of logits at a time and skips a
/// block whose largest logit fails it: one vectorized max per block instead of a branch per
/// logit (docs/sampling.md, "Making it cheap").
#[inline(always)]
fn top_k_sorted(src: &[f32], inv_t: f32, top_k: usize, candidates: &mut Vec<(f32, u32)>) {
    const BLOCK: usize = 64;
    for (b, block) in src.chunks(BLOCK).enumerate() {
        if candidates.len() == top_k {
            // Scaling by inv_t > 0 keeps the order, so the block's best scaled logit is its
            // best logit scaled.
            if max_value(block) * inv_t <= candidates[top_k - 1].0 {
                continue;
            }
        }
        for (j, &raw) in block.iter().enumerate() {
            let l = raw * inv_t;
            let c = &mut *candidates;
            if c.len() == top_k {
                if l <= c[top_k - 1].0 {
                    continue;
                }
                c.pop();
            }
            let at = c.partition_point(|&(v, _)| v >= l);
            c.insert(at, (l, (b * BLOCK + j) as u32));
        }
    }
}

/// top-p's cut: how many of `sorted` (the most likely first) to keep while the mass before each
/// is below `target` (HF keeps the token that crosses top_p): the smallest set reaching it.
/// `mass_before` is the mass of the tokens already kept above these. All of them when together
/// they stay below `target`; at least one.
#[inline(always)]
pub(super) fn cut_to_nucleus(
    sorted: &[(f32, u32)],
    mass_before: f64,
    target: f64,
    max: f32,
) -> usize {
    let mut mass = mass_before;
    for (i, &(l, _)) in sorted.iter().enumerate() {
        if mass >= target {
            return i.max(1);
        }
        mass += weight(l, max);
    }
    sorted.len()
}

/// The largest value (NaNs ignored), in 16 independent running maxima so that the compiler can
/// keep them in vector registers (a single running `f32::max` is a chain it will not reorder).
#[inline(always)]
pub(super) fn max_value(v: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = v.chunks_exact(16);
    for (i, &x) in chunks.remainder().iter().enumerate() {
        m[i] = if x > m[i] { x } else { m[i] };
    }
    for c in chunks {
        for i in 0..16 {
            m[i] = if c[i] > m[i] { c[i] } else { m[i] };
        }
    }
    m.iter()
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a })
}

/// Index of the largest value; the first one on ties. NaN is never the maximum (an all-NaN or
/// empty slice gives 0).
#[inline(always)]
pub fn argmax(v: &[f32]) -> usize {
    // The largest value first (vectorized), then its first position.
    let m = max_value(v);
    v.iter().position(|&x| x == m).unwrap_or(0)
}
