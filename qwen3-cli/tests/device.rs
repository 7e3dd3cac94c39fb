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

#[test]
fn unknown_device_is_refused() {
    let (code, err) = run(&["inference", "no-such.bin", "-i", "hi", "--device", "gpu"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid device \"gpu\""), "{err}");
}
