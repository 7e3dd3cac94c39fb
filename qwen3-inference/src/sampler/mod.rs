//! Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, and a seeded
//! random draw. See docs/sampling.md.
//!
//! The steps run in the order HuggingFace `generate` applies its logits processors
//! (`transformers/generation/logits_process.py`): repetition penalty, temperature, top-k, top-p,
//! min-p, then one draw from what is left. Temperature 0 is greedy: the argmax of the penalised
//! logits.
//!
//! Read in this order: `config.rs` (the settings), `penalties.rs`, `filter.rs` (top-k, min-p),
//! `top_p.rs` (the plain nucleus as llama2.c writes it, then the fast one tested against it),
//! `draw.rs`, and the steps put together in [`Sampler::sample`] below.

mod config;
mod draw;
mod filter;
mod penalties;
mod rng;
#[cfg(test)]
mod tests;
pub mod top_p;

pub use config::SamplerConfig;
pub use filter::argmax;
pub use rng::Rng;

use crate::kernels::exp::exp;
use crate::kernels::{vector_isa, VectorIsa};
use anyhow::Result;
use draw::{draw, DRAW_BLOCK};
use filter::{filter, max_value, min_p_floor};
use penalties::Penalties;
use top_p::{nucleus, Nucleus, TopPBuffers};

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
    /// Which ids the penalties already handled in this call.
    penalties: Penalties,
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
            penalties: Penalties::default(),
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
        let penalized = self.cfg.has_penalties();
        if self.cfg.is_greedy() && !penalized {
            // Plain greedy: nothing reshapes the logits, so no copy.
            self.last_kept = 1;
            return argmax(logits) as u32;
        }
        // 1. Penalties, on a copy of the logits (only when a penalty is set: otherwise the
        //    logits are read in place).
        if penalized {
            self.work.clear();
            self.work.extend_from_slice(logits);
            (self.penalties).apply(&self.cfg, &mut self.work, context, generated);
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
}

/// [`Sampler::sample`]'s signature, for [`sample_fn`].
type SampleFn = fn(&mut Sampler, &[f32], &[u32], &[u32]) -> u32;

/// [`Sampler::sample_body`] compiled for the instruction set of the chosen kernel family
/// ([`vector_isa`], as attention's kernel is). Its passes over the vocabulary (the maximum,
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
