//! A generation job: what a checked request asks of the engine ([`Params`], `Job`), shared by
//! the engine handle (engine.rs), which queues it, and answer shaping (answer.rs), which turns its
//! tokens into JSON. Also the request log's pieces, which both the log middleware (routes.rs)
//! and a stream's end (pump.rs) write.
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

/// What a request asks of the engine, read and checked (request/ reads it).
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
    /// `speculative: false` opts out of the server's drafts (`--draft`): the answer is the same
    /// either way, only the steps differ.
    pub speculative: bool,
}

/// A generation request, read: the prompt as token ids and how to read the answer's tokens.
pub(crate) struct Job {
    pub(crate) kind: Kind,
    /// The prompts as token ids: one, or (`/v1/completions` with a list) several, each answered
    /// by `n` choices.
    pub(crate) prompts: Vec<Vec<u32>>,
    /// `/v1/completions`' `echo`: each choice's text (and log-probabilities) start with its
    /// prompt.
    pub(crate) echo: bool,
    /// Split `<think>` off (`Some(starts inside)`), for a thinking model's chat.
    pub(crate) reasoning: Option<bool>,
    pub(crate) stop_ids: Vec<u32>,
    /// Alternatives to report with each token's log-probability (`None`: no log-probabilities).
    pub(crate) logprobs: Option<usize>,
    /// Cut `<tool_call>` blocks out of the answer (a chat with tools): the beginning of the call
    /// the prompt already holds (empty unless `tool_choice` forces a call), and the tools.
    pub(crate) tool_calls: Option<qwen3_inference::chat::tool_calls::ToolCalls>,
    /// The grammar the answer must match (`response_format`, a tool call), if any.
    pub(crate) constraint: Option<Constraint>,
    /// When the request arrived (its time to first token counts from here).
    pub(crate) start: Instant,
    /// A chat's images, encoded, at their rows of its one prompt (request/chat.rs).
    pub(crate) images: Option<qwen3_inference::engine::PromptImages>,
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

/// Logs and counts a generation request the client left before its answer was complete, when
/// dropped armed: status 499 (nginx's "client closed request"), with the tokens generated so
/// far. The handler (or a stream's task) holds it while it waits; a client that hangs up drops
/// that future, and with it the guard.
pub(crate) struct LeftEarly {
    pub(crate) state: std::sync::Arc<crate::state::AppState>,
    pub(crate) path: &'static str,
    pub(crate) prompt: usize,
    /// Tokens generated so far (kept up to date by the holder).
    pub(crate) completion: usize,
    pub(crate) start: Instant,
    /// Cleared when the answer is complete (it is then logged as such).
    pub(crate) armed: bool,
}

impl LeftEarly {
    /// Armed, for a request to `path` with `prompt` tokens that arrived at `start`.
    pub(crate) fn new(
        state: &std::sync::Arc<crate::state::AppState>,
        path: &'static str,
        prompt: usize,
        start: Instant,
    ) -> LeftEarly {
        LeftEarly {
            state: state.clone(),
            path,
            prompt,
            completion: 0,
            start,
            armed: true,
        }
    }
}

impl Drop for LeftEarly {
    fn drop(&mut self) {
        if self.armed {
            let tokens = LogTokens {
                prompt: self.prompt,
                completion: self.completion,
            };
            log_line("POST", self.path, 499, Some(tokens), self.start.elapsed());
            self.state.metrics.request(self.path, 499);
            self.state.metrics.tokens(self.prompt, self.completion);
        }
    }
}

/// The route of a job's kind, for the log.
pub(crate) fn route(kind: Kind) -> &'static str {
    match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    }
}

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
