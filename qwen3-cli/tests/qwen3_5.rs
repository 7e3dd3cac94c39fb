//! Qwen3.5 through the commands a user runs: `export` of a `Qwen3_5ForConditionalGeneration`
//! checkpoint in the hub's layout (text model under `model.language_model.`, a vision tower and
//! MTP tensors left out and said so) in every dtype, what the file stores for the family's own
//! layout (`qwen3-export/src/hf/qwen3_5.rs`), `info`'s layers and state, and greedy `generate`
//! equal to HuggingFace's continuation on the f32 export, with and without drafts. (Exactness at every logit:
//! tests/parity.rs; many clients at once: tests/serve_batching.rs.)

use qwen3_inference::format::{DType, ModelFile};
use qwen3_test_support::tempdir;
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NAME: &str = "tiny-qwen3_5-bf16";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(NAME)
}

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = qwen3(args);
    assert!(
        o.status.success(),
        "qwen3 {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A bf16 tensor of the checkpoint, widened to f32.
fn source(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap();
    t.data()
        .chunks_exact(2)
        .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        .collect()
}

fn f32s(file: &ModelFile, name: &str) -> Vec<f32> {
    let data = file.tensor(name).unwrap().data;
    assert_eq!(data.dtype(), DType::F32, "{name}");
    data.f32().to_vec()
}

#[test]
fn export_info_and_generate_in_every_dtype() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
            .unwrap();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dir = tempdir("pq-qwen3_5", "every");
    for (dtype, gs) in [("f32", "0"), ("bf16", "0"), ("q8", "32"), ("q4", "32")] {
        let m = dir.join(format!("{dtype}.bin"));
        let m = m.to_str().unwrap();
        let fx = fixture();
        let mut args = vec!["export", fx.to_str().unwrap(), m, "--dtype", dtype];
        if gs != "0" {
            args.extend(["--group-size", gs]);
        }
        let out = ok(&args);
        assert!(
            out.contains("left out 21 tensors of the vision tower (model.visual.; no preprocessor_config.json) and 4 tensors of the multi-token-prediction layer (mtp.)"),
            "{out}"
        );
        let info = ok(&["info", m]);
        for want in [
            "architecture             Qwen3_5ForCausalLM",
            "format version 7",
            "layers                   6 Gated DeltaNet (2 key and 4 value heads of 16 and 16, conv 4), 2 gated attention (RoPE on 8 of 32 dims)",
            "Gated DeltaNet state 33.0 KiB a sequence (f32)",
        ] {
            assert!(info.contains(want), "{want:?} in {info}");
        }

        // What the file stores for Qwen3.5's own layout.
        let file = ModelFile::open(Path::new(m)).unwrap();
        assert_eq!(file.config().dtype, DType::parse(dtype).unwrap());
        let p = "model.layers.3";
        let hf = |name: &str| source(&st, &format!("model.language_model.{name}"));
        // Norms: 1 + w, in f32, as Qwen3_5RMSNorm multiplies; the DeltaNet's own norm as it is.
        for name in [
            format!("{p}.input_layernorm.weight"),
            format!("{p}.self_attn.q_norm.weight"),
            "model.norm.weight".to_string(),
        ] {
            let want: Vec<f32> = hf(&name[6..]).iter().map(|w| 1.0 + w).collect();
            assert_eq!(f32s(&file, &name), want, "{name}");
        }
        let gated = "model.layers.0.linear_attn.norm.weight";
        assert_eq!(f32s(&file, gated), hf(&gated[6..]));
        // conv1d without its middle axis; A_log, dt_bias f32 in every file.
        let conv = "model.layers.0.linear_attn.conv1d.weight";
        assert_eq!(file.tensor(conv).unwrap().shape, [128, 4]);
        assert_eq!(f32s(&file, conv), hf(&conv[6..]));
        for name in ["A_log", "dt_bias"] {
            let n = format!("model.layers.0.linear_attn.{name}");
            assert_eq!(f32s(&file, &n), hf(&n[6..]), "{n}");
        }
        if dtype == "f32" {
            // q_proj's rows, per head of 32: the query's, then the gate's.
            let q = hf("layers.3.self_attn.q_proj.weight");
            let rows = |first: usize| -> Vec<f32> {
                (0..4)
                    .flat_map(|h| q[(h * 64 + first) * 64..(h * 64 + first + 32) * 64].to_vec())
                    .collect()
            };
            assert_eq!(
                f32s(&file, &format!("{p}.self_attn.q_proj.weight")),
                rows(0)
            );
            assert_eq!(
                f32s(&file, &format!("{p}.self_attn.output_gate.weight")),
                rows(32)
            );

            // Greedy from HF's prompts: HF's continuation, token for token (the 210-token
            // prompt spans four chunks of the delta rule).
            for case in reference["cases"].as_array().unwrap() {
                let ids = case["prompt_ids"].to_string();
                let greedy = case["greedy_ids"].as_array().unwrap();
                let n = greedy.len().to_string();
                let args = ["generate", m, "--prompt-ids", &ids, "-n", &n, "-t", "0"];
                let out = ok(&[&args[..], &["--json"]].concat());
                let v: Value = serde_json::from_str(&out).unwrap();
                assert_eq!(v["tokens"].as_array().unwrap(), greedy);
            }
            // `--draft ngram` is accepted and changes nothing (this random model's answers do not
            // repeat the prompt, so lookup rarely proposes; rejected drafts' rollback is checked
            // in the engine's drafts_change_nothing_but_the_steps).
            let case = &reference["cases"][2];
            let mut ids: Vec<Value> = case["prompt_ids"].as_array().unwrap()[..40].to_vec();
            ids.extend(ids.clone());
            let ids = Value::from(ids).to_string();
            let run = |extra: &[&str]| -> Value {
                let args = [
                    "generate",
                    m,
                    "--prompt-ids",
                    &ids,
                    "-n",
                    "24",
                    "-t",
                    "0",
                    "--json",
                ];
                serde_json::from_str(&ok(&[&args[..], extra].concat())).unwrap()
            };
            let (plain, drafted) = (run(&[]), run(&["--draft", "ngram"]));
            assert_eq!(plain["tokens"], drafted["tokens"]);
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Layer types this runtime does not run, and linear attention's sizes that do not fit
/// together, are refused by name before anything is written.
#[test]
fn unsupported_hybrids_are_refused_by_name() {
    let dir = tempdir("pq-qwen3_5", "refused");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: [(&str, Edit); 3] = [
        (
            "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2",
            Box::new(|c| c["text_config"]["linear_num_value_heads"] = 3.into()),
        ),
        (
            "\"sliding_attention\" is not a layer type this runtime runs",
            Box::new(|c| c["text_config"]["layer_types"][1] = "sliding_attention".into()),
        ),
        (
            "8 layer_types for 9 layers",
            Box::new(|c| c["text_config"]["num_hidden_layers"] = 9.into()),
        ),
    ];
    for (want, edit) in cases {
        let ck = dir.join("ck");
        let _ = std::fs::remove_dir_all(&ck);
        std::fs::create_dir_all(&ck).unwrap();
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(fixture().join(f), ck.join(f)).unwrap();
        }
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(ck.join("config.json"), c.to_string()).unwrap();
        let out = dir.join("m.bin");
        let o = qwen3(&["export", ck.to_str().unwrap(), out.to_str().unwrap()]);
        assert!(!o.status.success(), "{want}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{want:?} in {err}");
        assert!(!out.exists(), "{want}: nothing written");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
