//! A hybrid model's states in the engine: its Gated DeltaNets' memories cannot be cut back as a
//! KV cache can (a cache is cut by forgetting positions; a state has been through every token).
//! Snapshots of the states take their place: one at a prompt's last multiple of the delta rule's
//! chunk, for the prefix cache, and one before a step that verifies drafts, to go back to when
//! a draft is rejected.

use super::{Engine, Event};
use crate::backend::Backend;
use crate::kernels::delta_rule;
use anyhow::Result;

impl<'m, B: Backend> Engine<'m, B> {
    /// Step 3b, after a successful pass of a hybrid model: a prompt that reached a multiple of
    /// the delta rule's chunk leaves a snapshot of its states there, for the prefix cache (one
    /// a slot, the latest; `Engine::prompt_piece` makes the prompt's last multiple a step's end).
    pub(super) fn take_snapshots(&mut self) {
        if self.snapshots.is_empty() {
            return;
        }
        for seg in &self.plan {
            let slot = &mut self.slots[seg.seq];
            let Some(job) = &slot.job else { continue };
            let end = slot.cached.len() + seg.len.min(job.tokens.len() - slot.cached.len());
            if end.is_multiple_of(delta_rule::CHUNK) && end <= job.prompt_len {
                let saved = self
                    .fwd
                    .save_state(&self.caches[seg.seq], &mut self.snapshots[seg.seq]);
                slot.snapshot = saved.is_ok().then_some(end);
            }
        }
    }

    /// Before the pass of a hybrid model: each sequence that verifies drafts this step keeps its
    /// states as they are, at the position of its pending token, in case one is rejected.
    pub(super) fn save_before_drafts(&mut self) -> Result<()> {
        if self.snapshots.is_empty() {
            return Ok(());
        }
        for seg in &self.plan {
            // A decoding segment with drafts: more rows of logits than one.
            if seg.logits <= 1 {
                continue;
            }
            let snap = match &mut self.before_drafts[seg.seq] {
                Some(snap) => snap,
                slot @ None => match self.fwd.new_snapshot()? {
                    Some(snap) => slot.insert(snap),
                    None => continue,
                },
            };
            self.fwd.save_state(&self.caches[seg.seq], snap)?;
        }
        Ok(())
    }

    /// After step 4, a hybrid model's sequences whose drafts were rejected: their keys and
    /// values past the accepted tokens are simply overwritten later, but their Gated DeltaNets'
    /// states went through every draft. They go back to the states before the step, and the
    /// tokens of the step (the pending one, the accepted drafts and the token drawn after them)
    /// run again at the next step, one by one in the recurrence as plain decoding runs them, so
    /// the answer's tokens and states are plain decoding's (`drafts_change_nothing_but_the_steps`).
    pub(super) fn roll_back_rejected_drafts(&mut self, events: &mut Vec<Event>) {
        for (i, before) in std::mem::take(&mut self.rollbacks) {
            let Some(snap) = &self.before_drafts[i] else {
                continue;
            };
            let slot = &mut self.slots[i];
            if slot.job.is_none() {
                // The request ended in this step: its cache is not reused past `before`.
                slot.cached.truncate(before);
                slot.snapshot = slot.snapshot.filter(|&s| s <= before);
            }
            match self.fwd.restore_state(snap, &mut self.caches[i]) {
                Ok(()) => slot.cached.truncate(before),
                Err(e) => {
                    slot.forget();
                    if let Some(job) = slot.job.take() {
                        let error = e.to_string();
                        events.push(Event::Failed { id: job.id, error });
                    }
                }
            }
        }
    }
}
