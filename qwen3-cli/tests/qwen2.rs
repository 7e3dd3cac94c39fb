//! The Qwen2 family through the commands a user runs, as for Qwen3: `export` in every dtype of a
//! sharded bf16 checkpoint, `info` (the architecture and what it implies), `bench`, and greedy
//! `generate` equal to HuggingFace's continuation on the f32 export. (Exactness at every logit:
//! tests/parity.rs; tokenize, chat-template, chat and serve on a Qwen2 checkpoint:
//! tests/post_processor.rs.)

use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::Value;
use std::process::{Command, Output};

const NAME: &str = "tiny-qwen2-bf16-untied-gqa4-sharded";

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

#[test]
fn info_bench_and_generate_on_every_dtype() {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/models")
                .join(NAME)
                .join("reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for (dtype, gs) in [
        (DType::F32, 0),
        (DType::Bf16, 0),
        (DType::Q8, 32),
        (DType::Q4, 32),
    ] {
        let m = export_fixture(NAME, &tempdir("qwen2", &dtype.to_string()), dtype, gs);
        let m = m.to_str().unwrap();
        let info = String::from_utf8(qwen3(&["info", m]).stdout).unwrap();
        assert!(
            info.contains("architecture             Qwen2ForCausalLM"),
            "{info}"
        );
        assert!(info.contains("q/k/v biases, no q/k norms"), "{info}");
        assert!(info.contains("head_dim                 16"), "{info}");
        let o = qwen3(&[
            "bench",
            m,
            "--prompt-tokens",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "--threads",
            "1",
            "--json",
        ]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v["runs"][0]["decode_tok_s"].as_f64().unwrap() > 0.0);
        if dtype == DType::F32 {
            // Greedy from HF's first prompt: HF's continuation, token for token.
            let case = &reference["cases"][0];
            let ids = case["prompt_ids"].to_string();
            let greedy = case["greedy_ids"].as_array().unwrap();
            let n = greedy.len().to_string();
            let o = qwen3(&[
                "generate",
                m,
                "--prompt-ids",
                &ids,
                "-n",
                &n,
                "-t",
                "0",
                "--json",
            ]);
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["tokens"].as_array().unwrap(), greedy);
        }
    }
}
