//! The routes as a client uses them, through the server's router in process (tests/common):
//! stop strings, `n` and seeds, bad input (each with OpenAI's error object, never a 5xx), the
//! routes that need no model, and the API key. What needs the real binary on a port (exactness
//! against HuggingFace with the request log, the CLI's own answers, SIGTERM, startup flags,
//! concurrency) is in qwen3-cli/tests/serve.rs and serve_batching.rs.

mod common;

use common::{text, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{fixture_json, Exported};
use serde_json::{json, Value};

const FIXTURE: &str = "tiny-qwen3-fullvocab";

/// The full-vocabulary fixture (random weights, the real Qwen3 tokenizer and chat template),
/// exported in f32 for one test.
fn model(test: &str) -> Exported {
    Exported::new(FIXTURE, "pq-routes", test, DType::F32)
}

fn reference() -> Value {
    fixture_json(FIXTURE, "reference.json")
}

/// Stop strings cut the answer before them (streamed or not), `n` gives several choices (the
/// same ones for greedy; different seeds for sampled ones), and a seed repeats an answer.
#[test]
fn stops_choices_and_seeds() {
    let m = model("stops");
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
    let m = model("bad");
    let s = Server::start(&m.path, &["--context", "64", "--model-name", "tiny"]);
    let check = |status: u16, path: &str, body: &[u8], param: Option<&str>, code: Option<&str>| {
        let r = s.http("POST", path, &[], body);
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
        br#"{"prompt": "hi", "top_p": 1.5}"#,
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
        br#"{"prompt": "hi", "echo": 1}"#,
        Some("echo"),
        None,
    );
    check(400, c, br#"{"max_tokens": 4}"#, Some("prompt"), None);
    check(400, c, br#"{"prompt": [[-1]]}"#, Some("prompt"), None);
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
    // Over the body limit (64 MiB): 413.
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(65 << 20));
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
    let m = model("key");
    let s = Server::start_env(&m.path, &[], &[("QWEN3_API_KEY", "sekret")]);
    let h = s.get("/health");
    assert_eq!((h.status, h.json()), (200, json!({"status": "ok"})));
    for path in ["/v1/models", "/v1/models/x"] {
        let r = s.get(path);
        assert_eq!(r.status, 401);
        assert_eq!(r.error()["code"], "invalid_api_key");
    }
    let wrong = s.http(
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekreT")],
        b"",
    );
    assert_eq!(wrong.status, 401);
    let r = s.http(
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
    let r = s.http(
        "GET",
        &format!("/v1/models/{id}"),
        &[("Authorization", "Bearer sekret")],
        b"",
    );
    assert_eq!(r.json()["id"], id);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let r = s.http("POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(r.status, 401);
    let auth = [("Authorization", "Bearer sekret")];
    let r = s.http("POST", "/v1/completions", &auth, body.as_bytes());
    assert_eq!(r.status, 200);
}

/// A POST body must be declared JSON (415 otherwise: a form or `text/plain` POST is one any web
/// page can send without a CORS preflight); CORS allows no page by default, and the `--cors`
/// origins only.
#[test]
fn json_bodies_only_and_cors_by_origin() {
    let m = model("cors");
    let body = br#"{"prompt": "hi", "max_tokens": 1}"#;
    let s = Server::start(&m.path, &[]);
    for ct in ["text/plain", "application/x-www-form-urlencoded", ""] {
        let r = s.http("POST", "/v1/completions", &[("Content-Type", ct)], body);
        assert_eq!(r.status, 415, "{ct}: {}", r.body);
        assert_eq!(r.error()["type"], "invalid_request_error", "{ct}");
    }
    let ok = [("Content-Type", "application/json; charset=utf-8")];
    assert_eq!(s.http("POST", "/v1/completions", &ok, body).status, 200);
    // A page from elsewhere: no CORS header, so the browser keeps the answer from it.
    let page = [("Origin", "https://evil.example")];
    let r = s.http("GET", "/v1/models", &page, b"");
    assert_eq!(r.header("access-control-allow-origin"), None);
    drop(s);

    let s = Server::start(&m.path, &["--cors", "https://app.example"]);
    let r = s.http(
        "GET",
        "/v1/models",
        &[("Origin", "https://app.example")],
        b"",
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let preflight = s.http(
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        b"",
    );
    assert_eq!(preflight.status, 200, "{}", preflight.body);
    let r = s.http("GET", "/v1/models", &page, b"");
    assert_eq!(r.header("access-control-allow-origin"), None);
}
