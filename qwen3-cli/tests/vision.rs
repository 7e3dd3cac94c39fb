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
