//! The pico-qwen model file, defined once.
//!
//! The exporter writes it with [`writer::ModelWriter`], the runtime reads it with
//! [`reader::ModelFile`]; nothing else in the workspace knows its bytes. The byte-by-byte layout is
//! documented in `docs/format.md`; in short (all integers little-endian):
//!
//! ```text
//! preamble   magic "QW3PICO\0", format version u32, byte-order mark u32, header length u64,
//!            file length u64                                        (32 bytes)
//! config     architecture, sizes, rope_theta, eps, token ids, generation defaults, dtype
//! directory  tensor count u32, then per tensor: name, dtype, shape, group size, offset, bytes
//! padding    zeros up to the next multiple of 64
//! data       each tensor's bytes, every tensor starting on a 64-byte boundary
//! ```
//!
//! A q8 tensor of shape `[rows, cols]` is stored as one block: `rows*cols` int8 values (row-major),
//! zero padding to a 64-byte boundary, then `rows * cols/group_size` f32 scales (row-major), so
//! group `g` of row `r` is `q[r*cols + g*gs .. + gs] * scales[r*(cols/gs) + g]`.

pub mod atomic;
pub mod bytes;
pub mod config;
pub mod mapped;
pub mod reader;
pub mod view;
pub mod writer;

pub use config::architecture;
pub use config::{
    Architecture, EmbeddingConfig, GenerationDefaults, ImageProcessor, LayerType,
    LinearAttentionConfig, ModelConfig, MoeConfig, RopeScaling, ValueHeads, VisionConfig,
    VisionInput, ARCHITECTURES,
};
pub use reader::{ModelFile, Reader};
pub use view::TensorView;
pub use writer::ModelWriter;

use std::path::{Path, PathBuf};

/// The first 8 bytes of every model file.
pub const MAGIC: [u8; 8] = *b"QW3PICO\0";
/// Bumped on any change of the layout. A reader reads this version and the older ones it lists in
/// [`OLDEST_READABLE_VERSION`]..; it refuses newer ones.
///
/// Version 2 added two flags to the config block (`attention_bias`, `qk_norm`) for the Qwen2
/// family; a version 1 file is a Qwen3 model (no biases, q/k norms), and loads as one. Version 3
/// added the q4 dtype (code 3), version 4 the q6 dtype (code 4) for the tensors a q4 file keeps
/// finer. Version 5 added two blocks to the config: RoPE scaling (YaRN) and experts (Qwen3-MoE);
/// version 6 one more, the embedding head (Qwen3-Embedding: no classifier); version 7 the hybrid
/// models (Qwen3.5: partial rotation, the attention output gate, Gated DeltaNet layers); version
/// 8 the vision tower (its shape, the image processor's settings, the image tokens, M-RoPE's
/// split; the tower's tensors `model.visual.*`); version 9 what only a GGUF held before, so that
/// `qwen3 export FILE.gguf` copies it as it is: GGUF's K-quant dtypes (codes 5, 6 and 7) and a
/// Gated DeltaNet's value heads in llama.cpp's tiled order (a byte after the vision block).
/// A file is written with the oldest version that holds its tensors ([`version_for`]) and its
/// config ([`ModelConfig::since_version`]), so a build from before q4 still reads a q8 file
/// exported today.
pub const FORMAT_VERSION: u32 = 9;
/// The version every file is written with at least: the config block has held its flags since
/// version 2.
pub const OLDEST_WRITTEN_VERSION: u32 = 2;

/// The oldest format version that can hold tensors of these dtypes: [`OLDEST_WRITTEN_VERSION`],
/// or the version that brought the newest of them ([`DType::since_version`]).
pub fn version_for(dtypes: impl IntoIterator<Item = DType>) -> u32 {
    dtypes
        .into_iter()
        .map(DType::since_version)
        .fold(OLDEST_WRITTEN_VERSION, u32::max)
}
/// The oldest version this build still reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// Written as a little-endian u32; a reader that sees other bytes was handed a file from a
/// big-endian writer (or garbage) and refuses it.
pub const BYTE_ORDER_MARK: u32 = 0x0A0B_0C0D;
/// Every tensor (and each q8 tensor's scale array) starts at a multiple of this many bytes, so a
/// tensor can be viewed in place as `&[f32]`/`&[u16]` from the page-aligned mmap, and loaded into
/// SIMD registers (and uploaded to a GPU) without copying.
pub const ALIGN: u64 = 64;
/// Length of the fixed preamble before the config block.
pub const PREAMBLE_LEN: u64 = 32;

mod dtype;
pub use dtype::{tensor_nbytes, value_bytes, DType, KQuant, K_BLOCK};

/// Rounds `n` up to the next multiple of [`ALIGN`]; `None` on overflow.
pub fn align_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

/// What a tensor is: a norm weight or a bias (vectors, kept in f32 whatever the export dtype), a
/// mixture-of-experts router (a matrix kept in f32: its products pick the experts, and a flipped
/// pick changes a token's whole MLP, so it is not quantized; it is 1/400 of a Qwen3-30B-A3B
/// token's bytes), or a matrix (stored in the export dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    Norm,
    Bias,
    Router,
    /// A Gated DeltaNet's own parameters: its convolution's filters `[conv_dim, K]`, its decay's
    /// `A_log` and `dt_bias` `[num_v_heads]`. Small, and the state's arithmetic (an exponential
    /// of the decay, compounded over the whole context) is sensitive to them: f32 always, as
    /// llama.cpp keeps them.
    Param,
    Matrix,
}

impl TensorKind {
    /// Whether tensors of this kind are f32 in every file.
    pub fn always_f32(self) -> bool {
        !matches!(self, TensorKind::Matrix)
    }
}

/// One tensor the forward pass needs: its HuggingFace name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub kind: TensorKind,
}

/// The tensors a model file holds, in file order, with the shapes the config implies (Qwen3: q/k
/// norms; Qwen2: q/k/v biases; Qwen3-MoE: a router and experts in its sparse layers).
///
/// Names are HuggingFace's (`modeling_qwen3.py`), so a reader can match them with the checkpoint.
/// The exporter writes exactly these; the reader checks that exactly these are present.
pub fn expected_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    let (d, hd, v) = (c.hidden_size as u64, c.head_dim as u64, c.vocab_size as u64);
    let (nq, nkv) = (c.num_attention_heads as u64, c.num_key_value_heads as u64);
    let m = |name: String, shape: Vec<u64>| ExpectedTensor {
        name,
        shape,
        kind: TensorKind::Matrix,
    };
    let n = |name: String, len: u64| ExpectedTensor {
        name,
        shape: vec![len],
        kind: TensorKind::Norm,
    };
    let bias = |name: String, len: u64| ExpectedTensor {
        name,
        shape: vec![len],
        kind: TensorKind::Bias,
    };
    let param = |name: String, shape: Vec<u64>| ExpectedTensor {
        name,
        shape,
        kind: TensorKind::Param,
    };
    let mut t = vec![m("model.embed_tokens.weight".into(), vec![v, d])];
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        t.push(n(format!("{p}.input_layernorm.weight"), d));
        if let Some(la) = c.linear_attention.as_ref().filter(|la| la.is_linear(l)) {
            // Qwen3.5's Gated DeltaNet (`Qwen3_5GatedDeltaNet`), in its module's order.
            let q = format!("{p}.linear_attn");
            let (cd, vd, vh) = (
                la.conv_dim() as u64,
                la.value_dim() as u64,
                la.linear_num_value_heads as u64,
            );
            let k = la.linear_conv_kernel_dim as u64;
            t.push(m(format!("{q}.in_proj_qkv.weight"), vec![cd, d]));
            t.push(m(format!("{q}.in_proj_z.weight"), vec![vd, d]));
            t.push(m(format!("{q}.in_proj_b.weight"), vec![vh, d]));
            t.push(m(format!("{q}.in_proj_a.weight"), vec![vh, d]));
            // HF's `[conv_dim, 1, K]` (one filter a channel), stored without its middle axis.
            t.push(param(format!("{q}.conv1d.weight"), vec![cd, k]));
            t.push(param(format!("{q}.dt_bias"), vec![vh]));
            t.push(param(format!("{q}.A_log"), vec![vh]));
            t.push(n(
                format!("{q}.norm.weight"),
                la.linear_value_head_dim as u64,
            ));
            t.push(m(format!("{q}.out_proj.weight"), vec![d, vd]));
            t.push(n(format!("{p}.post_attention_layernorm.weight"), d));
            t.extend(mlp_tensors(c, l, &p));
            continue;
        }
        t.push(m(format!("{p}.self_attn.q_proj.weight"), vec![nq * hd, d]));
        if c.attn_output_gate {
            // The gate's rows of HF's q_proj, stored apart (see ModelConfig::attn_output_gate).
            t.push(m(
                format!("{p}.self_attn.output_gate.weight"),
                vec![nq * hd, d],
            ));
        }
        t.push(m(format!("{p}.self_attn.k_proj.weight"), vec![nkv * hd, d]));
        t.push(m(format!("{p}.self_attn.v_proj.weight"), vec![nkv * hd, d]));
        if c.attention_bias {
            // Qwen2: q/k/v projections with biases.
            t.push(bias(format!("{p}.self_attn.q_proj.bias"), nq * hd));
            t.push(bias(format!("{p}.self_attn.k_proj.bias"), nkv * hd));
            t.push(bias(format!("{p}.self_attn.v_proj.bias"), nkv * hd));
        }
        if c.qk_norm {
            // Qwen3: per-head RMSNorms of q and k.
            t.push(n(format!("{p}.self_attn.q_norm.weight"), hd));
            t.push(n(format!("{p}.self_attn.k_norm.weight"), hd));
        }
        t.push(m(format!("{p}.self_attn.o_proj.weight"), vec![d, nq * hd]));
        t.push(n(format!("{p}.post_attention_layernorm.weight"), d));
        t.extend(mlp_tensors(c, l, &p));
    }
    t.push(n("model.norm.weight".into(), d));
    // An embedding model has no classifier, tied or not.
    if !c.tie_word_embeddings && c.embedding.is_none() {
        t.push(m("lm_head.weight".into(), vec![v, d]));
    }
    // A vision-language model's tower (`model.visual.*`), after the text model.
    if let Some(vision) = &c.vision {
        t.extend(vision.tower.tensors());
    }
    t
}

/// Layer `l`'s MLP tensors, under its prefix `p`: a SwiGLU, or a router and experts.
fn mlp_tensors(c: &ModelConfig, l: u32, p: &str) -> Vec<ExpectedTensor> {
    let (d, ff) = (c.hidden_size as u64, c.intermediate_size as u64);
    let m = |name: String, shape: Vec<u64>| ExpectedTensor {
        name,
        shape,
        kind: TensorKind::Matrix,
    };
    let mut t = Vec::new();
    match &c.moe {
        // Qwen3-MoE's sparse layers: the router, then each expert's SwiGLU, under the hub's
        // per-expert names (the exporter splits transformers 5's fused tensors into these).
        Some(moe) if moe.is_sparse(l) => {
            let (e, mff) = (moe.num_experts as u64, moe.moe_intermediate_size as u64);
            t.push(ExpectedTensor {
                name: format!("{p}.mlp.gate.weight"),
                shape: vec![e, d],
                kind: TensorKind::Router,
            });
            for x in 0..e {
                let q = format!("{p}.mlp.experts.{x}");
                t.push(m(format!("{q}.gate_proj.weight"), vec![mff, d]));
                t.push(m(format!("{q}.up_proj.weight"), vec![mff, d]));
                t.push(m(format!("{q}.down_proj.weight"), vec![d, mff]));
            }
            // Qwen3.5-MoE: the shared expert, and its gate (a router-like [1, hidden], f32).
            let sff = moe.shared_expert_intermediate_size as u64;
            if sff > 0 {
                let q = format!("{p}.mlp.shared_expert");
                t.push(m(format!("{q}.gate_proj.weight"), vec![sff, d]));
                t.push(m(format!("{q}.up_proj.weight"), vec![sff, d]));
                t.push(m(format!("{q}.down_proj.weight"), vec![d, sff]));
                t.push(ExpectedTensor {
                    name: format!("{p}.mlp.shared_expert_gate.weight"),
                    shape: vec![1, d],
                    kind: TensorKind::Router,
                });
            }
        }
        _ => {
            t.push(m(format!("{p}.mlp.gate_proj.weight"), vec![ff, d]));
            t.push(m(format!("{p}.mlp.up_proj.weight"), vec![ff, d]));
            t.push(m(format!("{p}.mlp.down_proj.weight"), vec![d, ff]));
        }
    }
    t
}

/// The group size of the q8 embedding table and classifier in a q4 file (see [`tensor_specs`]).
pub const Q4_TABLE_GROUP: u32 = 64;

/// Which tensors of a q4 file keep more bits, and how many (the others are q4). Quantization
/// error does not hurt every tensor alike: the classifier writes the logits directly; `v_proj`'s
/// error reaches the residual stream through attention's weighted sum and `o_proj`, linearly,
/// and `down_proj`'s output is added to it directly. llama.cpp's Q4_K_M gives these 6 bits
/// (Q6_K). What each choice costs and buys is measured in docs/quantization.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q4Mix {
    /// The embedding table and the classifier (`export --tables`). In q8 they take groups of
    /// [`Q4_TABLE_GROUP`] where the width allows (they are used alone, so their group size is
    /// free); in q6 and q4 the file's group size.
    pub tables: MixDType,
    /// `v_proj` and `down_proj` of the layers [`sensitive_layer`] picks (`export --sensitive`),
    /// at the file's group size (`v_proj` shares its input's quantization with `q_proj` and
    /// `k_proj`, so their groups must match).
    pub sensitive: MixDType,
}

/// How a [`Q4Mix`] stores a group of tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixDType {
    Q4,
    Q6,
    Q8,
}

impl MixDType {
    pub fn dtype(self) -> DType {
        match self {
            MixDType::Q4 => DType::Q4,
            MixDType::Q6 => DType::Q6,
            MixDType::Q8 => DType::Q8,
        }
    }

    /// `q4`, `q6` or `q8`.
    pub fn parse(s: &str) -> Option<MixDType> {
        [MixDType::Q4, MixDType::Q6, MixDType::Q8]
            .into_iter()
            .find(|f| f.dtype().name() == s)
    }
}

impl Default for Q4Mix {
    /// Tables and sensitive layers in q6, as Q4_K_M gives them 6 bits: a file of Q4_K_M's size.
    /// q8 for both is a little more accurate and 15% larger (docs/quantization.md).
    fn default() -> Self {
        Q4Mix {
            tables: MixDType::Q6,
            sensitive: MixDType::Q6,
        }
    }
}

/// The layers whose `v_proj` and `down_proj` a q4 file keeps finer: the first and last eighth,
/// and every third layer between them, half the layers in all. This is llama.cpp's
/// `use_more_bits` (src/llama-quant.cpp), its Q4_K_M's rule for `attn_v` and `ffn_down`.
pub fn sensitive_layer(layer: u32, n_layers: u32) -> bool {
    let eighth = n_layers / 8;
    layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2
}

/// Whether `name` is the embedding table or the classifier, which a q4 file stores apart.
fn is_table(name: &str) -> bool {
    name == "model.embed_tokens.weight" || name == "lm_head.weight"
}

/// The layer a tensor name belongs to and the rest of its name: `model.layers.3.mlp.down_proj.weight`
/// gives `(3, "mlp.down_proj.weight")`.
fn layer_of(name: &str) -> Option<(u32, &str)> {
    let (layer, rest) = name.strip_prefix("model.layers.")?.split_once('.')?;
    Some((layer.parse().ok()?, rest))
}

/// Every tensor of a model with this config as the model file stores it by default: norm weights
/// and biases in f32, matrices in the config's dtype and group size, except in a q4 file the
/// tensors [`Q4Mix::default`] keeps finer. The exporter writes these ([`tensor_specs_with`] for
/// another mix); the reader accepts any mix.
pub fn tensor_specs(c: &ModelConfig) -> Vec<writer::TensorSpec> {
    tensor_specs_with(c, Q4Mix::default())
}

/// [`tensor_specs`] with a q4 file's tensors stored as `mix` says (ignored for other dtypes).
pub fn tensor_specs_with(c: &ModelConfig, mix: Q4Mix) -> Vec<writer::TensorSpec> {
    // q6 packs runs of 32 values: with groups of another size, q8 in its place.
    let stored = |m: MixDType| match m {
        MixDType::Q6 if !c.group_size.is_multiple_of(32) => MixDType::Q8,
        m => m,
    };
    let (tables, sensitive_as) = (stored(mix.tables), stored(mix.sensitive));
    expected_tensors(c)
        .into_iter()
        .map(|e| {
            let table = is_table(&e.name);
            let sensitive = layer_of(&e.name).is_some_and(|(l, rest)| {
                // An expert's down_proj is its layer's down_proj (llama.cpp's rule matches
                // `ffn_down` and `ffn_down_exps` alike).
                let expert_down =
                    rest.starts_with("mlp.experts.") && rest.ends_with(".down_proj.weight");
                // A Gated DeltaNet's values come out of its in_proj_qkv, which llama.cpp's
                // Q4_K_M counts with the `attn_v`s (its `attn_qkv`).
                sensitive_layer(l, c.num_hidden_layers)
                    && (matches!(
                        rest,
                        "self_attn.v_proj.weight"
                            | "linear_attn.in_proj_qkv.weight"
                            | "mlp.down_proj.weight"
                    ) || expert_down)
            });
            let (dtype, group_size) = match e.kind {
                TensorKind::Norm | TensorKind::Bias | TensorKind::Router | TensorKind::Param => {
                    (DType::F32, 0)
                }
                // Rows the group size does not divide cannot be grouped: bf16, as it came.
                TensorKind::Matrix if stays_bf16(c, &e.shape) => (DType::Bf16, 0),
                TensorKind::Matrix if c.dtype != DType::Q4 => (c.dtype, c.group_size),
                // q8's own groups of 64 where the width allows: the q8 kernels' fast path wants
                // a multiple of 64.
                TensorKind::Matrix if table && tables == MixDType::Q8 => {
                    let gs = match c.hidden_size.is_multiple_of(Q4_TABLE_GROUP) {
                        true => Q4_TABLE_GROUP,
                        false => c.group_size,
                    };
                    (DType::Q8, gs)
                }
                TensorKind::Matrix if table => (tables.dtype(), c.group_size),
                TensorKind::Matrix if sensitive => (sensitive_as.dtype(), c.group_size),
                TensorKind::Matrix => (DType::Q4, c.group_size),
            };
            writer::TensorSpec {
                name: e.name,
                dtype,
                shape: e.shape,
                group_size,
            }
        })
        .collect()
}

/// Whether a matrix of `shape` stays bf16 in a file of `c`'s dtype: in a q8 or q4 file, when the
/// group size does not divide its rows (a group never spans two rows). Qwen3.5-35B-A3B's vision
/// tower has a 4304-wide MLP, which no group size of 32 or more divides, and a group size a user
/// picks may not divide an expert's rows (Qwen3-30B-A3B's are 768 wide). The products that share
/// one input all read rows of its width, so they are all grouped or all bf16, never a mix.
pub fn stays_bf16(c: &ModelConfig, shape: &[u64]) -> bool {
    let cols = shape.last().copied().unwrap_or(0);
    matches!(c.dtype, DType::Q8 | DType::Q4)
        && c.group_size > 0
        && !cols.is_multiple_of(c.group_size as u64)
}

/// Whether a model file may store a matrix `name` of `shape` of a file of dtype `file` as `dtype`
/// in groups of `group_size`: as the file's dtype and group size, or, in a q4 file, also as q6
/// or q8 at the file's group size (any matrix: the kernels take each tensor as it is stored, and
/// the products that share one quantized input need one group size), and the embedding table and
/// classifier as q8 in groups of [`Q4_TABLE_GROUP`]; and as bf16 when its rows cannot be grouped
/// ([`stays_bf16`]), and only then. A GGUF's mix of K-quants is held to the types llama-quantize
/// writes instead (below).
pub fn matrix_storage_ok(
    c: &ModelConfig,
    name: &str,
    shape: &[u64],
    dtype: DType,
    group_size: u32,
) -> bool {
    if stays_bf16(c, shape) {
        return dtype == DType::Bf16 && group_size == 0;
    }
    let table = is_table(name);
    if c.dtype.is_k_quant() || dtype.is_k_quant() {
        // A GGUF's mix (llama-quantize's Q4_K_M: Q4_K, with Q6_K for the embedding table and
        // some `v` and `down` matrices; its Q4_0: Q4_0 with a Q6_K table): every matrix in one
        // of the types whose products read activations in groups of 32 (where a row is not
        // whole blocks of 256, llama-quantize falls back to Q5_0 and Q8_0: both q8 here). A
        // matrix it was told to keep finer (`--token-embedding-type bf16`, `--tensor-type
        // attn_v=f16`; F16 is f32 here) reads the activations unquantized.
        return match dtype {
            DType::K(_) => group_size as u64 == K_BLOCK,
            DType::Q8 | DType::Q4 => group_size == 32,
            DType::F32 | DType::Bf16 => group_size == 0,
            DType::Q6 => false,
        };
    }
    (dtype == c.dtype && group_size == c.group_size)
        || (c.dtype == DType::Q4
            && matches!(dtype, DType::Q6 | DType::Q8)
            && group_size == c.group_size)
        || (c.dtype == DType::Q4 && dtype == DType::Q8 && table && group_size == Q4_TABLE_GROUP)
}

/// Where the companion files of a model file live: `x.bin` -> `x.tokenizer.bin`, `x.template.json`.
pub fn companion_paths(model_path: &Path) -> CompanionPaths {
    let stem = match model_path.extension() {
        Some(ext) if ext == "bin" => model_path.with_extension(""),
        _ => model_path.to_path_buf(),
    };
    let with = |suffix: &str| {
        let mut s = stem.clone().into_os_string();
        s.push(suffix);
        PathBuf::from(s)
    };
    CompanionPaths {
        tokenizer: with(".tokenizer.bin"),
        template: with(".template.json"),
    }
}

/// See [`companion_paths`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompanionPaths {
    pub tokenizer: PathBuf,
    pub template: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_replace_bin_extension() {
        let c = companion_paths(Path::new("models/qwen3-0.6b.bin"));
        assert_eq!(c.tokenizer, Path::new("models/qwen3-0.6b.tokenizer.bin"));
        assert_eq!(c.template, Path::new("models/qwen3-0.6b.template.json"));
        let c = companion_paths(Path::new("m.q8"));
        assert_eq!(c.tokenizer, Path::new("m.q8.tokenizer.bin"));
    }

    /// A matrix stays bf16 exactly when the group size does not divide its rows: the exporter's
    /// specs say so, the reader accepts it there and nowhere else, and a grouped dtype is refused
    /// for it.
    #[test]
    fn a_matrix_stays_bf16_only_when_its_rows_cannot_be_grouped() {
        for dtype in [DType::Q8, DType::Q4] {
            let mut c = config::tests::tiny_config(dtype);
            (c.intermediate_size, c.group_size) = (160, 64);
            let down = "model.layers.1.mlp.down_proj.weight";
            let up = "model.layers.1.mlp.up_proj.weight";
            for s in tensor_specs(&c) {
                let ungrouped = s.name.ends_with("down_proj.weight");
                assert_eq!(s.dtype == DType::Bf16, ungrouped, "{dtype} {}", s.name);
                if s.shape.len() == 2 {
                    assert_eq!(stays_bf16(&c, &s.shape), ungrouped, "{dtype} {}", s.name);
                }
            }
            assert!(matrix_storage_ok(&c, down, &[64, 160], DType::Bf16, 0));
            assert!(!matrix_storage_ok(&c, down, &[64, 160], dtype, 64));
            assert!(!matrix_storage_ok(&c, up, &[160, 64], DType::Bf16, 0));
            assert!(matrix_storage_ok(&c, up, &[160, 64], dtype, 64));
            // Files that are not grouped keep every matrix in their own dtype.
            let f = config::tests::tiny_config(DType::Bf16);
            assert!(!stays_bf16(&f, &[64, 160]));
        }
    }

    /// The layers llama.cpp's Q4_K_M stores `attn_v` and `ffn_down` of in Q6_K, read from the
    /// Q4_K_M file llama-quantize (0c1e570) wrote of a 28-layer Qwen3 (0.6B and 1.7B both have
    /// 28): ours keeps the same layers' `v_proj` and `down_proj` finer.
    #[test]
    fn sensitive_layers_are_llama_cpp_q4_k_m_ones() {
        let q6k = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27];
        let ours: Vec<u32> = (0..28).filter(|&l| sensitive_layer(l, 28)).collect();
        assert_eq!(ours, q6k);
        let mut c = config::tests::tiny_config(DType::Q4);
        c.num_hidden_layers = 28;
        let names = |c: &ModelConfig, mix: Q4Mix, dtype: DType| -> Vec<String> {
            tensor_specs_with(c, mix)
                .iter()
                .filter(|s| s.dtype == dtype)
                .map(|s| s.name.clone())
                .collect()
        };
        // The default: the embedding table and the (untied) classifier, and two tensors a
        // sensitive layer, in q6; every matrix at the file's 32, so the products that share one
        // quantized input share one group size.
        let q6 = names(&c, Q4Mix::default(), DType::Q6);
        assert_eq!(q6.len(), 2 + 2 * q6k.len(), "{q6:?}");
        assert!(q6.contains(&"model.layers.27.mlp.down_proj.weight".to_string()));
        assert!(q6.contains(&"model.layers.5.self_attn.v_proj.weight".to_string()));
        assert!(q6.contains(&"lm_head.weight".to_string()));
        assert!(tensor_specs(&c)
            .iter()
            .all(|s| s.group_size == 32 || s.group_size == 0));
        // In q8 the same tensors, the tables in q8's groups of 64 (hidden 64 allows it).
        let all_q8 = Q4Mix {
            tables: MixDType::Q8,
            sensitive: MixDType::Q8,
        };
        assert_eq!(names(&c, all_q8, DType::Q8), q6);
        for s in tensor_specs_with(&c, all_q8)
            .iter()
            .filter(|s| s.group_size != 0)
        {
            let gs = if is_table(&s.name) { 64 } else { 32 };
            assert_eq!(s.group_size, gs, "{}", s.name);
        }
        let all_q4 = Q4Mix {
            tables: MixDType::Q4,
            sensitive: MixDType::Q4,
        };
        assert!(tensor_specs_with(&c, all_q4)
            .iter()
            .all(|s| s.dtype == DType::Q4 || s.group_size == 0));
        // q6 needs groups of a multiple of 32: at 16, those tensors are q8.
        c.group_size = 16;
        assert_eq!(names(&c, Q4Mix::default(), DType::Q8), q6);
    }

    /// A Qwen3.5's Gated DeltaNets carry their values in `in_proj_qkv`: a q4 file keeps it finer
    /// in the sensitive layers, as llama.cpp's Q4_K_M keeps their `attn_qkv` in Q6_K (read from
    /// its Q4_K_M of Qwen3.5-0.8B's shape: layers 0, 1, 2, 5, 8, 14, 17, 20, 21 and 22 of the
    /// linear ones), and the other projections in q4.
    #[test]
    fn a_gated_delta_nets_values_are_sensitive_too() {
        use crate::format::{LayerType, LinearAttentionConfig};
        let mut c = config::tests::tiny_config(DType::Q4);
        c.num_hidden_layers = 24;
        let layer_types = (0..24)
            .map(|l| match (l + 1) % 4 {
                0 => LayerType::FullAttention,
                _ => LayerType::LinearAttention,
            })
            .collect();
        c.linear_attention = Some(LinearAttentionConfig {
            layer_types,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 16,
            linear_conv_kernel_dim: 4,
            value_heads: Default::default(),
        });
        c.architecture = architecture::QWEN3_5.name.into();
        let specs = tensor_specs(&c);
        let layers = |suffix: &str, dtype: DType| -> Vec<u32> {
            specs
                .iter()
                .filter(|s| s.name.ends_with(suffix) && s.dtype == dtype)
                .filter_map(|s| layer_of(&s.name).map(|(l, _)| l))
                .collect()
        };
        let q6k = [0, 1, 2, 5, 8, 14, 17, 20, 21, 22];
        assert_eq!(layers("linear_attn.in_proj_qkv.weight", DType::Q6), q6k);
        for rest in ["in_proj_z", "in_proj_a", "in_proj_b", "out_proj"] {
            let suffix = format!("linear_attn.{rest}.weight");
            assert!(layers(&suffix, DType::Q6).is_empty(), "{rest}");
        }
    }

    #[test]
    fn nbytes_of_each_dtype() {
        assert_eq!(tensor_nbytes(DType::F32, &[3, 5], 0), Some(60));
        assert_eq!(tensor_nbytes(DType::Bf16, &[3, 5], 0), Some(30));
        // 2*128 values = 256 bytes (already aligned) + 2*2 scales * 4 bytes.
        assert_eq!(tensor_nbytes(DType::Q8, &[2, 128], 64), Some(256 + 16));
        // 3*64 = 192 values, aligned to 192; 3 scales.
        assert_eq!(tensor_nbytes(DType::Q8, &[3, 64], 64), Some(192 + 12));
        // 1*32 values pad to 64, then one scale.
        assert_eq!(tensor_nbytes(DType::Q8, &[1, 32], 32), Some(64 + 4));
        assert_eq!(tensor_nbytes(DType::Q8, &[2, 100], 64), None);
        // q4: half a byte a value, padded to 64, then an f16 scale per group.
        assert_eq!(tensor_nbytes(DType::Q4, &[2, 128], 32), Some(128 + 16));
        assert_eq!(tensor_nbytes(DType::Q4, &[3, 64], 32), Some(128 + 12));
        assert_eq!(tensor_nbytes(DType::Q4, &[2, 100], 32), None);
        // q6: three bytes for four values, padded to 64, then an f16 scale per group.
        assert_eq!(tensor_nbytes(DType::Q6, &[2, 128], 32), Some(192 + 16));
        assert_eq!(tensor_nbytes(DType::Q6, &[1, 32], 32), Some(64 + 2));
        assert_eq!(tensor_nbytes(DType::Q6, &[2, 48], 16), None);
        assert_eq!(tensor_nbytes(DType::F32, &[u64::MAX, 2], 0), None);
    }
}
