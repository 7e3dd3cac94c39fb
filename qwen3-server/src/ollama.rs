//! Ollama's API on the same port, for the tools that speak only it (VS Code's Copilot Chat with a
//! local model, Open WebUI in Ollama mode, Continue, the `ollama` Python and JavaScript
//! clients): `/api/version`, `/api/tags`, `/api/show`, `/api/ps`, `/api/chat` and
//! `/api/generate`.
//!
//! A translation layer, nothing more: a chat or generate request becomes the OpenAI request it
//! means (`options.num_predict` is `max_tokens`, `format` is `response_format`, `think` is
//! `enable_thinking`, ...), read and checked by request/ as any other, run by the same engine
//! handle (engine.rs), and its choice is shaped as Ollama shapes an answer: one JSON object, or
//! by default a stream of them, one per line (`application/x-ndjson`), the last with
//! `done: true`, why, and the counts and durations in nanoseconds. Errors are Ollama's
//! `{"error": "..."}` with the same status.
//!
//! Reference: Ollama's docs/api.md.

use crate::answer::Choices;
use crate::engine::{self, Queued};
use crate::error::ApiError;
use crate::job::{unix_now, LeftEarly, LogLater, LogTokens};
use crate::pump::{gather, pump, Shape};
use crate::request::{ChatRequest, CompletionRequest};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// The version of Ollama's API this server follows (clients check it before they use newer
/// fields such as `think`).
const API_VERSION: &str = "0.12.0";

/// An error as Ollama answers one: `{"error": message}`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    refuse(status, message).into_response()
}

/// An error on its way to becoming the answer: a status and Ollama's message.
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused(status, message.into())
}

impl ApiError {
    /// The same error in Ollama's shape.
    fn ollama(self) -> Response {
        error(self.status, self.message)
    }
}

/// A model name a request gives: the server's own, with or without Ollama's default tag.
fn check_model(s: &AppState, v: &Value) -> Result<(), Refused> {
    match v
        .get("model")
        .or_else(|| v.get("name"))
        .and_then(Value::as_str)
    {
        None => Err(refuse(StatusCode::BAD_REQUEST, "model is required")),
        Some(m) if m == s.model_name || m.strip_suffix(":latest") == Some(&s.model_name) => Ok(()),
        Some(m) => Err(refuse(
            StatusCode::NOT_FOUND,
            format!("model {m:?} not found: this server runs {:?}", s.model_name),
        )),
    }
}

/// Time as Ollama writes it: RFC 3339 in UTC (`2026-11-27T13:05:09Z`).
fn rfc3339(unix: u64) -> String {
    // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `details`, as `/api/tags`, `/api/show` and `/api/ps` give them.
fn details(s: &AppState) -> Value {
    let i = &s.info;
    json!({
        "parent_model": "",
        "format": "pico-qwen",
        "family": i.family,
        "families": [i.family],
        "parameter_size": parameter_size(i.parameters),
        "quantization_level": i.quantization,
    })
}

/// Parameters as Ollama writes them: `8.0B`, `751.63M`.
fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.2}M", n as f64 / 1e6)
    }
}

/// A stand-in for Ollama's digest (the sha256 of the model's blob, which this server does not
/// compute over gigabytes at start): a hash of the name, size and modification time, so that it
/// changes when the file does.
fn digest(s: &AppState) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a
    let key = format!("{}:{}:{}", s.model_name, s.info.file_size, s.info.modified);
    for b in key.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({"version": API_VERSION}))
}

/// `GET /api/tags`: the one model.
pub async fn tags(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"models": [{
        "name": s.model_name,
        "model": s.model_name,
        "modified_at": rfc3339(s.info.modified),
        "size": s.info.file_size,
        "digest": digest(&s),
        "details": details(&s),
    }]}))
}

/// `GET /api/ps`: the one model, always loaded.
pub async fn ps(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"models": [{
        "name": s.model_name,
        "model": s.model_name,
        "size": s.info.file_size,
        "digest": digest(&s),
        "details": details(&s),
        // Loaded for as long as the server runs.
        "expires_at": "2318-01-01T00:00:00Z",
        "size_vram": 0,
        "context_length": s.context_len,
    }]}))
}

/// `POST /api/show`: the model's details, `model_info` under GGUF's key names, and what it can
/// do (`completion`; `tools` when its template renders tools; `thinking` when it has a thinking
/// switch).
pub async fn show(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")),
    };
    if let Err(r) = check_model(&s, &v) {
        return r.into_response();
    }
    let i = &s.info;
    let a = &i.family;
    // An embedding model embeds and does nothing else.
    let mut capabilities = vec![if s.embeds { "embedding" } else { "completion" }];
    if !s.embeds
        && s.template
            .as_ref()
            .is_some_and(|t| t.file().chat_template.contains("tools"))
    {
        capabilities.push("tools");
    }
    if !s.embeds && s.thinking_template {
        capabilities.push("thinking");
    }
    if s.images.is_some() {
        capabilities.push("vision");
    }
    Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": s.template.as_ref().map_or("", |t| t.file().chat_template.as_str()),
        "details": details(&s),
        "model_info": {
            "general.architecture": a,
            "general.parameter_count": i.parameters,
            format!("{a}.context_length"): s.context_len,
            format!("{a}.embedding_length"): i.embedding_length,
            format!("{a}.block_count"): i.block_count,
            format!("{a}.attention.head_count"): i.head_count,
            format!("{a}.attention.head_count_kv"): i.head_count_kv,
        },
        "capabilities": capabilities,
        "modified_at": rfc3339(i.modified),
    }))
    .into_response()
}

/// Ollama's `options` (and `format`, `think`, `stream`) as the OpenAI fields they mean, into
/// `out`. Unknown options are ignored, as Ollama ignores the ones a model does not use.
fn translate_options(v: &Value, out: &mut Map<String, Value>) -> Result<(), Refused> {
    let o = &v["options"];
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("min_p", "min_p"),
        ("seed", "seed"),
        ("stop", "stop"),
        ("repeat_penalty", "repetition_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
    ] {
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            out.insert(to.into(), x.clone());
        }
    }
    // num_predict: -1 (and -2, "fill the context") mean no limit.
    match o.get("num_predict").and_then(Value::as_i64) {
        Some(n) if n >= 0 => {
            out.insert("max_tokens".into(), n.max(1).into());
        }
        _ => {}
    }
    match v.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(f)) if f.is_empty() => {}
        Some(Value::String(f)) if f == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(_) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "format must be \"json\" or a JSON Schema",
            ))
        }
    }
    // `think`: true or false (newer models also take "low"/"medium"/"high": thinking on).
    match v.get("think") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(t)) => {
            out.insert("chat_template_kwargs".into(), json!({"enable_thinking": t}));
        }
        Some(Value::String(_)) => {
            out.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": true}),
            );
        }
        Some(_) => return Err(refuse(StatusCode::BAD_REQUEST, "think must be a boolean")),
    }
    Ok(())
}

/// Ollama's `images` (base64, no media type) as OpenAI's image parts before the text `content`,
/// as `ollama run` places a message's images; `content` alone without images.
fn with_images(content: Option<&Value>, images: Option<&Value>) -> Result<Value, Refused> {
    let images = match images {
        None | Some(Value::Null) => return Ok(content.cloned().unwrap_or(Value::Null)),
        Some(Value::Array(a)) if a.is_empty() => {
            return Ok(content.cloned().unwrap_or(Value::Null))
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "images must be a list of base64 strings",
            ))
        }
    };
    let mut parts = Vec::with_capacity(images.len() + 1);
    for image in images {
        let Some(b64) = image.as_str() else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "images must be a list of base64 strings",
            ));
        };
        // Plain base64, as Ollama's clients send it; a data URL is taken as it is.
        let url = match b64.starts_with("data:") {
            true => b64.to_string(),
            false => format!("data:;base64,{b64}"),
        };
        parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    match content {
        Some(Value::String(t)) if !t.is_empty() => parts.push(json!({"type": "text", "text": t})),
        None | Some(Value::Null | Value::String(_)) => {}
        Some(_) => return Err(refuse(StatusCode::BAD_REQUEST, "content must be a string")),
    }
    Ok(Value::Array(parts))
}

/// An Ollama message as the OpenAI message it is (a call's `arguments` stay an object, which
/// the template takes; `thinking` is `reasoning_content`).
fn message(m: &Value) -> Result<Value, Refused> {
    let mut out = Map::new();
    if let Some(x) = m.get("role") {
        out.insert("role".into(), x.clone());
    }
    let content = with_images(m.get("content"), m.get("images"))?;
    if !content.is_null() {
        out.insert("content".into(), content);
    }
    if let Some(t) = m.get("thinking").filter(|t| t.is_string()) {
        out.insert("reasoning_content".into(), t.clone());
    }
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| json!({"type": "function", "function": c["function"]}))
            .collect();
        out.insert("tool_calls".into(), calls.into());
    }
    Ok(Value::Object(out))
}

/// The body as JSON, an object; else Ollama's 400.
fn body_json(body: &[u8]) -> Result<Value, Refused> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        )),
        Err(e) => Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("invalid JSON: {e}"),
        )),
    }
}

/// `POST /api/chat`.
pub async fn chat(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let v = match body_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_model(&s, &v) {
        return r.into_response();
    }
    let mut o = Map::new();
    let messages = match v.get("messages") {
        Some(Value::Array(m)) => m.iter().map(message).collect::<Result<Vec<_>, _>>(),
        _ => return error(StatusCode::BAD_REQUEST, "messages must be a list"),
    };
    let messages = match messages {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    if messages.is_empty() {
        // Ollama's way to load a model: an empty conversation, answered at once.
        return Json(done_object(&s, "load", Kind::Chat, None)).into_response();
    }
    o.insert("messages".into(), messages.into());
    if let Some(t) = v.get("tools").filter(|t| !t.is_null()) {
        o.insert("tools".into(), t.clone());
    }
    if let Err(r) = translate_options(&v, &mut o) {
        return r.into_response();
    }
    let openai = Value::Object(o).to_string();
    let req = match ChatRequest::parse(openai.as_bytes(), &s) {
        Ok(r) => r,
        Err(e) => return e.ollama(),
    };
    let (job, params) = match req.into_job(&s, Instant::now()).await {
        Ok(jp) => jp,
        Err(e) => return e.ollama(),
    };
    answer(s, job, params, stream_flag(&v), Kind::Chat).await
}

/// `POST /api/embed`: `input` (a string or a list of them) embedded, as `/v1/embeddings` does
/// (`dimensions` too); Ollama's answer: `embeddings` (one list per input), `prompt_eval_count`,
/// durations in nanoseconds. `truncate` is not honoured: an input longer than the context is
/// refused, as `truncate: false` refuses it.
pub async fn embed(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = std::time::Instant::now();
    let v = match body_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_model(&s, &v) {
        return r.into_response();
    }
    let mut openai = json!({"input": v.get("input").cloned().unwrap_or(Value::Null)});
    if let Some(d) = v.get("dimensions") {
        openai["dimensions"] = d.clone();
    }
    let e = match crate::embeddings::compute(&s, openai.to_string().as_bytes()).await {
        Ok(e) => e,
        Err(e) => return e.ollama(),
    };
    let mut r = Json(json!({
        "model": s.model_name,
        "embeddings": e.vectors,
        "total_duration": start.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": e.prompt_tokens,
    }))
    .into_response();
    r.extensions_mut().insert(LogTokens {
        prompt: e.prompt_tokens,
        completion: 0,
    });
    r
}

/// `POST /api/generate`: a prompt completed through the chat template (with `system`), or as
/// it is with `raw: true`.
pub async fn generate(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let v = match body_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_model(&s, &v) {
        return r.into_response();
    }
    let prompt = v["prompt"].as_str().unwrap_or("");
    if prompt.is_empty() {
        // Ollama's way to load a model: no prompt, answered at once.
        return Json(done_object(&s, "load", Kind::Generate, None)).into_response();
    }
    let mut o = Map::new();
    let raw = v["raw"].as_bool().unwrap_or(false) || s.template.is_none();
    if raw {
        o.insert("prompt".into(), prompt.into());
        if !v["options"]["num_predict"].is_i64() {
            // Ollama generates until the end of text, not OpenAI's 16 tokens.
            let left = s.context_len.saturating_sub(1).max(1);
            o.insert("max_tokens".into(), left.into());
        }
    } else {
        let mut messages = Vec::new();
        if let Some(sys) = v["system"].as_str().filter(|t| !t.is_empty()) {
            messages.push(json!({"role": "system", "content": sys}));
        }
        let content = match with_images(Some(&Value::from(prompt)), v.get("images")) {
            Ok(c) => c,
            Err(r) => return r.into_response(),
        };
        messages.push(json!({"role": "user", "content": content}));
        o.insert("messages".into(), messages.into());
    }
    if let Err(r) = translate_options(&v, &mut o) {
        return r.into_response();
    }
    let openai = Value::Object(o).to_string();
    let parsed = if raw {
        if v["images"].as_array().is_some_and(|i| !i.is_empty()) {
            let why = match s.template {
                Some(_) => "images need the chat template: drop raw",
                None => "images need a chat template, and this model has none",
            };
            return error(StatusCode::BAD_REQUEST, why);
        }
        CompletionRequest::parse(openai.as_bytes(), &s).map(|r| r.into_job(&s, Instant::now()))
    } else {
        match ChatRequest::parse(openai.as_bytes(), &s) {
            Ok(r) => r.into_job(&s, Instant::now()).await,
            Err(e) => Err(e),
        }
    };
    let (job, mut params) = match parsed {
        Ok(jp) => jp,
        Err(e) => return e.ollama(),
    };
    if raw {
        // The whole prompt's budget check counts against the context, as a chat's does.
        params.max_tokens = params
            .max_tokens
            .map(|m| m.min(s.context_len.saturating_sub(job.prompts[0].len()).max(1)));
    }
    answer(s, job, params, stream_flag(&v), Kind::Generate).await
}

/// Ollama streams unless told not to.
fn stream_flag(v: &Value) -> bool {
    v["stream"].as_bool().unwrap_or(true)
}

/// Which endpoint, for the answer's shape: `message` or `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
}

/// The counts and durations of an answer (nanoseconds): from the request's arrival to its
/// first token (Ollama's prompt evaluation), and from there to the end.
struct Timing {
    start: Instant,
    first: Option<Instant>,
    prompt: usize,
    completion: usize,
}

impl Timing {
    /// Notes when the first token arrived.
    fn saw(&mut self, choices: &Choices) {
        if self.first.is_none() && choices.completion_tokens() > 0 {
            self.first = Some(Instant::now());
        }
    }
}

/// The last object of an answer: `done`, why, and the counts and durations.
fn done_object(s: &AppState, reason: &str, kind: Kind, t: Option<&Timing>) -> Value {
    let mut v = json!({
        "model": s.model_name,
        "created_at": rfc3339(unix_now()),
        "done": true,
        "done_reason": reason,
    });
    if kind == Kind::Chat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = "".into();
    }
    if let Some(t) = t {
        let total = t.start.elapsed().as_nanos() as u64;
        let prompt = t.first.map_or(total, |f| (f - t.start).as_nanos() as u64);
        v["total_duration"] = total.into();
        v["load_duration"] = 0.into();
        v["prompt_eval_count"] = t.prompt.into();
        v["prompt_eval_duration"] = prompt.into();
        v["eval_count"] = t.completion.into();
        v["eval_duration"] = (total - prompt).into();
    }
    v
}

/// A piece of the answer: `content` (and `thinking`, `tool_calls`) of a chat's message, or a
/// generate's `response` (and `thinking`).
fn piece(
    s: &AppState,
    kind: Kind,
    content: &str,
    thinking: &str,
    calls: &[qwen3_inference::chat::tool_calls::ToolCall],
) -> Value {
    let mut v = json!({"model": s.model_name, "created_at": rfc3339(unix_now()), "done": false});
    match kind {
        Kind::Chat => {
            let mut m = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                m["thinking"] = thinking.into();
            }
            if !calls.is_empty() {
                m["tool_calls"] = calls
                    .iter()
                    .map(|c| {
                        // Ollama gives `arguments` as an object, not a string.
                        let args = serde_json::from_str::<Value>(&c.arguments)
                            .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                        json!({"function": {"name": c.name, "arguments": args}})
                    })
                    .collect();
            }
            v["message"] = m;
        }
        Kind::Generate => {
            v["response"] = content.into();
            if !thinking.is_empty() {
                v["thinking"] = thinking.into();
            }
        }
    }
    v
}

/// Ollama's `done_reason` for an OpenAI finish reason.
fn done_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "length",
        _ => "stop",
    }
}

/// Runs the job and answers in Ollama's shape, whole or streamed.
async fn answer(
    s: Arc<AppState>,
    job: crate::job::Job,
    p: crate::job::Params,
    stream: bool,
    kind: Kind,
) -> Response {
    let Queued {
        mut choices,
        mut rx,
        n_prompt,
        ..
    } = match engine::queue(&s, &job, &p).await {
        Ok(q) => q,
        Err(e) => return e.ollama(),
    };
    let path = match kind {
        Kind::Chat => "/api/chat",
        Kind::Generate => "/api/generate",
    };
    let mut timing = Timing {
        start: job.start,
        first: None,
        prompt: n_prompt,
        completion: 0,
    };
    let mut left = LeftEarly::new(&s, path, n_prompt, job.start);
    if stream {
        let shape = Lines {
            s: s.clone(),
            kind,
            timing,
        };
        let body = pump(s, choices, rx, left, shape);
        let mut r = Response::new(Body::from_stream(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/x-ndjson"),
        );
        r.extensions_mut().insert(LogLater);
        return r;
    }
    let gathered = gather(&s, &mut choices, &mut rx, &mut left, |c| timing.saw(c)).await;
    if let Err(e) = gathered {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e);
    }
    timing.completion = choices.completion_tokens();
    let c = &choices.c[0];
    let calls: Vec<_> = c.tool_calls.iter().map(|(_, call)| call.clone()).collect();
    let whole = piece(&s, kind, &c.content, &c.reasoning, &calls);
    let mut v = done_object(&s, done_reason(c.finish), kind, Some(&timing));
    for (k, x) in whole.as_object().expect("an object") {
        if k != "done" {
            v[k] = x.clone();
        }
    }
    let mut r = Json(v).into_response();
    r.extensions_mut().insert(LogTokens {
        prompt: n_prompt,
        completion: timing.completion,
    });
    r
}

/// Ollama's streamed answer: a line of JSON per piece, then the `done` line (or an error line
/// when the answer stops short).
struct Lines {
    s: Arc<AppState>,
    kind: Kind,
    timing: Timing,
}

impl Shape for Lines {
    type Item = Bytes;

    fn pieces(&mut self, choices: &mut Choices) -> Vec<Bytes> {
        self.timing.saw(choices);
        std::mem::take(&mut choices.out)
            .into_iter()
            .filter(|(_, d, _)| {
                !(d.content.is_empty() && d.reasoning.is_empty() && d.tool_calls.is_empty())
            })
            .map(|(_, d, _)| {
                line(piece(
                    &self.s,
                    self.kind,
                    &d.content,
                    &d.reasoning,
                    &d.tool_calls,
                ))
            })
            .collect()
    }

    fn last(mut self, choices: &Choices, failed: Option<String>) -> Vec<Bytes> {
        self.timing.completion = choices.completion_tokens();
        let last = match failed {
            Some(e) => json!({"error": e}),
            None => done_object(
                &self.s,
                done_reason(choices.c[0].finish),
                self.kind,
                Some(&self.timing),
            ),
        };
        vec![line(last)]
    }
}

/// One line of newline-delimited JSON.
fn line(v: Value) -> Bytes {
    Bytes::from(v.to_string() + "\n")
}
