//! Qwen3.5 and Qwen3.6 (transformers' `models/qwen3_5`): what this family's checkpoints name and
//! store differently from Qwen3's, in one place.
//!
//! - **The config.** The hub's checkpoints are `Qwen3_5ForConditionalGeneration`, a
//!   vision-language model: the text model's keys sit under `text_config`, the vision tower's under
//!   `vision_config`. A text-only `Qwen3_5ForCausalLM` has them at the top. Both export as
//!   `Qwen3_5ForCausalLM`. Its own keys: `layer_types` (or `full_attention_interval`: every n-th
//!   layer attention, the others linear), `linear_*` (the Gated DeltaNets' sizes), and
//!   `rope_parameters.partial_rotary_factor` (0.25 when absent, `Qwen3_5TextConfig`'s default).
//!   Its `mrope_section` splits the rotary frequencies between a position's time, height and width
//!   components; for text every component is the token's position, so the split changes nothing
//!   and the rotation is plain RoPE over the rotated dimensions (`Qwen3_5TextRotaryEmbedding`'s
//!   `recomposition_frequencies` picks each frequency from one of three equal tables).
//! - **The tensors.** The text model is `model.language_model.` (the checkpoint reader renames
//!   it `model.`), the vision tower `model.visual.` and the multi-token-prediction layer `mtp.`:
//!   the text forward pass does not use these two, and the exporter leaves them out, saying how
//!   many it left. `conv1d.weight` is `[conv_dim, 1, K]`; the file stores `[conv_dim, K]`.
//!   `q_proj.weight` holds, for each head, `head_dim` rows of the query and then `head_dim` rows
//!   of the output gate (`Qwen3_5Attention`: `q_proj(x).view(.., -1, head_dim * 2).chunk(2)`); the
//!   file stores the query rows as `q_proj.weight` and the gate rows as `output_gate.weight`.
//! - **The experts** (Qwen3.5-MoE): every layer's MLP is a mixture of experts, as Qwen3-MoE's,
//!   with the chosen probabilities always renormalised, plus a shared expert every token runs
//!   (`shared_expert.*`, width `shared_expert_intermediate_size`) weighted by
//!   `sigmoid(shared_expert_gate x)`. The config has no `intermediate_size`.
//! - **The norms.** `Qwen3_5RMSNorm` multiplies by `1 + weight` (its weights start at zero); the
//!   file stores `1 + weight`, computed in f32 as transformers computes it
//!   (`1.0 + self.weight.float()`), so the forward pass's RMSNorm is Qwen3's. The Gated DeltaNet's
//!   own norm (`Qwen3_5RMSNormGated`) multiplies by its weight and is stored as it is.

use super::checkpoint::{Checkpoint, TensorMeta};
use super::config::get_u32;
use anyhow::{bail, Context, Result};
use qwen3_inference::format::{LayerType, LinearAttentionConfig, ModelConfig};
use serde_json::{Map, Value};

/// The architecture a Qwen3.5 checkpoint exports as, and a Qwen3.5-MoE one.
pub const ARCHITECTURE: &str = "Qwen3_5ForCausalLM";
pub const MOE_ARCHITECTURE: &str = "Qwen3_5MoeForCausalLM";

/// The checkpoints' `architectures` this family reads: dense, and with experts (Qwen3.5-35B-A3B,
/// Qwen3.6-35B-A3B: every MLP a mixture of experts with a shared expert).
pub const CHECKPOINTS: [&str; 2] = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"];
pub const MOE_CHECKPOINTS: [&str; 2] = [
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
];

/// Hybrid checkpoints not implemented yet, refused by name.
pub const NOT_YET: [&str; 1] = ["Qwen3NextForCausalLM"];

/// Whether a file's architecture is this family's.
fn family(c: &ModelConfig) -> bool {
    c.architecture == ARCHITECTURE || c.architecture == MOE_ARCHITECTURE
}

/// `partial_rotary_factor` when a Qwen3.5 config does not say (`Qwen3_5TextConfig.__post_init__`).
pub const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.25;

/// `head_dim` when a Qwen3.5 config does not say (`Qwen3_5TextConfig`'s default).
pub const DEFAULT_HEAD_DIM: u32 = 256;

/// The object holding the text model's keys: `text_config` of a vision-language checkpoint, or
/// the config itself.
pub fn text_config(obj: &Map<String, Value>) -> Result<&Map<String, Value>> {
    match obj.get("text_config") {
        None => Ok(obj),
        Some(Value::Object(t)) => Ok(t),
        Some(v) => bail!("text_config must be an object, got {v}"),
    }
}

/// The Gated DeltaNet layers and where they are, from the text config's keys.
pub fn linear_attention(obj: &Map<String, Value>, layers: u32) -> Result<LinearAttentionConfig> {
    let layer_types = match obj.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| {
                t.as_str().and_then(LayerType::parse).with_context(|| {
                    format!("layer_types: {t} is not a layer type this runtime runs (full_attention, linear_attention)")
                })
            })
            .collect::<Result<Vec<_>>>()?,
        None | Some(Value::Null) => {
            let every = get_u32(obj, "full_attention_interval")?.unwrap_or(4);
            if every == 0 {
                bail!("full_attention_interval is 0");
            }
            (0..layers)
                .map(|l| match (l + 1).is_multiple_of(every) {
                    true => LayerType::FullAttention,
                    false => LayerType::LinearAttention,
                })
                .collect()
        }
        Some(v) => bail!("layer_types must be a list, got {v}"),
    };
    let need =
        |key: &str, default: u32| -> Result<u32> { Ok(get_u32(obj, key)?.unwrap_or(default)) };
    // Defaults: Qwen3_5TextConfig's.
    Ok(LinearAttentionConfig {
        layer_types,
        linear_num_key_heads: need("linear_num_key_heads", 16)?,
        linear_num_value_heads: need("linear_num_value_heads", 32)?,
        linear_key_head_dim: need("linear_key_head_dim", 128)?,
        linear_value_head_dim: need("linear_value_head_dim", 128)?,
        linear_conv_kernel_dim: need("linear_conv_kernel_dim", 4)?,
    })
}

/// Parts of a checkpoint the text model does not use: the vision tower and the
/// multi-token-prediction layer. The export leaves them out.
pub fn is_other_part(name: &str) -> bool {
    name.starts_with("model.visual.") || name.starts_with("mtp.")
}

/// Whether the file stores `1 + w` for tensor `name` of a model with config `c` (its
/// `Qwen3_5RMSNorm`s: every norm but the Gated DeltaNet's own).
pub fn stores_one_plus(c: &ModelConfig, name: &str) -> bool {
    family(c) && name.ends_with("norm.weight") && !name.ends_with(".linear_attn.norm.weight")
}

/// Where the file's tensor `name` comes from in a Qwen3.5 checkpoint, when not from the tensor
/// of that name: the query or gate rows of `q_proj`, or `conv1d` without its middle axis.
/// `None` for every other tensor.
pub fn source(ckpt: &Checkpoint, c: &ModelConfig, name: &str) -> Result<Option<TensorMeta>> {
    if !family(c) {
        return Ok(None);
    }
    let hd = c.head_dim as u64;
    for (suffix, first) in [
        (".self_attn.q_proj.weight", 0),
        (".self_attn.output_gate.weight", hd),
    ] {
        if let Some(layer) = name.strip_suffix(suffix) {
            let q = ckpt.tensor(&format!("{layer}.self_attn.q_proj.weight"))?;
            return Ok(Some(Checkpoint::row_runs(&q, first, hd, 2 * hd)?));
        }
    }
    if name.ends_with(".linear_attn.conv1d.weight") {
        let mut t = ckpt.tensor(name)?;
        if let [channels, 1, k] = t.shape[..] {
            t.shape = vec![channels, k];
        }
        return Ok(Some(t));
    }
    Ok(None)
}
