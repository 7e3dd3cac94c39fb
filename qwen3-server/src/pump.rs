//! The one loop between the model worker and an answer, for OpenAI's and Ollama's shapes alike:
//! the worker's updates for a job applied to its choices ([`Choices::apply`]) until every
//! choice is done, and then either the whole answer made at once ([`gather`]) or, update by
//! update, pieces sent to the client as they come ([`pump`]).
//!
//! ```text
//! worker --Update--> Choices::apply --+--> gather: wait for the end, then one JSON answer
//!                                     +--> pump:   Shape::pieces after each update, Shape::last
//!                                                  at the end, on a channel the body streams
//! ```
//!
//! Both keep the request log honest: a client that leaves before the end (its future or its
//! stream dropped) is logged as 499 by the [`LeftEarly`] guard, with the tokens made so far; a
//! streamed answer logs its 200 line when its last piece is sent, since the handler returned
//! long before.

use crate::answer::Choices;
use crate::job::{log_line, LeftEarly, LogTokens};
use crate::state::AppState;
use crate::worker::Update;
use futures_util::Stream;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Applies the worker's updates to `choices` until every choice is done; `each` sees the
/// choices after every update. `Err`: why the answer stopped short (the worker ended, or an
/// update did not fit the choices). The guard `left` is kept up to date and disarmed at the end.
pub(crate) async fn gather(
    s: &AppState,
    choices: &mut Choices,
    rx: &mut mpsc::UnboundedReceiver<Update>,
    left: &mut LeftEarly,
    mut each: impl FnMut(&Choices),
) -> Result<(), String> {
    let outcome = loop {
        if choices.all_done() {
            break Ok(());
        }
        let Some(u) = rx.recv().await else {
            break Err("the model worker has stopped".to_string());
        };
        if let Err(e) = choices.apply(u, s) {
            break Err(e);
        }
        each(choices);
        left.completion = choices.completion_tokens();
    };
    left.armed = false;
    outcome
}

/// What a streamed answer sends: its pieces as updates arrive, and its end.
pub(crate) trait Shape: Send + 'static {
    /// One message of the stream (a server-sent event, a line of JSON).
    type Item: Send + 'static;
    /// After each update: what to send of the choices' new pieces (`choices.out`, to be taken).
    fn pieces(&mut self, choices: &mut Choices) -> Vec<Self::Item>;
    /// At the end: what to send last, given why the answer stopped short, if it did.
    fn last(self, choices: &Choices, failed: Option<String>) -> Vec<Self::Item>;
}

/// Streams a job's answer in `shape`: a task applies the worker's updates and sends what the
/// shape makes of them, and the returned stream is the response body's. When the client goes
/// away, the body, and with it the channel, is dropped; the task ends at its next send (or at
/// once while the request still waits for a slot), and the worker sees its update channel
/// closed and frees the slot. `left` is the request's guard, armed; the log's path and prompt
/// count come from it.
pub(crate) fn pump<S: Shape>(
    s: Arc<AppState>,
    mut choices: Choices,
    mut rx: mpsc::UnboundedReceiver<Update>,
    left: LeftEarly,
    mut shape: S,
) -> impl Stream<Item = Result<S::Item, Infallible>> {
    let (tx, items) = mpsc::channel::<Result<S::Item, Infallible>>(64);
    tokio::spawn(async move {
        // The whole guard moves in (its Drop logs a client that leaves), not just the fields
        // this block names, which is all a closure would capture.
        let mut left = left;
        let mut failed = None;
        while !choices.all_done() {
            // A client that leaves while its request waits for a slot (nothing to send yet)
            // ends it here, before it runs.
            let u = tokio::select! {
                u = rx.recv() => u,
                _ = tx.closed() => return,
            };
            let Some(u) = u else {
                failed = Some("the model worker has stopped".to_string());
                break;
            };
            if let Err(e) = choices.apply(u, &s) {
                failed = Some(e);
                break;
            }
            left.completion = choices.completion_tokens();
            for item in shape.pieces(&mut choices) {
                if tx.send(Ok(item)).await.is_err() {
                    return; // the client is gone: `left` logs it
                }
            }
        }
        left.armed = false;
        for item in shape.last(&choices, failed) {
            let _ = tx.send(Ok(item)).await;
        }
        let tokens = LogTokens {
            prompt: left.prompt,
            completion: choices.completion_tokens(),
        };
        log_line("POST", left.path, 200, Some(tokens), left.start.elapsed());
        s.metrics.request(left.path, 200);
        s.metrics.tokens(tokens.prompt, tokens.completion);
    });
    futures_util::stream::unfold(items, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}
