//! The Qwen3 model: its weights, borrowed from the model file, and the forward pass.
//!
//! The structs mirror HuggingFace's modules in `transformers/models/qwen3/modeling_qwen3.py`
//! (`Qwen3ForCausalLM` > `Qwen3Model` > `Qwen3DecoderLayer` > `Qwen3Attention` / `Qwen3MLP`), so
//! a reader can hold the two side by side. The weights are [`TensorView`]s into the mmapped file:
//! loading copies nothing. The forward pass itself lives in [`session`], which owns the KV cache.
//! See docs/transformer.md.

mod session;
#[cfg(test)]
pub(crate) mod test_model;

pub use session::Session;

use crate::format::reader::{TensorData, TensorView};
use crate::format::{ModelConfig, ModelFile};
use anyhow::{bail, Result};

/// `Qwen3ForCausalLM`: the decoder stack plus the classifier.
pub struct Model<'a> {
    pub config: &'a ModelConfig,
    /// `model.embed_tokens.weight`: `[vocab, hidden]`.
    pub embed_tokens: TensorView<'a>,
    pub layers: Vec<Qwen3DecoderLayer<'a>>,
    /// `model.norm.weight`: `[hidden]`, the final RMSNorm.
    pub norm: &'a [f32],
    /// `lm_head.weight`: `[vocab, hidden]`. With `tie_word_embeddings` (Qwen3-0.6B) this is the
    /// embedding table itself, read a second time as the classifier.
    pub lm_head: TensorView<'a>,
}

/// `Qwen3DecoderLayer`: pre-norm attention and pre-norm MLP, each with a residual connection.
pub struct Qwen3DecoderLayer<'a> {
    /// `input_layernorm.weight`: `[hidden]`.
    pub input_layernorm: &'a [f32],
    pub self_attn: Qwen3Attention<'a>,
    /// `post_attention_layernorm.weight`: `[hidden]`.
    pub post_attention_layernorm: &'a [f32],
    pub mlp: Qwen3MLP<'a>,
}

/// `Qwen3Attention`: projections and the per-head q/k RMSNorms (new in Qwen3, absent in Qwen2).
pub struct Qwen3Attention<'a> {
    /// `[n_heads * head_dim, hidden]`
    pub q_proj: TensorView<'a>,
    /// `[n_kv_heads * head_dim, hidden]`
    pub k_proj: TensorView<'a>,
    /// `[n_kv_heads * head_dim, hidden]`
    pub v_proj: TensorView<'a>,
    /// `[hidden, n_heads * head_dim]`
    pub o_proj: TensorView<'a>,
    /// `[head_dim]`, shared by every head.
    pub q_norm: &'a [f32],
    /// `[head_dim]`
    pub k_norm: &'a [f32],
}

/// `Qwen3MLP`: SwiGLU, `down(silu(gate(x)) * up(x))`.
pub struct Qwen3MLP<'a> {
    /// `[intermediate, hidden]`
    pub gate_proj: TensorView<'a>,
    /// `[intermediate, hidden]`
    pub up_proj: TensorView<'a>,
    /// `[hidden, intermediate]`
    pub down_proj: TensorView<'a>,
}

impl<'a> Model<'a> {
    /// Borrows every weight from `file`. The file was validated when opened (every tensor
    /// present, with the shape and dtype the config implies), so this only looks names up.
    pub fn load(file: &'a ModelFile) -> Result<Model<'a>> {
        let config = file.config();
        if config.architecture != "Qwen3ForCausalLM" {
            bail!(
                "{}: architecture {} is not Qwen3ForCausalLM",
                file.path().display(),
                config.architecture
            );
        }
        let norm = |name: &str| -> Result<&'a [f32]> {
            match file.tensor(name)?.data {
                TensorData::F32(v) => Ok(v),
                _ => bail!("{}: {name} is not stored as f32", file.path().display()),
            }
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers as usize);
        for l in 0..config.num_hidden_layers {
            let p = format!("model.layers.{l}");
            layers.push(Qwen3DecoderLayer {
                input_layernorm: norm(&format!("{p}.input_layernorm.weight"))?,
                self_attn: Qwen3Attention {
                    q_proj: file.tensor(&format!("{p}.self_attn.q_proj.weight"))?,
                    k_proj: file.tensor(&format!("{p}.self_attn.k_proj.weight"))?,
                    v_proj: file.tensor(&format!("{p}.self_attn.v_proj.weight"))?,
                    o_proj: file.tensor(&format!("{p}.self_attn.o_proj.weight"))?,
                    q_norm: norm(&format!("{p}.self_attn.q_norm.weight"))?,
                    k_norm: norm(&format!("{p}.self_attn.k_norm.weight"))?,
                },
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
                mlp: Qwen3MLP {
                    gate_proj: file.tensor(&format!("{p}.mlp.gate_proj.weight"))?,
                    up_proj: file.tensor(&format!("{p}.mlp.up_proj.weight"))?,
                    down_proj: file.tensor(&format!("{p}.mlp.down_proj.weight"))?,
                },
            });
        }
        let embed_tokens = file.tensor("model.embed_tokens.weight")?;
        let lm_head = if config.tie_word_embeddings {
            embed_tokens
        } else {
            file.tensor("lm_head.weight")?
        };
        Ok(Model {
            config,
            embed_tokens,
            layers,
            norm: norm("model.norm.weight")?,
            lm_head,
        })
    }

    /// Bytes of KV cache a session of `context_len` positions needs: keys and values, f32, for
    /// every layer and kv head.
    pub fn kv_cache_bytes(&self, context_len: usize) -> u64 {
        let c = self.config;
        2 * c.num_hidden_layers as u64
            * c.num_key_value_heads as u64
            * c.head_dim as u64
            * context_len as u64
            * 4
    }
}
