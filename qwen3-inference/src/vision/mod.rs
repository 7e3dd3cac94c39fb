//! Images in: from an image file to the vectors that stand for it in the prompt, as transformers
//! computes them for Qwen3-VL and Qwen3.5 (bit for bit up to the patches but for a JPEG's
//! decoding, within f32 rounding through the tower; docs/vision.md measures each).
//!
//! ```text
//! file bytes --image::decode--> RGB bytes --ImageProcessor::preprocess--> Patches
//!   (PNG, JPEG, GIF, WebP;        (resize to a multiple of patch x merge,   (grid_thw, one row of
//!    EXIF orientation; alpha       Pillow's bicubic; rescale, normalise;     3 x T x p x p values
//!    over white)                   patches in the merger's order)            a patch)
//!
//! Patches --VisionTower::forward--> VisionOutput
//!   (patch embedding, learned positions, ViT blocks with 2-D RoPE, 2x2 merger; Qwen3-VL's
//!    DeepStack features)          merged [patches / 4, text hidden size]
//!
//! prompt with image tokens --positions::mrope_positions--> (time, height, width) per token
//!
//! template tokens + images --ImageEncoder::prompt--> the engine's prompt and PromptImages
//! ```
//!
//! Each step is checked against transformers: the processor against `Qwen2VLImageProcessorPil`
//! on images made by `scripts/vision_reference.py` (the RGB bytes, the resized size and every
//! pixel value), the tower against `Qwen3VLVisionModel` and `Qwen3_5VisionModel` on tiny random
//! towers made by `scripts/vision_tower_reference.py` (`tests/vision_tower.rs`), and the whole path
//! (a model file's tower, the text model's logits with images) against
//! `Qwen3_5ForConditionalGeneration` and `Qwen3VLForConditionalGeneration` with DeepStack
//! (`qwen3-cli/tests/vision.rs`). The tower here is the
//! textbook one (plain loops, f32 values, f64 sums).

pub mod image;
pub mod positions;
pub mod processor;
pub mod prompt;
pub mod resize;
pub mod tower;

#[cfg(test)]
mod tests;

pub use image::{decode, Rgb};
pub use processor::{ImageProcessor, Patches};
pub use prompt::{EncodedImage, ImageEncoder, MAX_SOURCE_PIXELS};
pub use tower::{Math, VisionConfig, VisionOutput, VisionTower};
