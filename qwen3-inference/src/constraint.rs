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
//!
//! 1. [`Constraint::prepare`] computes the set of tokens the grammar allows next (a bit per id);
//!    it only depends on what was written before, so the engine runs it beside the forward pass;
//! 2. [`Constraint::mask`] sets the logits of the other tokens to -inf (the sampler's temperature
//!    and top-p then work within the allowed set); the end-of-sequence ids are allowed exactly
//!    when the grammar may end;
//! 3. [`Constraint::advance`] moves the grammar past the sampled token, and
//!    [`Constraint::forced`] hands back the tokens that the grammar now allows one way only (the
//!    `{"name": "` of a schema with one required key), so the engine feeds them without a
//!    forward pass each.
//!
//! A constraint need not start at the first token ([`Start`]): a thinking model's reasoning
//! stays free until `</think>`, and a tool call is free text until the model opens
//! `<tool_call>` (a lazy grammar, as llama.cpp calls it).

use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::ops::Deref;
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
    /// The id the grammar engine calls end-of-sequence (a sequence's own stop ids take its place
    /// in [`Constraint::mask`]).
    eos: u32,
    env: TokEnv,
}

/// The token trie and our tokenizer (any shared handle on one: an `Arc`, a `&'static`), for
/// llguidance's forced-token and lexer steps.
struct Env<T> {
    trie: TokTrie,
    tokenizer: T,
}

impl<T: Deref<Target = Tokenizer> + Send + Sync> TokenizerEnv for Env<T> {
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
    pub fn new<T>(tokenizer: T, n_logits: usize, eos: u32) -> Result<Vocabulary>
    where
        T: Deref<Target = Tokenizer> + Send + Sync + 'static,
    {
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
        Ok(Vocabulary { factory, eos, env })
    }

    /// The id of `text` if the tokenizer has it as one token (`</think>`, `<tool_call>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match self.env.tokenize_bytes(text.as_bytes()).as_slice() {
            [id] => Some(*id),
            _ => None,
        }
    }

    /// Where the answer to a chat prompt (`prompt`, rendered by the template) starts, for its
    /// grammar: after `</think>` if the prompt opened the reasoning; after it too if the model
    /// opens it first (`<think>` as its first token); at once if the template closed it already
    /// (thinking off), or the template has no thinking switch (`thinking_template` false).
    pub fn answer_start(&self, prompt: &str, thinking_template: bool) -> Start {
        let (Some(open), Some(close)) = (self.token_id("<think>"), self.token_id("</think>"))
        else {
            return Start::Now;
        };
        let t = prompt.trim_end();
        if !thinking_template || t.ends_with("</think>") {
            Start::Now
        } else if t.ends_with("<think>") {
            Start::FreeUntil(close)
        } else {
            Start::MayReason { open, close }
        }
    }

    /// A fresh constraint for one sequence. A grammar that does not compile (an invalid schema,
    /// a feature llguidance cannot enforce) is an error that says why.
    pub fn constraint(&self, grammar: &Grammar, start: Start) -> Result<Constraint> {
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
        let phase = match start {
            Start::Now => Phase::Grammar,
            Start::MayReason { open, close } => Phase::MayOpen { open, close },
            Start::FreeUntil(close) => Phase::Free { close },
        };
        Ok(Constraint {
            matcher,
            phase,
            eos: self.eos,
            allowed: None,
        })
    }
}

/// A JSON Schema as a piece of a Lark grammar (`%json {...}`), its whitespace bounded as
/// [`Grammar::JsonSchema`]'s is: for grammars that embed JSON, such as a tool call's.
pub fn json_in_lark(schema: &Value) -> String {
    format!("%json {}", bounded_whitespace(schema.clone()))
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

/// Where the grammar starts to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// At the first token.
    Now,
    /// At the first token, unless that token is `open` (`<think>`): then the text is free until
    /// `close` (`</think>`), and the grammar applies after it. A thinking model's reasoning stays
    /// its own; the answer is constrained.
    MayReason { open: u32, close: u32 },
    /// After the model writes this token (`</think>` when the prompt already opened the
    /// reasoning; `<tool_call>` for a lazy tool-call grammar); free text before.
    FreeUntil(u32),
}

/// Where a sequence is with respect to its grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    MayOpen { open: u32, close: u32 },
    Free { close: u32 },
    Grammar,
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    phase: Phase,
    eos: u32,
    /// The next token's allowed set, once [`Constraint::prepare`] computed it.
    allowed: Option<Result<SimpleVob, String>>,
}

impl Clone for Constraint {
    /// An independent copy (each of a request's `n` choices gets one).
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            phase: self.phase,
            eos: self.eos,
            allowed: self.allowed.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("phase", &self.phase)
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Whether the next token is masked at all (not in a free stretch).
    pub fn is_active(&self) -> bool {
        !matches!(self.phase, Phase::Free { .. })
    }

    /// Computes the next token's allowed set, if the next token is masked and it is not computed
    /// yet. Only reads what was written before, so it can run while the forward pass computes
    /// the logits it will mask.
    pub fn prepare(&mut self) {
        if self.is_active() && self.allowed.is_none() {
            let mut allowed = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| format!("grammar: {e}"));
            if let (Ok(a), Phase::MayOpen { open, .. }) = (&mut allowed, self.phase) {
                a.allow_token(open);
            }
            self.allowed = Some(allowed);
        }
    }

    /// Sets to -inf every logit whose token the grammar does not allow next. The grammar
    /// engine's end-of-sequence id stands for all of `stop_ids` (a chat's end of turn, the
    /// model's end of text): they are allowed exactly when the grammar may end here. In a free
    /// stretch nothing is masked.
    pub fn mask(&mut self, logits: &mut [f32], stop_ids: &[u32]) -> Result<()> {
        if !self.is_active() {
            return Ok(());
        }
        self.prepare();
        let allowed = match self.allowed.as_ref().expect("prepared") {
            Ok(a) => a,
            Err(e) => bail!("{e}"),
        };
        let may_end = allowed.is_allowed(self.eos);
        // A word of the bit set covers 32 ids: most words of a JSON grammar's mask are all zero
        // (or all one, inside a string), so whole runs of logits go at once.
        let words = allowed.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << j) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &id in stop_ids {
            if let Some(l) = logits.get_mut(id as usize) {
                if !may_end {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Whether `token` is one [`Constraint::mask`] let through (a stop id counts as the grammar
    /// engine's end of sequence). The sampler draws masked tokens with weight `e^-87`, not zero
    /// (kernels/exp.rs): the engine checks, and takes the best allowed token in that case.
    pub fn allows(&self, token: u32, stop_ids: &[u32]) -> bool {
        match (&self.allowed, self.is_active()) {
            (_, false) => true,
            (Some(Ok(a)), true) => {
                let id = if stop_ids.contains(&token) {
                    self.eos
                } else {
                    token
                };
                a.is_allowed(id)
            }
            _ => false,
        }
    }

    /// Moves past `token`, which [`Constraint::mask`] allowed (not a stop id).
    pub fn advance(&mut self, token: u32) -> Result<()> {
        self.allowed = None;
        match self.phase {
            Phase::MayOpen { open, close } if token == open => {
                self.phase = Phase::Free { close };
                Ok(())
            }
            Phase::Free { close } => {
                if token == close {
                    self.phase = Phase::Grammar;
                }
                Ok(())
            }
            Phase::MayOpen { .. } | Phase::Grammar => {
                self.phase = Phase::Grammar;
                self.matcher
                    .consume_token(token)
                    .map_err(|e| anyhow!("grammar: {e}"))
            }
        }
    }

    /// The tokens the grammar allows one way only from here, at most `max`, consumed: the caller
    /// appends them to the sequence as if sampled. None in a free stretch.
    pub fn forced(&mut self, max: usize) -> Vec<u32> {
        if self.phase != Phase::Grammar || max == 0 {
            return Vec::new();
        }
        let mut ff = self.matcher.compute_ff_tokens();
        ff.truncate(max);
        if ff.is_empty() || self.matcher.consume_tokens(&ff).is_err() {
            return Vec::new();
        }
        self.allowed = None;
        ff
    }

    /// Whether the grammar has ended (only the end-of-sequence id can follow).
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Grammar && self.matcher.is_stopped()
    }
}
