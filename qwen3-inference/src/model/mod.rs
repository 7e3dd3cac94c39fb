//! The Qwen3 model: its weights, and the forward pass over them.
//!
//! The structs mirror HuggingFace's modules in `transformers/models/qwen3/modeling_qwen3.py`
//! (`Qwen3ForCausalLM` > `Qwen3Model` > `Qwen3DecoderLayer` > `Qwen3Attention` / `Qwen3MLP`), so
//! a reader can hold the two side by side. Qwen2 (`modeling_qwen2.py`) is the same model with two
//! differences in its attention, both data here: q/k/v projections with biases, and no q/k norms
//! (the optional fields of [`Qwen3Attention`]). Qwen3-MoE (`modeling_qwen3_moe.py`) is Qwen3 whose
//! MLPs are, in its sparse layers, mixtures of experts ([`Mlp::Sparse`]). They are generic over the tensor type `T` of the
//! [`Backend`](crate::backend::Backend) that runs them: on the CPU a [`TensorView`] into the
//! mmapped file (loading copies nothing), on a GPU a range of the uploaded file. The forward pass
//! itself lives in [`Forward`], written once for a step of one or many sequences; a
//! [`Session`] is one sequence with its KV cache. See docs/transformer.md.

mod forward;
pub mod gated_attention;
pub mod gated_delta_net;
mod moe;
mod session;

pub use forward::{Cache, Forward, RowInputs, Segment, StateSnapshot, MAX_BATCH};
pub use moe::Routes;
pub use session::Session;

use crate::format::view::TensorView;
use crate::format::{DType, ModelConfig, ModelFile};
use crate::kernels::dot::interleaved;
use crate::kernels::KvType;
use anyhow::{bail, Result};

/// `Qwen3ForCausalLM`: the decoder stack plus the classifier. `T` is one stored tensor; by
/// default a [`TensorView`] borrowed from the model file (the CPU's).
pub struct Model<'a, T = TensorView<'a>> {
    pub config: &'a ModelConfig,
    /// `model.embed_tokens.weight`: `[vocab, hidden]`.
    pub embed_tokens: T,
    pub layers: Vec<Qwen3DecoderLayer<T>>,
    /// `model.norm.weight`: `[hidden]`, the final RMSNorm.
    pub norm: T,
    /// `lm_head.weight`: `[vocab, hidden]`. With `tie_word_embeddings` (Qwen3-0.6B) this is the
    /// embedding table itself, read a second time as the classifier. `None` for an embedding
    /// model (Qwen3-Embedding is a bare `Qwen3Model`: its output is the final norm's).
    pub lm_head: Option<T>,
}

/// `Qwen3DecoderLayer`: a pre-norm token mixer (attention, or in Qwen3.5 a Gated DeltaNet) and
/// a pre-norm MLP, each with a residual connection.
pub struct Qwen3DecoderLayer<T> {
    /// `input_layernorm.weight`: `[hidden]`.
    pub input_layernorm: T,
    pub mixer: Mixer<T>,
    /// `post_attention_layernorm.weight`: `[hidden]`.
    pub post_attention_layernorm: T,
    pub mlp: Mlp<T>,
}

/// A layer's token mixer, where information moves between positions: attention (HF's
/// `self_attn`), or Qwen3.5's Gated DeltaNet (`linear_attn`) in the layers its `layer_types`
/// name `linear_attention`.
pub enum Mixer<T> {
    Attention(Qwen3Attention<T>),
    GatedDeltaNet(LinearAttention<T>),
}

impl<T> Mixer<T> {
    /// The attention, if this layer has one.
    pub fn attention(&self) -> Option<&Qwen3Attention<T>> {
        match self {
            Mixer::Attention(a) => Some(a),
            Mixer::GatedDeltaNet(_) => None,
        }
    }
}

/// `Qwen3_5GatedDeltaNet`: linear attention with a forgetting gate and the delta rule's update,
/// over a fixed-size state per sequence. `model/gated_delta_net.rs` is its textbook form and
/// explains each step.
pub struct LinearAttention<T> {
    /// `in_proj_qkv.weight`: `[conv_dim, hidden]`, q, k and v side by side.
    pub in_proj_qkv: T,
    /// `in_proj_z.weight`: `[value_dim, hidden]`, the output gate.
    pub in_proj_z: T,
    /// `in_proj_b.weight`: `[num_v_heads, hidden]`, the write strength before its sigmoid.
    pub in_proj_b: T,
    /// `in_proj_a.weight`: `[num_v_heads, hidden]`, the decay's input.
    pub in_proj_a: T,
    /// `conv1d.weight`: `[conv_dim, K]`, one causal filter a channel (f32).
    pub conv1d: T,
    /// `dt_bias`: `[num_v_heads]` (f32).
    pub dt_bias: T,
    /// `A_log`: `[num_v_heads]`, the log of each head's decay rate (f32).
    pub a_log: T,
    /// `norm.weight`: `[head_v_dim]`, the gated RMSNorm's gain, shared by the heads.
    pub norm: T,
    /// `out_proj.weight`: `[hidden, value_dim]`.
    pub out_proj: T,
}

/// A layer's MLP: one SwiGLU (every dense model's layers, and Qwen3-MoE's `mlp_only_layers`), or
/// a mixture of experts (Qwen3-MoE's sparse layers: `Qwen3MoeDecoderLayer.__init__` decides,
/// [`crate::format::MoeConfig::is_sparse`] repeats its rule).
pub enum Mlp<T> {
    Dense(Qwen3MLP<T>),
    Sparse(Qwen3MoeSparseMoeBlock<T>),
}

impl<T> Mlp<T> {
    /// The dense MLP, if this is one.
    pub fn dense(&self) -> Option<&Qwen3MLP<T>> {
        match self {
            Mlp::Dense(m) => Some(m),
            Mlp::Sparse(_) => None,
        }
    }
}

/// `Qwen3MoeSparseMoeBlock`: a router scores every expert for each token, the token goes to the
/// `num_experts_per_tok` best, and its output is their SwiGLUs' outputs weighted by the router's
/// probabilities (renormalised over the chosen ones with `norm_topk_prob`).
pub struct Qwen3MoeSparseMoeBlock<T> {
    /// `mlp.gate.weight`: `[num_experts, hidden]`, the router (f32 in every file).
    pub gate: T,
    /// `mlp.experts.{e}`: `num_experts` SwiGLUs of width `moe_intermediate_size`.
    pub experts: Vec<Qwen3MLP<T>>,
    /// Qwen3.5-MoE: `mlp.shared_expert` (a SwiGLU of width `shared_expert_intermediate_size`
    /// every token runs) and `mlp.shared_expert_gate.weight` (`[1, hidden]`, f32): the block's
    /// output gains `sigmoid(gate x) * shared_expert(x)`.
    pub shared_expert: Option<(Qwen3MLP<T>, T)>,
}

/// `Qwen3Attention` (and `Qwen2Attention`): projections, and per-head q/k RMSNorms (new in Qwen3)
/// or q/k/v biases (Qwen2).
pub struct Qwen3Attention<T> {
    /// `[n_heads * head_dim, hidden]`
    pub q_proj: T,
    /// `[n_kv_heads * head_dim, hidden]`
    pub k_proj: T,
    /// `[n_kv_heads * head_dim, hidden]`
    pub v_proj: T,
    /// `[hidden, n_heads * head_dim]`
    pub o_proj: T,
    /// Qwen2: `q_proj.bias`, `k_proj.bias`, `v_proj.bias`, `[n_heads * head_dim]` and
    /// `[n_kv_heads * head_dim]` twice.
    pub qkv_bias: Option<[T; 3]>,
    /// Qwen3: `q_norm.weight` and `k_norm.weight`, `[head_dim]` each, shared by every head.
    /// (Qwen3.5 writes its norms as `x * (1 + w)`; the exporter stores `1 + w`.)
    pub qk_norm: Option<[T; 2]>,
    /// Qwen3.5: `output_gate.weight`, `[n_heads * head_dim, hidden]`: the gate's rows of HF's
    /// `q_proj` (each head's second half), stored apart; the output is `attn * sigmoid(gate)`.
    pub output_gate: Option<T>,
}

/// `Qwen3MLP`: SwiGLU, `down(silu(gate(x)) * up(x))`.
pub struct Qwen3MLP<T> {
    /// `[intermediate, hidden]`
    pub gate_proj: T,
    /// `[intermediate, hidden]`
    pub up_proj: T,
    /// `[hidden, intermediate]`
    pub down_proj: T,
}

impl<'a> Model<'a> {
    /// Borrows every weight from `file` (the CPU's model). The file was validated when opened
    /// (every tensor present, with the shape the config implies and a dtype it allows; each
    /// tensor carries its own), so this only looks names up.
    pub fn load(file: &'a ModelFile) -> Result<Model<'a>> {
        // On AVX-512 the q4, q6 and q8 matrices, and GGUF's Q4_K and Q6_K (on AVX2 these two
        // only, eight rows side by side), are read in the
        // kernels' own order, made here once (kernels/dot/interleaved.rs,
        // kernels/dot/k_interleaved.rs); each view carries both orders. A GGUF file's Q8_0, Q5_0
        // and Q4_0 matrices are already a copy, made at open: in that order where the file was
        // opened for the CPU's kernels (`format::Reader::Interleaved`), else in this format's (q8
        // then read as it is rather than copied twice).
        let reorders = interleaved::Reorders::of_this_cpu();
        let interleaved = match reorders.any() {
            true => Some(file.derived(|f| interleaved::interleave_file(f, reorders))?),
            false => None,
        };
        let model = Model::load_with(file, |name| {
            let mut t = file.tensor(name)?;
            if let Some(d) = interleaved.and_then(|d| d.view(file, name).transpose()) {
                t.interleaved = Some(d?);
            }
            Ok(t)
        })?;
        // Norm weights, biases, routers and the DeltaNets' parameters are f32 in every model file (format::tensor_specs); the
        // kernels rely on it.
        let layers = model.layers.iter();
        let norms = layers.flat_map(|l| {
            let (qk, bias, linear) = match &l.mixer {
                Mixer::Attention(attn) => (
                    attn.qk_norm.iter().flatten().collect(),
                    attn.qkv_bias.iter().flatten().collect(),
                    vec![],
                ),
                Mixer::GatedDeltaNet(la) => (
                    vec![],
                    vec![],
                    vec![&la.conv1d, &la.dt_bias, &la.a_log, &la.norm],
                ),
            };
            let router = match &l.mlp {
                Mlp::Sparse(moe) => {
                    let shared = moe.shared_expert.as_ref().map(|(_, g)| g);
                    [Some(&moe.gate), shared].into_iter().flatten().collect()
                }
                Mlp::Dense(_) => vec![],
            };
            [&l.input_layernorm, &l.post_attention_layernorm]
                .into_iter()
                .chain(qk)
                .chain(bias)
                .chain(linear)
                .chain(router)
        });
        for t in norms.chain([&model.norm]) {
            if t.data.dtype() != DType::F32 {
                bail!("{}: {} is not stored as f32", file.path().display(), t.name);
            }
        }
        Ok(model)
    }
}

/// The three matrices of the SwiGLU under `prefix` (`model.layers.3.mlp`, or one expert's
/// `model.layers.3.mlp.experts.17`).
fn swiglu<T>(get: &mut impl FnMut(&str) -> Result<T>, prefix: &str) -> Result<Qwen3MLP<T>> {
    Ok(Qwen3MLP {
        gate_proj: get(&format!("{prefix}.gate_proj.weight"))?,
        up_proj: get(&format!("{prefix}.up_proj.weight"))?,
        down_proj: get(&format!("{prefix}.down_proj.weight"))?,
    })
}

impl<'a, T> Model<'a, T> {
    /// Looks every weight up by its HuggingFace name through `get`: a view into the mapped file
    /// on the CPU, a range of the uploaded file on a GPU.
    pub fn load_with(
        file: &'a ModelFile,
        mut get: impl FnMut(&str) -> Result<T>,
    ) -> Result<Model<'a, T>> {
        let config = file.config();
        let mut layers = Vec::with_capacity(config.num_hidden_layers as usize);
        for l in 0..config.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut t = |name: &str| get(&format!("{p}.{name}"));
            let linear = config.linear_attention.as_ref();
            let mixer = if linear.is_some_and(|la| la.is_linear(l)) {
                Mixer::GatedDeltaNet(LinearAttention {
                    in_proj_qkv: t("linear_attn.in_proj_qkv.weight")?,
                    in_proj_z: t("linear_attn.in_proj_z.weight")?,
                    in_proj_b: t("linear_attn.in_proj_b.weight")?,
                    in_proj_a: t("linear_attn.in_proj_a.weight")?,
                    conv1d: t("linear_attn.conv1d.weight")?,
                    dt_bias: t("linear_attn.dt_bias")?,
                    a_log: t("linear_attn.A_log")?,
                    norm: t("linear_attn.norm.weight")?,
                    out_proj: t("linear_attn.out_proj.weight")?,
                })
            } else {
                Mixer::Attention(Qwen3Attention {
                    q_proj: t("self_attn.q_proj.weight")?,
                    k_proj: t("self_attn.k_proj.weight")?,
                    v_proj: t("self_attn.v_proj.weight")?,
                    o_proj: t("self_attn.o_proj.weight")?,
                    qkv_bias: match config.attention_bias {
                        true => Some([
                            t("self_attn.q_proj.bias")?,
                            t("self_attn.k_proj.bias")?,
                            t("self_attn.v_proj.bias")?,
                        ]),
                        false => None,
                    },
                    qk_norm: match config.qk_norm {
                        true => {
                            Some([t("self_attn.q_norm.weight")?, t("self_attn.k_norm.weight")?])
                        }
                        false => None,
                    },
                    output_gate: match config.attn_output_gate {
                        true => Some(t("self_attn.output_gate.weight")?),
                        false => None,
                    },
                })
            };
            let mlp = match &config.moe {
                Some(moe) if moe.is_sparse(l) => Mlp::Sparse(Qwen3MoeSparseMoeBlock {
                    gate: get(&format!("{p}.mlp.gate.weight"))?,
                    experts: (0..moe.num_experts)
                        .map(|e| swiglu(&mut get, &format!("{p}.mlp.experts.{e}")))
                        .collect::<Result<_>>()?,
                    shared_expert: match moe.shared_expert_intermediate_size {
                        0 => None,
                        _ => Some((
                            swiglu(&mut get, &format!("{p}.mlp.shared_expert"))?,
                            get(&format!("{p}.mlp.shared_expert_gate.weight"))?,
                        )),
                    },
                }),
                _ => Mlp::Dense(swiglu(&mut get, &format!("{p}.mlp"))?),
            };
            let mut w = |name: &str| get(&format!("{p}.{name}.weight"));
            layers.push(Qwen3DecoderLayer {
                input_layernorm: w("input_layernorm")?,
                mixer,
                post_attention_layernorm: w("post_attention_layernorm")?,
                mlp,
            });
        }
        // Tied: the classifier is the embedding table, looked up a second time (a view or a
        // device range, not a copy).
        let lm_head = match (config.embedding.is_some(), config.classifier_is_embedding()) {
            (true, _) => None,
            (false, true) => Some(get("model.embed_tokens.weight")?),
            (false, false) => Some(get("lm_head.weight")?),
        };
        Ok(Model {
            config,
            embed_tokens: get("model.embed_tokens.weight")?,
            layers,
            norm: get("model.norm.weight")?,
            lm_head,
        })
    }

    /// Bytes of KV cache a session of `context_len` positions needs: keys and values, as `kv`
    /// stores them, for every attention layer and kv head.
    pub fn kv_cache_bytes(&self, context_len: usize, kv: KvType) -> u64 {
        let c = self.config;
        2 * c.attention_layers() as u64
            * c.num_key_value_heads as u64
            * c.head_dim as u64
            * context_len as u64
            * kv.bytes() as u64
    }
}
