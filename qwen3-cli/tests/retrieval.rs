//! Retrieval from the terminal, through the binary: `qwen3 embed` on the Qwen3-Embedding-shaped
//! fixture (sentence-transformers' vectors, 1e-4, for texts given with `-i` or as lines on stdin;
//! `--dimensions`; clear errors for a generation model or a dimension out of range), and
//! `qwen3 rerank` on the full-vocabulary fixture (transformers' scores of Qwen3-Reranker's
//! recipe, 1e-4, most relevant first).

use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture, fixture_json, tempdir};
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};

fn reference() -> Value {
    fixture_json("tiny-qwen3-embedding", "reference.json")
}

fn lines(out: &[u8]) -> Vec<Vec<f64>> {
    String::from_utf8_lossy(out)
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["index"], i);
            v["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn embed_gives_sentence_transformers_vectors() {
    let dir = tempdir("pq-embed-cli", "st");
    let m = export_fixture("tiny-qwen3-embedding", &dir, DType::F32, 0);
    let refr = reference();
    let cases = refr["cases"].as_array().unwrap();
    // On the CPU's kernels and on the plain backend's textbook loops: the same vectors.
    let embed = |device: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
        cmd.args([
            "embed",
            m.to_str().unwrap(),
            "--threads",
            "1",
            "--device",
            device,
        ]);
        cmd.arg("--verbose");
        for c in cases {
            cmd.args(["-i", c["text"].as_str().unwrap()]);
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(&format!("device: {device}")), "{err}");
        let got = lines(&o.stdout);
        assert_eq!(got.len(), cases.len());
        for (g, c) in got.iter().zip(cases) {
            let want = c["embedding"].as_array().unwrap();
            for (x, w) in g.iter().zip(want) {
                assert!(
                    (x - w.as_f64().unwrap()).abs() < 1e-4,
                    "{device}: {}",
                    c["text"]
                );
            }
        }
        got
    };
    embed("plain");
    let got = embed("cpu");
    // The same texts as lines on stdin, cut to 8 dimensions.
    let mut child = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["embed", m.to_str().unwrap(), "--dimensions", "8"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let text: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all((text.join("\n") + "\n").as_bytes())
        .unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let cut = lines(&o.stdout);
    for (c, full) in cut.iter().zip(&got) {
        let norm = full[..8].iter().map(|x| x * x).sum::<f64>().sqrt();
        for (x, f) in c.iter().zip(&full[..8]) {
            assert!((x - f / norm).abs() < 1e-6);
        }
    }
    // Clear errors.
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run(&[
        "embed",
        m.to_str().unwrap(),
        "-i",
        "x",
        "--dimensions",
        "65",
    ]);
    assert!(e.contains("--dimensions must be in 1 ..= 64"), "{e}");
    let g = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let e = run(&["embed", g.to_str().unwrap(), "-i", "x"]);
    assert!(e.contains("not an embedding model"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rerank_gives_transformers_scores() {
    let dir = tempdir("pq-rerank-cli", "scores");
    let m = export_fixture("tiny-qwen3-fullvocab", &dir, DType::F32, 0);
    let p = fixture("tiny-qwen3-fullvocab").join("rerank.json");
    let refr: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    // The first case on the plain backend's textbook loops too.
    let cases = refr["cases"].as_array().unwrap();
    let runs = cases
        .iter()
        .map(|c| (c, "cpu"))
        .chain([(&cases[0], "plain")]);
    for (case, device) in runs {
        let want = case["results"].as_array().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
        cmd.args([
            "rerank",
            m.to_str().unwrap(),
            "--threads",
            "1",
            "--device",
            device,
        ]);
        cmd.args(["-q", case["query"].as_str().unwrap(), "--verbose"]);
        if let Some(i) = case["instruction"].as_str() {
            cmd.args(["--instruction", i]);
        }
        for w in want {
            cmd.arg(w["document"].as_str().unwrap());
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(&format!("device: {device}")), "{err}");
        let mut last = f64::INFINITY;
        let out = String::from_utf8(o.stdout).unwrap();
        for line in out.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let i = v["index"].as_u64().unwrap() as usize;
            let score = v["relevance_score"].as_f64().unwrap();
            assert!(
                (score - want[i]["score"].as_f64().unwrap()).abs() < 1e-4,
                "{device}: {line}"
            );
            assert!(score <= last);
            last = score;
        }
        assert_eq!(out.lines().count(), want.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
