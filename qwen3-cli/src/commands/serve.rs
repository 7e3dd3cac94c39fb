//! `qwen3 serve <model.bin>`: an OpenAI-compatible HTTP server (the `qwen3-server` crate) over
//! the continuous-batching engine. This file reads the model's files and starts the worker; see
//! docs/serve.md for what the server does.

use super::args::{DeviceArgs, DraftArgs, KvCacheArg};
use super::device::{self, OnDevice, Place};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, KvType};
use qwen3_inference::engine::{logit_rows, EngineConfig};
use qwen3_inference::model::{Model, MAX_BATCH};
use qwen3_inference::rerank::Reranker;
use qwen3_server::listen::Limits;
use qwen3_server::metrics::Metrics;
use qwen3_server::state::{Grammars, ModelInfo};
use qwen3_server::worker::{self, Command};
use qwen3_server::{AppState, ServeOptions};
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// `--parallel`'s default.
pub const SERVE_SLOTS: usize = 4;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on. The default answers this machine only; 0.0.0.0 answers every
    /// network the machine is on (set --api-key then).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (printed when ready).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health and the page (default:
    /// the QWEN3_API_KEY environment variable, if set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Do not answer `/` with the chat page.
    #[arg(long)]
    pub no_ui: bool,
    /// Let web pages from ORIGIN (`https://app.example`) call the API from a browser; repeat
    /// for more, or `*` for any page on the web. Default: none (the chat page at `/` is the
    /// server's own and needs none). A page that may call a server without --api-key may use
    /// the model.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Serve `/v1/rerank` with Qwen3-Reranker's recipe (the model must be a Qwen3-Reranker, or
    /// a Qwen3 model asked the same yes-or-no question).
    #[arg(long)]
    pub rerank: bool,
    /// Connections held at once; a new one beyond them gets a 503 and is closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a request's line and headers may take to arrive (an idle keep-alive connection
    /// is closed after as long).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive (408 after them).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub body_timeout: f64,
    /// `GET /metrics` needs no key even with `--api-key` (for scrapers that send none, such as
    /// the Kubernetes Gateway API's endpoint picker).
    #[arg(long)]
    pub public_metrics: bool,
    /// A model that sees images: the most one chat request may carry (400 beyond them; 0 takes
    /// none).
    #[arg(long, default_value_t = qwen3_server::images::MAX_IMAGES, value_name = "N")]
    pub max_images: usize,
    /// A model that sees images: the most pixels an image may decode to before it is resized
    /// (400 beyond them): what one image may cost in memory while it is decoded.
    #[arg(long, default_value_t = qwen3_inference::vision::MAX_SOURCE_PIXELS, value_name = "N")]
    pub max_image_pixels: u64,
    /// A model that sees images: the most bytes one image file may have, as a data URL or
    /// fetched (400 beyond them; 20 MiB, OpenAI's limit). A request's body is also bounded (64
    /// MiB, base64 taking 4 bytes for 3).
    #[arg(long, default_value_t = qwen3_server::images::MAX_IMAGE_BYTES, value_name = "BYTES")]
    pub max_image_bytes: usize,
    /// A model that sees images: fetch images given as http(s) URLs (each within
    /// --max-image-bytes, a request's all within 30 s, redirects followed). Off by default: the
    /// server then reaches nothing outside itself and takes images as data URLs only. With it,
    /// the server requests whatever address a client names, its own network included: turn it
    /// on for trusted clients only.
    #[arg(long)]
    pub fetch_image_urls: bool,
    /// On SIGTERM or Ctrl-C: seconds the requests already held may take to finish (new ones get
    /// a 503 and /health turns 503 meanwhile); what still runs after them is ended. 0 ends
    /// them at once.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub shutdown_timeout: f64,
}

/// The model and how the engine runs it: `qwen3 serve`'s and `qwen3 batch`'s.
#[derive(Args)]
pub struct EngineArgs {
    /// Model file written by `qwen3 export` (its tokenizer and template files beside it), or a
    /// HuggingFace repository id (Qwen/Qwen3-0.6B), exported once into --models-dir and reused.
    pub model: PathBuf,
    /// Where models given by repository id are exported (default: $QWEN3_MODELS_DIR, else
    /// $XDG_DATA_HOME/qwen3/models, i.e. ~/.local/share/qwen3/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// With a repository id: use the HuggingFace cache only, never the network.
    #[arg(long)]
    pub offline: bool,
    /// Sequences generated at once, each with its own KV cache; more requests wait.
    #[arg(long, default_value_t = SERVE_SLOTS)]
    pub parallel: usize,
    /// Speculative decoding for every request that does not send `"speculative": false`.
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Requests that may wait for a free sequence; beyond them the server answers 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Context of each sequence (prompt + answer). Default: the model's maximum, capped at 4096.
    #[arg(short = 'c', long)]
    pub context: Option<usize>,
    /// What the KV caches store keys and values as: f32 (exact) or bf16 (half the memory).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache: KvCacheArg,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// The model id that /v1/models lists and requests name (default: the repository id the
    /// model was given as, else the model file's stem).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Prompt tokens a step takes while other sequences are generating: smaller keeps their
    /// streams smoother, larger reads a new prompt sooner.
    #[arg(long, default_value_t = 32)]
    pub prefill_chunk: usize,
}

pub fn run(args: ServeArgs) -> Result<()> {
    // The listener's timeouts and limits first: a bad one is refused before the model is read
    // (the address is checked when it is bound).
    let seconds = |name: &str, s: f64| {
        if s.is_finite() && s > 0.0 && s <= 86_400.0 {
            Ok(Duration::from_secs_f64(s))
        } else {
            bail!("--{name} {s}: must be a number of seconds in (0, 86400]")
        }
    };
    let body_timeout = seconds("body-timeout", args.body_timeout)?;
    if args.max_connections == 0 {
        bail!("--max-connections 0: at least one connection must be allowed");
    }
    let opts = ServeOptions {
        host: args.host,
        port: args.port,
        limits: Limits {
            max_connections: args.max_connections,
            header_timeout: seconds("header-timeout", args.header_timeout)?,
        },
        shutdown_timeout: if args.shutdown_timeout == 0.0 {
            Duration::ZERO
        } else {
            seconds("shutdown-timeout", args.shutdown_timeout)?
        },
    };
    if args.max_image_bytes == 0 {
        bail!("--max-image-bytes must be at least 1 (--max-images 0 takes no images)");
    }
    if args.fetch_image_urls && !qwen3_server::images::FETCHES {
        bail!("--fetch-image-urls: this build fetches nothing (built without the `hub` feature)");
    }
    let api_key = args
        .api_key
        .or_else(|| std::env::var("QWEN3_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let (mut state, commands, worker) = prepare(args.engine, api_key)?;
    // Then the flags that depend on the model.
    state.ui = !args.no_ui;
    state.cors = args.cors;
    state.public_metrics = args.public_metrics;
    state.max_images = args.max_images;
    state.max_image_pixels = args.max_image_pixels;
    state.max_image_bytes = args.max_image_bytes;
    state.body_timeout = body_timeout;
    if args.fetch_image_urls && state.images.is_none() {
        bail!("--fetch-image-urls: this model takes no images (its file has no vision tower, or the device does not run one)");
    }
    state.fetch_image_urls = args.fetch_image_urls;
    if args.rerank {
        if state.embeds {
            bail!("--rerank needs a language model (Qwen3-Reranker), not an embedding model");
        }
        state.reranker = Some(Reranker::new(state.tokenizer).context("--rerank")?);
    }
    qwen3_server::serve(opts, state, commands, worker)
}

/// What the worker thread runs: builds the engine there and serves its commands.
pub type Worker = Box<dyn FnOnce(Receiver<Command>) -> Result<()> + Send>;

/// Reads the model's files, checks the flags, and makes the handlers' state, the command
/// channel's receiving end, and the worker (the engine is built once here too, so that a bad
/// setting fails before anything listens or runs).
pub fn prepare(
    mut args: EngineArgs,
    api_key: Option<String>,
) -> Result<(AppState, Receiver<Command>, Worker)> {
    // A repository id: served under that name, from its export.
    if let Some(repo) = crate::hub::models::as_repo(&args.model) {
        args.model_name.get_or_insert(repo.id);
    }
    args.model =
        crate::hub::models::resolve(&args.model, args.models_dir.as_deref(), args.offline)?;
    let device = device::parse(&args.on.device)?;
    let second = args.draft.draft_model.is_some().then_some("--draft-model");
    device::check(device, args.kv_cache, second)?;
    if args.parallel == 0 || args.parallel > MAX_BATCH {
        bail!(
            "--parallel must be in 1 ..= {MAX_BATCH}, got {}",
            args.parallel
        );
    }
    if args.on.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    // Shared with the image encoder, which copies the tower out of it at the first image.
    let file = std::sync::Arc::new(device::open(device, &args.model)?);
    let c = file.config().clone();
    // The drafts' flags checked before a draft model is opened (or exported from the hub).
    let draft = args.draft.draft()?;
    let draft_file =
        args.draft
            .open_model(&args.model, args.models_dir.as_deref(), args.offline)?;
    let context_len = super::args::context_len(args.context, &c)?;
    let tokenizer = super::model_text::tokenizer(&args.model)?;
    // A model exported without a chat template still serves /v1/completions.
    let template = super::model_text::template(&args.model)?;
    let chat_stop_ids = match &template {
        Some(t) => super::chat::stop_ids(&c.eos_token_ids, t, &tokenizer),
        None => c.eos_token_ids.clone(),
    };
    let thinking_template = template
        .as_ref()
        .is_some_and(|t| t.default_thinking().is_some());
    let xml_tool_calls = template.as_ref().is_some_and(|t| t.xml_tool_calls());
    let model_name = match args.model_name {
        Some(n) => n,
        None => args
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .context("the model path has no file name")?,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let state = AppState {
        model_name,
        tokenizer: Box::leak(Box::new(tokenizer)),
        template,
        thinking_template,
        xml_tool_calls,
        eos_ids: c.eos_token_ids.clone(),
        chat_stop_ids,
        defaults: c.generation.clone(),
        context_len,
        slots: args.parallel,
        max_queue: args.queue,
        api_key,
        created: qwen3_server::job::unix_now(),
        commands: tx,
        metrics: metrics.clone(),
        ui: false,
        grammars: Grammars::new(c.vocab_size as usize),
        cors: vec![],
        body_timeout: Duration::from_secs(60),
        reranker: None,
        embeds: c.embedding.is_some(),
        info: ModelInfo::of(&file, &args.model),
        // A backend that does not take images (the CUDA one, yet) serves the text only, and
        // says so to an image. The tower is copied out of the file at the first image.
        images: if device::takes_images(device) {
            qwen3_inference::vision::ImageEncoder::at_first_image(file.clone())
        } else {
            None
        },
        draining: Default::default(),
        public_metrics: false,
        max_images: qwen3_server::images::MAX_IMAGES,
        max_image_pixels: qwen3_inference::vision::MAX_SOURCE_PIXELS,
        fetch_image_urls: false,
        max_image_bytes: qwen3_server::images::MAX_IMAGE_BYTES,
        draft,
    };
    let cfg = EngineConfig {
        slots: args.parallel,
        max_queue: args.queue,
        prefill_chunk: args.prefill_chunk,
    };
    let kv = args.kv_cache.into();
    // The engine is built on the worker thread, inside a rayon pool of `--threads` threads (the
    // kernels' parallel loops then run with the worker taking part, as `qwen3 inference` does).
    // It is built before the server listens, so a bad setting fails here, not at the first
    // request.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.on.threads.unwrap_or(0))
        .build()
        .map_err(|e| anyhow!("cannot start the thread pool: {e}"))?;
    let serve = Serve {
        context_len,
        cfg,
        kv,
        worker: None,
    };
    // On the CPU the engine is built once here, so that a bad setting fails before anything
    // listens (on a GPU the worker's thread must be the one that loads it).
    if device == Device::Cpu {
        device::run_on(
            device,
            &file,
            draft_file.as_ref(),
            Serve {
                worker: None,
                ..serve
            },
        )?;
    }
    let worker: Worker = Box::new(move |commands| {
        let serve = Serve {
            worker: Some((commands, metrics)),
            ..serve
        };
        pool.install(|| device::run_on(device, &file, draft_file.as_ref(), serve))
    });
    Ok((state, rx, worker))
}

/// The server's engine on any backend: built, and with the worker's channel run until it stops
/// (without it, only built: the check before the server listens).
struct Serve {
    context_len: usize,
    cfg: EngineConfig,
    kv: KvType,
    worker: Option<(Receiver<Command>, Arc<Metrics>)>,
}

impl OnDevice for Serve {
    type Out = ();

    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        draft: Option<&'m Model<'m, B::Tensor>>,
        _place: &Place,
    ) -> Result<()> {
        let (ctx, rows) = (self.context_len, logit_rows(self.cfg.slots));
        let engine = device::engine(backend, model, draft, ctx, self.cfg, rows, self.kv)?;
        if let Some((commands, metrics)) = self.worker {
            worker::run(engine, commands, metrics);
        }
        Ok(())
    }
}
