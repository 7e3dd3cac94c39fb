//! The model worker: one thread that owns the [`Engine`] (the model, every sequence's KV cache)
//! and runs its steps, while the HTTP handlers, on tokio, talk to it through channels.
//!
//! ```text
//! handler --Command::Submit{requests, updates}--> [std mpsc] --> worker: engine.submit(...)
//! handler <--Update::Token / Finished ...-------- [tokio mpsc, one per HTTP request]
//! ```
//!
//! The worker blocks on its command channel while the engine is idle, and otherwise takes the
//! commands that arrived since the last step before running the next one. A handler that goes
//! away (its client disconnected) drops its receiver; the worker sees the closed channel before
//! the next step and cancels the request, freeing its slot.

use crate::metrics::Metrics;
use qwen3_inference::backend::Backend;
use qwen3_inference::engine::{Engine, Event, Rejected, Request, RequestId};
use qwen3_inference::generate::StopReason;
use qwen3_inference::logprobs::TokenLogprobs;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What a handler asks of the worker.
pub enum Command {
    /// Run these requests (an HTTP request's `n` choices); what happens to them goes to
    /// `updates`, each tagged with its choice's index.
    Submit {
        requests: Vec<Request>,
        updates: UnboundedSender<Update>,
    },
    /// Stop a request early (a stop string ended it).
    Cancel(RequestId),
    /// End every request and return (Ctrl-C or SIGTERM).
    Shutdown,
}

/// What happened to a choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The engine took the requests; choice `i` is request `ids[i]`.
    Queued { ids: Vec<RequestId> },
    /// The engine refused them; none runs.
    Rejected(Rejected),
    /// Choice `choice` took a slot with `cached` prompt tokens already computed.
    Started { choice: usize, cached: usize },
    /// The prompt's log-probabilities (`echo` with `logprobs`), before the first token.
    PromptLogprobs {
        choice: usize,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The logits at the prompt's last position (`/v1/rerank`).
    Logits { choice: usize, logits: Vec<f32> },
    /// An embedding model's vector of the input (`/v1/embeddings`).
    Embedding { choice: usize, vector: Vec<f32> },
    /// The next token, with its log-probabilities if the request asked for them.
    Token {
        choice: usize,
        token: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    },
    Finished {
        choice: usize,
        reason: StopReason,
        generated: usize,
    },
    /// The worker failed this choice (a failed step, or shutdown).
    Failed { choice: usize, error: String },
}

/// Runs the worker until the command channel closes or [`Command::Shutdown`] arrives, keeping
/// the engine's gauges in `metrics` up to date after every step.
pub fn run<B: Backend>(mut engine: Engine<B>, commands: Receiver<Command>, metrics: Arc<Metrics>) {
    let mut routes: HashMap<RequestId, (UnboundedSender<Update>, usize)> = HashMap::new();
    let mut events = Vec::new();
    loop {
        // 1. Commands: wait for one when there is nothing to run, then take all that arrived.
        let mut next = if engine.is_idle() {
            match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            None
        };
        loop {
            let cmd = match next.take() {
                Some(c) => c,
                None => match commands.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return fail_all(&routes, "shut down"),
                },
            };
            match cmd {
                Command::Submit { requests, updates } => {
                    submit(&mut engine, &mut routes, requests, updates)
                }
                Command::Cancel(id) => {
                    engine.cancel(id);
                    routes.remove(&id);
                }
                Command::Shutdown => {
                    return fail_all(&routes, "the server is shutting down");
                }
            }
        }

        // 2. Clients that went away: their requests end now.
        routes.retain(|&id, (tx, _)| {
            let open = !tx.is_closed();
            if !open {
                engine.cancel(id);
            }
            open
        });

        // 3. One step, and its events to their requests.
        engine.step(&mut events);
        // The gauges before the events go out (a handler that answers then, and a client that
        // reads /metrics after it, see the step's end), and again after them (a send that
        // finds its handler gone cancels a request).
        set_gauges(&engine, &metrics);
        if engine.step_sequences() > 0 {
            metrics
                .step_sequences
                .observe(engine.step_sequences() as f64);
        }
        for ev in events.drain(..) {
            match &ev {
                Event::Started { cached, .. } if *cached > 0 => {
                    metrics.prefix_cache_hits.fetch_add(1, Relaxed);
                    metrics
                        .prefix_cache_tokens
                        .fetch_add(*cached as u64, Relaxed);
                }
                Event::Finished { stats, .. } => {
                    let (d, a) = (stats.drafted_tokens as u64, stats.accepted_tokens as u64);
                    metrics.draft_tokens.fetch_add(d, Relaxed);
                    metrics.draft_accepted_tokens.fetch_add(a, Relaxed);
                }
                _ => {}
            }
            let (id, last) = match &ev {
                Event::Started { id, .. }
                | Event::PromptLogprobs { id, .. }
                | Event::Embedding { id, .. }
                | Event::Logits { id, .. }
                | Event::Token { id, .. } => (*id, false),
                Event::Finished { id, .. } | Event::Failed { id, .. } => (*id, true),
            };
            let Some((tx, choice)) = routes.get(&id) else {
                continue;
            };
            let choice = *choice;
            let update = match ev {
                Event::Started { cached, .. } => Update::Started { choice, cached },
                Event::PromptLogprobs { logprobs, .. } => {
                    Update::PromptLogprobs { choice, logprobs }
                }
                Event::Embedding { vector, .. } => Update::Embedding { choice, vector },
                Event::Logits { logits, .. } => Update::Logits { choice, logits },
                Event::Token {
                    token, logprobs, ..
                } => Update::Token {
                    choice,
                    token,
                    logprobs,
                },
                Event::Finished { stats, .. } => Update::Finished {
                    choice,
                    reason: stats.stop,
                    generated: stats.generated_tokens,
                },
                Event::Failed { error, .. } => Update::Failed { choice, error },
            };
            if tx.send(update).is_err() {
                // The handler is gone: stop spending steps on it.
                engine.cancel(id);
                routes.remove(&id);
            } else if last {
                routes.remove(&id);
            }
        }
        set_gauges(&engine, &metrics);
    }
}

/// The engine's state in `/metrics`' gauges.
fn set_gauges<B: Backend>(engine: &Engine<B>, metrics: &Metrics) {
    metrics.queued.store(engine.queued() as u64, Relaxed);
    metrics.running.store(engine.running() as u64, Relaxed);
    metrics.kv_cache_bytes.store(engine.kv_bytes(), Relaxed);
    metrics
        .kv_cache_usage
        .store(engine.kv_usage().to_bits(), Relaxed);
}

/// Queues an HTTP request's choices, all or none.
fn submit<B: Backend>(
    engine: &mut Engine<B>,
    routes: &mut HashMap<RequestId, (UnboundedSender<Update>, usize)>,
    requests: Vec<Request>,
    updates: UnboundedSender<Update>,
) {
    let mut ids = Vec::with_capacity(requests.len());
    for r in requests {
        match engine.submit(r) {
            Ok(id) => ids.push(id),
            Err(why) => {
                for &id in &ids {
                    engine.cancel(id);
                }
                let _ = updates.send(Update::Rejected(why));
                return;
            }
        }
    }
    for (choice, &id) in ids.iter().enumerate() {
        routes.insert(id, (updates.clone(), choice));
    }
    let _ = updates.send(Update::Queued { ids });
}

/// Tells every open request that the worker stops.
fn fail_all(routes: &HashMap<RequestId, (UnboundedSender<Update>, usize)>, why: &str) {
    for (tx, choice) in routes.values() {
        let _ = tx.send(Update::Failed {
            choice: *choice,
            error: why.to_string(),
        });
    }
}
