//! `qwen3`: the pico-qwen command line. One file per command under `commands/`.

mod commands;
mod hub;

use clap::{Parser, Subcommand};
use commands::{
    args, batch, bench, chat_template, detokenize, embed, export, inference, info, models,
    perplexity, rerank, serve, tokenize,
};

/// Run HuggingFace Qwen3 models from a compact INT8 file, on the CPU.
#[derive(Parser)]
#[command(name = "qwen3", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a HuggingFace Qwen3 checkpoint directory into a model file and its companions.
    Export(export::ExportArgs),
    /// Print what a model file holds: config, sizes, companion files (and tensors with --tensors).
    Info(info::InfoArgs),
    /// Run the model: one completion (`-m generate`) or a terminal chat (`-m chat`).
    Inference(args::InferenceArgs),
    /// A conversation in the terminal: the same as `inference -m chat`.
    #[command(mut_arg("mode", |a| a.hide(true)))]
    Chat(args::InferenceArgs),
    /// Complete a prompt once: the same as `inference -m generate`.
    #[command(mut_arg("mode", |a| a.hide(true)))]
    Generate(args::InferenceArgs),
    /// Encode text into token ids with the model's tokenizer.
    Tokenize(tokenize::TokenizeArgs),
    /// Decode token ids into text with the model's tokenizer.
    Detokenize(detokenize::DetokenizeArgs),
    /// Render a conversation (HuggingFace messages JSON) with the model's chat template.
    ChatTemplate(chat_template::ChatTemplateArgs),
    /// Measure prefill and decode speed against this machine's memory bandwidth.
    Bench(bench::BenchArgs),
    /// An embedding model's vectors of texts, one JSON line each.
    Embed(embed::EmbedArgs),
    /// Documents scored against a query by a Qwen3-Reranker, most relevant first.
    Rerank(rerank::RerankArgs),
    /// Score a text: perplexity, and with --base the KL divergence from a higher-precision file.
    Perplexity(perplexity::PerplexityArgs),
    /// Serve the model over an OpenAI-compatible HTTP API, batching concurrent requests.
    Serve(serve::ServeArgs),
    /// Run a file of OpenAI Batch API requests through the same engine, results to a file.
    Batch(batch::BatchArgs),
    /// List the models exported by name (`qwen3 chat Qwen/Qwen3-0.6B`) in the models directory,
    /// and ollama's (`qwen3 chat qwen3:0.6b-q8_0`).
    List(models::ListArgs),
    /// Remove models exported by name, with their tokenizer and template files.
    Rm(models::RmArgs),
}

/// A model given by its repository id (`Qwen/Qwen3-0.6B`) as the model file it was, or now is,
/// exported to in the models directory (`$QWEN3_MODELS_DIR`), as `chat` and `serve` take it.
fn by_name(model: &mut std::path::PathBuf) -> anyhow::Result<()> {
    *model = hub::models::resolve(model, None, false)?;
    Ok(())
}

/// Restores the default action for SIGPIPE (terminate quietly), which Rust's runtime sets to
/// "ignore". Without this, `qwen3 inference ... | head -1` would make the next write to stdout
/// fail and `println!` panic, instead of the process simply ending like any Unix filter.
#[cfg(unix)]
fn restore_sigpipe() {
    // SAFETY: `signal` with SIG_DFL installs no handler code of ours; it is called first thing in
    // `main`, before any other thread exists, so nothing races with the change of disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}

/// Runs `f` on a thread of a rayon pool of `threads` threads (default: as many as cores, or
/// `RAYON_NUM_THREADS`).
///
/// The forward pass's parallel loops (a few hundred a token) then run with the calling thread
/// taking part and the others stealing from it. Called from the main thread instead, each loop
/// would hand its work to the pool, wake a worker and put the main thread to sleep until the loop
/// ends: a futex wake and a sleep per loop, which showed in decode's profile (measured:
/// docs/performance.md, "The thread team").
fn on_worker_thread(
    threads: Option<usize>,
    f: impl FnOnce() -> anyhow::Result<()> + Send,
) -> anyhow::Result<()> {
    if threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the thread pool: {e}"))?
        .install(f)
}

fn main() {
    restore_sigpipe();
    let cli = Cli::parse();
    // A kernel family forced by QWEN3_KERNELS that this CPU lacks: one line, before any work.
    if let Err(e) = qwen3_inference::kernels::dot::requested() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let result = match cli.command {
        Command::Export(a) => export::run(a),
        Command::Info(mut a) => by_name(&mut a.model).and_then(|()| info::run(a)),
        Command::Inference(a) => on_worker_thread(a.on.threads, || inference::run(a)),
        Command::Chat(a) => args::with_mode(a, args::Mode::Chat, "chat")
            .and_then(|a| on_worker_thread(a.on.threads, || inference::run(a))),
        Command::Generate(a) => args::with_mode(a, args::Mode::Generate, "generate")
            .and_then(|a| on_worker_thread(a.on.threads, || inference::run(a))),
        Command::Tokenize(mut a) => by_name(&mut a.model).and_then(|()| tokenize::run(a)),
        Command::Detokenize(mut a) => by_name(&mut a.model).and_then(|()| detokenize::run(a)),
        Command::ChatTemplate(mut a) => by_name(&mut a.model).and_then(|()| chat_template::run(a)),
        Command::Bench(mut a) => by_name(&mut a.model).and_then(|()| bench::run(a)),
        Command::Perplexity(mut a) => by_name(&mut a.model)
            .and_then(|()| on_worker_thread(a.on.threads, || perplexity::run(a))),
        Command::Embed(mut a) => {
            by_name(&mut a.model).and_then(|()| on_worker_thread(a.on.threads, || embed::run(a)))
        }
        Command::Rerank(mut a) => {
            by_name(&mut a.model).and_then(|()| on_worker_thread(a.on.threads, || rerank::run(a)))
        }
        Command::Serve(a) => serve::run(a),
        Command::Batch(a) => batch::run(a),
        Command::List(a) => models::list(a),
        Command::Rm(a) => models::rm(a),
    };
    if let Err(e) = result {
        // One line: the chain of contexts, outermost first ("file: problem: cause").
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
