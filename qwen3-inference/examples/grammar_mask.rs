//! How long structured output's grammar work takes per token: building the vocabulary's trie,
//! compiling a grammar, and computing one next-token mask (`Constraint::prepare`), measured over
//! answers sampled from random logits (the mask's cost depends on the grammar's state, which
//! random text drives through long strings, numbers and every branch).
//!
//!     cargo run --release -p qwen3-inference --example grammar_mask -- \
//!         MODEL.tokenizer.bin VOCAB_SIZE SCHEMA.json [ANSWERS] [TOKENS]
//!
//! Prints the times and the mask's median, p99 and maximum over all masked tokens.

use anyhow::{Context, Result};
use qwen3_inference::constraint::{Grammar, Start, Vocabulary};
use qwen3_inference::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tok, vocab, schema, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: grammar_mask TOKENIZER VOCAB_SIZE SCHEMA.json [ANSWERS] [TOKENS]");
    };
    let answers: usize = rest.first().map_or(Ok(20), |a| a.parse())?;
    let limit: usize = rest.get(1).map_or(Ok(300), |a| a.parse())?;
    let n_logits: usize = vocab.parse()?;
    let tokenizer = Arc::new(Tokenizer::open(std::path::Path::new(tok))?);
    let eos = tokenizer
        .token_id("<|im_end|>")
        .context("no <|im_end|> in the tokenizer")?;
    let schema = serde_json::from_str(&std::fs::read_to_string(schema)?)?;
    let grammar = Grammar::JsonSchema(schema);

    let t = Instant::now();
    let vocabulary = Vocabulary::new(tokenizer.clone(), n_logits, eos)?;
    println!("vocabulary (trie of {n_logits} ids): {:.1} ms", ms(t));
    let t = Instant::now();
    vocabulary.constraint(&grammar, Start::NOW)?;
    println!("grammar compile: {:.2} ms", ms(t));

    let (mut times, mut applied) = (Vec::new(), Vec::new());
    let (mut ended, mut tokens, mut forced) = (0, 0, 0);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut logits = vec![0f32; n_logits];
    for _ in 0..answers {
        let mut c = vocabulary.constraint(&grammar, Start::NOW)?;
        for _ in 0..limit {
            let t = Instant::now();
            c.prepare();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            for l in logits.iter_mut() {
                // xorshift: cheap, deterministic random logits.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *l = (seed >> 40) as f32 / (1u64 << 24) as f32 * 8.0;
            }
            let t = Instant::now();
            c.mask(&mut logits, &[eos])?;
            applied.push(t.elapsed().as_secs_f64() * 1e3);
            let next = argmax(&logits);
            tokens += 1;
            if next == eos {
                ended += 1;
                break;
            }
            c.advance(next)?;
            let ff = c.forced(limit);
            forced += ff.len();
        }
    }
    println!("{answers} answers, {ended} ended, {tokens} sampled tokens + {forced} forced");
    for (what, mut t) in [
        ("computing the mask (beside the forward pass)", times),
        ("applying it to the logits (before sampling)", applied),
    ] {
        t.sort_by(f64::total_cmp);
        let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
        println!(
            "{what}: median {:.3} ms, p99 {:.3} ms, max {:.3} ms per sampled token",
            q(0.5),
            q(0.99),
            t[t.len() - 1]
        );
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}
