//! `qwen3 serve` as a client uses it: the real binary on an ephemeral loopback port, spoken to
//! over HTTP. What needs the binary: exactness against HuggingFace with streaming, usage and the
//! request log on stderr, the same answer as the CLI's own chat, a clean exit on SIGTERM, the API
//! key read from `QWEN3_API_KEY` by the command, and clear errors for bad flags. Concurrency (batch invariance, a burst of clients, clients that
//! vanish) is in serve_batching.rs; the routes where the socket is not the point (stop strings,
//! `n`, bad input, the API key) are in qwen3-server/tests, through the router in process.

mod common;

use common::{connect, http, send, text, wait_until, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{fixture_json, Exported};
use serde_json::{json, Value};
use std::io::Read;
use std::process::Command;
use std::time::Duration;

const FIXTURE: &str = "tiny-qwen3-fullvocab";

/// The full-vocabulary fixture (random weights, the real Qwen3 tokenizer and chat template),
/// exported in f32 for one test.
fn model(test: &str) -> Exported {
    Exported::new(FIXTURE, "pq-serve", test, DType::F32)
}

fn reference() -> Value {
    fixture_json(FIXTURE, "reference.json")
}

/// The greedy `/v1/completions` text equals HuggingFace's greedy continuation (f32 model,
/// `reference.json`), streamed or not, and the stream's deltas add up to the same text.
#[test]
fn completions_match_huggingface() {
    let m = model("exact");
    let s = Server::start(&m.path, &["--model-name", "tiny"]);
    for case in reference()["cases"].as_array().unwrap() {
        let prompt = case["prompt_text"].as_str().unwrap();
        let want = case["greedy_text"].as_str().unwrap();
        let req = json!({"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0});
        let r = s.post("/v1/completions", &req);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(text(&v), want, "prompt {prompt:?}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["model"], "tiny");
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
        assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let n_prompt = case["prompt_ids"].as_array().unwrap().len() as u64;
        let u = &v["usage"];
        assert_eq!(u["prompt_tokens"], n_prompt);
        assert_eq!(u["completion_tokens"], 24);
        assert_eq!(u["total_tokens"], n_prompt + 24);
        assert!(u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some());

        // The prompt as ids gives the same answer.
        let ids = case["prompt_ids"].clone();
        let r = s.post(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 24, "temperature": 0}),
        );
        assert_eq!(text(&r.json()), want);

        // Streamed: chunks of text, then a usage chunk, then [DONE].
        let mut req = req.clone();
        req["stream"] = true.into();
        req["stream_options"] = json!({"include_usage": true});
        let r = s.post("/v1/completions", &req);
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let events = r.events();
        assert_eq!(events.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let (usage, chunks) = chunks.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 24);
        let streamed: String = chunks
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, want);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
        assert!(chunks.iter().all(|c| c["usage"].is_null()));
    }
    // The second identical prompt found the first one's tokens in a slot.
    let case = &reference()["cases"][0];
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": case["prompt_text"], "max_tokens": 2, "temperature": 0}),
    );
    let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert_eq!(
        cached,
        case["prompt_ids"].as_array().unwrap().len() as u64 - 1
    );
    // One log line per request: method, path, status, tokens, milliseconds.
    let log = s.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with("POST /v1/completions 200 prompt=")
                && l.contains("completion=24")
                && l.ends_with("ms")),
        "{log}"
    );
}

/// The same greedy answer as `qwen3 inference -t 0`, through the chat template too: the server
/// renders a conversation exactly as the CLI does (`qwen3 chat-template --ids` counts its ids).
#[test]
fn chat_matches_the_cli() {
    let m = model("chat");
    let s = Server::start(&m.path, &[]);
    let model = m.path.to_str().unwrap();
    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    for thinking in ["on", "off"] {
        let want = cli(&[
            "inference",
            model,
            "--chat",
            "-i",
            "Hello there",
            "-n",
            "20",
            "-t",
            "0",
            "-y",
            "Be brief.",
            "--thinking",
            thinking,
        ]);
        let req = json!({
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hello there"}],
            "max_tokens": 20, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": thinking == "on"},
        });
        let r = s.post("/v1/chat/completions", &req);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        let msg = &v["choices"][0]["message"];
        assert_eq!(msg["role"], "assistant");
        // The random model writes no <think> block: all of it is content.
        assert_eq!(
            msg["content"].as_str().unwrap(),
            want.trim_end_matches('\n')
        );
        assert!(msg.get("reasoning_content").is_none());

        // The prompt's ids: as many as the template renders for the same messages.
        let msgs = m.dir.join("messages.json");
        std::fs::write(&msgs, req["messages"].to_string()).unwrap();
        let ids = cli(&[
            "chat-template",
            model,
            msgs.to_str().unwrap(),
            "--ids",
            "--thinking",
            thinking,
        ]);
        let ids: Vec<u32> = serde_json::from_str(ids.trim()).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());

        // Streamed: a first delta with the role, then content, then the finish.
        let mut sreq = req.clone();
        sreq["stream"] = true.into();
        let events = s.post("/v1/chat/completions", &sreq).events();
        assert_eq!(events.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(streamed, msg["content"].as_str().unwrap());
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
    }
}

/// `kill -TERM` the server.
fn terminate(s: &Server) {
    let kill = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// Reads a response from `stream` until `needle` has come (or the response ends); returns what
/// was read.
fn read_until(stream: &mut std::net::TcpStream, needle: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(needle.len()).any(|w| w == needle) {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// A rolling update's stop: on SIGTERM `/health` turns 503 and a new request gets a 503 that
/// names the shutdown (a load balancer sends both elsewhere), while the requests the server
/// holds, one running and one queued behind it, are answered in full; then it exits 0.
#[test]
fn sigterm_answers_what_it_holds_then_exits() {
    let m = model("drain");
    let mut s = Server::start(&m.path, &["--parallel", "1", "--shutdown-timeout", "300"]);
    let body = json!({"prompt": "hi", "max_tokens": 300, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}})
    .to_string();
    let mut running = connect(s.port);
    send(
        &mut running,
        "POST",
        "/v1/completions",
        &[],
        body.as_bytes(),
    );
    let mut first = read_until(&mut running, b"data: ");
    let mut queued = connect(s.port);
    send(&mut queued, "POST", "/v1/completions", &[], body.as_bytes());
    assert!(wait_until(Duration::from_secs(60), || s
        .get("/metrics")
        .body
        .contains("\nqwen3_queued_requests 1\n")));

    terminate(&s);
    assert!(wait_until(Duration::from_secs(10), || s
        .get("/health")
        .status
        == 503));
    let refused = s.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}));
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "shutting_down");
    assert_eq!(refused.header("retry-after"), Some("1"));

    for (stream, mut raw) in [
        (&mut running, std::mem::take(&mut first)),
        (&mut queued, vec![]),
    ] {
        stream.read_to_end(&mut raw).unwrap();
        let events = common::parse(&raw).events();
        assert_eq!(events.last().unwrap(), "[DONE]");
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 300, "{events:?}");
    }
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", s.log());
    assert!(s.log().contains("every request answered"), "{}", s.log());
}

/// Past `--shutdown-timeout` what still runs is ended: the stream gets an error event and
/// `[DONE]`, and the server exits 0.
#[test]
fn sigterm_ends_what_outlasts_the_shutdown_timeout() {
    let m = model("term");
    let mut s = Server::start(&m.path, &["--shutdown-timeout", "0.5"]);
    // A long answer in flight.
    let mut stream = connect(s.port);
    let body = json!({"prompt": "hi", "max_tokens": 3000, "stream": true, "ignore_eos": true});
    send(
        &mut stream,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    let mut raw = read_until(&mut stream, b"data: ");
    terminate(&s);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", s.log());
    // The client got an answer that ends (an error event for the cut-off stream, then [DONE]).
    stream.read_to_end(&mut raw).unwrap();
    let r = common::parse(&raw);
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(
        events.iter().any(|e| e.contains("shutting down")),
        "{events:?}"
    );
}

/// The key can come from the environment instead of `--api-key` (read by the command, so only
/// the real binary shows it): then the routes under `/v1` want it, and `/health` does not.
#[test]
fn the_api_key_comes_from_the_environment() {
    let m = model("env-key");
    let s = Server::start_env(&m.path, &[], &[("QWEN3_API_KEY", "sekret")]);
    assert_eq!(s.get("/health").status, 200);
    let r = s.get("/v1/models");
    assert_eq!(r.status, 401, "{}", r.body);
    let ok = http(
        s.port,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekret")],
        b"",
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
}

/// Bad flags: a clear one-line error and exit 1, before anything listens.
#[test]
fn bad_flags_are_clear_errors() {
    let m = model("flags");
    let model = m.path.to_str().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(["serve", model, "--port", "0"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}: nothing listens");
        String::from_utf8(o.stderr).unwrap()
    };
    assert!(run(&["--parallel", "0"]).contains("--parallel"));
    assert!(run(&["--context", "999999"]).contains("--context"));
    assert!(run(&["--threads", "0"]).contains("--threads"));
    assert!(run(&["--device", "tpu"]).contains("tpu"));
    let e = run(&["--device", "cuda"]);
    assert!(e.to_lowercase().contains("cuda"), "{e}");
    assert!(run(&["--host", "256.1.1.1"]).contains("256.1.1.1"));
    assert!(run(&["--max-connections", "0"]).contains("--max-connections"));
    assert!(run(&["--header-timeout", "0"]).contains("--header-timeout"));
    assert!(run(&["--body-timeout", "nan"]).contains("--body-timeout"));
    // The listener's limits are refused before the model is read: even with no model there.
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["serve", "/nonexistent/model.bin", "--body-timeout", "nan"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--body-timeout"));
    // A text model fetches no images.
    assert!(run(&["--fetch-image-urls"]).contains("takes no images"));
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["serve", "/nonexistent/model.bin"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/model.bin"));
}

/// Sends `bytes` on a fresh connection and reads the answer to the end.
fn raw(port: u16, bytes: &[u8]) -> common::Resp {
    use std::io::{Read, Write};
    let mut s = common::connect(port);
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    common::parse(&out)
}

/// The errors HTTP itself answers carry OpenAI's error object like every other: a garbage
/// request line (400), a URI over hyper's 64 KiB (414), headers over its buffer (431); a body
/// that does not arrive within `--body-timeout` gets a 408, and a request head that does not
/// arrive within `--header-timeout` has its connection closed.
#[test]
fn http_level_errors_and_timeouts() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let m = model("http-errors");
    let s = Server::start(
        &m.path,
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--context",
            "64",
        ],
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let big_head = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(500_000)
    );
    for (bytes, status) in [
        (&b"HELLO THERE\r\n\r\n"[..], 400),
        (long_uri.as_bytes(), 414),
        (big_head.as_bytes(), 431),
    ] {
        let r = raw(s.port, bytes);
        assert_eq!(r.status, status, "{}", r.body);
        let e = r.error();
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert!(!e["message"].as_str().unwrap().is_empty());
    }
    // A body that promises 100 bytes and sends 2.
    let t = Instant::now();
    let r = raw(
        s.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}",
    );
    assert_eq!(r.status, 408, "{}", r.body);
    assert!(r.error()["message"]
        .as_str()
        .unwrap()
        .contains("--body-timeout"));
    assert!(t.elapsed() < Duration::from_secs(30));
    // Half a request head: the connection is closed (read gives end of file, not a timeout).
    let t = Instant::now();
    let mut c = common::connect(s.port);
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    // The server still answers.
    assert_eq!(s.get("/health").status, 200);
}

/// `--max-connections 2`: with two connections open, a third gets a 503 with OpenAI's error
/// object at once; when one closes, new connections are served again.
#[test]
fn connections_beyond_the_limit_get_503() {
    use std::io::Write;
    let m = model("max-connections");
    let s = Server::start(&m.path, &["--max-connections", "2", "--context", "64"]);
    let mut held = vec![common::connect(s.port), common::connect(s.port)];
    // Each has started a request, so both are surely accepted and held.
    for c in &mut held {
        c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    }
    let r = raw(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.error()["code"], "too_many_connections");
    held.pop();
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || { s.get("/health").status == 200 }
    ));
}
