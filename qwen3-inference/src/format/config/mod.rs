//! The config block of the model file: everything the forward pass and the sampler need from
//! config.json and generation_config.json, plus how the matrices are stored. Its bytes in the
//! file are `codec.rs`'s.

use super::DType;
use anyhow::{bail, Result};

/// Sampling defaults a model ships in generation_config.json. Each is optional: a checkpoint may
/// omit any of them, and then the sampler's own default applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `do_sample: false` in generation_config.json means greedy decoding.
    pub do_sample: Option<bool>,
}

/// The model's hyper-parameters, named as in HuggingFace's `Qwen3Config` / `Qwen2Config`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `architectures[0]` of config.json: one of [`ARCHITECTURES`]' names.
    pub architecture: String,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_hidden_layers: u32,
    pub num_attention_heads: u32,
    pub num_key_value_heads: u32,
    /// Width of one attention head. Qwen3 sets it explicitly (0.6B: 128, not 1024/16).
    pub head_dim: u32,
    pub vocab_size: u32,
    pub max_position_embeddings: u32,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends a generation (config.json and generation_config.json, merged).
    pub eos_token_ids: Vec<u32>,
    pub generation: GenerationDefaults,
    /// How the matrices are stored (norm weights are always f32).
    pub dtype: DType,
    /// Values per q8 group along each row (0 when `dtype` is not q8).
    pub group_size: u32,
    /// q, k and v projections add a bias (`q_proj.bias`, ...): Qwen2's attention (always on in
    /// transformers' `Qwen2Attention`; `attention_bias` in `Qwen3Config`, off in every Qwen3).
    pub attention_bias: bool,
    /// Each head of q and k is RMS-normalised before RoPE (`q_norm`, `k_norm`): new in Qwen3,
    /// absent in Qwen2.
    pub qk_norm: bool,
    /// How RoPE's frequencies are scaled for long contexts (`rope_scaling` in config.json).
    /// Since format version 5.
    pub rope_scaling: RopeScaling,
    /// Qwen3-MoE: which layers route each token to a few of many experts, and how. `None` for
    /// dense models. Since format version 5.
    pub moe: Option<MoeConfig>,
    /// An embedding model (Qwen3-Embedding): no classifier; a text's vector is the final norm's
    /// output at its last token. `None` for a language model. Since format version 6.
    pub embedding: Option<EmbeddingConfig>,
    /// The share of each head's dimensions that RoPE rotates (the first `rotary_dim()` of
    /// `head_dim`; the rest pass unrotated): 1 for Qwen2 and Qwen3, 0.25 for Qwen3.5 (its
    /// `rope_parameters.partial_rotary_factor`). Since format version 7.
    pub partial_rotary_factor: f64,
    /// Attention's output is gated per value: `o_proj(attn * sigmoid(gate))`, the gate a second
    /// projection of the layer's input (Qwen3.5's `Qwen3_5Attention`, Qwen3-Next's
    /// `attn_output_gate`). The file stores the gate's rows of HF's `q_proj` as their own matrix,
    /// `self_attn.output_gate.weight`. Since format version 7.
    pub attn_output_gate: bool,
    /// Qwen3.5: which layers run a Gated DeltaNet instead of attention, and its sizes. `None`
    /// when every layer is attention. Since format version 7.
    pub linear_attention: Option<LinearAttentionConfig>,
    /// Images in (Qwen3.5's and Qwen3-VL's vision tower): its shape, the image processor's
    /// settings, the image tokens' ids, M-RoPE's split. `None` for a text-only file. Since
    /// format version 8.
    pub vision: Option<VisionInput>,
}

/// A layer's token mixer, as `layer_types` in Qwen3.5's config.json names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// `full_attention`: softmax attention over a KV cache (gated in Qwen3.5).
    FullAttention,
    /// `linear_attention`: a Gated DeltaNet, a fixed-size state per sequence
    /// (`model/gated_delta_net.rs` has the math).
    LinearAttention,
}

impl LayerType {
    /// The name config.json gives it.
    pub fn name(self) -> &'static str {
        match self {
            LayerType::FullAttention => "full_attention",
            LayerType::LinearAttention => "linear_attention",
        }
    }

    /// The layers of a model without `layer_types`: every `every`-th attention, the others
    /// linear (`Qwen3_5TextConfig`'s and llama.cpp's reading of `full_attention_interval`).
    pub fn by_interval(layers: u32, every: u32) -> Vec<LayerType> {
        (0..layers)
            .map(|l| match (l + 1).is_multiple_of(every) {
                true => LayerType::FullAttention,
                false => LayerType::LinearAttention,
            })
            .collect()
    }

    /// The layer type config.json calls `name`, if this runtime runs it.
    pub fn parse(name: &str) -> Option<LayerType> {
        [LayerType::FullAttention, LayerType::LinearAttention]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

/// The Gated DeltaNet layers of a hybrid model (`Qwen3_5TextConfig`'s `linear_*` keys), and
/// where they are.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttentionConfig {
    /// One per layer: `layer_types` (or, in older configs, every `full_attention_interval`-th
    /// layer attention and the others linear).
    pub layer_types: Vec<LayerType>,
    /// Query and key heads.
    pub linear_num_key_heads: u32,
    /// Value heads: a multiple of the key heads, which they share as GQA shares KV heads.
    pub linear_num_value_heads: u32,
    pub linear_key_head_dim: u32,
    pub linear_value_head_dim: u32,
    /// The causal convolution's width over the q, k, v channels.
    pub linear_conv_kernel_dim: u32,
    /// The order of the value heads in the projections' rows (and `out_proj`'s columns).
    pub value_heads: ValueHeads,
}

/// The order of a Gated DeltaNet's value heads, which decides the key head each one reads.
///
/// With `vh` value heads sharing `kh` key heads (`r = vh / kh` a key head), HuggingFace's
/// checkpoints keep each key head's value heads together; llama.cpp's converter reorders them so
/// that the key heads repeat (`_LinearAttentionVReorderBase` in `conversion/qwen.py`: ggml's
/// broadcast repeats a tensor whole, `[K0, K1, K0, K1, ...]`):
///
/// ```text
/// Grouped (HF):   v0 v1 | v2 v3      value head h reads key head h / r
/// Tiled (GGUF):   v0 v2 | v1 v3      value head h reads key head h % kh
/// ```
///
/// Every per-value-head tensor of a `qwen35` GGUF is in the tiled order (`in_proj_qkv`'s value
/// rows, `in_proj_z`, `a`, `b`, `A_log`, `dt_bias`, the convolution's value channels, `out_proj`'s
/// columns); computing in that order and reading key head `h % kh` gives the same output, with
/// no need to permute a quantized matrix's columns back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueHeads {
    #[default]
    Grouped,
    Tiled,
}

impl ValueHeads {
    /// Where llama.cpp's converter puts HF's value head `g` of `vh` sharing `kh` key heads
    /// (`r = vh / kh` a key head): grouped head `k r + j` goes to tiled place `j kh + k`.
    pub fn tiled_place(g: usize, kh: usize, vh: usize) -> usize {
        let r = vh / kh;
        (g % r) * kh + g / r
    }
}

impl LinearAttentionConfig {
    /// `key_dim` of `Qwen3_5GatedDeltaNet`: all key heads together (the queries' too).
    pub fn key_dim(&self) -> u32 {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// `value_dim`: all value heads together.
    pub fn value_dim(&self) -> u32 {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// `conv_dim`: the convolution's channels, q, k and v side by side.
    pub fn conv_dim(&self) -> u32 {
        2 * self.key_dim() + self.value_dim()
    }

    /// Whether layer `l` is a Gated DeltaNet.
    pub fn is_linear(&self, layer: u32) -> bool {
        self.layer_types.get(layer as usize) == Some(&LayerType::LinearAttention)
    }
}

/// How an embedding model pools and scales its vector, as sentence-transformers' files say
/// (modules.json, 1_Pooling/config.json). Qwen3-Embedding pools the last token (the
/// `<|endoftext|>` its tokenizer appends), the only pooling this runtime implements; the
/// exporter refuses the others by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingConfig {
    /// sentence-transformers' `Normalize` module follows the pooling: vectors have length 1.
    pub normalize: bool,
}

/// RoPE's frequency scaling: config.json's `rope_scaling` (hub) or `rope_parameters`
/// (transformers 5) when its `rope_type` is not `default`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// The rotary embedding as trained: `inv_freq[i] = theta^(-2i / head_dim)`.
    None,
    /// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
    /// Models"), as transformers' `_compute_yarn_parameters` computes it: each frequency is
    /// blended between itself (fast rotations, kept) and itself / `factor` (slow rotations,
    /// interpolated) by a ramp over the dimensions between the `beta_fast` and `beta_slow`
    /// rotation counts within `original_max_position_embeddings` positions; cos and sin are then
    /// multiplied by `attention_factor`. Qwen3 and Qwen2.5 document `factor: 4`, original 32768.
    Yarn {
        factor: f64,
        original_max_position_embeddings: u32,
        beta_fast: f64,
        beta_slow: f64,
        /// The factor applied to cos and sin: config.json's `attention_factor`, or, resolved at
        /// export as transformers resolves it, `0.1 ln(factor) + 1` (or the `mscale` ratio).
        attention_factor: f64,
        /// Whether the ramp's ends are rounded to whole dimensions (transformers' `truncate`,
        /// default true).
        truncate: bool,
    },
}

/// The mixture-of-experts block of Qwen3-MoE (`Qwen3MoeSparseMoeBlock` in transformers'
/// `modeling_qwen3_moe.py`), named as `Qwen3MoeConfig` names it.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts in each sparse layer (the hub's `num_experts`; transformers 5: `num_local_experts`).
    pub num_experts: u32,
    /// Experts each token is sent to (top-k of the router's probabilities).
    pub num_experts_per_tok: u32,
    /// Width of each expert's SwiGLU (the dense layers use `intermediate_size`).
    pub moe_intermediate_size: u32,
    /// Whether the k chosen probabilities are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Layer `l` is sparse when `(l + 1) % decoder_sparse_step == 0` ...
    pub decoder_sparse_step: u32,
    /// ... and `l` is not one of these (dense layers among sparse ones).
    pub mlp_only_layers: Vec<u32>,
    /// Qwen3.5-MoE: the width of the shared expert, a SwiGLU every token runs beside its routed
    /// experts, weighted by `sigmoid(shared_expert_gate x)`; 0 for none (Qwen3-MoE). Since format
    /// version 7.
    pub shared_expert_intermediate_size: u32,
}

impl MoeConfig {
    /// Whether layer `l`'s MLP is a mixture of experts: the rule of `Qwen3MoeDecoderLayer.__init__`.
    pub fn is_sparse(&self, layer: u32) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Sentinel for "absent" in the optional u32 fields.
const NONE_U32: u32 = u32::MAX;

impl ModelConfig {
    /// Whether the classifier is the embedding table itself (`tie_word_embeddings` in a language
    /// model; an embedding model has no classifier): the table is then a matrix of products too,
    /// not only rows looked up.
    pub fn classifier_is_embedding(&self) -> bool {
        self.embedding.is_none() && self.tie_word_embeddings
    }

    /// The oldest format version whose config block holds this config: 8 for a vision tower, 7
    /// for a partial
    /// rotation, an attention output gate or linear attention, 6 for an embedding model, 5 for
    /// RoPE scaling or experts, else [`super::OLDEST_WRITTEN_VERSION`].
    pub fn since_version(&self) -> u32 {
        let shared = self
            .moe
            .as_ref()
            .is_some_and(|m| m.shared_expert_intermediate_size > 0);
        if self.linear_attention.as_ref().map(|la| la.value_heads) == Some(ValueHeads::Tiled) {
            // A GGUF's order (exported as it is), as its K-quants (`dtype.rs`).
            9
        } else if self.vision.is_some() {
            8
        } else if self.partial_rotary_factor != 1.0
            || self.attn_output_gate
            || self.linear_attention.is_some()
            || shared
        {
            7
        } else if self.embedding.is_some() {
            6
        } else if self.rope_scaling != RopeScaling::None || self.moe.is_some() {
            5
        } else {
            super::OLDEST_WRITTEN_VERSION
        }
    }

    /// The dimensions of each head that RoPE rotates: `int(head_dim * partial_rotary_factor)`,
    /// as transformers' `compute_default_rope_parameters` takes them.
    pub fn rotary_dim(&self) -> u32 {
        (self.head_dim as f64 * self.partial_rotary_factor) as u32
    }

    /// Whether layer `l` runs attention (every layer but a hybrid model's linear ones).
    pub fn is_attention(&self, layer: u32) -> bool {
        !self
            .linear_attention
            .as_ref()
            .is_some_and(|la| la.is_linear(layer))
    }

    /// The layers that run attention, and so hold keys and values.
    pub fn attention_layers(&self) -> u32 {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_attention(l))
            .count() as u32
    }

    /// Bytes of state a sequence holds in the Gated DeltaNet layers, whatever its length: each
    /// linear layer's convolution window `[conv_dim, K - 1]` and memory `[num_v_heads, dk, dv]`,
    /// f32 (0 without them).
    pub fn linear_state_bytes(&self) -> u64 {
        let Some(la) = &self.linear_attention else {
            return 0;
        };
        let layers = (self.num_hidden_layers - self.attention_layers()) as u64;
        let per = la.conv_dim() as u64 * (la.linear_conv_kernel_dim as u64 - 1)
            + la.linear_num_value_heads as u64
                * la.linear_key_head_dim as u64
                * la.linear_value_head_dim as u64;
        4 * layers * per
    }

    /// The most positions a sequence may hold: `max_position_embeddings`, or with YaRN
    /// `factor x original_max_position_embeddings` when that is more. Qwen3's config.json says
    /// 40960 and its model card documents 131072 tokens with YaRN's factor 4 over 32768; vLLM
    /// and llama.cpp take the scaled length too (transformers itself sets no limit).
    pub fn max_context(&self) -> u32 {
        match self.rope_scaling {
            RopeScaling::None => self.max_position_embeddings,
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                ..
            } => {
                let scaled =
                    (factor * original_max_position_embeddings as f64).min(u32::MAX as f64);
                self.max_position_embeddings.max(scaled as u32)
            }
        }
    }

    /// Checks the invariants the forward pass relies on. Called by the writer and the reader, so a
    /// config that breaks them can neither be written nor loaded.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        let Some(architecture) = Architecture::named(&self.architecture) else {
            bail!(
                "config: architecture {} is not supported (supported: {})",
                self.architecture,
                Architecture::list(|a| a.name)
            );
        };
        for (name, v) in positive {
            if v == 0 {
                bail!("config: {name} is 0");
            }
        }
        // Sizes beyond these would not fit any machine; refusing them keeps size arithmetic in
        // u64/usize far from overflow on a hostile file.
        if self.hidden_size > 1 << 20
            || self.intermediate_size > 1 << 22
            || self.num_hidden_layers > 4096
            || self.num_attention_heads > 4096
            || self.head_dim > 1 << 16
            || self.vocab_size > 1 << 24
        {
            bail!("config: a size is implausibly large ({self:?})");
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "config: head_dim {} is odd; rotary embeddings rotate pairs",
                self.head_dim
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!(
                "config: rope_theta {} is not a positive number",
                self.rope_theta
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            bail!(
                "config: rms_norm_eps {} is not a non-negative number",
                self.rms_norm_eps
            );
        }
        for &id in self.eos_token_ids.iter().chain(self.bos_token_id.iter()) {
            if id >= self.vocab_size {
                bail!(
                    "config: token id {id} is outside the vocabulary ({})",
                    self.vocab_size
                );
            }
        }
        if architecture.experts != self.moe.is_some() {
            bail!(
                "config: {} {} experts",
                self.architecture,
                if self.moe.is_some() {
                    "with"
                } else {
                    "without"
                }
            );
        }
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0) {
            bail!(
                "config: partial_rotary_factor {} is not in (0, 1]",
                self.partial_rotary_factor
            );
        }
        let rot = self.rotary_dim();
        if rot == 0 || !rot.is_multiple_of(2) {
            bail!("config: RoPE would rotate {rot} dimensions of each head; it rotates pairs");
        }
        if architecture.linear_attention != self.linear_attention.is_some() {
            bail!(
                "config: {} {} linear attention layers",
                self.architecture,
                if self.linear_attention.is_some() {
                    "with"
                } else {
                    "without"
                }
            );
        }
        if let Some(la) = &self.linear_attention {
            if la.layer_types.len() != self.num_hidden_layers as usize {
                bail!(
                    "config: {} layer_types for {} layers",
                    la.layer_types.len(),
                    self.num_hidden_layers
                );
            }
            let sizes = [
                ("linear_num_key_heads", la.linear_num_key_heads),
                ("linear_num_value_heads", la.linear_num_value_heads),
                ("linear_key_head_dim", la.linear_key_head_dim),
                ("linear_value_head_dim", la.linear_value_head_dim),
                ("linear_conv_kernel_dim", la.linear_conv_kernel_dim),
            ];
            for (name, v) in sizes {
                if v == 0 || v > 1 << 12 {
                    bail!("config: {name} {v} is 0 or implausibly large");
                }
            }
            if !la
                .linear_num_value_heads
                .is_multiple_of(la.linear_num_key_heads)
            {
                bail!(
                    "config: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                    la.linear_num_value_heads,
                    la.linear_num_key_heads
                );
            }
        }
        if let Some(v) = &self.vision {
            v.validate(
                self.vocab_size,
                self.rotary_dim(),
                self.hidden_size,
                self.num_hidden_layers,
            )?;
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.num_experts > 4096 {
                bail!("config: num_experts {} is not in 1 ..= 4096", m.num_experts);
            }
            if m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
                bail!(
                    "config: num_experts_per_tok {} is not in 1 ..= num_experts ({})",
                    m.num_experts_per_tok,
                    m.num_experts
                );
            }
            if m.moe_intermediate_size == 0 || m.moe_intermediate_size > 1 << 22 {
                bail!(
                    "config: moe_intermediate_size {} is 0 or implausibly large",
                    m.moe_intermediate_size
                );
            }
            if m.decoder_sparse_step == 0 {
                bail!("config: decoder_sparse_step is 0");
            }
            if m.shared_expert_intermediate_size > 1 << 22 {
                bail!(
                    "config: shared_expert_intermediate_size {} is implausibly large",
                    m.shared_expert_intermediate_size
                );
            }
        }
        if let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            ..
        } = self.rope_scaling
        {
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !(positive(factor)
                && positive(beta_fast)
                && positive(beta_slow)
                && positive(attention_factor))
                || original_max_position_embeddings == 0
            {
                bail!(
                    "config: YaRN parameters out of range ({:?})",
                    self.rope_scaling
                );
            }
        }
        match self.dtype {
            DType::Q8 => {
                if self.group_size == 0 {
                    bail!("config: q8 with group size 0");
                }
            }
            DType::Q4 => {
                if self.group_size == 0 || !self.group_size.is_multiple_of(2) {
                    bail!(
                        "config: q4 needs an even group size, got {}",
                        self.group_size
                    );
                }
            }
            DType::Q6 => bail!("config: q6 is not a file's dtype (q4 files keep tensors in it)"),
            DType::K(_) => {
                if self.group_size as u64 != super::K_BLOCK {
                    bail!(
                        "config: {} has blocks of {}, not a group size of {}",
                        self.dtype,
                        super::K_BLOCK,
                        self.group_size
                    );
                }
            }
            _ => {
                if self.group_size != 0 {
                    bail!(
                        "config: group size {} given for {}",
                        self.group_size,
                        self.dtype
                    );
                }
            }
        }
        Ok(())
    }
}

pub mod architecture;
mod codec;
pub mod vision;

pub use architecture::{Architecture, ARCHITECTURES};
pub use vision::{ImageProcessor, VisionConfig, VisionInput, TOWER_PREFIX};
#[cfg(test)]
pub(crate) mod tests;
