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

use crate::error::ApiError;
use crate::job::{Job, Kind, Params};
use crate::state::AppState;
use crate::structured;
use axum::http::StatusCode;
use qwen3_inference::constraint::Constraint;
use qwen3_inference::format::GenerationDefaults;
use qwen3_inference::sampler::SamplerConfig;
use qwen3_inference::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// `POST /v1/completions`, checked: a raw prompt, completed as `qwen3 inference -m generate`
/// does.
pub struct CompletionRequest {
    pub params: Params,
    /// `prompt`, as token ids (text is encoded with its special tokens, as the CLI does): one
    /// or more prompts.
    pub prompts: Vec<Vec<u32>>,
    /// `echo`: the answer repeats the prompt before the completion.
    pub echo: bool,
    /// `logprobs: K`: alternatives to report with each token, or `None` for none.
    pub logprobs: Option<usize>,
    /// `response_format`, compiled.
    pub constraint: Option<Constraint>,
}

impl CompletionRequest {
    /// Reads and checks `body` for the model `s` runs.
    pub fn parse(body: &[u8], s: &AppState) -> Result<CompletionRequest, ApiError> {
        let (v, params) = common(body, s)?;
        let prompts = completion_prompt(&v, s.tokenizer)?;
        let echo = typed::<Echo>(&v)?.echo.unwrap_or(false);
        // Nothing to generate is a request only to score the prompt (evaluation harnesses).
        if params.max_tokens == Some(0) && !echo {
            return Err(ApiError::invalid(
                "max_tokens".to_string(),
                "max_tokens must be at least 1 (0 is allowed only with echo)",
            ));
        }
        let choices = prompts.len() * params.n;
        if choices > MAX_CHOICES {
            return Err(ApiError::invalid(
                "prompt".to_string(),
                format!(
                    "{} prompts x n {} = {choices} choices: at most {MAX_CHOICES} in one request",
                    prompts.len(),
                    params.n
                ),
            ));
        }
        let logprobs = logprobs(&v, false)?;
        let format = structured::response_format(&v)?;
        let constraint = structured::completion(s, format.as_ref())?;
        no_ignore_eos(&constraint, &params)?;
        Ok(CompletionRequest {
            params,
            prompts,
            echo,
            logprobs,
            constraint,
        })
    }

    /// The job the engine handle runs (`start`: when the request arrived).
    pub(crate) fn into_job(self, s: &AppState, start: Instant) -> (Job, Params) {
        let job = Job {
            kind: Kind::Completion,
            prompts: self.prompts,
            echo: self.echo,
            reasoning: None,
            stop_ids: s.eos_ids.clone(),
            logprobs: self.logprobs,
            tool_calls: None,
            constraint: self.constraint,
            start,
            images: None,
        };
        (job, self.params)
    }
}

/// `POST /v1/chat/completions`, checked: a conversation, rendered by the model's chat template.
pub struct ChatRequest {
    pub params: Params,
    /// `messages`, as the chat template reads them: roles known, content as text.
    pub messages: Vec<Value>,
    /// `chat_template_kwargs.enable_thinking`, if given.
    pub thinking: Option<bool>,
    /// `tools`, as given (the template renders them), and `tool_choice`.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// `logprobs: true` with `top_logprobs: K`, or `None` for none.
    pub logprobs: Option<usize>,
    /// The conversation as the template renders it, up to where the answer starts (with the
    /// beginning of a call when `tool_choice` forces one). Rendered while the request is read,
    /// because a template that refuses the conversation is a fault of `messages`.
    pub text: String,
    /// `response_format` and the tool calls' grammar, compiled (structured.rs).
    pub constraint: Option<Constraint>,
    /// The messages' images, in order (images.rs encodes them into the job).
    pub images: Vec<crate::images::ImagePart>,
}

impl ChatRequest {
    /// Reads and checks `body` for the model `s` runs, and renders it with the model's template.
    pub fn parse(body: &[u8], s: &AppState) -> Result<ChatRequest, ApiError> {
        let (v, params) = common(body, s)?;
        if params.max_tokens == Some(0) {
            return Err(ApiError::invalid(
                "max_tokens".to_string(),
                "max_tokens must be at least 1",
            ));
        }
        if typed::<Echo>(&v)?.echo == Some(true) {
            return Err(ApiError::invalid(
                "echo".to_string(),
                "echo is a field of /v1/completions, not of chat",
            ));
        }
        let (messages, thinking, images) = chat_messages(&v)?;
        if !images.is_empty() && s.images.is_none() {
            return Err(ApiError::invalid(
                images[0].param.clone(),
                crate::images::NO_TOWER,
            ));
        }
        if images.len() > crate::images::MAX_IMAGES {
            return Err(ApiError::invalid(
                "messages".to_string(),
                format!(
                    "{} images: at most {} in one request",
                    images.len(),
                    crate::images::MAX_IMAGES
                ),
            ));
        }
        let Some(template) = &s.template else {
            return Err(ApiError::invalid(
                None,
                "this model has no chat template: use /v1/completions",
            ));
        };
        let (tools, tool_choice) = tools(&v)?;
        let shown = shown_tools(&tools, &tool_choice);
        let mut text = template
            .render_json(&messages, shown, true, thinking)
            .map_err(|e| ApiError::invalid("messages".to_string(), format!("{e:#}")))?;
        text.push_str(&tool_choice.forced_start(s.xml_tool_calls));
        let logprobs = logprobs(&v, true)?;
        let format = structured::response_format(&v)?;
        let constraint = structured::chat(s, format.as_ref(), &tools, &tool_choice, &text)?;
        no_ignore_eos(&constraint, &params)?;
        Ok(ChatRequest {
            params,
            messages,
            thinking,
            tools,
            tool_choice,
            logprobs,
            text,
            constraint,
            images,
        })
    }

    /// The job the engine handle runs (`start`: when the request arrived).
    pub(crate) fn into_job(self, s: &AppState, start: Instant) -> (Job, Params) {
        // With tools shown, `<tool_call>` blocks are cut out of the answer; the answer of a
        // forced call starts inside one.
        let tool_calls =
            shown_tools(&self.tools, &self.tool_choice).map(|tools| crate::tool_calls::ToolCalls {
                prefix: self.tool_choice.forced_start(s.xml_tool_calls),
                tools: tools.into(),
            });
        // A template that opens the reasoning block in the prompt (DeepSeek-R1's) starts the
        // answer inside it.
        let reasoning = s
            .thinking_template
            .then(|| self.text.trim_end().ends_with("<think>"));
        let job = Job {
            kind: Kind::Chat,
            prompts: vec![s.tokenizer.encode(&self.text)],
            echo: false,
            reasoning,
            stop_ids: s.chat_stop_ids.clone(),
            logprobs: self.logprobs,
            tool_calls,
            constraint: self.constraint,
            start,
            images: None,
        };
        (job, self.params)
    }
}

/// The tools the model is shown: none with `tool_choice: "none"`.
fn shown_tools<'a>(tools: &'a [Value], choice: &ToolChoice) -> Option<&'a [Value]> {
    (!tools.is_empty() && *choice != ToolChoice::None).then_some(tools)
}

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

/// `tool_choice`: whether and how the answer calls a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// Some call: the answer starts with `<tool_call>`.
    Required,
    /// This function: the answer starts with the call's beginning, its name filled in.
    Named(String),
}

impl ToolChoice {
    /// The beginning of the answer the prompt already holds: with "required" and a named
    /// function the answer starts as a call does (Qwen's format, the only way the template has
    /// to ask; in XML when the template writes calls so), and the model writes the rest. Empty
    /// otherwise.
    fn forced_start(&self, xml: bool) -> String {
        match self {
            ToolChoice::Required => "<tool_call>\n".to_string(),
            ToolChoice::Named(name) if xml => format!("<tool_call>\n<function={name}>\n"),
            ToolChoice::Named(name) => format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                Value::from(name.as_str())
            ),
            ToolChoice::Auto | ToolChoice::None => String::new(),
        }
    }
}

/// `/v1/chat/completions`' `tools` (OpenAI's `{"type": "function", "function": {"name", ...}}`
/// list, given to the chat template as is) and `tool_choice`.
fn tools(v: &Value) -> Result<(Vec<Value>, ToolChoice), ApiError> {
    let tools = match v.get("tools") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(t)) => t.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "tools".to_string(),
                "tools must be a list",
            ))
        }
    };
    let mut names = vec![];
    for (i, t) in tools.iter().enumerate() {
        match (t["type"].as_str(), t["function"]["name"].as_str()) {
            (Some("function"), Some(name)) => names.push(name),
            _ => {
                return Err(ApiError::invalid(
                    format!("tools[{i}]"),
                    "a tool is {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}",
                ))
            }
        }
    }
    let choice = match v.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(c) => match c["function"]["name"].as_str() {
            Some(name) if c["type"] == "function" => ToolChoice::Named(name.to_string()),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice".to_string(),
                    "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    let missing = match &choice {
        ToolChoice::Required => tools
            .is_empty()
            .then(|| "tool_choice \"required\" needs tools".to_string()),
        ToolChoice::Named(n) if !names.contains(&n.as_str()) => Some(format!(
            "tool_choice names {n:?}, which is not among the tools"
        )),
        _ => None,
    };
    if let Some(why) = missing {
        return Err(ApiError::invalid("tool_choice".to_string(), why));
    }
    Ok((tools, choice))
}

/// `/v1/completions`' `prompt`: a string or a list of token ids, or a list of either (several
/// prompts, each answered by its own choices).
fn completion_prompt(v: &Value, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Prompt {
        Text(String),
        Ids(Vec<u32>),
        Texts(Vec<String>),
        IdLists(Vec<Vec<u32>>),
    }
    let p = match v.get("prompt") {
        None => {
            return Err(ApiError::invalid(
                "prompt".to_string(),
                "prompt is required",
            ))
        }
        // The spec's default: generate as from the start of a new document.
        Some(Value::Null) => Value::String(String::new()),
        Some(p) => p.clone(),
    };
    let bad = || {
        ApiError::invalid(
            "prompt".to_string(),
            "prompt must be a string, a list of token ids (integers from 0), or a list of either",
        )
    };
    let mut prompts = match serde_json::from_value::<Prompt>(p).map_err(|_| bad())? {
        Prompt::Text(t) => vec![tok.encode_with_special_tokens(&t)],
        Prompt::Ids(ids) => vec![ids],
        Prompt::Texts(t) => t
            .iter()
            .map(|t| tok.encode_with_special_tokens(t))
            .collect(),
        Prompt::IdLists(l) => l,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            "prompt".to_string(),
            "the list of prompts is empty",
        ));
    }
    // An empty prompt is OpenAI's `<|endoftext|>` (its default prompt, the document separator
    // of GPT's and Qwen's tokenizers): the model starts a new document.
    for (i, ids) in prompts.iter_mut().enumerate() {
        if ids.is_empty() {
            let Some(start) = tok.token_id("<|endoftext|>") else {
                let which = match i {
                    0 => "the prompt".to_string(),
                    i => format!("prompt {i}"),
                };
                return Err(ApiError::invalid(
                    "prompt".to_string(),
                    format!(
                        "{which} is empty and this tokenizer has no <|endoftext|> to start from"
                    ),
                ));
            };
            ids.push(start);
        }
    }
    Ok(prompts)
}

/// The messages' images, in order.
type Images = Vec<crate::images::ImagePart>;

/// `/v1/chat/completions`' `messages`, as the JSON messages the chat template reads,
/// `chat_template_kwargs.enable_thinking`, and the messages' images.
fn chat_messages(v: &Value) -> Result<(Vec<Value>, Option<bool>, Images), ApiError> {
    #[derive(Deserialize)]
    struct Kwargs {
        enable_thinking: Option<bool>,
    }
    #[derive(Deserialize)]
    struct Body {
        messages: Option<Vec<Value>>,
        chat_template_kwargs: Option<Kwargs>,
    }
    let body: Body = typed(v)?;
    let messages = body
        .messages
        .ok_or_else(|| ApiError::invalid("messages".to_string(), "messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages".to_string(),
            "messages must hold at least one message",
        ));
    }
    let mut images = Vec::new();
    let out = messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m, &mut images))
        .collect::<Result<_, _>>()?;
    let thinking = body.chat_template_kwargs.and_then(|k| k.enable_thinking);
    Ok((out, thinking, images))
}

/// One message, checked: a known role, and content that is text (a string, or a list of text
/// parts, which are joined) or, with images, a list of text parts and `{"type": "image"}`
/// parts in their order, as Qwen3.5's template reads them (the images' bytes go to `images`).
fn message(i: usize, m: &Value, images: &mut Images) -> Result<Value, ApiError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let obj = m.as_object().ok_or_else(|| {
        ApiError::invalid(format!("messages[{i}]"), "a message must be an object")
    })?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
        // OpenAI's newer name for the system role.
        Some("developer") => "system",
        Some(r) => {
            return Err(ApiError::invalid(
                at("role"),
                format!("unknown role {r:?}: expected system, developer, user, assistant or tool"),
            ))
        }
        None => return Err(ApiError::invalid(at("role"), "role must be a string")),
    };
    let content: Value = match obj.get("content") {
        None | Some(Value::Null) if role == "assistant" => String::new().into(),
        Some(Value::String(s)) => s.clone().into(),
        Some(Value::Array(parts)) => {
            let (mut text, mut listed, before) = (String::new(), Vec::new(), images.len());
            for (j, p) in parts.iter().enumerate() {
                let param = format!("messages[{i}].content[{j}]");
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text" | "input_text"), Some(Value::String(t))) => {
                        text.push_str(t);
                        listed.push(serde_json::json!({"type": "text", "text": t}));
                    }
                    _ => match crate::images::image_part(p, &param)? {
                        Some(image) if role == "user" => {
                            images.push(image);
                            listed.push(serde_json::json!({"type": "image"}));
                        }
                        Some(_) => {
                            return Err(ApiError::invalid(
                                param,
                                "images are taken in user messages only",
                            ))
                        }
                        None => return Err(ApiError::invalid(
                            param,
                            "a content part is text ({\"type\": \"text\", \"text\": ...}) or an \
                             image ({\"type\": \"image_url\", \"image_url\": {\"url\": \"data:...\"}})",
                        )),
                    },
                }
            }
            match images.len() > before {
                true => Value::Array(listed),
                false => text.into(),
            }
        }
        _ => {
            return Err(ApiError::invalid(
                at("content"),
                "content must be a string or a list of text and image parts",
            ))
        }
    };
    let mut out = serde_json::Map::new();
    out.insert("role".into(), role.into());
    out.insert("content".into(), content);
    if role == "assistant" {
        // The calls it made, as the template renders them (Qwen3's takes `arguments` as a JSON
        // string, as OpenAI clients send it, or as an object).
        match obj.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for (j, c) in calls.iter().enumerate() {
                    if c["function"]["name"].as_str().is_none() {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].tool_calls[{j}].function.name"),
                            "a tool call needs function.name",
                        ));
                    }
                }
                out.insert("tool_calls".into(), Value::Array(calls.clone()));
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    at("tool_calls"),
                    "tool_calls must be a list",
                ))
            }
        }
        match obj.get("reasoning_content") {
            None | Some(Value::Null) => {}
            Some(Value::String(r)) => {
                out.insert("reasoning_content".into(), r.clone().into());
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    at("reasoning_content"),
                    "reasoning_content must be a string",
                ))
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<Params, ApiError> {
        params(&v, &GenerationDefaults::default(), 1)
    }

    #[test]
    fn fields_are_checked_and_named() {
        let e = p(json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        let e = p(json!({"temperature": 3})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert_eq!(p(json!({"n": 0})).unwrap_err().param.as_deref(), Some("n"));
        let e = p(json!({"max_tokens": -1})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = p(json!({"logit_bias": {"1": 5}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        // What clients send when they do not ask for these: accepted.
        p(json!({"logit_bias": {}, "suffix": "", "best_of": 1, "echo": false})).unwrap();
        let e = p(json!({"best_of": 2})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        p(json!({"best_of": 2, "n": 2})).unwrap();
        // Integers written as numbers with no fraction.
        let ok = p(json!({"max_tokens": 4.0, "n": 2.0, "seed": 3.0, "top_k": 5.0})).unwrap();
        assert_eq!((ok.max_tokens, ok.n, ok.sampler.seed), (Some(4), 2, 3));
        assert_eq!(ok.sampler.top_k, 5);
        let e = p(json!({"max_tokens": 4.5})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        assert_eq!(
            p(json!({"seed": 18446744073709551615u64}))
                .unwrap()
                .sampler
                .seed,
            u64::MAX
        );
        // top_p 0: greedy, as top-k 1.
        let g = p(json!({"top_p": 0})).unwrap();
        assert_eq!((g.sampler.top_k, g.sampler.top_p), (1, 1.0));
        let e = p(json!({"stop": [1]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let ok = p(
            json!({"temperature": 0, "top_k": -1, "seed": -1, "stop": "x",
                          "stream": true, "stream_options": {"include_usage": true},
                          "frequency_penalty": 0.5, "whatever": 1}),
        )
        .unwrap();
        assert_eq!(ok.sampler.temperature, 0.0);
        assert_eq!(ok.sampler.top_k, 0);
        assert_eq!(ok.sampler.seed, u64::MAX);
        assert_eq!(ok.sampler.frequency_penalty, 0.5);
        assert_eq!(ok.stops, ["x"]);
        assert!(ok.include_usage);
    }

    #[test]
    fn messages_are_checked() {
        let m = |v: Value| chat_messages(&json!({ "messages": v }));
        let e = m(json!([{"role": "wizard", "content": "hi"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = m(json!([{"role": "user", "content": 5}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        assert!(m(json!([])).is_err());
        let (ok, _, _) = m(json!([{"role": "developer", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]))
        .unwrap();
        assert_eq!(ok, [json!({"role": "system", "content": "ab"})]);
    }

    #[test]
    fn logprobs_per_endpoint() {
        let lp = |v: Value, chat| logprobs(&v, chat).map_err(|e| e.param.unwrap_or_default());
        assert_eq!(lp(json!({}), true), Ok(None));
        assert_eq!(lp(json!({"logprobs": false}), true), Ok(None));
        assert_eq!(lp(json!({"logprobs": true}), true), Ok(Some(0)));
        assert_eq!(
            lp(json!({"logprobs": true, "top_logprobs": 20}), true),
            Ok(Some(20))
        );
        assert_eq!(
            lp(json!({"top_logprobs": 2}), true),
            Err("top_logprobs".into())
        );
        assert_eq!(
            lp(json!({"logprobs": true, "top_logprobs": 21}), true),
            Err("top_logprobs".into())
        );
        assert_eq!(lp(json!({"logprobs": 2}), true), Err("logprobs".into()));
        assert_eq!(lp(json!({}), false), Ok(None));
        assert_eq!(lp(json!({"logprobs": null}), false), Ok(None));
        assert_eq!(lp(json!({"logprobs": 0}), false), Ok(Some(0)));
        assert_eq!(lp(json!({"logprobs": 5}), false), Ok(Some(5)));
        assert_eq!(lp(json!({"logprobs": 21}), false), Err("logprobs".into()));
        assert_eq!(lp(json!({"logprobs": true}), false), Err("logprobs".into()));
    }
}
