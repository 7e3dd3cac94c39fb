//! The HTTP routes: `GET /` (the chat page), `GET /health`, `GET /metrics`, `GET /v1/models`,
//! `POST /v1/completions`, `POST /v1/chat/completions`, with the API key check, the request log,
//! and OpenAI's error object for everything that goes wrong (unknown routes included).
//!
//! A generation request goes: body -> [`api`] (checked fields) -> token ids (the prompt, or the
//! chat template rendered as `qwen3 inference -m chat` renders it) -> the worker, as `n`
//! engine requests -> updates back -> [`crate::answer`]: each choice's text, one JSON answer or a
//! stream of server-sent events.

use crate::answer::{stream, Choices, Meta};
use crate::api::{self, Params};
use crate::error::ApiError;
use crate::worker::{Command, Update};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qwen3_inference::engine::{Rejected, Request as EngineRequest};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `GET /health`: answers as soon as the server listens (no key needed), as llama-server does.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

fn model_object(s: &AppState) -> Value {
    json!({
        "id": s.model_name,
        "object": "model",
        "created": s.created,
        "owned_by": "pico-qwen",
        "max_model_len": s.context_len,
    })
}

/// `GET /v1/models`: the one model this server runs.
pub async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&s)]}))
}

/// `GET /v1/models/{id}`.
pub async fn model(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_model(&s, Some(&id))?;
    Ok(Json(model_object(&s)))
}

fn check_model(s: &AppState, name: Option<&str>) -> Result<(), ApiError> {
    match name {
        Some(m) if m != s.model_name => Err(ApiError::invalid(
            "model".to_string(),
            format!(
                "the model {m:?} does not exist: this server runs {:?}",
                s.model_name
            ),
        )
        .with_status(StatusCode::NOT_FOUND)
        .with_code("model_not_found")),
        _ => Ok(()),
    }
}

/// The body, or the right 4xx: 413 over the size limit, 400 otherwise.
fn body(b: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = b.map_err(|e| {
        let status = e.status();
        let code = (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large");
        let mut err = ApiError::invalid(None, e.body_text()).with_status(status);
        err.code = code;
        err
    })?;
    api::parse_body(&bytes)
}

/// A generation request's body and its shared fields, checked, for the model this server runs.
fn read(s: &AppState, b: Result<Bytes, BytesRejection>) -> Result<(Value, Params), ApiError> {
    let v = body(b)?;
    let params = api::params(&v, &s.defaults, default_seed())?;
    check_model(s, params.model.as_deref())?;
    Ok((v, params))
}

/// `POST /v1/completions`: a raw prompt, completed as `qwen3 inference -m generate` does.
pub async fn completions(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let (v, params) = read(&s, b)?;
    let prompt = api::completion_prompt(&v, s.tokenizer)?;
    let job = Job {
        kind: Kind::Completion,
        prompt,
        reasoning: None,
        stop_ids: s.eos_ids.clone(),
        logprobs: api::logprobs(&v, false)?,
        tool_calls: None,
        start,
    };
    run(s, job, params).await
}

/// `POST /v1/chat/completions`: the conversation through the model's chat template.
pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let (v, params) = read(&s, b)?;
    let (messages, thinking) = api::chat_messages(&v)?;
    let Some(template) = &s.template else {
        return Err(ApiError::invalid(
            None,
            "this model has no chat template: use /v1/completions",
        ));
    };
    let (tools, choice) = api::tools(&v)?;
    // With tool_choice "none" the model is not shown the tools.
    let shown = (!tools.is_empty() && choice != api::ToolChoice::None).then_some(&tools[..]);
    let mut text = template
        .render_json(&messages, shown, true, thinking)
        .map_err(|e| ApiError::invalid("messages".to_string(), format!("{e:#}")))?;
    // "required" and a named function: the answer starts as a call does (Qwen's format, the
    // only way the template has to ask), and the model writes the rest.
    let forced = match &choice {
        api::ToolChoice::Required => "<tool_call>\n".to_string(),
        api::ToolChoice::Named(name) => format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": ",
            Value::from(name.as_str())
        ),
        _ => String::new(),
    };
    text.push_str(&forced);
    let tool_calls = shown.map(|_| forced);
    // A template that opens the reasoning block in the prompt (DeepSeek-R1's) starts the answer
    // inside it.
    let reasoning = s
        .thinking_template
        .then(|| text.trim_end().ends_with("<think>"));
    let job = Job {
        kind: Kind::Chat,
        prompt: s.tokenizer.encode(&text),
        reasoning,
        stop_ids: s.chat_stop_ids.clone(),
        logprobs: api::logprobs(&v, true)?,
        tool_calls,
        start,
    };
    run(s, job, params).await
}

/// A seed from the clock, for requests that do not give one (as `qwen3 inference` does).
fn default_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

/// A generation request, read.
pub(crate) struct Job {
    pub(crate) kind: Kind,
    pub(crate) prompt: Vec<u32>,
    /// Split `<think>` off (`Some(starts inside)`), for a thinking model's chat.
    pub(crate) reasoning: Option<bool>,
    pub(crate) stop_ids: Vec<u32>,
    /// Alternatives to report with each token's log-probability (`None`: no log-probabilities).
    pub(crate) logprobs: Option<usize>,
    /// Cut `<tool_call>` blocks out of the answer (a chat with tools): `Some(the beginning of
    /// the call the prompt already holds)`, empty unless `tool_choice` forces a call.
    pub(crate) tool_calls: Option<String>,
    /// When the request arrived (its time to first token counts from here).
    pub(crate) start: Instant,
}

/// What the request log line says about tokens; put in a response's extensions by the handler.
#[derive(Clone, Copy)]
pub struct LogTokens {
    pub prompt: usize,
    pub completion: usize,
}

/// Marks a stream: its log line is written when it ends, not when its head is sent.
#[derive(Clone, Copy)]
pub struct LogLater;

/// Checks the token budget, queues the choices, and answers.
async fn run(s: Arc<AppState>, job: Job, p: Params) -> Result<Response, ApiError> {
    let ctx = s.context_len;
    let n_prompt = job.prompt.len();
    if n_prompt >= ctx {
        return Err(too_long(job.kind, ctx, n_prompt, p.max_tokens.unwrap_or(1)));
    }
    let max_tokens = match (p.max_tokens, job.kind) {
        (Some(m), _) if n_prompt + m > ctx => return Err(too_long(job.kind, ctx, n_prompt, m)),
        (Some(m), _) => m,
        // OpenAI's default for the legacy completions endpoint is 16 tokens; a chat answer may
        // use the rest of the context.
        (None, Kind::Completion) => 16.min(ctx - n_prompt),
        (None, Kind::Chat) => ctx - n_prompt,
    };
    let requests = (0..p.n)
        .map(|i| {
            let mut sampler = p.sampler.clone();
            sampler.seed = sampler.seed.wrapping_add(i as u64);
            EngineRequest {
                prompt: job.prompt.clone(),
                max_tokens,
                sampler,
                stop_ids: if p.ignore_eos {
                    vec![]
                } else {
                    job.stop_ids.clone()
                },
                logprobs: job.logprobs,
            }
        })
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sent = s.commands.send(Command::Submit {
        requests,
        updates: tx,
    });
    if sent.is_err() {
        return Err(ApiError::internal("the model worker has stopped"));
    }
    let ids = match rx.recv().await {
        Some(Update::Queued { ids }) => ids,
        Some(Update::Rejected(Rejected::QueueFull)) => {
            return Err(ApiError::overloaded(s.max_queue))
        }
        Some(Update::Rejected(Rejected::Invalid(why))) => {
            return Err(ApiError::invalid("prompt".to_string(), why))
        }
        _ => return Err(ApiError::internal("the model worker has stopped")),
    };
    let meta = Meta {
        id: format!(
            "{}-{:x}{:04x}",
            if job.kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            unix_now(),
            ids[0]
        ),
        created: unix_now(),
        model: s.model_name.clone(),
        kind: job.kind,
    };
    let choices = Choices::new(&s, &job, &p, ids);
    if p.stream {
        Ok(stream(s, meta, choices, rx, p.include_usage, n_prompt))
    } else {
        let mut choices = choices;
        while !choices.all_done() {
            let Some(u) = rx.recv().await else {
                return Err(ApiError::internal("the model worker has stopped"));
            };
            if let Err(e) = choices.apply(u, &s) {
                return Err(ApiError::internal(e));
            }
        }
        let usage = choices.usage(n_prompt);
        let mut r = Json(meta.whole(&choices, &usage, s.tokenizer)).into_response();
        r.extensions_mut().insert(LogTokens {
            prompt: n_prompt,
            completion: choices.completion_tokens(),
        });
        Ok(r)
    }
}

fn too_long(kind: Kind, ctx: usize, prompt: usize, max_tokens: usize) -> ApiError {
    let param = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    ApiError::invalid(
        param.to_string(),
        format!(
            "this model's context holds {ctx} tokens; the request asks for {} ({prompt} in the prompt, {max_tokens} to generate): shorten the prompt or lower max_tokens",
            prompt + max_tokens
        ),
    )
    .with_code("context_length_exceeded")
}

/// Middleware: with an API key set, every route but `/health` needs `Authorization: Bearer KEY`.
pub async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        // The health check and the chat page (a static file, which asks for the key itself)
        // need none.
        let open = matches!(req.uri().path(), "/health" | "/");
        if !open && !bearer_matches(req.headers(), key) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares the bearer token with `key` in time that depends only on their lengths, so that
/// timing does not reveal how much of a guess was right.
fn bearer_matches(headers: &HeaderMap, key: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.as_bytes(), key.as_bytes());
    // The length is not secret (it is the same for every guess of the right length); the bytes
    // are all compared, whatever the first difference.
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Middleware: one line per request on stderr (streams log when they end).
pub async fn log(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let start = Instant::now();
    let r = next.run(req).await;
    if r.extensions().get::<LogLater>().is_none() {
        let tokens = r.extensions().get::<LogTokens>().copied();
        let status = r.status().as_u16();
        crate::log_line(&method, &path, status, tokens, start.elapsed());
        s.metrics.request(&path, status);
        if let Some(t) = tokens {
            s.metrics.tokens(t.prompt, t.completion);
        }
    }
    r
}

/// `GET /`: the chat page (chat.html, one file built into the binary), unless `--no-ui`.
pub async fn page(State(s): State<Arc<AppState>>, req: Request) -> Response {
    if !s.ui {
        return not_found(req).await.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("chat.html"),
    )
        .into_response()
}

/// `GET /metrics`: the Prometheus text (metrics.rs).
pub async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

/// Fallback: OpenAI's error object with 404 for a path the server does not have.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::no_route(req.method().as_str(), req.uri().path())
}

/// Fallback: 405 for a known path with the wrong method.
pub async fn wrong_method(req: Request) -> ApiError {
    let mut e = ApiError::no_route(req.method().as_str(), req.uri().path())
        .with_status(StatusCode::METHOD_NOT_ALLOWED);
    e.kind = "invalid_request_error";
    e.with_code("method_not_allowed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let mut h = HeaderMap::new();
        assert!(!bearer_matches(&h, "k1"));
        h.insert(header::AUTHORIZATION, "Bearer k1".parse().unwrap());
        assert!(bearer_matches(&h, "k1"));
        assert!(!bearer_matches(&h, "k2"));
        assert!(!bearer_matches(&h, "k1x"));
        assert!(!bearer_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "Basic k1".parse().unwrap());
        assert!(!bearer_matches(&h, "k1"));
    }
}
