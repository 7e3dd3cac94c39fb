//! Log-probabilities against HuggingFace through the server's routes (in process:
//! tests/common): `/v1/completions` `logprobs: K`, `/v1/chat/completions` `logprobs: true,
//! top_logprobs: K`, streamed and not, on f32 exports of the fixtures, every value within 1e-4 of
//! `torch.log_softmax` of transformers' float32 logits (fixtures/models/*/logprobs.json, written
//! by scripts/logprobs_reference.py). The CLI's `generate --logprobs K` is checked against the
//! same files in qwen3-cli/tests/logprobs.rs.

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture_json, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;

const TOL: f64 = 1e-4;

fn reference(name: &str) -> Value {
    fixture_json(name, "logprobs.json")
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

/// The legacy lists of a `/v1/completions` answer, whole or gathered from its stream.
fn lists(server: &Server, body: &Value) -> (Value, Value, String) {
    let whole = server.post("/v1/completions", body).json();
    let mut streamed =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    let mut s = body.clone();
    s["stream"] = true.into();
    let mut text = String::new();
    for ev in server.post("/v1/completions", &s).events() {
        if ev == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&ev).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap());
        let l = &v["choices"][0]["logprobs"];
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let add = l[key].as_array().unwrap().clone();
            streamed[key].as_array_mut().unwrap().extend(add);
        }
    }
    (whole, streamed, text)
}

/// `echo` with `logprobs: 5` (what evaluation harnesses send to score a text): the answer's
/// text starts with the prompt, and its lists cover the prompt's tokens, the first with null
/// (nothing comes before it) and each other equal to HF's log-softmax at the position before it,
/// its alternatives too; then the generated tokens as without echo. `max_tokens: 0` scores the
/// prompt alone. Streamed or not, the same.
#[test]
fn echo_scores_the_prompt_as_hf() {
    let name = "tiny-qwen3-fullvocab";
    let refr = reference(name);
    let m = f32_model(name, "echo");
    let server = Server::start(&m, &[]);
    let tok =
        qwen3_inference::tokenizer::Tokenizer::open(&m.with_extension("tokenizer.bin")).unwrap();
    let piece = |id: u64| String::from_utf8_lossy(tok.token_bytes(id as u32).unwrap()).into_owned();
    let close = |a: &Value, b: &Value| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < TOL;
    for case in refr["cases"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let prompt_text = tok.decode(&ids, false).unwrap();
        let scored = case["prompt"].as_array().unwrap();
        let steps = case["steps"].as_array().unwrap();
        for max_tokens in [0, steps.len()] {
            let body = json!({
                "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "echo": true,
                "logprobs": 5, "ignore_eos": true,
            });
            let (whole, streamed, streamed_text) = lists(&server, &body);
            let lp = &whole["choices"][0]["logprobs"];
            assert_eq!(&streamed, lp, "streamed and whole differ");
            let text = whole["choices"][0]["text"].as_str().unwrap();
            assert_eq!(streamed_text, text);
            assert!(text.starts_with(&prompt_text), "{text:?}");
            assert_eq!(whole["usage"]["completion_tokens"], max_tokens);
            assert_eq!(whole["usage"]["prompt_tokens"], ids.len());
            assert_eq!(
                lp["tokens"].as_array().unwrap().len(),
                ids.len() + max_tokens
            );
            assert_eq!(lp["tokens"][0], piece(ids[0] as u64));
            assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
            // The prompt's tokens after the first, then the answer's.
            let want = scored.iter().chain(steps.iter().take(max_tokens));
            for (k, w) in want.enumerate().map(|(k, w)| (k + 1, w)) {
                let id = w["token"].as_u64().unwrap();
                assert_eq!(lp["tokens"][k], piece(id), "token {k}");
                assert!(close(&lp["token_logprobs"][k], &w["logprob"]), "token {k}");
                let top = lp["top_logprobs"][k].as_object().unwrap();
                for alt in w["top"].as_array().unwrap() {
                    let got = &top[&piece(alt[0].as_u64().unwrap())];
                    assert!(close(got, &alt[1]), "token {k}: {top:?} {alt}");
                }
            }
            let offsets = lp["text_offset"].as_array().unwrap();
            assert_eq!(offsets[0], 0);
        }
    }
}

/// `prompt` as a list: each prompt gets `n` choices, numbered prompt x n + choice as OpenAI
/// does, each the answer the prompt gets alone (the same seeds); echo repeats each choice's own
/// prompt; usage counts each prompt once.
#[test]
fn a_list_of_prompts_gets_n_choices_each() {
    let m = f32_model("tiny-qwen3-fullvocab", "prompts");
    let server = Server::start(&m, &[]);
    let prompts = ["The capital of France is", "Once upon a"];
    let common = json!({"max_tokens": 5, "temperature": 0.9, "seed": 11, "n": 2, "echo": true});
    let mut alone = vec![];
    let mut n_prompt = 0;
    for p in prompts {
        let mut b = common.clone();
        b["prompt"] = p.into();
        let r = server.post("/v1/completions", &b).json();
        n_prompt += r["usage"]["prompt_tokens"].as_u64().unwrap();
        for c in r["choices"].as_array().unwrap() {
            assert!(c["text"].as_str().unwrap().starts_with(p));
            alone.push(c["text"].clone());
        }
    }
    let mut b = common.clone();
    b["prompt"] = json!(prompts);
    let r = server.post("/v1/completions", &b).json();
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], alone[i], "choice {i}");
    }
    assert_eq!(r["usage"]["prompt_tokens"], n_prompt);
    // Token-id lists too, and the bounds.
    let ids = json!([[1, 2, 3], [4, 5]]);
    let r = server.post("/v1/completions", &json!({"prompt": ids, "max_tokens": 2}));
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
    for (body, what) in [
        (
            json!({"prompt": [[-1]], "max_tokens": 2}),
            "integers from 0",
        ),
        (json!({"prompt": vec!["a"; 65], "n": 2}), "at most 128"),
        (json!({"prompt": "a", "max_tokens": 0}), "only with echo"),
    ] {
        let r = server.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(!r.error()["param"].as_str().unwrap().is_empty());
        assert!(
            r.error()["message"].as_str().unwrap().contains(what),
            "{}",
            r.body
        );
    }
    // An empty or null prompt starts a new document (`<|endoftext|>`, the spec's default).
    for p in [json!(null), json!(""), json!([]), json!([[1], []])] {
        let body = json!({"prompt": p, "max_tokens": 1, "echo": true, "logprobs": 0});
        let r = server.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{p}: {}", r.body);
        let v = r.json();
        let last = v["choices"].as_array().unwrap().last().unwrap();
        assert_eq!(last["logprobs"]["tokens"][0], "<|endoftext|>", "{p}");
    }
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "echo": true}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["param"], "echo");
}
