//! Qwen3.5 and Qwen3-VL that see images, through their model files: `export` of a
//! `Qwen3_5ForConditionalGeneration`, a `Qwen3VLForConditionalGeneration` or a
//! `Qwen3VLMoeForConditionalGeneration` with a tower and `preprocessor_config.json`
//! (fixtures/models/tiny-qwen3_5-vl-f32, tiny-qwen3-vl-f32 and tiny-qwen3-vl-moe-f32,
//! scripts/fixture_vision_models.py) keeps the tower, its shape, the processor's settings and the
//! image tokens in the file; the tower read back from the file turns the fixture's images into
//! transformers' vectors, and the text model (Qwen3-VL's with DeepStack) reads them as
//! transformers does.

use qwen3_inference::format::{DType, ImageProcessor, ModelFile};
use qwen3_inference::testing::reference_json::max_rel_diff;
use qwen3_inference::vision::{self, VisionTower};
use qwen3_test_support::{export_fixture, fixture, floats_b64, tempdir};
use serde_json::Value;
use std::path::Path;

mod common;
#[path = "vision/engine.rs"]
mod engine;

/// The Qwen3.5 fixture (hybrid text model, no DeepStack), which every test runs.
const NAME: &str = "tiny-qwen3_5-vl-f32";
/// The Qwen3-VL fixture (Qwen3 text model, DeepStack after both tower blocks).
const QWEN3_VL: &str = "tiny-qwen3-vl-f32";
/// The Qwen3-VL-MoE fixture (Qwen3-MoE text model with a dense layer, DeepStack; its experts
/// fused and transposed as the hub's files hold them).
const QWEN3_VL_MOE: &str = "tiny-qwen3-vl-moe-f32";
/// All three, for the tests of the model's math.
const NAMES: [&str; 3] = [NAME, QWEN3_VL, QWEN3_VL_MOE];

fn json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The tower of the exported file, on each case's images, against transformers' merged vectors.
fn check_tower(name: &str, file: &ModelFile, bound: f32) -> f32 {
    let vision = file
        .config()
        .vision
        .clone()
        .expect("the file keeps the tower");
    let tower = VisionTower::from_file(file).unwrap().unwrap();
    let reference = json(&fixture(name).join("images-reference.json"));
    let mut worst = 0f32;
    for case in reference["cases"].as_array().unwrap() {
        let (mut patches, mut grids) = (Vec::new(), Vec::new());
        for image in case["images"].as_array().unwrap() {
            let bytes =
                std::fs::read(fixture(name).join("images").join(image.as_str().unwrap())).unwrap();
            let rgb = vision::decode(&bytes, 1 << 24).unwrap();
            let p = vision.processor.preprocess(&rgb).unwrap();
            patches.extend(p.values);
            grids.push(p.grid_thw);
        }
        let want: Vec<[usize; 3]> = case["image_grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| [0, 1, 2].map(|i| g[i].as_u64().unwrap() as usize))
            .collect();
        assert_eq!(grids, want, "{}: grids", case["name"]);
        // The textbook tower and the fast one (the file's dtype on the kernels: in a q8 file,
        // the activations quantized too).
        for math in [vision::Math::Plain, vision::Math::Fast] {
            let out = tower.forward_with(&patches, &grids, math).unwrap();
            let err = max_rel_diff(
                &out.merged,
                &floats_b64(case["merged_b64"].as_str().unwrap()),
            );
            eprintln!(
                "{name} {} {math:?} {}: merged {} values, largest difference {err:.2e} of the largest",
                file.config().dtype,
                case["name"],
                out.merged.len()
            );
            assert!(
                err < bound,
                "{} ({math:?}): {err:.2e} from transformers'",
                case["name"]
            );
            worst = worst.max(err);
        }
    }
    worst
}

/// `ImageEncoder::at_first_image`, what `qwen3 serve` makes (the tower copied out of the file
/// when the first image comes), encodes each of the fixture's images to the bits of an encoder
/// that copied it at once, from the first image on; a text-only file makes neither.
#[test]
fn an_encoder_that_copies_its_tower_at_the_first_image_encodes_the_same() {
    let dir = tempdir("qwen3-vision", "deferred");
    for (name, dtype, group) in [(NAME, DType::F32, 0), (QWEN3_VL, DType::Q8, 32)] {
        let path = export_fixture(name, &dir, dtype, group);
        let now = vision::ImageEncoder::from_file(&ModelFile::open(&path).unwrap())
            .unwrap()
            .unwrap();
        let later = vision::ImageEncoder::at_first_image(std::sync::Arc::new(
            ModelFile::open(&path).unwrap(),
        ))
        .unwrap();
        for image in ["rgb-64x96.png", "gray-50x70.png", "rgba-96x64.png"] {
            let bytes = std::fs::read(fixture(name).join("images").join(image)).unwrap();
            let [a, b] = [&later, &now].map(|e| e.encode(&bytes, 1 << 24, 4096).unwrap());
            assert_eq!(a, b, "{name} {dtype} {image}");
        }
    }
    let text_only = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let file = std::sync::Arc::new(ModelFile::open(&text_only).unwrap());
    assert!(vision::ImageEncoder::from_file(&file).unwrap().is_none());
    assert!(vision::ImageEncoder::at_first_image(file).is_none());
}

/// The text model's copy of the matrices in the AVX-512 kernels' order
/// (`interleave_file`, made at load) leaves the tower's out: the text model never reads them,
/// and the tower copies its own when it is built (Qwen3-VL-2B's q8 tower is 0.3 GB).
#[test]
fn the_text_models_kernel_copy_leaves_the_tower_out() {
    use qwen3_inference::kernels::dot::interleaved::{interleave_file, Reorders};
    let dir = tempdir("qwen3-vision", "interleaved");
    let path = export_fixture(QWEN3_VL, &dir, DType::Q8, 32);
    let file = ModelFile::open(&path).unwrap();
    let derived = interleave_file(&file, Reorders::all()).unwrap();
    let names: Vec<String> = file
        .header()
        .tensors
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let copied = |prefix: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(prefix) && derived.get(n).is_some())
            .count()
    };
    assert!(copied("model.layers.") > 0, "no text matrix copied");
    assert_eq!(copied("model.visual."), 0);
    assert!(names
        .iter()
        .any(|n| n.starts_with("model.visual.") && n.ends_with("qkv.weight")));
}

#[test]
fn export_keeps_the_tower_and_it_sees_as_transformers_does() {
    let dir = tempdir("qwen3-vision", "export");
    // (fixture, config.json's model_type, the file's architecture, mrope_section, DeepStack)
    let families = [
        (NAME, "qwen3_5", "Qwen3_5ForCausalLM", [2, 1, 1], vec![]),
        (
            QWEN3_VL,
            "qwen3_vl",
            "Qwen3ForCausalLM",
            [6, 5, 5],
            vec![0, 1],
        ),
        (
            QWEN3_VL_MOE,
            "qwen3_vl_moe",
            "Qwen3MoeForCausalLM",
            [3, 3, 2],
            vec![0, 1],
        ),
    ];
    for (name, model_type, architecture, mrope, deepstack) in families {
        let f32_path = export_fixture(name, &dir, DType::F32, 0);
        let file = ModelFile::open(&f32_path).unwrap();
        let c = file.config();
        assert_eq!(file.header().version, 8);
        assert_eq!(c.architecture, architecture);
        let v = c.vision.as_ref().unwrap();
        // The header holds what the checkpoint's files say.
        let processor =
            ImageProcessor::from_json(&json(&fixture(name).join("preprocessor_config.json")))
                .unwrap();
        assert_eq!(v.processor, processor);
        let config = json(&fixture(name).join("config.json"));
        let tower =
            qwen3_inference::format::VisionConfig::from_json(model_type, &config["vision_config"])
                .unwrap();
        assert_eq!(v.tower, tower);
        assert_eq!(v.tower.deepstack_visual_indexes, deepstack);
        assert_eq!(
            (
                v.image_token_id,
                v.vision_start_token_id,
                v.vision_end_token_id
            ),
            (509, 507, 508)
        );
        assert_eq!(v.mrope_section, mrope);
        // The tower's LayerNorms are stored as they are (not as Qwen3.5's 1 + w RMSNorms).
        let st_bytes = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
        let norm = "model.visual.merger.norm.weight";
        let want: Vec<f32> = st
            .tensor(norm)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = file.tensor(norm).unwrap();
        let got: Vec<f32> = (0..want.len())
            .map(|i| qwen3_inference::backend::weight(&got, i))
            .collect();
        assert_eq!(got, want);
        check_tower(name, &file, 2e-6);
        // In a bf16 or q8 file the tower's matrices are bf16 or q8 too; its vectors stay close.
        for (dtype, group) in [(DType::Bf16, 0), (DType::Q8, 32)] {
            let file = ModelFile::open(&export_fixture(name, &dir, dtype, group)).unwrap();
            let err = check_tower(name, &file, 0.05);
            eprintln!("{name} {dtype}: the tower within {err:.2e} of transformers' f32");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A case's prompt as our runtime sees it: the images decoded, preprocessed and encoded by the
/// file's tower, their vectors at the rows of their `<|image_pad|>` tokens, and every token's
/// M-RoPE positions.
struct Prompt {
    ids: Vec<u32>,
    positions: qwen3_inference::vision::positions::Positions,
    /// (first row, merged vectors, DeepStack features) per image.
    images: Vec<(usize, Vec<f32>, Vec<Vec<f32>>)>,
}

fn prompt(name: &str, file: &ModelFile, tower: &VisionTower, case: &Value) -> Prompt {
    let v = file.config().vision.as_ref().unwrap();
    let ids: Vec<u32> = case["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    let is_image: Vec<bool> = ids.iter().map(|&t| t == v.image_token_id).collect();
    let (mut grids, mut images) = (Vec::new(), Vec::new());
    let mut runs = ids
        .iter()
        .enumerate()
        .filter(|&(i, &t)| t == v.image_token_id && (i == 0 || ids[i - 1] != t))
        .map(|(i, _)| i);
    for image in case["images"].as_array().unwrap() {
        let bytes =
            std::fs::read(fixture(name).join("images").join(image.as_str().unwrap())).unwrap();
        let p = v
            .processor
            .preprocess(&vision::decode(&bytes, 1 << 24).unwrap())
            .unwrap();
        let out = tower.forward(&p.values, &[p.grid_thw]).unwrap();
        grids.push(p.grid_thw);
        images.push((runs.next().unwrap(), out.merged, out.deepstack));
    }
    let positions =
        vision::positions::mrope_positions(&is_image, &grids, v.tower.spatial_merge_size).unwrap();
    Prompt {
        ids,
        positions,
        images,
    }
}

/// Every logit of each prompt with images within the f32 tolerance of transformers', on the plain and
/// the CPU backend, in one call and in chunks that split an image; the positions equal
/// transformers'; and the greedy continuation (decoding past the image, from the prompt's last
/// position + 1) is transformers'. Qwen3-VL's answers need its DeepStack features.
#[test]
fn logits_and_greedy_with_images_are_transformers() {
    use qwen3_inference::backend::{Backend, CpuBackend, KvType, PlainBackend};
    use qwen3_inference::format::view::TensorView;
    use qwen3_inference::model::{Model, RowInputs, Session};

    let dir = tempdir("qwen3-vision", "logits");
    let vocab = 512;

    /// The prompt's logits (every row) and `greedy` tokens after it; without the DeepStack
    /// features when `deepstack` is false.
    fn run<'m, B: Backend<Tensor = TensorView<'m>>>(
        b: &'m B,
        model: &'m Model<'m>,
        p: &Prompt,
        batch: usize,
        greedy: usize,
        deepstack: bool,
    ) -> (Vec<f32>, Vec<u32>) {
        let mut s = Session::new(b, model, p.ids.len() + greedy, KvType::F32).unwrap();
        s.set_max_batch(batch.min(p.ids.len() + greedy)).unwrap();
        let embeddings: Vec<(usize, &[f32])> =
            p.images.iter().map(|(r, v, _)| (*r, &v[..])).collect();
        let features: Vec<(usize, usize, &[f32])> = p
            .images
            .iter()
            .flat_map(|(r, _, ds)| ds.iter().enumerate().map(|(l, f)| (l, *r, &f[..])))
            .filter(|_| deepstack)
            .collect();
        let inputs = RowInputs {
            positions: Some(&p.positions.thw),
            embeddings: &embeddings,
            deepstack: &features,
        };
        let logits = s.forward_all_logits_with(&p.ids, inputs).unwrap();
        let argmax = |l: &[f32]| {
            l.iter()
                .enumerate()
                .fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m })
                .0 as u32
        };
        let mut next = argmax(&logits[logits.len() - 512..]);
        let mut out = vec![next];
        while out.len() < greedy {
            next = argmax(s.forward(&[next]).unwrap());
            out.push(next);
        }
        (logits, out)
    }

    for name in NAMES {
        let file = ModelFile::open(&export_fixture(name, &dir, DType::F32, 0)).unwrap();
        let model = Model::load(&file).unwrap();
        let tower = VisionTower::from_file(&file).unwrap().unwrap();
        let reference = json(&fixture(name).join("images-reference.json"));
        for case in reference["cases"].as_array().unwrap() {
            let case_name = format!("{name}, {}", case["name"].as_str().unwrap());
            let p = prompt(name, &file, &tower, case);
            let want_positions: Vec<Vec<u32>> =
                serde_json::from_value(case["positions"].clone()).unwrap();
            for (c, row) in want_positions.iter().enumerate() {
                let ours: Vec<u32> = p.positions.thw.iter().map(|t| t[c]).collect();
                assert_eq!(&ours, row, "{case_name}: position component {c}");
            }
            assert_eq!(
                p.positions.next as u64,
                case["next_position"].as_u64().unwrap()
            );
            let want = floats_b64(case["logits_b64"].as_str().unwrap());
            let greedy: Vec<u32> = serde_json::from_value(case["greedy"].clone()).unwrap();
            assert!(case["greedy_min_gap"].as_f64().unwrap() > 1e-2);
            let cpu = CpuBackend::new();
            let plain = PlainBackend::new();
            for (backend, batch) in [("cpu", 64), ("cpu", 5), ("plain", 64)] {
                let (logits, tokens) = match backend {
                    "cpu" => run(&cpu, &model, &p, batch, greedy.len(), true),
                    _ => run(&plain, &model, &p, batch, greedy.len(), true),
                };
                assert_eq!(logits.len(), p.ids.len() * vocab);
                let err = qwen3_test_support::max_abs(&logits, &want);
                eprintln!(
                    "{case_name}: {backend}, chunks of {batch}: {} tokens, every logit within {err:.2e}; greedy {tokens:?}",
                    p.ids.len()
                );
                // tests/parity.rs's f32 tolerance: 1e-4, or five times the reference's own f32
                // rounding where that is larger (the Qwen3.5 fixture's is up to 1.3e-4).
                let rounding = case["f32_vs_f64_max_abs"].as_f64().unwrap() as f32;
                let tol = 1e-4f32.max(5.0 * rounding);
                assert!(
                    err < tol,
                    "{case_name} ({backend}, {batch}): logits {err:.2e} from transformers' (tolerance {tol:.1e})"
                );
                assert_eq!(tokens, greedy, "{case_name} ({backend}, {batch}): greedy");
            }
            // Without the images' vectors (the pads' own embeddings) and positions, the logits
            // differ: the test sees the image.
            let cpu = CpuBackend::new();
            let mut s = Session::new(&cpu, &model, p.ids.len(), KvType::F32).unwrap();
            let blind = s.forward_all_logits(&p.ids).unwrap();
            assert!(
                qwen3_test_support::max_abs(&blind, &want) > 1e-2,
                "{case_name}"
            );
            // Qwen3-VL without its DeepStack features: other logits, so the test sees them.
            if name != NAME {
                let (flat, _) = run(&cpu, &model, &p, 64, 1, false);
                let err = qwen3_test_support::max_abs(&flat, &want);
                assert!(
                    err > 1e-2,
                    "{case_name}: without DeepStack within {err:.1e}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qwen3 export` of fixture `name` to `model`, then `qwen3 inference -m generate --image` of
/// its chat case (an image, then the question) at greedy: the output's JSON, after checking its
/// tokens are transformers'. Returns the JSON, the question, the image and transformers' tokens.
fn generate_chat_case(
    qwen3: &dyn Fn(&[&str]) -> std::process::Output,
    name: &str,
    model: &Path,
) -> (Value, String, std::path::PathBuf, Vec<Value>) {
    let fx = fixture(name);
    let export = qwen3(&[
        "export",
        fx.to_str().unwrap(),
        model.to_str().unwrap(),
        "--dtype",
        "f32",
    ]);
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let reference = json(&fx.join("images-reference.json"));
    let case = &reference["cases"][3];
    assert_eq!(case["name"], "chat: an image, then the question");
    let text = case["messages"][0]["content"][1]["text"].as_str().unwrap();
    let image = fx.join("images").join(case["images"][0].as_str().unwrap());
    let greedy = case["greedy"].as_array().unwrap().clone();
    let n = greedy.len().to_string();
    let args = [
        "inference",
        model.to_str().unwrap(),
        "-m",
        "generate",
        "-i",
        text,
        "--image",
        image.to_str().unwrap(),
        "-n",
        &n,
        "-t",
        "0",
        "--json",
    ];
    let out = qwen3(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The answer may end early at an end-of-turn id that transformers' run went past.
    let tokens = v["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty());
    assert_eq!(tokens[..], greedy[..tokens.len()], "{name}: {v}");
    eprintln!("{name}: generate --image: {v}");
    (v, text.to_string(), image, greedy)
}

/// `qwen3 inference -m generate --image FILE -i TEXT`: the image before the text in one user
/// turn of the chat template, as transformers' processor prepares it; transformers' greedy
/// tokens, for Qwen3.5 and Qwen3-VL. A text-only model, a missing file and a file that is no
/// image are refused by name.
#[test]
fn generate_with_an_image_answers_as_transformers() {
    use std::process::Command;
    let dir = tempdir("qwen3-vision", "cli");
    let model = dir.join("m.bin");
    let qwen3 = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .args(args)
            .output()
            .unwrap()
    };
    generate_chat_case(&qwen3, QWEN3_VL, &dir.join("qwen3-vl.bin"));
    let (v, text, image, greedy) = generate_chat_case(&qwen3, NAME, &model);
    let text = text.as_str();
    let m = model.to_str().unwrap();

    // `qwen3 batch` lines with images: the same answer as the CLI's; a bad image is that line's
    // 400, the others are answered.
    let url = qwen3_test_support::data_url(&image);
    let chat = |id: &str, url: &str| {
        serde_json::json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}],
                "max_tokens": greedy.len(), "temperature": 0}})
        .to_string()
    };
    let input = dir.join("in.jsonl");
    let lines = [chat("img", &url), chat("bad", "data:image/png;base64,AAAA")];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let output = dir.join("out.jsonl");
    let b = qwen3(&[
        "batch",
        m,
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let results: Vec<Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by = |id: &str| {
        results
            .iter()
            .find(|r| r["custom_id"] == id)
            .unwrap()
            .clone()
    };
    let img = by("img");
    let body = &img["response"]["body"];
    let said = ["reasoning_content", "content"]
        .map(|k| {
            body["choices"][0]["message"][k]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .concat();
    assert_eq!(said, v["text"].as_str().unwrap(), "{img}");
    assert_eq!(body["usage"]["prompt_tokens"], v["prompt_tokens"]);
    assert_eq!(by("bad")["response"]["status_code"], 400);

    // Refused by name.
    let fail = |args: &[&str], want: &str| {
        let o = qwen3(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{want}: {err}");
    };
    let not_an_image = dir.join("notes.png");
    std::fs::write(&not_an_image, b"not a picture").unwrap();
    let run = |model: &str, img: &str| -> Vec<String> {
        [
            "inference",
            model,
            "-m",
            "generate",
            "-i",
            "Hi",
            "--image",
            img,
            "-n",
            "2",
        ]
        .map(String::from)
        .to_vec()
    };
    let strs = |v: &[String]| -> Vec<String> { v.to_vec() };
    let call = |v: Vec<String>, want: &str| {
        let r: Vec<&str> = v.iter().map(String::as_str).collect();
        fail(&r, want)
    };
    call(strs(&run(m, not_an_image.to_str().unwrap())), "notes.png");
    call(
        strs(&run(m, dir.join("missing.png").to_str().unwrap())),
        "missing.png: cannot read",
    );
    let text_model = dir.join("text.bin");
    let text_fx =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3_5-bf16");
    let e = qwen3(&[
        "export",
        text_fx.to_str().unwrap(),
        text_model.to_str().unwrap(),
    ]);
    assert!(e.status.success());
    call(
        run(text_model.to_str().unwrap(), image.to_str().unwrap()),
        "does not take images",
    );
    // An image larger than the context is refused before the tower runs; chat mode takes none.
    let mut small = run(m, image.to_str().unwrap());
    small.extend(["-c".into(), "5".into()]);
    call(small, "makes 6 tokens, more than the 5");
    call(
        [
            "inference",
            m,
            "-m",
            "chat",
            "--image",
            image.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec(),
        "--image are for -m generate",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qwen3 serve` with images under many clients: the real binary, real HTTP. 24 chat requests
/// (the fixture's images with one question, text alone, greedy and sampled, some streamed) from
/// 8 clients at once each answer as they do alone; a client that hangs up while its image
/// request runs costs nothing but its own answer.
#[test]
fn served_concurrently_with_images_equals_alone() {
    use common::{http, Server};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    let dir = tempdir("qwen3-vision", "serve");
    let model = export_fixture(NAME, &dir, DType::Q8, 32);
    let s = Server::start(
        &model,
        &[
            "--parallel",
            "4",
            "--prefill-chunk",
            "8",
            "--context",
            "256",
        ],
    );
    let images: Vec<String> = ["rgb-64x96.png", "gray-50x70.png", "rgba-96x64.png"]
        .iter()
        .map(|f| qwen3_test_support::data_url(&fixture(NAME).join("images").join(f)))
        .collect();
    let request = move |i: usize| -> Value {
        let mut content = vec![json_text("What is in the picture?")];
        if i % 4 != 3 {
            let url = &images[i % 3];
            content.insert(
                0,
                serde_json::json!({"type": "image_url", "image_url": {"url": url}}),
            );
        }
        serde_json::json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": if i.is_multiple_of(2) { 0.0 } else { 0.9 },
            "seed": i,
            "stream": i % 3 == 1,
        })
    };
    let answer = |r: common::Resp, stream: bool| -> String {
        assert_eq!(r.status, 200, "{}", r.body);
        let pick = |v: &Value, k: &str| {
            ["reasoning_content", "content"]
                .iter()
                .map(|f| v["choices"][0][k][f].as_str().unwrap_or("").to_string())
                .collect::<String>()
        };
        match stream {
            false => pick(&r.json(), "message"),
            true => r.events()[..r.events().len() - 1]
                .iter()
                .map(|e| pick(&serde_json::from_str(e).unwrap(), "delta"))
                .collect(),
        }
    };
    let n = 24;
    let solo: Vec<String> = (0..n)
        .map(|i| {
            let req = request(i);
            answer(s.post("/v1/chat/completions", &req), req["stream"] == true)
        })
        .collect();
    let next = Arc::new(Mutex::new(0usize));
    let got = Arc::new(Mutex::new(vec![None; n]));
    let request = Arc::new(request);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (next, got, request, port) = (next.clone(), got.clone(), request.clone(), s.port);
            std::thread::spawn(move || loop {
                let i = {
                    let mut k = next.lock().unwrap();
                    if *k == n {
                        return;
                    }
                    *k += 1;
                    *k - 1
                };
                let req = request(i);
                let body = req.to_string();
                let r = http(port, "POST", "/v1/chat/completions", &[], body.as_bytes());
                got.lock().unwrap()[i] = Some(answer(r, req["stream"] == true));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let got = got.lock().unwrap();
    for i in 0..n {
        assert_eq!(got[i].as_deref(), Some(solo[i].as_str()), "request {i}");
    }
    assert_ne!(solo[0], solo[4], "another image, another answer");
    // A client that sends an image request and hangs up at once.
    for _ in 0..3 {
        let mut c = common::connect(s.port);
        let body = request(0).to_string();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(body.as_bytes()).unwrap();
        drop(c);
    }
    let again = answer(s.post("/v1/chat/completions", &request(0)), false);
    assert_eq!(again, solo[0]);
    let metrics = s.get("/metrics").body;
    assert!(metrics.contains("qwen3_images_total"), "{metrics}");
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn json_text(t: &str) -> Value {
    serde_json::json!({"type": "text", "text": t})
}

/// `/image FILE` in `-m chat`: the next message's prompt ids are transformers' (the chat case's,
/// pads expanded as its processor expands them), and the answer is `generate --image`'s; a file
/// that is no image is said at once and the chat goes on.
#[test]
fn chat_takes_an_image_for_the_next_message() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = tempdir("qwen3-vision", "chat");
    let m = export_fixture(NAME, &dir, DType::F32, 0);
    let m = m.to_str().unwrap();
    let reference = json(&fixture(NAME).join("images-reference.json"));
    let case = &reference["cases"][3];
    let text = case["messages"][0]["content"][1]["text"].as_str().unwrap();
    let image = fixture(NAME)
        .join("images")
        .join(case["images"][0].as_str().unwrap());
    let image = image.to_str().unwrap();
    let mut chat = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args([
            "inference",
            m,
            "-m",
            "chat",
            "-t",
            "0",
            "-n",
            "8",
            "--verbose-prompt",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "not a picture").unwrap();
    let input = format!("/image {}\n/image {image}\n{text}\n", notes.display());
    chat.stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("notes.txt"), "{stderr}");
    assert!(
        stderr.contains("6 tokens, for your next message"),
        "{stderr}"
    );
    let ids = stderr
        .lines()
        .find_map(|l| l.strip_prefix("prompt ids: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    let ids: Value = serde_json::from_str(ids).unwrap();
    assert_eq!(
        ids, case["input_ids"],
        "the chat's prompt ids are transformers'"
    );
    let generate = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args([
            "inference",
            m,
            "-m",
            "generate",
            "--image",
            image,
            "-i",
            text,
            "-n",
            "8",
            "-t",
            "0",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&generate.stdout);
    assert_eq!(stdout.lines().next(), said.lines().next(), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
