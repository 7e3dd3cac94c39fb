//! Speculative decoding through the CLI (`generate --draft ngram`): the answer is plain
//! decoding's, token for token, greedy and seeded sampling, on f32 and q8 exports of the
//! full-vocabulary fixture, with a prompt that repeats itself (so that prompt lookup drafts);
//! the drafts are counted in `--json`; bad flags are refused by name. `--draft-model` likewise,
//! with the model itself and another of the same tokens as draft models, and one of other
//! tokens refused. `qwen3 serve --draft ngram` and `--draft-model` answer eight concurrent
//! clients as they answer each alone without drafts. The engine's own tests
//! (qwen3-inference engine/tests/speculative.rs) check the same against replayed answers, rejected drafts
//! and the KV cache's rollback.

mod common;

use common::{text, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const PROMPT: &str =
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the";

fn generate(model: &Path, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .arg("generate")
        .arg(model)
        .args(["-i", PROMPT, "-n", "48", "--json", "--threads", "1"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn drafts_give_the_plain_answer() {
    let dir = tempdir("speculative", "answers");
    for dt in [DType::F32, DType::Q8] {
        let group = if dt == DType::Q8 { 32 } else { 0 };
        let model = export_fixture("tiny-qwen3-fullvocab", &dir, dt, group);
        for sampling in [&["-t", "0"][..], &["-t", "0.8", "-s", "7"]] {
            let plain = generate(&model, sampling);
            assert_eq!(plain["draft"]["drafted_tokens"], 0);
            for max in ["2", "8"] {
                let args = [sampling, &["--draft", "ngram", "--draft-max", max]].concat();
                let drafted = generate(&model, &args);
                let what = format!("{dt} {sampling:?} --draft-max {max}");
                assert_eq!(drafted["tokens"], plain["tokens"], "{what}");
                assert_eq!(drafted["text"], plain["text"], "{what}");
                // Greedy, the random model repeats itself and prompt lookup drafts; sampled, its
                // answer rarely repeats a pair of tokens (the engine's tests draft sampled
                // answers by replay).
                let d = &drafted["draft"];
                if sampling[1] == "0" {
                    assert!(d["drafted_tokens"].as_u64().unwrap() > 0, "{what}: {d}");
                }
                assert!(d["accepted_tokens"].as_u64() <= d["drafted_tokens"].as_u64());
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_draft_flags_are_refused() {
    for (args, says) in [
        (
            &["--draft", "ngram", "--draft-max", "0"][..],
            "--draft-max 0",
        ),
        (&["--draft-max", "4"], "give --draft ngram"),
        (&["--draft", "model"], "invalid value 'model'"),
        (
            &["--draft", "ngram", "--draft-model", "m.bin"],
            "two sources of drafts",
        ),
        (
            &["--draft-model", "m.bin", "--draft-max", "0"],
            "--draft-max 0",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(["generate", "no-such-model.bin", "-i", "x"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

/// Eight clients at once on `s`'s four slots, greedy and seeded, each with the server's drafts:
/// each answer equals the one the same request gets alone with `"speculative": false`, and
/// `/metrics` counts the drafts.
fn eight_clients_get_plain_answers(s: &Server) {
    let body = |i: usize| {
        let t = if i.is_multiple_of(2) { 0.0 } else { 0.8 };
        json!({"prompt": format!("{PROMPT} {i}"), "max_tokens": 32, "temperature": t, "seed": i})
    };
    let port = s.port;
    let clients: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let b = body(i).to_string();
                common::http(port, "POST", "/v1/completions", &[], b.as_bytes())
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let mut alone = body(i);
        alone["speculative"] = json!(false);
        let plain = s.post("/v1/completions", &alone);
        assert_eq!(text(&r.json()), text(&plain.json()), "client {i}");
    }
    let m = s.get("/metrics").body;
    let drafted = m
        .lines()
        .find_map(|l| l.strip_prefix("qwen3_draft_tokens_total "))
        .unwrap();
    assert!(drafted.parse::<u64>().unwrap() > 0, "{m}");
}

/// `qwen3 serve --draft ngram`: [`eight_clients_get_plain_answers`].
#[test]
fn served_beside_others_the_answers_are_plain() {
    let s = Server::start(
        Path::new(common::fullvocab_model()),
        &["--parallel", "4", "--draft", "ngram"],
    );
    eight_clients_get_plain_answers(&s);
}

/// Greedy and seeded answers with `--draft-model`, the model itself (every greedy guess right)
/// or a smaller one with the same tokens (few right, so guesses are rolled back), equal plain
/// decoding's, f32 and q8; `--json` counts the drafts.
#[test]
fn a_draft_model_gives_the_plain_answer() {
    let dir = tempdir("speculative", "draft-model");
    let small = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    for dt in [DType::F32, DType::Q8] {
        let group = if dt == DType::Q8 { 32 } else { 0 };
        let model = export_fixture("tiny-bf16-untied-mha", &dir, dt, group);
        for sampling in [&["-t", "0"][..], &["-t", "0.8", "-s", "7"]] {
            let plain = generate(&model, sampling);
            for draft in [&model, &small] {
                let args = [sampling, &["--draft-model", draft.to_str().unwrap()]].concat();
                let drafted = generate(&model, &args);
                let what = format!("{dt} {sampling:?} {}", draft.display());
                assert_eq!(drafted["tokens"], plain["tokens"], "{what}");
                assert_eq!(drafted["text"], plain["text"], "{what}");
                let d = &drafted["draft"];
                assert!(d["drafted_tokens"].as_u64().unwrap() > 0, "{what}: {d}");
                if draft == &model && sampling[1] == "0" {
                    assert_eq!(d["accepted_tokens"], d["drafted_tokens"], "{what}");
                }
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A draft model whose tokens are not the model's (a Qwen2 fixture's tokenizer: the same size,
/// other added tokens) is refused, naming the first difference; so is an embedding model; in
/// `generate` and in `serve`.
#[test]
fn a_draft_model_of_other_tokens_is_refused() {
    let dir = tempdir("speculative", "other-vocab");
    let model = export_fixture("tiny-bf16-untied-mha", &dir, DType::F32, 0);
    let cases = [
        (
            "tiny-qwen2-f32-tied-gqa2",
            "has another vocabulary than",
            "token 505 is \"<think>\" against \"<tool_call>\"",
        ),
        ("tiny-qwen3-embedding", "an embedding model", "no tokens"),
    ];
    for (fixture, says, because) in cases {
        let draft = export_fixture(fixture, &dir, DType::F32, 0);
        for args in [&["generate", "-i", "x"][..], &["serve", "--port", "0"]] {
            let out = Command::new(env!("CARGO_BIN_EXE_qwen3"))
                .arg(args[0])
                .arg(&model)
                .args(&args[1..])
                .arg("--draft-model")
                .arg(&draft)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains(says) && err.contains(because),
                "{fixture} {args:?}: {err}"
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `qwen3 serve --draft-model`: [`eight_clients_get_plain_answers`].
#[test]
fn served_with_a_draft_model_the_answers_are_plain() {
    let dir = tempdir("speculative", "serve-draft-model");
    let model = export_fixture("tiny-bf16-untied-mha", &dir, DType::Q8, 32);
    let small = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let s = Server::start(
        &model,
        &["--parallel", "4", "--draft-model", small.to_str().unwrap()],
    );
    eight_clients_get_plain_answers(&s);
    drop(s);
    std::fs::remove_dir_all(dir).unwrap();
}
