//! The sampler's settings: what the model's generation_config.json asks for, HuggingFace's
//! defaults for what it leaves out, and the checks that refuse meaningless values.

use crate::format::GenerationDefaults;
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
