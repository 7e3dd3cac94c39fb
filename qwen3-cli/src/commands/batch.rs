//! `qwen3 batch <model.bin> <input.jsonl> -o <output.jsonl>`: a file of OpenAI Batch API requests
//! through the server's routes and batching engine, without a network (`qwen3_server::batch`).
//! On a terminal a progress bar (done/total, tokens/s, ETA) on stderr; on a pipe, nothing but the
//! results in the output file.

use super::serve::{prepare, EngineArgs};
use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qwen3_server::batch::{self, Progress};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct BatchArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests, one JSON object a line: {"custom_id", "method": "POST", "url":
    /// "/v1/chat/completions" or "/v1/completions", "body"}.
    pub input: PathBuf,
    /// Where results are appended, one a line; the custom_ids already there are skipped.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

pub fn run(args: BatchArgs) -> Result<()> {
    if args.output == args.input {
        bail!("-o {}: that is the input file", args.output.display());
    }
    let (state, commands, worker) = prepare(args.engine, None)?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} requests, {msg}, ETA {eta}")
                .expect("a valid template"),
        );
        b
    });
    let (start, tokens) = (Instant::now(), Arc::new(AtomicU64::new(0)));
    let shown = bar.clone();
    let summary = batch::run(
        state,
        commands,
        worker,
        &args.input,
        &args.output,
        move |p| {
            let Some(b) = &shown else { return };
            match p {
                Progress::Total {
                    to_run,
                    already_done,
                } => {
                    b.set_length(to_run);
                    if already_done > 0 {
                        b.println(format!("{already_done} already in the output: skipped"));
                    }
                }
                Progress::Done { completion_tokens } => {
                    let t =
                        tokens.fetch_add(completion_tokens, Ordering::Relaxed) + completion_tokens;
                    b.set_message(format!(
                        "{:.1} tok/s",
                        t as f64 / start.elapsed().as_secs_f64()
                    ));
                    b.inc(1);
                }
            }
        },
    )?;
    if let Some(b) = bar {
        b.finish();
    }
    // One line, on a terminal or not: what this run did.
    eprintln!(
        "qwen3 batch: {} written to {} ({} of them invalid lines), {} already there, {} failed",
        summary.written,
        args.output.display(),
        summary.invalid,
        summary.skipped,
        summary.failed
    );
    if summary.failed > 0 {
        bail!(
            "{} failed in the model and were not written (rerun to retry them); the first: {}",
            if summary.failed == 1 {
                "1 request".to_string()
            } else {
                format!("{} requests", summary.failed)
            },
            summary.first_failure.unwrap_or_default()
        );
    }
    Ok(())
}
