//! End-to-end tests of `qwen3 tokenize`, with the real Qwen3 tokenizer exported from
//! fixtures/tokenizer/ into a temp dir. Expected ids come from HF `tokenizers`
//! (fixtures/tokenizer/tokenizer-cases-dev.json).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer")
}

/// A temp dir holding `m.tokenizer.bin` (no model file: tokenize only reads the companion).
fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pq-cli-tokenize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        qwen3_export::hf::tokenizer_json::export_tokenizer(
            &fixtures(),
            &dir.join("m.tokenizer.bin"),
            151936,
        )
        .unwrap();
        dir
    })
}

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

fn model() -> String {
    model_dir().join("m.bin").display().to_string()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn text_argument_prints_hf_ids() {
    // dev-000 "Hello world" -> [9707, 1879]
    let o = qwen3(&["tokenize", &model(), "Hello world"]);
    assert_eq!(stdout(&o), "[9707,1879]\n");
}

#[test]
fn every_dev_case_through_a_file() {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer-cases-dev.json")).unwrap(),
    )
    .unwrap();
    let dir = model_dir();
    for (i, c) in cases["cases"].as_array().unwrap().iter().enumerate() {
        let path = dir.join(format!("case-{i}.txt"));
        std::fs::write(&path, c["text"].as_str().unwrap()).unwrap();
        let o = qwen3(&["tokenize", &model(), "-f", path.to_str().unwrap()]);
        let got: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(got, c["ids"], "{}", c["id"]);
    }
}

#[test]
fn show_pieces_prints_ids_and_escaped_text() {
    // HF: "<|im_start|>user\nHi 🦜" -> [151644, 872, 198, 13048, 11162, 99, 250], tokens
    // ['<|im_start|>', 'user', 'Ċ', 'Hi', 'ĠðŁ', '¦', 'ľ']: the parrot's 4 bytes are split over
    // three tokens, shown as \x bytes.
    let o = qwen3(&[
        "tokenize",
        &model(),
        "--show-pieces",
        "<|im_start|>user\nHi 🦜",
    ]);
    let out = stdout(&o);
    let ids: Vec<u32> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, [151644, 872, 198, 13048, 11162, 99, 250]);
    assert!(out.contains("\"<|im_start|>\"  (special)"), "{out}");
    assert!(out.contains("\"\\n\""), "{out}");
    assert!(out.contains("\" \\xF0\\x9F\""), "{out}");
    assert!(out.contains("\"\\xA6\""), "{out}");
}

#[test]
fn missing_companion_is_a_clear_error() {
    let o = qwen3(&["tokenize", "/nonexistent/x.bin", "hi"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent/x.tokenizer.bin") && err.contains("not found"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn corrupt_tokenizer_file_is_a_clear_error() {
    let dir = model_dir();
    std::fs::write(dir.join("bad.tokenizer.bin"), b"PQWTOKEN\x01\x00").unwrap();
    let bad = dir.join("bad.bin");
    let o = qwen3(&["tokenize", bad.to_str().unwrap(), "hi"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.tokenizer.bin") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn non_utf8_file_is_a_clear_error() {
    let path = model_dir().join("latin1.txt");
    std::fs::write(&path, b"caf\xe9").unwrap();
    let o = qwen3(&["tokenize", &model(), "-f", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("latin1.txt") && err.contains("UTF-8"), "{err}");
}

/// `qwen3 detokenize` gives HF's `decode` of every recorded id list, with and without
/// skip_special_tokens (incomplete UTF-8 as U+FFFD, as HF does).
#[test]
fn detokenize_matches_hf_decode() {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer-cases-dev.json")).unwrap(),
    )
    .unwrap();
    let m = model();
    for c in cases["decode_cases"].as_array().unwrap() {
        let ids = c["ids"].to_string();
        let name = c["name"].as_str().unwrap();
        let got = stdout(&qwen3(&["detokenize", &m, &ids]));
        assert_eq!(got, c["decoded"].as_str().unwrap(), "{name}");
        let got = stdout(&qwen3(&["detokenize", &m, &ids, "--skip-special"]));
        assert_eq!(got, c["decoded_skip_special"].as_str().unwrap(), "{name}");
    }
}

/// What `tokenize` prints, `detokenize` reads back (from a file) to HF's decoding of those ids,
/// for every seventh dev case.
#[test]
fn detokenize_reads_what_tokenize_prints() {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer-cases-dev.json")).unwrap(),
    )
    .unwrap();
    let m = model();
    let dir = model_dir();
    for (i, c) in cases["cases"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .step_by(7)
    {
        let want = c["decoded"].as_str().unwrap();
        let printed = dir.join(format!("ids-{i}.txt"));
        std::fs::write(
            &printed,
            stdout(&qwen3(&["tokenize", &m, "-f", &text_file(i, c)])),
        )
        .unwrap();
        let got = stdout(&qwen3(&["detokenize", &m, "-f", printed.to_str().unwrap()]));
        assert_eq!(got, want, "case {i}");
    }
    let err = qwen3(&["detokenize", &m, "[12, x]"]);
    assert_eq!(err.status.code(), Some(1));
    let err = String::from_utf8_lossy(&err.stderr);
    assert!(err.contains("the ids: \"x\" is not a token id"), "{err}");
    let err = qwen3(&["detokenize", &m, "[151936]"]);
    let err = String::from_utf8_lossy(&err.stderr);
    assert!(err.contains("token id 151936 is out of range"), "{err}");
}

/// Case `i`'s text in a file of its own.
fn text_file(i: usize, c: &serde_json::Value) -> String {
    let path = model_dir().join(format!("text-{i}.txt"));
    std::fs::write(&path, c["text"].as_str().unwrap()).unwrap();
    path.display().to_string()
}
