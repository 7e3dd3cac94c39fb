//! `qwen3 inference -m generate` end to end through the binary, on a tiny random-weight model
//! file: output format, stop reasons, determinism, and bad input (non-zero exit, one-line error,
//! no panic). Exactness against HuggingFace is in parity.rs.

use qwen3_inference::backend::{KvType, CPU};
use qwen3_inference::format::{DType, GenerationDefaults, ModelConfig, ModelFile};
use qwen3_inference::model::{Model, Session};
use qwen3_inference::sampler::argmax;
use qwen3_test_support::{lossy as text, tempdir};
use std::path::Path;
use std::process::{Command, Output};

/// A q8 model file with random weights: 2 layers, vocab 64, 32 positions, EOS id 0.
fn write_model(path: &Path) {
    let c = ModelConfig {
        architecture: "Qwen3ForCausalLM".into(),
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        vocab_size: 64,
        max_position_embeddings: 32,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        bos_token_id: None,
        eos_token_ids: vec![0],
        generation: GenerationDefaults {
            temperature: Some(0.8),
            top_k: Some(20),
            top_p: Some(0.95),
            ..Default::default()
        },
        dtype: DType::Q8,
        group_size: 16,
        attention_bias: false,
        qk_norm: true,
        rope_scaling: qwen3_inference::format::RopeScaling::None,
        moe: None,
        embedding: None,
        partial_rotary_factor: 1.0,
        attn_output_gate: false,
        linear_attention: None,
        vision: None,
    };
    qwen3_inference::testing::model::write_random_config(path, &c);
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

/// `qwen3 inference <model> <args>`: each test passes only the flags it is about.
fn run_inference(model: &Path, args: &[&str]) -> Output {
    let mut a = vec!["inference", model.to_str().unwrap()];
    a.extend_from_slice(args);
    run(&a)
}

fn ids(stdout: &[u8]) -> Vec<u32> {
    text(stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The greedy continuation computed through the library, one full forward per step.
fn greedy_reference(model: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let file = ModelFile::open(model).unwrap();
    let m = Model::load(&file).unwrap();
    let mut seq = prompt.to_vec();
    let mut out = vec![];
    for _ in 0..n {
        let mut s = Session::new(CPU, &m, 32, KvType::F32).unwrap();
        let next = argmax(s.forward(&seq).unwrap()) as u32;
        if next == 0 {
            break;
        }
        out.push(next);
        seq.push(next);
    }
    out
}

#[test]
fn greedy_generation_streams_ids_and_a_summary() {
    let d = tempdir("pq-inference", "greedy");
    let m = d.join("m.bin");
    write_model(&m);
    let o = run_inference(
        &m,
        &[
            "-m",
            "generate",
            "--prompt-ids",
            "[5, 9, 13]",
            "-n",
            "6",
            "-t",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let got = ids(&o.stdout);
    let want = greedy_reference(&m, &[5, 9, 13], 6);
    assert_eq!(got, want);
    let err = text(&o.stderr);
    if want.len() == 6 {
        assert!(err.contains("[stopped: reached -n 6]"), "{err}");
    } else {
        assert!(err.contains("[stopped: end-of-sequence token 0]"), "{err}");
    }
    assert!(err.contains("prompt tokens 3, generated tokens"), "{err}");
    assert!(
        err.contains("prefill") && err.contains("decode") && err.contains("time to first token")
    );

    // --echo prints the prompt first; --verbose reports the KV cache.
    let o = run_inference(
        &m,
        &[
            "--prompt-ids",
            "[5,9,13]",
            "-n",
            "2",
            "-t",
            "0",
            "--echo",
            "--verbose",
            "-c",
            "16",
        ],
    );
    assert!(o.status.success());
    assert_eq!(&ids(&o.stdout)[..3], &[5, 9, 13]);
    // 2 layers * 2 kv heads * 16 dims * 16 positions * (k + v) * 4 bytes = 8 KiB.
    assert!(
        text(&o.stderr).contains("KV cache up to 0.0 MiB"),
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn stop_reasons_and_n_zero() {
    let d = tempdir("pq-inference", "stops");
    let m = d.join("m.bin");
    write_model(&m);
    // Context of 5 with a 3-token prompt: at most 3 sampled tokens (2 fed, the last not).
    let o = run_inference(
        &m,
        &[
            "--prompt-ids",
            "[5,9,13]",
            "-n",
            "50",
            "-t",
            "0",
            "-c",
            "5",
            "--top-k",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("[stopped: context full (5 positions") || err.contains("end-of-sequence"),
        "{err}"
    );
    // -n 0: prefill only, nothing generated.
    let o = run_inference(&m, &["--prompt-ids", "[5,9,13]", "-n", "0"]);
    assert!(o.status.success());
    assert!(ids(&o.stdout).is_empty());
    assert!(text(&o.stderr).contains("generated tokens 0"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_seed_makes_sampling_reproducible() {
    let d = tempdir("pq-inference", "seed");
    let m = d.join("m.bin");
    write_model(&m);
    let go = |seed: &str| {
        let o = run_inference(
            &m,
            &[
                "--prompt-ids",
                "[7]",
                "-n",
                "20",
                "-t",
                "1.5",
                "--top-k",
                "0",
                "--seed",
                seed,
            ],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        ids(&o.stdout)
    };
    assert_eq!(go("0"), go("0"));
    assert_eq!(go("18446744073709551615"), go("18446744073709551615"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Each output row is computed whole by one thread, so the thread count cannot change a bit of
/// the logits: the sampled ids are the same on 1, 2 and 3 threads. `--threads 0` is an error.
#[test]
fn the_thread_count_does_not_change_the_output() {
    let d = tempdir("pq-inference", "threads");
    let m = d.join("m.bin");
    write_model(&m);
    let go = |seed: &str, threads: &str| {
        let args = ["--prompt-ids", "[7, 3, 9]", "-n", "20", "-t", "1.0"];
        let o = run_inference(
            &m,
            &[&args[..], &["--seed", seed, "--threads", threads]].concat(),
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        ids(&o.stdout)
    };
    // Several seeds, as a sampled end-of-sequence may end a sequence early.
    let mut total = 0;
    for seed in ["1", "2", "3", "4", "5", "6", "7", "8"] {
        let one = go(seed, "1");
        total += one.len();
        assert_eq!(go(seed, "2"), one, "seed {seed}");
        assert_eq!(go(seed, "3"), one, "seed {seed}");
    }
    assert!(total >= 20, "only {total} tokens sampled");
    let o = run_inference(&m, &["--prompt-ids", "[7]", "--threads", "0"]);
    assert!(!o.status.success());
    assert_eq!(
        text(&o.stderr).trim(),
        "error: --threads must be at least 1"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_input_is_a_one_line_error() {
    let d = tempdir("pq-inference", "bad");
    let m = d.join("m.bin");
    write_model(&m);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--prompt-ids", "[1,2,3,4,5,6]", "-c", "4"],
            "context holds 4",
        ),
        (
            &["--prompt-ids", "[1]", "-c", "33"],
            "larger than the model supports (32",
        ),
        (
            &["--prompt-ids", "[1]", "-c", "0"],
            "holds at least one position",
        ),
        (&["--prompt-ids", "[1]", "-t", "-1"], "temperature"),
        (&["--prompt-ids", "[1]", "--top-p", "1.5"], "top-p"),
        (&["--prompt-ids", "[1]", "--top-p", "0"], "top-p"),
        (&["--prompt-ids", "[1]", "--min-p", "2"], "min-p"),
        (
            &["--prompt-ids", "[1]", "--repeat-penalty", "0"],
            "repetition penalty",
        ),
        (&["--prompt-ids", "[1, 64]"], "outside the vocabulary"),
        (&["--prompt-ids", "1,2"], "not a JSON array"),
        (&["--prompt-ids", "[]"], "prompt is empty"),
        (
            &["--prompt-ids", "[1]", "-m", "chat"],
            "reads the user's messages from stdin",
        ),
        (&[], "no prompt"),
    ];
    for (extra, want) in cases {
        let o = run_inference(&m, extra);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{extra:?} succeeded");
        assert!(err.contains(want), "{extra:?}: {err:?} lacks {want:?}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
    }
    let o = run_inference(&d.join("missing.bin"), &["--prompt-ids", "[1]"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("missing.bin"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Text in, text out, against HuggingFace: the full-vocabulary fixture (real Qwen3 tokenizer),
/// exported in f32, must print exactly the text transformers' greedy continuation decodes to
/// (`greedy_text` in its reference.json: 24 tokens, none of them EOS).
#[test]
fn text_generation_matches_huggingface() {
    let d = tempdir("pq-inference", "text");
    let m = d.join("fv.bin");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab");
    let o = run(&[
        "export",
        fixture.to_str().unwrap(),
        m.to_str().unwrap(),
        "--dtype",
        "f32",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap())
            .unwrap();
    for case in reference["cases"].as_array().unwrap() {
        let prompt = case["prompt_text"].as_str().unwrap();
        let want = case["greedy_text"].as_str().unwrap();
        let o = run_inference(&m, &["-i", prompt, "-n", "24", "-t", "0"]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert_eq!(text(&o.stdout), format!("{want}\n"), "prompt {prompt:?}");
        assert!(text(&o.stderr).contains("[stopped: reached -n 24]"));
        // --echo puts the prompt text first.
        let o = run_inference(&m, &["-i", prompt, "-n", "24", "-t", "0", "--echo"]);
        assert_eq!(text(&o.stdout), format!("{prompt}{want}\n"));
    }
    // A model without its tokenizer file: a text prompt is a clear error naming the file.
    std::fs::remove_file(d.join("fv.tokenizer.bin")).unwrap();
    let o = run_inference(&m, &["-i", "Hello"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("fv.tokenizer.bin"),
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_dir_all(&d).unwrap();
}
