//! `--device`: without the `cuda` feature (the default build, which is what `cargo test` runs),
//! asking for a GPU is one clear line and a non-zero exit, before any file is opened; with the
//! feature on a machine without a driver (`cargo test -p qwen3-cli --features cuda`), too.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn cuda_without_the_feature_is_one_line() {
    // Both modes take the same path to the device (generate and chat are generic over it).
    let modes: [&[&str]; 2] = [&["-m", "generate", "-i", "hi"], &["-m", "chat"]];
    for dev in ["cuda", "cuda:1"] {
        for mode in modes {
            let mut args = vec!["inference", "no-such.bin", "--device", dev];
            args.extend_from_slice(mode);
            let (code, err) = run(&args);
            assert_eq!(code, Some(1), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            if cfg!(feature = "cuda") {
                // Built with CUDA: the machine's driver, device or NVRTC is missing, or, with a
                // GPU, the model file is.
                assert!(
                    [
                        "no CUDA driver found",
                        "no CUDA device",
                        "libnvrtc",
                        "no-such.bin"
                    ]
                    .iter()
                    .any(|m| err.contains(m)),
                    "{err}"
                );
            } else {
                assert!(
                    err.contains("built without CUDA support") && err.contains("--features cuda"),
                    "{err}"
                );
            }
        }
    }
}

/// The other commands that run a model read `--device` the same way, before the model file.
#[test]
fn every_command_refuses_cuda_without_the_feature_in_one_line() {
    if cfg!(feature = "cuda") {
        return; // the inference test above covers a CUDA build without a driver
    }
    let commands: [&[&str]; 3] = [
        &["embed", "no-such.bin", "-i", "x"],
        &["rerank", "no-such.bin", "-q", "q", "a document"],
        &["perplexity", "no-such.bin", "-f", "no-such.txt"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.extend(["--device", "cuda"]);
        let (code, err) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("built without CUDA support"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn unknown_device_is_refused() {
    let (code, err) = run(&["inference", "no-such.bin", "-i", "hi", "--device", "gpu"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid device \"gpu\""), "{err}");
}

/// `--device plain` (the textbook loops) gives HuggingFace's greedy continuation on f32 exports
/// of the fixtures (`reference.json`, transformers in float32), as the fast CPU backend does.
#[test]
fn plain_device_is_exact_against_huggingface() {
    use qwen3_inference::format::DType;
    use qwen3_test_support::{export_fixture, tempdir};
    for name in [
        "tiny-f32-tied-gqa2",
        "tiny-qwen2-bf16-untied-gqa4-sharded",
        "tiny-qwen3-fullvocab",
    ] {
        let dir = tempdir("pq-plain", name);
        let m = export_fixture(name, &dir, DType::F32, 0);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/models")
            .join(name)
            .join("reference.json");
        let refr: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let case = &refr["cases"][0];
        let eos: Vec<u64> = serde_json::from_value(refr["eos_token_ids"].clone()).unwrap();
        let greedy: Vec<u64> = serde_json::from_value(case["greedy_ids"].clone()).unwrap();
        let ids = case["prompt_ids"].to_string();
        let n = greedy.len().to_string();
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args([
                "generate",
                m.to_str().unwrap(),
                "--prompt-ids",
                &ids,
                "-t",
                "0",
            ])
            .args(["-n", &n, "--device", "plain", "--verbose"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("device: plain"), "{err}");
        let got: Vec<u64> = String::from_utf8(o.stdout)
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        // An end-of-sequence id ends the answer early where HF's continuation reaches one.
        let want: Vec<u64> = greedy
            .iter()
            .copied()
            .take_while(|id| !eos.contains(id))
            .collect();
        assert_eq!(got, want, "{name}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
