//! One completion: run the whole prompt (prefill), then sample and feed one token at a time
//! (decode) until an end-of-sequence id, the token limit, or the end of the context.

use crate::backend::Backend;
use crate::model::Session;
use crate::sampler::Sampler;
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this end-of-sequence id (one of the model file's `eos_token_ids`).
    Eos(u32),
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// Every position of the session's context is used.
    ContextFull,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Eos(id) => write!(f, "end-of-sequence token {id}"),
            StopReason::MaxTokens => write!(f, "token limit reached"),
            StopReason::ContextFull => write!(f, "context full"),
        }
    }
}

/// What happened, for the summary line.
#[derive(Debug, Clone)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Tokens sampled, an end-of-sequence token included.
    pub generated_tokens: usize,
    /// Time of the prompt's forward pass.
    pub prefill: Duration,
    /// From the start to the first sampled token (prefill plus one sampling step).
    pub time_to_first_token: Duration,
    /// From the first sampled token to the last: `generated_tokens - 1` decode steps.
    pub decode: Duration,
    /// Time spent in the sampler, all tokens together (included in the times above).
    pub sampling: Duration,
    /// Candidates the sampler's filters kept, summed over the sampled tokens.
    pub kept_candidates: usize,
    pub stop: StopReason,
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64()
    }

    /// Tokens per second after the first one (each is one forward pass with t = 1 and a sample).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64()
    }
}

/// Runs `prompt` at the session's current position, then generates up to `max_tokens` tokens,
/// calling `on_token` with each one as it is produced (end-of-sequence ids are not passed on).
///
/// The prompt is run in full before anything is sampled. `max_tokens == 0` runs the prompt and
/// generates nothing (useful to time prefill).
pub fn generate<B: Backend>(
    session: &mut Session<B>,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_tokens: usize,
    eos_ids: &[u32],
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<GenerationStats> {
    if prompt.is_empty() {
        bail!("the prompt is empty: give at least one token");
    }
    let free = session.context_len() - session.pos();
    if prompt.len() > free {
        bail!(
            "the prompt has {} tokens but only {free} of the {} context positions are free (raise -c/--context)",
            prompt.len(),
            session.context_len()
        );
    }
    // Every token the model has seen in this call: the repetition penalty's scope.
    let mut context = Vec::with_capacity(prompt.len() + max_tokens.min(free) + 1);
    context.extend_from_slice(prompt);

    // Prefill: the whole prompt in one forward pass; only the last position's logits are used.
    let start = Instant::now();
    let mut logits = session.forward(prompt)?;
    let prefill = start.elapsed();
    let mut first_token_at = None;
    let mut sampling = Duration::ZERO;
    let mut kept_candidates = 0;

    let stop = loop {
        if context.len() - prompt.len() == max_tokens {
            break StopReason::MaxTokens;
        }
        let t = Instant::now();
        let next = sampler.sample(logits, &context, &context[prompt.len()..]);
        sampling += t.elapsed();
        kept_candidates += sampler.last_kept();
        first_token_at.get_or_insert_with(|| start.elapsed());
        context.push(next);
        if eos_ids.contains(&next) {
            break StopReason::Eos(next);
        }
        on_token(next)?;
        if context.len() - prompt.len() == max_tokens {
            break StopReason::MaxTokens;
        }
        if session.pos() == session.context_len() {
            break StopReason::ContextFull;
        }
        // Decode: feed the sampled token at the next position.
        logits = session.forward(&[next])?;
    };
    let total = start.elapsed();
    let time_to_first_token = first_token_at.unwrap_or(total);
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        generated_tokens: context.len() - prompt.len(),
        prefill,
        time_to_first_token,
        decode: total - time_to_first_token,
        sampling,
        kept_candidates,
        stop,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DType, ModelFile};
    use crate::model::test_model::write_random;
    use crate::model::Model;
    use crate::sampler::{argmax, SamplerConfig};

    fn greedy() -> Sampler {
        Sampler::new(SamplerConfig::greedy()).unwrap()
    }

    #[test]
    fn stops_for_each_reason() {
        let dir = std::env::temp_dir().join(format!("pq-generate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.bin");
        write_random(&p, DType::F32);
        let file = ModelFile::open(&p).unwrap();
        let model = Model::load(&file).unwrap();
        let prompt = [3u32, 14, 15, 9];

        // Token limit; every token passed on; greedy output is the argmax of each step's logits.
        let mut s = Session::new(&model, 32).unwrap();
        let mut out = vec![];
        let st = generate(&mut s, &mut greedy(), &prompt, 6, &[], |t| {
            out.push(t);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, out.len()),
            (StopReason::MaxTokens, 6, 6)
        );
        // The last sampled token is not fed: 4 prompt + 5 fed.
        assert_eq!(s.pos(), 9);
        let mut check = Session::new(&model, 32).unwrap();
        let mut seq = prompt.to_vec();
        for &t in &out {
            let logits = check.forward_all_logits(&seq).unwrap();
            let last = &logits[(seq.len() - 1) * 40..];
            assert_eq!(argmax(last) as u32, t);
            check.truncate(0).unwrap();
            seq.push(t);
        }

        // End of sequence: make the first greedy token an EOS id; nothing is passed on.
        let mut s = Session::new(&model, 32).unwrap();
        let st = generate(&mut s, &mut greedy(), &prompt, 6, &[out[0]], |_| {
            panic!("EOS must not be emitted")
        })
        .unwrap();
        assert_eq!((st.stop, st.generated_tokens), (StopReason::Eos(out[0]), 1));

        // Context full: 4 prompt tokens in a context of 7 leave room for 3 more fed tokens, so
        // the 4th sampled token fills the last slot's successor and stops.
        let mut s = Session::new(&model, 7).unwrap();
        let st = generate(&mut s, &mut greedy(), &prompt, 100, &[], |_| Ok(())).unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, s.pos()),
            (StopReason::ContextFull, 4, 7)
        );

        // -n 0: prefill only.
        let mut s = Session::new(&model, 32).unwrap();
        let st = generate(&mut s, &mut greedy(), &prompt, 0, &[], |_| Ok(())).unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, s.pos()),
            (StopReason::MaxTokens, 0, 4)
        );

        // A prompt that does not fit, or none: errors.
        let mut s = Session::new(&model, 3).unwrap();
        let e = generate(&mut s, &mut greedy(), &prompt, 1, &[], |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("context positions are free"), "{e}");
        assert!(generate(&mut s, &mut greedy(), &[], 1, &[], |_| Ok(())).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
