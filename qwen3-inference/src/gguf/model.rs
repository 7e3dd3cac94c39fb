//! A GGUF file as the model it holds: the config from its metadata (llama.cpp's keys, named
//! `{arch}.{key}`) and each tensor under the model file's names (HuggingFace's), for the
//! families llama.cpp calls `qwen3`, `qwen2` and `qwen3moe`. What llama.cpp's
//! `convert_hf_to_gguf.py` writes, read back:
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
//! ```
//!
//! A mixture of experts' experts are stacked in a GGUF: `blk.N.ffn_gate_exps` is one
//! `[experts, rows, cols]` tensor where the model file has `mlp.experts.E.gate_proj` for each
//! `E`. Each expert's rows are one contiguous run of its bytes (the expert is the outermost
//! dimension), so each becomes a tensor of its own, a slice of the GGUF's ([`pieces`]).
//!
//! A tensor's shape in the file lists its row length first (`dims[0]`, ggml's `ne0`), so the
//! model's `[rows, cols]` is `dims` reversed.

use super::repack::Legacy;
use super::{GgufHeader, GgufTensor, Value};
use crate::format::reader::{Header, TensorInfo};
use crate::format::{
    align_up, tensor_nbytes, DType, GenerationDefaults, ModelConfig, MoeConfig, RopeScaling,
    K_BLOCK,
};
use anyhow::{bail, ensure, Context, Result};

/// Values a block of ggml's legacy types (Q8_0, Q4_0, Q5_0) holds: such a tensor is q8 or q4 in
/// groups of this many (`repack.rs`).
pub const LEGACY_GROUP: u32 = 32;

/// The model file's name of GGUF tensor `name` (llama.cpp's `tensor_mapping.py`, for the dense
/// Qwen families), or `None` for a name it does not use.
pub fn hf_name(name: &str) -> Option<String> {
    let whole = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = whole {
        return Some(n.into());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // A mixture of experts' router (its experts: [`pieces`]).
        "ffn_gate_inp" => "mlp.gate",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("model.layers.{layer}.{module}.{kind}"))
}

/// The model's `[rows, cols]` (or `[n]`) shape of a GGUF tensor: its dims reversed.
pub fn hf_shape(t: &GgufTensor) -> Vec<u64> {
    t.dims.iter().rev().copied().collect()
}

/// One tensor of the model file that a GGUF tensor holds: its name and shape, and which bytes of
/// the GGUF tensor are its (all of them, or one expert's slice of a stacked tensor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub name: String,
    pub shape: Vec<u64>,
    /// Bytes from the GGUF tensor's start, and how many.
    pub offset: u64,
    pub nbytes: u64,
}

/// The model file's tensors GGUF tensor `t` holds: itself under its model-file name
/// ([`hf_name`]), or for a stacked mixture of experts' `blk.N.ffn_{gate,up,down}_exps.weight`
/// (`[experts, rows, cols]`), each expert's `[rows, cols]` slice as
/// `model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`. `None`: a name no family uses.
pub fn pieces(t: &GgufTensor) -> Option<Vec<Piece>> {
    if let Some(name) = hf_name(&t.name) {
        return Some(vec![Piece {
            name,
            shape: hf_shape(t),
            offset: 0,
            nbytes: t.nbytes,
        }]);
    }
    let rest = t.name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let proj = match rest {
        "ffn_gate_exps.weight" => "gate_proj",
        "ffn_up_exps.weight" => "up_proj",
        "ffn_down_exps.weight" => "down_proj",
        _ => return None,
    };
    let shape = hf_shape(t);
    let [experts, rows, cols] = shape[..] else {
        return None;
    };
    // Whole rows of whole blocks an expert: the bytes split evenly.
    if experts == 0 || !t.nbytes.is_multiple_of(experts) {
        return None;
    }
    let each = t.nbytes / experts;
    Some(
        (0..experts)
            .map(|e| Piece {
                name: format!("model.layers.{layer}.mlp.experts.{e}.{proj}.weight"),
                shape: vec![rows, cols],
                offset: e * each,
                nbytes: each,
            })
            .collect(),
    )
}

/// The model's config from a GGUF file's metadata. The matrices keep the GGUF's own storage,
/// tensor by tensor (`GgufTensor::ggml_type`); `dtype` says f32, what they dequantize to
/// (`blocks.rs`), and the sampling defaults are absent (a GGUF carries none).
pub fn model_config(h: &GgufHeader) -> Result<ModelConfig> {
    let arch = h
        .architecture()
        .context("no general.architecture: not a model file llama.cpp wrote")?;
    let (architecture, attention_bias, qk_norm) = match arch {
        "qwen3" => ("Qwen3ForCausalLM", false, true),
        "qwen2" => ("Qwen2ForCausalLM", true, false),
        "qwen3moe" => ("Qwen3MoeForCausalLM", false, true),
        a => bail!("GGUF architecture {a}: the families read are qwen3, qwen2 and qwen3moe"),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let int = |k: &str| -> Result<Option<u32>> {
        match h.get(&key(k)) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => bail!("{}: {v:?} is not a 32-bit count", key(k)),
            },
        }
    };
    let need = |k: &str| int(k)?.with_context(|| format!("{} is missing", key(k)));
    let float = |k: &str| -> Result<f64> {
        match h.get(&key(k)) {
            Some(Value::F32(v)) => Ok(*v as f64),
            Some(Value::F64(v)) => Ok(*v),
            Some(v) => bail!("{}: {v:?} is not a float", key(k)),
            None => bail!("{} is missing", key(k)),
        }
    };
    // Long-context RoPE (YaRN) is written as rope.scaling.*: not read yet, so refused rather
    // than run without it.
    if let Some(v) = h.get(&key("rope.scaling.type")) {
        if v.as_str() != Some("none") {
            bail!(
                "{}: {v:?}: RoPE scaling in a GGUF is not read yet",
                key("rope.scaling.type")
            );
        }
    }
    let hidden_size = need("embedding_length")?;
    let num_attention_heads = need("attention.head_count")?;
    let embd = h
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .context("no token_embd.weight tensor")?;
    let vocab = *hf_shape(embd).first().unwrap_or(&0);
    let head_dim = match int("attention.key_length")? {
        Some(d) => d,
        None => hidden_size / num_attention_heads.max(1),
    };
    // Qwen3-MoE: every layer sparse (llama.cpp's qwen3moe has no dense layers among them), the
    // chosen experts' probabilities renormalised (`build_moe_ffn(..., norm_w = true, ...)`).
    let moe = match arch {
        "qwen3moe" => Some(MoeConfig {
            num_experts: need("expert_count")?,
            num_experts_per_tok: need("expert_used_count")?,
            moe_intermediate_size: need("expert_feed_forward_length")?,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: 0,
        }),
        _ => None,
    };
    let token = |k: &str| {
        h.get(k)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    let config = ModelConfig {
        architecture: architecture.into(),
        hidden_size,
        intermediate_size: need("feed_forward_length")?,
        num_hidden_layers: need("block_count")?,
        num_attention_heads,
        num_key_value_heads: int("attention.head_count_kv")?.unwrap_or(num_attention_heads),
        head_dim,
        vocab_size: u32::try_from(vocab).context("token_embd.weight: too many rows")?,
        max_position_embeddings: need("context_length")?,
        rope_theta: float("rope.freq_base")?,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
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
        partial_rotary_factor: 1.0,
        attn_output_gate: false,
        linear_attention: None,
        vision: None,
    };
    config.validate()?;
    Ok(config)
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
/// each once, under a name [`pieces`] maps and with its shape, and nothing else.
pub fn check_tensors(h: &GgufHeader, c: &ModelConfig) -> Result<()> {
    let expected = crate::format::expected_tensors(c);
    // Each expected tensor by name, and how many times the file holds it: one lookup a tensor
    // (a mixture of experts has tens of thousands).
    let mut found: std::collections::HashMap<&str, (&_, usize)> =
        expected.iter().map(|e| (e.name.as_str(), (e, 0))).collect();
    for t in &h.tensors {
        let pieces = pieces(t).with_context(|| {
            format!(
                "tensor {}: not a name of the {} family",
                t.name, c.architecture
            )
        })?;
        for Piece { name, shape, .. } in pieces {
            let Some((e, count)) = found.get_mut(name.as_str()) else {
                bail!(
                    "tensor {} ({name}): not part of this config's model",
                    t.name
                );
            };
            if shape != e.shape {
                bail!(
                    "tensor {} ({name}): shape {shape:?}, the config implies {:?}",
                    t.name,
                    e.shape
                );
            }
            *count += 1;
        }
    }
    for e in &expected {
        let n = found[e.name.as_str()].1;
        if n != 1 {
            bail!("{}: found {n} times, expected once", e.name);
        }
    }
    Ok(())
}

/// The model file's header for GGUF header `h` of a file of `file_len` bytes: its config (with
/// `dtype` the matrices' storage) and its tensors under the model file's names and shapes.
///
/// A GGUF's F32 and BF16 tensors are stored as the model file stores them (little-endian, rows
/// one after another): each stays where the GGUF holds it, read in place; an F16 tensor is
/// widened to f32 in the bytes `repack::repack` makes at open. A Q8_0 tensor is the
/// model file's q8 with groups of 32 in another order of its bytes (`repack.rs`): its offset
/// and size here are those of its q8 layout in the bytes `repack::repack` makes at open, and so
/// a Q5_0 tensor's (q8 too) and a Q4_0 tensor's (the model file's q4 with groups of 32). Q4_K,
/// Q5_K and Q6_K blocks are read where they lie ([`crate::format::KQuant`]). Other ggml types
/// are refused by name.
pub fn model_header(h: &GgufHeader, file_len: u64) -> Result<Header> {
    let mut config = model_config(h)?;
    check_tensors(h, &config)?;
    let storage = |t: &GgufTensor| {
        match t.ggml_type.name {
        "F32" => Ok((DType::F32, 0)),
        "BF16" => Ok((DType::Bf16, 0)),
        // Widened to f32 at open (repack.rs).
        "F16" => Ok((DType::F32, 0)),
        "Q8_0" => Ok((DType::Q8, LEGACY_GROUP)),
        "Q4_0" => Ok((DType::Q4, LEGACY_GROUP)),
        "Q5_0" => Ok((DType::Q8, LEGACY_GROUP)),
        "Q4_K" => Ok((DType::Q4K, K_BLOCK as u32)),
        "Q5_K" => Ok((DType::Q5K, K_BLOCK as u32)),
        "Q6_K" => Ok((DType::Q6K, K_BLOCK as u32)),
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
    for t in h.tensors.iter().filter(|t| t.dims.len() >= 2) {
        // A stacked tensor counts once per expert.
        let (s, n) = (storage(t)?, t.dims.get(2).map_or(1, |&e| e as usize));
        match counts.iter_mut().find(|(k, _)| *k == s) {
            Some((_, c)) => *c += n,
            None => counts.push((s, n)),
        }
    }
    // The first of the most common: the embedding's when it ties.
    let most = counts.iter().map(|&(_, n)| n).max().unwrap_or(0);
    (config.dtype, config.group_size) = counts.iter().find(|&&(_, n)| n == most).unwrap().0;
    // The repacked bytes' length so far: each Q8_0 or Q5_0 (Q4_0) tensor's q8 (q4) layout, each
    // F16 tensor's f32 values, at the next multiple of 64 (format::ALIGN), as a model file places
    // its tensors.
    let mut repacked = 0u64;
    let mut tensors = Vec::with_capacity(h.tensors.len());
    for t in &h.tensors {
        let (dtype, group_size) = storage(t)?;
        // check_tensors mapped every name.
        for piece in pieces(t).context("a tensor's name")? {
            let shape = piece.shape;
            let (offset, nbytes) = match dtype {
                // Taken apart (widened) into the repacked bytes at open.
                _ if Legacy::of(t.ggml_type.name).is_some() => {
                    let offset = align_up(repacked).context("overflow")?;
                    let nbytes = tensor_nbytes(dtype, &shape, group_size).with_context(|| {
                        format!("tensor {}: {shape:?} in groups of {group_size}", t.name)
                    })?;
                    repacked = offset + nbytes;
                    (offset, nbytes)
                }
                // Read where they lie: their bytes must be what the shape in whole blocks takes.
                DType::Q4K | DType::Q5K | DType::Q6K => {
                    let want = tensor_nbytes(dtype, &shape, group_size);
                    ensure!(
                        want == Some(piece.nbytes),
                        "tensor {}: {} bytes of {dtype} for a {shape:?} matrix (its rows must be \
                         whole blocks of 256)",
                        t.name,
                        piece.nbytes
                    );
                    (t.start + piece.offset, piece.nbytes)
                }
                _ => (t.start + piece.offset, piece.nbytes),
            };
            tensors.push(TensorInfo {
                name: piece.name,
                dtype,
                shape,
                group_size,
                offset,
                nbytes,
            });
        }
    }
    let header = Header {
        version: crate::format::FORMAT_VERSION,
        header_len: h.data_start,
        file_len,
        config,
        tensors,
    };
    header.check_tensor_set()?;
    Ok(header)
}
