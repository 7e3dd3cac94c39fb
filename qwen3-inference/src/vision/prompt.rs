//! A prompt with images, from the chat template's tokens to what the engine runs, as
//! transformers' `Qwen3VLProcessor` prepares it:
//!
//! 1. each image file is decoded, preprocessed and encoded by the model's tower
//!    ([`ImageEncoder::encode`]): a grid of patches and its merged vectors;
//! 2. the chat template writes `<|vision_start|><|image_pad|><|vision_end|>` for each image;
//!    the one `<|image_pad|>` becomes as many as the image has merged tokens
//!    ([`ImageEncoder::prompt`]; the processor does the same to the text before tokenizing);
//! 3. the prompt's M-RoPE positions follow from where the pads are and the grids
//!    (`positions::mrope_positions`), and each image's vectors go to its pads' rows
//!    ([`PromptImages`]).

use anyhow::{anyhow, bail, ensure, Result};
use std::sync::{Arc, OnceLock};

use super::image::decode;
use super::positions::mrope_positions;
use super::tower::{Math, VisionTower};
use crate::engine::{PromptImage, PromptImages};
use crate::format::{ModelFile, VisionInput};

/// Pixels an image file may hold before it is resized (a decoded image is 3 bytes a pixel):
/// 64 megapixels, a large camera's photo.
pub const MAX_SOURCE_PIXELS: u64 = 64 << 20;

/// One image, encoded.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedImage {
    /// `(1, H, W)` in patches.
    pub grid: [usize; 3],
    /// `[H/merge * W/merge, hidden]`: what the text model reads in place of its pads.
    pub vectors: Vec<f32>,
    /// Qwen3-VL's DeepStack features, each shaped as `vectors` (empty for Qwen3.5).
    pub deepstack: Vec<Vec<f32>>,
}

impl EncodedImage {
    /// Merged tokens: the `<|image_pad|>`s it takes in the prompt.
    pub fn tokens(&self, hidden: usize) -> usize {
        self.vectors.len() / hidden
    }
}

/// A model file's image input: its tower and the settings around it.
pub struct ImageEncoder {
    tower: Tower,
    input: VisionInput,
}

/// The tower's weights, copied out of the file (`VisionTower::from_file`) when the encoder is
/// made, or when it meets its first image.
enum Tower {
    Copied(VisionTower),
    /// [`ImageEncoder::at_first_image`]: the file, held open, and the tower once copied (or
    /// why it could not be).
    AtFirstImage {
        file: Arc<ModelFile>,
        tower: OnceLock<std::result::Result<VisionTower, String>>,
    },
}

impl ImageEncoder {
    /// The encoder of a model file with a vision tower, its tower copied now; `None` for a
    /// text-only file.
    pub fn from_file(file: &ModelFile) -> Result<Option<ImageEncoder>> {
        let Some(input) = file.config().vision.clone() else {
            return Ok(None);
        };
        let tower = VisionTower::from_file(file)?.expect("a config with vision has a tower");
        Ok(Some(ImageEncoder {
            tower: Tower::Copied(tower),
            input,
        }))
    }

    /// The encoder of a model file with a vision tower, its tower copied when the first image
    /// comes (the first [`Self::encode`] waits for the copy; others meanwhile wait with it);
    /// `None` for a text-only file. A server that may never see an image keeps the tower's
    /// weights in the file's mapping only: Qwen3-VL-2B's q8 tower is 0.3 GB, and as much again
    /// in the order the AVX-512 kernels read. The file's reader has checked the tower's tensors
    /// against its config at open.
    pub fn at_first_image(file: Arc<ModelFile>) -> Option<ImageEncoder> {
        let input = file.config().vision.clone()?;
        Some(ImageEncoder {
            tower: Tower::AtFirstImage {
                file,
                tower: OnceLock::new(),
            },
            input,
        })
    }

    /// The tower, copied now if it was left for the first image.
    fn tower(&self) -> Result<&VisionTower> {
        match &self.tower {
            Tower::Copied(t) => Ok(t),
            Tower::AtFirstImage { file, tower } => tower
                .get_or_init(|| match VisionTower::from_file(file) {
                    Ok(Some(t)) => Ok(t),
                    Ok(None) => Err("the file has no vision tower".into()),
                    Err(e) => Err(format!("{e:#}")),
                })
                .as_ref()
                .map_err(|e| anyhow!("the vision tower: {e}")),
        }
    }

    /// The file's image settings.
    pub fn input(&self) -> &VisionInput {
        &self.input
    }

    /// An image file's bytes (PNG, JPEG, GIF, WebP) through the processor and the tower.
    /// `max_source_pixels` bounds the decoded image (before it is resized), `max_tokens` the
    /// merged tokens it may make (the context's room): checked before the tower runs, its
    /// costliest step.
    pub fn encode(
        &self,
        bytes: &[u8],
        max_source_pixels: u64,
        max_tokens: usize,
    ) -> Result<EncodedImage> {
        let rgb = decode(bytes, max_source_pixels)?;
        let (h, w) = self.input.processor.resized(rgb.height, rgb.width)?;
        let per_token = self.input.tower.patch_size * self.input.tower.spatial_merge_size;
        let tokens = (h / per_token) * (w / per_token);
        ensure!(
            tokens <= max_tokens,
            "a {}x{} image makes {tokens} tokens, more than the {max_tokens} the context has room for",
            rgb.width,
            rgb.height
        );
        let patches = self.input.processor.preprocess(&rgb)?;
        let out = self
            .tower()?
            .forward_with(&patches.values, &[patches.grid_thw], Math::Fast)?;
        Ok(EncodedImage {
            grid: patches.grid_thw,
            vectors: out.merged,
            deepstack: out.deepstack,
        })
    }

    /// The prompt the engine runs for template tokens `ids` that hold one `<|image_pad|>` per
    /// image, in order: each pad repeated for its image's merged tokens, and the images'
    /// vectors and positions.
    pub fn prompt(
        &self,
        ids: &[u32],
        images: Vec<EncodedImage>,
    ) -> Result<(Vec<u32>, PromptImages)> {
        let pad = self.input.image_token_id;
        let places = ids.iter().filter(|&&t| t == pad).count();
        ensure!(
            places == images.len(),
            "the prompt has {places} places for an image (<|image_pad|>) but {} images were given",
            images.len()
        );
        let hidden = self.input.tower.out_hidden_size;
        let mut prompt = Vec::with_capacity(ids.len());
        let mut placed = Vec::with_capacity(images.len());
        let mut images = images.into_iter();
        for &t in ids {
            if t != pad {
                prompt.push(t);
                continue;
            }
            let image = images.next().expect("counted above");
            let n = image.tokens(hidden);
            if n == 0 {
                bail!("an image encoded to no tokens");
            }
            placed.push((prompt.len(), image));
            prompt.extend(std::iter::repeat_n(pad, n));
        }
        let is_image: Vec<bool> = prompt.iter().map(|&t| t == pad).collect();
        let grids: Vec<[usize; 3]> = placed.iter().map(|(_, im)| im.grid).collect();
        let positions = mrope_positions(&is_image, &grids, self.input.tower.spatial_merge_size)?;
        let images = placed
            .into_iter()
            .map(|(row, im)| PromptImage::new(row, im.vectors, im.deepstack))
            .collect();
        Ok((
            prompt,
            PromptImages {
                images,
                positions: positions.thw,
                next: positions.next,
            },
        ))
    }
}
