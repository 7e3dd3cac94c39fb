//! q4 files through the commands a user runs: `info` (q4 layers, q8 tables), `bench` (its ceiling
//! from the q4 bytes), and `serve` answering several concurrent requests with the very text
//! `generate` writes for each prompt (a q4 step of several sequences gives each the bits it gets
//! alone). Accuracy against f32: tests/perplexity.rs's command, docs/quantization.md's table.

mod common;

use common::{text, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn qwen3(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "qwen3 {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn export(dtype: &str) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    let out = common::binary_dir().join(format!("m-{dtype}.bin"));
    let (src, path) = (src.to_str().unwrap(), out.to_str().unwrap());
    qwen3(&["export", src, path, "--dtype", dtype, "--group-size", "32"]);
    path.to_string()
}

#[test]
fn info_bench_and_serve_on_a_q4_file() {
    let (q4, q8) = (export("q4"), export("q8"));
    let info = qwen3(&["info", &q4, "--tensors"]);
    assert!(info.contains("q4"), "{info}");
    let lines = |name: &str| -> Vec<String> {
        info.lines()
            .filter(|l| l.contains(name))
            .map(str::to_string)
            .collect()
    };
    assert!(lines("q_proj").iter().all(|l| l.contains("q4")), "{info}");
    assert!(
        lines("embed_tokens").iter().all(|l| l.contains("q8")),
        "{info}"
    );

    // The bench's ceiling counts the bytes a token reads: fewer for q4 than for q8.
    let bytes = |m: &str| {
        let out = qwen3(&[
            "bench",
            m,
            "--prompt-tokens",
            "4",
            "-n",
            "2",
            "-r",
            "1",
            "--threads",
            "1",
            "--json",
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["dtype"], if m == q4 { "q4" } else { "q8" });
        v["bytes_per_token"].as_f64().unwrap()
    };
    let (b4, b8) = (bytes(&q4), bytes(&q8));
    assert!(b4 < b8, "q4 {b4} bytes a token, q8 {b8}");

    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "1, 2, 3,",
        "def main():",
    ];
    let want: Vec<String> = prompts
        .iter()
        .map(|p| {
            let out = qwen3(&["generate", &q4, "-i", p, "-n", "16", "-t", "0", "--json"]);
            let v: Value = serde_json::from_str(&out).unwrap();
            v["text"].as_str().unwrap().to_string()
        })
        .collect();
    let s = Server::start(Path::new(&q4), &["--parallel", "4"]);
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                scope.spawn(move || {
                    let req = json!({"prompt": p, "max_tokens": 16, "temperature": 0});
                    let r = s.post("/v1/completions", &req);
                    assert_eq!(r.status, 200, "{}", r.body);
                    text(&r.json())
                })
            })
            .collect();
        for ((h, w), p) in handles.into_iter().zip(&want).zip(prompts) {
            assert_eq!(&h.join().unwrap(), w, "prompt {p:?}");
        }
    });
}
