//! `qwen3 bench --draft-replay 2,4,8`: speculative decoding's ceiling on this machine.
//!
//! A draft the model always accepts shows what verifying several tokens in one step can give at
//! best: each thread count decodes the prompt greedily once, plainly (one token a step), then
//! again with that answer replayed as the draft (`Draft::Replay`), at each draft length. The
//! answer is the same token for token (checked); only the steps differ. What real drafts give
//! is this times their acceptance (docs/performance.md, "Speculative decoding").
//!
//! With `--draft-model`, each length also runs with that model's guesses, which shows what a
//! real draft model gives: its passes' cost and its share of right guesses together.

use super::args::BenchArgs;
use super::figures::median_spread;
use anyhow::{bail, Context, Result};
use qwen3_inference::backend::CPU;
use qwen3_inference::engine::{Draft, Engine, GenerationStats, Request};
use qwen3_inference::generate::generate;
use qwen3_inference::model::Model;
use qwen3_inference::sampler::SamplerConfig;

/// One thread count's figures: plain decode tok/s (median, spread), then each draft's: its
/// source, its length, its decode tok/s, and the share of the answer that came from guesses.
struct Line {
    threads: usize,
    plain: (f64, f64),
    drafts: Vec<(&'static str, usize, (f64, f64), f64)>,
}

/// Measures and prints (a table, or one JSON object with `--json`).
pub fn run(
    args: &BenchArgs,
    model: &Model,
    draft_model: Option<&Model>,
    prompt: &[u32],
    threads: &[usize],
) -> Result<()> {
    if args.draft_replay.contains(&0) {
        bail!("--draft-replay: draft lengths must be at least 1");
    }
    let ctx = args.prompt + args.decode;
    let mut lines = vec![];
    for &t in threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .context("cannot start the thread pool")?;
        let mut engine = pool.install(|| {
            let e = Engine::one_sequence(CPU, model, ctx, args.kv_cache.into())?;
            crate::commands::device::with_draft_model(e, draft_model)
        })?;
        let mut decode = |draft: Draft| -> Result<(Vec<u32>, GenerationStats)> {
            let request = Request {
                prompt: prompt.to_vec(),
                max_tokens: args.decode,
                sampler: SamplerConfig::greedy(),
                stop_ids: vec![],
                logprobs: None,
                constraint: None,
                prompt_logprobs: None,
                last_logits: false,
                draft,
                images: None,
            };
            let mut tokens = vec![];
            let stats = pool.install(|| {
                generate(&mut engine, request, |t| {
                    tokens.push(t);
                    Ok(true)
                })
            })?;
            Ok((tokens, stats))
        };
        // Plain first (its answer is the replay), then each draft; repeats alternate them.
        let (answer, _) = decode(Draft::None)?;
        let mut drafts: Vec<(&str, Draft)> = vec![];
        for &max in &args.draft_replay {
            let answer = answer.clone();
            drafts.push(("replay", Draft::Replay { answer, max }));
        }
        if draft_model.is_some() {
            for &max in &args.draft_replay {
                drafts.push(("model", Draft::Model { max }));
            }
        }
        let mut plain = vec![];
        let mut speeds: Vec<Vec<f64>> = vec![vec![]; drafts.len()];
        let mut shares = vec![0.0; drafts.len()];
        for _ in 0..args.repeats {
            plain.push(decode(Draft::None)?.1.decode_tok_s());
            for (j, (kind, draft)) in drafts.iter().enumerate() {
                let (tokens, stats) = decode(draft.clone())?;
                if tokens != answer {
                    bail!(
                        "{kind} drafts of {}: the answer differs from plain decoding's (a bug)",
                        draft.max()
                    );
                }
                speeds[j].push(stats.decode_tok_s());
                shares[j] = stats.accepted_tokens as f64 / stats.generated_tokens as f64;
            }
        }
        let plain = median_spread(&mut plain);
        let drafts = (drafts.iter().zip(&mut speeds).zip(shares))
            .map(|(((kind, d), v), share)| (*kind, d.max(), median_spread(v), share))
            .collect();
        lines.push(Line {
            threads: t,
            plain,
            drafts,
        });
    }
    if args.json {
        let runs: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| {
                serde_json::json!({
                    "threads": l.threads,
                    "plain_decode_tok_s": l.plain.0,
                    "drafts": l.drafts.iter().map(|(kind, max, (m, s), share)| serde_json::json!({
                        "draft": kind,
                        "draft_max": max,
                        "decode_tok_s": m,
                        "decode_spread": s,
                        "speedup": m / l.plain.0,
                        "tokens_from_drafts": share,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let out = serde_json::json!({
            "model": args.model.display().to_string(),
            "prompt_tokens": args.prompt,
            "decode_tokens": args.decode,
            "repeats": args.repeats,
            "isa": qwen3_inference::kernels::dot::dots().isa,
            "draft_replay": runs,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "speculative decoding: {} greedy tokens after a {}-token prompt; replay: the answer replayed as the draft (every draft accepted), the ceiling{}; medians of {}",
        args.decode,
        args.prompt,
        if draft_model.is_some() { "; model: the draft model's guesses" } else { "" },
        args.repeats
    );
    println!("threads  draft   max  decode tok/s  (spread)  x plain  answer tokens from drafts");
    for l in &lines {
        println!(
            "{:>7}  {:<6}  {:>4}  {:>12.1}  ({:>6.1})  {:>7.2}",
            l.threads, "none", "", l.plain.0, l.plain.1, 1.0
        );
        for (kind, max, (m, s), share) in &l.drafts {
            println!(
                "{:>7}  {:<6}  {:>4}  {:>12.1}  ({:>6.1})  {:>7.2}  {:>5.0}%",
                l.threads,
                kind,
                max,
                m,
                s,
                m / l.plain.0,
                100.0 * share
            );
        }
    }
    Ok(())
}
