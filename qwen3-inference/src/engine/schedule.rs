//! Steps 1 and 2 of [`Engine::step`]: who runs, and which rows. Step 1 admits waiting requests
//! into free slots, each into the slot whose cache gives its prompt the most tokens (the prefix
//! cache); step 2 plans the step's rows: every decoding sequence's next token (and its drafts),
//! then pieces of prompts still being read, up to the step's budget. A hybrid model's prompts
//! are cut where a chunk of the delta rule starts, so that a token is computed the same way
//! however its prompt is cut.

use super::draft::{Drafter, SPECULATE_ROWS};
use super::images::{image_reuse, PromptImages};
use super::job::Job;
use super::{Engine, Event, Slot};
use crate::backend::Backend;
use crate::chat::{common_prefix_len, reuse_len};
use crate::kernels::delta_rule;
use crate::model::Segment;
use crate::sampler::Sampler;
use std::time::{Duration, Instant};

impl<'m, B: Backend> Engine<'m, B> {
    /// How many of `prompt`'s first tokens `slot`'s cache can give it. A hybrid model's
    /// sequence can go back only to its snapshot (the states of its Gated DeltaNets at the end of
    /// the cached tokens are past the shared prefix), so that position, if the prompt shares it.
    pub(super) fn reusable(
        &self,
        slot: &Slot,
        prompt: &[u32],
        images: Option<&PromptImages>,
    ) -> usize {
        let hidden = self.fwd.model().config.hidden_size as usize;
        let reuse = image_reuse(
            &slot.images,
            images,
            hidden,
            reuse_len(&slot.cached, prompt),
        );
        match self.has_linear_state() {
            false => reuse,
            true => slot.snapshot.filter(|&s| s <= reuse).unwrap_or(0),
        }
    }

    /// Prompt tokens a step takes while others decode: the configured chunk, or for a hybrid
    /// model that rounded up to a whole chunk of the delta rule ([`Engine::prompt_piece`]).
    pub(super) fn prefill_chunk(&self) -> usize {
        match self.has_linear_state() {
            true => self.cfg.prefill_chunk.next_multiple_of(delta_rule::CHUNK),
            false => self.cfg.prefill_chunk,
        }
    }

    /// How many of the `todo` prompt tokens from position `at` a step takes when `n` fit. A
    /// hybrid model's prompt is cut where a chunk of the delta rule starts (or where it ends): a
    /// token's form (chunked or recurrent) follows from its position and the step's first and
    /// last (`kernels/delta_net.rs`), so cut there, each token is computed the same way alone or
    /// beside others; a prompt that gets less than a chunk waits for the next step. (Only when
    /// a step has fewer than a chunk's rows beside its `decoding` sequences, over 64 of them,
    /// does a piece end elsewhere: no step would take a whole chunk.) A piece also ends at the
    /// prompt's last multiple of the chunk, `snapshot_at`, where the step takes a snapshot of the
    /// states for the prefix cache.
    pub(super) fn prompt_piece(&self, at: usize, n: usize, todo: usize, decoding: usize) -> usize {
        if !self.has_linear_state() {
            return n;
        }
        let c = delta_rule::CHUNK;
        let snapshot_at = (at + todo) / c * c;
        if at < snapshot_at && snapshot_at < at + n {
            return snapshot_at - at;
        }
        if n == todo {
            return n;
        }
        let aligned = ((at + n) / c * c).saturating_sub(at);
        match aligned == 0 && self.fwd.max_batch() - decoding < c {
            true => n,
            false => aligned,
        }
    }

    /// Step 1: free slots take waiting requests, first come first served.
    pub(super) fn admit(&mut self, events: &mut Vec<Event>) {
        while !self.waiting.is_empty() {
            // The free slot whose cache gives the prompt the most tokens; among equals, the one
            // that shares the longest prefix with it (a prompt that repeats a cached one whole,
            // all but its last token reusable, goes back to that slot rather than over another
            // conversation), then the least recently used (so that a busy conversation's cache
            // is not the first overwritten).
            let (prompt, images) = (&self.waiting[0].1.prompt, self.waiting[0].1.images.as_ref());
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.job.is_none())
                .map(|(i, s)| {
                    let common = common_prefix_len(&s.cached, prompt);
                    let reuse = self.reusable(s, prompt, images);
                    (reuse, common, std::cmp::Reverse(s.last_used), i)
                })
                .max();
            let Some((_, _, _, i)) = best else { break };
            let (id, req) = self.waiting.pop_front().expect("not empty");
            // A prompt to score runs whole: the logits of its cached positions are gone.
            let reuse = match req.prompt_logprobs {
                Some(_) => 0,
                None => self.reusable(&self.slots[i], &req.prompt, req.images.as_ref()),
            };
            let slot = &mut self.slots[i];
            if slot.snapshot.is_some_and(|s| s == reuse) {
                // A hybrid model's prefix: its states taken back to the snapshot's position.
                let restored = self
                    .fwd
                    .restore_state(&self.snapshots[i], &mut self.caches[i]);
                if let Err(e) = restored {
                    slot.forget();
                    events.push(Event::Failed {
                        id,
                        error: e.to_string(),
                    });
                    continue;
                }
            } else {
                slot.snapshot = None;
            }
            slot.cached.truncate(reuse);
            slot.last_used = self.steps;
            let hidden = self.fwd.model().config.hidden_size as usize;
            slot.images.clear();
            if let Some(p) = &req.images {
                slot.images.extend(
                    p.images
                        .iter()
                        .map(|im| super::images::CachedImage::of(im, hidden)),
                );
            }
            let sampler = match Sampler::new(req.sampler) {
                Ok(s) => s,
                Err(e) => {
                    // Validated in `submit`; kept as an event rather than a panic.
                    events.push(Event::Failed {
                        id,
                        error: e.to_string(),
                    });
                    continue;
                }
            };
            let prompt_len = req.prompt.len();
            // Drafts need the rows' own tokens, one logits row each: not with a grammar (its
            // masks and forced tokens advance one token at a time) or a prompt to score.
            let drafter = match (&req.constraint, req.prompt_logprobs, req.max_tokens) {
                (None, None, 1..) => Drafter::new(req.draft),
                _ => None,
            }
            .filter(|d| !(d.uses_model() && req.images.is_some()));
            let mut tokens = req.prompt;
            tokens.reserve(req.max_tokens.min(self.fwd.context_len()) + 1);
            slot.job = Some(Job {
                id,
                tokens,
                prompt_len,
                max_tokens: req.max_tokens,
                sampler,
                stop_ids: req.stop_ids,
                logprobs: req.logprobs,
                constraint: req.constraint,
                scoring: req.prompt_logprobs.map(|top| (top, Vec::new())),
                last_logits: req.last_logits,
                cached: reuse,
                start: Instant::now(),
                prefill: None,
                first_token: None,
                sampling: Duration::ZERO,
                kept_candidates: 0,
                drafter,
                images: req.images,
            });
            events.push(Event::Started { id, cached: reuse });
        }
    }

    /// Step 2, the step's rows: one for each decoding sequence, then prompt chunks, the oldest
    /// request's first, up to the budget. `plan` gets a segment per slot that runs, in slot
    /// order.
    pub(super) fn plan_rows(&mut self) {
        self.rows.clear();
        self.plan.clear();
        let pending = |s: &Slot| {
            s.job
                .as_ref()
                .map_or(0, |j| j.tokens.len() - s.cached.len())
        };
        let decoding = self.slots.iter().filter(|s| pending(s) == 1).count();
        let mut budget = if decoding > 0 {
            self.prefill_chunk().min(self.fwd.max_batch() - decoding)
        } else {
            self.fwd.max_batch()
        };
        // The budget goes to the prompts in the order their requests came (ids grow), not in
        // slot order: a request admitted into a low slot that just freed must not overtake one
        // that has been reading its prompt longer, which could otherwise wait forever under a
        // steady stream of new requests.
        self.take.clear();
        self.take.resize(self.slots.len(), 0);
        self.order.clear();
        self.order.extend((0..self.slots.len()).filter(|&i| {
            self.slots[i]
                .job
                .as_ref()
                .is_some_and(|j| j.scoring.is_none()) // a prompt being scored waits (step 1b)
        }));
        let slots = &self.slots;
        self.order
            .sort_unstable_by_key(|&i| slots[i].job.as_ref().map_or(0, |j| j.id));
        for &i in &self.order {
            let todo = pending(&self.slots[i]);
            self.take[i] = if todo == 1 {
                1
            } else {
                let at = self.slots[i].cached.len();
                let n = self.prompt_piece(at, todo.min(budget), todo, decoding);
                budget -= n;
                n
            };
        }
        // Drafts (speculative decoding, draft.rs): the decoding sequences that draft, oldest
        // first, add rows up to SPECULATE_ROWS in all, within the rows of logits a step returns
        // (one for each segment that ends its prompt or decodes, one for each drafted token).
        let mut rows: usize = self.take.iter().sum();
        let mut logit_rows = (0..self.slots.len())
            .filter(|&i| self.take[i] > 0 && self.take[i] == pending(&self.slots[i]))
            .count();
        let (ctx, max_logits) = (self.fwd.context_len(), self.fwd.max_logits());
        self.asks.clear();
        for &i in &self.order {
            let slot = &mut self.slots[i];
            let Some(job) = slot.job.as_mut() else {
                continue;
            };
            let Some(drafter) = job.drafter.as_mut() else {
                continue;
            };
            if job.tokens.len() - slot.cached.len() != 1 {
                continue;
            }
            // The pending token runs at position `cached`; all k drafts accepted make k + 1
            // more tokens of the answer, at positions up to `cached + k` of the context.
            let generated = job.tokens.len() - job.prompt_len;
            let room = (job.max_tokens.saturating_sub(generated + 1))
                .min(ctx - slot.cached.len() - 1)
                .min(SPECULATE_ROWS.saturating_sub(rows))
                .min(max_logits - logit_rows);
            let k = if drafter.uses_model() {
                let want = drafter.want(room);
                if want > 0 {
                    self.asks.push((i, want));
                }
                want
            } else {
                drafter.propose(&job.tokens, job.prompt_len, room)
            };
            rows += k;
            logit_rows += k;
        }
        if !self.asks.is_empty() {
            self.guess_with_draft_model();
        }
        // The segments in slot order: the tokens to run, then the drafted ones.
        for (i, slot) in self.slots.iter().enumerate() {
            let (Some(job), n) = (&slot.job, self.take[i]) else {
                continue;
            };
            let todo = &job.tokens[slot.cached.len()..];
            if n > 0 {
                self.rows.extend_from_slice(&todo[..n]);
                let drafted = job.drafter.as_ref().map_or(&[][..], |d| &d.proposed);
                self.rows.extend_from_slice(drafted);
                self.plan.push(Segment {
                    seq: i,
                    pos: slot.cached.len(),
                    len: n + drafted.len(),
                    logits: if n == todo.len() {
                        1 + drafted.len()
                    } else {
                        0
                    },
                });
            }
        }
    }
}
