//! The engine against the one-sequence path (`generate` over a `Session`, what
//! `qwen3 inference` runs): the same tokens, bit for bit, whatever runs beside a request.

use super::*;
use crate::backend::{CpuBackend, KvType, CPU};
use crate::format::ModelConfig;
use crate::format::{DType, ModelFile};
use crate::logprobs::token_logprobs;
use crate::model::{Model, Session};
use crate::sampler::argmax;
use crate::testing::model::{
    config, moe_config, qwen3_5_config, write_random, write_random_config,
};
use std::collections::HashMap;
use std::path::PathBuf;

pub(super) fn model_file(name: &str, dt: DType) -> (PathBuf, ModelFile) {
    let d = std::env::temp_dir().join(format!("pq-engine-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("m.bin");
    write_random(&p, dt);
    let f = ModelFile::open(&p).unwrap();
    (d, f)
}

/// A random model file of config `c`.
pub(super) fn model_file_of(name: &str, c: &ModelConfig) -> (PathBuf, ModelFile) {
    let d = std::env::temp_dir().join(format!("pq-engine-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("m.bin");
    write_random_config(&p, c);
    let f = ModelFile::open(&p).unwrap();
    (d, f)
}

fn engine<'m>(model: &'m Model<'m>, slots: usize, chunk: usize) -> Engine<'m, CpuBackend<'m>> {
    let fwd = Forward::new(CPU, model, 64, MAX_BATCH, slots, KvType::F32).unwrap();
    let cfg = EngineConfig {
        slots,
        max_queue: 64,
        prefill_chunk: chunk,
    };
    Engine::new(fwd, cfg).unwrap()
}

/// Test prompts of different lengths (the test model's vocabulary is 40 tokens; 0 is its EOS).
pub(super) fn prompts() -> Vec<Vec<u32>> {
    (0..6)
        .map(|i| {
            (0..3 + 5 * i)
                .map(|j| 1 + (j * 7 + i * 3) as u32 % 39)
                .collect()
        })
        .collect()
}

pub(super) fn request(prompt: &[u32], sampler: SamplerConfig) -> Request {
    Request {
        prompt: prompt.to_vec(),
        max_tokens: 12,
        sampler,
        stop_ids: vec![],
        logprobs: None,
        constraint: None,
        prompt_logprobs: None,
        last_logits: false,
        draft: Draft::None,
        images: None,
    }
}

/// Runs the engine until idle; returns each request's tokens and finish event.
fn drain<B: crate::backend::Backend>(e: &mut Engine<B>) -> HashMap<RequestId, (Vec<u32>, Event)> {
    let mut out: HashMap<RequestId, (Vec<u32>, Event)> = HashMap::new();
    let mut events = Vec::new();
    let mut steps = 0;
    while !e.is_idle() {
        e.step(&mut events);
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
        for ev in events.drain(..) {
            match ev {
                Event::Token { id, token, .. } => out.entry(id).or_default().0.push(token),
                Event::Finished { id, .. } | Event::Failed { id, .. } => {
                    out.entry(id).or_default().1 = ev
                }
                Event::Started { .. }
                | Event::PromptLogprobs { .. }
                | Event::Embedding { .. }
                | Event::Logits { .. } => {}
            }
        }
    }
    out
}

impl Default for Event {
    fn default() -> Self {
        Event::Started { id: 0, cached: 0 }
    }
}

pub(super) fn sampled(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        seed,
        ..SamplerConfig::greedy()
    }
}

/// Every request's tokens, run together with the others on 4 slots (prompts chunked by 5 while
/// others decode), equal the same request run alone, and the greedy ones equal `generate` on a
/// `Session`: for f32, bf16 and q8 weights, and for a Qwen3-MoE (f32, q8, q4), whose experts
/// run on the rows of every request that chose them at once.
#[test]
fn batch_invariance() {
    let cases = [
        config(DType::F32),
        config(DType::Bf16),
        config(DType::Q8),
        moe_config(DType::F32),
        moe_config(DType::Q8),
        moe_config(DType::Q4),
    ];
    for c in cases {
        let dt = c.dtype;
        let name = format!("{}-{dt}", c.architecture);
        let (dir, file) = model_file_of(&name, &c);
        let model = Model::load(&file).unwrap();
        let mut reqs = vec![];
        for (i, p) in prompts().iter().enumerate() {
            reqs.push(request(p, SamplerConfig::greedy()));
            reqs.push(request(p, sampled(i as u64)));
        }

        let mut alone = vec![];
        for r in &reqs {
            let mut e = engine(&model, 1, 128);
            let id = e.submit(r.clone()).unwrap();
            alone.push(drain(&mut e).remove(&id).unwrap());
        }
        let mut e = engine(&model, 4, 5);
        let ids: Vec<_> = reqs.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
        let mut together = drain(&mut e);
        for (i, id) in ids.iter().enumerate() {
            let (tokens, fin) = together.remove(id).unwrap();
            assert_eq!(tokens, alone[i].0, "{name} request {i}");
            assert!(
                matches!(&fin, Event::Finished { stats, .. } if stats.generated_tokens == 12),
                "{fin:?}"
            );
            assert_eq!(tokens.len(), 12);
        }

        // Greedy: the argmax of a Session's logits (the one-sequence forward pass, no engine),
        // token by token.
        for (i, r) in reqs.iter().enumerate().step_by(2) {
            let mut s = Session::new(CPU, &model, 64, KvType::F32).unwrap();
            let mut logits = s.forward(&r.prompt).unwrap().to_vec();
            let mut out = vec![];
            for _ in 0..12 {
                let t = argmax(&logits) as u32;
                out.push(t);
                logits = s.forward(&[t]).unwrap().to_vec();
            }
            assert_eq!(out, alone[i].0, "{name} request {i} against a Session");
        }
        // The samplers' seeds matter (the test can fail): two seeds, two answers.
        assert_ne!(alone[1].0, alone[3].0);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A request that starts with a finished one's prompt and answer reuses them (the prefix cache)
/// and gets the tokens a fresh engine gives.
#[test]
fn prefix_cache_reuses_and_matches() {
    let (dir, file) = model_file("prefix", DType::Q8);
    let model = Model::load(&file).unwrap();
    let p = &prompts()[3];
    let mut e = engine(&model, 2, 8);
    let first = e.submit(request(p, SamplerConfig::greedy())).unwrap();
    let answer = drain(&mut e).remove(&first).unwrap().0;
    // A finished request's prefix cache is held but not in use (a new request may take it).
    assert!(e.kv_bytes() > 0);
    assert_eq!(e.kv_usage(), 0.0);

    // The conversation resent: prompt, answer, and a new turn.
    let mut next = p.clone();
    next.extend(&answer);
    next.extend([5, 6, 7]);
    let id = e.submit(request(&next, SamplerConfig::greedy())).unwrap();
    let mut events = vec![];
    e.step(&mut events);
    // The last answer token was sampled, never fed: everything before it is cached.
    let cached = p.len() + answer.len() - 1;
    assert_eq!(events[0], Event::Started { id, cached });
    // Running now, in the one slot that holds tokens: its positions of 2 slots x 64.
    let held: usize = (0..2).map(|i| e.slot_tokens(i).len()).sum();
    assert!(held > cached);
    assert_eq!(e.kv_usage(), held as f64 / 128.0);
    let mut rest = drain(&mut e);
    let mut tokens: Vec<u32> = events
        .iter()
        .filter_map(|ev| match ev {
            Event::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    tokens.extend(rest.remove(&id).unwrap().0);

    let mut fresh = engine(&model, 1, 128);
    let fid = fresh
        .submit(request(&next, SamplerConfig::greedy()))
        .unwrap();
    assert_eq!(tokens, drain(&mut fresh).remove(&fid).unwrap().0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn stops_queue_and_cancel() {
    let (dir, file) = model_file("stops", DType::F32);
    let model = Model::load(&file).unwrap();
    let p = prompts()[1].clone();
    let mut e = engine(&model, 1, 128);
    let id = e.submit(request(&p, SamplerConfig::greedy())).unwrap();
    let tokens = drain(&mut e).remove(&id).unwrap().0;

    // An end-of-sequence id: not reported, and the reason says which.
    let mut r = request(&p, SamplerConfig::greedy());
    r.stop_ids = vec![tokens[2]];
    let id = e.submit(r).unwrap();
    let (got, fin) = drain(&mut e).remove(&id).unwrap();
    let first = tokens.iter().position(|&t| t == tokens[2]).unwrap();
    assert_eq!(got, tokens[..first]);
    assert!(matches!(&fin, Event::Finished { stats, .. }
        if stats.stop == StopReason::Eos(tokens[2]) && stats.generated_tokens == first + 1));

    // The context: 64 positions, so a prompt of 60 leaves room for 4 fed tokens and a 5th
    // sampled one.
    let long: Vec<u32> = (0..60).map(|i| 1 + i % 39).collect();
    let mut r = request(&long, SamplerConfig::greedy());
    r.max_tokens = 100;
    let id = e.submit(r).unwrap();
    let (got, fin) = drain(&mut e).remove(&id).unwrap();
    assert_eq!(got.len(), 5);
    assert!(matches!(&fin, Event::Finished { stats, .. } if stats.stop == StopReason::ContextFull));

    // Refusals.
    let bad = |prompt: Vec<u32>| request(&prompt, SamplerConfig::greedy());
    assert!(matches!(e.submit(bad(vec![])), Err(Rejected::Invalid(_))));
    assert!(matches!(
        e.submit(bad(vec![1; 65])),
        Err(Rejected::Invalid(_))
    ));
    assert!(matches!(e.submit(bad(vec![40])), Err(Rejected::Invalid(_))));
    let mut e = Engine::new(
        Forward::new(CPU, &model, 64, MAX_BATCH, 1, KvType::F32).unwrap(),
        EngineConfig {
            slots: 1,
            max_queue: 2,
            prefill_chunk: 8,
        },
    )
    .unwrap();
    // One free slot and a queue of two: the fourth is refused.
    let a = e.submit(bad(p.clone())).unwrap();
    let b = e.submit(bad(p.clone())).unwrap();
    let c = e.submit(bad(p.clone())).unwrap();
    assert_eq!(e.submit(bad(p.clone())), Err(Rejected::QueueFull));

    // Cancel the running one after a step; the queued ones take its slot in turn.
    let mut events = vec![];
    e.step(&mut events);
    assert_eq!((e.running(), e.queued()), (1, 2));
    e.cancel(a);
    let done = drain(&mut e);
    assert!(!done.contains_key(&a));
    assert_eq!(done[&b].0, tokens);
    assert_eq!(done[&c].0, tokens);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Log-probabilities come with each token when asked: the log-softmax of the logits a
/// one-sequence `Session` computes for the same context, and the same bits whether the request
/// runs alone or beside others. Refused past `MAX_TOP` alternatives.
#[test]
fn logprobs_are_the_log_softmax_of_the_logits_in_any_batch() {
    let (d, f) = model_file("logprobs", DType::F32);
    let model = Model::load(&f).unwrap();
    let run = |slots: usize, ids: &[usize]| -> Vec<Vec<(u32, Box<TokenLogprobs>)>> {
        let mut e = engine(&model, slots, 4);
        let mut reqs = vec![];
        for (k, &i) in ids.iter().enumerate() {
            let mut r = request(&prompts()[i], sampled(40 + i as u64));
            r.logprobs = Some(k % 4);
            reqs.push(e.submit(r).unwrap());
        }
        let mut got: HashMap<RequestId, Vec<(u32, Box<TokenLogprobs>)>> = HashMap::new();
        let mut events = Vec::new();
        while !e.is_idle() {
            e.step(&mut events);
            for ev in events.drain(..) {
                if let Event::Token {
                    id,
                    token,
                    logprobs,
                } = ev
                {
                    got.entry(id)
                        .or_default()
                        .push((token, logprobs.expect("asked for")));
                }
            }
        }
        reqs.iter()
            .map(|id| got.remove(id).unwrap_or_default())
            .collect()
    };
    let all = [0, 1, 2, 3, 4, 5];
    let batched = run(4, &all);
    for (k, &i) in all.iter().enumerate() {
        // Alone, with the same number of alternatives asked for.
        let mut e = engine(&model, 1, 4);
        let mut r = request(&prompts()[i], sampled(40 + i as u64));
        r.logprobs = Some(k % 4);
        let id = e.submit(r).unwrap();
        let mut alone = vec![];
        let mut events = Vec::new();
        while !e.is_idle() {
            e.step(&mut events);
            for ev in events.drain(..) {
                if let Event::Token {
                    id: j,
                    token,
                    logprobs,
                } = ev
                {
                    assert_eq!(j, id);
                    alone.push((token, logprobs.unwrap()));
                }
            }
        }
        assert_eq!(batched[k], alone, "request {k}");
        // Against the log-softmax of a Session's logits over the same context.
        let mut context = prompts()[i].clone();
        for (token, lp) in &alone {
            let mut s = Session::new(CPU, &model, 64, KvType::F32).unwrap();
            let logits = s.forward(&context).unwrap().to_vec();
            assert_eq!(
                **lp,
                crate::logprobs::token_logprobs(&logits, *token, k % 4)
            );
            assert_eq!(lp.top.len(), k % 4);
            context.push(*token);
        }
    }
    let mut e = engine(&model, 1, 4);
    let mut r = request(&prompts()[0], sampled(1));
    r.logprobs = Some(MAX_TOP + 1);
    assert!(matches!(e.submit(r), Err(Rejected::Invalid(m)) if m.contains("at most 20")));
    std::fs::remove_dir_all(d).unwrap();
}

/// A request that asks for its prompt's log-probabilities gets, before its first token, one
/// entry per prompt token after the first: equal to the log-softmax of that position's logits
/// from a `Session` (the one-sequence path), whether it ran alone or among other requests, in
/// chunks of 5 positions; its answer is the one it gets without asking; `max_tokens: 0` ends it
/// after the scores.
#[test]
fn prompt_logprobs_equal_the_session_logits() {
    let (_d, f) = model_file("prompt-logprobs", DType::F32);
    let model = Model::load(&f).unwrap();
    let mut e = engine(&model, 3, 5);
    let mut want = Vec::new();
    let mut ids = Vec::new();
    for (i, p) in prompts().iter().enumerate() {
        let mut s = Session::new(CPU, &model, 64, KvType::F32).unwrap();
        let logits = s.forward_all_logits(p).unwrap();
        let v = logits.len() / p.len();
        let lp: Vec<TokenLogprobs> = (1..p.len())
            .map(|k| token_logprobs(&logits[(k - 1) * v..k * v], p[k], 3))
            .collect();
        want.push(lp);
        // Every other request runs beside them without asking.
        let plain = e.submit(request(p, SamplerConfig::greedy())).unwrap();
        let mut r = request(p, SamplerConfig::greedy());
        r.prompt_logprobs = Some(3);
        r.max_tokens = if i == 2 { 0 } else { 12 };
        ids.push((e.submit(r).unwrap(), plain));
    }
    let mut events = Vec::new();
    let mut got: HashMap<RequestId, (Option<Vec<TokenLogprobs>>, Vec<u32>)> = HashMap::new();
    while !e.is_idle() {
        e.step(&mut events);
        for ev in events.drain(..) {
            match ev {
                Event::PromptLogprobs { id, logprobs } => {
                    let g = got.entry(id).or_default();
                    assert!(g.0.is_none() && g.1.is_empty(), "scores after a token");
                    g.0 = Some(logprobs);
                }
                Event::Token { id, token, .. } => got.entry(id).or_default().1.push(token),
                Event::Failed { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    }
    for (i, (scored, plain)) in ids.into_iter().enumerate() {
        let (lp, tokens) = got.remove(&scored).unwrap();
        assert_eq!(lp.unwrap(), want[i], "prompt {i}");
        let answer = got.remove(&plain).map(|g| g.1).unwrap_or_default();
        if i == 2 {
            assert!(tokens.is_empty(), "max_tokens 0 generated {tokens:?}");
        } else {
            assert_eq!(tokens, answer, "prompt {i}: the answer changed");
        }
    }
}

/// Prompt rows go to the oldest request first, not to the lowest slot: a request admitted into
/// a slot that just freed does not overtake one still reading its prompt (which a steady stream
/// of new requests could otherwise delay forever).
#[test]
fn prompts_are_read_oldest_first() {
    let (_d, f) = model_file("fifo", DType::F32);
    let model = Model::load(&f).unwrap();
    let mut e = engine(&model, 2, 64);
    let budget = e.forward().max_batch();
    let long = |seed: u32| -> Vec<u32> {
        (0..budget as u32 - 4)
            .map(|j| 1 + (j * 7 + seed) % 39)
            .collect()
    };
    // How many of `prompt`'s tokens its slot holds.
    let read = |e: &Engine<CpuBackend>, prompt: &[u32]| -> usize {
        (0..2)
            .map(|i| e.slot_tokens(i))
            .find(|t| !t.is_empty() && prompt.starts_with(t))
            .map_or(0, |t| t.len())
    };
    let (a, b, c) = (long(1), long(2), long(3));
    // A fills the first step's budget but for 4 rows, which B takes.
    let mut ra = request(&a, SamplerConfig::greedy());
    ra.max_tokens = 1;
    e.submit(ra).unwrap();
    e.submit(request(&b, SamplerConfig::greedy())).unwrap();
    let mut events = Vec::new();
    e.step(&mut events);
    assert_eq!((read(&e, &a), read(&e, &b)), (budget - 4, 4));
    // A's answer is its one token: its slot frees, and C takes it.
    while e.running() == 2 {
        e.step(&mut events);
    }
    e.submit(request(&c, SamplerConfig::greedy())).unwrap();
    e.step(&mut events);
    // B, older, read the rest of its prompt in this step; C got what was left.
    assert_eq!(read(&e, &b), budget - 4, "B waited behind C");
    assert_eq!(read(&e, &c), 8);
}

/// Runs the engine until idle; returns each request's token events (log-probabilities
/// included, ids 0) and its stats, and how many steps it took.
pub(super) fn run_tokens<B: crate::backend::Backend>(
    e: &mut Engine<B>,
) -> (HashMap<RequestId, (Vec<Event>, GenerationStats)>, usize) {
    let mut out: HashMap<RequestId, (Vec<Event>, Option<GenerationStats>)> = HashMap::new();
    let (mut events, mut steps) = (Vec::new(), 0);
    while !e.is_idle() {
        e.step(&mut events);
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
        for ev in events.drain(..) {
            match ev {
                // The id set to 0: runs of one request on different engines compare equal.
                Event::Token {
                    id,
                    token,
                    logprobs,
                } => {
                    let ev = Event::Token {
                        id: 0,
                        token,
                        logprobs,
                    };
                    out.entry(id).or_default().0.push(ev)
                }
                Event::Finished { id, stats } => out.entry(id).or_default().1 = Some(stats),
                Event::Failed { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    }
    let out = out.into_iter().map(|(id, (t, s))| (id, (t, s.unwrap())));
    (out.collect(), steps)
}

mod failures;
mod hybrid;
mod speculative;
