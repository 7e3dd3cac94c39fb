//! The HTTP routes, the top of the crate: `GET /` (the chat page), `GET /health`,
//! `GET /metrics`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, with
//! the API key check, the request log, and OpenAI's error object for everything that goes wrong
//! (unknown routes included).
//!
//! A generation route is thin: it reads its request type ([`CompletionRequest`],
//! [`ChatRequest`]: every field checked, the prompt as token ids or the conversation rendered as
//! `qwen3 inference -m chat` renders it), turns it into a job, and hands that to the engine
//! handle (`engine::run`), which queues it on the worker and has [`crate::answer`] shape what
//! comes back.

use crate::engine;
use crate::error::ApiError;
use crate::job::{log_line, LogLater, LogTokens};
use crate::request::{check_model, ChatRequest, CompletionRequest};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// `GET /health`: answers as soon as the server listens (no key needed), as llama-server does;
/// 503 once it is stopping, so that a readiness probe or a load balancer's health check stops
/// sending it requests while it answers those it holds.
pub async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.draining.load(std::sync::atomic::Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
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

/// The body's bytes, or the right 4xx: 413 over the size limit, 400 otherwise.
fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        let status = e.status();
        let code = (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large");
        let mut err = ApiError::invalid(None, e.body_text()).with_status(status);
        err.code = code;
        err
    })
}

/// `POST /v1/completions`: a raw prompt, completed as `qwen3 inference -m generate` does.
pub async fn completions(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let (job, params) = CompletionRequest::parse(&body(b)?, &s)?.into_job(&s, start);
    engine::run(s, job, params).await
}

/// `POST /v1/chat/completions`: the conversation through the model's chat template.
pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req = ChatRequest::parse(&body(b)?, &s)?;
    let (job, params) = req.into_job(&s, start).await?;
    engine::run(s, job, params).await
}

/// `POST /v1/embeddings`: an embedding model's vectors of the inputs.
pub async fn embeddings(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::embeddings::embeddings(s, &body(b)?).await
}

/// `POST /v1/rerank` and `/rerank`: documents scored against a query (`--rerank`).
pub async fn rerank(
    State(s): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::rerank::rerank(s, &body(b)?).await
}

/// Middleware: with an API key set, every route but `/health` needs `Authorization: Bearer KEY`
/// (and `/metrics` too unless `--public-metrics`).
pub async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        // The health check and the chat page (a static file, which asks for the key itself)
        // need none.
        let open = matches!(req.uri().path(), "/health" | "/" | "/favicon.svg")
            || (s.public_metrics && req.uri().path() == "/metrics");
        if !open && !bearer_matches(req.headers(), key) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Middleware: once the server is stopping, a new request for the model (every POST) is a 503
/// that names why; a load balancer that retries on 503 sends it to another replica. The
/// requests already running are not touched: they are answered.
pub async fn refuse_when_stopping(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() == axum::http::Method::POST
        && s.draining.load(std::sync::atomic::Ordering::Relaxed)
    {
        return ApiError::stopping().into_response();
    }
    next.run(req).await
}

/// Middleware: a request with a body must say it is JSON (`Content-Type: application/json`),
/// else 415. A form or `text/plain` POST is one a web page can send to any server without the
/// browser asking the server first (no CORS preflight): refusing it keeps other sites' pages
/// from driving a server on the user's machine.
pub async fn json_only(req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::POST {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = ct.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case("application/json") {
            let got = if ct.is_empty() { "none" } else { ct };
            return ApiError::invalid(
                None,
                format!(
                    "the body must be JSON sent with Content-Type: application/json (got {got})"
                ),
            )
            .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .into_response();
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
        log_line(&method, &path, status, tokens, start.elapsed());
        s.metrics.request(&path, status);
        if let Some(t) = tokens {
            s.metrics.tokens(t.prompt, t.completion);
        }
    }
    r
}

/// `GET /favicon.svg`: the page's icon (a browser asks for one on every load), no key needed.
pub async fn favicon() -> Response {
    const SVG: &str = concat!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">"##,
        r##"<rect width="32" height="32" rx="7" fill="#2f6fde"/>"##,
        r##"<text x="16" y="22" font-family="sans-serif" font-size="15" font-weight="bold" "##,
        r##"fill="#fff" text-anchor="middle">qw</text></svg>"##
    );
    ([(header::CONTENT_TYPE, "image/svg+xml")], SVG).into_response()
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
