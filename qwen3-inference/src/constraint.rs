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
            return Start::NOW;
        };
        let t = prompt.trim_end();
        let reasoning = if !thinking_template || t.ends_with("</think>") {
            Reasoning::None
        } else if t.ends_with("<think>") {
            Reasoning::Inside { close }
        } else {
            Reasoning::MayOpen { open, close }
        };
        Start {
            reasoning,
            trigger: None,
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
        Ok(Constraint {
            matcher,
            reasoning: start.reasoning,
            trigger: start.trigger,
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
    // `true` is the schema that accepts anything: as an object, it can carry the options.
    if schema == Value::Bool(true) {
        schema = json!({});
    }
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// Where the grammar starts to apply: after the reasoning, and for a lazy grammar after its
/// trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    pub reasoning: Reasoning,
    /// A lazy grammar: the text is free (and may end) until the model writes this token
    /// (`<tool_call>`), after the reasoning; the grammar applies from the next token.
    pub trigger: Option<u32>,
}

impl Start {
    /// At the first token.
    pub const NOW: Start = Start {
        reasoning: Reasoning::None,
        trigger: None,
    };
}

/// A thinking model's reasoning block before the answer: its text is free, and it must be
/// closed before the answer may end (a reasoning is not an answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reasoning {
    /// None (any more): the answer starts here.
    None,
    /// The first token may be `open` (`<think>`), which starts a reasoning closed by `close`.
    MayOpen { open: u32, close: u32 },
    /// Inside one (the prompt opened it, or the model did), until `close` (`</think>`).
    Inside { close: u32 },
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    reasoning: Reasoning,
    /// The lazy grammar's trigger, until the model writes it.
    trigger: Option<u32>,
    eos: u32,
    /// The next token's allowed set, once [`Constraint::prepare`] computed it.
    allowed: Option<Result<SimpleVob, String>>,
}

impl Clone for Constraint {
    /// An independent copy (each of a request's `n` choices gets one).
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            reasoning: self.reasoning,
            trigger: self.trigger,
            eos: self.eos,
            allowed: self.allowed.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("reasoning", &self.reasoning)
            .field("trigger", &self.trigger)
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Whether the grammar decides the next token (not inside a reasoning, not before a lazy
    /// grammar's trigger).
    pub fn is_active(&self) -> bool {
        !matches!(self.reasoning, Reasoning::Inside { .. }) && self.trigger.is_none()
    }

    /// Computes the next token's allowed set, if the grammar decides it and it is not computed
    /// yet. Only reads what was written before, so it can run while the forward pass computes
    /// the logits it will mask.
    pub fn prepare(&mut self) {
        if self.is_active() && self.allowed.is_none() {
            let mut allowed = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| format!("grammar: {e}"));
            if let (Ok(a), Reasoning::MayOpen { open, .. }) = (&mut allowed, self.reasoning) {
                a.allow_token(open);
            }
            self.allowed = Some(allowed);
        }
    }

    /// Sets to -inf every logit whose token may not come next. Where the grammar decides: the
    /// tokens it does not allow; the request's `stop_ids` (a chat's end of turn, the model's end
    /// of text) stand for the grammar engine's end of sequence, allowed exactly when the grammar
    /// may end. Inside a reasoning: only the stop ids (the reasoning must be closed). Before a
    /// lazy grammar's trigger: nothing.
    pub fn mask(&mut self, logits: &mut [f32], stop_ids: &[u32]) -> Result<()> {
        if matches!(self.reasoning, Reasoning::Inside { .. }) {
            for &id in stop_ids {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        if self.trigger.is_some() {
            return Ok(());
        }
        self.prepare();
        let allowed = match self.allowed.as_ref().expect("prepared") {
            Ok(a) => a,
            Err(e) => bail!("{e}"),
        };
        let may_end = allowed.is_allowed(self.eos);
        if may_end && stop_ids.is_empty() {
            bail!("the grammar is complete but the request has no end-of-sequence id to end it");
        }
        // The stop ids are special tokens, which the grammar never allows as such: their
        // logits are kept aside and put back if the grammar may end.
        let stops: Vec<(usize, f32)> = stop_ids
            .iter()
            .filter_map(|&id| Some((id as usize, *logits.get(id as usize)?)))
            .collect();
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
        // The grammar engine's own end id is not a stop id of this request (unless it is one).
        if let Some(l) = logits.get_mut(self.eos as usize) {
            *l = f32::NEG_INFINITY;
        }
        for (id, raw) in stops {
            logits[id] = if may_end { raw } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    /// Whether `token` is one [`Constraint::mask`] let through. The sampler draws masked tokens
    /// with weight `e^-87`, not zero (kernels/exp.rs): the engine checks, and takes the best
    /// allowed token in that case.
    pub fn allows(&self, token: u32, stop_ids: &[u32]) -> bool {
        let stop = stop_ids.contains(&token);
        if matches!(self.reasoning, Reasoning::Inside { .. }) {
            return !stop;
        }
        if self.trigger.is_some() {
            return true;
        }
        match &self.allowed {
            Some(Ok(a)) if stop => a.is_allowed(self.eos),
            Some(Ok(a)) => token != self.eos && a.is_allowed(token),
            _ => false,
        }
    }

    /// Moves past `token`, which [`Constraint::mask`] allowed (not a stop id).
    pub fn advance(&mut self, token: u32) -> Result<()> {
        self.allowed = None;
        match self.reasoning {
            Reasoning::MayOpen { open, close } => {
                self.reasoning = Reasoning::None;
                if token == open {
                    self.reasoning = Reasoning::Inside { close };
                    return Ok(());
                }
            }
            Reasoning::Inside { close } => {
                if token == close {
                    self.reasoning = Reasoning::None;
                }
                return Ok(());
            }
            Reasoning::None => {}
        }
        if let Some(trigger) = self.trigger {
            if token == trigger {
                self.trigger = None;
            }
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("grammar: {e}"))
    }

    /// The tokens the grammar allows one way only from here, at most `max`, consumed: the caller
    /// appends them to the sequence as if sampled. None where the grammar does not decide.
    pub fn forced(&mut self, max: usize) -> Vec<u32> {
        if !self.is_active() || max == 0 {
            return Vec::new();
        }
        let mut ff = self.matcher.compute_ff_tokens();
        ff.truncate(max);
        // Only as many as the grammar accepts as they are (a canonical tokenization that the
        // trie does not follow, such as a special token's text, stops the run).
        let valid = self.matcher.validate_tokens(&ff).unwrap_or(0);
        ff.truncate(valid);
        if ff.is_empty() || self.matcher.consume_tokens(&ff).is_err() {
            return Vec::new();
        }
        self.allowed = None;
        ff
    }

    /// Whether the grammar has ended (only the end-of-sequence id can follow).
    pub fn is_done(&self) -> bool {
        self.is_active() && self.matcher.is_stopped()
    }
}
