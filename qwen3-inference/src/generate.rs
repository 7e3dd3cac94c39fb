//! One completion, as the CLI runs it: submit one request to an [`Engine`] and step it until the
//! request ends, passing each token on as it comes. The decode loop itself is the engine's (the
//! same one the server runs for many requests): prefill, then sample and feed one token at a time
//! until an end-of-sequence id, the token limit, or the end of the context.

use crate::backend::Backend;
use crate::engine::{Engine, Event, Request};
use crate::logprobs::TokenLogprobs;
use anyhow::{anyhow, bail, Result};

// How a request ended is the engine's to say (the CLI's summary line and the server's
// `finish_reason` read the same two types); re-exported where the CLI has always found them.
pub use crate::engine::{GenerationStats, StopReason};

/// Runs `request` on `engine` (which should have nothing else to do) until it ends, calling
/// `on_token` with each token as it is produced (end-of-sequence ids are not passed on).
/// `on_token` returns whether to go on: `false` ends the request with [`StopReason::Stopped`].
///
/// The prompt is run in full before anything is sampled. `max_tokens == 0` runs the prompt and
/// generates nothing (useful to time prefill).
pub fn generate<B: Backend>(
    engine: &mut Engine<B>,
    request: Request,
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<GenerationStats> {
    generate_until(engine, request, || false, |id, _| on_token(id))
}

/// [`generate`], asking `interrupted()` after every step of the engine as well: a step is a
/// token, or a chunk of at most `MAX_BATCH` prompt tokens (model/forward/mod.rs), so a user's Ctrl-C
/// during a long prompt acts within one chunk rather than after the whole prefill. When it says
/// yes the request ends with [`StopReason::Stopped`]. `on_token` also gets the token's
/// log-probabilities when the request asks for them (`Request::logprobs`).
pub fn generate_until<B: Backend>(
    engine: &mut Engine<B>,
    request: Request,
    mut interrupted: impl FnMut() -> bool,
    mut on_token: impl FnMut(u32, Option<&TokenLogprobs>) -> Result<bool>,
) -> Result<GenerationStats> {
    let ctx = engine.context_len();
    if request.prompt.len() > ctx {
        bail!(
            "the prompt has {} tokens but the context holds {ctx} (raise -c/--context)",
            request.prompt.len()
        );
    }
    let id = engine.submit(request).map_err(|e| anyhow!(e))?;
    let mut events = Vec::with_capacity(8);
    loop {
        engine.step(&mut events);
        let mut go_on = true;
        for ev in events.drain(..) {
            match ev {
                Event::Token {
                    id: i,
                    token,
                    logprobs,
                } if i == id && go_on => {
                    go_on = match on_token(token, logprobs.as_deref()) {
                        Ok(g) => g,
                        Err(e) => {
                            engine.cancel(id);
                            return Err(e);
                        }
                    }
                }
                Event::Finished { id: i, stats } if i == id => return Ok(stats),
                Event::Failed { id: i, error } if i == id => bail!("{error}"),
                _ => {}
            }
        }
        if !go_on || interrupted() {
            if let Some(stats) = engine.stop(id) {
                return Ok(stats);
            }
        }
        if engine.is_idle() {
            bail!("the request ended without a result (a bug in the engine)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CpuBackend, KvType, CPU};
    use crate::engine::{Engine, EngineConfig};
    use crate::format::{DType, ModelFile};
    use crate::model::{Forward, Model, Session, MAX_BATCH};
    use crate::sampler::{argmax, SamplerConfig};
    use crate::testing::model::write_random;

    fn engine<'m>(model: &'m Model<'m>, ctx: usize) -> Engine<'m, CpuBackend<'m>> {
        let fwd = Forward::new(CPU, model, ctx, MAX_BATCH, 1, KvType::F32).unwrap();
        Engine::new(
            fwd,
            EngineConfig {
                slots: 1,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn request(prompt: &[u32], max_tokens: usize, stop_ids: &[u32]) -> Request {
        Request {
            prompt: prompt.to_vec(),
            max_tokens,
            sampler: SamplerConfig::greedy(),
            stop_ids: stop_ids.to_vec(),
            logprobs: None,
            constraint: None,
            prompt_logprobs: None,
            last_logits: false,
            draft: crate::engine::Draft::None,
            images: None,
        }
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
        let mut e = engine(&model, 32);
        let mut out = vec![];
        let st = generate(&mut e, request(&prompt, 6, &[]), |t| {
            out.push(t);
            Ok(true)
        })
        .unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, out.len()),
            (StopReason::MaxTokens, 6, 6)
        );
        // The last sampled token is not fed: 4 prompt + 5 fed.
        assert_eq!(e.slot_tokens(0).len(), 9);
        let mut check = Session::new(CPU, &model, 32, KvType::F32).unwrap();
        let mut seq = prompt.to_vec();
        for &t in &out {
            let logits = check.forward_all_logits(&seq).unwrap();
            let last = &logits[(seq.len() - 1) * 40..];
            assert_eq!(argmax(last) as u32, t);
            check.truncate(0).unwrap();
            seq.push(t);
        }

        // End of sequence: make the first greedy token an EOS id; nothing is passed on.
        let mut e = engine(&model, 32);
        let st = generate(&mut e, request(&prompt, 6, &[out[0]]), |_| {
            panic!("EOS must not be emitted")
        })
        .unwrap();
        assert_eq!((st.stop, st.generated_tokens), (StopReason::Eos(out[0]), 1));

        // Context full: 4 prompt tokens in a context of 7 leave room for 3 more fed tokens, so
        // the 4th sampled token fills the last slot's successor and stops.
        let mut e = engine(&model, 7);
        let st = generate(&mut e, request(&prompt, 100, &[]), |_| Ok(true)).unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, e.slot_tokens(0).len()),
            (StopReason::ContextFull, 4, 7)
        );

        // The caller stops after two tokens.
        let mut e = engine(&model, 32);
        let mut n = 0;
        let st = generate(&mut e, request(&prompt, 100, &[]), |_| {
            n += 1;
            Ok(n < 2)
        })
        .unwrap();
        assert_eq!((st.stop, st.generated_tokens), (StopReason::Stopped, 2));

        // -n 0: prefill only.
        let mut e = engine(&model, 32);
        let st = generate(&mut e, request(&prompt, 0, &[]), |_| Ok(true)).unwrap();
        assert_eq!(
            (st.stop, st.generated_tokens, e.slot_tokens(0).len()),
            (StopReason::MaxTokens, 0, 4)
        );

        // A prompt that does not fit, or none: errors.
        let mut e = engine(&model, 3);
        let err = generate(&mut e, request(&prompt, 1, &[]), |_| Ok(true)).unwrap_err();
        assert!(err.to_string().contains("context holds 3"), "{err}");
        assert!(generate(&mut e, request(&[], 1, &[]), |_| Ok(true)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
