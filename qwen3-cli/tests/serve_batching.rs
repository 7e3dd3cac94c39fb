//! `qwen3 serve` under many clients: the real binary, real HTTP, concurrent connections.
//!
//! - A burst of 64 requests at concurrency 16: every request is answered, and each answer is
//!   bit-identical to the same request run alone (batch invariance: its tokens do not depend on
//!   its neighbours in a step nor on how its prompt was chunked), and the greedy ones equal
//!   `qwen3 inference -t 0`; for a dense model and for a Qwen3-MoE, whose experts each run once
//!   a step on every row that chose them; and for a Qwen3.5, whose sequences carry a state.
//! - Clients that vanish mid-answer (streaming or not) free their slot at once; a full queue is a
//!   503 with Retry-After.

mod common;

use common::{connect, http, send, text, wait_until, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::io::Read;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const FIXTURE: &str = "tiny-qwen3-fullvocab";

/// Prompts of 1 to `max_words` words: short ones, and long ones that a step takes in several
/// chunks.
fn prompts(max_words: usize) -> Vec<String> {
    let words = [
        "river", "stone", "quantum", "bread", "Paris", "violet", "engine", "mouse",
    ];
    (0..16)
        .map(|i| {
            let n = 1 + (i * 37) % max_words;
            (0..n)
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Request `i` of the burst: a prompt, greedy or sampled with its own seed, streamed or not.
fn request(i: usize, prompts: &[String]) -> Value {
    let greedy = i.is_multiple_of(2);
    json!({
        "prompt": prompts[i % prompts.len()],
        "max_tokens": 16,
        "temperature": if greedy { 0.0 } else { 0.8 },
        "seed": i,
        "stream": i % 4 >= 2,
    })
}

/// The text of an answer, streamed or not.
fn answer(r: &common::Resp, stream: bool) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    if !stream {
        return text(&r.json());
    }
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn burst_answers_equal_solo_answers() {
    burst(FIXTURE, 160);
}

/// The same with experts: the Qwen3-MoE fixture (256 positions: prompts of up to 40 words).
#[test]
fn burst_answers_equal_solo_answers_with_experts() {
    burst("tiny-qwen3moe-bf16-tied", 40);
}

/// The same with Qwen3.5's hybrid layers: each sequence's Gated DeltaNet state beside its KV
/// cache, prompts of up to 120 words (over 64 tokens: the server cuts them where a chunk of the
/// delta rule starts, whatever `--prefill-chunk` says).
#[test]
fn burst_answers_equal_solo_answers_with_gated_delta_nets() {
    burst("tiny-qwen3_5-bf16", 120);
}

fn burst(fixture: &str, max_words: usize) {
    let dir = tempdir("pq-serve-batch", &format!("burst-{fixture}"));
    let model = export_fixture(fixture, &dir, DType::Q8, 32);
    let prompts = prompts(max_words);
    let s = Server::start(
        &model,
        &["--parallel", "16", "--prefill-chunk", "7", "--threads", "2"],
    );

    // Each request alone, one after the other.
    let solo: Vec<String> = (0..64)
        .map(|i| {
            let req = request(i, &prompts);
            answer(&s.post("/v1/completions", &req), req["stream"] == true)
        })
        .collect();

    // The same 64 from 16 clients at once.
    let next = Arc::new(Mutex::new(0usize));
    let got = Arc::new(Mutex::new(vec![None; 64]));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (next, got, prompts, port) = (next.clone(), got.clone(), prompts.clone(), s.port);
            std::thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    if *n == 64 {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let req = request(i, &prompts);
                let r = http(
                    port,
                    "POST",
                    "/v1/completions",
                    &[],
                    req.to_string().as_bytes(),
                );
                got.lock().unwrap()[i] = Some(answer(&r, req["stream"] == true));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let got = got.lock().unwrap();
    for i in 0..64 {
        assert_eq!(got[i].as_deref(), Some(solo[i].as_str()), "request {i}");
    }
    // The test can fail: sampled answers depend on their seeds.
    assert_ne!(solo[1], solo[3]);
    let log = s.log();
    assert_eq!(
        log.lines().filter(|l| l.contains(" 200 ")).count(),
        128,
        "{log}"
    );

    // Greedy answers equal the CLI's.
    for i in [0, 2, 6, 10] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args([
                "inference",
                model.to_str().unwrap(),
                "-i",
                &prompts[i],
                "-n",
                "16",
                "-t",
                "0",
            ])
            .output()
            .unwrap();
        assert!(o.status.success());
        let cli = String::from_utf8(o.stdout).unwrap();
        // The CLI prints special tokens (`<|im_start|>`, which a random model may generate); a
        // completion's text leaves them out.
        let cli = without_special_tokens(cli.strip_suffix('\n').unwrap());
        assert_eq!(cli, solo[i], "prompt {i}");
    }
    drop(s);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `text` without the `<|...|>` special tokens.
fn without_special_tokens(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("<|") {
        out.push_str(&rest[..start]);
        match rest[start..].find("|>") {
            Some(end) => rest = &rest[start + end + 2..],
            None => {
                rest = &rest[start..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One slot and no queue: a second request is a 503 with Retry-After while the first runs; a
/// client that hangs up (mid-stream, or waiting for a whole answer) frees the slot at once, so
/// the next request is served long before the abandoned answer would have ended.
#[test]
fn vanished_clients_free_their_slots() {
    let dir = tempdir("pq-serve-batch", "vanish");
    let model = export_fixture(FIXTURE, &dir, DType::Q8, 32);
    let s = Server::start(
        &model,
        &["--parallel", "1", "--queue", "0", "--context", "40000"],
    );
    let try_small = || small_request(s.port);

    for stream in [true, false] {
        let mut c = long_request(s.port, stream);
        if stream {
            // Read until the first token has arrived.
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !String::from_utf8_lossy(&seen).contains("data: {") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the stream ended early");
                seen.extend_from_slice(&buf[..n]);
            }
        } else {
            // Give the server a moment to take the request (a small one sent at once could
            // reach the worker first and take the slot).
            std::thread::sleep(Duration::from_millis(300));
        }
        // Busy: the second request is refused with the right status and header.
        let r = try_small();
        assert_eq!(r.status, 503, "{}; log: {}", r.body, s.log());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.error()["code"], "queue_full");

        drop(c); // the client vanishes
        assert!(
            wait_until(Duration::from_secs(10), || try_small().status == 200),
            "the abandoned request (stream: {stream}) still holds the slot: {}",
            s.log()
        );
    }
    assert_eq!(s.get("/health").status, 200);
    // Each abandoned request has its log line (status 499, nginx's "client closed request",
    // with the tokens so far) and its count in /metrics.
    assert!(
        wait_until(Duration::from_secs(10), || s
            .log()
            .matches("POST /v1/completions 499 prompt=4 completion=")
            .count()
            == 2),
        "{}",
        s.log()
    );
    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains(r#"qwen3_requests_total{route="/v1/completions",status="499"} 2"#),
        "{metrics}"
    );
    drop(s);

    // A client that leaves while its request waits in the queue frees its place there too.
    let s = Server::start(
        &model,
        &["--parallel", "1", "--queue", "1", "--context", "40000"],
    );
    let running = long_request(s.port, true);
    std::thread::sleep(Duration::from_millis(300));
    // The status line of a streamed request: sent as soon as it is queued (or refused).
    let status = |c: &mut TcpStream| {
        let mut head = [0u8; 12];
        c.read_exact(&mut head).unwrap();
        String::from_utf8_lossy(&head[9..12]).to_string()
    };
    let mut queued = long_request(s.port, true);
    assert_eq!(status(&mut queued), "200");
    assert_eq!(small_request(s.port).status, 503, "the queue holds one");
    drop(queued);
    let freed = wait_until(Duration::from_secs(10), || {
        status(&mut long_request(s.port, true)) == "200"
    });
    assert!(
        freed,
        "the vanished queued request still holds its place: {}",
        s.log()
    );
    drop(running);
    drop(s);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Sends a request long enough that nobody waits for its end (39990 tokens, whatever the
/// model samples) on a new connection, and returns the connection unread.
fn long_request(port: u16, stream: bool) -> TcpStream {
    let body = json!({"prompt": "Once upon a time", "max_tokens": 39990, "stream": stream,
                      "ignore_eos": true});
    let mut c = connect(port);
    send(
        &mut c,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    c
}

/// A two-token request, answered in full.
fn small_request(port: u16) -> common::Resp {
    let small = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    http(port, "POST", "/v1/completions", &[], small.as_bytes())
}
