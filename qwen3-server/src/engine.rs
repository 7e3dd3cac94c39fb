//! The handlers' handle on the engine: one `Job` checked against the context, queued on the
//! model worker as `n` engine requests, and its updates handed to answer shaping (answer.rs)
//! through the pump (pump.rs), either gathered into one JSON answer or passed on as
//! server-sent events.
//!
//! ```text
//! Job + Params --token budget--> Command::Submit --> worker
//!                                 Update::Queued  <-- (or Rejected: 503 / 400)
//!                                 Update::Token ... --> answer::Choices --> JSON or events
//! ```

use crate::answer::{Choices, Meta};
use crate::error::ApiError;
use crate::job::{route, unix_now, Job, Kind, LeftEarly, LogLater, LogTokens, Params};
use crate::pump::{gather, pump, Shape};
use crate::state::AppState;
use crate::worker::{Command, Update};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use qwen3_inference::engine::{Rejected, Request as EngineRequest};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A job on the worker's queue: its answer's fixed fields, its choices, and the updates that
/// will fill them.
pub(crate) struct Queued {
    pub(crate) meta: Meta,
    pub(crate) choices: Choices,
    pub(crate) rx: mpsc::UnboundedReceiver<Update>,
    pub(crate) n_prompt: usize,
}

/// Checks the token budget, queues the choices, and answers in OpenAI's shape.
pub(crate) async fn run(s: Arc<AppState>, job: Job, p: Params) -> Result<Response, ApiError> {
    let Queued {
        meta,
        mut choices,
        mut rx,
        n_prompt,
    } = queue(&s, &job, &p).await?;
    // Logs the request as 499 if the client hangs up (this future, or the stream, is dropped).
    let mut left = LeftEarly::new(&s, route(job.kind), n_prompt, job.start);
    if p.stream {
        let shape = Events {
            s: s.clone(),
            meta,
            include_usage: p.include_usage,
            n_prompt,
        };
        let body = pump(s, choices, rx, left, shape);
        let mut r = Sse::new(body)
            .keep_alive(KeepAlive::default())
            .into_response();
        r.extensions_mut().insert(LogLater);
        return Ok(r);
    }
    gather(&s, &mut choices, &mut rx, &mut left, |_| {})
        .await
        .map_err(ApiError::internal)?;
    let usage = choices.usage(n_prompt);
    let mut r = Json(meta.whole(&choices, &usage, s.tokenizer)).into_response();
    r.extensions_mut().insert(LogTokens {
        prompt: n_prompt,
        completion: choices.completion_tokens(),
    });
    Ok(r)
}

/// OpenAI's streamed answer: server-sent events, `data: {chunk}` per piece, then (if asked) a
/// chunk with the usage, then `data: [DONE]`; an answer that stops short ends with an error
/// object before `[DONE]`.
struct Events {
    s: Arc<AppState>,
    meta: Meta,
    include_usage: bool,
    n_prompt: usize,
}

impl Shape for Events {
    type Item = Event;

    fn pieces(&mut self, choices: &mut Choices) -> Vec<Event> {
        std::mem::take(&mut choices.out)
            .into_iter()
            .map(|(i, d, finish)| {
                let ch = choices.streamed(&self.meta, i, &d, finish, self.s.tokenizer);
                data(self.meta.chunk(vec![ch], self.include_usage))
            })
            .collect()
    }

    fn last(self, choices: &Choices, failed: Option<String>) -> Vec<Event> {
        let mut out = vec![];
        if let Some(e) = failed {
            out.push(data(ApiError::internal(e).body()));
        } else if self.include_usage {
            let mut last = self.meta.chunk(vec![], false);
            last["usage"] = choices.usage(self.n_prompt);
            out.push(data(last));
        }
        out.push(Event::default().data("[DONE]"));
        out
    }
}

/// One server-sent event of JSON.
fn data(v: Value) -> Event {
    Event::default().data(v.to_string())
}

/// Checks the token budget and queues the job's choices on the worker.
pub(crate) async fn queue(s: &Arc<AppState>, job: &Job, p: &Params) -> Result<Queued, ApiError> {
    if s.embeds {
        return Err(ApiError::invalid(
            None,
            format!(
                "{} is an embedding model: it generates no text (use /v1/embeddings)",
                s.model_name
            ),
        ));
    }
    let ctx = s.context_len;
    // Every prompt gets the same budget, which the longest must fit.
    let longest = job.prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= ctx {
        return Err(too_long(job.kind, ctx, longest, p.max_tokens.unwrap_or(1)));
    }
    let max_tokens = match (p.max_tokens, job.kind) {
        (Some(m), _) if longest + m > ctx => return Err(too_long(job.kind, ctx, longest, m)),
        (Some(m), _) => m,
        // OpenAI's default for the legacy completions endpoint is 16 tokens; a chat answer may
        // use the rest of the context.
        (None, Kind::Completion) => 16.min(ctx - longest),
        (None, Kind::Chat) => ctx - longest,
    };
    // `usage.prompt_tokens`: each prompt once, however many choices answer it.
    let n_prompt = job.prompts.iter().map(Vec::len).sum();
    // Prompt i's choice j is request i * n + j, with seed `seed + j`.
    let per_prompt = (0..p.n).map(|j| {
        let mut sampler = p.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(j as u64);
        sampler
    });
    let requests = job
        .prompts
        .iter()
        .flat_map(|prompt| per_prompt.clone().map(move |sampler| (prompt, sampler)))
        .map(|(prompt, sampler)| EngineRequest {
            prompt: prompt.clone(),
            max_tokens,
            sampler,
            stop_ids: if p.ignore_eos {
                vec![]
            } else {
                job.stop_ids.clone()
            },
            logprobs: job.logprobs,
            constraint: job.constraint.clone(),
            prompt_logprobs: if job.echo { job.logprobs } else { None },
            last_logits: false,
            draft: match p.speculative {
                true => s.draft.clone(),
                false => qwen3_inference::engine::Draft::None,
            },
            images: job.images.clone(),
        })
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sent = s.commands.send(Command::Submit {
        requests,
        updates: tx,
    });
    if sent.is_err() {
        return Err(ApiError::internal("the model worker has stopped"));
    }
    let ids = match rx.recv().await {
        Some(Update::Queued { ids }) => ids,
        Some(Update::Rejected(Rejected::QueueFull)) => {
            return Err(ApiError::overloaded(s.max_queue))
        }
        Some(Update::Rejected(Rejected::Invalid(why))) => {
            return Err(ApiError::invalid("prompt".to_string(), why))
        }
        _ => return Err(ApiError::internal("the model worker has stopped")),
    };
    let meta = Meta {
        id: format!(
            "{}-{:x}{:04x}",
            if job.kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            unix_now(),
            ids[0]
        ),
        created: unix_now(),
        model: s.model_name.clone(),
        kind: job.kind,
    };
    let choices = Choices::new(s, job, p, ids);
    Ok(Queued {
        meta,
        choices,
        rx,
        n_prompt,
    })
}

/// 400 `context_length_exceeded`, naming the field that holds the prompt.
fn too_long(kind: Kind, ctx: usize, prompt: usize, max_tokens: usize) -> ApiError {
    let param = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    ApiError::invalid(
        param.to_string(),
        format!(
            "this model's context holds {ctx} tokens; the request asks for {} ({prompt} in the prompt, {max_tokens} to generate): shorten the prompt or lower max_tokens",
            prompt + max_tokens
        ),
    )
    .with_code("context_length_exceeded")
}
