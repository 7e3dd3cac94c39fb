//! `POST /v1/embeddings`: an embedding model's vectors, in OpenAI's shape.
//!
//! Each input is one engine request with nothing to generate: its tokens run through the model
//! beside every other request's rows (prefill-only sequences), and the engine hands back the
//! final norm's output at its last token, normalised as the model's sentence-transformers files
//! say ([`qwen3_inference::engine::Engine::embeds`]). A text is tokenized as HF's
//! `tokenizer(text)` does (Qwen3-Embedding's post-processor appends `<|endoftext|>`, whose hidden
//! state is the vector); token ids are used as given. The instruction a query needs
//! ("Instruct: ...\nQuery: ...", from the model card) is the client's to prepend, as with
//! sentence-transformers' `prompt_name="query"`.
//!
//! `dimensions` keeps the first N values and scales them back to length 1 (Qwen3-Embedding is
//! trained for such "Matryoshka" truncation); `encoding_format: "base64"` sends each vector as
//! the base64 of its little-endian f32 bytes, as OpenAI's does.

use crate::error::ApiError;
use crate::job::{LeftEarly, LogTokens};
use crate::request::{check_model, parse_body, typed, Int};
use crate::state::AppState;
use crate::worker::{Command, Update};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use qwen3_inference::embedding::truncate;
use qwen3_inference::engine::{Rejected, Request};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Most inputs in one request (OpenAI's limit is 2048).
pub const MAX_INPUTS: usize = 2048;

/// `/v1/embeddings`' body, checked.
struct EmbeddingRequest {
    inputs: Vec<Vec<u32>>,
    base64: bool,
    dimensions: Option<usize>,
}

fn parse(body: &[u8], s: &AppState) -> Result<EmbeddingRequest, ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Input {
        Text(String),
        Ids(Vec<u32>),
        Texts(Vec<String>),
        IdLists(Vec<Vec<u32>>),
    }
    #[derive(Deserialize)]
    struct Body {
        model: Option<String>,
        input: Option<Value>,
        encoding_format: Option<String>,
        dimensions: Option<Int>,
    }
    let v = parse_body(body)?;
    let b: Body = typed(&v)?;
    check_model(s, b.model.as_deref())?;
    let bad = |m: String| ApiError::invalid("input".to_string(), m);
    let input = b.input.ok_or_else(|| bad("input is required".into()))?;
    if input.as_array().is_some_and(Vec::is_empty) {
        return Err(bad("the list of inputs is empty".into()));
    }
    let tok = s.tokenizer;
    let inputs = match serde_json::from_value::<Input>(input).map_err(|_| {
        bad("input must be a string, a list of strings, a list of token ids (integers from 0), or a list of such lists".into())
    })? {
        Input::Text(t) => vec![tok.encode_with_special_tokens(&t)],
        Input::Ids(ids) => vec![ids],
        Input::Texts(t) => t.iter().map(|t| tok.encode_with_special_tokens(t)).collect(),
        Input::IdLists(l) => l,
    };
    if inputs.is_empty() {
        return Err(bad("the list of inputs is empty".into()));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(bad(format!(
            "{} inputs: at most {MAX_INPUTS} in one request",
            inputs.len()
        )));
    }
    if let Some(i) = inputs.iter().position(Vec::is_empty) {
        return Err(bad(format!("input {i} has no tokens")));
    }
    let ctx = s.context_len;
    if let Some(i) = inputs.iter().position(|x| x.len() > ctx) {
        return Err(bad(format!(
            "input {i} has {} tokens; this server's context holds {ctx}",
            inputs[i].len()
        ))
        .with_code("context_length_exceeded"));
    }
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format".to_string(),
                format!("encoding_format must be \"float\" or \"base64\", got {other:?}"),
            ))
        }
    };
    let dim = s.info.embedding_length as i64;
    let dimensions = match b.dimensions.map(Int::get) {
        None => None,
        Some(n) if (1..=dim).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid(
                "dimensions".to_string(),
                format!("dimensions must be in 1 ..= {dim} (this model's vectors), got {n}"),
            ))
        }
    };
    Ok(EmbeddingRequest {
        inputs,
        base64,
        dimensions,
    })
}

/// A request's vectors (truncated to its `dimensions`), its token count, and its format.
pub(crate) struct Embedded {
    pub(crate) vectors: Vec<Vec<f32>>,
    pub(crate) prompt_tokens: usize,
    base64: bool,
}

/// Checks an OpenAI-shaped `body` and embeds its inputs (Ollama's `/api/embed` comes here too).
pub(crate) async fn compute(s: &Arc<AppState>, body: &[u8]) -> Result<Embedded, ApiError> {
    let start = Instant::now();
    if !s.embeds {
        return Err(ApiError::invalid(
            None,
            format!(
                "{} is a text generation model: it has no embeddings (serve an embedding model such as Qwen3-Embedding)",
                s.model_name
            ),
        ));
    }
    let req = parse(body, s)?;
    let prompt_tokens: usize = req.inputs.iter().map(Vec::len).sum();
    let mut vectors = last_rows(s, req.inputs, false, "/v1/embeddings", start).await?;
    if let Some(n) = req.dimensions {
        vectors.iter_mut().for_each(|v| truncate(v, n));
    }
    Ok(Embedded {
        vectors,
        prompt_tokens,
        base64: req.base64,
    })
}

/// `POST /v1/embeddings`.
pub async fn embeddings(s: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let e = compute(&s, body).await?;
    let n_prompt = e.prompt_tokens;
    let data: Vec<Value> = e
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = match e.base64 {
                true => Value::String(to_base64(v)),
                false => json!(v),
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let mut r = Json(json!({
        "object": "list",
        "data": data,
        "model": s.model_name,
        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt},
    }))
    .into_response();
    r.extensions_mut().insert(LogTokens {
        prompt: n_prompt,
        completion: 0,
    });
    Ok(r)
}

/// Runs `inputs` through the engine, one request each with nothing to generate, and returns
/// each one's last row in input order: an embedding model's vector, or with `logits` a language
/// model's logits at the last position (a reranker's, rerank.rs). `path`: the route, for the log.
pub(crate) async fn last_rows(
    s: &Arc<AppState>,
    inputs: Vec<Vec<u32>>,
    logits: bool,
    path: &'static str,
    start: Instant,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let n = inputs.len();
    let n_prompt = inputs.iter().map(Vec::len).sum();
    let requests = inputs
        .into_iter()
        .map(|prompt| Request::prefill_only(prompt, logits))
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    if s.commands
        .send(Command::Submit {
            requests,
            updates: tx,
        })
        .is_err()
    {
        return Err(ApiError::internal("the model worker has stopped"));
    }
    // Logs the request as 499 if the client hangs up while it runs.
    let mut left = LeftEarly::new(s, path, n_prompt, start);
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
    let mut done = 0;
    while done < n {
        match rx.recv().await {
            Some(Update::Queued { .. } | Update::Started { .. }) => {}
            Some(Update::Rejected(Rejected::QueueFull)) => {
                left.armed = false;
                return Err(ApiError::overloaded(s.max_queue));
            }
            Some(Update::Rejected(Rejected::Invalid(why))) => {
                left.armed = false;
                return Err(ApiError::invalid("input".to_string(), why));
            }
            Some(
                Update::Embedding {
                    choice,
                    vector: row,
                }
                | Update::Logits {
                    choice,
                    logits: row,
                },
            ) => vectors[choice] = Some(row),
            Some(Update::Finished { .. }) => done += 1,
            Some(Update::Failed { error, .. }) => {
                left.armed = false;
                return Err(ApiError::internal(error));
            }
            Some(Update::Token { .. } | Update::PromptLogprobs { .. }) => {}
            None => {
                left.armed = false;
                return Err(ApiError::internal("the model worker has stopped"));
            }
        }
    }
    left.armed = false;
    vectors
        .into_iter()
        .map(|v| v.ok_or_else(|| ApiError::internal("an input ended without its last row")))
        .collect()
}

/// The base64 of the values' little-endian f32 bytes (what OpenAI's `encoding_format: "base64"`
/// sends, and its Python client decodes with `np.frombuffer(..., dtype="float32")`).
fn to_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_little_endian_f32() {
        // 1.0f32 = 0x3f800000: bytes 00 00 80 3f.
        assert_eq!(to_base64(&[1.0]), "AACAPw==");
    }
}
