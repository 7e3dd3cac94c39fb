//! Penalties for tokens already seen, applied to the logits before anything else:
//! HuggingFace's repetition penalty and OpenAI's presence and frequency penalties.

use super::SamplerConfig;

/// The penalties' memory between tokens: which token ids were already penalised in this call, so
/// that an id repeated in the context is penalised once. `marks[token] == stamp` means "done";
/// a new call takes a new stamp instead of clearing `[vocab]` marks.
#[derive(Default)]
pub(super) struct Penalties {
    marks: Vec<u32>,
    stamp: u32,
}

impl SamplerConfig {
    /// Whether any penalty is set (otherwise the logits are read in place, never copied).
    pub(super) fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

impl Penalties {
    /// Applies `cfg`'s penalties to `logits` (`[vocab]`) in place. `context` is every token the
    /// model has seen (the repetition penalty's scope, as in HF); `generated` the generated part
    /// (the presence and frequency penalties' scope, as in OpenAI's API).
    pub(super) fn apply(
        &mut self,
        cfg: &SamplerConfig,
        logits: &mut [f32],
        context: &[u32],
        generated: &[u32],
    ) {
        let vocab = logits.len();
        if self.marks.len() != vocab {
            self.marks = vec![0; vocab];
            self.stamp = 0;
        }
        // Repetition (Keskar et al. 2019): l / rp when positive, l * rp when negative, so that
        // rp > 1 always makes a seen token less likely. Once per distinct id.
        let rp = cfg.repetition_penalty;
        if rp != 1.0 {
            let stamp = self.next_stamp();
            for &t in context {
                let t = t as usize;
                if t < vocab && self.marks[t] != stamp {
                    self.marks[t] = stamp;
                    let l = &mut logits[t];
                    *l = if *l < 0.0 { *l * rp } else { *l / rp };
                }
            }
        }
        // Presence: l - pp for every distinct generated id.
        let pp = cfg.presence_penalty;
        if pp != 0.0 {
            let stamp = self.next_stamp();
            for &t in generated {
                let t = t as usize;
                if t < vocab && self.marks[t] != stamp {
                    self.marks[t] = stamp;
                    logits[t] -= pp;
                }
            }
        }
        // Frequency: once per occurrence, a token generated three times loses 3 * fp.
        let fp = cfg.frequency_penalty;
        if fp != 0.0 {
            for &t in generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= fp;
                }
            }
        }
    }

    fn next_stamp(&mut self) -> u32 {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // After 2^32 stamps an old mark could equal the new one: start over.
            self.marks.fill(0);
            self.stamp = 1;
        }
        self.stamp
    }
}
