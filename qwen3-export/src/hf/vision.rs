//! A vision-language checkpoint's image input (Qwen3.5's `Qwen3_5ForConditionalGeneration`,
//! Qwen3-VL's `Qwen3VLForConditionalGeneration` and `Qwen3VLMoeForConditionalGeneration`):
//! config.json's `vision_config` and image token ids, the text config's `mrope_section`, and
//! `preprocessor_config.json`, read into the file's [`VisionInput`]; and the tower's tensors
//! as the file stores them.
//!
//! A checkpoint with a tower but without `preprocessor_config.json` exports as a text model
//! (the tower left out, and said so): without the processor's settings an image cannot be
//! turned into the tower's input as the model was trained on.

use super::checkpoint::{Checkpoint, TensorMeta};
use super::config::{get_u32, read_json};
use anyhow::{bail, Context, Result};
use qwen3_inference::format::{ImageProcessor, ModelConfig, VisionConfig, VisionInput};
use serde_json::Value;
use std::path::Path;

/// `mrope_section` when a text config does not say: Qwen3.5's (`Qwen3_5TextRotaryEmbedding`)
/// and Qwen3-VL's (`Qwen3VLTextRotaryEmbedding`).
const QWEN3_5_MROPE_SECTION: [u32; 3] = [11, 11, 10];
const QWEN3_VL_MROPE_SECTION: [u32; 3] = [24, 20, 20];

/// Qwen3-VL's checkpoints: a Qwen3 text model (exported as `Qwen3ForCausalLM` with the tower
/// beside it), and a Qwen3-MoE one (exported as `Qwen3MoeForCausalLM`).
pub const QWEN3_VL: &str = "Qwen3VLForConditionalGeneration";
pub const QWEN3_VL_MOE: &str = "Qwen3VLMoeForConditionalGeneration";

/// Reads the image input of the checkpoint in `hf_dir`, whose config.json is `json` and whose
/// text model `text` is already read: `None` for a text model, and for a tower without
/// `preprocessor_config.json`.
pub fn vision_input(
    hf_dir: &Path,
    json: &Value,
    text: &ModelConfig,
) -> Result<Option<VisionInput>> {
    let Some(vision_config) = json.get("vision_config") else {
        return Ok(None);
    };
    let processor_path = hf_dir.join("preprocessor_config.json");
    if !processor_path.exists() {
        return Ok(None);
    }
    let model_type = json
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let default_section = match model_type {
        "qwen3_5" | "qwen3_5_moe" => QWEN3_5_MROPE_SECTION,
        "qwen3_vl" | "qwen3_vl_moe" => QWEN3_VL_MROPE_SECTION,
        _ => bail!(
            "vision_config of model_type {model_type:?}: only Qwen3.5's and Qwen3-VL's towers \
             are exported"
        ),
    };
    let tower = VisionConfig::from_json(model_type, vision_config)?;
    let processor = ImageProcessor::from_json(&read_json(&processor_path)?)
        .with_context(|| format!("{}", processor_path.display()))?;
    let top = json.as_object().context("config.json is not an object")?;
    let id = |key: &str| -> Result<u32> {
        get_u32(top, key)?.with_context(|| {
            format!("{key} is missing (a vision-language config names its image tokens)")
        })
    };
    // The text config's rope block: transformers 5's `rope_parameters`, or the older
    // `rope_scaling`.
    let text_obj = super::qwen3_5::text_config(top)?;
    let rope = text_obj
        .get("rope_parameters")
        .or_else(|| text_obj.get("rope_scaling"))
        .filter(|v| !v.is_null());
    if rope.and_then(|r| r.get("mrope_interleaved")) == Some(&Value::Bool(false)) {
        bail!("mrope_interleaved false (Qwen2-VL's sections one after the other) is not supported");
    }
    let mrope_section = match rope.and_then(|r| r.get("mrope_section")) {
        None | Some(Value::Null) => default_section,
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut s = [0u32; 3];
            for (s, v) in s.iter_mut().zip(a) {
                *s = v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| format!("mrope_section: {v} is not an integer"))?;
            }
            s
        }
        Some(v) => bail!("mrope_section must be three integers, got {v}"),
    };
    let input = VisionInput {
        tower,
        processor,
        image_token_id: id("image_token_id")?,
        vision_start_token_id: id("vision_start_token_id")?,
        vision_end_token_id: id("vision_end_token_id")?,
        mrope_section,
    };
    input.validate(
        text.vocab_size,
        text.rotary_dim(),
        text.hidden_size,
        text.num_hidden_layers,
    )?;
    Ok(Some(input))
}

/// Where tower tensor `name` of the file comes from, when not from the checkpoint's tensor as it
/// is: the patch embedding's Conv3d kernel `[D, 3, T, p, p]` read as the matrix `[D, 3*T*p*p]`
/// (the same bytes). `None` for every other tensor.
pub fn source(ckpt: &Checkpoint, name: &str) -> Result<Option<TensorMeta>> {
    if name != "model.visual.patch_embed.proj.weight" {
        return Ok(None);
    }
    let mut t = ckpt.tensor(name)?;
    if let [d, rest @ ..] = &t.shape[..] {
        t.shape = vec![*d, rest.iter().product()];
    }
    Ok(Some(t))
}

/// Whether a checkpoint tensor belongs to the vision tower.
pub fn is_tower(name: &str) -> bool {
    name.starts_with("model.visual.")
}
