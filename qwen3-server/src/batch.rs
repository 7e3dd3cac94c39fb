//! `qwen3 batch`: a file of requests through the same routes and the same batching engine as
//! `qwen3 serve`, without a network (for evaluations and data generation).
//!
//! Input and output follow OpenAI's Batch API. Each input line is
//! `{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" |
//! "/v1/embeddings",
//! "body": {...}}`; each output line is
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`, or
//! `"response": null, "error": {"code", "message"}` for a line that is not a valid request.
//! The body is answered by the server's own router (in process, `tower::ServiceExt::oneshot`), so
//! a batch answer is byte for byte what `qwen3 serve` answers, 4xx included.
//!
//! Results are appended as they finish, one whole line per write. A rerun with the same output
//! skips the `custom_id`s already there (a last line cut by an interruption is dropped and redone),
//! so an interrupted run loses nothing.

use crate::state::AppState;
use crate::worker::Command;
use crate::{router_with, start_worker};
use anyhow::{Context, Result};
use axum::body::Body;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Read, Seek, Write};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// What a batch reports while it runs: the count of requests to run (once), then each result
/// with the tokens it generated.
pub enum Progress {
    Total { to_run: u64, already_done: u64 },
    Done { completion_tokens: u64 },
}

/// What a finished batch did.
#[derive(Debug, Default)]
pub struct Summary {
    /// Results written by this run (answers, 4xx answers and invalid lines alike).
    pub written: u64,
    /// Requests skipped because the output already had their `custom_id`.
    pub skipped: u64,
    /// Lines that were not valid requests (written as error lines).
    pub invalid: u64,
    /// Requests the server failed (a 5xx: the model failed): not written, so a rerun retries
    /// them; the first one's message.
    pub failed: u64,
    pub first_failure: Option<String>,
}

/// One line of the input, read.
enum Line {
    Request {
        custom_id: String,
        url: String,
        body: Value,
    },
    Invalid {
        custom_id: Option<String>,
        message: String,
    },
}

/// Reads input line `no` (1-based, for messages).
fn parse_line(no: usize, text: &str) -> Line {
    let invalid = |custom_id: Option<String>, m: String| Line::Invalid {
        custom_id,
        message: format!("line {no}: {m}"),
    };
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return invalid(None, format!("not valid JSON: {e}")),
    };
    let Some(custom_id) = v
        .get("custom_id")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return invalid(None, "custom_id must be a string".into());
    };
    let id = Some(custom_id.clone());
    // What a field held, for a message: its JSON, or that it is missing.
    let got = |f: &str| v.get(f).map_or("nothing".to_string(), Value::to_string);
    match v.get("method").and_then(Value::as_str) {
        Some("POST") => {}
        _ => {
            let m = format!("method must be \"POST\", got {}", got("method"));
            return invalid(id, m);
        }
    }
    let url = match v.get("url").and_then(Value::as_str) {
        Some(u @ ("/v1/chat/completions" | "/v1/completions" | "/v1/embeddings")) => u.to_string(),
        _ => {
            return invalid(
                id,
                format!(
                    "url must be \"/v1/chat/completions\", \"/v1/completions\" or \"/v1/embeddings\", got {}",
                    got("url")
                ),
            )
        }
    };
    let body = match v.get("body") {
        Some(b @ Value::Object(_)) => b.clone(),
        _ => return invalid(id, "body must be a JSON object".into()),
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return invalid(id, "stream: true has no meaning in a batch".into());
    }
    Line::Request {
        custom_id,
        url,
        body,
    }
}

/// What an existing output file holds already.
#[derive(Debug, Default)]
struct Done {
    /// The `custom_id`s of its answers, and for its error lines (an input line that was not a
    /// valid request), `#` and their message, which names the input line.
    ids: HashSet<String>,
    /// Its lines: this run's result ids continue from there (`batch_req_{lines + 1}`, ...).
    lines: u64,
    /// The id of the error line of each `custom_id` that has one: an answer to a fixed line
    /// says which error line it supersedes.
    errors: HashMap<String, String>,
}

/// Reads an existing output file (see [`Done`]). A last line without its newline (the run was
/// cut while writing it) is removed from the file, so it is run again.
fn done_ids(output: &Path) -> Result<Done> {
    let mut done = Done::default();
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(output)
    else {
        return Ok(done); // no output yet
    };
    let mut text = Vec::new();
    f.read_to_end(&mut text)
        .with_context(|| format!("{}: cannot read", output.display()))?;
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < text.len() {
        f.set_len(complete as u64)
            .with_context(|| format!("{}: cannot drop its cut last line", output.display()))?;
    }
    f.rewind()?;
    for (i, line) in std::io::BufReader::new(&text[..complete])
        .lines()
        .enumerate()
    {
        let line = line.with_context(|| format!("{}: not UTF-8 text", output.display()))?;
        let v: Value = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not a batch result (another file?)",
                output.display(),
                i + 1
            )
        })?;
        done.lines += 1;
        // An answer (2xx or 4xx) stands for its request; an error line for its input line.
        match v.get("custom_id").and_then(Value::as_str) {
            Some(id) if !v["response"].is_null() => done.ids.insert(id.to_string()),
            custom_id => {
                if let (Some(c), Some(line_id)) = (custom_id, v["id"].as_str()) {
                    done.errors.insert(c.to_string(), line_id.to_string());
                }
                let message = v["error"]["message"].as_str().unwrap_or("");
                done.ids.insert(format!("#{message}"))
            }
        };
    }
    Ok(done)
}

/// Runs the requests of `input` (a JSONL file) on the worker and appends their results to
/// `output`, calling `progress` as it goes. The worker is started as [`crate::serve`] starts it.
/// A request the server fails (5xx, the model failed) is not written: the summary counts it, and
/// a rerun retries it.
pub fn run<W>(
    state: AppState,
    commands: Receiver<Command>,
    worker: W,
    input: &Path,
    output: &Path,
    progress: impl Fn(Progress) + Send + Sync + 'static,
) -> Result<Summary>
where
    W: FnOnce(Receiver<Command>) -> Result<()> + Send + 'static,
{
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("{}: cannot read", input.display()))?;
    let done = done_ids(output)?;
    // Lines to run, and lines to answer with an error at once.
    let (mut todo, mut invalid, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
    let mut skipped = 0;
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line = match parse_line(i + 1, raw) {
            Line::Request { custom_id, .. } if !seen.insert(custom_id.clone()) => Line::Invalid {
                message: format!("line {}: custom_id {custom_id:?} appears twice", i + 1),
                custom_id: Some(custom_id),
            },
            line => line,
        };
        match line {
            Line::Request { custom_id, .. } if done.ids.contains(&custom_id) => skipped += 1,
            Line::Request {
                custom_id,
                url,
                body,
            } => todo.push((custom_id, url, body)),
            Line::Invalid { custom_id, message } => {
                if done.ids.contains(&format!("#{message}")) {
                    skipped += 1;
                } else {
                    invalid.push((custom_id, message));
                }
            }
        }
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(output)
        .with_context(|| format!("{}: cannot write", output.display()))?;
    let mut summary = Summary {
        skipped,
        invalid: invalid.len() as u64,
        ..Summary::default()
    };
    progress(Progress::Total {
        to_run: (todo.len() + invalid.len()) as u64,
        already_done: skipped,
    });
    // Result ids go on from those of earlier runs, so that they stay unique in the file.
    let mut next_id = done.lines;
    let mut write = |v: Value| -> Result<()> {
        // One write per line: an interruption cuts at most the line being written.
        let mut line = v.to_string();
        line.push('\n');
        out.write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .with_context(|| format!("{}: cannot write", output.display()))
    };
    for (custom_id, message) in invalid {
        next_id += 1;
        write(json!({
            "id": format!("batch_req_{next_id}"), "custom_id": custom_id, "response": null,
            "error": {"code": "invalid_request", "message": message},
        }))?;
        summary.written += 1;
        progress(Progress::Done {
            completion_tokens: 0,
        });
    }
    if todo.is_empty() {
        return Ok(summary);
    }

    let (thread, _ended) = start_worker(worker, commands)?;
    let in_flight = state.slots + state.max_queue;
    let commands_tx = state.commands.clone();
    let app = router_with(Arc::new(state), false);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(async {
        // At most the engine's slots plus its queue at once (weighted by each request's `n`),
        // so no request is refused for a full queue.
        let limit = Arc::new(Semaphore::new(in_flight));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, u16, Value)>();
        for (custom_id, url, body) in todo {
            let n = body
                .get("n")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .clamp(1, in_flight as u64);
            let permit = limit.clone().acquire_many_owned(n as u32).await?;
            let (app, tx) = (app.clone(), tx.clone());
            tokio::spawn(async move {
                let req = axum::http::Request::post(url)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .expect("a valid request");
                let (status, body) = match app.oneshot(req).await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await;
                        let body = bytes
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or(Value::Null);
                        (status, body)
                    }
                    Err(e) => match e {},
                };
                drop(permit);
                let _ = tx.send((custom_id, status, body));
            });
            // Write what has finished meanwhile.
            while let Ok(r) = rx.try_recv() {
                emit(&mut write, &mut next_id, &mut summary, &progress, &done, r)?;
            }
        }
        drop(tx);
        while let Some(r) = rx.recv().await {
            emit(&mut write, &mut next_id, &mut summary, &progress, &done, r)?;
        }
        anyhow::Ok(())
    });
    let _ = commands_tx.send(Command::Shutdown);
    drop(thread);
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result?;
    Ok(summary)
}

/// Writes one answer as a result line; an answer to a line whose earlier run wrote an error line
/// (the line was fixed since) says so: `"supersedes": "batch_req_N"`.
fn emit(
    write: &mut impl FnMut(Value) -> Result<()>,
    next_id: &mut u64,
    summary: &mut Summary,
    progress: &impl Fn(Progress),
    done: &Done,
    (custom_id, status, body): (String, u16, Value),
) -> Result<()> {
    if status >= 500 {
        summary.failed += 1;
        let why = body["error"]["message"]
            .as_str()
            .unwrap_or("no message")
            .to_string();
        summary
            .first_failure
            .get_or_insert_with(|| format!("{custom_id}: {status} {why}"));
        return Ok(());
    }
    *next_id += 1;
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    let mut line = json!({
        "id": format!("batch_req_{next_id}"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": body.get("id").cloned().unwrap_or(Value::Null), "body": body},
        "error": null,
    });
    if let Some(earlier) = done.errors.get(&custom_id) {
        line["supersedes"] = earlier.as_str().into();
    }
    write(line)?;
    summary.written += 1;
    progress(Progress::Done {
        completion_tokens: tokens,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_and_named() {
        let bad = |t: &str| match parse_line(3, t) {
            Line::Invalid { message, .. } => message,
            Line::Request { .. } => panic!("accepted {t}"),
        };
        assert!(bad("{").starts_with("line 3: not valid JSON"));
        assert!(bad(r#"{"method": "POST"}"#).contains("custom_id must be a string"));
        assert!(bad(
            r#"{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}"#
        )
        .contains("method must be \"POST\", got \"GET\""));
        assert!(bad(
            r#"{"custom_id": "a", "method": "POST", "url": "/v1/images/generations", "body": {}}"#
        )
        .contains("url must be"));
        assert!(bad(
            r#"{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": 1}"#
        )
        .contains("body must be a JSON object"));
        assert!(bad(r#"{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"stream": true}}"#)
            .contains("stream"));
        assert!(matches!(
            parse_line(
                1,
                r#"{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}"#
            ),
            Line::Request { .. }
        ));
    }

    #[test]
    fn a_cut_last_line_is_dropped_and_done_ids_read() {
        let d = std::env::temp_dir().join(format!("pq-batch-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("out.jsonl");
        let a = r#"{"custom_id": "a", "response": {"status_code": 200}}"#;
        let b = r#"{"custom_id": "b", "response": null, "error": {"message": "line 2: x"}}"#;
        std::fs::write(&p, format!("{a}\n{b}\n{{\"custom_id\": \"c\", \"resp")).unwrap();
        let done = done_ids(&p).unwrap();
        assert_eq!(
            done.ids,
            HashSet::from(["a".to_string(), "#line 2: x".to_string()])
        );
        assert_eq!(done.lines, 2);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("{a}\n{b}\n"));
        assert!(done_ids(&d.join("none.jsonl")).unwrap().ids.is_empty());
        std::fs::write(&p, "not json\n").unwrap();
        assert!(done_ids(&p)
            .unwrap_err()
            .to_string()
            .contains("not a batch result"));
        std::fs::remove_dir_all(d).unwrap();
    }
}
