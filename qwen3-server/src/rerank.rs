//! `POST /v1/rerank` (also `/rerank`, as llama-server, Jina and Cohere clients call it): how well
//! each document answers a query, by Qwen3-Reranker's recipe (`qwen3 serve M --rerank`).
//!
//! The recipe (the prompt around each (query, document) pair, and the score from the last
//! position's logits) is [`qwen3_inference::rerank`]'s. Each pair is one engine request with
//! nothing to generate, batched with everything else; the engine hands back its last row of
//! logits.

use crate::embeddings::last_rows;
use crate::error::ApiError;
use crate::job::LogTokens;
use crate::request::{check_model, parse_body, typed, Int};
use crate::state::AppState;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qwen3_inference::rerank::DEFAULT_INSTRUCTION;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Most documents in one request.
pub const MAX_DOCUMENTS: usize = 1024;

/// `POST /v1/rerank`.
pub async fn rerank(s: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let start = Instant::now();
    let Some(r) = &s.reranker else {
        return Err(ApiError::invalid(
            None,
            "this server does not rerank: start it with --rerank and a Qwen3-Reranker model",
        ));
    };
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Document {
        Text(String),
        Object { text: String },
    }
    #[derive(Deserialize)]
    struct Body {
        model: Option<String>,
        query: Option<String>,
        documents: Option<Vec<Document>>,
        top_n: Option<Int>,
        instruction: Option<String>,
        return_documents: Option<bool>,
    }
    let v = parse_body(body)?;
    let b: Body = typed(&v)?;
    check_model(&s, b.model.as_deref())?;
    let bad = |p: &str, m: String| ApiError::invalid(p.to_string(), m);
    let query = b
        .query
        .ok_or_else(|| bad("query", "query is required".into()))?;
    let docs: Vec<String> = b
        .documents
        .ok_or_else(|| bad("documents", "documents is required".into()))?
        .into_iter()
        .map(|d| match d {
            Document::Text(t) | Document::Object { text: t } => t,
        })
        .collect();
    if docs.is_empty() || docs.len() > MAX_DOCUMENTS {
        return Err(bad(
            "documents",
            format!(
                "documents must hold 1 ..= {MAX_DOCUMENTS} texts, got {}",
                docs.len()
            ),
        ));
    }
    let top_n = match b.top_n.map(Int::get) {
        None => docs.len(),
        Some(n) if n >= 1 => (n as usize).min(docs.len()),
        Some(n) => return Err(bad("top_n", format!("top_n must be at least 1, got {n}"))),
    };
    let instruction = b.instruction.as_deref().unwrap_or(DEFAULT_INSTRUCTION);
    let inputs: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| r.pair(s.tokenizer, instruction, &query, d))
        .collect();
    let ctx = s.context_len;
    if let Some(i) = inputs.iter().position(|x| x.len() > ctx) {
        return Err(bad(
            "documents",
            format!(
                "document {i} with the query and the recipe's prompt is {} tokens; this server's context holds {ctx}",
                inputs[i].len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let n_prompt: usize = inputs.iter().map(Vec::len).sum();
    let rows = last_rows(&s, inputs, true, "/v1/rerank", start).await?;
    let mut results: Vec<(usize, f64)> = rows.iter().map(|l| r.score(l)).enumerate().collect();
    // Most relevant first; equal scores keep the documents' order.
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let with_text = b.return_documents.unwrap_or(false);
    let results: Vec<Value> = results[..top_n]
        .iter()
        .map(|&(index, score)| {
            let mut o = json!({"index": index, "relevance_score": score});
            if with_text {
                o["document"] = json!({"text": docs[index]});
            }
            o
        })
        .collect();
    let mut resp = Json(json!({
        "object": "list",
        "model": s.model_name,
        "results": results,
        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt},
    }))
    .into_response();
    resp.extensions_mut().insert(LogTokens {
        prompt: n_prompt,
        completion: 0,
    });
    Ok(resp)
}
