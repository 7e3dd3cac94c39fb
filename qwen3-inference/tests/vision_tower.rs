//! The vision tower against transformers: tiny random towers (Qwen3-VL's with DeepStack, Qwen3.5's
//! without; fixtures/vision/tower/, scripts/vision_tower_reference.py) run on the image
//! processor's goldens, alone and two images in one call; the merged vectors and every DeepStack
//! feature within f32 rounding of `Qwen3VLVisionModel`'s / `Qwen3_5VisionModel`'s.

use base64::Engine as _;
use qwen3_export::hf::checkpoint::{to_f32, Checkpoint};
use qwen3_inference::testing::reference_json::max_rel_diff;
use qwen3_inference::vision::tower::Matrix;
use qwen3_inference::vision::{Math, VisionConfig, VisionTower};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vision")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(b64: &str) -> Vec<f32> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The tower of fixtures/vision/tower/NAME, its tensors read from the checkpoint under
/// `model.visual.`.
fn tower(name: &str) -> VisionTower {
    let dir = fixtures().join("tower").join(name);
    let config = json(&dir.join("config.json"));
    let model_type = config["model_type"].as_str().unwrap();
    let vc = VisionConfig::from_json(model_type, &config["vision_config"]).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    VisionTower::load(vc, |tensor, shape| {
        let t = ckpt.tensor(&format!("model.visual.{tensor}"))?;
        let want: Vec<u64> = shape.iter().map(|&n| n as u64).collect();
        anyhow::ensure!(
            t.shape == want,
            "{tensor}: shape {:?}, expected {want:?}",
            t.shape
        );
        let mut bytes = Vec::new();
        ckpt.read_rows(&t, 0, t.numel() / t.row_len(), &mut bytes)?;
        let mut out = Vec::new();
        to_f32(t.dtype, &bytes, &mut out);
        Ok(Matrix::from_f32(&out))
    })
    .unwrap()
}

fn check(name: &str, deepstack_features: usize) {
    let t = tower(name);
    let processed = json(&fixtures().join("processor-reference.json"));
    let pixels = |file: &str| -> Vec<f32> {
        let case = processed["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["file"] == file)
            .unwrap();
        floats(case["pixel_values_b64"].as_str().unwrap())
    };
    let reference = json(&fixtures().join("tower").join(name).join("reference.json"));
    for case in reference["cases"].as_array().unwrap() {
        let images: Vec<&str> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let patches: Vec<f32> = images.iter().flat_map(|f| pixels(f)).collect();
        let grids: Vec<[usize; 3]> = case["grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| [0, 1, 2].map(|i| g[i].as_u64().unwrap() as usize))
            .collect();
        // The textbook tower and the fast one (tower/fast.rs), each against transformers.
        for math in [Math::Plain, Math::Fast] {
            let out = t.forward_with(&patches, &grids, math).unwrap();
            let merged = floats(case["merged_b64"].as_str().unwrap());
            let err = max_rel_diff(&out.merged, &merged);
            eprintln!(
                "{name} {images:?} ({math:?}): merged {} values, largest difference {err:.2e} of the largest",
                merged.len()
            );
            assert!(
                err < 2e-6,
                "{name} {images:?} ({math:?}): merged vectors {err:.2e} from transformers'"
            );
            let want = case["deepstack_b64"].as_array().unwrap();
            assert_eq!(out.deepstack.len(), want.len());
            assert_eq!(want.len(), deepstack_features);
            for (j, (got, w)) in out.deepstack.iter().zip(want).enumerate() {
                let err = max_rel_diff(got, &floats(w.as_str().unwrap()));
                assert!(
                    err < 2e-6,
                    "{name} {images:?} ({math:?}): DeepStack feature {j} {err:.2e} from transformers'"
                );
            }
        }
    }
}

#[test]
fn qwen3_vls_tower_computes_what_transformers_does() {
    check("qwen3-vl", 2);
}

#[test]
fn qwen3_5s_tower_computes_what_transformers_does() {
    check("qwen3_5", 0);
}

#[test]
fn a_tower_refuses_patches_that_do_not_fit_the_grid() {
    let t = tower("qwen3_5");
    let e = t
        .forward(&[0.0; 96 * 5], &[[1, 2, 2]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("4 patches of 96 values"), "{e}");
    let e = t
        .forward(&[0.0; 96 * 6], &[[1, 2, 3]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not whole 2x2 blocks"), "{e}");
}

/// The fast tower against the textbook one on images larger than the fixtures': a 20 x 30 and a
/// 16 x 18 grid in one call (600 and 288 patches: attention's query rows go in blocks of 256,
/// the last one partial), made of pseudo-random patch values.
#[test]
fn the_fast_tower_computes_what_the_textbook_one_does_on_larger_images() {
    let t = tower("qwen3-vl");
    let grids = [[1, 20, 30], [1, 16, 18]];
    let n: usize = grids.iter().map(|g| g[1] * g[2]).sum();
    let len = n * t.config.patch_len();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let patches: Vec<f32> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 2001) as f32 / 1000.0 - 1.0
        })
        .collect();
    let plain = t.forward_with(&patches, &grids, Math::Plain).unwrap();
    let fast = t.forward_with(&patches, &grids, Math::Fast).unwrap();
    let err = max_rel_diff(&fast.merged, &plain.merged);
    eprintln!("fast vs plain, {n} patches: {err:.2e} of the largest");
    assert!(err < 2e-6, "{err:.2e}");
    for (f, p) in fast.deepstack.iter().zip(&plain.deepstack) {
        assert!(max_rel_diff(f, p) < 2e-6);
    }
}
