//! `qwen3 serve`: an OpenAI-compatible HTTP server over the continuous-batching engine
//! ([`qwen3_inference::engine`]). See docs/serve.md.
//!
//! This crate is the only place tokio lives. The library below it is synchronous: one worker
//! thread ([`worker`]) owns the engine, and the async handlers ([`routes`]) talk to it through
//! channels. The caller (the CLI) loads the model files and says how to start the worker, so that
//! the server does not care which backend runs the model.
//!
//! A request flows one way, down this list; each module uses only those after it (the test
//! `tests/layers.rs` holds this order to the code):
//!
//! - [`batch`]: a file of requests sent through the router below without a network (`qwen3
//!   batch`), the one module that uses this file's own functions;
//! - [`routes`]: the HTTP routes, auth, the request log; each generation route reads its
//!   request type, makes a job and hands it on;
//! - [`ollama`]: Ollama's API, translated to the requests below and its answers back;
//! - [`rerank`]: `/v1/rerank`, documents scored against a query by Qwen3-Reranker's recipe
//!   ([`qwen3_inference::rerank`]);
//! - [`embeddings`]: `/v1/embeddings`, an embedding model's vectors;
//! - [`request`]: one validated type per endpoint ([`request::CompletionRequest`],
//!   [`request::ChatRequest`]), every field checked in one place; a chat's images encoded;
//! - [`images`]: the image parts of a chat's messages, read into bytes;
//! - [`structured`]: `response_format` and tool calls as the grammar the answer must match;
//! - [`engine`]: the handle on the engine: a job's token budget, queued on the worker, its
//!   answer whole or as OpenAI's server-sent events;
//! - [`pump`]: the one loop from the worker's updates to an answer, gathered or streamed, for
//!   OpenAI's shape and Ollama's;
//! - [`answer`]: the updates shaped into OpenAI's choices, chunks and whole answer;
//! - [`job`]: what a checked request asks of the engine, and the request log's line;
//! - [`logprobs`]: log-probabilities in OpenAI's shapes;
//! - [`state`]: what the handlers share (the tokenizer, the template, the worker's channel);
//! - [`worker`]: the model thread;
//! - [`metrics`]: `GET /metrics` for Prometheus (counted by the handlers and the worker);
//! - [`listen`]: the accept loop under the router: the connection limit, the header and body
//!   timeouts, the body's size, and OpenAI's error object on the errors HTTP itself answers;
//! - [`error`]: OpenAI's error object.
//!
//! This file only wires the modules together: the router, [`serve`] and [`start_worker`].

#![forbid(unsafe_code)]

// One module per group: rustfmt would sort a block of them, and the order is the data flow.
pub mod batch;

pub mod routes;

pub mod ollama;

pub mod rerank;

pub mod embeddings;

pub mod request;

pub mod images;

pub mod structured;

pub mod engine;

pub mod pump;

pub mod answer;

pub mod job;

pub mod logprobs;

pub mod state;

pub mod worker;

pub mod metrics;

pub mod listen;

pub mod error;

use anyhow::{bail, Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderValue;
use axum::routing::{get, post};
use axum::Router;
use std::io::Write;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use worker::Command;

/// The state and options the caller builds, where it has always named them.
pub use state::{AppState, ServeOptions};

/// The routes, with auth, the log, CORS and the body limit.
pub fn router(state: Arc<AppState>) -> Router {
    router_with(state, true)
}

/// [`router`], with or without the request log on stderr (a batch keeps stderr for its
/// progress).
pub fn router_with(state: Arc<AppState>, log: bool) -> Router {
    let app = Router::new()
        .route("/", get(routes::page))
        .route("/favicon.svg", get(routes::favicon))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/embeddings", post(routes::embeddings))
        .route("/v1/rerank", post(routes::rerank))
        .route("/rerank", post(routes::rerank))
        // Ollama's API (ollama.rs).
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::wrong_method)
        .layer(DefaultBodyLimit::max(listen::MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.body_timeout,
            listen::read_body,
        ))
        .layer(axum::middleware::from_fn(routes::json_only))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::refuse_when_stopping,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::auth,
        ));
    let app = if log {
        app.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::log,
        ))
    } else {
        app
    };
    let app = match cors(&state.cors) {
        Some(layer) => app.layer(layer),
        None => app,
    };
    app.with_state(state)
}

/// CORS for `--cors` origins: none by default, so that a web page the user visits cannot use a
/// server on their machine (a browser sends a page's cross-origin requests only if the server
/// allows them; a JSON POST needs a preflight, which then fails).
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    if origins.iter().any(|o| o == "*") {
        return Some(CorsLayer::permissive());
    }
    let list: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(list))
            .allow_methods(Any)
            .allow_headers(Any),
    )
}

/// Starts `worker` on its own thread with the command channel's receiving end. The receiver
/// gets why the worker ended, once it does (an error, a panic, or its channel closing).
pub fn start_worker<W>(
    worker: W,
    commands: Receiver<Command>,
) -> Result<(
    std::thread::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<String>,
)>
where
    W: FnOnce(Receiver<Command>) -> Result<()> + Send + 'static,
{
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<String>();
    let thread = std::thread::Builder::new()
        .name("qwen3-worker".into())
        .spawn(move || {
            let why =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(commands))) {
                    Ok(Ok(())) => "the model worker stopped".to_string(),
                    Ok(Err(e)) => format!("the model worker failed: {e:#}"),
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        format!("the model worker panicked: {msg}")
                    }
                };
            let _ = ended_tx.send(why);
        })
        .context("cannot start the model worker thread")?;
    Ok((thread, ended_rx))
}

/// Serves until Ctrl-C or SIGTERM: starts `worker` on its own thread with the command channel's
/// receiving end, listens, prints one line with the URL, and answers.
///
/// On a signal it stops as a rolling update needs: `/health` turns 503 first (a readiness probe
/// takes the replica out), new requests get a 503 (a load balancer retries them elsewhere), the
/// listener closes, and the requests already held, running or queued, are answered. When they
/// are all answered, or after `shutdown_timeout` (or at a second signal), what is left is ended
/// and it returns `Ok`. If the worker ends on its own (it failed), the server stops at once with
/// its error.
pub fn serve<W>(
    opts: ServeOptions,
    state: AppState,
    commands: Receiver<Command>,
    worker: W,
) -> Result<()>
where
    W: FnOnce(Receiver<Command>) -> Result<()> + Send + 'static,
{
    let (thread, ended_rx) = start_worker(worker, commands)?;
    let shutdown_commands = state.commands.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let shown = if local.is_ipv6() {
            format!("[{}]:{}", local.ip(), local.port())
        } else {
            local.to_string()
        };
        let state = Arc::new(state);
        let shared = state.clone();
        println!(
            "qwen3 serve: {} on http://{shown} ({} slots of {} positions)",
            state.model_name, state.slots, state.context_len
        );
        std::io::stdout().flush().ok();
        let app = router(state);

        // Stop on a signal, or when the worker ends by itself.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
        let signals = async {
            tokio::select! {
                _ = signal() => None,
                why = ended_rx => Some(why.unwrap_or_else(|_| "the model worker vanished".into())),
            }
        };
        let server = listen::serve(listener, app, opts.limits, {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.changed().await;
            }
        });
        let mut server = tokio::spawn(server);
        let failure = signals.await;
        if failure.is_none() {
            drain(&shared, opts.shutdown_timeout, &stop_tx, &mut server).await;
        }
        // End what still runs (their handlers answer and streams close), then give the
        // connections a moment to finish.
        let _ = shutdown_commands.send(Command::Shutdown);
        let _ = stop_tx.send(failure.clone());
        if !server.is_finished()
            && tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .is_err()
        {
            eprintln!("qwen3 serve: connections still open after 10 s; exiting anyway");
        }
        match failure {
            Some(why) => bail!("{why}"),
            None => {
                eprintln!("qwen3 serve: stopped");
                Ok(())
            }
        }
    });
    // The worker got Shutdown; do not wait long for it (it may be in the middle of a step).
    drop(thread);
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// A rolling update's stop, in three phases within `timeout` (a second signal cuts it short):
///
/// 1. still listening: `/health` says 503 and new requests get a 503, while the engine answers
///    what it holds, until it holds nothing (the worker's gauges say so);
/// 2. the listener closes and idle keep-alive connections with it; connections still writing an
///    answer finish it (and a request that slipped in before phase 1 is still answered: the
///    worker runs until the caller stops it);
/// 3. (the caller) ends whatever is left.
async fn drain(
    state: &AppState,
    timeout: Duration,
    stop: &tokio::sync::watch::Sender<Option<String>>,
    server: &mut tokio::task::JoinHandle<()>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let deadline = tokio::time::Instant::now() + timeout;
    state.draining.store(true, Relaxed);
    let held = || state.metrics.queued.load(Relaxed) + state.metrics.running.load(Relaxed);
    eprintln!(
        "qwen3 serve: stopping: /health and new requests answer 503; requests held: {}, answered within {} s (--shutdown-timeout)",
        held(),
        timeout.as_secs_f64()
    );
    let answered = async {
        while held() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(None);
        server.await
    };
    let done = tokio::select! {
        done = tokio::time::timeout_at(deadline, answered) => done.is_ok(),
        _ = signal() => false,
    };
    let _ = stop.send(None);
    if done {
        eprintln!("qwen3 serve: every request answered");
    } else {
        eprintln!(
            "qwen3 serve: ending the requests still held ({}): the timeout passed or a second signal came",
            held()
        );
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
