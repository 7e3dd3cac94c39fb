//! `--device`: without the `cuda` feature (the default build, which is what `cargo test` runs),
//! asking for a GPU is one clear line and a non-zero exit, before any file is opened.

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
    for dev in ["cuda", "cuda:1"] {
        let (code, err) = run(&["inference", "no-such.bin", "-i", "hi", "--device", dev]);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("built without CUDA support") && err.contains("--features cuda"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn unknown_device_is_refused() {
    let (code, err) = run(&["inference", "no-such.bin", "-i", "hi", "--device", "gpu"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid device \"gpu\""), "{err}");
}
