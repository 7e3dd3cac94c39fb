//! Qwen3-Reranker's recipe: how well a document answers a query, from a causal LM asked a
//! yes-or-no question. Its model card's recipe, followed here token for token: each
//! (query, document) pair becomes
//!
//! ```text
//! <|im_start|>system\nJudge whether the Document meets the requirements based on the Query and
//! the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n
//! <|im_start|>user\n  +  <Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}
//!                     +  <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
//! ```
//!
//! (the three parts encoded separately, as the card encodes them), and its score is the
//! probability of "yes" against "no" at the last position: `softmax([l_no, l_yes])[1]`, which is
//! `1 / (1 + e^(l_no - l_yes))`. The server's `/v1/rerank` and `qwen3 rerank` run each pair as
//! one engine request with nothing to generate and score its last row of logits.

use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};

const SYSTEM: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
const ASSISTANT: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The model card's default instruction; a request's `instruction` replaces it.
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";
/// The recipe's fixed tokens, for the model's tokenizer.
pub struct Reranker {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    yes: u32,
    no: u32,
}

impl Reranker {
    /// Refuses a tokenizer without single "yes" and "no" tokens (not a Qwen reranker's).
    pub fn new(tok: &Tokenizer) -> Result<Reranker> {
        let (Some(yes), Some(no)) = (tok.token_id("yes"), tok.token_id("no")) else {
            bail!("the tokenizer has no \"yes\" and \"no\" tokens (is this a Qwen3-Reranker?)");
        };
        Ok(Reranker {
            prefix: tok.encode(SYSTEM),
            suffix: tok.encode(ASSISTANT),
            yes,
            no,
        })
    }

    /// The ids of one (query, document) pair.
    pub fn pair(&self, tok: &Tokenizer, instruction: &str, query: &str, doc: &str) -> Vec<u32> {
        let text = format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}");
        let mut ids = self.prefix.clone();
        ids.extend(tok.encode_with_special_tokens(&text));
        ids.extend_from_slice(&self.suffix);
        ids
    }

    /// P("yes") against "no" from the last position's logits.
    pub fn score(&self, logits: &[f32]) -> f64 {
        let (y, n) = (
            logits[self.yes as usize] as f64,
            logits[self.no as usize] as f64,
        );
        1.0 / (1.0 + (n - y).exp())
    }
}
