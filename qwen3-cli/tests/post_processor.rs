//! A tokenizer whose tokenizer.json post-processor adds a BOS token (DeepSeek-R1-Distill-Qwen's
//! kind: `TemplateProcessing` with `<｜begin▁of▁sentence｜> $A`), end to end: a text prompt gets
//! the BOS in every mode that encodes one (`tokenize`, `generate`, the server's
//! `/v1/completions`), and a chat prompt gets exactly the one its template writes (`chat-template`,
//! `chat`, `/v1/chat/completions`): HuggingFace's `tokenizer(text)` and `apply_chat_template`.
//!
//! The fixture is `fixtures/models/tiny-qwen2-bos-tokenizer` (scripts/make_fixtures.py): its
//! reference.json holds transformers' ids and greedy continuation of the text prompt, and
//! `chat_cases`, the ids of two conversations.

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture_json, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Output};

const NAME: &str = "tiny-qwen2-bos-tokenizer";
/// The BOS id of the fixture's tokenizer.
const BOS: u64 = 501;

fn reference() -> Value {
    fixture_json(NAME, "reference.json")
}

fn model(test: &str) -> PathBuf {
    export_fixture(NAME, &tempdir(&format!("bos-{test}"), NAME), DType::F32, 0)
}

fn qwen3(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "qwen3 {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn ids(v: &Value) -> Vec<u64> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn tokenize_and_generate_add_the_bos_of_the_post_processor() {
    let m = model("cli");
    let m = m.to_str().unwrap();
    let r = reference();
    let case = &r["cases"][0];
    let text = case["prompt_text"].as_str().unwrap();
    let want = ids(&case["prompt_ids"]);
    assert_eq!(want[0], BOS, "HF's tokenizer(text) starts with the BOS");

    let o = qwen3(&["tokenize", m, text]);
    let got: Vec<u64> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(got, want);
    let o = qwen3(&["tokenize", m, text, "--no-special-tokens"]);
    let got: Vec<u64> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(got, want[1..], "add_special_tokens=False: the text alone");

    // Greedy generation from the text: HF's continuation of [BOS] + text.
    let greedy = ids(&case["greedy_ids"]);
    let n = greedy.len().to_string();
    let o = qwen3(&["generate", m, "-i", text, "-n", &n, "-t", "0", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["prompt_tokens"], want.len());
    assert_eq!(ids(&v["tokens"]), greedy);
}

/// A chat prompt has the one BOS its template writes, not a second from the post-processor.
#[test]
fn chat_prompts_have_the_templates_bos_only() {
    let m = model("chat");
    let r = reference();
    let dir = m.parent().unwrap();
    for (i, case) in r["chat_cases"].as_array().unwrap().iter().enumerate() {
        let want = ids(&case["ids"]);
        assert_eq!(want.iter().filter(|&&t| t == BOS).count(), 1);
        let msgs = dir.join(format!("chat-{i}.json"));
        std::fs::write(&msgs, case["messages"].to_string()).unwrap();
        let o = qwen3(&[
            "chat-template",
            m.to_str().unwrap(),
            msgs.to_str().unwrap(),
            "--ids",
        ]);
        let got: Vec<u64> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(got, want, "case {i}");
    }
    // The terminal chat, piped: the first turn's prompt ids are the first case's.
    let case = &r["chat_cases"][0];
    let question = case["messages"][0]["content"].as_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["chat", m.to_str().unwrap(), "-n", "4", "-t", "0"])
        .arg("--verbose-prompt")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    writeln!(child.stdin.take().unwrap(), "{question}").unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("prompt ids: "))
        .unwrap_or_else(|| panic!("no prompt ids in {err}"));
    let got: Vec<u64> = serde_json::from_str(line).unwrap();
    assert_eq!(got, ids(&case["ids"]));
}

/// The server: a text completion's prompt has the BOS (its usage counts it, and the answer is
/// HF's greedy continuation); a chat completion's has the template's one.
#[test]
fn the_server_frames_text_prompts_and_not_chat_prompts() {
    let m = model("serve");
    let r = reference();
    let case = &r["cases"][0];
    let server = Server::start(&m, &[]);
    let greedy = ids(&case["greedy_ids"]);
    let v = server
        .post(
            "/v1/completions",
            &json!({"prompt": case["prompt_text"], "max_tokens": greedy.len(),
                    "temperature": 0}),
        )
        .json();
    assert_eq!(
        v["usage"]["prompt_tokens"],
        case["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(v["choices"][0]["text"], case["greedy_text"]);

    let chat = &r["chat_cases"][1];
    let v = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": chat["messages"], "max_tokens": 1}),
        )
        .json();
    assert_eq!(
        v["usage"]["prompt_tokens"],
        chat["ids"].as_array().unwrap().len()
    );
}
