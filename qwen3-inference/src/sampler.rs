//! Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, and a seeded
//! random draw. See docs/sampling.md.
//!
//! The steps run in the order HuggingFace `generate` applies its logits processors
//! (`transformers/generation/logits_process.py`): repetition penalty, temperature, top-k, top-p,
//! min-p, then one draw from what is left. Temperature 0 is greedy: the argmax of the penalised
//! logits.

use crate::format::GenerationDefaults;
use crate::kernels::exp::exp;
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
    /// exp(logit - max) of each candidate, for the draw.
    weights: Vec<f32>,
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
            weights: Vec::new(),
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
        let vocab = logits.len();
        let (rp, pp) = (self.cfg.repetition_penalty, self.cfg.presence_penalty);
        if self.cfg.is_greedy() && rp == 1.0 && pp == 0.0 {
            // Plain greedy: nothing reshapes the logits, so no copy.
            self.last_kept = 1;
            return argmax(logits) as u32;
        }
        // 1. Penalties, once per distinct token id, on a copy of the logits (only when a penalty
        //    is set: otherwise the logits are read in place).
        let penalized = rp != 1.0 || pp != 0.0;
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

        let src: &[f32] = if penalized { &self.work } else { logits };

        // 2. Greedy: the first index of the largest logit (torch.argmax's tie rule).
        if self.cfg.is_greedy() {
            self.last_kept = 1;
            return argmax(src) as u32;
        }

        // 3. Temperature: p ~ exp(l / T). Below 1 sharpens, above 1 flattens. It is applied
        //    inside the filter, to the candidates only: dividing by T > 0 keeps the order.
        let inv_t = 1.0 / self.cfg.temperature;
        let max = filter(&self.cfg, src, inv_t, &mut self.candidates);
        self.last_kept = self.candidates.len();

        // 4. Draw from the kept candidates in proportion to exp(l - max): the weights once (a
        //    loop the compiler vectorizes; with no filter it covers the whole vocabulary), their
        //    total in f64, then a walk to where the uniform draw falls.
        self.weights.clear();
        self.weights
            .extend(self.candidates.iter().map(|&(l, _)| exp(l - max)));
        let total: f64 = self.weights.iter().map(|&w| w as f64).sum();
        let mut r = self.rng.next_f64() * total;
        for (&w, &(_, t)) in self.weights.iter().zip(&self.candidates) {
            r -= w as f64;
            if r < 0.0 {
                return t;
            }
        }
        // Rounding left a sliver of mass past the end: it belongs to the last candidate.
        self.candidates.last().map_or(0, |&(_, t)| t)
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

/// Leaves in `candidates` the tokens top-k, top-p and min-p keep, and returns the largest scaled
/// logit (the argmax is always kept). Each filter keeps a prefix of the tokens sorted by
/// probability, so the result is the shortest of the three prefixes; only that prefix is ever
/// sorted, never the whole vocabulary. Works on `src * inv_t` (the temperature applied) without
/// writing it out.
fn filter(cfg: &SamplerConfig, src: &[f32], inv_t: f32, candidates: &mut Vec<(f32, u32)>) -> f32 {
    let (top_k, top_p, min_p) = (cfg.top_k, cfg.top_p as f64, cfg.min_p);
    // Scaled logit of token i: src[i] * inv_t, computed where a candidate is kept.
    let max = max_value(src) * inv_t;
    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let weight = |l: f32| exp(l - max) as f64;

    // top-k: the k largest logits, sorted. One pass that keeps the best k seen so far in a
    // small sorted array: after the first few hundred tokens almost every logit fails the
    // comparison with the k-th best. So the pass goes a block of logits at a time and skips a
    // block whose largest logit fails it: one vectorized max per block instead of a branch per
    // logit (docs/sampling.md has the before and after).
    candidates.clear();
    let mut sorted = false;
    if top_k > 0 && top_k < src.len() {
        const BLOCK: usize = 64;
        for (b, block) in src.chunks(BLOCK).enumerate() {
            if candidates.len() == top_k {
                // Scaling by inv_t > 0 keeps the order, so the block's best scaled logit is
                // its best logit scaled.
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
        sorted = true;
    } else if top_p < 1.0 || min_p > 0.0 {
        // Top-p or min-p will cut the tail; tokens more than NEGLIGIBLE below the maximum
        // cannot matter to either (see the constant), so they are not even collected.
        let floor = max - NEGLIGIBLE;
        candidates.extend(
            src.iter()
                .enumerate()
                .map(|(i, &raw)| (raw * inv_t, i as u32))
                .filter(|&(l, _)| l >= floor),
        );
    } else {
        candidates.extend(
            src.iter()
                .enumerate()
                .map(|(i, &raw)| (raw * inv_t, i as u32)),
        );
    }

    // top-p is measured against the distribution top-k left (HF renormalises after top-k).
    let z: f64 = if top_p < 1.0 {
        candidates.iter().map(|&(l, _)| weight(l)).sum()
    } else {
        0.0
    };

    // min-p: p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p). Dropping these first is
    // safe: min-p would drop them after top-p anyway, and top-p's cut only depends on the
    // mass of tokens above it, which min-p never removes.
    if min_p > 0.0 {
        let floor = max + min_p.ln();
        candidates.retain(|&(l, _)| l >= floor);
    }

    // top-p: sort only a growing prefix (64, 256, ...) until its mass reaches top_p * z.
    // The nucleus is usually a few dozen tokens, so this is one partial selection.
    if top_p < 1.0 {
        let target = top_p * z;
        let mut m = 64;
        loop {
            let n = candidates.len();
            let prefix = m.min(n);
            if !sorted {
                if m < n {
                    candidates.select_nth_unstable_by(m - 1, desc);
                }
                candidates[..prefix].sort_unstable_by(desc);
            }
            // Keep token i while the mass of the tokens before it is below the target (HF
            // keeps the token that crosses top_p): the smallest set reaching top_p.
            let mut mass = 0.0;
            let mut keep = None;
            for (i, &(l, _)) in candidates[..prefix].iter().enumerate() {
                if mass >= target {
                    keep = Some(i);
                    break;
                }
                mass += weight(l);
            }
            if let Some(k) = keep {
                candidates.truncate(k.max(1));
                return max;
            }
            if prefix == n {
                return max; // every candidate is needed to reach top_p
            }
            m *= 4;
        }
    }
    // No top-p: the draw does not need the candidates in order.
    max
}

/// The largest value (NaNs ignored), in 16 independent running maxima so that the compiler can
/// keep them in vector registers (a single running `f32::max` is a chain it will not reorder).
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
            filter(&s.cfg, &l, 1.0, &mut s.candidates);
            assert_eq!(s.candidates.len(), nucleus, "n {n} p {p}");
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
        let mut s = Sampler::new(c).unwrap();
        assert_eq!(
            s.sample(&l, &[0], &[]),
            0,
            "presence penalty ignores the prompt"
        );
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
