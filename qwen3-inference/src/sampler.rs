//! Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, and a seeded
//! random draw. See docs/sampling.md.
//!
//! The steps run in the order HuggingFace `generate` applies its logits processors
//! (`transformers/generation/logits_process.py`): repetition penalty, temperature, top-k, top-p,
//! min-p, then one draw from what is left. Temperature 0 is greedy: the argmax of the penalised
//! logits.

use crate::format::GenerationDefaults;
use crate::kernels::exp::exp;
use crate::kernels::lanes;
use crate::kernels::{vector_isa, VectorIsa};
use anyhow::{bail, Result};

/// The sampler's settings. Built from the model's generation_config.json defaults
/// ([`SamplerConfig::from_defaults`]), then overridden by the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; 0 means greedy. `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`. In (0, 1].
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one. In [0, 1].
    pub min_p: f32,
    /// HF's repetition penalty (Keskar et al. 2019, CTRL): a logit of a token already in the
    /// context is divided by it when positive, multiplied when negative. 1 is off. `> 0`.
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already generated (OpenAI's presence penalty).
    /// 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from the logit of a generated token once for every time it was generated
    /// (OpenAI's frequency penalty: `logit - count * frequency_penalty`). 0 is off.
    pub frequency_penalty: f32,
    /// Seed of the random draws; every value is valid, 0 included.
    pub seed: u64,
}

impl SamplerConfig {
    /// Plain greedy decoding: always the most likely token, no penalty.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }

    /// The model's defaults, with HuggingFace's `GenerationConfig` defaults for what the model
    /// leaves out (temperature 1, top-k 50, top-p 1, no min-p, no penalty). `do_sample: false`
    /// means greedy.
    pub fn from_defaults(g: &GenerationDefaults, seed: u64) -> SamplerConfig {
        let greedy = g.do_sample == Some(false);
        SamplerConfig {
            temperature: if greedy {
                0.0
            } else {
                g.temperature.unwrap_or(1.0)
            },
            top_k: g.top_k.map_or(50, |k| k as usize),
            top_p: g.top_p.unwrap_or(1.0),
            min_p: g.min_p.unwrap_or(0.0),
            repetition_penalty: g.repetition_penalty.unwrap_or(1.0),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed,
        }
    }

    /// Refuses values that have no meaning, with the flag's name.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            bail!("temperature must be a number >= 0 (0 is greedy), got {t}");
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            bail!("top-p must be in (0, 1], got {p}");
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            bail!("min-p must be in [0, 1], got {m}");
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            bail!("repetition penalty must be a number > 0 (1 is off), got {r}");
        }
        if !self.frequency_penalty.is_finite() {
            bail!(
                "frequency penalty must be a finite number, got {}",
                self.frequency_penalty
            );
        }
        if !self.presence_penalty.is_finite() {
            bail!(
                "presence penalty must be a finite number, got {}",
                self.presence_penalty
            );
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// SplitMix64 (Steele, Lea & Flood 2014): a 64-bit counter passed through a mixing function.
/// Every seed, 0 included, gives a full-period, well-mixed stream.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A token whose (temperature-scaled) logit is this far below the maximum has probability below
/// `e^-40 = 4e-18` of the top token's; all 151936 such tokens together hold less than 1e-12 of
/// it. Top-p ignores them (their mass cannot move its cut by more than f32 rounding of the logits
/// does), and min-p drops them anyway unless min_p < 4e-18.
const NEGLIGIBLE: f32 = 40.0;

/// A sampler: settings, RNG and buffers reused across tokens (no allocation per token).
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    /// The logits after penalties and temperature, `[vocab]`.
    work: Vec<f32>,
    /// (logit, token) of the tokens still in the running.
    candidates: Vec<(f32, u32)>,
    /// top-p's buffers (see [`nucleus`]).
    top_p: TopPBuffers,
    /// exp(logit - max) of each candidate, for the draw.
    weights: Vec<f32>,
    /// The draw's sums of [`DRAW_BLOCK`] weights at a time.
    block_sums: Vec<f64>,
    /// `marks[token] == stamp` means "already penalised this call" (dedupes repeated ids).
    marks: Vec<u32>,
    stamp: u32,
    /// Tokens the filters left for the last draw (1 for greedy).
    last_kept: usize,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        cfg.validate()?;
        Ok(Sampler {
            rng: Rng::new(cfg.seed),
            cfg,
            work: Vec::new(),
            candidates: Vec::new(),
            top_p: TopPBuffers::default(),
            weights: Vec::new(),
            block_sums: Vec::new(),
            marks: Vec::new(),
            stamp: 0,
            last_kept: 0,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// How many tokens top-k, top-p and min-p left in the running for the last draw.
    pub fn last_kept(&self) -> usize {
        self.last_kept
    }

    /// Picks the next token from `logits` (`[vocab]`). `context` is every token the model has
    /// seen (prompt and generated: the repetition penalty looks at all of them, as in HF);
    /// `generated` is the generated part alone (the presence penalty's scope, as in OpenAI's API).
    pub fn sample(&mut self, logits: &[f32], context: &[u32], generated: &[u32]) -> u32 {
        sample_fn()(self, logits, context, generated)
    }

    /// [`Sampler::sample`]. Inlined into the per-instruction-set versions of [`sample_fn`], with
    /// every helper it calls on whole vocabularies.
    #[inline(always)]
    fn sample_body(&mut self, logits: &[f32], context: &[u32], generated: &[u32]) -> u32 {
        let vocab = logits.len();
        let (rp, pp) = (self.cfg.repetition_penalty, self.cfg.presence_penalty);
        let fp = self.cfg.frequency_penalty;
        if self.cfg.is_greedy() && rp == 1.0 && pp == 0.0 && fp == 0.0 {
            // Plain greedy: nothing reshapes the logits, so no copy.
            self.last_kept = 1;
            return argmax(logits) as u32;
        }
        // 1. Penalties, once per distinct token id, on a copy of the logits (only when a penalty
        //    is set: otherwise the logits are read in place).
        let penalized = rp != 1.0 || pp != 0.0 || fp != 0.0;
        if penalized {
            self.work.clear();
            self.work.extend_from_slice(logits);
            if self.marks.len() != vocab {
                self.marks = vec![0; vocab];
                self.stamp = 0;
            }
        }
        if rp != 1.0 {
            let stamp = self.next_stamp();
            for &t in context {
                let t = t as usize;
                if t < vocab && self.marks[t] != stamp {
                    self.marks[t] = stamp;
                    let l = &mut self.work[t];
                    *l = if *l < 0.0 { *l * rp } else { *l / rp };
                }
            }
        }
        if pp != 0.0 {
            let stamp = self.next_stamp();
            for &t in generated {
                let t = t as usize;
                if t < vocab && self.marks[t] != stamp {
                    self.marks[t] = stamp;
                    self.work[t] -= pp;
                }
            }
        }
        if fp != 0.0 {
            // Once per occurrence: a token generated three times loses 3 * fp.
            for &t in generated {
                if let Some(l) = self.work.get_mut(t as usize) {
                    *l -= fp;
                }
            }
        }

        let src: &[f32] = if penalized { &self.work } else { logits };

        // 2. Greedy: the first index of the largest logit (torch.argmax's tie rule).
        if self.cfg.is_greedy() {
            self.last_kept = 1;
            return argmax(src) as u32;
        }

        // 3. Temperature: p ~ exp(l / T). Below 1 sharpens, above 1 flattens. It is applied
        //    inside the filter, to the candidates only: dividing by T > 0 keeps the order.
        let inv_t = 1.0 / self.cfg.temperature;
        // Room for the whole vocabulary in every buffer, once: how many tokens the filters keep
        // changes from token to token, and a buffer that grew whenever a step kept more than
        // any before would allocate in the middle of decoding.
        if self.candidates.capacity() < vocab {
            self.candidates.clear();
            self.candidates.reserve(vocab);
            self.weights.clear();
            self.weights.reserve(vocab);
            self.block_sums.clear();
            self.block_sums.reserve(vocab.div_ceil(DRAW_BLOCK));
            // Tokens too close to be told apart by f32 can leave more than FEW between top-p's
            // bounds: room for all.
            self.top_p.between.clear();
            self.top_p.between.reserve(vocab);
        }
        // The largest scaled logit: the draw's weights are exp(l - max), at most 1.
        let max = max_value(src) * inv_t;
        let cfg = &self.cfg;
        let no_filter =
            (cfg.top_k == 0 || cfg.top_k >= vocab) && cfg.top_p >= 1.0 && cfg.min_p <= 0.0;
        if no_filter && max.is_finite() {
            // 4a. Nothing to filter: draw from the whole vocabulary in proportion to
            //     exp(l - max), the weights written straight from the logits (a loop the
            //     compiler vectorizes), no candidate list.
            self.weights.resize(vocab, 0.0);
            for (w, &raw) in self.weights.iter_mut().zip(src) {
                *w = exp(raw * inv_t - max);
            }
            self.last_kept = vocab;
            let u = self.rng.next_f64();
            return draw(&self.weights, u, &mut self.block_sums) as u32;
        }
        if (cfg.top_k == 0 || cfg.top_k >= vocab) && cfg.top_p < 1.0 && max.is_finite() {
            // 4b. top-p over the whole vocabulary: a small nucleus is listed in the candidates,
            //     a large one left as the weights of the tokens kept (zeros for the others),
            //     drawn from as they are.
            self.weights.resize(vocab, 0.0);
            let floor = min_p_floor(cfg.min_p, max);
            let (top_p, buffers) = (cfg.top_p as f64, &mut self.top_p);
            let (weights, candidates) = (&mut self.weights, &mut self.candidates);
            let kept = nucleus(src, inv_t, max, top_p, floor, weights, candidates, buffers);
            if let Nucleus::Weighted(n) = kept {
                self.last_kept = n;
                let u = self.rng.next_f64();
                return draw(&self.weights, u, &mut self.block_sums) as u32;
            }
        } else {
            filter(cfg, src, inv_t, max, &mut self.candidates);
        }
        self.last_kept = self.candidates.len();

        // 4c. Draw from the kept candidates in proportion to exp(l - max).
        self.weights.resize(self.candidates.len(), 0.0);
        for (w, &(l, _)) in self.weights.iter_mut().zip(&self.candidates) {
            *w = exp(l - max);
        }
        let u = self.rng.next_f64();
        self.candidates[draw(&self.weights, u, &mut self.block_sums)].1
    }

    fn next_stamp(&mut self) -> u32 {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.marks.fill(0);
            self.stamp = 1;
        }
        self.stamp
    }
}

/// [`Sampler::sample`]'s signature, for [`sample_fn`].
type SampleFn = fn(&mut Sampler, &[f32], &[u32], &[u32]) -> u32;

/// [`Sampler::sample_body`] compiled for the best instruction set of this CPU ([`vector_isa`], as
/// attention's kernel is). Its passes over the vocabulary (the maximum,
/// the exponentials, top-p's thresholds, the draw's block sums) are plain loops that the compiler turns into
/// vector instructions of the enabled width: SSE2 or NEON by default, AVX2 or AVX-512 in the
/// wrappers below. The draws are identical in every version: the sums go in fixed lanes, and
/// Rust never fuses a multiply and an add.
fn sample_fn() -> SampleFn {
    match vector_isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only chosen when the CPU has AVX-512F.
        VectorIsa::Avx512 => |s, l, c, g| unsafe { sample_avx512(s, l, c, g) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only chosen when the CPU has AVX2.
        VectorIsa::Avx2 => |s, l, c, g| unsafe { sample_avx2(s, l, c, g) },
        VectorIsa::Baseline => Sampler::sample_body,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sample_avx512(s: &mut Sampler, logits: &[f32], context: &[u32], gen: &[u32]) -> u32 {
    s.sample_body(logits, context, gen)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sample_avx2(s: &mut Sampler, logits: &[f32], context: &[u32], gen: &[u32]) -> u32 {
    s.sample_body(logits, context, gen)
}

/// Weights the draw sums at a time before it walks one by one.
const DRAW_BLOCK: usize = 64;

/// The index where the running sum of `weights` passes `u` times their total (`u` uniform in
/// [0, 1)): index i with probability `weights[i] / total`.
///
/// A walk that subtracts one weight at a time is a chain of dependent f64 subtractions, about
/// four cycles a weight (0.6 ms over the whole vocabulary). So the weights are summed
/// [`DRAW_BLOCK`] at a time in independent lanes (vectorized), the total is the sum of those
/// block sums, and the walk goes block by block, then one by one inside the block where `u`
/// falls. `block_sums` is the caller's buffer, reused across tokens.
#[inline(always)]
fn draw(weights: &[f32], u: f64, block_sums: &mut Vec<f64>) -> usize {
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
struct TopPBuffers {
    /// The largest scaled logit of each block of [`TOP_P_BLOCK`] tokens.
    block_max: Vec<f32>,
    /// (scaled logit, token) of the tokens between the search's bounds.
    between: Vec<(f32, u32)>,
}

/// What [`nucleus`] left for the draw.
enum Nucleus {
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
/// 151936 tokens cost 1.5 ms at temperature 1.5, and so does any pass that handles the tokens one
/// at a time, as collecting them into a list does: 1-2 ns a token on this project's machine
/// (docs/performance.md). So the vocabulary is only read in passes the compiler
/// vectorizes, and only the tokens around the cut are listed and sorted:
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
fn nucleus(
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
/// the compiler from vectorizing the loop: 125-160 us a pass over 151936 tokens, against 28.)
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

/// Leaves in `candidates` the tokens top-k, top-p and min-p keep (the argmax always among them),
/// except for top-p without top-k, which [`nucleus`] does; `max` is the largest scaled logit.
/// Each filter keeps a prefix of the tokens sorted by probability, so the result is the shortest
/// of the three prefixes. Nothing sorts the whole vocabulary: top-k keeps its k in order as it
/// scans. Works on `src * inv_t` (the temperature applied) without writing it out.
#[inline(always)]
fn filter(
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
fn min_p_floor(min_p: f32, max: f32) -> f32 {
    if min_p > 0.0 {
        max + min_p.ln()
    } else {
        f32::NEG_INFINITY
    }
}

/// Unnormalised probability of scaled logit `l`: `exp(l - max)`, summed in f64.
#[inline(always)]
fn weight(l: f32, max: f32) -> f64 {
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
fn descending(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// top-k: the k largest scaled logits, sorted. One pass that keeps the best k seen so far in a
/// small sorted array: after the first few hundred tokens almost every logit fails the
/// comparison with the k-th best. So the pass goes a block of logits at a time and skips a
/// block whose largest logit fails it: one vectorized max per block instead of a branch per
/// logit (docs/sampling.md has the before and after).
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
fn cut_to_nucleus(sorted: &[(f32, u32)], mass_before: f64, target: f64, max: f32) -> usize {
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
fn max_value(v: &[f32]) -> f32 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed,
        }
    }

    /// A fixed pseudo-random logit vector over `n` tokens with distinct values.
    fn logits(n: usize, spread: f32) -> Vec<f32> {
        let mut rng = Rng::new(12345);
        (0..n)
            .map(|_| (rng.next_f64() as f32 - 0.5) * spread)
            .collect()
    }

    fn ranked(l: &[f32]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..l.len()).collect();
        idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        idx
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits(1000, 10.0);
        let want = ranked(&l)[0] as u32;
        let mut s = Sampler::new(cfg(0.0, 20, 0.9, 0.1, 7)).unwrap();
        for _ in 0..5 {
            assert_eq!(s.sample(&l, &[], &[]), want);
        }
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[f32::NAN; 3]), 0);
        assert_eq!(argmax(&[]), 0);
        // Ties in different lanes of the vectorized maximum: still the first.
        let mut v = vec![0.0f32; 40];
        (v[37], v[5], v[21]) = (2.0, 2.0, 1.0);
        assert_eq!(argmax(&v), 5);
    }

    #[test]
    fn same_seed_same_tokens_every_seed_valid() {
        let l = logits(500, 4.0);
        for seed in [0, 1, u64::MAX] {
            let run = |seed| {
                let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, seed)).unwrap();
                (0..50).map(|_| s.sample(&l, &[], &[])).collect::<Vec<_>>()
            };
            let a = run(seed);
            assert_eq!(a, run(seed), "seed {seed}");
            // Not a constant stream: seed 0 is as good as any other.
            assert!(a.iter().any(|&t| t != a[0]), "seed {seed}");
        }
        let mut a = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 1)).unwrap();
        let mut b = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 2)).unwrap();
        let ra: Vec<u32> = (0..50).map(|_| a.sample(&l, &[], &[])).collect();
        let rb: Vec<u32> = (0..50).map(|_| b.sample(&l, &[], &[])).collect();
        assert_ne!(ra, rb);
    }

    #[test]
    fn top_k_never_leaves_the_k_best() {
        let l = logits(2000, 3.0);
        let best: Vec<usize> = ranked(&l)[..10].to_vec();
        let mut s = Sampler::new(cfg(1.5, 10, 1.0, 0.0, 99)).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..5000 {
            let t = s.sample(&l, &[], &[]) as usize;
            assert!(best.contains(&t), "token {t} is not among the 10 best");
            seen.insert(t);
        }
        // With flat-ish logits and 5000 draws, all 10 show up (the filter is not top-1).
        assert_eq!(seen.len(), 10);
    }

    /// The kept set must be exactly the smallest prefix (by probability) whose mass reaches p:
    /// every token inside it is drawn, nothing outside it ever is.
    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        for (n, spread, p) in [(3000, 12.0, 0.9f32), (200, 2.0, 0.5), (5000, 30.0, 0.95)] {
            let l = logits(n, spread);
            let order = ranked(&l);
            let max = l[order[0]] as f64;
            let z: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
            let mut mass = 0.0;
            let mut nucleus = 0;
            while mass < p as f64 * z {
                mass += (l[order[nucleus]] as f64 - max).exp();
                nucleus += 1;
            }
            let inside: std::collections::HashSet<usize> =
                order[..nucleus].iter().copied().collect();
            let mut s = Sampler::new(cfg(1.0, 0, p, 0.0, 5)).unwrap();
            assert_eq!(kept_by_nucleus(&mut s, &l).len(), nucleus, "n {n} p {p}");
            let mut seen = std::collections::HashSet::new();
            for _ in 0..4000 {
                let t = s.sample(&l, &[], &[]) as usize;
                assert!(
                    inside.contains(&t),
                    "token {t} outside the nucleus of {nucleus}"
                );
                seen.insert(t);
            }
            if nucleus <= 50 {
                assert_eq!(seen.len(), nucleus, "every nucleus token is reachable");
            }
        }
    }

    /// The tokens [`nucleus`] keeps (top-p and min-p without top-k, as `sample` runs it), in
    /// increasing order; checks the count it returns.
    fn kept_by_nucleus(s: &mut Sampler, l: &[f32]) -> Vec<u32> {
        let inv_t = 1.0 / s.cfg.temperature;
        let max = max_value(l) * inv_t;
        let floor = min_p_floor(s.cfg.min_p, max);
        let mut w = vec![0f32; l.len()];
        let mut c = Vec::new();
        match nucleus(
            l,
            inv_t,
            max,
            s.cfg.top_p as f64,
            floor,
            &mut w,
            &mut c,
            &mut s.top_p,
        ) {
            Nucleus::Listed => {
                let mut kept: Vec<u32> = c.iter().map(|&(_, i)| i).collect();
                kept.sort_unstable();
                kept
            }
            Nucleus::Weighted(n) => {
                let kept: Vec<u32> = (0..l.len() as u32)
                    .filter(|&i| w[i as usize] > 0.0)
                    .collect();
                assert_eq!(kept.len(), n, "the count nucleus returns");
                kept
            }
        }
    }

    /// The tokens top-p and min-p keep, from a full sort in f64 with the library `exp`: the
    /// smallest set of most likely tokens whose probability reaches `p`, then the tokens of it
    /// at least `min_p` times as likely as the top one.
    fn reference_kept(l: &[f32], t: f32, p: f32, min_p: f32) -> Vec<u32> {
        let scaled: Vec<f32> = l.iter().map(|&v| v * (1.0 / t)).collect();
        let order = ranked(&scaled);
        let max = scaled[order[0]] as f64;
        let prob = |i: usize| (scaled[i] as f64 - max).exp();
        let z: f64 = (0..l.len()).map(prob).sum();
        let mut kept = Vec::new();
        let mut mass = 0.0;
        for &i in &order {
            if mass >= p as f64 * z {
                break;
            }
            kept.push(i as u32);
            mass += prob(i);
        }
        kept.retain(|&i| prob(i as usize) >= min_p as f64);
        kept.sort_unstable();
        kept
    }

    /// Top-p over the whole vocabulary searches its cut by thresholds (`nucleus`): the kept set
    /// must be exactly the reference's, from a few tokens to nearly all, with and without min-p
    /// binding first.
    #[test]
    fn top_p_and_min_p_keep_exactly_the_reference_set() {
        let vocab = 151936;
        for (n, spread, t, p, min_p, spikes) in [
            (vocab, 8.0, 1.0, 0.9, 0.0, false),
            (vocab, 8.0, 1.5, 0.9, 0.0, false),
            (vocab, 40.0, 0.6, 0.95, 0.0, false),
            (vocab, 12.0, 1.0, 0.9, 0.0, true),
            (vocab, 12.0, 1.5, 0.95, 0.0, true),
            (vocab, 12.0, 0.7, 0.8, 0.0, true),
            // The spikes hold most of the mass: the cut is found while few blocks are read, so
            // the search's passes compute the weights instead of reading them back.
            (vocab, 4.0, 0.5, 0.8, 0.0, true),
            (vocab, 20.0, 1.0, 0.9, 0.05, false),
            (vocab, 8.0, 1.0, 0.5, 0.3, false),
            (vocab, 8.0, 1.0, 0.99, 0.5, false),
            (vocab, 12.0, 1.0, 0.95, 0.1, true),
            (3000, 12.0, 1.0, 0.9, 0.0, false),
            (200, 2.0, 1.0, 0.5, 0.0, false),
            (10, 1.0, 1.0, 0.99, 0.0, false),
        ] {
            let mut l = logits(n, spread);
            if spikes {
                // A few tokens far above the rest, as a trained model's logits have.
                for (k, v) in l.iter_mut().step_by(9973).take(6).enumerate() {
                    *v += 12.0 - k as f32;
                }
            }
            let want = reference_kept(&l, t, p, min_p);
            let mut s = Sampler::new(cfg(t, 0, p, min_p, 5)).unwrap();
            let got = kept_by_nucleus(&mut s, &l);
            assert_eq!(
                got.len(),
                want.len(),
                "n {n} spread {spread} T {t} p {p} min-p {min_p}"
            );
            assert_eq!(got, want, "n {n} spread {spread} T {t} p {p} min-p {min_p}");
        }
    }

    /// The draw walks blocks of 64 weights, then the weights of one block: `u` picks the token
    /// where the running sum passes `u * total`, across block ends too.
    #[test]
    fn draw_lands_where_the_running_sum_passes_u() {
        let mut w = vec![0f32; 200];
        (w[10], w[63], w[64], w[150], w[199]) = (1.0, 1.0, 2.0, 3.0, 1.0); // total 8
        let mut sums = Vec::new();
        for (u, want) in [
            (0.0, 10),
            (0.1, 10),
            (0.13, 63),
            (0.25, 64),
            (0.49, 64),
            (0.5, 150),
            (0.87, 150),
            (0.875, 199),
            (0.999_999, 199),
        ] {
            assert_eq!(draw(&w, u, &mut sums), want, "u {u}");
        }
        assert_eq!(draw(&[0.5], 0.7, &mut sums), 0);
    }

    /// Each instruction set's build of the sampler draws the same tokens from the same seed.
    #[test]
    fn every_instruction_set_draws_the_same_tokens() {
        let l = logits(151936, 12.0);
        for c in [
            cfg(1.0, 0, 1.0, 0.0, 11),
            cfg(1.5, 0, 0.9, 0.0, 12),
            cfg(0.6, 20, 0.95, 0.0, 13),
            cfg(1.0, 0, 1.0, 0.02, 14),
        ] {
            // The baseline build, then every other one this CPU can run.
            let mut builds: Vec<(&str, SampleFn)> = vec![("baseline", Sampler::sample_body)];
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2") {
                    // SAFETY: this CPU has AVX2.
                    builds.push(("avx2", |s, l, c, g| unsafe { sample_avx2(s, l, c, g) }));
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: this CPU has AVX-512F.
                    builds.push(("avx512", |s, l, c, g| unsafe { sample_avx512(s, l, c, g) }));
                }
            }
            builds.push(("dispatched", Sampler::sample));
            let mut want = None;
            for (name, build) in builds {
                let mut s = Sampler::new(c.clone()).unwrap();
                let got: Vec<u32> = (0..20).map(|_| build(&mut s, &l, &[], &[])).collect();
                assert_eq!(
                    got,
                    *want.get_or_insert_with(|| got.clone()),
                    "{name}, {c:?}"
                );
            }
        }
    }

    /// A temperature so small that the scaled logits overflow is greedy, whatever the filters.
    #[test]
    fn a_vanishing_temperature_is_greedy() {
        let l = [1.0f32, 3.0, 2.0, -1.0];
        for (k, p, m) in [(0, 1.0, 0.0), (0, 0.9, 0.0), (2, 0.9, 0.1), (0, 1.0, 0.5)] {
            let mut s = Sampler::new(cfg(1e-39, k, p, m, 1)).unwrap();
            for _ in 0..10 {
                assert_eq!(s.sample(&l, &[], &[]), 1, "top-k {k} top-p {p} min-p {m}");
            }
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // p ~ exp(l): logits 0, -1, -2, -5 -> ratios 1, 0.37, 0.14, 0.007 of the max.
        let l = [0.0f32, -1.0, -2.0, -5.0];
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.1, 3)).unwrap();
        for _ in 0..2000 {
            assert!(s.sample(&l, &[], &[]) < 3);
        }
    }

    #[test]
    fn penalties_move_the_argmax() {
        let l = [2.0f32, 1.5, -1.0];
        let mut c = cfg(0.0, 0, 1.0, 0.0, 0);
        c.repetition_penalty = 2.0;
        let mut s = Sampler::new(c.clone()).unwrap();
        // 2.0 / 2 = 1.0 < 1.5; repeated ids count once.
        assert_eq!(s.sample(&l, &[0, 0, 0], &[]), 1);
        assert_eq!(s.sample(&l, &[], &[]), 0);
        c.repetition_penalty = 1.0;
        c.presence_penalty = 0.6;
        let mut s = Sampler::new(c.clone()).unwrap();
        assert_eq!(
            s.sample(&l, &[0], &[]),
            0,
            "presence penalty ignores the prompt"
        );
        assert_eq!(s.sample(&l, &[0], &[0, 0]), 1);
        // Frequency: 2.0 - 0.3 = 1.7 stays first after one occurrence, 2.0 - 0.6 = 1.4 does not
        // after two.
        c.presence_penalty = 0.0;
        c.frequency_penalty = 0.3;
        let mut s = Sampler::new(c).unwrap();
        assert_eq!(s.sample(&l, &[0], &[0]), 0);
        assert_eq!(s.sample(&l, &[0], &[0, 0]), 1);
    }

    #[test]
    fn invalid_settings_are_refused() {
        for (c, msg) in [
            (cfg(-0.1, 0, 1.0, 0.0, 0), "temperature"),
            (cfg(f32::NAN, 0, 1.0, 0.0, 0), "temperature"),
            (cfg(1.0, 0, 0.0, 0.0, 0), "top-p"),
            (cfg(1.0, 0, 1.5, 0.0, 0), "top-p"),
            (cfg(1.0, 0, 1.0, -0.5, 0), "min-p"),
        ] {
            let e = Sampler::new(c).err().unwrap().to_string();
            assert!(e.contains(msg), "{e}");
        }
        let mut c = cfg(1.0, 0, 1.0, 0.0, 0);
        c.repetition_penalty = 0.0;
        assert!(Sampler::new(c).is_err());
    }

    #[test]
    fn defaults_follow_the_model() {
        let g = GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            min_p: Some(0.0),
            repetition_penalty: None,
            do_sample: Some(true),
        };
        let c = SamplerConfig::from_defaults(&g, 4);
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.min_p),
            (0.6, 20, 0.95, 0.0)
        );
        let g = GenerationDefaults {
            do_sample: Some(false),
            ..g
        };
        assert!(SamplerConfig::from_defaults(&g, 4).is_greedy());
    }
}
