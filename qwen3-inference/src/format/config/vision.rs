//! A vision-language model's image input, as the model file records it (since format version 8):
//! the vision tower's shape ([`VisionConfig`], config.json's `vision_config`), the image
//! processor's settings ([`ImageProcessor`], `preprocessor_config.json`), the ids of the tokens
//! that stand for an image in a prompt, and how M-RoPE splits the rotary frequencies between a
//! position's time, height and width ([`VisionInput`]). What is done with them is `vision/`'s.

use anyhow::{anyhow, bail, ensure, Result};
use serde_json::Value;

use crate::format::bytes::{ByteReader, ByteWriter};
use crate::format::{ExpectedTensor, TensorKind};

/// What the names of the tower's tensors in a model file start with (then transformers' names
/// in `Qwen3VLVisionModel`).
pub const TOWER_PREFIX: &str = "model.visual.";

/// Images in (Qwen3-VL, Qwen3.5): everything the file holds besides the tower's tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionInput {
    pub tower: VisionConfig,
    pub processor: ImageProcessor,
    /// `image_token_id`: `<|image_pad|>`, one per merged token of an image.
    pub image_token_id: u32,
    /// `vision_start_token_id` and `vision_end_token_id`: `<|vision_start|>` and `<|vision_end|>`
    /// around each image's pads.
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// `rope_parameters.mrope_section` of the text config: of the rotated dimensions' half, how
    /// many frequencies follow the time, height and width components, interleaved
    /// (`mrope_interleaved`: t, h, w, t, h, w, ...; `vision::positions::mrope_component`).
    pub mrope_section: [u32; 3],
}

impl VisionInput {
    /// Checks what the tower, the processor and the text model must agree on.
    pub fn validate(
        &self,
        vocab_size: u32,
        rotary_dim: u32,
        hidden_size: u32,
        layers: u32,
    ) -> Result<()> {
        let (t, p) = (&self.tower, &self.processor);
        // Qwen3-VL adds DeepStack feature j to the output of text layer j
        // (`Qwen3VLTextModel.forward`): one text layer per feature.
        ensure!(
            t.deepstack_visual_indexes.len() <= layers as usize,
            "config: {} DeepStack features for {layers} text layers",
            t.deepstack_visual_indexes.len()
        );
        ensure!(
            (t.patch_size, t.temporal_patch_size, t.spatial_merge_size)
                == (p.patch_size, p.temporal_patch_size, p.merge_size),
            "config: the tower's patch {} / temporal patch {} / merge {} differ from the \
             processor's {} / {} / {}",
            t.patch_size,
            t.temporal_patch_size,
            t.spatial_merge_size,
            p.patch_size,
            p.temporal_patch_size,
            p.merge_size
        );
        ensure!(
            t.out_hidden_size == hidden_size as usize,
            "config: the tower's out_hidden_size {} is not the text model's hidden_size {hidden_size}",
            t.out_hidden_size
        );
        for id in [
            self.image_token_id,
            self.vision_start_token_id,
            self.vision_end_token_id,
        ] {
            ensure!(
                id < vocab_size,
                "config: image token id {id} is outside the vocabulary ({vocab_size})"
            );
        }
        let sum: u64 = self.mrope_section.iter().map(|&s| s as u64).sum();
        ensure!(
            sum == rotary_dim as u64 / 2,
            "config: mrope_section {:?} sums to {sum}, not the {} rotary frequencies",
            self.mrope_section,
            rotary_dim / 2
        );
        Ok(())
    }
}

/// The tower's shape, from config.json's `vision_config` (transformers' names).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// Blocks (`depth`).
    pub depth: usize,
    /// Width of a patch's vector (`hidden_size`, D).
    pub hidden_size: usize,
    /// Width of a block's MLP (`intermediate_size`).
    pub intermediate_size: usize,
    /// Attention heads (`num_heads`); each `hidden_size / num_heads` wide.
    pub num_heads: usize,
    /// Colour channels (`in_channels`: 3).
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    /// Patches per side merged into one token (`spatial_merge_size`).
    pub spatial_merge_size: usize,
    /// Width of a merged token: the language model's hidden size (`out_hidden_size`, E).
    pub out_hidden_size: usize,
    /// Rows of the learned position table, a square grid (`num_position_embeddings`).
    pub num_position_embeddings: usize,
    /// Blocks after which a DeepStack merger's output is kept (`deepstack_visual_indexes`).
    pub deepstack_visual_indexes: Vec<usize>,
    /// Base of the 2-D rotary embedding (`rope_parameters.rope_theta`).
    pub rope_theta: f64,
}

impl VisionConfig {
    /// Reads `vision_config`. `model_type` is the checkpoint's (`qwen3_vl`, `qwen3_vl_moe`,
    /// `qwen3_5`, `qwen3_5_moe`): Qwen3-VL's towers have DeepStack (transformers' default blocks 8,
    /// 16, 24 when the key is absent), Qwen3.5's have none.
    pub fn from_json(model_type: &str, v: &Value) -> Result<VisionConfig> {
        let int = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(Value::as_u64)
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| anyhow!("vision_config.{key}: a positive integer is required"))
        };
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            bail!("vision_config.hidden_act {act:?} is not supported (Qwen3-VL and Qwen3.5 use gelu_pytorch_tanh)");
        }
        let deepstack = match v.get("deepstack_visual_indexes") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|n| n.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    anyhow!("vision_config.deepstack_visual_indexes: integers are required")
                })?,
            Some(other) => {
                bail!("vision_config.deepstack_visual_indexes: a list is required, got {other}")
            }
            None if model_type.starts_with("qwen3_vl") => vec![8, 16, 24],
            None => Vec::new(),
        };
        let rope = v.get("rope_parameters");
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
        {
            if kind != "axial" {
                bail!("vision_config.rope_parameters.rope_type {kind:?} is not supported (axial)");
            }
        }
        let c = VisionConfig {
            depth: int("depth")?,
            hidden_size: int("hidden_size")?,
            intermediate_size: int("intermediate_size")?,
            num_heads: int("num_heads")?,
            in_channels: v.get("in_channels").and_then(Value::as_u64).unwrap_or(3) as usize,
            patch_size: int("patch_size")?,
            temporal_patch_size: int("temporal_patch_size")?,
            spatial_merge_size: int("spatial_merge_size")?,
            out_hidden_size: int("out_hidden_size")?,
            num_position_embeddings: int("num_position_embeddings")?,
            deepstack_visual_indexes: deepstack,
            rope_theta: rope
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(10000.0),
        };
        c.validate()?;
        Ok(c)
    }

    /// The invariants the tower relies on (from config.json or a model file's header).
    pub fn validate(&self) -> Result<()> {
        // Bounds no real tower comes near (Qwen3.5's: 27 blocks of 1152, patch 16), so that the
        // sizes' products cannot overflow.
        ensure!(
            self.depth <= 256
                && self.hidden_size <= 1 << 16
                && self.intermediate_size <= 1 << 18
                && self.num_heads <= 1024
                && self.patch_size <= 1024
                && self.temporal_patch_size <= 64
                && self.spatial_merge_size <= 64
                && self.out_hidden_size <= 1 << 20
                && self.num_position_embeddings <= 1 << 20
                && self.deepstack_visual_indexes.len() <= self.depth,
            "vision_config: a size is implausibly large ({self:?})"
        );
        ensure!(
            [
                self.depth,
                self.hidden_size,
                self.intermediate_size,
                self.num_heads,
                self.patch_size,
                self.temporal_patch_size,
                self.spatial_merge_size,
                self.out_hidden_size,
                self.num_position_embeddings
            ]
            .iter()
            .all(|&n| n > 0),
            "vision_config: a size is 0 ({self:?})"
        );
        ensure!(
            self.rope_theta.is_finite() && self.rope_theta > 0.0,
            "vision_config: rope_theta {} is not a positive number",
            self.rope_theta
        );
        ensure!(
            self.in_channels == 3,
            "vision_config.in_channels {} (an RGB tower has 3)",
            self.in_channels
        );
        ensure!(
            self.hidden_size.is_multiple_of(self.num_heads)
                && (self.hidden_size / self.num_heads).is_multiple_of(4),
            "vision_config: hidden_size {} over {} heads is not a whole head a multiple of 4 wide \
             (the 2-D rotary embedding splits each head in four)",
            self.hidden_size,
            self.num_heads
        );
        let side = self.position_grid_side();
        ensure!(
            side * side == self.num_position_embeddings,
            "vision_config.num_position_embeddings {} is not a square grid",
            self.num_position_embeddings
        );
        if let Some(&l) = self
            .deepstack_visual_indexes
            .iter()
            .find(|&&l| l >= self.depth)
        {
            bail!(
                "vision_config.deepstack_visual_indexes: block {l} of {} blocks",
                self.depth
            );
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Side of the learned position grid: sqrt(num_position_embeddings).
    pub fn position_grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Values in one patch: 3 x T x p x p.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

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
                        anyhow!(
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
                        anyhow!(
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
        p.validate()?;
        Ok(p)
    }

    /// The invariants preprocessing relies on (from preprocessor_config.json or a model file's
    /// header).
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.patch_size > 0
                && self.merge_size > 0
                && self.temporal_patch_size > 0
                && self.min_pixels > 0,
            "preprocessor_config.json: a size is 0 ({self:?})"
        );
        // Bounds no real tower comes near, so that the sizes' products cannot overflow.
        if self.patch_size > 1024 || self.merge_size > 64 || self.temporal_patch_size > 64 {
            bail!(
                "preprocessor_config.json: patch {} / merge {} / temporal patch {} out of range",
                self.patch_size,
                self.merge_size,
                self.temporal_patch_size
            );
        }
        // Qwen3-VL's and Qwen3.5's own bound is 2^24 (16 megapixels, 65536 patches).
        if self.max_pixels > 1 << 26 {
            bail!(
                "preprocessor_config.json: {} maximum pixels is over 2^26",
                self.max_pixels
            );
        }
        if self.min_pixels > self.max_pixels {
            bail!(
                "preprocessor_config.json: {} minimum pixels over {} maximum",
                self.min_pixels,
                self.max_pixels
            );
        }
        if self.image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            bail!(
                "preprocessor_config.json: image_std {:?} has a zero",
                self.image_std
            );
        }
        ensure!(
            self.image_mean.iter().all(|m| m.is_finite())
                && self.rescale_factor.is_finite()
                && self.rescale_factor > 0.0,
            "preprocessor_config.json: image_mean {:?} or rescale_factor {} is not a finite number",
            self.image_mean,
            self.rescale_factor
        );
        Ok(())
    }
}

impl VisionInput {
    /// Appends the vision block (format version 8; docs/format.md): the tower's sizes, its
    /// DeepStack blocks and rotary base, the processor's pixel bounds, mean, std and rescale
    /// factor (its patch, temporal patch and merge are the tower's), the image tokens' ids, and
    /// `mrope_section`.
    pub fn encode(&self, w: &mut ByteWriter) {
        let t = &self.tower;
        for v in [
            t.depth,
            t.hidden_size,
            t.intermediate_size,
            t.num_heads,
            t.in_channels,
            t.patch_size,
            t.temporal_patch_size,
            t.spatial_merge_size,
            t.out_hidden_size,
            t.num_position_embeddings,
        ] {
            w.u32(v as u32);
        }
        w.u32(t.deepstack_visual_indexes.len() as u32);
        for &l in &t.deepstack_visual_indexes {
            w.u32(l as u32);
        }
        w.f64(t.rope_theta);
        let p = &self.processor;
        w.u64(p.min_pixels as u64);
        w.u64(p.max_pixels as u64);
        for v in p.image_mean.iter().chain(&p.image_std) {
            w.f32(*v);
        }
        w.f64(p.rescale_factor);
        for v in [
            self.image_token_id,
            self.vision_start_token_id,
            self.vision_end_token_id,
        ]
        .iter()
        .chain(&self.mrope_section)
        {
            w.u32(*v);
        }
    }

    /// Reads what [`VisionInput::encode`] wrote; the caller validates it with the text model's
    /// sizes ([`VisionInput::validate`]).
    pub fn decode(r: &mut ByteReader<'_>) -> Result<VisionInput> {
        let mut size = |what: &str| -> Result<usize> { Ok(r.u32(what)? as usize) };
        let depth = size("vision depth")?;
        let hidden_size = size("vision hidden_size")?;
        let intermediate_size = size("vision intermediate_size")?;
        let num_heads = size("vision num_heads")?;
        let in_channels = size("vision in_channels")?;
        let patch_size = size("vision patch_size")?;
        let temporal_patch_size = size("vision temporal_patch_size")?;
        let spatial_merge_size = size("vision spatial_merge_size")?;
        let out_hidden_size = size("vision out_hidden_size")?;
        let num_position_embeddings = size("vision num_position_embeddings")?;
        let n = r.count(4, "deepstack_visual_indexes count")?;
        let mut deepstack_visual_indexes = Vec::with_capacity(n);
        for _ in 0..n {
            deepstack_visual_indexes.push(r.u32("deepstack_visual_indexes")? as usize);
        }
        let tower = VisionConfig {
            depth,
            hidden_size,
            intermediate_size,
            num_heads,
            in_channels,
            patch_size,
            temporal_patch_size,
            spatial_merge_size,
            out_hidden_size,
            num_position_embeddings,
            deepstack_visual_indexes,
            rope_theta: r.f64("vision rope_theta")?,
        };
        tower.validate()?;
        let min_pixels = r.u64("min_pixels")?;
        let max_pixels = r.u64("max_pixels")?;
        let mut triple =
            |what: &str| -> Result<[f32; 3]> { Ok([r.f32(what)?, r.f32(what)?, r.f32(what)?]) };
        let image_mean = triple("image_mean")?;
        let image_std = triple("image_std")?;
        let processor = ImageProcessor {
            patch_size,
            temporal_patch_size,
            merge_size: spatial_merge_size,
            min_pixels: usize::try_from(min_pixels)?,
            max_pixels: usize::try_from(max_pixels)?,
            image_mean,
            image_std,
            rescale_factor: r.f64("rescale_factor")?,
        };
        processor.validate()?;
        Ok(VisionInput {
            tower,
            processor,
            image_token_id: r.u32("image_token_id")?,
            vision_start_token_id: r.u32("vision_start_token_id")?,
            vision_end_token_id: r.u32("vision_end_token_id")?,
            mrope_section: [
                r.u32("mrope_section")?,
                r.u32("mrope_section")?,
                r.u32("mrope_section")?,
            ],
        })
    }
}

impl VisionConfig {
    /// The tower's tensors in the model file, in the module's order, under the checkpoint's
    /// names (`model.visual.` + transformers' names in `Qwen3VLVisionModel`). The patch
    /// embedding's Conv3d kernel `[D, 3, T, p, p]` is stored as the matrix it is used as,
    /// `[D, 3*T*p*p]`; the learned position table is f32 like the norms (it is read by rows,
    /// interpolated, never multiplied).
    pub fn tensors(&self) -> Vec<ExpectedTensor> {
        let (d, i, e) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.out_hidden_size as u64,
        );
        let m4 = d * (self.spatial_merge_size * self.spatial_merge_size) as u64;
        let one = |name: String, shape: Vec<u64>, kind: TensorKind| ExpectedTensor {
            name: format!("{TOWER_PREFIX}{name}"),
            shape,
            kind,
        };
        let mut t = Vec::new();
        let linear = |t: &mut Vec<ExpectedTensor>, name: &str, out: u64, inp: u64| {
            t.push(one(
                format!("{name}.weight"),
                vec![out, inp],
                TensorKind::Matrix,
            ));
            t.push(one(format!("{name}.bias"), vec![out], TensorKind::Bias));
        };
        let norm = |t: &mut Vec<ExpectedTensor>, name: &str, width: u64| {
            t.push(one(format!("{name}.weight"), vec![width], TensorKind::Norm));
            t.push(one(format!("{name}.bias"), vec![width], TensorKind::Bias));
        };
        linear(&mut t, "patch_embed.proj", d, self.patch_len() as u64);
        t.push(one(
            "pos_embed.weight".into(),
            vec![self.num_position_embeddings as u64, d],
            TensorKind::Param,
        ));
        for l in 0..self.depth {
            let b = format!("blocks.{l}");
            norm(&mut t, &format!("{b}.norm1"), d);
            norm(&mut t, &format!("{b}.norm2"), d);
            linear(&mut t, &format!("{b}.attn.qkv"), 3 * d, d);
            linear(&mut t, &format!("{b}.attn.proj"), d, d);
            linear(&mut t, &format!("{b}.mlp.linear_fc1"), i, d);
            linear(&mut t, &format!("{b}.mlp.linear_fc2"), d, i);
        }
        // The final merger normalises each patch (D wide), DeepStack's mergers the 2x2
        // patches side by side (4D wide).
        norm(&mut t, "merger.norm", d);
        linear(&mut t, "merger.linear_fc1", m4, m4);
        linear(&mut t, "merger.linear_fc2", e, m4);
        for j in 0..self.deepstack_visual_indexes.len() {
            let name = format!("deepstack_merger_list.{j}");
            norm(&mut t, &format!("{name}.norm"), m4);
            linear(&mut t, &format!("{name}.linear_fc1"), m4, m4);
            linear(&mut t, &format!("{name}.linear_fc2"), e, m4);
        }
        t
    }
}
