//! The HTTP routes: `GET /health`, `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions`, with the API key check, the request log, and OpenAI's error
//! object for everything that goes wrong (unknown routes included).
//!
//! A generation request goes: body -> [`api`] (checked fields) -> token ids (the prompt, or the
//! chat template rendered as `qwen3 inference -m chat` renders it) -> the worker, as `n`
//! engine requests -> updates back -> [`ChoiceText`] per choice -> one JSON answer, or a stream
//! of server-sent events.

use crate::api::{self, Params};
use crate::error::ApiError;
use crate::logprobs;
use crate::text::{ChoiceText, Delta};
use crate::tool_calls::ToolCall;
use crate::worker::{Command, Update};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use qwen3_inference::engine::{Rejected, Request as EngineRequest, RequestId};
use qwen3_inference::generate::StopReason;
use qwen3_inference::logprobs::TokenLogprobs;
use qwen3_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
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
enum Kind {
    Completion,
    Chat,
}

/// A generation request, read.
struct Job {
    kind: Kind,
    prompt: Vec<u32>,
    /// Split `<think>` off (`Some(starts inside)`), for a thinking model's chat.
    reasoning: Option<bool>,
    stop_ids: Vec<u32>,
    /// Alternatives to report with each token's log-probability (`None`: no log-probabilities).
    logprobs: Option<usize>,
    /// Cut `<tool_call>` blocks out of the answer (a chat with tools): `Some(the beginning of
    /// the call the prompt already holds)`, empty unless `tool_choice` forces a call.
    tool_calls: Option<String>,
    /// When the request arrived (its time to first token counts from here).
    start: Instant,
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

/// The answer's fixed fields.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

/// One choice's state.
struct ChoiceState {
    text: ChoiceText<'static>,
    content: String,
    reasoning: String,
    tokens: usize,
    cached: usize,
    finish: Option<&'static str>,
    /// Something was sent for this choice (a stream's first chunk carries the role).
    started: bool,
    /// Log-probabilities of the tokens so far (when asked for), and how many of them were sent.
    logprobs: Vec<TokenLogprobs>,
    sent_logprobs: usize,
    /// Characters of the text whose tokens' log-probabilities were sent (`text_offset`).
    sent_chars: usize,
    /// When its last token arrived (`/metrics`' latencies).
    last_token: Option<Instant>,
    /// The calls in the answer, with the ids given to them.
    tool_calls: Vec<(String, ToolCall)>,
}

/// Every choice of a request, fed by the worker's updates.
struct Choices {
    ids: Vec<RequestId>,
    /// When the request arrived.
    start: Instant,
    /// The request asked for log-probabilities.
    logprobs: bool,
    c: Vec<ChoiceState>,
    /// What the last update changed: (choice, text, finish reason), for a stream to send.
    out: Vec<(usize, Delta, Option<&'static str>)>,
}

impl Choices {
    fn new(s: &Arc<AppState>, job: &Job, p: &Params, ids: Vec<RequestId>) -> Choices {
        let c = ids
            .iter()
            .map(|_| ChoiceState {
                text: match &job.tool_calls {
                    Some(prefix) => ChoiceText::new(s.tokenizer, p.stops.clone(), job.reasoning)
                        .with_tool_calls(prefix),
                    None => ChoiceText::new(s.tokenizer, p.stops.clone(), job.reasoning),
                },
                content: String::new(),
                reasoning: String::new(),
                tokens: 0,
                cached: 0,
                finish: None,
                started: false,
                logprobs: Vec::new(),
                sent_logprobs: 0,
                sent_chars: 0,
                last_token: None,
                tool_calls: Vec::new(),
            })
            .collect();
        Choices {
            ids,
            start: job.start,
            logprobs: job.logprobs.is_some(),
            c,
            out: Vec::new(),
        }
    }

    fn all_done(&self) -> bool {
        self.c.iter().all(|c| c.finish.is_some())
    }

    /// Applies an update; `out` gets what changed. A failed choice is an error.
    fn apply(&mut self, u: Update, s: &AppState) -> Result<(), String> {
        self.out.clear();
        match u {
            Update::Started { choice, cached } => self.c[choice].cached = cached,
            Update::Token {
                choice,
                token,
                logprobs,
            } => {
                let c = &mut self.c[choice];
                if c.finish.is_some() {
                    return Ok(()); // after a stop string, until the cancel lands
                }
                c.tokens += 1;
                let now = Instant::now();
                match c.last_token.replace(now) {
                    None => s.metrics.first_token(now - self.start),
                    Some(t) => s.metrics.next_token(now - t),
                }
                if let Some(lp) = logprobs {
                    c.logprobs.push(*lp);
                }
                let (d, stopped) = c.text.push(token);
                if stopped {
                    c.finish = Some("stop");
                    let _ = s.commands.send(Command::Cancel(self.ids[choice]));
                }
                self.record(choice, d);
            }
            Update::Finished {
                choice,
                reason,
                generated,
            } => {
                let c = &mut self.c[choice];
                if c.finish.is_some() {
                    return Ok(());
                }
                c.tokens = generated;
                let d = c.text.finish();
                let called = !c.tool_calls.is_empty() || !d.tool_calls.is_empty();
                c.finish = Some(match reason {
                    // The model ended its turn after calling: the client runs the tools.
                    StopReason::Eos(_) if called => "tool_calls",
                    StopReason::Eos(_) | StopReason::Stopped => "stop",
                    StopReason::MaxTokens | StopReason::ContextFull => "length",
                });
                self.record(choice, d);
            }
            Update::Failed { error, .. } => return Err(error),
            Update::Queued { .. } | Update::Rejected(_) => {}
        }
        Ok(())
    }

    fn record(&mut self, choice: usize, d: Delta) {
        let c = &mut self.c[choice];
        c.content.push_str(&d.content);
        c.reasoning.push_str(&d.reasoning);
        for call in &d.tool_calls {
            c.tool_calls.push((call_id(), call.clone()));
        }
        if !d.is_empty() || c.finish.is_some() {
            self.out.push((choice, d, c.finish));
        }
    }

    fn completion_tokens(&self) -> usize {
        self.c.iter().map(|c| c.tokens).sum()
    }

    fn usage(&self, prompt: usize) -> Value {
        let completion = self.completion_tokens();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.c[0].cached},
        })
    }
}

impl Meta {
    /// The non-streamed answer.
    fn whole(&self, ch: &Choices, usage: &Value, tok: &Tokenizer) -> Value {
        let choices: Vec<Value> = ch
            .c
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let lp = ch.logprobs.then(|| self.logprobs(&c.logprobs, 0, tok));
                match self.kind {
                    Kind::Completion => json!({
                        "index": i, "text": c.content, "logprobs": lp, "finish_reason": c.finish,
                    }),
                    Kind::Chat => {
                        let mut m = json!({"role": "assistant", "content": c.content});
                        if !c.reasoning.is_empty() {
                            m["reasoning_content"] = c.reasoning.clone().into();
                        }
                        if !c.tool_calls.is_empty() {
                            let calls = &c.tool_calls;
                            m["tool_calls"] = calls.iter().enumerate().map(call_json).collect();
                            if c.content.is_empty() {
                                m["content"] = Value::Null;
                            }
                        }
                        json!({"index": i, "message": m, "logprobs": lp, "finish_reason": c.finish})
                    }
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        })
    }

    /// One streamed chunk with `choices`.
    fn chunk(&self, choices: Vec<Value>, include_usage: bool) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// Log-probabilities of `entries` in this endpoint's shape; `offset`: characters of the
    /// text before them (`/v1/completions`' `text_offset`).
    fn logprobs(&self, entries: &[TokenLogprobs], offset: usize, tok: &Tokenizer) -> Value {
        match self.kind {
            Kind::Completion => logprobs::completion(entries, tok, offset),
            Kind::Chat => logprobs::chat(entries, tok),
        }
    }

    /// A stream's choice object; `lp`: the log-probabilities of the tokens since the last one.
    /// `calls`: the tool calls completed in this delta, with their index in the answer and id.
    fn choice_delta(
        &self,
        i: usize,
        d: &Delta,
        first: bool,
        finish: Option<&str>,
        lp: Value,
        calls: &[(usize, &(String, ToolCall))],
    ) -> Value {
        match self.kind {
            Kind::Completion => {
                json!({"index": i, "text": d.content, "logprobs": lp, "finish_reason": finish})
            }
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if !d.reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), d.reasoning.clone().into());
                }
                if !d.content.is_empty()
                    || (first && d.reasoning.is_empty() && d.tool_calls.is_empty())
                {
                    delta.insert("content".into(), d.content.clone().into());
                }
                if !calls.is_empty() {
                    let v: Vec<Value> = calls.iter().map(|(k, c)| call_json((*k, c))).collect();
                    delta.insert("tool_calls".into(), v.into());
                }
                json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
        }
    }
}

/// An id for a tool call (OpenAI's `call_...`), unique in this server's life.
fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "call_{:x}{:06x}",
        unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A call as OpenAI writes it: `arguments` is the JSON text, as a string.
fn call_json((index, (id, call)): (usize, &(String, ToolCall))) -> Value {
    json!({
        "index": index, "id": id, "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

/// The answer as server-sent events: `data: {chunk}` lines, then `data: [DONE]`. A task turns the
/// worker's updates into events; when the client goes away the response body, and with it the
/// event channel, is dropped, the task ends, and the worker sees its update channel closed.
fn stream(
    s: Arc<AppState>,
    meta: Meta,
    mut choices: Choices,
    mut rx: mpsc::UnboundedReceiver<Update>,
    include_usage: bool,
    n_prompt: usize,
) -> Response {
    let (tx, events) = mpsc::channel::<Result<Event, Infallible>>(64);
    let started = Instant::now();
    tokio::spawn(async move {
        let send = |v: Value| Event::default().data(v.to_string());
        let mut failed = None;
        while !choices.all_done() {
            // A client that leaves while its request waits for a slot (no tokens to send yet)
            // ends it here, before it runs.
            let u = tokio::select! {
                u = rx.recv() => u,
                _ = tx.closed() => return,
            };
            let Some(u) = u else {
                failed = Some("the model worker has stopped".to_string());
                break;
            };
            if let Err(e) = choices.apply(u, &s) {
                failed = Some(e);
                break;
            }
            for (i, d, finish) in std::mem::take(&mut choices.out) {
                let c = &mut choices.c[i];
                let first = !c.started;
                c.started = true;
                // The tokens since the last chunk: their text may have been held back until now.
                let lp = if choices.logprobs {
                    let new = &c.logprobs[c.sent_logprobs..];
                    let v = meta.logprobs(new, c.sent_chars, s.tokenizer);
                    c.sent_chars += logprobs::chars(new, s.tokenizer);
                    c.sent_logprobs = c.logprobs.len();
                    v
                } else {
                    Value::Null
                };
                // The calls this delta completed: the last ones recorded.
                let n = d.tool_calls.len();
                let all = &c.tool_calls;
                let calls: Vec<(usize, &(String, ToolCall))> =
                    (all.len() - n..all.len()).map(|k| (k, &all[k])).collect();
                let ch = meta.choice_delta(i, &d, first, finish, lp, &calls);
                if tx
                    .send(Ok(send(meta.chunk(vec![ch], include_usage))))
                    .await
                    .is_err()
                {
                    return; // the client is gone
                }
            }
        }
        if let Some(e) = failed {
            let _ = tx.send(Ok(send(ApiError::internal(e).body()))).await;
        } else if include_usage {
            let mut last = meta.chunk(vec![], false);
            last["usage"] = choices.usage(n_prompt);
            let _ = tx.send(Ok(send(last))).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
        let path = if meta.kind == Kind::Chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let completion = choices.completion_tokens();
        let tokens = LogTokens {
            prompt: n_prompt,
            completion,
        };
        crate::log_line("POST", path, 200, Some(tokens), started.elapsed());
        s.metrics.request(path, 200);
        s.metrics.tokens(n_prompt, completion);
    });
    let body =
        futures_util::stream::unfold(
            events,
            |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
        );
    let mut r = Sse::new(body)
        .keep_alive(KeepAlive::default())
        .into_response();
    r.extensions_mut().insert(LogLater);
    r
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

#[cfg(test)]
#[path = "routes_tests.rs"]
mod answer_tests;
