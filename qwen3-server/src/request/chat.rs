//! `POST /v1/chat/completions`' request: the messages (text and images), the tools and
//! `tool_choice`, rendered by the model's chat template while the body is read, and turned into
//! the engine handle's job, with its images encoded by the vision tower.

use super::{common, logprobs, no_ignore_eos, typed, Echo};
use crate::error::ApiError;
use crate::images::{self, ImagePart, ImageRules};
use crate::job::{Job, Kind, Params};
use crate::state::AppState;
use crate::structured;
use qwen3_inference::chat::tool_calls::{ToolCalls, ToolChoice};
use qwen3_inference::constraint::Constraint;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

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
    /// The messages' images, in order (`into_job` encodes them into the job).
    pub images: Vec<ImagePart>,
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
        let (messages, thinking, images) = chat_messages(&v, ImageRules::of(s))?;
        if !images.is_empty() && s.images.is_none() {
            return Err(ApiError::invalid(images[0].param.clone(), images::NO_TOWER));
        }
        if images.len() > s.max_images {
            return Err(ApiError::invalid(
                "messages".to_string(),
                format!(
                    "{} images: this server takes at most {} in one request (--max-images)",
                    images.len(),
                    s.max_images
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

    /// The job the engine handle runs (`start`: when the request arrived), with the images (if
    /// any) decoded, encoded by the model's tower and put in place of their pads, on a blocking
    /// thread: decoding and the tower take milliseconds to seconds, which the async threads must
    /// not spend. An image that cannot be decoded is the request's fault: a 400 naming it.
    pub(crate) async fn into_job(
        mut self,
        s: &Arc<AppState>,
        start: Instant,
    ) -> Result<(Job, Params), ApiError> {
        let parts = std::mem::take(&mut self.images);
        if parts.is_empty() {
            return Ok(self.text_job(s, start));
        }
        let rules = ImageRules::of(s);
        // Images given as URLs are fetched first (`--fetch-image-urls`), on a blocking thread
        // of their own and within one time limit for the request, before it waits for its
        // turn at the tower: a slow web server holds up this request only.
        let files = match parts.iter().any(ImagePart::is_url) {
            true => tokio::task::spawn_blocking(move || images::fetch_all(parts, rules))
                .await
                .map_err(|e| ApiError::internal(format!("fetching the images failed: {e}")))??,
            // Nothing to fetch: the bytes are moved, not copied.
            false => images::fetch_all(parts, rules)?,
        };
        // One request's images at a time: the tower already uses every thread, and a burst of
        // image requests then waits its turn instead of multiplying its memory.
        let _turn = ENCODES
            .acquire()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let state = s.clone();
        tokio::task::spawn_blocking(move || {
            let encoder = state
                .images
                .as_ref()
                .ok_or_else(|| ApiError::invalid("messages".to_string(), images::NO_TOWER))?;
            let encoded = files
                .iter()
                .map(|f| {
                    encoder
                        .encode(&f.bytes, state.max_image_pixels, state.context_len)
                        .map_err(|e| ApiError::invalid(f.param.clone(), format!("{e:#}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (mut job, params) = self.text_job(&state, start);
            let (prompt, images) = encoder
                .prompt(&job.prompts[0], encoded)
                .map_err(|e| ApiError::invalid("messages".to_string(), format!("{e:#}")))?;
            if prompt.len() > state.context_len {
                return Err(ApiError::invalid(
                    "messages".to_string(),
                    format!(
                        "the prompt has {} tokens with its images but the context holds {}",
                        prompt.len(),
                        state.context_len
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            state.metrics.images(files.len());
            job.prompts[0] = prompt;
            job.images = Some(images);
            Ok((job, params))
        })
        .await
        .map_err(|e| ApiError::internal(format!("encoding the images failed: {e}")))?
    }

    /// The job of the conversation's text, images not yet in it (`start`: when the request
    /// arrived).
    fn text_job(self, s: &AppState, start: Instant) -> (Job, Params) {
        // With tools shown, `<tool_call>` blocks are cut out of the answer; the answer of a
        // forced call starts inside one.
        let tool_calls = shown_tools(&self.tools, &self.tool_choice).map(|tools| ToolCalls {
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

/// Requests whose images are being encoded: one at a time.
static ENCODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The tools the model is shown: none with `tool_choice: "none"`.
fn shown_tools<'a>(tools: &'a [Value], choice: &ToolChoice) -> Option<&'a [Value]> {
    (!tools.is_empty() && *choice != ToolChoice::None).then_some(tools)
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

/// The messages' images, in order.
type Images = Vec<ImagePart>;

/// `/v1/chat/completions`' `messages`, as the JSON messages the chat template reads,
/// `chat_template_kwargs.enable_thinking`, and the messages' images.
/// `rules`: whether the server fetches `http(s)` image URLs (`--fetch-image-urls`; otherwise
/// one is refused here, before anything else is done for the request) and how large an image
/// may be.
pub(super) fn chat_messages(
    v: &Value,
    rules: ImageRules,
) -> Result<(Vec<Value>, Option<bool>, Images), ApiError> {
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
        .map(|(i, m)| message(i, m, rules, &mut images))
        .collect::<Result<_, _>>()?;
    let thinking = body.chat_template_kwargs.and_then(|k| k.enable_thinking);
    Ok((out, thinking, images))
}

/// One message, checked: a known role, and content that is text (a string, or a list of text
/// parts, which are joined) or, with images, a list of text parts and `{"type": "image"}`
/// parts in their order, as Qwen3.5's template reads them (the images' bytes go to `images`).
fn message(i: usize, m: &Value, rules: ImageRules, images: &mut Images) -> Result<Value, ApiError> {
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
                    _ => match images::image_part(p, &param, rules)? {
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
