//! `qwen3 bench` end to end through the binary, on a tiny fixture exported as q8: the JSON report
//! has every field it documents (docs/benchmarks.md, "Measuring"), its byte count is the model file's tensors plus the KV
//! cache the decoded positions read, and bad arguments are one-line errors. (The speeds themselves
//! are not checked: timings belong in benchmarks, not tests.)

use qwen3_export::{export, ExportOptions};
use qwen3_inference::format::{DType, ModelFile};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tiny_q8(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pq-bench-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("tiny.bin");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-f32-tied-gqa2");
    let opts = ExportOptions {
        dtype: DType::Q8,
        group_size: 32,
        progress: false,
        ..Default::default()
    };
    export(&src, &out, &opts).unwrap();
    out
}

fn qwen3(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_report_has_every_field() {
    let model = tiny_q8("json");
    let m = model.to_str().unwrap();
    let out = qwen3(&[
        "bench",
        m,
        "--prompt-tokens",
        "5",
        "-n",
        "3",
        "--threads",
        "1,2",
        "-r",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, threads) in runs.iter().zip([1, 2]) {
        assert_eq!(run["threads"], threads);
        assert_eq!(run["device"], "cpu");
        for key in [
            "prefill_tok_s",
            "decode_tok_s",
            "bandwidth_gb_s",
            "ceiling_tok_s",
            "fraction_of_ceiling",
        ] {
            let x = run[key].as_f64().unwrap_or(f64::NAN);
            assert!(x > 0.0 && x.is_finite(), "{key} = {}", run[key]);
        }
    }

    // Shares of 2 MiB pages: a fraction on Linux (where /proc/self/smaps exists), null elsewhere.
    for key in ["weights_in_huge_pages", "bandwidth_buffer_in_huge_pages"] {
        match v[key].as_f64() {
            Some(x) => assert!((0.0..=1.0).contains(&x), "{key} = {x}"),
            None => assert!(v[key].is_null() && !cfg!(target_os = "linux"), "{key}"),
        }
    }

    // Bytes per decoded token: every tensor of the file once, plus the f32 keys and values of
    // positions 0 ..= p for p = 5 .. 5 + 3 (on average 5 + (3 + 1) / 2 = 7 positions).
    let file = ModelFile::open(&model).unwrap();
    let c = file.config();
    let weights: u64 = file.header().tensors.iter().map(|t| t.nbytes).sum();
    let per_position =
        2.0 * (c.num_hidden_layers * c.num_key_value_heads * c.head_dim) as f64 * 4.0;
    assert_eq!(v["weight_bytes"].as_u64(), Some(weights));
    assert_eq!(v["kv_bytes_per_token"].as_f64(), Some(per_position * 7.0));
    assert_eq!(
        v["bytes_per_token"].as_f64(),
        Some(weights as f64 + per_position * 7.0)
    );
    std::fs::remove_dir_all(model.parent().unwrap()).unwrap();
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let model = tiny_q8("bad");
    let m = model.to_str().unwrap();
    for args in [
        vec!["bench", m, "-r", "0"],
        vec!["bench", m, "--threads", "0"],
        vec!["bench", m, "--prompt-tokens", "250", "-n", "10"],
        vec!["bench", "/nonexistent/model.bin"],
        // the textbook loops are not for timing; a default build has no CUDA, and a CUDA build
        // on these machines no driver: both one line (qwen3-cuda's tests cover the GPU itself)
        vec!["bench", m, "--device", "plain"],
        vec!["bench", m, "--device", "cuda"],
        vec!["bench", m, "--device", "tpu"],
    ] {
        let out = qwen3(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(model.parent().unwrap()).unwrap();
}

/// The table never shows a fraction of the memory ceiling above 100%: such a run shows "-" and
/// a line that says why (the bytes fit in the caches).
#[test]
fn table_never_claims_more_than_the_ceiling() {
    let model = tiny_q8("table");
    let m = model.to_str().unwrap();
    let out = qwen3(&["bench", m, "--prompt-tokens", "5", "-n", "3", "-r", "1"]);
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = s
        .lines()
        .filter(|l| l.contains("tok/s") && l.contains("GB/s"))
        .collect();
    assert!(!rows.is_empty(), "{s}");
    for row in &rows {
        let last = row.split_whitespace().last().unwrap();
        match last.strip_suffix('%') {
            Some(p) => assert!(p.parse::<f64>().unwrap() <= 100.0, "{row}"),
            None => {
                assert_eq!(last, "-", "{row}");
                assert!(s.contains("fit in this machine's caches"), "{s}");
            }
        }
    }
    std::fs::remove_dir_all(model.parent().unwrap()).unwrap();
}

/// `QWEN3_KERNELS` forces a kernel family, named in the report; one this CPU lacks is a one-line
/// error naming it.
#[test]
fn a_kernel_family_can_be_forced() {
    let model = tiny_q8("kernels");
    let m = model.to_str().unwrap();
    let args = [
        "bench",
        m,
        "--prompt-tokens",
        "5",
        "-n",
        "3",
        "--threads",
        "1",
        "-r",
        "1",
        "--json",
    ];
    let have: Vec<&str> = qwen3_inference::kernels::dot::available()
        .iter()
        .map(|d| d.isa)
        .collect();
    for isa in &have {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(args)
            .env("QWEN3_KERNELS", isa)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["isa"], *isa);
    }
    for missing in ["avx512", "neon", "bogus"] {
        if have.iter().any(|h| h.starts_with(missing)) {
            continue;
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(args)
            .env("QWEN3_KERNELS", missing)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{missing}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("QWEN3_KERNELS={missing}")), "{err}");
    }
    std::fs::remove_dir_all(model.parent().unwrap()).unwrap();
}

/// `--draft-replay` with `--draft-model` (the model itself, so every greedy guess is right):
/// one line per thread count with plain decode and each draft's figures; the replayed and the
/// modelled drafts both make most of the answer (the bench itself checks that the answers equal
/// plain decoding's, and fails if not).
#[test]
fn draft_report_has_both_kinds() {
    let model = tiny_q8("draft");
    let m = model.to_str().unwrap();
    let out = qwen3(&[
        "bench",
        m,
        "--prompt-tokens",
        "5",
        "-n",
        "12",
        "--threads",
        "1",
        "-r",
        "1",
        "--draft-replay",
        "2,4",
        "--draft-model",
        m,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = &v["draft_replay"][0];
    assert!(run["plain_decode_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    let drafts = run["drafts"].as_array().unwrap();
    let kinds: Vec<_> = drafts
        .iter()
        .map(|d| {
            (
                d["draft"].as_str().unwrap(),
                d["draft_max"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("replay", 2), ("replay", 4), ("model", 2), ("model", 4)]
    );
    for d in drafts {
        assert!(d["tokens_from_drafts"].as_f64().unwrap() > 0.5, "{d}");
    }
    std::fs::remove_dir_all(model.parent().unwrap()).unwrap();
}
