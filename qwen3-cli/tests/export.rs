//! `qwen3 export` and `qwen3 info` on bad input, end to end through the binary: every case must
//! give a non-zero exit, a one-line error naming the file and the problem, no panic, and no
//! output file left behind. (Successful exports of the HF fixtures are tested in parity.rs and
//! export_fixtures.rs.)

use qwen3_test_support::tempdir;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn qwen3() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
}

fn config() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 128, "max_position_embeddings": 256, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "eos_token_id": 2,
        "torch_dtype": "float32"
    })
}

/// Names and shapes of the tensors of `config()`, as HF names them.
fn tensor_shapes() -> Vec<(String, Vec<usize>)> {
    let p = "model.layers.0";
    vec![
        ("model.embed_tokens.weight".into(), vec![128, 64]),
        (format!("{p}.input_layernorm.weight"), vec![64]),
        (format!("{p}.self_attn.q_proj.weight"), vec![128, 64]),
        (format!("{p}.self_attn.k_proj.weight"), vec![64, 64]),
        (format!("{p}.self_attn.v_proj.weight"), vec![64, 64]),
        (format!("{p}.self_attn.q_norm.weight"), vec![32]),
        (format!("{p}.self_attn.k_norm.weight"), vec![32]),
        (format!("{p}.self_attn.o_proj.weight"), vec![64, 128]),
        (format!("{p}.post_attention_layernorm.weight"), vec![64]),
        (format!("{p}.mlp.gate_proj.weight"), vec![192, 64]),
        (format!("{p}.mlp.up_proj.weight"), vec![192, 64]),
        (format!("{p}.mlp.down_proj.weight"), vec![64, 192]),
        ("model.norm.weight".into(), vec![64]),
        ("lm_head.weight".into(), vec![128, 64]),
    ]
}

/// Writes `tensors` (f32 values 0.01*i, or the dtype given) as a safetensors file.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)], dtype: Dtype) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| {
            let n: usize = shape.iter().product();
            match dtype {
                Dtype::F32 => (0..n)
                    .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
                    .collect(),
                Dtype::I32 => (0..n).flat_map(|i| (i as i32).to_le_bytes()).collect(),
                other => panic!("test writes no {other:?}"),
            }
        })
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape), b)| {
            (
                name.clone(),
                TensorView::new(dtype, shape.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A checkpoint directory with `config` and `tensors` in one f32 file.
fn checkpoint(name: &str, config: &Value, tensors: &[(String, Vec<usize>)]) -> PathBuf {
    let d = tempdir("pq-export", name);
    let hf = d.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    write_safetensors(&hf.join("model.safetensors"), tensors, Dtype::F32);
    hf
}

/// Runs `qwen3 args`, expects failure, and returns stderr after checking it is one line with no
/// panic in it.
fn fails(args: &[&str]) -> String {
    let out = qwen3().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} succeeded; stderr {err}");
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
    assert!(err.starts_with("error: "), "{err}");
    err
}

/// Exports `hf` into a fresh `out` directory, expects failure mentioning every string of `want`,
/// and checks that the output directory is left empty.
fn export_fails(hf: &Path, extra: &[&str], want: &[&str]) {
    let out_dir = hf.parent().unwrap().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("m.bin");
    let mut args = vec!["export", hf.to_str().unwrap(), out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let err = fails(&args);
    for w in want {
        assert!(err.contains(w), "expected {w:?} in {err:?}");
    }
    let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn missing_checkpoint_directory() {
    let d = tempdir("pq-export", "missing-dir");
    export_fails(&d.join("nope"), &[], &["nope", "not a directory"]);
}

#[test]
fn missing_config() {
    let hf = checkpoint("missing-config", &config(), &tensor_shapes());
    std::fs::remove_file(hf.join("config.json")).unwrap();
    export_fails(&hf, &[], &["config.json", "cannot read"]);
}

#[test]
fn malformed_config() {
    let hf = checkpoint("bad-json", &config(), &tensor_shapes());
    std::fs::write(hf.join("config.json"), "{\"hidden_size\": 64,").unwrap();
    export_fails(&hf, &[], &["config.json", "malformed JSON"]);
}

#[test]
fn unsupported_config_option() {
    let mut c = config();
    c["rope_scaling"] = json!({"rope_type": "linear", "factor": 4.0});
    let hf = checkpoint("linear-rope", &c, &tensor_shapes());
    export_fails(&hf, &[], &["config.json", "linear", "not supported"]);
}

/// `config()` as a Qwen3-MoE of one sparse layer: 2 experts of width 32, top 1.
fn moe_config() -> Value {
    let mut c = config();
    c["architectures"] = json!(["Qwen3MoeForCausalLM"]);
    c["model_type"] = json!("qwen3_moe");
    c["num_experts"] = json!(2);
    c["num_experts_per_tok"] = json!(1);
    c["moe_intermediate_size"] = json!(32);
    c
}

/// `tensor_shapes()` with the MLP replaced by a router and two experts (the hub's names).
fn moe_tensor_shapes() -> Vec<(String, Vec<usize>)> {
    let mut t = tensor_shapes();
    t.retain(|(n, _)| !n.contains(".mlp."));
    let p = "model.layers.0.mlp";
    t.push((format!("{p}.gate.weight"), vec![2, 64]));
    for e in 0..2 {
        t.push((format!("{p}.experts.{e}.gate_proj.weight"), vec![32, 64]));
        t.push((format!("{p}.experts.{e}.up_proj.weight"), vec![32, 64]));
        t.push((format!("{p}.experts.{e}.down_proj.weight"), vec![64, 32]));
    }
    t
}

/// A Qwen3-MoE checkpoint without one expert's matrix: the error names it.
#[test]
fn missing_expert_tensor() {
    let mut t = moe_tensor_shapes();
    t.retain(|(n, _)| n != "model.layers.0.mlp.experts.1.up_proj.weight");
    let hf = checkpoint("missing-expert", &moe_config(), &t);
    export_fails(
        &hf,
        &["--group-size", "32"],
        &["model.layers.0.mlp.experts.1.up_proj.weight", "missing"],
    );
}

/// Options of other mixture-of-experts families are refused by name, not ignored.
#[test]
fn other_moe_families_are_refused() {
    let mut c = moe_config();
    c["shared_expert_intermediate_size"] = json!(64);
    let hf = checkpoint("shared-expert", &c, &moe_tensor_shapes());
    export_fails(
        &hf,
        &[],
        &["config.json", "shared_expert_intermediate_size"],
    );
}

#[test]
fn missing_tensor() {
    let mut t = tensor_shapes();
    t.retain(|(n, _)| n != "model.layers.0.mlp.up_proj.weight");
    let hf = checkpoint("missing-tensor", &config(), &t);
    export_fails(&hf, &[], &["model.layers.0.mlp.up_proj.weight", "missing"]);
}

#[test]
fn wrong_shape() {
    let mut t = tensor_shapes();
    t[2].1 = vec![64, 64];
    let hf = checkpoint("wrong-shape", &config(), &t);
    export_fails(
        &hf,
        &[],
        &[
            "model.safetensors",
            "q_proj.weight",
            "[64, 64]",
            "[128, 64]",
        ],
    );
}

#[test]
fn unexpected_tensor() {
    let mut t = tensor_shapes();
    t.push(("model.layers.0.self_attn.q_proj.bias".into(), vec![128]));
    let hf = checkpoint("bias", &config(), &t);
    export_fails(&hf, &[], &["q_proj.bias", "unexpected"]);
}

#[test]
fn unsupported_dtype() {
    let hf = checkpoint("i32", &config(), &tensor_shapes());
    write_safetensors(&hf.join("model.safetensors"), &tensor_shapes(), Dtype::I32);
    export_fails(
        &hf,
        &[],
        &["model.safetensors", "I32", "only F32, F16 and BF16"],
    );
}

#[test]
fn truncated_safetensors() {
    let hf = checkpoint("truncated", &config(), &tensor_shapes());
    let p = hf.join("model.safetensors");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    export_fails(
        &hf,
        &[],
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn index_naming_missing_shard() {
    let hf = checkpoint("missing-shard", &config(), &tensor_shapes());
    std::fs::rename(
        hf.join("model.safetensors"),
        hf.join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    let mut map = serde_json::Map::new();
    for (i, (name, _)) in tensor_shapes().iter().enumerate() {
        let shard = if i < 7 { 1 } else { 2 };
        map.insert(
            name.clone(),
            json!(format!("model-0000{shard}-of-00002.safetensors")),
        );
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(hf.join("model.safetensors.index.json"), index.to_string()).unwrap();
    export_fails(
        &hf,
        &[],
        &[
            "model.safetensors.index.json",
            "model-00002-of-00002.safetensors",
            "does not exist",
        ],
    );
}

#[test]
fn bad_group_size_lists_valid_ones() {
    let hf = checkpoint("group", &config(), &tensor_shapes());
    // Row lengths are 64, 128 and 192: their common divisors are the valid sizes.
    export_fails(
        &hf,
        &["--group-size", "128"],
        &[
            "group size 128",
            "valid group sizes: 1, 2, 4, 8, 16, 32, 64",
        ],
    );
    export_fails(&hf, &["--group-size", "0"], &["group size 0"]);
}

#[test]
fn bad_dtype_flag() {
    let hf = checkpoint("dtype-flag", &config(), &tensor_shapes());
    export_fails(
        &hf,
        &["--dtype", "q3"],
        &["--dtype", "q3", "expected q8, q4, bf16 or f32"],
    );
    // q6 is a dtype of tensors inside q4 files (--tables, --sensitive), not of a file.
    export_fails(
        &hf,
        &["--dtype", "q6"],
        &["--dtype", "q6", "expected q8, q4, bf16 or f32"],
    );
}

#[test]
fn output_in_missing_directory() {
    let hf = checkpoint("out-missing", &config(), &tensor_shapes());
    let out = hf.parent().unwrap().join("no-such-dir").join("m.bin");
    let err = fails(&["export", hf.to_str().unwrap(), out.to_str().unwrap()]);
    assert!(
        err.contains("no-such-dir") && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn output_that_is_a_directory_fails_before_any_work() {
    let hf = checkpoint("out-is-dir", &config(), &tensor_shapes());
    let out = hf.parent().unwrap().join("models");
    std::fs::create_dir_all(&out).unwrap();
    let err = fails(&["export", hf.to_str().unwrap(), out.to_str().unwrap()]);
    assert!(err.contains("is a directory"), "{err}");
    assert!(
        err.contains(&format!("{}", out.join("model.bin").display())),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    // Nothing beside it either (no companion files, no temporaries).
    let mut names: Vec<String> = std::fs::read_dir(hf.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["hf", "models"]);
}

#[test]
fn unwritable_output_is_named_as_given() {
    let hf = checkpoint("out-unwritable", &config(), &tensor_shapes());
    // /proc takes no new files, whoever runs the test (root included).
    let err = fails(&["export", hf.to_str().unwrap(), "/proc/m.bin"]);
    assert!(err.contains("/proc/m.bin: cannot write there"), "{err}");
    assert!(!err.contains(".tmp") && !err.contains(".partial"), "{err}");
}

/// The real Qwen3 vocabulary makes the fixture's export take long enough to be interrupted.
fn fullvocab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-fullvocab")
}

/// Ctrl-C (SIGINT, what the terminal sends the foreground process) at several moments of an
/// export: each run either finishes (the three files) or exits 130 leaving no file at all, and
/// at least one run is interrupted.
#[test]
fn interrupted_export_leaves_nothing_behind() {
    let d = tempdir("pq-export", "interrupt");
    let mut interrupted = 0;
    for delay_ms in [20, 60, 120, 200, 350] {
        let out_dir = d.join(format!("out-{delay_ms}"));
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("m.bin");
        let child = qwen3()
            .arg("export")
            .arg(fullvocab())
            .arg(&out)
            .args(["--dtype", "f32"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: kill(2) with a pid we spawned and have not waited for (so not reused).
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        let mut left: Vec<String> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        if o.status.success() {
            assert_eq!(left, ["m.bin", "m.template.json", "m.tokenizer.bin"]);
        } else {
            assert_eq!(o.status.code(), Some(130), "{err}");
            assert!(
                err.contains("interrupted; the partial files were removed"),
                "{err}"
            );
            assert!(left.is_empty(), "left behind after {delay_ms} ms: {left:?}");
            interrupted += 1;
        }
    }
    assert!(
        interrupted > 0,
        "no run was interrupted: the export is too fast for this test"
    );
}

#[test]
fn a_checkpoint_directory_given_as_a_model_file_says_to_export_it() {
    let hf = fullvocab();
    for cmd in ["inference", "info", "bench", "serve"] {
        let err = fails(&[cmd, hf.to_str().unwrap()]);
        assert!(
            err.contains("a HuggingFace checkpoint directory, not a model file"),
            "{cmd}: {err}"
        );
        assert!(
            err.contains(&format!(
                "qwen3 export {} tiny-qwen3-fullvocab.bin",
                hf.display()
            )),
            "{cmd}: {err}"
        );
    }
    let err = fails(&["inference", env!("CARGO_MANIFEST_DIR")]);
    assert!(err.contains("a directory, not a model file"), "{err}");
}

// ---- info (and the loader behind it) on damaged model files ----

/// A valid model file written through the library (export needs tokenizer files this test
/// does not have, so the model file is written directly from the checkpoint).
fn valid_model_file(name: &str) -> PathBuf {
    use qwen3_inference::format::writer::ModelWriter;
    use qwen3_inference::format::{tensor_specs, DType};
    let mut c = qwen3_export::hf::config::parse_config(&config()).unwrap();
    c.dtype = DType::Q8;
    c.group_size = 32;
    let specs = tensor_specs(&c);
    let path = tempdir("pq-export", name).join("m.bin");
    let mut w = ModelWriter::create(&path, &c, specs.clone()).unwrap();
    for s in &specs {
        let n = s.shape.iter().product::<u64>() as usize;
        if s.dtype == DType::F32 {
            w.write_f32(&s.name, &vec![1.0; n]).unwrap();
        } else {
            w.write_q8(&s.name, &vec![1; n], &vec![0.5; n / 32])
                .unwrap();
        }
    }
    w.finish().unwrap();
    path
}

#[test]
fn info_prints_config_and_tensors() {
    let p = valid_model_file("info-ok");
    let out = qwen3()
        .args(["info", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    for want in [
        "Qwen3ForCausalLM",
        "head_dim                 32",
        "rope_theta               1000000",
        "q8 (group size 32)",
        "(missing)",
        "tensors                  14 (--tensors lists them)",
        // 2 (key, value) x 1 layer x 2 KV heads x 32 dims x 4 bytes.
        "keys and values 512 B a position in f32, 256 B in bf16",
        "4 slots x 256 positions",
    ] {
        assert!(s.contains(want), "expected {want:?} in\n{s}");
    }
    // The summary only; the table with --tensors.
    assert!(!s.contains("lm_head.weight"), "{s}");
    assert!(s.lines().count() < 30, "{s}");
    let out = qwen3()
        .args(["info", p.to_str().unwrap(), "--tensors"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    for want in ["model.layers.0.mlp.down_proj.weight", "lm_head.weight"] {
        assert!(s.contains(want), "expected {want:?} in\n{s}");
    }
}

#[test]
fn info_on_damaged_files() {
    let p = valid_model_file("info-bad");
    let good = std::fs::read(&p).unwrap();
    let bad = p.with_file_name("bad.bin");
    let path = bad.to_str().unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(b"NOTQWEN3");
                b
            },
            "wrong magic",
        ),
        (
            {
                // GGUF's magic on our bytes: read as a GGUF file (gguf/mod.rs), which they
                // are not, and refused as one.
                let mut b = good.clone();
                b[..8].copy_from_slice(b"GGUF\x03\0\0\0");
                b
            },
            "bad.bin (GGUF): the tensor count",
        ),
        (
            {
                let mut b = good.clone();
                b[8] = qwen3_inference::format::FORMAT_VERSION as u8 + 1;
                b
            },
            "is newer than this build reads",
        ),
        (good[..good.len() / 2].to_vec(), "truncated"),
        (good[..5].to_vec(), "shorter than its magic"),
        (vec![], "shorter than its magic"),
    ];
    // The directory's first entry (model.embed_tokens.weight) pointing past the end of the file:
    // find its (offset, nbytes) pair in the header and move the offset out.
    let h = qwen3_inference::format::reader::Header::parse(&good).unwrap();
    let t = &h.tensors[0];
    let needle: Vec<u8> = [t.offset.to_le_bytes(), t.nbytes.to_le_bytes()].concat();
    let at = good
        .windows(16)
        .position(|w| w == needle.as_slice())
        .unwrap();
    let mut outside = good.clone();
    outside[at..at + 8]
        .copy_from_slice(&((good.len() as u64).div_ceil(64) * 64 + 4096).to_le_bytes());
    let mut cases = cases;
    cases.push((outside, "outside the data section"));
    for (bytes, want) in cases {
        std::fs::write(&bad, &bytes).unwrap();
        let err = fails(&["info", path]);
        assert!(
            err.contains(want) && err.contains("bad.bin"),
            "expected {want:?}: {err}"
        );
    }
    let err = fails(&["info", "/nonexistent/m.bin"]);
    assert!(
        err.contains("/nonexistent/m.bin") && err.contains("cannot open"),
        "{err}"
    );
}
