//! Log-probabilities in OpenAI's two shapes: `/v1/chat/completions`' `logprobs.content` (one
//! entry per token, with its bytes and `top_logprobs`) and `/v1/completions`' legacy
//! `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists.
//!
//! A token's text is its bytes read as UTF-8 (a token that holds part of a character shows
//! U+FFFD, and its `bytes` say exactly what it holds, as OpenAI's do). The values are the
//! log-softmax of the raw logits (`qwen3_inference::logprobs`).

use qwen3_inference::logprobs::TokenLogprobs;
use qwen3_inference::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

fn bytes(tok: &Tokenizer, id: u32) -> &[u8] {
    tok.token_bytes(id).unwrap_or_default()
}

fn text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(bytes(tok, id)).into_owned()
}

/// `{"content": [...], "refusal": null}` for the tokens of `entries`.
pub fn chat(entries: &[TokenLogprobs], tok: &Tokenizer) -> Value {
    let one =
        |id: u32, lp: f32| json!({"token": text(tok, id), "logprob": lp, "bytes": bytes(tok, id)});
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = one(e.token, e.logprob);
            v["top_logprobs"] = e.top.iter().map(|&(id, lp)| one(id, lp)).collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The legacy lists for the tokens of `entries`, whose text starts `offset` characters into the
/// choice's text (`text_offset` counts characters, as OpenAI's does).
pub fn completion(entries: &[TokenLogprobs], tok: &Tokenizer, mut offset: usize) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for e in entries {
        let t = text(tok, e.token);
        offsets.push(offset);
        offset += t.chars().count();
        tokens.push(t);
        if e.logprob.is_nan() {
            // An echoed prompt's first token: nothing before it to give it a probability.
            lps.push(Value::Null);
            tops.push(Value::Null);
            continue;
        }
        lps.push(json!(e.logprob));
        let top: Map<String, Value> = e
            .top
            .iter()
            .map(|&(id, lp)| (text(tok, id), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Characters the tokens of `entries` add to a completion's `text_offset`.
pub fn chars(entries: &[TokenLogprobs], tok: &Tokenizer) -> usize {
    entries
        .iter()
        .map(|e| text(tok, e.token).chars().count())
        .sum()
}
