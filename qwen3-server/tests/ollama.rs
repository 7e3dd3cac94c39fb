//! Ollama's API through the router: the model listed and described as Ollama describes one, and
//! `/api/chat` and `/api/generate` answering as OpenAI's routes answer the same request
//! (greedy, so the same tokens), whole or as NDJSON lines, with Ollama's counts and durations.
//! The official `ollama` Python client is run against the real binary by
//! scripts/check_ollama_client.py (CI).

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;

fn model(test: &str) -> PathBuf {
    export_fixture(
        "tiny-qwen3-fullvocab",
        &tempdir("pq-ollama", test),
        DType::F32,
        0,
    )
}

/// A model's family is its GGUF architecture's name, as ollama reports it: a Qwen3.5 model's is
/// `qwen35` (`format::Architecture`'s table), not Qwen3's.
#[test]
fn a_hybrid_model_is_listed_in_its_family() {
    let dir = tempdir("pq-ollama", "family");
    let m = export_fixture("tiny-qwen3_5-bf16", &dir, DType::F32, 0);
    let s = Server::start(&m, &["--model-name", "tiny35", "--context", "256"]);
    let tags = s.get("/api/tags").json();
    assert_eq!(tags["models"][0]["details"]["family"], "qwen35", "{tags}");
}

/// The NDJSON lines of a streamed answer.
fn lines(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn the_model_is_listed_and_described() {
    let m = model("tags");
    let s = Server::start(&m, &["--model-name", "tiny", "--context", "512"]);
    assert!(s.get("/api/version").json()["version"].is_string());
    let tags = s.get("/api/tags").json();
    let t = &tags["models"][0];
    assert_eq!(
        (t["name"].as_str(), t["model"].as_str()),
        (Some("tiny"), Some("tiny"))
    );
    assert_eq!(t["details"]["family"], "qwen3");
    assert!(t["size"].as_u64().unwrap() > 1_000_000, "{t}");
    assert!(t["modified_at"].as_str().unwrap().ends_with('Z'));
    let ps = s.get("/api/ps").json();
    assert_eq!(ps["models"][0]["context_length"], 512);
    // `/api/show` takes the name as listed, and with Ollama's default tag.
    for name in ["tiny", "tiny:latest"] {
        let show = s.post("/api/show", &json!({"model": name}));
        assert_eq!(show.status, 200, "{}", show.body);
        let v = show.json();
        assert_eq!(v["model_info"]["general.architecture"], "qwen3");
        assert_eq!(v["model_info"]["qwen3.context_length"], 512);
        let caps: Vec<&str> = v["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(caps, ["completion", "tools", "thinking"]);
    }
    let r = s.post("/api/show", &json!({"model": "llama3"}));
    assert_eq!(r.status, 404);
    assert!(
        r.json()["error"].as_str().unwrap().contains("tiny"),
        "{}",
        r.body
    );
}

#[test]
fn chat_and_generate_answer_as_the_openai_routes() {
    let m = model("chat");
    let s = Server::start(&m, &["--model-name", "tiny"]);
    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let openai = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 6, "temperature": 0,
                    "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .json();
    let want = openai["choices"][0]["message"]["content"].as_str().unwrap();
    let body = json!({"model": "tiny", "messages": messages, "stream": false, "think": false,
                      "options": {"temperature": 0, "num_predict": 6}});
    let whole = s.post("/api/chat", &body).json();
    assert_eq!(whole["message"]["role"], "assistant");
    assert_eq!(whole["message"]["content"], want, "{whole}");
    assert_eq!(whole["done"], true);
    assert_eq!(whole["done_reason"], "length");
    assert_eq!(whole["eval_count"], 6);
    assert_eq!(whole["prompt_eval_count"], openai["usage"]["prompt_tokens"]);
    let total = whole["total_duration"].as_u64().unwrap();
    assert!(total > 0 && total >= whole["eval_duration"].as_u64().unwrap());

    // Streamed by default: NDJSON, the pieces add up to the same text, the last line is done.
    let mut streamed = body.clone();
    streamed.as_object_mut().unwrap().remove("stream");
    let r = s.post("/api/chat", &streamed);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let all = lines(&r.body);
    let (last, pieces) = all.split_last().unwrap();
    assert!(pieces.iter().all(|p| p["done"] == false));
    let text: String = pieces
        .iter()
        .map(|p| p["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, want);
    assert_eq!(
        (last["done"].as_bool(), last["eval_count"].as_u64()),
        (Some(true), Some(6))
    );

    // /api/generate: the prompt as a user message through the template, or raw.
    let g = s
        .post(
            "/api/generate",
            &json!({"model": "tiny", "prompt": "Hello there", "stream": false, "think": false,
                    "options": {"temperature": 0, "num_predict": 6}}),
        )
        .json();
    assert_eq!(g["response"], want, "{g}");
    let completion = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}),
        )
        .json();
    let raw = s
        .post(
            "/api/generate",
            &json!({"model": "tiny:latest", "prompt": "Once upon a time", "raw": true,
                    "stream": false, "options": {"temperature": 0, "num_predict": 5}}),
        )
        .json();
    assert_eq!(raw["response"], completion["choices"][0]["text"], "{raw}");

    // No prompt, no messages: Ollama's way to load the model, answered at once.
    let load = s.post("/api/generate", &json!({"model": "tiny"})).json();
    assert_eq!(
        (load["done"].as_bool(), load["done_reason"].as_str()),
        (Some(true), Some("load"))
    );
    // Errors in Ollama's shape.
    let r = s.post(
        "/api/chat",
        &json!({"model": "other", "messages": messages}),
    );
    assert_eq!(r.status, 404);
    let r = s.post(
        "/api/chat",
        &json!({"model": "tiny", "messages": messages, "options": {"temperature": 7}}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"].as_str().unwrap().contains("temperature"),
        "{}",
        r.body
    );
}

/// `format`: "json" or a JSON Schema, enforced as `response_format` is.
#[test]
fn format_constrains_the_answer() {
    let m = model("format");
    let s = Server::start(&m, &["--model-name", "tiny"]);
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"},
                        "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["ok", "n"], "additionalProperties": false});
    for format in [json!("json"), schema.clone()] {
        let r = s
            .post(
                "/api/chat",
                &json!({"model": "tiny", "messages": [{"role": "user", "content": "JSON"}],
                        "stream": false, "think": false, "format": format,
                        "options": {"temperature": 1, "seed": 4, "num_predict": 300}}),
            )
            .json();
        let text = r["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if format == schema {
            assert_eq!(r["done_reason"], "stop", "{r}");
            let v: Value = serde_json::from_str(text).unwrap();
            assert!(v["ok"].is_boolean() && v["n"].as_i64().unwrap() <= 9, "{v}");
        }
    }
}
