//! `qwen3 embed`: an embedding model's vectors of texts, one JSON line each, as `/v1/embeddings`
//! computes them (the same engine: each text a prefill-only sequence, several at once; the last
//! token's output, unit length if the model says so; `--dimensions` keeps the first N values
//! at length 1).
//!
//! Texts come from `-i` (repeatable), else from the lines of `-f FILE` (`-` for stdin), else
//! from the lines of stdin. A query's instruction is the caller's to prepend, as the model card
//! says: `-i "Instruct: Given a web search query, retrieve relevant passages that answer the
//! query\nQuery: ..."`.

use super::args::DEFAULT_CONTEXT_CAP;
use super::input::read_text;
use super::tokenize::open_tokenizer;
use anyhow::{bail, Result};
use clap::Args;
use qwen3_inference::backend::{KvType, CPU};
use qwen3_inference::engine::{Engine, EngineConfig, Event, Request};
use qwen3_inference::format::ModelFile;
use qwen3_inference::model::{Forward, Model, MAX_BATCH};
use qwen3_inference::sampler::SamplerConfig;
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Args)]
pub struct EmbedArgs {
    /// Embedding model file written by `qwen3 export` (a Qwen3-Embedding checkpoint), or its
    /// repository id.
    pub model: PathBuf,
    /// A text to embed (repeat for more).
    #[arg(short = 'i', long = "input")]
    pub inputs: Vec<String>,
    /// A file of texts, one per line (`-` for stdin).
    #[arg(short = 'f', long = "file", conflicts_with = "inputs")]
    pub file: Option<PathBuf>,
    /// Keep the first N values of each vector, scaled back to length 1.
    #[arg(long)]
    pub dimensions: Option<usize>,
    /// Most tokens of one text (default: the model's maximum, capped at 4096).
    #[arg(short = 'c', long)]
    pub context: Option<usize>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Texts embedded at once (each a sequence of the engine).
const SLOTS: usize = 8;

pub fn run(args: EmbedArgs) -> Result<()> {
    let file = ModelFile::open(&args.model)?;
    let c = file.config();
    if c.embedding.is_none() {
        bail!(
            "{}: a text generation model, not an embedding model (export a Qwen3-Embedding checkpoint)",
            args.model.display()
        );
    }
    let dim = c.hidden_size as usize;
    if args.dimensions.is_some_and(|n| n == 0 || n > dim) {
        bail!("--dimensions must be in 1 ..= {dim} (this model's vectors)");
    }
    let tok = open_tokenizer(&args.model)?;
    let texts: Vec<String> = if !args.inputs.is_empty() {
        args.inputs.clone()
    } else if let Some(path) = &args.file {
        read_text(path)?.lines().map(str::to_string).collect()
    } else {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    };
    let max_ctx = c.max_context() as usize;
    let context = args.context.unwrap_or(max_ctx.min(DEFAULT_CONTEXT_CAP));
    if context == 0 || context > max_ctx {
        bail!("--context must be in 1 ..= {max_ctx}");
    }
    let model = Model::load(&file)?;
    let fwd = Forward::new(CPU, &model, context, MAX_BATCH, SLOTS, KvType::F32)?;
    let cfg = EngineConfig {
        slots: SLOTS,
        max_queue: texts.len().max(1),
        prefill_chunk: MAX_BATCH,
    };
    let mut engine = Engine::new(fwd, cfg)?;
    let mut ids = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let prompt = tok.encode_with_special_tokens(t);
        if prompt.len() > context {
            bail!(
                "text {i} has {} tokens; the context holds {context} (-c)",
                prompt.len()
            );
        }
        let req = Request {
            prompt,
            max_tokens: 0,
            sampler: SamplerConfig::greedy(),
            stop_ids: vec![],
            logprobs: None,
            constraint: None,
            prompt_logprobs: None,
            last_logits: false,
        };
        ids.push(
            engine
                .submit(req)
                .map_err(|e| anyhow::anyhow!("text {i}: {e}"))?,
        );
    }
    let mut vectors = vec![None; texts.len()];
    let mut events = Vec::new();
    while !engine.is_idle() {
        engine.step(&mut events);
        for ev in events.drain(..) {
            match ev {
                Event::Embedding { id, vector } => {
                    let i = ids
                        .iter()
                        .position(|&x| x == id)
                        .expect("a request of ours");
                    vectors[i] = Some(vector);
                }
                Event::Failed { error, .. } => bail!("{error}"),
                _ => {}
            }
        }
    }
    let mut out = std::io::stdout().lock();
    for (i, v) in vectors.into_iter().enumerate() {
        let Some(mut v) = v else {
            bail!("text {i} ended without its vector");
        };
        if let Some(n) = args.dimensions {
            qwen3_server::embeddings::truncate(&mut v, n);
        }
        writeln!(out, "{}", json!({"index": i, "embedding": v}))?;
    }
    Ok(())
}
