//! How a request ended: why it stopped ([`StopReason`]) and what it cost ([`GenerationStats`]),
//! which the engine fills in and the CLI's summary line and the server's answers read.

use std::time::Duration;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this end-of-sequence id (one of the model file's `eos_token_ids`).
    Eos(u32),
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// Every position of the session's context is used.
    ContextFull,
    /// The caller stopped it (Ctrl-C in the chat).
    Stopped,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Eos(id) => write!(f, "end-of-sequence token {id}"),
            StopReason::MaxTokens => write!(f, "token limit reached"),
            StopReason::ContextFull => write!(f, "context full"),
            StopReason::Stopped => write!(f, "stopped"),
        }
    }
}

/// What happened, for the summary line.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values were already cached (not run again).
    pub cached_tokens: usize,
    /// Tokens sampled, an end-of-sequence token included, and those a grammar forced.
    pub generated_tokens: usize,
    /// From taking a slot to the end of the pass that ran the prompt's last token.
    pub prefill: Duration,
    /// From the start to the first sampled token (prefill plus one sampling step).
    pub time_to_first_token: Duration,
    /// From the first sampled token to the last: `generated_tokens - 1` decode steps (fewer
    /// when a grammar forced tokens).
    pub decode: Duration,
    /// Time spent in the sampler, all tokens together (included in the times above).
    pub sampling: Duration,
    /// Candidates the sampler's filters kept, summed over the sampled tokens.
    pub kept_candidates: usize,
    /// Speculative decoding: tokens drafted, and those of them the model agreed with (each an
    /// answer token that took no step of its own).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub stop: StopReason,
}

impl GenerationStats {
    /// Prompt tokens run per second of prefill (cached ones are not run).
    pub fn prefill_tok_s(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / self.prefill.as_secs_f64()
    }

    /// Tokens per second after the first one (each one forward pass with t = 1 and a sample, but
    /// for the tokens a grammar forces, which run several to a pass: docs/structured.md).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64()
    }
}
