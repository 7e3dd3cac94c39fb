//! A Qwen3.5 that sees images, through its model file: `export` of a
//! `Qwen3_5ForConditionalGeneration` with a tower and `preprocessor_config.json`
//! (fixtures/models/tiny-qwen3_5-vl-f32, scripts/fixture_qwen3_5_vl.py) keeps the tower, its
//! shape, the processor's settings and the image tokens in the file, and the tower read back from
//! the file turns the fixture's images into transformers' vectors.

use qwen3_inference::format::{DType, ImageProcessor, ModelFile};
use qwen3_inference::testing::reference_json::max_rel_diff;
use qwen3_inference::vision::{self, VisionTower};
use qwen3_test_support::{export_fixture, fixture, floats_b64, tempdir};
use serde_json::Value;

const NAME: &str = "tiny-qwen3_5-vl-f32";

fn json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The tower of the exported file, on each case's images, against transformers' merged vectors.
fn check_tower(file: &ModelFile, bound: f32) -> f32 {
    let vision = file
        .config()
        .vision
        .clone()
        .expect("the file keeps the tower");
    let tower = VisionTower::from_file(file).unwrap().unwrap();
    let reference = json(&fixture(NAME).join("reference.json"));
    let mut worst = 0f32;
    for case in reference["cases"].as_array().unwrap() {
        let (mut patches, mut grids) = (Vec::new(), Vec::new());
        for image in case["images"].as_array().unwrap() {
            let bytes =
                std::fs::read(fixture(NAME).join("images").join(image.as_str().unwrap())).unwrap();
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
        let out = tower.forward(&patches, &grids).unwrap();
        let err = max_rel_diff(
            &out.merged,
            &floats_b64(case["merged_b64"].as_str().unwrap()),
        );
        eprintln!(
            "{} {}: merged {} values, largest difference {err:.2e} of the largest",
            file.config().dtype,
            case["name"],
            out.merged.len()
        );
        assert!(
            err < bound,
            "{}: {err:.2e} from transformers'",
            case["name"]
        );
        worst = worst.max(err);
    }
    worst
}

#[test]
fn export_keeps_the_tower_and_it_sees_as_transformers_does() {
    let dir = tempdir("qwen3-vision", "export");
    let f32_path = export_fixture(NAME, &dir, DType::F32, 0);
    let file = ModelFile::open(&f32_path).unwrap();
    let c = file.config();
    assert_eq!(file.header().version, 8);
    let v = c.vision.as_ref().unwrap();
    // The header holds what the checkpoint's files say.
    let processor =
        ImageProcessor::from_json(&json(&fixture(NAME).join("preprocessor_config.json"))).unwrap();
    assert_eq!(v.processor, processor);
    let config = json(&fixture(NAME).join("config.json"));
    let tower =
        qwen3_inference::format::VisionConfig::from_json("qwen3_5", &config["vision_config"])
            .unwrap();
    assert_eq!(v.tower, tower);
    assert_eq!(
        (
            v.image_token_id,
            v.vision_start_token_id,
            v.vision_end_token_id
        ),
        (509, 507, 508)
    );
    assert_eq!(v.mrope_section, [2, 1, 1]);
    // The tower's LayerNorms are stored as they are (not as Qwen3.5's 1 + w RMSNorms).
    let st_bytes = std::fs::read(fixture(NAME).join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    let name = "model.visual.merger.norm.weight";
    let want: Vec<f32> = st
        .tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let got = file.tensor(name).unwrap();
    let got: Vec<f32> = (0..want.len())
        .map(|i| qwen3_inference::backend::weight(&got, i))
        .collect();
    assert_eq!(got, want);
    check_tower(&file, 2e-6);
    // In a q8 file the tower's matrices are q8 too; its vectors stay close.
    let q8 = ModelFile::open(&export_fixture(NAME, &dir, DType::Q8, 32)).unwrap();
    let err = check_tower(&q8, 0.05);
    eprintln!("q8: the tower within {err:.2e} of transformers' f32");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A case's prompt as our runtime sees it: the images decoded, preprocessed and encoded by the
/// file's tower, their vectors at the rows of their `<|image_pad|>` tokens, and every token's
/// M-RoPE positions.
struct Prompt {
    ids: Vec<u32>,
    positions: qwen3_inference::vision::positions::Positions,
    /// (first row, merged vectors) per image.
    images: Vec<(usize, Vec<f32>)>,
}

fn prompt(file: &ModelFile, tower: &VisionTower, case: &Value) -> Prompt {
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
            std::fs::read(fixture(NAME).join("images").join(image.as_str().unwrap())).unwrap();
        let p = v
            .processor
            .preprocess(&vision::decode(&bytes, 1 << 24).unwrap())
            .unwrap();
        let merged = tower.forward(&p.values, &[p.grid_thw]).unwrap().merged;
        grids.push(p.grid_thw);
        images.push((runs.next().unwrap(), merged));
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
/// position + 1) is transformers'.
#[test]
fn logits_and_greedy_with_images_are_transformers() {
    use qwen3_inference::backend::{Backend, CpuBackend, KvType, PlainBackend};
    use qwen3_inference::format::reader::TensorView;
    use qwen3_inference::model::{Model, RowInputs, Session};

    let dir = tempdir("qwen3-vision", "logits");
    let file = ModelFile::open(&export_fixture(NAME, &dir, DType::F32, 0)).unwrap();
    let model = Model::load(&file).unwrap();
    let tower = VisionTower::from_file(&file).unwrap().unwrap();
    let reference = json(&fixture(NAME).join("reference.json"));
    let vocab = 512;

    fn run<'m, B: Backend<Tensor = TensorView<'m>>>(
        b: &'m B,
        model: &'m Model<'m>,
        p: &Prompt,
        batch: usize,
        greedy: usize,
    ) -> (Vec<f32>, Vec<u32>) {
        let mut s = Session::new(b, model, p.ids.len() + greedy, KvType::F32).unwrap();
        s.set_max_batch(batch.min(p.ids.len() + greedy)).unwrap();
        let embeddings: Vec<(usize, &[f32])> = p.images.iter().map(|(r, v)| (*r, &v[..])).collect();
        let inputs = RowInputs {
            positions: Some(&p.positions.thw),
            embeddings: &embeddings,
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

    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let p = prompt(&file, &tower, case);
        let want_positions: Vec<Vec<u32>> =
            serde_json::from_value(case["positions"].clone()).unwrap();
        for (c, row) in want_positions.iter().enumerate() {
            let ours: Vec<u32> = p.positions.thw.iter().map(|t| t[c]).collect();
            assert_eq!(&ours, row, "{name}: position component {c}");
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
                "cpu" => run(&cpu, &model, &p, batch, greedy.len()),
                _ => run(&plain, &model, &p, batch, greedy.len()),
            };
            assert_eq!(logits.len(), p.ids.len() * vocab);
            let err = qwen3_test_support::max_abs(&logits, &want);
            eprintln!(
                "{name}: {backend}, chunks of {batch}: {} tokens, every logit within {err:.2e}; greedy {tokens:?}",
                p.ids.len()
            );
            // tests/parity.rs's f32 tolerance: 1e-4, or five times the reference's own f32
            // rounding where that is larger (this model's is up to 1.3e-4).
            let rounding = case["f32_vs_f64_max_abs"].as_f64().unwrap() as f32;
            let tol = 1e-4f32.max(5.0 * rounding);
            assert!(
                err < tol,
                "{name} ({backend}, {batch}): logits {err:.2e} from transformers' (tolerance {tol:.1e})"
            );
            assert_eq!(tokens, greedy, "{name} ({backend}, {batch}): greedy");
        }
        // Without the images' vectors (the pads' own embeddings) and positions, the logits
        // differ: the test sees the image.
        let cpu = CpuBackend::new();
        let mut s = Session::new(&cpu, &model, p.ids.len(), KvType::F32).unwrap();
        let blind = s.forward_all_logits(&p.ids).unwrap();
        assert!(qwen3_test_support::max_abs(&blind, &want) > 1e-2, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
