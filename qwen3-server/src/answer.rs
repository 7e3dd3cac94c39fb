//! Answer shaping, the last step of a request: the worker's updates for one job become each
//! choice's text (through [`ChoiceText`]), its log-probabilities and tool calls, and then the
//! whole answer's JSON or one streamed chunk per piece. The pump (pump.rs) feeds it; it reads
//! only the job (job.rs), the shared state, and the text pipeline below it.

use crate::job::{unix_now, Job, Kind, Params};
use crate::logprobs;
use crate::state::AppState;
use crate::worker::{Command, Update};
use qwen3_inference::chat::tool_calls::ToolCall;
use qwen3_inference::engine::RequestId;
use qwen3_inference::generate::StopReason;
use qwen3_inference::logprobs::TokenLogprobs;
use qwen3_inference::text::{ChoiceText, Delta};
use qwen3_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The answer's fixed fields.
pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) kind: Kind,
}

/// One choice's state.
pub(crate) struct ChoiceState {
    text: ChoiceText<'static>,
    pub(crate) content: String,
    pub(crate) reasoning: String,
    tokens: usize,
    cached: usize,
    pub(crate) finish: Option<&'static str>,
    /// Something was sent for this choice (a stream's first chunk carries the role).
    started: bool,
    /// Log-probabilities of the tokens so far (when asked for), and how many of them were sent.
    logprobs: Vec<TokenLogprobs>,
    sent_logprobs: usize,
    /// Characters of the text whose tokens' log-probabilities were sent (`text_offset`).
    sent_chars: usize,
    /// When its last token arrived (`/metrics`' latencies).
    last_token: Option<Instant>,
    /// The calls in the answer, with the ids given to them.
    pub(crate) tool_calls: Vec<(String, ToolCall)>,
    /// `echo`: the prompt, until its text is put at the start of the answer.
    echo: Option<Vec<u32>>,
}

/// Every choice of a request, fed by the worker's updates.
pub(crate) struct Choices {
    ids: Vec<RequestId>,
    /// When the request arrived.
    start: Instant,
    /// The request asked for log-probabilities.
    logprobs: bool,
    pub(crate) c: Vec<ChoiceState>,
    /// What the last update changed: (choice, text, finish reason), for a stream to send.
    pub(crate) out: Vec<(usize, Delta, Option<&'static str>)>,
}

impl Choices {
    pub(crate) fn new(s: &Arc<AppState>, job: &Job, p: &Params, ids: Vec<RequestId>) -> Choices {
        // Choice i answers prompt i / n (OpenAI's numbering of several prompts' choices).
        let c = (0..ids.len())
            .map(|i| ChoiceState {
                text: match &job.tool_calls {
                    Some(calls) => ChoiceText::new(s.tokenizer, p.stops.clone(), job.reasoning)
                        .with_tool_calls(calls),
                    None => ChoiceText::new(s.tokenizer, p.stops.clone(), job.reasoning),
                },
                content: String::new(),
                reasoning: String::new(),
                tokens: 0,
                cached: 0,
                finish: None,
                started: false,
                logprobs: Vec::new(),
                sent_logprobs: 0,
                sent_chars: 0,
                last_token: None,
                tool_calls: Vec::new(),
                echo: job.echo.then(|| job.prompts[i / p.n].clone()),
            })
            .collect();
        Choices {
            ids,
            start: job.start,
            logprobs: job.logprobs.is_some(),
            c,
            out: Vec::new(),
        }
    }

    pub(crate) fn all_done(&self) -> bool {
        self.c.iter().all(|c| c.finish.is_some())
    }

    /// Applies an update; `out` gets what changed. A failed choice is an error.
    pub(crate) fn apply(&mut self, u: Update, s: &AppState) -> Result<(), String> {
        self.out.clear();
        match u {
            Update::Started { choice, cached } => {
                self.c[choice].cached = cached;
                if !self.logprobs {
                    self.echo(choice, vec![], s.tokenizer)?;
                }
            }
            // Asked for with `echo` and `logprobs` only, and sent before the first token.
            Update::PromptLogprobs { choice, logprobs } => {
                self.echo(choice, logprobs, s.tokenizer)?
            }
            Update::Token {
                choice,
                token,
                logprobs,
            } => {
                let c = &mut self.c[choice];
                if c.finish.is_some() {
                    return Ok(()); // after a stop string, until the cancel lands
                }
                c.tokens += 1;
                let now = Instant::now();
                match c.last_token.replace(now) {
                    None => s.metrics.first_token(now - self.start),
                    Some(t) => s.metrics.next_token(now - t),
                }
                if let Some(lp) = logprobs {
                    c.logprobs.push(*lp);
                }
                let (d, stopped) = c.text.push(token);
                if stopped {
                    c.finish = Some("stop");
                    let _ = s.commands.send(Command::Cancel(self.ids[choice]));
                }
                self.record(choice, d);
            }
            Update::Finished {
                choice,
                reason,
                generated,
            } => {
                let c = &mut self.c[choice];
                if c.finish.is_some() {
                    return Ok(());
                }
                c.tokens = generated;
                let d = c.text.finish();
                let called = !c.tool_calls.is_empty() || !d.tool_calls.is_empty();
                c.finish = Some(match reason {
                    // The model ended its turn after calling: the client runs the tools.
                    StopReason::Eos(_) if called => "tool_calls",
                    StopReason::Eos(_) | StopReason::Stopped => "stop",
                    StopReason::MaxTokens | StopReason::ContextFull => "length",
                });
                self.record(choice, d);
            }
            Update::Failed { error, .. } => return Err(error),
            Update::Queued { .. }
            | Update::Rejected(_)
            | Update::Embedding { .. }
            | Update::Logits { .. } => {}
        }
        Ok(())
    }

    /// The stream's choice object for delta `d` of choice `i` (an entry of `out`): with the
    /// log-probabilities of the tokens since the last chunk (their text may have been held back
    /// until now) and the tool calls this delta completed.
    pub(crate) fn streamed(
        &mut self,
        meta: &Meta,
        i: usize,
        d: &Delta,
        finish: Option<&str>,
        tok: &Tokenizer,
    ) -> Value {
        let c = &mut self.c[i];
        let first = !c.started;
        c.started = true;
        let lp = if self.logprobs {
            let new = &c.logprobs[c.sent_logprobs..];
            let v = meta.logprobs(new, c.sent_chars, tok);
            c.sent_chars += logprobs::chars(new, tok);
            c.sent_logprobs = c.logprobs.len();
            v
        } else {
            Value::Null
        };
        // The calls this delta completed: the last ones recorded.
        let all = &c.tool_calls;
        let calls: Vec<(usize, &(String, ToolCall))> = (all.len() - d.tool_calls.len()..all.len())
            .map(|k| (k, &all[k]))
            .collect();
        meta.choice_delta(i, d, first, finish, lp, &calls)
    }

    /// `echo`: the prompt's text starts choice `choice`'s text, and the prompt's log-probabilities
    /// (`lp`, one per token after the first) its log-probabilities. The first prompt token has
    /// none: NaN, which the legacy lists write as null, as OpenAI does.
    fn echo(
        &mut self,
        choice: usize,
        lp: Vec<TokenLogprobs>,
        tok: &Tokenizer,
    ) -> Result<(), String> {
        let c = &mut self.c[choice];
        let Some(prompt) = c.echo.take() else {
            return Ok(());
        };
        let content = tok.decode(&prompt, false).map_err(|e| e.to_string())?;
        if self.logprobs {
            c.logprobs.push(TokenLogprobs {
                token: prompt[0],
                logprob: f32::NAN,
                top: vec![],
            });
            c.logprobs.extend(lp);
        }
        let d = Delta {
            content,
            ..Delta::default()
        };
        self.record(choice, d);
        Ok(())
    }

    fn record(&mut self, choice: usize, d: Delta) {
        let c = &mut self.c[choice];
        c.content.push_str(&d.content);
        c.reasoning.push_str(&d.reasoning);
        for call in &d.tool_calls {
            c.tool_calls.push((call_id(), call.clone()));
        }
        if !d.is_empty() || c.finish.is_some() {
            self.out.push((choice, d, c.finish));
        }
    }

    pub(crate) fn completion_tokens(&self) -> usize {
        self.c.iter().map(|c| c.tokens).sum()
    }

    pub(crate) fn usage(&self, prompt: usize) -> Value {
        let completion = self.completion_tokens();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.c[0].cached},
        })
    }
}

impl Meta {
    /// The non-streamed answer.
    pub(crate) fn whole(&self, ch: &Choices, usage: &Value, tok: &Tokenizer) -> Value {
        let choices: Vec<Value> = ch
            .c
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let lp = ch.logprobs.then(|| self.logprobs(&c.logprobs, 0, tok));
                match self.kind {
                    Kind::Completion => json!({
                        "index": i, "text": c.content, "logprobs": lp, "finish_reason": c.finish,
                    }),
                    Kind::Chat => {
                        // `refusal`: the spec requires the field; this server never refuses.
                        let mut m =
                            json!({"role": "assistant", "content": c.content, "refusal": null});
                        if !c.reasoning.is_empty() {
                            m["reasoning_content"] = c.reasoning.clone().into();
                        }
                        if !c.tool_calls.is_empty() {
                            let calls = &c.tool_calls;
                            m["tool_calls"] = calls.iter().enumerate().map(call_json).collect();
                            if c.content.is_empty() {
                                m["content"] = Value::Null;
                            }
                        }
                        json!({"index": i, "message": m, "logprobs": lp, "finish_reason": c.finish})
                    }
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        })
    }

    /// One streamed chunk with `choices`.
    pub(crate) fn chunk(&self, choices: Vec<Value>, include_usage: bool) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// Log-probabilities of `entries` in this endpoint's shape; `offset`: characters of the
    /// text before them (`/v1/completions`' `text_offset`).
    fn logprobs(&self, entries: &[TokenLogprobs], offset: usize, tok: &Tokenizer) -> Value {
        match self.kind {
            Kind::Completion => logprobs::completion(entries, tok, offset),
            Kind::Chat => logprobs::chat(entries, tok),
        }
    }

    /// A stream's choice object; `lp`: the log-probabilities of the tokens since the last one.
    /// `calls`: the tool calls completed in this delta, with their index in the answer and id.
    fn choice_delta(
        &self,
        i: usize,
        d: &Delta,
        first: bool,
        finish: Option<&str>,
        lp: Value,
        calls: &[(usize, &(String, ToolCall))],
    ) -> Value {
        match self.kind {
            Kind::Completion => {
                json!({"index": i, "text": d.content, "logprobs": lp, "finish_reason": finish})
            }
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if !d.reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), d.reasoning.clone().into());
                }
                if !d.content.is_empty()
                    || (first && d.reasoning.is_empty() && d.tool_calls.is_empty())
                {
                    delta.insert("content".into(), d.content.clone().into());
                }
                if !calls.is_empty() {
                    let v: Vec<Value> = calls.iter().map(|(k, c)| call_json((*k, c))).collect();
                    delta.insert("tool_calls".into(), v.into());
                }
                json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
        }
    }
}

/// An id for a tool call (OpenAI's `call_...`), unique in this server's life.
fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "call_{:x}{:06x}",
        unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A call as OpenAI writes it: `arguments` is the JSON text, as a string.
fn call_json((index, (id, call)): (usize, &(String, ToolCall))) -> Value {
    json!({
        "index": index, "id": id, "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
