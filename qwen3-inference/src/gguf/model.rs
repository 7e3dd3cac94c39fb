//! A GGUF file as the model it holds: the config from its metadata (llama.cpp's keys, named
//! `{arch}.{key}`) and each tensor under the model file's names (HuggingFace's: `names.rs`), for
//! the families llama.cpp calls `qwen3`, `qwen2`, `qwen3moe`, `qwen35`, `qwen35moe` and `qwen3next`. What
//! llama.cpp's `convert_hf_to_gguf.py` writes, read back:
//!
//! ```text
//! config.json (Qwen3Config)      GGUF metadata
//! hidden_size                    qwen3.embedding_length
//! intermediate_size              qwen3.feed_forward_length
//! num_hidden_layers              qwen3.block_count
//! num_attention_heads            qwen3.attention.head_count
//! num_key_value_heads            qwen3.attention.head_count_kv
//! head_dim                       qwen3.attention.key_length
//! max_position_embeddings        qwen3.context_length
//! rope_theta                     qwen3.rope.freq_base             (an f32 in the file)
//! rms_norm_eps                   qwen3.attention.layer_norm_rms_epsilon   (an f32 too)
//! vocab_size                     the rows of token_embd
//! tie_word_embeddings            no `output` tensor
//! generation_config.json         GGUF metadata
//! eos_token_id                   tokenizer.ggml.eos_token_id, and <|endoftext|> (not recorded)
//! temperature, top_p, top_k      general.sampling.temp, .top_p, .top_k (and .min_p,
//!                                .penalty_repeat), where the converter wrote them
//! num_experts (Qwen3-MoE)        qwen3moe.expert_count
//! num_experts_per_tok            qwen3moe.expert_used_count
//! moe_intermediate_size          qwen3moe.expert_feed_forward_length
//! norm_topk_prob                 always true (llama.cpp's qwen3moe graph renormalises)
//!
//! Qwen3.5 (text_config)          qwen35 (and qwen35moe)
//! num_hidden_layers              block_count - nextn_predict_layers (the MTP layers, left out)
//! partial_rotary_factor          rope.dimension_count / attention.key_length
//! layer_types                    attention.recurrent_layers (true: linear_attention), or
//!                                every full_attention_interval-th layer attention
//! linear_num_key_heads           ssm.group_count
//! linear_num_value_heads         ssm.time_step_rank
//! linear_key_head_dim            ssm.state_size
//! linear_value_head_dim          ssm.inner_size / ssm.time_step_rank
//! linear_conv_kernel_dim         ssm.conv_kernel
//! shared_expert_intermediate_size  expert_shared_feed_forward_length (qwen35moe)
//! mrope_section                  rope.dimension_sections (not needed: for text every position
//!                                component is the token's, and M-RoPE is RoPE)
//!
//! Qwen3-Next                     qwen3next: Qwen3.5-MoE's keys, value heads in HF's order
//! norm_topk_prob                 always true (llama.cpp's qwen3next graph renormalises)
//! mlp_only_layers                none (llama.cpp's loader wants a router in every layer)
//! ```

use super::names::{all_pieces, Names, Piece};
use super::repack::Legacy;
use super::{GgufHeader, GgufTensor, Value};
use crate::format::architecture::QWEN3_NEXT;
use crate::format::reader::{Header, TensorInfo};
use crate::format::{
    align_up, tensor_nbytes, Architecture, DType, GenerationDefaults, KQuant, LayerType,
    LinearAttentionConfig, ModelConfig, MoeConfig, RopeScaling, ValueHeads, K_BLOCK,
};
use anyhow::{bail, ensure, Context, Result};

/// Values a block of ggml's legacy types (Q8_0, Q4_0, Q5_0) holds: such a tensor is q8 or q4 in
/// groups of this many (`repack.rs`).
pub const LEGACY_GROUP: u32 = 32;

/// A GGUF's blocks (`block_count`): the model's layers, then Qwen3.5's multi-token-prediction
/// layers (`nextn_predict_layers`, the last blocks), which the forward pass does not run
/// (`names.rs` leaves their tensors out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    pub count: u32,
    pub mtp: u32,
}

impl Blocks {
    /// The layers the model runs.
    pub fn layers(self) -> u32 {
        self.count - self.mtp
    }
}

/// The [`Blocks`] of the GGUF with header `h`.
pub fn blocks(h: &GgufHeader) -> Result<Blocks> {
    let keys = Keys::of(h)?;
    let total = keys.need("block_count")?;
    let mtp = keys.count("nextn_predict_layers")?.unwrap_or(0);
    ensure!(
        mtp < total,
        "{}: {mtp} of {total} blocks",
        keys.key("nextn_predict_layers")
    );
    Ok(Blocks { count: total, mtp })
}

/// The architecture's own keys of a GGUF header (`{arch}.{k}`: `qwen3.embedding_length`), read
/// as a config needs them: a missing or mistyped one named in the error.
struct Keys<'a> {
    h: &'a GgufHeader,
    arch: &'a str,
}

impl<'a> Keys<'a> {
    fn of(h: &'a GgufHeader) -> Result<Keys<'a>> {
        let arch = h
            .architecture()
            .context("no general.architecture: not a model file llama.cpp wrote")?;
        Ok(Keys { h, arch })
    }

    /// The full name of key `k`.
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.h.get(&self.key(k))
    }

    /// A count, if the file has it.
    fn count(&self, k: &str) -> Result<Option<u32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => bail!("{}: {v:?} is not a 32-bit count", self.key(k)),
            },
        }
    }

    /// A count the file must have.
    fn need(&self, k: &str) -> Result<u32> {
        self.count(k)?
            .with_context(|| format!("{} is missing", self.key(k)))
    }

    /// A float the file must have.
    fn float(&self, k: &str) -> Result<f64> {
        match self.get(k) {
            Some(Value::F32(v)) => Ok(*v as f64),
            Some(Value::F64(v)) => Ok(*v),
            Some(v) => bail!("{}: {v:?} is not a float", self.key(k)),
            None => bail!("{} is missing", self.key(k)),
        }
    }
}

/// The model's config from a GGUF file's metadata. The matrices keep the GGUF's own storage,
/// tensor by tensor (`GgufTensor::ggml_type`); `dtype` says f32, what they dequantize to
/// (`blocks.rs`), and the sampling defaults are absent (a GGUF carries none).
pub fn model_config(h: &GgufHeader) -> Result<ModelConfig> {
    let keys = Keys::of(h)?;
    let arch = keys.arch;
    let Some(row) = Architecture::of_gguf(arch) else {
        bail!(
            "GGUF architecture {arch}: the families read are {}",
            Architecture::list(|a| a.gguf)
        );
    };
    let (architecture, attention_bias, qk_norm) = (row.name, row.attention_bias, row.qk_norm);
    // Qwen3.5 and 3.6, and Qwen3-Next before them: Gated DeltaNets among gated attention layers.
    let hybrid = row.linear_attention;
    // Long-context RoPE (YaRN) is written as rope.scaling.*: not read yet, so refused rather
    // than run without it.
    if let Some(v) = keys.get("rope.scaling.type") {
        if v.as_str() != Some("none") {
            bail!(
                "{}: {v:?}: RoPE scaling in a GGUF is not read yet",
                keys.key("rope.scaling.type")
            );
        }
    }
    let hidden_size = keys.need("embedding_length")?;
    let num_hidden_layers = blocks(h)?.layers();
    let num_attention_heads = keys.need("attention.head_count")?;
    let embd = h
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .context("no token_embd.weight tensor")?;
    let vocab = *super::names::hf_shape(embd).first().unwrap_or(&0);
    let head_dim = match keys.count("attention.key_length")? {
        Some(d) => d,
        None => hidden_size / num_attention_heads.max(1),
    };
    // Qwen3-MoE: every layer sparse (llama.cpp's qwen3moe has no dense layers among them), the
    // chosen experts' probabilities renormalised (`build_moe_ffn(..., norm_w = true, ...)`).
    // Qwen3.5-MoE the same, always renormalised too (`Qwen3_5MoeSparseMoeBlock`), with a shared
    // expert. Qwen3-Next too, every layer sparse and renormalised as llama.cpp's qwen3next
    // loader and graph take it (`norm_topk_prob` is not recorded; Qwen3-Next-80B-A3B's is true).
    let moe = match row.experts {
        true => Some(MoeConfig {
            num_experts: keys.need("expert_count")?,
            num_experts_per_tok: keys.need("expert_used_count")?,
            moe_intermediate_size: keys.need("expert_feed_forward_length")?,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: keys
                .count("expert_shared_feed_forward_length")?
                .unwrap_or(0),
        }),
        false => None,
    };
    // Qwen3.5-MoE has no dense MLP and no feed_forward_length: its experts' width stands in, as
    // the exporter writes it.
    let intermediate_size = match (keys.count("feed_forward_length")?, &moe) {
        (Some(ff), _) => ff,
        (None, Some(m)) if hybrid => m.moe_intermediate_size,
        (None, _) => keys.need("feed_forward_length")?,
    };
    let linear_attention = match hybrid {
        true => Some(linear_attention(&keys, num_hidden_layers, row)?),
        false => None,
    };
    // The rotated part of each head: all of it, unless rope.dimension_count says less (Qwen3.5
    // rotates a quarter).
    let partial_rotary_factor = match keys.count("rope.dimension_count")? {
        None => 1.0,
        Some(r) if r == head_dim => 1.0,
        Some(r) => {
            let f = r as f64 / head_dim as f64;
            ensure!(
                r < head_dim && (head_dim as f64 * f) as u32 == r,
                "{}: {r} of a head of {head_dim}",
                keys.key("rope.dimension_count")
            );
            f
        }
    };
    let token = |k: &str| {
        h.get(k)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    let config = ModelConfig {
        architecture: architecture.into(),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: keys
            .count("attention.head_count_kv")?
            .unwrap_or(num_attention_heads),
        head_dim,
        vocab_size: u32::try_from(vocab).context("token_embd.weight: too many rows")?,
        max_position_embeddings: keys.need("context_length")?,
        rope_theta: keys.float("rope.freq_base")?,
        rms_norm_eps: keys.float("attention.layer_norm_rms_epsilon")?,
        tie_word_embeddings: !h.tensors.iter().any(|t| t.name == "output.weight"),
        bos_token_id: token("tokenizer.ggml.bos_token_id"),
        eos_token_ids: eos_ids(h, token("tokenizer.ggml.eos_token_id")),
        generation: sampling(h),
        dtype: DType::F32,
        group_size: 0,
        attention_bias,
        qk_norm,
        rope_scaling: RopeScaling::None,
        moe,
        embedding: None,
        partial_rotary_factor,
        attn_output_gate: hybrid,
        linear_attention,
        vision: None,
    };
    config.validate()?;
    Ok(config)
}

/// A `qwen35` or `qwen3next` GGUF's Gated DeltaNets (llama.cpp's `ssm.*` keys, written by the
/// converter's `Qwen3NextModel.set_gguf_parameters`), in the GGUF's order of value heads.
fn linear_attention(keys: &Keys, layers: u32, row: &Architecture) -> Result<LinearAttentionConfig> {
    let layer_types = match keys.get("attention.recurrent_layers") {
        Some(Value::Array(flags)) => {
            ensure!(
                flags.len() >= layers as usize,
                "{}: {} entries for {layers} layers",
                keys.key("attention.recurrent_layers"),
                flags.len()
            );
            flags[..layers as usize]
                .iter()
                .map(|f| match f {
                    Value::Bool(true) => Ok(LayerType::LinearAttention),
                    Value::Bool(false) => Ok(LayerType::FullAttention),
                    v => bail!(
                        "{}: {v:?} is not a bool",
                        keys.key("attention.recurrent_layers")
                    ),
                })
                .collect::<Result<Vec<_>>>()?
        }
        Some(v) => bail!(
            "{}: {v:?} is not a list",
            keys.key("attention.recurrent_layers")
        ),
        // Every n-th layer attention, the others linear (`full_attention_interval`, 4 where the
        // file does not say, as llama.cpp and transformers read it).
        None => {
            let every = match keys.get("full_attention_interval") {
                None => 4,
                Some(_) => keys.need("full_attention_interval")?,
            };
            ensure!(every > 0, "{} is 0", keys.key("full_attention_interval"));
            LayerType::by_interval(layers, every)
        }
    };
    let value_heads = keys.need("ssm.time_step_rank")?;
    let inner = keys.need("ssm.inner_size")?;
    ensure!(
        value_heads > 0 && inner.is_multiple_of(value_heads),
        "{} ({inner}) is not a whole number of {} ({value_heads}) heads",
        keys.key("ssm.inner_size"),
        keys.key("ssm.time_step_rank")
    );
    Ok(LinearAttentionConfig {
        layer_types,
        linear_num_key_heads: keys.need("ssm.group_count")?,
        linear_num_value_heads: value_heads,
        linear_key_head_dim: keys.need("ssm.state_size")?,
        linear_value_head_dim: inner / value_heads,
        linear_conv_kernel_dim: keys.need("ssm.conv_kernel")?,
        // The converter's order: Qwen3.5's reordered (`_LinearAttentionVReorderBase`), Qwen3-Next's
        // as HF's.
        value_heads: match *row == QWEN3_NEXT {
            true => ValueHeads::Grouped,
            false => ValueHeads::Tiled,
        },
    })
}

/// The ids that end a generation: the file's eos (tokenizer_config.json's `eos_token`,
/// `<|im_end|>` for an instruct Qwen) and `<|endoftext|>`, which Qwen's generation_config.json
/// lists beside it (`eos_token_id: [151645, 151643]`) and which a GGUF does not record.
fn eos_ids(h: &GgufHeader, eos: Option<u32>) -> Vec<u32> {
    let endoftext = match h.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t
            .iter()
            .position(|v| v.as_str() == Some("<|endoftext|>"))
            .and_then(|i| u32::try_from(i).ok()),
        _ => None,
    };
    let mut ids: Vec<u32> = eos.into_iter().collect();
    ids.extend(endoftext.filter(|e| Some(*e) != eos));
    ids
}

/// The sampling defaults generation_config.json gave, as llama.cpp's converter writes them
/// (`general.sampling.*`); absent keys stay unset, as they do for a model file.
fn sampling(h: &GgufHeader) -> GenerationDefaults {
    let float = |k: &str| match h.get(k) {
        Some(Value::F32(v)) => Some(*v),
        Some(Value::F64(v)) => Some(*v as f32),
        _ => None,
    };
    GenerationDefaults {
        temperature: float("general.sampling.temp"),
        top_p: float("general.sampling.top_p"),
        top_k: h
            .get("general.sampling.top_k")
            .and_then(Value::as_u64)
            .and_then(|k| u32::try_from(k).ok()),
        min_p: float("general.sampling.min_p"),
        repetition_penalty: float("general.sampling.penalty_repeat"),
        ..Default::default()
    }
}

/// Checks that the file holds every tensor the model file would (`format::expected_tensors`),
/// each once, under a name [`names::pieces`](super::names::pieces) maps and with its shape, and
/// nothing else; gives every GGUF tensor's pieces (beside its index in `h.tensors`).
pub fn check_tensors(h: &GgufHeader, c: &ModelConfig) -> Result<Vec<(usize, Piece)>> {
    let expected = crate::format::expected_tensors(c);
    // Each expected tensor by name, and how many times the file holds it: one lookup a tensor
    // (a mixture of experts has tens of thousands).
    let mut found: std::collections::HashMap<&str, (&_, usize)> =
        expected.iter().map(|e| (e.name.as_str(), (e, 0))).collect();
    let mut pieces = all_pieces(h, &Names::of(h, c), &c.architecture)?;
    for (i, Piece { name, shape, .. }) in &mut pieces {
        let t = &h.tensors[*i];
        let Some((e, count)) = found.get_mut(name.as_str()) else {
            bail!(
                "tensor {} ({name}): not part of this config's model",
                t.name
            );
        };
        // A matrix of one row as a vector: llama-quantize drops a trailing dimension of 1
        // (Qwen3.5-MoE's and Qwen3-Next's `ffn_gate_inp_shexp`, `[1, hidden]` as the converter
        // writes it, `[hidden]` in every file it quantized). The same values in the same order.
        if e.shape.len() == 2 && e.shape[0] == 1 && shape[..] == e.shape[1..] {
            *shape = e.shape.clone();
        }
        if *shape != e.shape {
            bail!(
                "tensor {} ({name}): shape {shape:?}, the config implies {:?}",
                t.name,
                e.shape
            );
        }
        *count += 1;
    }
    for e in &expected {
        let n = found[e.name.as_str()].1;
        if n != 1 {
            bail!("{}: found {n} times, expected once", e.name);
        }
    }
    Ok(pieces)
}

/// A GGUF read as a model file: its header, and for each of the header's tensors (in its
/// order) the GGUF tensor and piece it comes from.
pub struct Layout {
    pub header: Header,
    pub pieces: Vec<(usize, Piece)>,
}

/// The model file's header for GGUF header `h` of a file of `file_len` bytes: its config (with
/// `dtype` the matrices' storage) and its tensors under the model file's names and shapes.
pub fn model_header(h: &GgufHeader, file_len: u64) -> Result<Header> {
    Ok(layout(h, file_len)?.header)
}

/// [`model_header`], and where each tensor's bytes come from.
///
/// A GGUF's F32 and BF16 tensors are stored as the model file stores them (little-endian, rows
/// one after another): each stays where the GGUF holds it, read in place; an F16 tensor is
/// widened to f32 in the bytes `repack::repack` makes at open. A Q8_0 tensor is the
/// model file's q8 with groups of 32 in another order of its bytes (`repack.rs`): its offset
/// and size here are those of its q8 layout in the bytes `repack::repack` makes at open, and so
/// a Q5_0 tensor's (q8 too) and a Q4_0 tensor's (the model file's q4 with groups of 32). Q4_K,
/// Q5_K and Q6_K blocks are read where they lie ([`crate::format::KQuant`]). A piece that is
/// not a run of a tensor's bytes as they are (gathered rows, `A_log`) is made at open too.
/// Other ggml types are refused by name.
pub fn layout(h: &GgufHeader, file_len: u64) -> Result<Layout> {
    let mut config = model_config(h)?;
    let pieces = check_tensors(h, &config)?;
    let storage = |t: &GgufTensor| {
        match t.ggml_type.name {
        "F32" => Ok((DType::F32, 0)),
        "BF16" => Ok((DType::Bf16, 0)),
        // Widened to f32 at open (repack.rs).
        "F16" => Ok((DType::F32, 0)),
        "Q8_0" => Ok((DType::Q8, LEGACY_GROUP)),
        "Q4_0" => Ok((DType::Q4, LEGACY_GROUP)),
        "Q5_0" => Ok((DType::Q8, LEGACY_GROUP)),
        "Q4_K" => Ok((DType::K(KQuant::Q4K), K_BLOCK as u32)),
        "Q5_K" => Ok((DType::K(KQuant::Q5K), K_BLOCK as u32)),
        "Q6_K" => Ok((DType::K(KQuant::Q6K), K_BLOCK as u32)),
        other => bail!(
            "tensor {} is {other}: GGUF files of F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K \
             tensors run so far; for this one, `qwen3 export` the HuggingFace checkpoint it was \
             made from",
            t.name
        ),
    }
    };
    // The matrices' storage is the type most of them are in (a Q4_K_M file's Q4_K, its Q4_0's
    // Q4_0, whose tables are Q6_K), the embedding's on a tie; `Header::check_tensor_set` below
    // holds every other matrix to it, or to the types a GGUF mixes with it, and every norm and
    // bias to f32.
    let embd = h
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .context("no token_embd.weight tensor")?;
    let mut counts: Vec<((DType, u32), usize)> = vec![(storage(embd)?, 0)];
    for (i, _) in pieces.iter().filter(|(_, p)| p.shape.len() == 2) {
        let s = storage(&h.tensors[*i])?;
        match counts.iter_mut().find(|(k, _)| *k == s) {
            Some((_, c)) => *c += 1,
            None => counts.push((s, 1)),
        }
    }
    // The first of the most common: the embedding's when it ties.
    let most = counts.iter().map(|&(_, n)| n).max().unwrap_or(0);
    (config.dtype, config.group_size) = counts.iter().find(|&&(_, n)| n == most).unwrap().0;
    // The repacked bytes' length so far: each Q8_0 or Q5_0 (Q4_0) tensor's q8 (q4) layout, each
    // F16 tensor's f32 values, each piece made at open, at the next multiple of 64
    // (format::ALIGN), as a model file places its tensors.
    let mut repacked = 0u64;
    let mut tensors = Vec::with_capacity(pieces.len());
    for (i, piece) in &pieces {
        let t = &h.tensors[*i];
        let (dtype, group_size) = storage(t)?;
        let shape = piece.shape.clone();
        let nbytes = piece.take.nbytes(t);
        if matches!(dtype, DType::K(_)) {
            // Their bytes must be what the shape in whole blocks takes.
            let want = tensor_nbytes(dtype, &shape, group_size);
            ensure!(
                want == Some(nbytes),
                "tensor {}: {nbytes} bytes of {dtype} for a {shape:?} matrix (its rows must be \
                 whole blocks of 256)",
                t.name,
            );
        }
        let (offset, nbytes) = match Legacy::of(t.ggml_type.name) {
            // Read where they lie.
            None if piece.take.in_place() => (piece.take.ranges(t)[0].start, nbytes),
            // Taken apart (widened), gathered or turned, into the repacked bytes at open.
            _ => {
                let offset = align_up(repacked).context("overflow")?;
                let nbytes = tensor_nbytes(dtype, &shape, group_size).with_context(|| {
                    format!("tensor {}: {shape:?} in groups of {group_size}", t.name)
                })?;
                repacked = offset + nbytes;
                (offset, nbytes)
            }
        };
        tensors.push(TensorInfo {
            name: piece.name.clone(),
            dtype,
            shape,
            group_size,
            offset,
            nbytes,
        });
    }
    let header = Header {
        version: crate::format::FORMAT_VERSION,
        header_len: h.data_start,
        file_len,
        config,
        tensors,
    };
    header.check_tensor_set()?;
    Ok(Layout { header, pieces })
}
