//! `qwen3 serve` as a client uses it: the real binary on an ephemeral loopback port, spoken to
//! over HTTP. Every route, exactness against HuggingFace, streaming, usage, stop strings, `n`,
//! the thinking split, bad input (each with OpenAI's error object, never a 5xx), the API key,
//! and a clean exit on SIGTERM. Concurrency (batch invariance, a burst of clients, clients that
//! vanish) is in serve_batching.rs.

mod common;

use common::{http, text, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

const FIXTURE: &str = "tiny-qwen3-fullvocab";

/// The full-vocabulary fixture (random weights, the real Qwen3 tokenizer and chat template),
/// exported in f32, in a directory removed when the test ends.
struct Model {
    dir: PathBuf,
    path: PathBuf,
}

impl Model {
    fn new(test: &str) -> Model {
        let dir = tempdir("pq-serve", test);
        let path = export_fixture(FIXTURE, &dir, DType::F32, 0);
        Model { dir, path }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn reference() -> Value {
    let p = fixture(FIXTURE).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The greedy `/v1/completions` text equals HuggingFace's greedy continuation (f32 model,
/// `reference.json`), streamed or not, and the stream's deltas add up to the same text.
#[test]
fn completions_match_huggingface() {
    let m = Model::new("exact");
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
    let m = Model::new("chat");
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

/// Stop strings cut the answer before them (streamed or not), `n` gives several choices (the
/// same ones for greedy; different seeds for sampled ones), and a seed repeats an answer.
#[test]
fn stops_choices_and_seeds() {
    let m = Model::new("stops");
    let s = Server::start(&m.path, &[]);
    let case = &reference()["cases"][2];
    let want = case["greedy_text"].as_str().unwrap();
    let prompt = case["prompt_text"].clone();
    // A stop string from the middle of the answer: the text before its first occurrence.
    let chars: Vec<char> = want.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let cut = &want[..want.find(&stop).unwrap()];
    for stream in [false, true] {
        let req = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0,
                         "stop": ["never in this text", stop], "stream": stream});
        let r = s.post("/v1/completions", &req);
        assert_eq!(r.status, 200, "{}", r.body);
        let (got, finish) = if stream {
            let chunks: Vec<Value> = r.events()[..r.events().len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let t: String = chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap())
                .collect();
            (
                t,
                chunks.last().unwrap()["choices"][0]["finish_reason"].clone(),
            )
        } else {
            let v = r.json();
            (text(&v), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(got, cut, "stream {stream}");
        assert_eq!(finish, "stop");
    }

    // n = 3, greedy: three equal choices, indexed; usage counts all their tokens.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "n": 3}),
    );
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], want);
    }
    assert_eq!(v["usage"]["completion_tokens"], 72);

    // Sampled with a seed: the same seed repeats the answer; the n choices differ.
    let req = json!({"prompt": prompt, "max_tokens": 16, "temperature": 1.0, "top_k": -1,
                     "seed": 42, "n": 2});
    let a = s.post("/v1/completions", &req).json();
    let b = s.post("/v1/completions", &req).json();
    assert_eq!(a["choices"], b["choices"]);
    assert_ne!(a["choices"][0]["text"], a["choices"][1]["text"]);
}

/// Bad input: the right 4xx with OpenAI's error object naming the problem, never a 5xx; the
/// server keeps answering.
#[test]
fn bad_input_gets_4xx_error_objects() {
    let m = Model::new("bad");
    let s = Server::start(&m.path, &["--context", "64", "--model-name", "tiny"]);
    let check = |status: u16, path: &str, body: &[u8], param: Option<&str>, code: Option<&str>| {
        let r = http(s.port, "POST", path, &[], body);
        assert_eq!(
            r.status,
            status,
            "{path} {}: {}",
            String::from_utf8_lossy(body),
            r.body
        );
        let e = r.error();
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{e}");
        }
        if let Some(c) = code {
            assert_eq!(e["code"], c, "{e}");
        }
        e
    };
    let c = "/v1/completions";
    let chat = "/v1/chat/completions";
    check(400, c, b"{not json", None, None);
    check(400, c, b"[1, 2]", None, None);
    check(
        400,
        c,
        br#"{"prompt": "hi", "temperature": "hot"}"#,
        Some("temperature"),
        None,
    );
    check(
        400,
        c,
        br#"{"prompt": "hi", "temperature": 5}"#,
        Some("temperature"),
        None,
    );
    check(
        400,
        c,
        br#"{"prompt": "hi", "top_p": 0}"#,
        Some("top_p"),
        None,
    );
    check(400, c, br#"{"prompt": "hi", "n": 0}"#, Some("n"), None);
    check(
        400,
        c,
        br#"{"prompt": "hi", "max_tokens": -1}"#,
        Some("max_tokens"),
        None,
    );
    check(
        400,
        c,
        br#"{"prompt": "hi", "stop": 7}"#,
        Some("stop"),
        None,
    );
    check(
        400,
        c,
        br#"{"prompt": "hi", "echo": true}"#,
        Some("echo"),
        None,
    );
    check(400, c, br#"{"max_tokens": 4}"#, Some("prompt"), None);
    check(400, c, br#"{"prompt": ""}"#, Some("prompt"), None);
    check(
        400,
        c,
        br#"{"prompt": [1, 99999999]}"#,
        Some("prompt"),
        None,
    );
    check(
        404,
        c,
        br#"{"prompt": "hi", "model": "gpt-4"}"#,
        Some("model"),
        Some("model_not_found"),
    );
    // The context is 64 positions: a prompt plus max_tokens beyond it, or a prompt beyond it.
    let e = check(
        400,
        c,
        br#"{"prompt": "The capital of France is", "max_tokens": 60}"#,
        None,
        Some("context_length_exceeded"),
    );
    assert!(e["message"].as_str().unwrap().contains("64"), "{e}");
    let long = json!({"prompt": "word ".repeat(100)}).to_string();
    check(
        400,
        c,
        long.as_bytes(),
        None,
        Some("context_length_exceeded"),
    );
    // Chat: no messages, an unknown role, content of the wrong type, a template refusal.
    check(400, chat, br#"{"messages": []}"#, Some("messages"), None);
    check(400, chat, br#"{"model": "tiny"}"#, Some("messages"), None);
    let r = br#"{"messages": [{"role": "wizard", "content": "hi"}]}"#;
    check(400, chat, r, Some("messages[0].role"), None);
    let r = br#"{"messages": [{"role": "user", "content": {"a": 1}}]}"#;
    check(400, chat, r, Some("messages[0].content"), None);
    let r = br#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": 3}"#;
    check(400, chat, r, Some("chat_template_kwargs"), None);
    // Over the body limit (8 MiB): 413.
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(9 << 20));
    check(413, c, big.as_bytes(), None, None);
    // Unknown routes and methods.
    let r = s.get("/v1/nothing");
    assert_eq!(r.status, 404);
    r.error();
    let r = s.get(c);
    assert_eq!(r.status, 405);
    r.error();
    let r = s.get("/v1/models/gpt-4");
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");

    // Still serving, and nothing above was a 5xx in the log.
    let r = s.post(c, &json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.body);
    let log = s.log();
    assert!(!log.lines().any(|l| l.contains(" 500 ")), "{log}");
}

/// The routes that need no model answer as OpenAI's do; with an API key, every route but
/// /health needs `Authorization: Bearer KEY` (401 with an error object otherwise).
#[test]
fn routes_and_api_key() {
    let m = Model::new("key");
    let s = Server::start_env(&m.path, &[], &[("QWEN3_API_KEY", "sekret")]);
    let h = s.get("/health");
    assert_eq!((h.status, h.json()), (200, json!({"status": "ok"})));
    for path in ["/v1/models", "/v1/models/x"] {
        let r = s.get(path);
        assert_eq!(r.status, 401);
        assert_eq!(r.error()["code"], "invalid_api_key");
    }
    let wrong = http(
        s.port,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekreT")],
        b"",
    );
    assert_eq!(wrong.status, 401);
    let r = http(
        s.port,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekret")],
        b"",
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    let id = format!("{FIXTURE}-f32");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], id);
    assert_eq!(v["data"][0]["object"], "model");
    let r = http(
        s.port,
        "GET",
        &format!("/v1/models/{id}"),
        &[("Authorization", "Bearer sekret")],
        b"",
    );
    assert_eq!(r.json()["id"], id);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let r = http(s.port, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(r.status, 401);
    let auth = [("Authorization", "Bearer sekret")];
    let r = http(s.port, "POST", "/v1/completions", &auth, body.as_bytes());
    assert_eq!(r.status, 200);
}

/// SIGTERM: the server stops accepting, ends what runs, and exits 0.
#[test]
fn sigterm_exits_cleanly() {
    let m = Model::new("term");
    let mut s = Server::start(&m.path, &[]);
    // A long answer in flight.
    let port = s.port;
    let client = std::thread::spawn(move || {
        http(
            port,
            "POST",
            "/v1/completions",
            &[],
            json!({"prompt": "hi", "max_tokens": 3000, "stream": true, "ignore_eos": true})
                .to_string()
                .as_bytes(),
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let kill = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", s.log());
    // The client got an answer that ends (an error event for the cut-off stream, then [DONE]).
    let r = client.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
}

/// Bad flags: a clear one-line error and exit 1, before anything listens.
#[test]
fn bad_flags_are_clear_errors() {
    let m = Model::new("flags");
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
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["serve", "/nonexistent/model.bin"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/model.bin"));
}
