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
//!   the exporter keeps the tower when the checkpoint has its `preprocessor_config.json`
//!   (`hf/vision.rs`) and leaves the MTP layer out (the forward pass does not use it), saying
//!   how many tensors it left. `conv1d.weight` is `[conv_dim, 1, K]`; the file stores `[conv_dim, K]`.
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
//! - **Qwen3-Next** (`Qwen3NextForCausalLM`, transformers' `models/qwen3_next`: Qwen3.5-MoE's
//!   design one release earlier, text only, keys at the top of its config) computes the same
//!   layers, and is kept under its own name: its router renormalises only with
//!   `norm_topk_prob`, and `decoder_sparse_step` and `mlp_only_layers` may leave layers dense.
//!   Its Gated DeltaNets store their projections fused per key head: `in_proj_qkvz` holds, for
//!   each key head, its query rows, its key rows, and the value rows and then the `z` rows of
//!   the value heads that share it; `in_proj_ba` each key head's `b` rows, then its `a` rows
//!   (`Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`). The file stores Qwen3.5's
//!   `in_proj_qkv` (every query, then every key, then every value row), `in_proj_z`,
//!   `in_proj_b` and `in_proj_a`, gathered from them.

use super::checkpoint::{Checkpoint, TensorMeta};
use super::config::get_u32;
use anyhow::{bail, Context, Result};
use qwen3_inference::format::architecture::QWEN3_NEXT;
use qwen3_inference::format::{
    Architecture, LayerType, LinearAttentionConfig, ModelConfig, ValueHeads,
};
use serde_json::{Map, Value};

/// The checkpoints' `architectures` this family reads: dense, and with experts (Qwen3.5-35B-A3B,
/// Qwen3.6-35B-A3B: every MLP a mixture of experts with a shared expert).
pub const CHECKPOINTS: [&str; 2] = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"];
pub const MOE_CHECKPOINTS: [&str; 2] = [
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
];

/// Whether a file's architecture is this family's (Qwen3.5, Qwen3.5-MoE, Qwen3-Next: Gated
/// DeltaNets among gated attention layers).
fn family(c: &ModelConfig) -> bool {
    Architecture::named(&c.architecture).is_some_and(|a| a.linear_attention)
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
            LayerType::by_interval(layers, every)
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
        value_heads: ValueHeads::Grouped,
    })
}

/// Parts of a checkpoint the text model does not use: the vision tower and the
/// multi-token-prediction layer. The export leaves them out (the tower only when the file cannot
/// carry it: `hf/vision.rs`).
pub fn is_other_part(name: &str) -> bool {
    name.starts_with("model.visual.") || name.starts_with("mtp.")
}

/// Checkpoint tensors the file's tensors are gathered from, not stored under their own names
/// (Qwen3-Next's fused projections).
pub fn is_read_through(name: &str) -> bool {
    name.ends_with(".linear_attn.in_proj_qkvz.weight")
        || name.ends_with(".linear_attn.in_proj_ba.weight")
}

/// Whether the file stores `1 + w` for tensor `name` of a model with config `c` (its
/// `Qwen3_5RMSNorm`s: every norm but the Gated DeltaNet's own).
pub fn stores_one_plus(c: &ModelConfig, name: &str) -> bool {
    // The tower's are LayerNorms, stored as they are.
    family(c)
        && name.ends_with("norm.weight")
        && !name.ends_with(".linear_attn.norm.weight")
        && !super::vision::is_tower(name)
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
    if c.architecture == QWEN3_NEXT.name {
        if let Some(t) = next_projection(ckpt, c, name)? {
            return Ok(Some(t));
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

/// Qwen3-Next's Gated DeltaNet projections, gathered from its fused `in_proj_qkvz` and
/// `in_proj_ba` (the module's text); `None` for every other tensor.
fn next_projection(ckpt: &Checkpoint, c: &ModelConfig, name: &str) -> Result<Option<TensorMeta>> {
    let Some(la) = &c.linear_attention else {
        return Ok(None);
    };
    let (dk, dv) = (
        la.linear_key_head_dim as u64,
        la.linear_value_head_dim as u64,
    );
    let (kh, vh) = (
        la.linear_num_key_heads as u64,
        la.linear_num_value_heads as u64,
    );
    if kh == 0 || vh % kh != 0 {
        bail!("linear_num_value_heads {vh} is not a multiple of linear_num_key_heads {kh}");
    }
    // Per key head: q (dk rows), k (dk), v (g dv), z (g dv); and b (g), a (g).
    let g = vh / kh;
    let per_head = (g.checked_mul(dv))
        .and_then(|v| v.checked_add(dk))
        .and_then(|v| v.checked_mul(2))
        .context("linear attention's sizes overflow")?;
    let fused =
        |layer: &str, which: &str| ckpt.tensor(&format!("{layer}.linear_attn.{which}.weight"));
    if let Some(layer) = name.strip_suffix(".linear_attn.in_proj_qkv.weight") {
        let qkvz = fused(layer, "in_proj_qkvz")?;
        let parts = [(0, dk), (dk, dk), (2 * dk, g * dv)]
            .into_iter()
            .map(|(first, run)| Checkpoint::row_runs(&qkvz, first, run, per_head))
            .collect::<Result<Vec<_>>>()?;
        return Checkpoint::concat_rows(parts).map(Some);
    }
    if let Some(layer) = name.strip_suffix(".linear_attn.in_proj_z.weight") {
        let qkvz = fused(layer, "in_proj_qkvz")?;
        return Checkpoint::row_runs(&qkvz, 2 * dk + g * dv, g * dv, per_head).map(Some);
    }
    for (suffix, first) in [
        (".linear_attn.in_proj_b.weight", 0),
        (".linear_attn.in_proj_a.weight", g),
    ] {
        if let Some(layer) = name.strip_suffix(suffix) {
            let ba = fused(layer, "in_proj_ba")?;
            return Checkpoint::row_runs(&ba, first, g, 2 * g).map(Some);
        }
    }
    Ok(None)
}
