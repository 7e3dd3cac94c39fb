//! `qwen3 rerank`: documents scored against a query by Qwen3-Reranker's recipe, as
//! `/v1/rerank` scores them (`qwen3_inference::rerank`: the recipe's prompt around each pair, the
//! probability of "yes" against "no"), most relevant first, one JSON line each.

use super::args::DeviceArgs;
use super::device;
use super::embed::LastRows;
use super::tokenize::open_tokenizer;
use anyhow::{bail, Result};
use clap::Args;
use qwen3_inference::rerank::{Reranker, DEFAULT_INSTRUCTION};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct RerankArgs {
    /// Reranker model file written by `qwen3 export` (a Qwen3-Reranker checkpoint), or its
    /// repository id.
    pub model: PathBuf,
    /// The query.
    #[arg(short = 'q', long)]
    pub query: String,
    /// The documents to score.
    #[arg(required = true)]
    pub documents: Vec<String>,
    /// The task, in the recipe's `<Instruct>` (default: the model card's web-search one).
    #[arg(long)]
    pub instruction: Option<String>,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Say on stderr where it runs (the device, threads and kernels).
    #[arg(long)]
    pub verbose: bool,
}

pub fn run(args: RerankArgs) -> Result<()> {
    let device = device::parse(&args.on.device)?;
    let file = device::open(device, &args.model)?;
    let c = file.config();
    if c.embedding.is_some() {
        bail!(
            "{}: an embedding model; reranking needs a Qwen3-Reranker (a language model)",
            args.model.display()
        );
    }
    let tok = open_tokenizer(&args.model)?;
    let reranker = Reranker::new(&tok)?;
    let instruction = args.instruction.as_deref().unwrap_or(DEFAULT_INSTRUCTION);
    let context = super::args::context_len(None, c)?;
    let mut prompts = Vec::with_capacity(args.documents.len());
    for (i, doc) in args.documents.iter().enumerate() {
        let prompt = reranker.pair(&tok, instruction, &args.query, doc);
        if prompt.len() > context {
            bail!(
                "document {i} with the query is {} tokens; the context holds {context}",
                prompt.len()
            );
        }
        prompts.push(prompt);
    }
    let work = LastRows {
        prompts,
        context,
        logits: true,
        what: "document",
        verbose: args.verbose,
    };
    let rows = device::run_on(device, &file, None, work)?;
    let mut ranked: Vec<(usize, f64)> =
        rows.iter().map(|l| reranker.score(l)).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = std::io::stdout().lock();
    for (i, s) in ranked {
        let line = json!({"index": i, "relevance_score": s, "document": args.documents[i]});
        writeln!(out, "{line}")?;
    }
    Ok(())
}
