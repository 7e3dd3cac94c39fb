//! Images in: from an image file to the vision tower's input, exactly as transformers' processor
//! prepares it for Qwen3-VL and Qwen3.5.
//!
//! ```text
//! file bytes --image::decode--> RGB bytes --ImageProcessor::preprocess--> Patches
//!   (PNG, JPEG, GIF, WebP;        (resize to a multiple of patch x merge,   (grid_thw, one row of
//!    EXIF orientation; alpha       Pillow's bicubic; rescale, normalise;     3 x T x p x p values
//!    over white)                   patches in the merger's order)            a patch)
//! ```
//!
//! Each step is checked against transformers' `Qwen2VLImageProcessorPil` on images made by
//! `scripts/vision_reference.py` (`fixtures/vision/`): the RGB bytes, the resized size and every
//! pixel value.

pub mod image;
pub mod processor;
pub mod resize;

#[cfg(test)]
mod tests;

pub use image::{decode, Rgb};
pub use processor::{ImageProcessor, Patches};
