//! `POST /v1/completions`' request: a raw prompt (text or token ids, one or several), checked
//! and turned into the engine handle's job.

use super::{common, logprobs, no_ignore_eos, typed, Echo, MAX_CHOICES};
use crate::error::ApiError;
use crate::job::{Job, Kind, Params};
use crate::state::AppState;
use crate::structured;
use qwen3_inference::constraint::Constraint;
use qwen3_inference::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;
use std::time::Instant;

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
