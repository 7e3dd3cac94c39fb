//! From RGB bytes to the vision tower's input: the patches of transformers' Qwen2-VL image processor
//! (`Qwen2VLImageProcessor`, which Qwen2.5-VL, Qwen3-VL and Qwen3.5 all use).
//!
//! 1. Resize to [`smart_resize`]'s size with Pillow's bicubic ([`resize_bicubic`]).
//! 2. Rescale each byte to [0, 1] and normalise per channel: `(v * rescale_factor - mean) / std`,
//!    with transformers' roundings: the product in f64 then rounded to f32, the rest in f32.
//! 3. Cut into patches of `patch_size x patch_size`, the still image repeated `temporal_patch_size`
//!    times (the tower's Conv3d takes that many video frames), ordered so that the `merge_size x
//!    merge_size` patches the merger will fuse into one token are consecutive:
//!
//! ```text
//! pixel [c, y, x] of the resized image,  y = (by * m + my) * p + py,  x = (bx * m + mx) * p + px
//!   -> row    ((by * (W/m) + bx) * m + my) * m + mx         (one row a patch; H, W in patches)
//!      column ((c * T + t) * p + py) * p + px               (for every t < T: the same value)
//! ```

use anyhow::{bail, Result};
use serde_json::Value;

use super::image::Rgb;
use super::resize::{resize_bicubic, smart_resize};

/// The image processor's settings, from the checkpoint's `preprocessor_config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProcessor {
    /// Side of a patch in pixels (`patch_size`: 16 for Qwen3-VL and Qwen3.5, 14 for Qwen2-VL).
    pub patch_size: usize,
    /// Frames per patch (`temporal_patch_size`: 2); a still image fills each with itself.
    pub temporal_patch_size: usize,
    /// Patches per side that the merger fuses into one token (`merge_size`: 2).
    pub merge_size: usize,
    /// Fewest and most pixels after resizing (`size.shortest_edge` and `size.longest_edge`, or the
    /// older `min_pixels` and `max_pixels`).
    pub min_pixels: usize,
    pub max_pixels: usize,
    /// Per channel (R, G, B): `(v * rescale_factor - mean) / std`.
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub rescale_factor: f64,
}

/// OpenAI CLIP's per-channel mean and standard deviation (transformers' `OPENAI_CLIP_MEAN` and
/// `OPENAI_CLIP_STD`): Qwen2VLImageProcessor's defaults. Python floats, rounded to f32 where used,
/// as numpy rounds them.
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The vision tower's input for one image.
#[derive(Clone, Debug, PartialEq)]
pub struct Patches {
    /// `(temporal, height, width)` in patches (`image_grid_thw`): `(1, H, W)` for a still image.
    pub grid_thw: [usize; 3],
    /// One row per patch, `row_len` values each (`pixel_values`).
    pub values: Vec<f32>,
    /// Values per patch: `3 * temporal_patch_size * patch_size^2`.
    pub row_len: usize,
}

/// The (row, column) in patches of patch `i` of a grid `w` patches wide, in the merger's order
/// (each `m x m` block's patches consecutive, blocks row by row): the diagram at the top.
pub fn merge_order(i: usize, w: usize, m: usize) -> (usize, usize) {
    let (block, inner) = (i / (m * m), i % (m * m));
    let (by, bx) = (block / (w / m), block % (w / m));
    (by * m + inner / m, bx * m + inner % m)
}

impl ImageProcessor {
    /// Reads `preprocessor_config.json`'s keys, with transformers' defaults for the ones it leaves
    /// out (Qwen2VLImageProcessor's class attributes).
    pub fn from_json(config: &Value) -> Result<ImageProcessor> {
        let usize_key = |key: &str, default: usize| -> Result<usize> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "preprocessor_config.json: {key} must be a positive integer, got {v}"
                        )
                    }),
            }
        };
        // The pixel limits: the older top-level `min_pixels` / `max_pixels` win over `size`, as
        // Qwen2VLImageProcessor's constructor lets them.
        let size = config.get("size");
        let edge = |key: &str, old: &str, default: usize| -> Result<usize> {
            match (config.get(old), size.and_then(|s| s.get(key))) {
                (Some(v), _) | (None, Some(v)) if !v.is_null() => {
                    v.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| {
                        anyhow::anyhow!(
                            "preprocessor_config.json: {old} (size.{key}) must be a positive integer, got {v}"
                        )
                    })
                }
                _ => Ok(default),
            }
        };
        let triple = |key: &str, default: [f32; 3]| -> Result<[f32; 3]> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok([0, 1, 2].map(|i| a[i].as_f64().unwrap() as f32))
                }
                Some(Value::Number(n)) => Ok([n.as_f64().unwrap() as f32; 3]),
                Some(v) => bail!("preprocessor_config.json: {key} must be three numbers, got {v}"),
            }
        };
        // Qwen2VLImageProcessor's defaults: OpenAI CLIP's mean and std, patch 14, 56*56 to
        // 28*28*1280 pixels.
        let p = ImageProcessor {
            patch_size: usize_key("patch_size", 14)?,
            temporal_patch_size: usize_key("temporal_patch_size", 2)?,
            merge_size: usize_key("merge_size", 2)?,
            min_pixels: edge("shortest_edge", "min_pixels", 56 * 56)?,
            max_pixels: edge("longest_edge", "max_pixels", 28 * 28 * 1280)?,
            image_mean: triple("image_mean", CLIP_MEAN.map(|v| v as f32))?,
            image_std: triple("image_std", CLIP_STD.map(|v| v as f32))?,
            rescale_factor: config
                .get("rescale_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0 / 255.0),
        };
        for key in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
            if config.get(key) == Some(&Value::Bool(false)) {
                bail!("preprocessor_config.json: {key} false is not supported (every Qwen checkpoint sets it true)");
            }
        }
        // Bounds no real tower comes near, so that the sizes' products cannot overflow.
        if p.patch_size > 1024 || p.merge_size > 64 || p.temporal_patch_size > 64 {
            bail!(
                "preprocessor_config.json: patch {} / merge {} / temporal patch {} out of range",
                p.patch_size,
                p.merge_size,
                p.temporal_patch_size
            );
        }
        if p.max_pixels > 1 << 32 {
            bail!(
                "preprocessor_config.json: {} maximum pixels is over 2^32",
                p.max_pixels
            );
        }
        if p.min_pixels > p.max_pixels {
            bail!(
                "preprocessor_config.json: {} minimum pixels over {} maximum",
                p.min_pixels,
                p.max_pixels
            );
        }
        if p.image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            bail!(
                "preprocessor_config.json: image_std {:?} has a zero",
                p.image_std
            );
        }
        Ok(p)
    }

    /// The size (height, width) in pixels an image of `height x width` is resized to.
    pub fn resized(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        smart_resize(
            height,
            width,
            self.patch_size * self.merge_size,
            self.min_pixels,
            self.max_pixels,
        )
    }

    /// The tower's input for `image`: resized, normalised, cut into patches.
    pub fn preprocess(&self, image: &Rgb) -> Result<Patches> {
        let (h, w) = self.resized(image.height, image.width)?;
        let resized = resize_bicubic(image, h, w);
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        let (gh, gw) = (h / p, w / p);
        // 2. Every byte's normalised value, per channel: 256 entries, each rounded as transformers
        //    rounds it (rescale: f64 product, then f32; normalise: f32 subtraction and division).
        let table: Vec<[f32; 256]> = (0..3)
            .map(|c| {
                std::array::from_fn(|v| {
                    let rescaled = (v as f64 * self.rescale_factor) as f32;
                    (rescaled - self.image_mean[c]) / self.image_std[c]
                })
            })
            .collect();
        // 3. Patches in the merger's order.
        let row_len = 3 * t * p * p;
        let mut values = vec![0f32; gh * gw * row_len];
        for (row, out) in values.chunks_exact_mut(row_len).enumerate() {
            let (gy, gx) = merge_order(row, gw, m);
            let (y0, x0) = (gy * p, gx * p);
            for (c, table) in table.iter().enumerate() {
                for py in 0..p {
                    for px in 0..p {
                        let v = resized.data[((y0 + py) * w + x0 + px) * 3 + c];
                        for ti in 0..t {
                            out[((c * t + ti) * p + py) * p + px] = table[v as usize];
                        }
                    }
                }
            }
        }
        Ok(Patches {
            grid_thw: [1, gh, gw],
            values,
            row_len,
        })
    }
}
