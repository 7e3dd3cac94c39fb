//! A request in a slot ([`Job`]), and what one row of its logits does to it ([`next_token`]):
//! the token drawn (through its grammar, if it has one), reported and appended, or the answer's
//! end. The engine (mod.rs) plans the rows and runs the step; this is step 4 for one request.

use super::draft::Drafter;
use super::{Event, GenerationStats, RequestId, StopReason};
use crate::constraint::Constraint;
use crate::logprobs::{token_logprobs, TokenLogprobs};
use crate::sampler::{argmax, Sampler};
use std::time::{Duration, Instant};

/// A request in a slot.
pub(super) struct Job {
    pub(super) id: RequestId,
    /// The prompt, then each sampled token: what the model has seen or will see next.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) max_tokens: usize,
    pub(super) sampler: Sampler,
    pub(super) stop_ids: Vec<u32>,
    pub(super) logprobs: Option<usize>,
    pub(super) constraint: Option<Constraint>,
    /// `Request::last_logits`.
    pub(super) last_logits: bool,
    /// The prompt's log-probabilities while they are being computed: alternatives per token,
    /// and the entries so far (`None` when not asked for, or once sent).
    pub(super) scoring: Option<(usize, Vec<TokenLogprobs>)>,
    /// Prompt tokens found in the slot's cache when it started.
    pub(super) cached: usize,
    /// When it took its slot.
    pub(super) start: Instant,
    /// The time of the pass that gave its first logits (the prompt's).
    pub(super) prefill: Option<Duration>,
    /// From `start` to its first sampled token.
    pub(super) first_token: Option<Duration>,
    pub(super) sampling: Duration,
    pub(super) kept_candidates: usize,
    /// Its drafts (speculative decoding), if it has any.
    pub(super) drafter: Option<Drafter>,
    /// Its prompt's images and positions (images.rs), if it has any.
    pub(super) images: Option<super::PromptImages>,
}

/// What a row of logits did to its request ([`next_token`]).
pub(super) enum Row {
    /// A token was drawn and the answer goes on.
    Next(u32),
    /// The answer ended.
    Stop(StopReason),
    /// The request failed (its grammar could not go on).
    Failed(String),
}

/// Step 4 for one row of a request's logits, `l`: the next token is drawn, reported and
/// appended, or the answer ends (the token limit, an end-of-sequence id, the context full with
/// `cached` positions in use).
pub(super) fn next_token(
    job: &mut Job,
    l: &[f32],
    masked: &mut Vec<f32>,
    cached: usize,
    ctx: usize,
    events: &mut Vec<Event>,
) -> Row {
    let generated = job.tokens.len() - job.prompt_len;
    if generated >= job.max_tokens {
        return Row::Stop(StopReason::MaxTokens);
    }
    let t = Instant::now();
    let next = match job.draw(l, masked) {
        Ok(next) => next,
        Err(error) => return Row::Failed(error),
    };
    job.sampling += t.elapsed();
    job.kept_candidates += job.sampler.last_kept();
    job.first_token.get_or_insert_with(|| job.start.elapsed());
    job.tokens.push(next);
    if job.stop_ids.contains(&next) {
        return Row::Stop(StopReason::Eos(next));
    }
    // Of the raw logits, which the sampler read but did not change.
    let logprobs = job
        .logprobs
        .map(|top| Box::new(token_logprobs(l, next, top)));
    events.push(Event::Token {
        id: job.id,
        token: next,
        logprobs,
    });
    // Tokens the grammar forces after `next`, appended as if sampled.
    let room = (job.max_tokens - generated - 1).min(ctx.saturating_sub(cached + 1));
    let generated = match job.force(room, events) {
        Ok(forced) => generated + forced,
        Err(error) => return Row::Failed(error),
    };
    if generated + 1 == job.max_tokens {
        Row::Stop(StopReason::MaxTokens)
    } else if cached == ctx {
        Row::Stop(StopReason::ContextFull)
    } else {
        Row::Next(next)
    }
}

impl Job {
    /// The next token from `logits`: sampled, or for a constrained request sampled from the
    /// logits masked by its grammar (copied into `masked`; the pass's logits are read-only).
    fn draw(&mut self, logits: &[f32], masked: &mut Vec<f32>) -> Result<u32, String> {
        // The penalties' scopes: everything seen, and the answer so far.
        let (seen, answer) = (&self.tokens, &self.tokens[self.prompt_len..]);
        let Some(c) = &mut self.constraint else {
            return Ok(self.sampler.sample(logits, seen, answer));
        };
        masked.clear();
        masked.extend_from_slice(logits);
        c.mask(masked, &self.stop_ids).map_err(|e| e.to_string())?;
        let next = self.sampler.sample(masked, seen, answer);
        if c.allows(next, &self.stop_ids) {
            Ok(next)
        } else {
            // Drawn with the vanishing weight the sampler gives -inf (see `Constraint::allows`):
            // the most likely allowed token instead.
            Ok(argmax(masked) as u32)
        }
    }

    /// Moves a constrained request's grammar past its last token (just sampled, not a stop id),
    /// then appends the tokens the grammar forces, at most `room` (the answer's and the
    /// context's room: each must run before the next sample), reporting each as a token. Not
    /// when log-probabilities are asked for: a forced token has no logits of its own. Returns
    /// how many were appended.
    fn force(&mut self, room: usize, events: &mut Vec<Event>) -> Result<usize, String> {
        let Some(c) = &mut self.constraint else {
            return Ok(0);
        };
        let last = *self.tokens.last().expect("just sampled");
        c.advance(last).map_err(|e| e.to_string())?;
        if self.logprobs.is_some() {
            return Ok(0);
        }
        let forced = c.forced(room);
        for &token in &forced {
            self.tokens.push(token);
            events.push(Event::Token {
                id: self.id,
                token,
                logprobs: None,
            });
        }
        Ok(forced.len())
    }

    /// The finished request's counts and times.
    pub(super) fn stats(&self, stop: StopReason) -> GenerationStats {
        let total = self.start.elapsed();
        let first = self.first_token.unwrap_or(total);
        GenerationStats {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached,
            generated_tokens: self.tokens.len() - self.prompt_len,
            prefill: self.prefill.unwrap_or(total),
            time_to_first_token: first,
            decode: total - first,
            sampling: self.sampling,
            kept_candidates: self.kept_candidates,
            drafted_tokens: self.drafter.as_ref().map_or(0, |d| d.drafted),
            accepted_tokens: self.drafter.as_ref().map_or(0, |d| d.accepted),
            stop,
        }
    }
}
