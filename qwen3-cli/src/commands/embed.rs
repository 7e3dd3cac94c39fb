//! `qwen3 embed`: an embedding model's vectors of texts, one JSON line each, as `/v1/embeddings`
//! computes them (the same engine: each text a prefill-only sequence, several at once; the last
//! token's output, unit length if the model says so; `--dimensions` keeps the first N values
//! at length 1).
//!
//! Texts come from `-i` (repeatable), else from the lines of `-f FILE` (`-` for stdin), else
//! from the lines of stdin. A query's instruction is the caller's to prepend, as the model card
//! says: `-i "Instruct: Given a web search query, retrieve relevant passages that answer the
//! query\nQuery: ..."`.

use super::args::DeviceArgs;
use super::device::{self, OnDevice, Place};
use super::input::read_text;
use super::tokenize::open_tokenizer;
use anyhow::{bail, Result};
use clap::Args;
use qwen3_inference::backend::{Backend, KvType};
use qwen3_inference::engine::{Engine, EngineConfig, Event, Request};
use qwen3_inference::model::{Model, MAX_BATCH};
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
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Say on stderr where it runs (the device, threads and kernels).
    #[arg(long)]
    pub verbose: bool,
}

/// Texts embedded, or pairs reranked, at once (each a sequence of the engine).
const SLOTS: usize = 8;

pub fn run(args: EmbedArgs) -> Result<()> {
    let device = device::parse(&args.on.device)?;
    let file = device::open(device, &args.model)?;
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
    let context = super::args::context_len(args.context, c)?;
    let mut prompts = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let prompt = tok.encode_with_special_tokens(t);
        if prompt.len() > context {
            bail!(
                "text {i} has {} tokens; the context holds {context} (-c)",
                prompt.len()
            );
        }
        prompts.push(prompt);
    }
    let work = LastRows {
        prompts,
        context,
        logits: false,
        what: "text",
        verbose: args.verbose,
    };
    let vectors = device::run_on(device, &file, None, work)?;
    let mut out = std::io::stdout().lock();
    for (i, mut v) in vectors.into_iter().enumerate() {
        if let Some(n) = args.dimensions {
            qwen3_inference::embedding::truncate(&mut v, n);
        }
        writeln!(out, "{}", json!({"index": i, "embedding": v}))?;
    }
    Ok(())
}

/// The last row of each prompt, run as prefill-only sequences of an engine of [`SLOTS`]
/// sequences on whichever device was asked: the final norm's output (`logits: false`, an
/// embedding model's vector) or the logits (`logits: true`, the reranker's); `what` names a
/// prompt in an error ("text 3: ...").
pub(super) struct LastRows {
    pub prompts: Vec<Vec<u32>>,
    pub context: usize,
    pub logits: bool,
    pub what: &'static str,
    /// `--verbose`: say where it runs.
    pub verbose: bool,
}

impl OnDevice for LastRows {
    type Out = Vec<Vec<f32>>;

    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        _draft: Option<&'m Model<'m, B::Tensor>>,
        place: &Place,
    ) -> Result<Self::Out> {
        if self.verbose {
            eprintln!("device: {}", place.about);
        }
        let cfg = EngineConfig {
            slots: SLOTS,
            max_queue: self.prompts.len().max(1),
            prefill_chunk: MAX_BATCH,
        };
        let mut engine =
            device::engine(backend, model, None, self.context, cfg, SLOTS, KvType::F32)?;
        last_rows(&mut engine, self.prompts, self.logits, self.what)
    }
}

/// Runs each prompt through `engine` as a request with nothing to generate
/// ([`Request::prefill_only`]) and returns their last rows in order: an embedding model's
/// vectors, or with `logits` the logits at each prompt's last position (`qwen3 rerank`). `what`
/// names a prompt in errors ("text 3").
fn last_rows<B: Backend>(
    engine: &mut Engine<B>,
    prompts: Vec<Vec<u32>>,
    logits: bool,
    what: &str,
) -> Result<Vec<Vec<f32>>> {
    let mut ids = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.into_iter().enumerate() {
        let id = engine.submit(Request::prefill_only(p, logits));
        ids.push(id.map_err(|e| anyhow::anyhow!("{what} {i}: {e}"))?);
    }
    let mut rows = vec![None; ids.len()];
    let mut events = Vec::new();
    while !engine.is_idle() {
        engine.step(&mut events);
        for ev in events.drain(..) {
            let (id, row) = match ev {
                Event::Embedding { id, vector } => (id, vector),
                Event::Logits { id, logits } => (id, logits),
                Event::Failed { error, .. } => bail!("{error}"),
                _ => continue,
            };
            let i = ids
                .iter()
                .position(|&x| x == id)
                .expect("a request of ours");
            rows[i] = Some(row);
        }
    }
    rows.into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| anyhow::anyhow!("{what} {i} ended without its last row")))
        .collect()
}
