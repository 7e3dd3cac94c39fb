//! Step 1b of [`Engine::step`]: the prompts whose log-probabilities were asked for
//! (`Request::prompt_logprobs`, OpenAI's `echo` with `logprobs`) are scored, a chunk a step,
//! each alone in a pass that returns every position's logits (see mod.rs).

use super::{Engine, Event};
use crate::backend::Backend;
use crate::logprobs::token_logprobs;
use crate::model::RowInputs;
use crate::model::Segment;

/// Most prompt positions scored in one step (`Request::prompt_logprobs`; fewer when the prefill
/// chunk is smaller): their logits take `SCORE_ROWS x vocab` floats (Qwen3's vocabulary: 39 MB).
pub const SCORE_ROWS: usize = 64;

impl<'m, B: Backend> Engine<'m, B> {
    /// Step 1b: the prompts being scored take their next [`SCORE_ROWS`] positions, each alone
    /// in a pass that returns every position's logits; position `p` gives the log-probability of
    /// prompt token `p + 1`. The last prompt token is left to step 2, as for any request: its
    /// logits give the first answer token.
    pub(super) fn score_prompts(&mut self, events: &mut Vec<Event>) {
        let vocab = self.fwd.vocab();
        // The prefill chunk bounds it too, so that the other streams keep flowing.
        let rows = SCORE_ROWS
            .min(self.prefill_chunk())
            .min(self.fwd.max_batch());
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            let Some(job) = slot.job.as_mut() else {
                continue;
            };
            let Some((top, got)) = job.scoring.as_mut() else {
                continue;
            };
            let (done, end) = (slot.cached.len(), job.prompt_len - 1);
            if done < end {
                let chunk = &job.tokens[done..end.min(done + rows)];
                let seg = Segment {
                    seq: 0,
                    pos: done,
                    len: chunk.len(),
                    logits: 0,
                };
                let b = self.fwd.backend();
                let scored = (|| {
                    let buf = match &mut self.scores {
                        Some(buf) => buf,
                        None => self.scores.insert(b.alloc(SCORE_ROWS * vocab)?),
                    };
                    self.fwd.step_all_logits(
                        chunk,
                        seg,
                        &mut self.caches[i],
                        buf,
                        RowInputs::default(),
                    )?;
                    // Row r holds the logits at position done + r: they score token done + r + 1.
                    let all = b.read(buf, chunk.len() * vocab, &mut self.scores_host)?;
                    for (r, row) in all.chunks_exact(vocab).enumerate() {
                        got.push(token_logprobs(row, job.tokens[done + r + 1], *top));
                    }
                    anyhow::Ok(())
                })();
                if let Err(e) = scored {
                    // The pass may have written part of the cache.
                    slot.forget();
                    let id = slot.job.take().expect("a job").id;
                    let error = e.to_string();
                    events.push(Event::Failed { id, error });
                    continue;
                }
                slot.cached.extend_from_slice(chunk);
            }
            if slot.cached.len() == end {
                let (_, logprobs) = job.scoring.take().expect("scoring");
                let id = job.id;
                events.push(Event::PromptLogprobs { id, logprobs });
            }
        }
    }
}
