//! `qwen3 bench --draft-replay 2,4,8`: speculative decoding's ceiling on this machine.
//!
//! A draft the model always accepts shows what verifying several tokens in one step can give at
//! best: each thread count decodes the prompt greedily once, plainly (one token a step), then
//! again with that answer replayed as the draft (`Draft::Replay`), at each draft length. The
//! answer is the same token for token (checked); only the steps differ. What real drafts give
//! is this times their acceptance (docs/performance.md, "Speculative decoding").

use super::bench::{median_spread, BenchArgs};
use anyhow::{bail, Context, Result};
use qwen3_inference::backend::CPU;
use qwen3_inference::engine::{Draft, Engine, GenerationStats, Request};
use qwen3_inference::generate::generate;
use qwen3_inference::model::Model;
use qwen3_inference::sampler::SamplerConfig;

/// One thread count's figures: plain decode tok/s, then each draft length's.
struct Line {
    threads: usize,
    plain: (f64, f64),
    drafts: Vec<(usize, (f64, f64), f64)>,
}

/// Measures and prints (a table, or one JSON object with `--json`).
pub fn run(args: &BenchArgs, model: &Model, prompt: &[u32], threads: &[usize]) -> Result<()> {
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
        let mut engine =
            pool.install(|| Engine::one_sequence(CPU, model, ctx, args.kv_cache.into()))?;
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
        // Plain first (its answer is the replay), then each length; repeats alternate them.
        let (answer, _) = decode(Draft::None)?;
        let mut plain = vec![];
        let mut drafted: Vec<Vec<f64>> = vec![vec![]; args.draft_replay.len()];
        let mut accepted = vec![0.0; args.draft_replay.len()];
        for _ in 0..args.repeats {
            plain.push(decode(Draft::None)?.1.decode_tok_s());
            for (j, &max) in args.draft_replay.iter().enumerate() {
                let replay = Draft::Replay {
                    answer: answer.clone(),
                    max,
                };
                let (tokens, stats) = decode(replay)?;
                if tokens != answer {
                    bail!("draft length {max}: the answer differs from plain decoding's (a bug)");
                }
                drafted[j].push(stats.decode_tok_s());
                accepted[j] = stats.accepted_tokens as f64 / stats.generated_tokens as f64;
            }
        }
        let plain = median_spread(&mut plain);
        let drafts = (args.draft_replay.iter().zip(&mut drafted).zip(accepted))
            .map(|((&max, v), share)| (max, median_spread(v), share))
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
                    "drafts": l.drafts.iter().map(|(max, (m, s), share)| serde_json::json!({
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
        "speculative decoding's ceiling: {} greedy tokens after a {}-token prompt, the answer replayed as the draft (every draft accepted), medians of {}",
        args.decode, args.prompt, args.repeats
    );
    println!("threads  draft max  decode tok/s  (spread)  x plain  answer tokens from drafts");
    for l in &lines {
        println!(
            "{:>7}  {:>9}  {:>12.1}  ({:>6.1})  {:>7.2}",
            l.threads, "none", l.plain.0, l.plain.1, 1.0
        );
        for (max, (m, s), share) in &l.drafts {
            println!(
                "{:>7}  {:>9}  {:>12.1}  ({:>6.1})  {:>7.2}  {:>5.0}%",
                l.threads,
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
