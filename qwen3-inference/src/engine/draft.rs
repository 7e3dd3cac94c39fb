//! Speculative decoding's drafts: guesses of a sequence's next tokens, checked by the model all at
//! once (docs/performance.md, "Speculative decoding").
//!
//! Decoding one token reads every weight once; on a CPU that read, not the arithmetic, is the
//! cost, so a step of a few rows costs about as much as a step of one. A draft `d1 .. dk` runs as
//! rows `[last, d1, .., dk]` of one step, and row `i`'s logits give the model's own next token
//! after the first `i` drafted ones. The engine draws from each row in turn with the request's
//! own sampler, exactly as plain decoding would, and goes on to the next row while the token
//! drawn is the drafted one: every drawn token is the one plain decoding would have drawn
//! (each row's logits are bit-identical to plain decoding's, since a row is computed the same
//! way whatever runs beside it), so the answer is the same, token for token, for greedy and
//! seeded sampling alike, only sooner when drafts agree.
//!
//! For sampling that is the speculative sampling rule (Leviathan et al. 2023; Chen et al. 2023)
//! for a draft that proposes one token with certainty: accept `d` with probability `p(d)`, else
//! draw from `p` without `d`. Drawing `x ~ p` and keeping it is the same: `x == d` with
//! probability `p(d)`, and when it is not, `x` is a draw from `p` without `d`.
//!
//! The rows of rejected drafts wrote keys and values past the accepted tokens; the engine forgets
//! them by shortening the slot's cached tokens (attention at position `p` reads positions `0..=p`
//! only, and the next step writes over them).
//!
//! Where drafts come from ([`Draft`]): the sequence itself (prompt lookup: a summary, an edit or
//! a RAG answer copies runs of its input), a small model of the same vocabulary (draft_model.rs),
//! or, for benchmarks, a given answer.

/// How a request's next tokens are guessed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Draft {
    /// No drafts: one token a step.
    #[default]
    None,
    /// Prompt lookup: find the sequence's last [`NGRAM_MAX`] tokens (else fewer, down to
    /// [`NGRAM_MIN`]) earlier in the prompt or the answer, and propose the tokens that followed
    /// their latest occurrence, at most `max`.
    Ngram { max: usize },
    /// A draft model's greedy guesses (the engine's [`DraftModel`](super::DraftModel), a small
    /// model of the same vocabulary, such as Qwen3-0.6B for Qwen3-8B), at most `max`.
    Model { max: usize },
    /// The answer given, in order: a benchmark's ceiling (a previous greedy run's answer, whose
    /// every draft the model accepts), at most `max` a step.
    Replay { answer: Vec<u32>, max: usize },
}

impl Draft {
    /// The longest draft a step may verify (0 for none).
    pub fn max(&self) -> usize {
        match self {
            Draft::None => 0,
            Draft::Ngram { max } | Draft::Model { max } | Draft::Replay { max, .. } => *max,
        }
    }
}

/// The longest n-gram prompt lookup matches; shorter ones are tried when it finds none.
pub const NGRAM_MAX: usize = 3;
/// The shortest: a single token matches too often to predict what follows.
pub const NGRAM_MIN: usize = 2;

/// Drafts a draft model gets to guess one token right before the request stops asking it.
pub const MODEL_TRIES: u32 = 4;

/// A step's rows, drafts included, up to which drafts are added. Speculation pays while a step
/// is bound by reading the weights, which a few rows are; a step that already runs this many
/// rows (many sequences decoding, or a prompt chunk) is bound by arithmetic, where every
/// rejected draft costs its full share.
pub const SPECULATE_ROWS: usize = 16;

/// A request's drafts as they go: what to propose, how many, and what was accepted.
#[derive(Debug)]
pub(super) struct Drafter {
    draft: Draft,
    /// How many tokens to propose next (at most the draft's `max`): it grows by 2 after a draft
    /// accepted whole and shrinks by 1 after one accepted in part (the schedule of transformers'
    /// assisted generation, `num_assistant_tokens_schedule="heuristic"`), and by half after one
    /// that was rejected outright.
    len: usize,
    /// Verifications in a row that accepted nothing, and the steps left to skip drafting: after
    /// each, drafting pauses for 2, 4, .. 64 steps, so that drafts that never match cost next
    /// to nothing. A draft model that has not guessed one token right in its first
    /// [`MODEL_TRIES`] drafts is not asked again for the request: unlike a lookup, its guesses
    /// cost a pass each, and its catching up after a pause a chunk of the tokens it missed.
    misses: u32,
    pause: usize,
    /// The tokens proposed this step (verified by the step's rows).
    pub proposed: Vec<u32>,
    /// Tokens drafted and accepted so far.
    pub drafted: usize,
    pub accepted: usize,
}

impl Drafter {
    /// A drafter for `draft`, or `None` when it drafts nothing.
    pub fn new(draft: Draft) -> Option<Drafter> {
        let max = draft.max();
        (max > 0).then(|| Drafter {
            draft,
            len: max.min(4),
            misses: 0,
            pause: 0,
            proposed: Vec::with_capacity(max),
            drafted: 0,
            accepted: 0,
        })
    }

    /// Whether the drafts come from the engine's draft model, which fills `proposed` itself
    /// (for every drafting sequence at once) after [`Drafter::want`].
    pub fn uses_model(&self) -> bool {
        matches!(self.draft, Draft::Model { .. })
    }

    /// How many tokens to propose this step, at most `room`: the adapted length, or none while
    /// drafting pauses. Clears `proposed`.
    pub fn want(&mut self, room: usize) -> usize {
        self.proposed.clear();
        let want = self.len.min(room);
        if want == 0 {
            return 0;
        }
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        want
    }

    /// Proposes at most `room` tokens to follow `tokens` (the prompt, then the answer so far; the
    /// last one sampled and not yet run) into `proposed`; returns how many. (A draft model's
    /// drafts are the engine's to make: none here.)
    pub fn propose(&mut self, tokens: &[u32], prompt_len: usize, room: usize) -> usize {
        let want = self.want(room);
        if want == 0 {
            return 0;
        }
        match &self.draft {
            Draft::None | Draft::Model { .. } => {}
            Draft::Ngram { .. } => lookup(tokens, want, &mut self.proposed),
            Draft::Replay { answer, .. } => {
                let done = tokens.len() - prompt_len;
                let next = answer.get(done..).unwrap_or(&[]);
                self.proposed.extend(next.iter().take(want));
            }
        }
        self.proposed.len()
    }

    /// After the step: `accepted` of the proposed tokens were the model's own.
    pub fn verified(&mut self, accepted: usize) {
        let k = self.proposed.len();
        self.drafted += k;
        self.accepted += accepted;
        if accepted == k {
            self.len = (self.len + 2).min(self.draft.max());
            self.misses = 0;
        } else if accepted == 0 {
            self.len = (self.len / 2).max(1);
            self.misses += 1;
            self.pause = 1 << self.misses.min(6);
            if self.uses_model() && self.accepted == 0 && self.misses >= MODEL_TRIES {
                self.pause = usize::MAX;
            }
        } else {
            self.len = self.len.saturating_sub(1).max(1);
            self.misses = 0;
        }
        self.proposed.clear();
    }
}

/// Prompt lookup: the tokens that followed the latest earlier occurrence of `tokens`' last n
/// tokens (n = [`NGRAM_MAX`] down to [`NGRAM_MIN`], the longest that occurs), at most `want`,
/// appended to `out`.
fn lookup(tokens: &[u32], want: usize, out: &mut Vec<u32>) {
    let len = tokens.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let key = &tokens[len - n..];
        // Occurrences that start at `s < len - n`: each is followed by at least one token, and
        // the key itself (at `len - n`) is not one of them.
        if let Some(s) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == key) {
            out.extend(tokens[s + n..].iter().take(want));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        let mut out = vec![];
        // "1 2 3" occurs at 0 (followed by 4 5) and at 5 (followed by 9): the latest wins.
        lookup(&[1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3], 4, &mut out);
        assert_eq!(out, [9, 7, 1, 2]);
        // No 3-gram "8 2 3" earlier; the 2-gram "2 3" is.
        out.clear();
        lookup(&[2, 3, 6, 8, 2, 3], 2, &mut out);
        assert_eq!(out, [6, 8]);
        // Nothing matches: no draft.
        out.clear();
        lookup(&[1, 2, 3, 4], 4, &mut out);
        assert!(out.is_empty());
        // A run of one token predicts more of it.
        lookup(&[5, 5, 5, 5], 3, &mut out);
        assert_eq!(out, [5]);
    }

    #[test]
    fn the_length_adapts_and_pauses_after_misses() {
        let mut d = Drafter::new(Draft::Ngram { max: 8 }).unwrap();
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        assert_eq!(d.propose(&tokens, 0, 100), 4);
        assert_eq!(d.proposed, [3, 4, 5, 6]);
        d.verified(4);
        assert_eq!(d.propose(&tokens, 0, 100), 6); // grew by 2
        d.verified(6);
        assert_eq!(d.propose(&tokens, 0, 100), 8); // the most: 8
        assert_eq!(d.propose(&tokens, 0, 3), 3); // the room bounds it
        d.verified(1);
        assert_eq!((d.drafted, d.accepted), (13, 11));
        // Accepted in part: one shorter (8 - 1). Then a verification that accepts nothing:
        // half as long, and drafting pauses for 2 steps; after the next, for 4.
        assert_eq!(d.propose(&tokens, 0, 100), 7);
        d.verified(0);
        assert_eq!(d.propose(&tokens, 0, 100), 0);
        assert_eq!(d.propose(&tokens, 0, 100), 0);
        assert_eq!(d.propose(&tokens, 0, 100), 3);
        d.verified(0);
        for _ in 0..4 {
            assert_eq!(d.propose(&tokens, 0, 100), 0);
        }
        assert_eq!(d.propose(&tokens, 0, 100), 1);
        // An accepted draft ends the pauses.
        d.verified(1);
        assert_eq!(d.propose(&tokens, 0, 100), 3);
        assert!(Drafter::new(Draft::Ngram { max: 0 }).is_none());
    }

    /// The acceptance rule on a known distribution: with `p = [0.5, 0.3, 0.15, 0.05]` and the
    /// draft `d = 1`, drawing `x ~ p` and keeping the draft when `x == d` accepts it with
    /// probability `p(d) = 0.3`; a rejection's token follows `p` without `d`, renormalized
    /// (`[5/7, 0, 1.5/7, 0.5/7]`); and the tokens emitted follow `p` itself. Frequencies of
    /// 40000 draws, each within 4.5 standard deviations.
    #[test]
    fn verifying_by_drawing_keeps_the_distribution() {
        use crate::sampler::{Sampler, SamplerConfig};
        let p = [0.5f64, 0.3, 0.15, 0.05];
        let logits: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        let (n, d) = (40_000, 1);
        let (mut emitted, mut rejected_as) = ([0usize; 4], [0usize; 4]);
        for _ in 0..n {
            let x = sampler.sample(&logits, &[], &[]) as usize;
            emitted[x] += 1;
            if x != d {
                rejected_as[x] += 1;
            }
        }
        let close = |count: usize, of: usize, q: f64| {
            let sd = (q * (1.0 - q) / of as f64).sqrt();
            let f = count as f64 / of as f64;
            assert!(
                (f - q).abs() <= 4.5 * sd + 1e-12,
                "{f} against {q} (of {of})"
            );
        };
        // Accepted: the draws equal to the draft.
        close(emitted[d], n, p[d]);
        let rejections = n - emitted[d];
        for t in 0..4 {
            close(emitted[t], n, p[t]);
            let without_d = if t == d { 0.0 } else { p[t] / (1.0 - p[d]) };
            close(rejected_as[t], rejections, without_d);
        }
    }

    #[test]
    fn a_draft_model_that_never_agrees_is_dropped() {
        // Over 1000 steps whose drafts are all rejected: the steps that drafted.
        let rejected_for_1000_steps = |d: &mut Drafter| {
            (0..1000)
                .filter(|_| {
                    let drafted = d.want(100) > 0;
                    if drafted {
                        d.proposed.push(1);
                        d.verified(0);
                    }
                    drafted
                })
                .count()
        };
        let mut d = Drafter::new(Draft::Model { max: 8 }).unwrap();
        assert_eq!(rejected_for_1000_steps(&mut d), MODEL_TRIES as usize);
        // One that agreed once keeps being asked, pausing after misses.
        let mut d = Drafter::new(Draft::Model { max: 8 }).unwrap();
        d.want(100);
        d.proposed.extend([1, 2]);
        d.verified(1);
        let steps = rejected_for_1000_steps(&mut d);
        assert!(steps > MODEL_TRIES as usize, "{steps}");
    }

    #[test]
    fn replay_proposes_the_rest_of_the_answer() {
        let mut d = Drafter::new(Draft::Replay {
            answer: vec![10, 11, 12, 13, 14, 15],
            max: 2,
        })
        .unwrap();
        // Prompt [1, 2], answer so far [10]: next come 11, 12.
        assert_eq!(d.propose(&[1, 2, 10], 2, 100), 2);
        assert_eq!(d.proposed, [11, 12]);
        d.verified(2);
        assert_eq!(d.propose(&[1, 2, 10, 11, 12, 13, 14, 15], 2, 100), 0);
    }
}
