//! A generation job: what a checked request asks of the engine ([`Params`], `Job`), shared by
//! the engine handle (engine.rs), which queues it, and answer shaping (answer.rs), which turns its
//! tokens into JSON. Also the request log's pieces, which both the log middleware (routes.rs)
//! and a stream's end (answer.rs) write.
//!
//! These types sit below the modules that use them, so that the request types build a job, the
//! engine handle runs it and the answer shapes it without any of them importing another upward.

use qwen3_inference::constraint::Constraint;
use qwen3_inference::sampler::SamplerConfig;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Which endpoint a job came from: it decides the answer's shape and its defaults.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

/// What a request asks of the engine, read and checked (request.rs reads it).
#[derive(Debug, Clone)]
pub struct Params {
    /// The model it names, if any.
    pub model: Option<String>,
    /// The first choice's sampler (choice `i` gets seed `seed + i`).
    pub sampler: SamplerConfig,
    /// `max_tokens` or `max_completion_tokens`, if given.
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's and llama-server's `ignore_eos`: generate `max_tokens` whatever the model says
    /// (for benchmarks).
    pub ignore_eos: bool,
}

/// A generation request, read: the prompt as token ids and how to read the answer's tokens.
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
    /// The grammar the answer must match (`response_format`, a tool call), if any.
    pub(crate) constraint: Option<Constraint>,
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

/// One request log line on stderr: method, path, status, tokens, milliseconds.
pub fn log_line(method: &str, path: &str, status: u16, tokens: Option<LogTokens>, took: Duration) {
    let tokens = tokens.map_or(String::new(), |t| {
        format!(" prompt={} completion={}", t.prompt, t.completion)
    });
    eprintln!(
        "{method} {path} {status}{tokens} {:.0}ms",
        took.as_secs_f64() * 1000.0
    );
}
