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

use anyhow::Result;

use super::image::Rgb;
use super::resize::{resize_bicubic, smart_resize};
/// The processor's settings: data of the model file's header (format/config/vision.rs), read
/// from `preprocessor_config.json` by `ImageProcessor::from_json`; what is done with them is here.
pub use crate::format::ImageProcessor;

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
