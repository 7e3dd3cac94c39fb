//! The requests of OpenAI's API as this server reads them: one validated type per endpoint,
//! [`CompletionRequest`] and [`ChatRequest`], each built from the body in one place (its
//! `parse`). Every field the server knows is checked for type and range there, and a wrong one
//! is a 400 naming it (`param`); a route gets either a request it can run or that error, and
//! turns the request into a `Job` for the engine handle.
//!
//! Unknown fields are ignored, as OpenAI's own server and vLLM ignore them; fields this server
//! cannot honour yet (`echo`, `logit_bias`, ...) are refused rather than silently dropped.
//! `response_format` and the tools' grammars are compiled here (structured.rs), so that a schema
//! the engine cannot enforce is a 400 before anything runs.
//! The fields are read in a fixed order (shared fields, then the endpoint's own), so a body
//! with several faults always gets the same error.
//!
//! References: OpenAI's API reference for `/v1/completions` and `/v1/chat/completions`; vLLM's
//! extra fields (`top_k`, `min_p`, `repetition_penalty`, `chat_template_kwargs`,
//! `ignore_eos`).

mod chat;
mod completion;
#[cfg(test)]
mod tests;

pub use chat::ChatRequest;
pub use completion::CompletionRequest;

use crate::error::ApiError;
use crate::job::Params;
use crate::state::AppState;
use axum::http::StatusCode;
use qwen3_inference::constraint::Constraint;
use qwen3_inference::format::GenerationDefaults;
use qwen3_inference::sampler::SamplerConfig;
use serde::Deserialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The body and the fields both endpoints share, checked, for the model this server runs.
fn common(body: &[u8], s: &AppState) -> Result<(Value, Params), ApiError> {
    let v = parse_body(body)?;
    let params = params(&v, &s.defaults, default_seed())?;
    check_model(s, params.model.as_deref())?;
    Ok((v, params))
}

/// A constraint (`response_format`, a tool call's grammar) with `ignore_eos` is refused: a
/// grammar ends an answer by allowing only the end-of-sequence ids, which `ignore_eos` takes away.
fn no_ignore_eos(constraint: &Option<Constraint>, params: &Params) -> Result<(), ApiError> {
    if constraint.is_some() && params.ignore_eos {
        return Err(ApiError::invalid(
            "ignore_eos".to_string(),
            "ignore_eos cannot be combined with response_format or tool calls, which end the answer when it is complete",
        ));
    }
    Ok(())
}

/// A model name other than the one this server runs is a 404 (`model_not_found`), as OpenAI
/// answers; no name is fine.
pub fn check_model(s: &AppState, name: Option<&str>) -> Result<(), ApiError> {
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

/// A seed from the clock, for requests that do not give one (as `qwen3 inference` does).
fn default_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}

// What follows reads one field (or a group of related fields) each: the only place each field's
// error is made.

/// The body as JSON: malformed JSON, or anything but an object, is a 400.
pub(crate) fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    }
    Ok(v)
}

/// Deserializes `v` as `T`; a field of the wrong type is a 400 whose `param` names it.
pub(crate) fn typed<T: for<'de> Deserialize<'de>>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(path.clone(), format!("{path}: {}", e.inner()))
    })
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// An integer field: a JSON integer, or a number with no fraction (`4.0`), as JavaScript
/// clients and spec-driven fuzzers write them. Wide enough for any u64 seed and any i64.
#[derive(Clone, Copy)]
pub(crate) struct Int(i128);

impl Int {
    /// The value, saturated to i64 (counts and limits are checked against far smaller bounds).
    pub(crate) fn get(self) -> i64 {
        self.0.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        if let Some(i) = n.as_i64() {
            return Ok(Int(i.into()));
        }
        if let Some(u) = n.as_u64() {
            return Ok(Int(u.into()));
        }
        match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e30 => Ok(Int(f as i128)),
            _ => Err(serde::de::Error::custom(format!(
                "expected an integer, got {n}"
            ))),
        }
    }
}

/// The fields both endpoints share.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<Int>,
    max_completion_tokens: Option<Int>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<Int>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<Int>,
    stop: Option<Stop>,
    n: Option<Int>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    ignore_eos: Option<bool>,
    speculative: Option<bool>,
}

/// Fields of OpenAI's API that this server does not implement: given with a value that asks for
/// them, they are refused (a client that needs them should know). Their defaults and no-op
/// values (`false`, `null`, `[]`, `{}`, `""`, `best_of: 1`) are what clients send when they do
/// not ask, and are accepted.
const UNSUPPORTED: [&str; 4] = ["suffix", "best_of", "logit_bias", "functions"];

/// `echo` (`/v1/completions` only).
#[derive(Deserialize)]
struct Echo {
    echo: Option<bool>,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 16;
/// Most choices of one `/v1/completions` request: prompts x `n`.
pub const MAX_CHOICES: usize = 128;
/// Most stop strings.
pub const MAX_STOPS: usize = 16;

/// Reads the shared fields of `v`; sampling defaults come from the model's generation config,
/// and the seed, when not given, from `default_seed`.
pub(crate) fn params(
    v: &Value,
    defaults: &GenerationDefaults,
    default_seed: u64,
) -> Result<Params, ApiError> {
    for name in UNSUPPORTED {
        match v.get(name) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::Object(o)) if o.is_empty() => {}
            Some(Value::String(t)) if t.is_empty() => {}
            // best_of = n: the n samples are the best n of n.
            Some(Value::Number(b))
                if name == "best_of"
                    && b.as_f64() == Some(v.get("n").and_then(Value::as_f64).unwrap_or(1.0)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    name.to_string(),
                    format!("{name} is not supported by this server"),
                ))
            }
        }
    }
    let c: Common = typed(v)?;
    let mut s = SamplerConfig::from_defaults(defaults, default_seed);
    let range = |name: &str, x: Option<f32>, ok: &dyn Fn(f32) -> bool, what: &str| match x {
        Some(x) if !x.is_finite() || !ok(x) => Err(ApiError::invalid(
            name.to_string(),
            format!("{name} must be {what}, got {x}"),
        )),
        _ => Ok(x),
    };
    if let Some(t) = range(
        "temperature",
        c.temperature,
        &|t| (0.0..=2.0).contains(&t),
        "in [0, 2]",
    )? {
        s.temperature = t;
    }
    // top_p 0 keeps only the most likely token: greedy (top-k 1), as vLLM reads it.
    let top_p_zero = match range("top_p", c.top_p, &|p| (0.0..=1.0).contains(&p), "in [0, 1]")? {
        Some(0.0) => true,
        Some(p) => {
            s.top_p = p;
            false
        }
        None => false,
    };
    if let Some(p) = range("min_p", c.min_p, &|p| (0.0..=1.0).contains(&p), "in [0, 1]")? {
        s.min_p = p;
    }
    let pen = |p: f32| (-2.0..=2.0).contains(&p);
    if let Some(p) = range("presence_penalty", c.presence_penalty, &pen, "in [-2, 2]")? {
        s.presence_penalty = p;
    }
    if let Some(p) = range("frequency_penalty", c.frequency_penalty, &pen, "in [-2, 2]")? {
        s.frequency_penalty = p;
    }
    let rep = |p: f32| p > 0.0 && p <= 10.0;
    if let Some(p) = range(
        "repetition_penalty",
        c.repetition_penalty,
        &rep,
        "in (0, 10]",
    )? {
        s.repetition_penalty = p;
    }
    match c.top_k.map(Int::get) {
        // vLLM's convention: -1 (or 0) keeps every token.
        Some(-1) | Some(0) => s.top_k = 0,
        Some(k) if k > 0 => s.top_k = k.min(u32::MAX as i64) as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k".to_string(),
                format!("top_k must be -1 (off) or at least 0, got {k}"),
            ))
        }
        None => {}
    }
    if top_p_zero {
        s.top_k = 1;
        s.top_p = 1.0;
    }
    if let Some(seed) = c.seed {
        // Any integer: negative ones keep their bits.
        s.seed = seed.0 as u64;
    }
    let max_tokens = match (
        c.max_completion_tokens.map(Int::get),
        c.max_tokens.map(Int::get),
    ) {
        (Some(m), _) => Some(("max_completion_tokens", m)),
        (None, Some(m)) => Some(("max_tokens", m)),
        _ => None,
    };
    let max_tokens = match max_tokens {
        // 0 is for scoring a prompt (`/v1/completions` with `echo`); the endpoints check it.
        Some((name, m)) if m < 0 => {
            return Err(ApiError::invalid(
                name.to_string(),
                format!("{name} must not be negative, got {m}"),
            ))
        }
        Some((_, m)) => Some(m.min(u32::MAX as i64) as usize),
        None => None,
    };
    let stops = match c.stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop".to_string(),
            format!("stop must be at most {MAX_STOPS} non-empty strings"),
        ));
    }
    let n = c.n.map_or(1, Int::get);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ApiError::invalid(
            "n".to_string(),
            format!("n must be in 1 ..= {MAX_N}, got {n}"),
        ));
    }
    let stream = c.stream.unwrap_or(false);
    Ok(Params {
        model: c.model,
        sampler: s,
        max_tokens,
        stops,
        n: n as usize,
        stream,
        include_usage: stream
            && c.stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        speculative: c.speculative.unwrap_or(true),
    })
}

/// How many alternatives to report with each token's log-probability, or `None` for none:
/// `/v1/chat/completions` takes `logprobs: true` and `top_logprobs: 0..=20`; `/v1/completions`
/// takes `logprobs: 0..=20` (OpenAI's legacy limit is 5; vLLM's is 20, as here).
fn logprobs(v: &Value, chat: bool) -> Result<Option<usize>, ApiError> {
    let max = qwen3_inference::logprobs::MAX_TOP as i64;
    let bad = |name: &str, what: String| Err(ApiError::invalid(name.to_string(), what));
    if chat {
        #[derive(Deserialize)]
        struct Body {
            logprobs: Option<bool>,
            top_logprobs: Option<Int>,
        }
        let b: Body = typed(v)?;
        match (b.logprobs.unwrap_or(false), b.top_logprobs.map(Int::get)) {
            (_, Some(k)) if !(0..=max).contains(&k) => bad(
                "top_logprobs",
                format!("top_logprobs must be in 0 ..= {max}, got {k}"),
            ),
            (false, Some(_)) => bad("top_logprobs", "top_logprobs needs logprobs: true".into()),
            (false, None) => Ok(None),
            (true, k) => Ok(Some(k.unwrap_or(0) as usize)),
        }
    } else {
        #[derive(Deserialize)]
        struct Body {
            logprobs: Option<Int>,
        }
        match typed::<Body>(v)?.logprobs.map(Int::get) {
            None => Ok(None),
            Some(k) if (0..=max).contains(&k) => Ok(Some(k as usize)),
            Some(k) => bad(
                "logprobs",
                format!("logprobs must be in 0 ..= {max}, got {k}"),
            ),
        }
    }
}
