//! GGUF files through the binary: `qwen3 info` reads one that llama.cpp's own writer made
//! (fixtures/gguf/tiny-header.gguf, scripts/make_gguf_fixtures.py), a damaged one is refused in
//! one line, and the GGUF files of F32, BF16 and Q8_0 tensors that llama.cpp's converter made
//! run as they are, as transformers runs their checkpoints.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/tiny-header.gguf")
}

/// The greedy text `qwen3 inference` generates from `model` (12 tokens of a fixed prompt),
/// checked to have run.
fn greedy_text(model: &Path) -> String {
    let o = qwen3(&[
        "inference",
        model.to_str().unwrap(),
        "-i",
        "The capital of France is",
        "-n",
        "12",
        "-t",
        "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", model.display());
    String::from_utf8(o.stdout).unwrap()
}

/// stderr of a failed run, checked to be one line with no panic.
fn one_line_error(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "succeeded: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    err
}

#[test]
fn info_reads_a_gguf_header() {
    let o = qwen3(&["info", fixture().to_str().unwrap(), "--tensors"]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for want in [
        "GGUF version 3)",
        "architecture             qwen3",
        "name                     tiny header",
        "block_count              2",
        "feed_forward_length      160",
        "rope.freq_base           1000000",
        "tokenizer                gpt2 (pre-tokenizer qwen2), 3 tokens, 1 merges",
        "chat template            {{ messages[0]['content'] }}",
        "tensors                  2: 1 F32 (256 B), 1 Q8_0 (136 B)",
        "run                      not yet",
    ] {
        assert!(s.contains(want), "expected {want:?} in\n{s}");
    }
    let embd = s.lines().find(|l| l.contains("token_embd.weight")).unwrap();
    assert!(
        embd.contains("[64, 2]") && embd.contains("Q8_0") && embd.ends_with("136"),
        "{embd}"
    );
}

/// llama.cpp's converter's GGUF of a tiny checkpoint: read as the model its config.json
/// describes, every tensor found.
#[test]
fn info_reads_a_converted_checkpoint_as_its_model() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/tiny-f32-tied-gqa2-f32.gguf");
    let o = qwen3(&["info", path.to_str().unwrap()]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = "model                    Qwen3ForCausalLM: 2 layers, hidden 64, 4 / 2 heads of 32, every tensor found";
    assert!(s.contains(want), "expected {want:?} in\n{s}");
    // The header-only fixture has no layers' tensors: said, not run.
    let o = qwen3(&["info", fixture().to_str().unwrap()]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(s.contains("model                    not read: "), "{s}");
    // A Qwen3.5's: its multi-token-prediction layer said and left out, every command runs it.
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/tiny-qwen3_5-bf16-q8_0.gguf");
    let o = qwen3(&["info", path.to_str().unwrap()]);
    let s = String::from_utf8(o.stdout).unwrap();
    for want in [
        "model                    Qwen3_5ForCausalLM: 8 layers (and 1 multi-token-prediction \
         layer, left out), hidden 64, 4 / 2 heads of 32, every tensor found",
        "run                      yes",
    ] {
        assert!(s.contains(want), "expected {want:?} in\n{s}");
    }
}

#[test]
fn a_damaged_gguf_is_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("pq-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(fixture()).unwrap();
    // Cut inside the Q8_0 tensor's bytes, and inside the metadata.
    for (cut, want) in [
        // (gguf-py pads the last tensor to the alignment: 24 bytes after its 136.)
        (
            bytes.len() - 30,
            "truncated: token_embd.weight (Q8_0 [64, 2], 136 bytes",
        ),
        (100, "truncated"),
    ] {
        let path = dir.join(format!("cut-{cut}.gguf"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = one_line_error(&qwen3(&["info", path.to_str().unwrap()]));
        assert!(err.contains(want) && err.contains("cut-"), "{cut}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GGUF file that holds no model (the header-only fixture) is refused in one line that says
/// it is a GGUF file, where a model file was expected.
#[test]
fn a_gguf_without_a_model_is_refused_in_one_line() {
    let o = qwen3(&[
        "inference",
        fixture().to_str().unwrap(),
        "-m",
        "generate",
        "-i",
        "hi",
    ]);
    let err = one_line_error(&o);
    assert!(err.contains("GGUF file"), "{err}");
}

/// llama.cpp's converter's GGUFs of three fixtures (Qwen3 f32 and bf16, Qwen2 with its biases)
/// run as they are: text in, text out, transformers' greedy continuation exactly, through the
/// file's own tokenizer; and `qwen3 info` says they run.
#[test]
fn a_gguf_generates_huggingfaces_text() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    for (name, dtype) in [
        ("tiny-f32-tied-gqa2", "f32"),
        ("tiny-bf16-untied-mha", "bf16"),
        ("tiny-qwen2-f32-tied-gqa2", "f32"),
    ] {
        let path = root.join(format!("gguf/{name}-{dtype}.gguf"));
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join(format!("models/{name}/reference.json"))).unwrap(),
        )
        .unwrap();
        let mut checked = 0;
        for case in reference["cases"].as_array().unwrap() {
            let Some(prompt) = case["prompt_text"].as_str() else {
                continue;
            };
            let want = case["greedy_text"].as_str().unwrap();
            let o = qwen3(&[
                "inference",
                path.to_str().unwrap(),
                "-i",
                prompt,
                "-n",
                "24",
                "-t",
                "0",
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{name}: {err}");
            assert_eq!(
                String::from_utf8_lossy(&o.stdout),
                format!("{want}\n"),
                "{name}"
            );
            assert!(err.contains("[stopped: reached -n 24]"), "{name}: {err}");
            checked += 1;
        }
        assert!(checked > 0, "{name}: no case with a text prompt");
        let o = qwen3(&["info", path.to_str().unwrap()]);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            s.contains(&format!(
                "run                      yes, {}:",
                dtype.to_uppercase()
            )),
            "{s}"
        );
    }
}

/// A Q8_0 GGUF (llama.cpp's converter's, `--outtype q8_0`), a Q4_K_M one and a Q4_0 one
/// (llama-quantize's) run as they are: `info` says so, and `inference` generates from a text prompt through the
/// file's own tokenizer. (Their logits against transformers: tests/parity.rs.)
#[test]
fn quantized_ggufs_run() {
    for (name, run) in [
        (
            "tiny-f32-tied-gqa2-q8_0",
            "yes, Q8_0: every command takes this file as it is",
        ),
        // The matrices' types, the most common first (`info` adds, where no vectorized kernel
        // reads them, that they run on the scalar reference).
        (
            "tiny-bf16-tied-k256-q4_k_m",
            "yes, Q4_K + Q6_K: every command takes this file as it is",
        ),
        (
            "tiny-bf16-tied-k256-q5_k_m",
            "yes, Q5_K + Q6_K: every command takes this file as it is",
        ),
        (
            "tiny-bf16-tied-k256-q4_0",
            "yes, Q4_0 + Q6_K: every command takes this file as it is",
        ),
        // The converter's --outtype f16 (ollama's fp16 tags).
        (
            "tiny-f32-tied-gqa2-f16",
            "yes, F16: every command takes this file as it is (its F16 tensors widened to f32 at \
             open: twice their bytes in memory)",
        ),
        // Rows of 64: llama-quantize's fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K.
        (
            "tiny-f32-tied-gqa2-q4_k_m",
            "yes, Q5_0 + Q8_0: every command takes this file as it is",
        ),
    ] {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/gguf/{name}.gguf"));
        let o = qwen3(&["info", path.to_str().unwrap()]);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            s.contains(&format!("run                      {run}")),
            "{s}"
        );
        let o = qwen3(&[
            "inference",
            path.to_str().unwrap(),
            "-i",
            "The capital of France is",
            "-n",
            "8",
            "-t",
            "0",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        assert!(
            err.contains("prompt tokens 8, generated tokens 8"),
            "{name}: {err}"
        );
    }
}

/// A GGUF file split in three parts runs from its first part as the whole file runs (the same
/// greedy text), `info` says how many parts it is, `export` writes it as one model file, and a
/// later part given instead of the first is a one-line error naming the first. (Every tensor's
/// bytes against the whole file's: qwen3-inference's gguf/tests/split.rs.)
#[test]
fn a_split_gguf_runs_from_its_first_part() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    let whole = gguf.join("tiny-f32-tied-gqa2-q8_0.gguf");
    let part = |k: usize| {
        gguf.join(format!(
            "split/tiny-f32-tied-gqa2-q8_0-{k:05}-of-00003.gguf"
        ))
    };
    let want = greedy_text(&whole);
    assert_eq!(greedy_text(&part(1)), want);
    let o = qwen3(&["info", part(1).to_str().unwrap()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("parts                    3 (this is the first"),
        "{s}"
    );
    assert!(
        s.contains("yes, Q8_0: every command takes this file as it is"),
        "{s}"
    );
    let dir = std::env::temp_dir().join(format!("pq-gguf-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("m.bin");
    let o = qwen3(&["export", part(1).to_str().unwrap(), out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(greedy_text(&out), want);
    std::fs::remove_dir_all(&dir).unwrap();
    let err = one_line_error(&qwen3(&["inference", part(2).to_str().unwrap(), "-n", "1"]));
    assert!(
        err.contains("part 2 of a GGUF file split in 3: open its first part")
            && err.contains("-00001-of-00003.gguf"),
        "{err}"
    );
}

/// A model ollama has pulled, by its name (`tiny:q8`): found through ollama's manifest under
/// `OLLAMA_MODELS` and run from its blob as it is; a manifest whose blob is gone is a one-line
/// error that names both.
#[test]
fn a_model_by_its_ollama_name() {
    let root = std::env::temp_dir().join(format!("pq-ollama-{}", std::process::id()));
    let manifests = root.join("manifests/registry.ollama.ai/library/tiny");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    let hex = "5f".repeat(32);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": format!("sha256:{}", "0".repeat(64)), "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template",
             "digest": format!("sha256:{}", "1".repeat(64)), "size": 10},
            {"mediaType": "application/vnd.ollama.image.model",
             "digest": format!("sha256:{hex}"), "size": 171648}
        ]
    });
    std::fs::write(manifests.join("q8"), manifest.to_string()).unwrap();
    let blob = root.join(format!("blobs/sha256-{hex}"));
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/tiny-f32-tied-gqa2-q8_0.gguf"),
        &blob,
    )
    .unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args([
                "inference",
                "tiny:q8",
                "-i",
                "The capital of France is",
                "-n",
                "4",
            ])
            .env("OLLAMA_MODELS", &root)
            .output()
            .unwrap()
    };
    let o = run();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("tiny:q8: ollama's ") && err.contains(&hex),
        "{err}"
    );
    assert!(err.contains("generated tokens 4"), "{err}");
    // `qwen3 list` shows it under its ollama name.
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(["list", "--models-dir"])
        .arg(root.join("no-exports"))
        .env("OLLAMA_MODELS", &root)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("tiny:q8 ") && l.contains("167.6 KiB") && l.ends_with("ollama")),
        "{out}"
    );
    std::fs::remove_file(&blob).unwrap();
    let err = one_line_error(&run());
    assert!(
        err.contains("tiny:q8: ollama's manifest names") && err.contains("which is missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// `qwen3 export FILE.gguf out.bin`: a K-quant mix (Q4_K + Q6_K, format version 9), a Q4_0 one
/// and Qwen3.5's Q8_0 (tiled value heads, gathered `attn_q` rows: version 9) become model files
/// that generate what the GGUF generates, token for token, with the GGUF's tokenizer and chat
/// template beside them; a requantizing flag is refused in one line. (Every tensor's bytes and
/// the logits against transformers: tests/parity/gguf.rs.)
#[test]
fn a_gguf_exports_as_it_runs() {
    let dir = std::env::temp_dir().join(format!("pq-gguf-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, version, types) in [
        (
            "tiny-bf16-tied-k256-q4_k_m",
            9,
            "Q4_K its blocks as they are",
        ),
        (
            "tiny-bf16-tied-k256-q4_0",
            9,
            "Q4_0 q4 in groups of 32 (exact)",
        ),
        (
            "tiny-qwen3_5-bf16-q8_0",
            9,
            "Q8_0 q8 in groups of 32 (exact)",
        ),
    ] {
        let gguf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/gguf/{name}.gguf"));
        let out = dir.join(format!("{name}.bin"));
        let o = qwen3(&["export", gguf.to_str().unwrap(), out.to_str().unwrap()]);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            s.contains(&format!("format version {version}")),
            "{name}: {s}"
        );
        assert!(
            s.contains("lossless, as the GGUF runs: ") && s.contains(types),
            "{name}: {s}"
        );
        assert!(
            s.contains("tokens from the GGUF's tokenizer.ggml.*"),
            "{name}: {s}"
        );
        assert_eq!(greedy_text(&out), greedy_text(&gguf), "{name}");
        // The chat template came along: a chat turn renders through it.
        let chat = |model: &Path| {
            let o = qwen3(&[
                "inference",
                model.to_str().unwrap(),
                "--chat",
                "-i",
                "Hi",
                "-n",
                "4",
                "-t",
                "0",
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{name}: {err}");
            assert!(err.contains("prompt tokens 12,"), "{name}: {err}");
            o.stdout
        };
        assert_eq!(chat(&out), chat(&gguf), "{name}");
    }
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf/tiny-bf16-tied-k256-q4_k_m.gguf");
    let out = dir.join("requantized.bin");
    let o = qwen3(&[
        "export",
        gguf.to_str().unwrap(),
        out.to_str().unwrap(),
        "--dtype",
        "q4",
    ]);
    let err = one_line_error(&o);
    assert!(
        err.contains("--dtype: a GGUF file is exported as it is"),
        "{err}"
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
