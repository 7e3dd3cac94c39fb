//! A hybrid model (Qwen3.5's Gated DeltaNets) in the engine: chunked prompts, snapshots.

use super::*;

/// A hybrid model (Qwen3.5's layers): every request's tokens, run four at a time with prompts
/// cut while others decode, equal the same request alone and (greedy) a `Session`'s, with prompts
/// longer than one and two chunks of the delta rule (`Engine::prompt_piece` cuts them where a
/// chunk starts). A conversation resent resumes at the snapshot of its states (the prompt's last
/// multiple of 64) and gets a fresh engine's tokens. (Drafts: `drafts_change_nothing_but_the_steps`.)
#[test]
fn hybrid_models_batch_and_restart_their_state() {
    for dt in [DType::F32, DType::Q8] {
        let c = ModelConfig {
            max_position_embeddings: 256,
            ..qwen3_5_config(dt)
        };
        let (dir, file) = model_file_of(&format!("hybrid-{dt}"), &c);
        let model = Model::load(&file).unwrap();
        let engine = |slots: usize, chunk: usize| {
            let fwd = Forward::new(CPU, &model, 256, MAX_BATCH, slots, KvType::F32).unwrap();
            let cfg = EngineConfig {
                slots,
                max_queue: 64,
                prefill_chunk: chunk,
            };
            Engine::new(fwd, cfg).unwrap()
        };
        let prompts: Vec<Vec<u32>> = [5, 70, 150, 20, 64, 129]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| 1 + (j * 7 + i * 5) as u32 % 39).collect())
            .collect();
        let mut reqs = vec![];
        for (i, p) in prompts.iter().enumerate() {
            reqs.push(request(p, SamplerConfig::greedy()));
            reqs.push(request(p, sampled(i as u64)));
        }
        let mut alone = vec![];
        for r in &reqs {
            let mut e = engine(1, 128);
            let id = e.submit(r.clone()).unwrap();
            alone.push(drain(&mut e).remove(&id).unwrap().0);
        }
        let mut e = engine(4, 5);
        let ids: Vec<_> = reqs.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
        let mut together = drain(&mut e);
        for (i, id) in ids.iter().enumerate() {
            let tokens = together.remove(id).unwrap().0;
            assert_eq!(tokens, alone[i], "{dt} request {i}");
        }
        for (i, r) in reqs.iter().enumerate().step_by(2) {
            let mut s = Session::new(CPU, &model, 256, KvType::F32).unwrap();
            let mut logits = s.forward(&r.prompt).unwrap().to_vec();
            let mut out = vec![];
            for _ in 0..12 {
                let t = argmax(&logits) as u32;
                out.push(t);
                logits = s.forward(&[t]).unwrap().to_vec();
            }
            assert_eq!(out, alone[i], "{dt} request {i} against a Session");
        }

        // A conversation resent after its answer (a 70-token prompt): its first 64 tokens
        // reused, a fresh engine's tokens.
        let mut e = engine(1, 128);
        let id = e.submit(reqs[2].clone()).unwrap();
        let answer = drain(&mut e).remove(&id).unwrap().0;
        let mut next = reqs[2].prompt.clone();
        next.extend(&answer);
        next.extend([5, 6, 7]);
        let resent = Request {
            last_logits: true,
            ..request(&next, SamplerConfig::greedy())
        };
        let id = e.submit(resent.clone()).unwrap();
        let mut events = vec![];
        e.step(&mut events);
        assert_eq!(events[0], Event::Started { id, cached: 64 });
        // The first answer token's logits, bit for bit a fresh engine's (the states taken back
        // to position 64 matter: the state at the end of the first answer gives others).
        let first_logits = |events: &[Event]| {
            events.iter().find_map(|ev| match ev {
                Event::Logits { logits, .. } => Some(logits.clone()),
                _ => None,
            })
        };
        let mut fresh = engine(1, 128);
        fresh.submit(resent).unwrap();
        let mut fresh_events = vec![];
        while first_logits(&fresh_events).is_none() {
            fresh.step(&mut fresh_events);
        }
        assert_eq!(first_logits(&events), first_logits(&fresh_events));
        let mut tokens: Vec<u32> = events
            .iter()
            .filter_map(|ev| match ev {
                Event::Token { token, .. } => Some(*token),
                _ => None,
            })
            .collect();
        tokens.extend(drain(&mut e).remove(&id).unwrap().0);
        let mut fresh = engine(1, 128);
        let fid = fresh
            .submit(request(&next, SamplerConfig::greedy()))
            .unwrap();
        assert_eq!(tokens, drain(&mut fresh).remove(&fid).unwrap().0);

        std::fs::remove_dir_all(dir).unwrap();
    }
}
