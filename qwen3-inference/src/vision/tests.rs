//! The image path against transformers' processor: `fixtures/vision/processor-reference.json`,
//! written by `scripts/vision_reference.py` with `Qwen2VLImageProcessorPil` (Pillow's decoding,
//! RGB conversion, bicubic resize; numpy's rescale and normalise).

use base64::Engine as _;
use serde_json::Value;

use super::*;

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vision")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixtures().join("processor-reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn bytes(case: &Value, key: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(case[key].as_str().unwrap())
        .unwrap()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as usize)
        .collect()
}

/// The processor a case was made with (its `settings`, as preprocessor_config.json would say them).
fn processor(case: &Value) -> ImageProcessor {
    let s = &case["settings"];
    ImageProcessor::from_json(&serde_json::json!({
        "patch_size": s["patch_size"], "temporal_patch_size": s["temporal_patch_size"],
        "merge_size": s["merge_size"], "image_mean": s["image_mean"], "image_std": s["image_std"],
        "size": {"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
        "rescale_factor": 0.00392156862745098,
    }))
    .unwrap()
}

/// JPEG decoders differ (libjpeg-turbo's IDCT and chroma upsampling in Pillow, the `image` crate's
/// own here): a JPEG's bytes are compared within a bound, every other format's exactly.
fn is_jpeg(case: &Value) -> bool {
    case["file"].as_str().unwrap().ends_with(".jpg")
}

#[test]
fn images_decode_to_pillows_rgb() {
    for case in reference()["cases"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let img = decode(&std::fs::read(fixtures().join(file)).unwrap(), 1 << 24).unwrap();
        let size = usizes(&case["size"]);
        assert_eq!((img.height, img.width), (size[0], size[1]), "{file}");
        let want = bytes(case, "rgb_b64");
        let worst = img
            .data
            .iter()
            .zip(&want)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap();
        if is_jpeg(case) {
            let mean = img
                .data
                .iter()
                .zip(&want)
                .map(|(&a, &b)| a.abs_diff(b) as f64)
                .sum::<f64>()
                / want.len() as f64;
            eprintln!(
                "{file}: largest difference from Pillow's decoding {worst} levels, mean {mean:.3}"
            );
            assert!(
                worst <= 8 && mean < 1.0,
                "{file}: {worst} levels, mean {mean}"
            );
        } else {
            assert_eq!(
                worst, 0,
                "{file} ({}): RGB bytes differ from Pillow's",
                case["mode"]
            );
        }
    }
}

#[test]
fn pixel_values_are_transformers_bit_for_bit() {
    for case in reference()["cases"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let p = processor(case);
        // From Pillow's own RGB bytes, so that a JPEG tests the processor, not the decoder.
        let size = usizes(&case["size"]);
        let rgb = Rgb {
            height: size[0],
            width: size[1],
            data: bytes(case, "rgb_b64"),
        };
        let resized = usizes(&case["resized"]);
        assert_eq!(
            p.resized(rgb.height, rgb.width).unwrap(),
            (resized[0], resized[1]),
            "{file}"
        );
        let got = p.preprocess(&rgb).unwrap();
        assert_eq!(got.grid_thw.to_vec(), usizes(&case["grid_thw"]), "{file}");
        let want: Vec<f32> = bytes(case, "pixel_values_b64")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got.values.len(), want.len(), "{file}");
        let differ = got
            .values
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{file}: {differ} of {} values differ from transformers'",
            want.len()
        );
        assert_eq!(got.row_len, 3 * 2 * 4 * 4);
    }
}

#[test]
fn files_other_than_jpegs_give_transformers_values_end_to_end() {
    for case in reference()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !is_jpeg(c))
    {
        let file = case["file"].as_str().unwrap();
        let img = decode(&std::fs::read(fixtures().join(file)).unwrap(), 1 << 24).unwrap();
        let got = processor(case).preprocess(&img).unwrap();
        let want = bytes(case, "pixel_values_b64");
        let same = got
            .values
            .iter()
            .zip(want.chunks_exact(4))
            .all(|(a, b)| a.to_le_bytes() == b);
        assert!(same, "{file}");
    }
}

#[test]
fn real_sizes_resize_as_transformers_says() {
    let r = reference();
    let s = &r["smart_resize"]["settings"];
    let p = ImageProcessor::from_json(&serde_json::json!({
        "patch_size": s["patch_size"], "merge_size": s["merge_size"],
        "size": {"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
    }))
    .unwrap();
    for case in r["smart_resize"]["cases"].as_array().unwrap() {
        let (size, want) = (usizes(&case["size"]), usizes(&case["resized"]));
        assert_eq!(
            p.resized(size[0], size[1]).unwrap(),
            (want[0], want[1]),
            "{size:?}"
        );
    }
    for case in r["smart_resize"]["refused"].as_array().unwrap() {
        let size = usizes(&case["size"]);
        let e = p.resized(size[0], size[1]).unwrap_err().to_string();
        assert!(
            e.contains("aspect ratio must be smaller than 200"),
            "{size:?}: {e}"
        );
    }
}

#[test]
fn the_processor_reads_qwen3_vls_config_and_refuses_what_it_does_not_do() {
    // Qwen3-VL's preprocessor_config.json, as the hub has it.
    let p = ImageProcessor::from_json(&serde_json::json!({
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"
    }))
    .unwrap();
    assert_eq!(
        (p.patch_size, p.merge_size, p.min_pixels, p.max_pixels),
        (16, 2, 65536, 16777216)
    );
    // Qwen2-VL's older keys and defaults (CLIP's mean).
    let old =
        ImageProcessor::from_json(&serde_json::json!({"min_pixels": 3136, "max_pixels": 12845056}))
            .unwrap();
    assert_eq!(
        (old.patch_size, old.min_pixels, old.max_pixels),
        (14, 3136, 12845056)
    );
    assert_eq!(old.image_mean[0], 0.48145466f64 as f32);
    for (bad, what) in [
        (serde_json::json!({"do_normalize": false}), "do_normalize"),
        (serde_json::json!({"patch_size": 0}), "patch_size"),
        (
            serde_json::json!({"image_std": [0.5, 0.0, 0.5]}),
            "image_std",
        ),
        (serde_json::json!({"image_mean": [0.5, 0.5]}), "image_mean"),
        (
            serde_json::json!({"size": {"shortest_edge": 100, "longest_edge": 10}}),
            "minimum pixels",
        ),
    ] {
        let e = ImageProcessor::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains(what), "{bad}: {e}");
    }
}

/// M-RoPE's positions against transformers' `get_rope_index` (Qwen3-VL's and Qwen3.5's, the same
/// code), and the frequencies' components against `recomposition_frequencies`
/// (fixtures/vision/positions-reference.json, scripts/vision_positions_reference.py).
#[test]
fn image_tokens_take_transformers_positions() {
    use super::positions::{mrope_component, mrope_positions};
    let text = std::fs::read_to_string(fixtures().join("positions-reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    for p in r["prompts"].as_array().unwrap() {
        let is_image: Vec<bool> = p["tokens"]
            .as_str()
            .unwrap()
            .chars()
            .map(|c| c == 'i')
            .collect();
        let grids: Vec<[usize; 3]> = p["grids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| [0, 1, 2].map(|i| g[i].as_u64().unwrap() as usize))
            .collect();
        let got =
            mrope_positions(&is_image, &grids, p["merge"].as_u64().unwrap() as usize).unwrap();
        let want: Vec<[u32; 3]> = p["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| [0, 1, 2].map(|i| t[i].as_u64().unwrap() as u32))
            .collect();
        assert_eq!(got.thw, want, "{}", p["name"]);
        assert_eq!(
            got.next as u64,
            p["next"].as_u64().unwrap(),
            "{}",
            p["name"]
        );
    }
    for s in r["sections"].as_array().unwrap() {
        let section = usizes(&s["mrope_section"]);
        let want = usizes(&s["components"]);
        let got: Vec<usize> = (0..want.len())
            .map(|j| mrope_component(j, [section[0], section[1], section[2]]))
            .collect();
        assert_eq!(got, want, "{}", s["model"]);
    }
}
