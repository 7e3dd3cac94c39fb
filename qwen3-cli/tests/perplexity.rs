//! `qwen3 perplexity` against HuggingFace: on tiny f32 fixtures (a Qwen3 and a Qwen3.5 MoE
//! hybrid), the perplexity of a text and, for each one's bf16 export against its f32 one, the
//! mean KL divergence and the top-1 agreement, as transformers computes them
//! (scripts/perplexity_reference.py wrote fixtures/text/perplexity-reference*.json).

use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

/// The number after the last `key` on the line starting with `line`.
fn number(out: &str, line: &str, key: &str) -> f64 {
    let l = out
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no line {line:?} in\n{out}"));
    let rest = &l[l
        .rfind(key)
        .unwrap_or_else(|| panic!("no {key:?} in {l:?}"))
        + key.len()..];
    let word = rest.split_whitespace().next().unwrap();
    word.trim_start_matches('(')
        .trim_end_matches(')')
        .parse()
        .unwrap()
}

#[test]
fn perplexity_and_kl_divergence_match_huggingface() {
    matches_huggingface("perplexity-reference.json");
}

/// A hybrid (Qwen3.5's MoE fixture: Gated DeltaNets beside attention, float32 weights): every
/// chunk starts from an empty cache and a zero recurrent state, as transformers runs each one
/// alone, and its bf16 export against the f32 one gives HF's divergence.
#[test]
fn a_hybrid_scores_each_chunk_from_a_fresh_state() {
    matches_huggingface("perplexity-reference-qwen3_5moe.json");
}

/// The perplexity, and the KL divergence of the bf16 export from the f32 one, against
/// `fixtures/text/<file>` (scripts/perplexity_reference.py).
fn matches_huggingface(file: &str) {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/text").join(file)).unwrap(),
    )
    .unwrap();
    let name = reference["model"].as_str().unwrap();
    let dir = tempdir("qwen3-perplexity", name);
    let f32 = export_fixture(name, &dir, DType::F32, 0);
    let bf16 = export_fixture(name, &dir, DType::Bf16, 0);
    let text = root().join(reference["text"].as_str().unwrap());
    let (ctx, chunks) = (
        reference["ctx"].to_string(),
        reference["chunks"].to_string(),
    );
    let args = |model: &Path, base: Option<&Path>| {
        let mut a = vec![
            model.to_str().unwrap().to_string(),
            "-f".into(),
            text.to_str().unwrap().into(),
            "--ctx".into(),
            ctx.clone(),
            "--chunks".into(),
            chunks.clone(),
        ];
        if let Some(b) = base {
            a.extend(["--base".into(), b.to_str().unwrap().into()]);
        }
        a
    };
    let run = |a: Vec<String>| {
        let mut all = vec!["perplexity".to_string()];
        all.extend(a);
        let o = qwen3(&all.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };

    // The f32 model alone: HF's perplexity, over the same tokens and positions.
    let out = run(args(&f32, None));
    let want = reference["perplexity_f32"].as_f64().unwrap();
    let got = number(&out, "perplexity", "perplexity");
    assert!(
        (got / want - 1.0).abs() < 1e-5,
        "perplexity {got} vs HF {want}"
    );
    let positions = reference["positions"].as_u64().unwrap();
    assert!(out.contains(&format!("{positions} positions")), "{out}");

    // bf16 against f32: HF's KL divergence (bf16 rounding moves logits by ~1e-3, so the
    // divergence is ~1e-4; the two implementations' f32 summation orders move it by far less)
    // and the same count of agreeing most likely tokens.
    let out = run(args(&bf16, Some(&f32)));
    let r = &reference["bf16_vs_f32"];
    let (want_kl, want_same) = (
        r["kl_mean"].as_f64().unwrap(),
        r["top1_same"].as_u64().unwrap(),
    );
    let kl = number(&out, "KL(base || model)", "mean");
    assert!((kl / want_kl - 1.0).abs() < 0.02, "KL {kl} vs HF {want_kl}");
    let same = number(&out, "top-1 agreement", "(");
    assert_eq!(same as u64, want_same, "{out}");
    let base_ppl = number(&out, "base", "perplexity");
    assert!((base_ppl / want - 1.0).abs() < 1e-5, "{out}");

    // A model against itself: no divergence at all, on the CPU's kernels and on the plain
    // backend's textbook loops (both models loaded by the one path every command takes), where
    // the perplexity is HF's too.
    for device in ["cpu", "plain"] {
        let mut a = vec!["perplexity".to_string()];
        a.extend(args(&f32, Some(&f32)));
        a.extend(["--device".into(), device.into(), "--verbose".into()]);
        let o = qwen3(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(&format!("device: {device}")), "{err}");
        let out = String::from_utf8(o.stdout).unwrap();
        assert_eq!(number(&out, "KL(base || model)", "max"), 0.0, "{out}");
        assert_eq!(number(&out, "top-1 agreement", "(") as u64, positions);
        let got = number(&out, "perplexity", "perplexity");
        assert!(
            (got / want - 1.0).abs() < 1e-5,
            "{device}: {got} vs HF {want}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A text shorter than one chunk, and a base that is another model, are one-line errors.
#[test]
fn bad_inputs_are_named() {
    let dir = tempdir("qwen3-perplexity", "errors");
    let a = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let b = export_fixture("tiny-bf16-untied-mha", &dir, DType::F32, 0);
    let short = dir.join("short.txt");
    std::fs::write(&short, "a few words").unwrap();
    let o = qwen3(&[
        "perplexity",
        a.to_str().unwrap(),
        "-f",
        short.to_str().unwrap(),
        "--ctx",
        "32",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("fewer than one chunk"),
        "{err}"
    );
    let text = root().join("fixtures/text/eval.md");
    let o = qwen3(&[
        "perplexity",
        a.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "--ctx",
        "32",
        "--base",
        b.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("not the same model"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A mixture of experts against a base of itself re-routes nothing; its q8 export, whose
/// activation rounding moves router scores across near ties, re-routes some choices, counted and
/// printed (the f32 file's and the q8 file's routing are recorded on the same tokens).
#[test]
fn rerouted_experts_are_counted() {
    let dir = tempdir("qwen3-perplexity", "moe");
    let f32 = export_fixture("tiny-qwen3moe-bf16-tied", &dir, DType::F32, 0);
    let q8 = export_fixture("tiny-qwen3moe-bf16-tied", &dir, DType::Q8, 32);
    let text = root().join("fixtures/text/eval.md");
    let run = |model: &Path| {
        let o = qwen3(&[
            "perplexity",
            model.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
            "--base",
            f32.to_str().unwrap(),
            "--ctx",
            "64",
            "--chunks",
            "8",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let same = run(&f32);
    // 8 chunks x 64 positions x 2 sparse layers x top 2
    assert!(
        same.contains("experts re-routed  0.000 % (0 of 2048 choices"),
        "{same}"
    );
    let quantized = run(&q8);
    let share = number(&quantized, "experts re-routed", "re-routed");
    assert!(share > 0.0 && share < 20.0, "{quantized}");
    std::fs::remove_dir_all(dir).unwrap();
}
