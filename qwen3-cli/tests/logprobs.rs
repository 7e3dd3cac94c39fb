//! Log-probabilities against HuggingFace, through the CLI (`generate --logprobs K`): on f32
//! exports of the fixtures, every value within 1e-4 of `torch.log_softmax` of transformers'
//! float32 logits (fixtures/models/*/logprobs.json, written by scripts/logprobs_reference.py).
//! The server's side (`/v1/completions` `logprobs: K`, `/v1/chat/completions` `logprobs: true,
//! top_logprobs: K`) is in qwen3-server/tests/logprobs.rs, against the same files.

use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture_json, tempdir};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

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

/// `(token, logprob, [(id, logprob)])` of one step, checked against HF's step: the chosen token
/// and its value, and the alternatives rank by rank (ids may swap where HF's values tie within
/// the tolerance).
fn check_step(what: &str, got: (u32, f64, Vec<(u32, f64)>), want: &Value) {
    let (token, lp, top) = got;
    assert_eq!(
        token as u64,
        want["token"].as_u64().unwrap(),
        "{what}: token"
    );
    let want_lp = want["logprob"].as_f64().unwrap();
    assert!(
        (lp - want_lp).abs() < TOL,
        "{what}: logprob {lp} vs HF {want_lp}"
    );
    let want_top: Vec<(u64, f64)> = want["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(top.len(), want_top.len(), "{what}: alternatives");
    for (r, (&(id, v), &(wid, wv))) in top.iter().zip(&want_top).enumerate() {
        assert!((v - wv).abs() < TOL, "{what}: rank {r}: {v} vs HF {wv}");
        let tied = want_top
            .iter()
            .any(|&(other, ov)| other != wid && (ov - wv).abs() < TOL);
        if !tied {
            assert_eq!(id as u64, wid, "{what}: rank {r}");
        }
    }
}

#[test]
fn cli_logprobs_equal_hf() {
    for name in ["tiny-qwen3-fullvocab", "tiny-f32-tied-gqa2"] {
        let refr = reference(name);
        let m = f32_model(name, "cli");
        for (c, case) in refr["cases"].as_array().unwrap().iter().enumerate() {
            let steps = case["steps"].as_array().unwrap();
            let ids = case["prompt_ids"].to_string();
            let n = steps.len().to_string();
            let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
                .args([
                    "generate",
                    m.to_str().unwrap(),
                    "--prompt-ids",
                    &ids,
                    "-t",
                    "0",
                ])
                .args(["-n", &n, "--logprobs", "5"])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let lines: Vec<Value> = String::from_utf8(o.stdout)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            // As many lines as tokens (EOS, if sampled, is not a token of the answer).
            assert!(lines.len() <= steps.len() && !lines.is_empty());
            for (k, (line, want)) in lines.iter().zip(steps).enumerate() {
                let top = line["top"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        (
                            t["token"].as_u64().unwrap() as u32,
                            t["logprob"].as_f64().unwrap(),
                        )
                    })
                    .collect();
                let got = (
                    line["token"].as_u64().unwrap() as u32,
                    line["logprob"].as_f64().unwrap(),
                    top,
                );
                check_step(&format!("{name} case {c} step {k}"), got, want);
            }
        }
    }
}
