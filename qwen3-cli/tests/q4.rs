//! q4 files through the commands a user runs: `export`'s choice of what keeps more bits, `info`,
//! `bench` (its ceiling from the q4 bytes), and `serve` answering several concurrent requests
//! with the very text `generate` writes for each prompt (a q4 step of several sequences gives each the bits it gets
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

/// The fullvocab fixture exported as `name` (each test its own files: tests run in parallel).
fn export(name: &str, dtype: &str, extra: &[&str]) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    let out = common::binary_dir().join(format!("{name}.bin"));
    let (src, path) = (src.to_str().unwrap(), out.to_str().unwrap());
    let mut args = vec!["export", src, path, "--dtype", dtype, "--group-size", "32"];
    args.extend(extra);
    qwen3(&args);
    path.to_string()
}

/// Which tensors of a q4 file keep 8 bits is a choice: by default the embedding table (here
/// also the tied classifier) and the sensitive layers' v_proj and down_proj (of this 2-layer
/// model, layer 1's, as llama.cpp's rule picks); `--tables q4` and `--sensitive q4` store them in
/// q4 too: each a smaller file that loads and generates. Either flag with another dtype is
/// refused by name.
#[test]
fn q4_mix_is_a_choice() {
    let q4 = export("mix-default", "q4", &[]);
    let q4t = export("mix-tables-q4", "q4", &["--tables", "q4"]);
    let all = export("mix-all-q4", "q4", &["--tables", "q4", "--sensitive", "q4"]);
    let eight = export("mix-q8", "q4", &["--tables", "q8", "--sensitive", "q8"]);
    let dtypes = |m: &str| -> Vec<(String, String)> {
        let info = qwen3(&["info", m, "--tensors"]);
        info.lines()
            .filter(|l| l.contains("_proj") || l.contains("embed_tokens"))
            .map(|l| {
                // name, shape (with spaces), dtype, group, bytes
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].to_string(), f[f.len() - 3].to_string())
            })
            .collect()
    };
    let stored_as = |m: &str, dtype: &str| -> Vec<String> {
        let mut v: Vec<String> = dtypes(m)
            .into_iter()
            .filter(|(_, d)| d == dtype)
            .map(|(n, _)| n)
            .collect();
        v.sort();
        v
    };
    let sensitive = [
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
    ];
    let finer = [&["model.embed_tokens.weight"][..], &sensitive[..]].concat();
    assert_eq!(stored_as(&q4, "q6"), finer);
    assert!(stored_as(&q4, "q8").is_empty());
    assert_eq!(stored_as(&q4t, "q6"), sensitive);
    assert!(dtypes(&all).iter().all(|(_, d)| d == "q4"));
    assert_eq!(stored_as(&eight, "q8"), finer);
    assert!(stored_as(&eight, "q6").is_empty());
    let info = qwen3(&["info", &q4]);
    assert!(info.contains("3 of 15 matrices in q6"), "{info}");
    let info = qwen3(&["info", &eight]);
    assert!(info.contains("3 of 15 matrices in q8"), "{info}");

    let size = |p: &str| std::fs::metadata(p).unwrap().len();
    assert!(size(&all) < size(&q4t) && size(&q4t) < size(&q4) && size(&q4) < size(&eight));
    for m in [&q4t, &all, &eight] {
        let out = qwen3(&[
            "generate",
            m,
            "-i",
            "Once upon a time",
            "-n",
            "8",
            "-t",
            "0",
            "--json",
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["tokens"].as_array().unwrap().len(), 8, "{out}");
    }

    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    for flag in ["--tables", "--sensitive"] {
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args([
                "export",
                src.to_str().unwrap(),
                "/nonexistent/x.bin",
                flag,
                "q4",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(&format!("{flag} applies to --dtype q4")),
            "{err}"
        );
    }
}

/// A group size the SIMD kernels do not take is said at export, before the work starts: such a
/// file runs on the scalar reference kernels, many times slower. q4's default (32) and a q8
/// multiple of 32 export without it (this model's rows are too short for q8's default of 64).
#[test]
fn export_warns_of_a_group_size_without_simd_kernels() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    let stderr = |name: &str, args: &[&str]| -> String {
        let out = common::binary_dir().join(format!("{name}.bin"));
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(["export", src.to_str().unwrap(), out.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{args:?}: {err}");
        err
    };
    let slow = stderr("gs16-q4", &["--dtype", "q4", "--group-size", "16"]);
    assert!(
        slow.contains("warning: the q4 kernels are vectorized for groups of 32: groups of 16 run on the scalar reference"),
        "{slow}"
    );
    let slow = stderr("gs16-q8", &["--dtype", "q8", "--group-size", "16"]);
    assert!(slow.contains("warning: the q8 kernels"), "{slow}");
    for (name, args) in [
        ("gs-default-q4", &["--dtype", "q4"][..]),
        ("gs32-q8", &["--dtype", "q8", "--group-size", "32"][..]),
    ] {
        let err = stderr(name, args);
        assert!(!err.contains("warning"), "{args:?}: {err}");
    }
}

#[test]
fn info_bench_and_serve_on_a_q4_file() {
    let (q4, q8) = (export("q4", "q4", &[]), export("q8", "q8", &[]));
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
        lines("embed_tokens").iter().all(|l| l.contains("q6")),
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
        // 2 layers of 7 matrices and the tied table; a q4 file keeps the table and layer 1's
        // v_proj and down_proj in q6.
        let want = if m == q4 {
            json!({"q4": 12, "q6": 3})
        } else {
            json!({"q8": 15})
        };
        assert_eq!(v["matrices"], want, "{out}");
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
