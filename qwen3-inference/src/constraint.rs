//! Structured output: a grammar (a JSON Schema, any JSON object, a Lark grammar or a regex) turned
//! into a mask over the next token's logits, so that what the model writes is guaranteed to match.
//!
//! The grammar engine is llguidance (with its token trie, toktrie), the one mistral.rs, vLLM and
//! SGLang use: an Earley parser over a lexer of derivatives of regular expressions, which walks a
//! trie of the vocabulary's byte strings to find, at each step, every token that can extend what
//! has been written so far. Writing that here would be worse than taking the field's engine; the
//! rest (the vocabulary it sees, where the mask meets the logits) is ours.
//!
//! One [`Vocabulary`] is built per tokenizer (the trie: every token's bytes, special tokens
//! marked so no grammar can produce them by accident); one [`Constraint`] per sequence. Each step:
//! [`Constraint::mask`] sets the logits of the tokens the grammar does not allow to -inf (the
//! sampler's temperature and top-p then work within the allowed set), and
//! [`Constraint::advance`] moves the grammar past the sampled token.

use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;

/// What the output must match.
#[derive(Clone, Debug)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON Schema (`json_schema`); llguidance refuses by name what it cannot enforce.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

/// The tokenizer as the grammar engine sees it: each id's bytes in a trie, built once.
pub struct Vocabulary {
    factory: ParserFactory,
}

/// The token trie and our tokenizer, for llguidance's forced-token and lexer steps.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Canonical ids for `s`: our BPE when the bytes are text, the trie's greedy split otherwise.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer`, padded to `n_logits` entries (the model's vocab_size, which
    /// may exceed the tokenizer's ids: the padding ids have no bytes and are never allowed), with
    /// `eos` as the id that ends a constrained answer.
    pub fn new(tokenizer: Arc<Tokenizer>, n_logits: usize, eos: u32) -> Result<Vocabulary> {
        let n = u32::try_from(n_logits).context("vocabulary too large")?;
        if (eos as usize) >= n_logits {
            bail!("end-of-sequence id {eos} is outside the {n_logits} logits");
        }
        // Special tokens get the trie's marker byte (0xFF, never part of UTF-8 text) in front,
        // so only a grammar that names them can produce them.
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| match tokenizer.token_bytes(id) {
                Some(b) if tokenizer.is_special(id) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(b);
                    w
                }
                Some(b) => b.to_vec(),
                None => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(n, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)?;
        // Errors come back as values; nothing on stderr.
        factory.set_stderr_log_level(0);
        Ok(Vocabulary { factory })
    }

    /// A fresh constraint for one sequence. A grammar that does not compile (an invalid schema,
    /// a feature llguidance cannot enforce) is an error that says why.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        let top = match grammar {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(bounded_whitespace(json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(bounded_whitespace(schema.clone()))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self.factory.create_parser(top)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            bail!("{e}");
        }
        Ok(Constraint { matcher })
    }
}

/// JSON in the layout Python's `json.dumps` writes (`", "` between items, `": "` after keys) and
/// no other whitespace between tokens, unless the schema sets its own (llguidance's `x-guidance`
/// options). With whitespace left free, a model can write spaces forever without breaking the
/// grammar: the endless-whitespace answer is the best-known failure of JSON modes.
fn bounded_whitespace(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Sets to -inf every logit whose token the grammar does not allow next. Once the grammar
    /// is complete, only the end-of-sequence id is allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| anyhow!("grammar: {e}"))?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Moves the grammar past `token`, which [`Constraint::mask`] allowed.
    pub fn advance(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("grammar: {e}"))
    }

    /// Whether the grammar has ended (only the end-of-sequence id can follow).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
