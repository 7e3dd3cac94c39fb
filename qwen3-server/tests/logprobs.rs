//! Log-probabilities against HuggingFace through the server's routes (in process:
//! tests/common): `/v1/completions` `logprobs: K`, `/v1/chat/completions` `logprobs: true,
//! top_logprobs: K`, streamed and not, on f32 exports of the fixtures, every value within 1e-4 of
//! `torch.log_softmax` of transformers' float32 logits (fixtures/models/*/logprobs.json, written
//! by scripts/logprobs_reference.py). The CLI's `generate --logprobs K` is checked against the
//! same files in qwen3-cli/tests/logprobs.rs.

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const TOL: f64 = 1e-4;

fn reference(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
        .join("logprobs.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// An f32 export of fixture `name` in a directory of its own for each `test` (tests run side
/// by side).
fn f32_model(name: &str, test: &str) -> PathBuf {
    export_fixture(
        name,
        &tempdir(&format!("logprobs-{test}"), name),
        DType::F32,
        0,
    )
}

/// `/v1/completions` with `logprobs: 5`, whole and streamed: OpenAI's legacy lists, equal to HF.
#[test]
fn completions_logprobs_equal_hf_streamed_or_not() {
    let name = "tiny-qwen3-fullvocab";
    let refr = reference(name);
    let m = f32_model(name, "completions");
    let server = Server::start(&m, &[]);
    let tok =
        qwen3_inference::tokenizer::Tokenizer::open(&m.with_extension("tokenizer.bin")).unwrap();
    let piece = |id: u64| String::from_utf8_lossy(tok.token_bytes(id as u32).unwrap()).into_owned();
    for case in refr["cases"].as_array().unwrap() {
        let steps = case["steps"].as_array().unwrap();
        let body = json!({
            "prompt": case["prompt_ids"], "max_tokens": steps.len(), "temperature": 0,
            "logprobs": 5, "ignore_eos": true,
        });
        let whole = server.post("/v1/completions", &body).json();
        let lp = &whole["choices"][0]["logprobs"];
        let mut streamed =
            json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
        let mut s = body.clone();
        s["stream"] = true.into();
        for ev in server.post("/v1/completions", &s).events() {
            if ev == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(&ev).unwrap();
            let l = &v["choices"][0]["logprobs"];
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let add = l[key].as_array().unwrap().clone();
                streamed[key].as_array_mut().unwrap().extend(add);
            }
        }
        assert_eq!(&streamed, lp, "streamed and whole differ");
        let text = whole["choices"][0]["text"].as_str().unwrap();
        let mut offset = 0;
        for (k, want) in steps.iter().enumerate() {
            let id = want["token"].as_u64().unwrap();
            assert_eq!(lp["tokens"][k], piece(id), "step {k}");
            assert_eq!(lp["text_offset"][k], offset, "step {k}");
            offset += piece(id).chars().count();
            let v = lp["token_logprobs"][k].as_f64().unwrap();
            assert!(
                (v - want["logprob"].as_f64().unwrap()).abs() < TOL,
                "step {k}"
            );
            // The alternatives as {text: logprob}: HF's best is among them with its value.
            let best = &want["top"][0];
            let got = lp["top_logprobs"][k][piece(best[0].as_u64().unwrap())]
                .as_f64()
                .unwrap();
            assert!((got - best[1].as_f64().unwrap()).abs() < TOL, "step {k}");
            assert_eq!(
                lp["top_logprobs"][k].as_object().unwrap().len(),
                5,
                "step {k}"
            );
        }
        assert_eq!(offset, text.chars().count());
    }
}

/// `/v1/chat/completions` with `logprobs: true, top_logprobs: 3`: one `content` entry per token
/// with its bytes and alternatives (greedy: the chosen token is the best), the streamed entries
/// adding up to the whole answer's. (The values are the ones the completions test checks against
/// HF: both routes take them from the same engine event.)
#[test]
fn chat_logprobs_shape_and_stream() {
    let m = f32_model("tiny-qwen3-fullvocab", "chat");
    let server = Server::start(&m, &[]);
    let body = json!({
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
        "logprobs": true, "top_logprobs": 3, "ignore_eos": true,
    });
    let whole = server.post("/v1/chat/completions", &body).json();
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 6);
    for e in &content {
        let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        assert_eq!(e["token"], String::from_utf8_lossy(&bytes).as_ref());
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    let mut s = body.clone();
    s["stream"] = true.into();
    let mut streamed = vec![];
    for ev in server.post("/v1/chat/completions", &s).events() {
        if ev == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&ev).unwrap();
        if let Some(c) = v["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(c.iter().cloned());
        }
    }
    assert_eq!(streamed, content);
    // Without logprobs: null, as before.
    let plain = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        )
        .json();
    assert!(plain["choices"][0]["logprobs"].is_null());
}

#[test]
fn bad_logprobs_are_400s() {
    let m = f32_model("tiny-f32-tied-gqa2", "bad");
    let server = Server::start(&m, &[]);
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "top_logprobs": 3}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "logprobs": 3}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "logprobs": -1}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "logprobs": true}),
            "logprobs",
        ),
    ] {
        let r = server.post(path, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{body}");
    }
}
