//! Speculative decoding's drafts change nothing but the number of steps.

use super::*;

/// Speculative decoding changes nothing but the number of steps: with prompt-lookup drafts, and
/// with replayed answers (all right, or wrong every third token, so that drafts are rejected and
/// the cache rolled back), every request's tokens and log-probabilities (the logits after each
/// rollback) equal plain decoding's, greedy and seeded sampling, alone and four at a time
/// (prompts chunked by 5), for f32, bf16 and q8 weights, and for a Qwen3.5 in f32 and q8 (its
/// Gated DeltaNets' states taken back too).
#[test]
fn drafts_change_nothing_but_the_steps() {
    // Qwen3.5's hybrid layers too: a rejected draft takes their states back
    // (`Engine::roll_back_rejected_drafts`).
    let configs = [
        config(DType::F32),
        config(DType::Bf16),
        config(DType::Q8),
        qwen3_5_config(DType::F32),
        qwen3_5_config(DType::Q8),
    ];
    for c in configs {
        let dt = format!("{} {}", c.architecture, c.dtype);
        let (dir, file) = model_file_of(&format!("draft-{}-{}", c.architecture, c.dtype), &c);
        let model = Model::load(&file).unwrap();
        // Prompts that say everything twice: prompt lookup finds something to propose.
        let mut reqs = vec![];
        for (i, p) in prompts().iter().take(4).enumerate() {
            let p = [&p[..], &p[..]].concat();
            let (mut greedy, mut sampled) = (
                request(&p, SamplerConfig::greedy()),
                request(&p, sampled(i as u64)),
            );
            greedy.logprobs = Some(3);
            for r in [&mut greedy, &mut sampled] {
                r.max_tokens = 16;
                reqs.push(r.clone());
            }
        }
        let with_logits = |slots: usize, chunk: usize, draft_max: usize| {
            let logits = (slots * (1 + draft_max)).min(MAX_BATCH);
            let fwd = Forward::new(CPU, &model, 64, MAX_BATCH, logits, KvType::F32).unwrap();
            let cfg = EngineConfig {
                slots,
                max_queue: 64,
                prefill_chunk: chunk,
            };
            Engine::new(fwd, cfg).unwrap()
        };
        let mut plain = vec![];
        let mut plain_steps = 0;
        for r in &reqs {
            let mut e = with_logits(1, 128, 0);
            let id = e.submit(r.clone()).unwrap();
            let (mut out, steps) = run_tokens(&mut e);
            plain.push(out.remove(&id).unwrap().0);
            plain_steps += steps;
        }
        let answer = |i: usize| -> Vec<u32> {
            plain[i]
                .iter()
                .map(|ev| match ev {
                    Event::Token { token, .. } => *token,
                    _ => unreachable!(),
                })
                .collect()
        };
        type Kind = fn(Vec<u32>) -> Draft;
        let kinds: [(&str, Kind); 3] = [
            ("ngram", |_| Draft::Ngram { max: 4 }),
            ("replay", |answer| Draft::Replay { answer, max: 4 }),
            ("wrong replay", |answer| {
                let answer = answer
                    .iter()
                    .enumerate()
                    .map(|(j, &t)| if j % 3 == 2 { (t + 1) % 40 } else { t })
                    .collect();
                Draft::Replay { answer, max: 4 }
            }),
        ];
        for (kind, draft) in kinds {
            let drafted_reqs: Vec<Request> = reqs
                .iter()
                .enumerate()
                .map(|(i, r)| Request {
                    draft: draft(answer(i)),
                    ..r.clone()
                })
                .collect();
            let (mut drafted, mut accepted, mut steps) = (0, 0, 0);
            for (i, r) in drafted_reqs.iter().enumerate() {
                let mut e = with_logits(1, 128, 4);
                let id = e.submit(r.clone()).unwrap();
                let (mut out, s) = run_tokens(&mut e);
                let (tokens, stats) = out.remove(&id).unwrap();
                assert_eq!(tokens, plain[i], "{dt} {kind} request {i} alone");
                (drafted, accepted, steps) = (
                    drafted + stats.drafted_tokens,
                    accepted + stats.accepted_tokens,
                    steps + s,
                );
            }
            let mut e = with_logits(4, 5, 4);
            let ids: Vec<_> = drafted_reqs
                .iter()
                .map(|r| e.submit(r.clone()).unwrap())
                .collect();
            let mut together = run_tokens(&mut e).0;
            for (i, id) in ids.iter().enumerate() {
                assert_eq!(
                    together.remove(id).unwrap().0,
                    plain[i],
                    "{dt} {kind} request {i} of 4"
                );
            }
            match kind {
                // Every draft accepted: about 5 tokens a step.
                "replay" => assert!(
                    accepted == drafted && drafted > 0 && steps * 3 < plain_steps,
                    "{drafted} {accepted} {steps} {plain_steps}"
                ),
                "wrong replay" => {
                    assert!(0 < accepted && accepted < drafted, "{drafted} {accepted}")
                }
                _ => assert!(drafted > 0, "{kind}: no drafts"),
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
