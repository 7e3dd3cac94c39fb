//! A GGUF's tensors under the model file's names: which model-file tensors each GGUF tensor
//! holds, and which of its bytes are each one's ([`pieces`]).
//!
//! Most GGUF tensors are one model-file tensor under another name (llama.cpp's
//! `tensor_mapping.py`: `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`), read
//! where they lie. Five kinds are not:
//!
//! - **Stacked experts.** `blk.N.ffn_gate_exps` is one `[experts, rows, cols]` tensor where the
//!   model file has `mlp.experts.E.gate_proj` for each `E`. Each expert's rows are one contiguous
//!   run of its bytes (the expert is the outermost dimension), so each becomes a tensor of its
//!   own, a slice of the GGUF's.
//! - **Qwen3.5's gated query.** `attn_q` is HF's `q_proj` as it is: for each head, `head_dim`
//!   rows of the query, then `head_dim` rows of the output gate. The model file keeps the two
//!   apart (`q_proj`, `output_gate`), so each is every other run of `head_dim` rows, gathered at
//!   open (rows are whole blocks in every type).
//! - **Qwen3.5's decay rates.** The converter writes `ssm_a = -exp(A_log)`; the model file
//!   holds `A_log`, so `ln(-ssm_a)` is taken at open (a few floats a layer; within an ulp or two
//!   of the checkpoint's, as `exp` of it gives back `-ssm_a` within one).
//! - **Qwen3-Next's `b` and `a` projections** are one tensor, `ssm_ba`, HF's `in_proj_ba` as it
//!   is: for each key head, the `b` rows of the value heads that share it, then their `a` rows.
//!   The model file keeps `in_proj_b` and `in_proj_a`, each every other run of rows, gathered at
//!   open as the gated query's are. (Its `in_proj_qkvz` the converter already writes apart, as
//!   `attn_qkv` and `attn_gate`, every query, then every key, then every value row, the value
//!   heads in HF's order; an older converter's fused `ssm_in` is refused by name.)
//! - **Qwen3.5's multi-token-prediction layer** (`nextn_predict_layers`: the last blocks,
//!   `blk.N.nextn.*` and a layer's tensors) is left out: the forward pass does not run it.
//!
//! Everything else of Qwen3.5's is a rename (its norms are stored `1 + w` by the converter as
//! by our exporter; its Gated DeltaNets' value heads in another order, which the kernels read as
//! they lie: `format::ValueHeads`).
//!
//! A tensor's shape in the file lists its row length first (`dims[0]`, ggml's `ne0`), so the
//! model's `[rows, cols]` is `dims` reversed.

use super::{GgufHeader, GgufTensor};
use crate::format::ModelConfig;
use std::ops::Range;

/// The model file's name of GGUF tensor `name` (llama.cpp's `tensor_mapping.py`, for the Qwen
/// families), or `None` for a name it does not use.
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
    // Qwen3.5's per-head decay parameters carry no `.weight`: `ssm_a` is `A_log` (its values
    // turned back at open, [`Take::ALog`]), `ssm_dt.bias` the softplus's `dt_bias`.
    match rest {
        "ssm_a" => return Some(format!("model.layers.{layer}.linear_attn.A_log")),
        "ssm_dt.bias" => return Some(format!("model.layers.{layer}.linear_attn.dt_bias")),
        _ => {}
    }
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
        // Qwen3.5's (llama.cpp's `qwen35` and `qwen35moe`): the norm before the MLP under
        // another name, the Gated DeltaNet's projections, convolution and norm, the shared
        // expert and its gate.
        "post_attention_norm" => "post_attention_layernorm",
        "attn_qkv" => "linear_attn.in_proj_qkv",
        "attn_gate" => "linear_attn.in_proj_z",
        "ssm_beta" => "linear_attn.in_proj_b",
        "ssm_alpha" => "linear_attn.in_proj_a",
        "ssm_conv1d" => "linear_attn.conv1d",
        "ssm_norm" => "linear_attn.norm",
        "ssm_out" => "linear_attn.out_proj",
        "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
        "ffn_up_shexp" => "mlp.shared_expert.up_proj",
        "ffn_down_shexp" => "mlp.shared_expert.down_proj",
        "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("model.layers.{layer}.{module}.{kind}"))
}

/// The model's `[rows, cols]` (or `[n]`) shape of a GGUF tensor: its dims reversed.
pub fn hf_shape(t: &GgufTensor) -> Vec<u64> {
    t.dims.iter().rev().copied().collect()
}

/// One tensor of the model file that a GGUF tensor holds: its name and shape, and how its bytes
/// come from the GGUF tensor's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub name: String,
    pub shape: Vec<u64>,
    pub take: Take,
}

/// How a model-file tensor's bytes come from its GGUF tensor's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A run of them, from `offset` bytes after the GGUF tensor's start: all of them, or one
    /// expert's slice of a stack. Read where it lies (or taken apart at open for Q8_0, Q4_0,
    /// Q5_0 and F16: `repack.rs`).
    Bytes { offset: u64, nbytes: u64 },
    /// Rows gathered at open: `run` rows from row `first`, then again every `period` rows, each
    /// row `row_bytes` (a Qwen3.5 `attn_q`'s query or gate rows, a Qwen3-Next `ssm_ba`'s `b` or `a`
    /// rows).
    Rows {
        first: u64,
        run: u64,
        period: u64,
        row_bytes: u64,
    },
    /// F32 values `a` turned into `ln(-a)` at open (`ssm_a = -exp(A_log)` back to `A_log`).
    ALog,
}

impl Take {
    /// Whether the model file reads the piece where the GGUF holds it (else it is made at open).
    pub fn in_place(&self) -> bool {
        matches!(self, Take::Bytes { .. })
    }

    /// The byte ranges of GGUF tensor `t` (from the file's start) that the piece's bytes come
    /// from, in order.
    pub fn ranges(&self, t: &GgufTensor) -> Vec<Range<u64>> {
        match *self {
            Take::Bytes { offset, nbytes } => {
                std::iter::once(t.start + offset..t.start + offset + nbytes).collect()
            }
            Take::ALog => std::iter::once(t.start..t.start + t.nbytes).collect(),
            Take::Rows {
                first,
                run,
                period,
                row_bytes,
            } => {
                let rows = t.nbytes / row_bytes;
                (first..rows)
                    .step_by(period as usize)
                    .map(|r| t.start + r * row_bytes..t.start + (r + run) * row_bytes)
                    .collect()
            }
        }
    }

    /// Bytes the piece takes of the GGUF tensor's.
    pub fn nbytes(&self, t: &GgufTensor) -> u64 {
        self.ranges(t).iter().map(|r| r.end - r.start).sum()
    }
}

/// What naming a GGUF's tensors needs to know of its model, beside the names themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Names {
    /// The text model's layers: blocks from here to `blocks` are the multi-token-prediction
    /// layers (Qwen3.5's `nextn_predict_layers`), left out.
    pub layers: u32,
    /// `{arch}.block_count`.
    pub blocks: u32,
    /// Qwen3.5's gated attention: `attn_q` holds each head's query rows and then its gate rows,
    /// this many each.
    pub gated_query_rows: Option<u64>,
    /// Qwen3-Next's `ssm_ba`: each key head's `b` rows and then its `a` rows, this many each
    /// (the value heads a key head has).
    pub fused_ba_rows: Option<u64>,
}

impl Names {
    /// For model `c` read from the GGUF with header `h`.
    pub fn of(h: &GgufHeader, c: &ModelConfig) -> Names {
        // (`model_config`, which made `c`, has read them.)
        let blocks = super::model::blocks(h).map_or(c.num_hidden_layers, |b| b.count);
        Names {
            layers: c.num_hidden_layers,
            blocks,
            gated_query_rows: c.attn_output_gate.then_some(c.head_dim as u64),
            // (Qwen3-Next's, whose value heads keep HF's order: in Qwen3.5's tiled order the
            // rows would not be these runs.)
            fused_ba_rows: c.linear_attention.as_ref().and_then(|la| {
                let (kh, vh) = (la.linear_num_key_heads, la.linear_num_value_heads);
                (kh > 0 && la.value_heads == crate::format::ValueHeads::Grouped)
                    .then_some((vh / kh) as u64)
            }),
        }
    }
}

/// The model file's tensors GGUF tensor `t` holds: itself under its model-file name
/// ([`hf_name`]); or each expert's `[rows, cols]` slice of a stacked mixture of experts'
/// `blk.N.ffn_{gate,up,down}_exps.weight` (`[experts, rows, cols]`), as
/// `model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`; or a gated `attn_q`'s query and
/// gate rows; or nothing, for a multi-token-prediction layer's tensor. `None`: a name no family
/// uses.
pub fn pieces(t: &GgufTensor, names: &Names) -> Option<Vec<Piece>> {
    let layer = t
        .name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(l, _)| l.parse::<u32>().ok());
    // A multi-token-prediction layer's, left out.
    if layer.is_some_and(|l| (names.layers..names.blocks).contains(&l)) {
        return Some(vec![]);
    }
    // Qwen3-Next's `b` and `a` rows, fused.
    if let (Some(g), Some(l), true) = (
        names.fused_ba_rows,
        layer,
        t.name.ends_with(".ssm_ba.weight"),
    ) {
        let shape = hf_shape(t);
        return gathered(t, &shape, g).map(|[b, a]| {
            let name = |w| format!("model.layers.{l}.linear_attn.in_proj_{w}.weight");
            vec![
                Piece {
                    name: name("b"),
                    shape: b.0,
                    take: b.1,
                },
                Piece {
                    name: name("a"),
                    shape: a.0,
                    take: a.1,
                },
            ]
        });
    }
    if let Some(name) = hf_name(&t.name) {
        let shape = hf_shape(t);
        // The gated query: each head's `hd` query rows, then its `hd` gate rows.
        if let (Some(hd), Some(q)) = (
            names.gated_query_rows,
            name.strip_suffix(".self_attn.q_proj.weight")
                .map(str::to_owned),
        ) {
            let [(q_shape, q_take), (gate_shape, gate_take)] = gathered(t, &shape, hd)?;
            return Some(vec![
                Piece {
                    name,
                    shape: q_shape,
                    take: q_take,
                },
                Piece {
                    name: format!("{q}.self_attn.output_gate.weight"),
                    shape: gate_shape,
                    take: gate_take,
                },
            ]);
        }
        // `ssm_a` is F32 as the converter writes every 1-D tensor: another type is refused.
        let take = match name.ends_with(".A_log") {
            true if t.ggml_type.name != "F32" => return None,
            true => Take::ALog,
            false => Take::Bytes {
                offset: 0,
                nbytes: t.nbytes,
            },
        };
        return Some(vec![Piece { name, shape, take }]);
    }
    let (_, rest) = t.name.strip_prefix("blk.")?.split_once('.')?;
    let layer = layer?;
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
                take: Take::Bytes {
                    offset: e * each,
                    nbytes: each,
                },
            })
            .collect(),
    )
}

/// A matrix of `shape` (GGUF tensor `t`) whose rows alternate between two tensors, `run` rows of
/// each in turn: the two, each `[rows / 2, cols]`, gathered every `2 run` rows from row 0 and
/// from row `run`. `None` for rows that are not whole pairs of runs, or rows of no bytes (a
/// damaged file, not a name to map).
fn gathered(t: &GgufTensor, shape: &[u64], run: u64) -> Option<[(Vec<u64>, Take); 2]> {
    let [rows, cols] = shape[..] else {
        return None;
    };
    if run == 0 || rows == 0 || !rows.is_multiple_of(2 * run) || t.nbytes < rows {
        return None;
    }
    if !t.nbytes.is_multiple_of(rows) {
        return None;
    }
    let row_bytes = t.nbytes / rows;
    let half = |first| {
        let take = Take::Rows {
            first,
            run,
            period: 2 * run,
            row_bytes,
        };
        (vec![rows / 2, cols], take)
    };
    Some([half(0), half(run)])
}

/// Every GGUF tensor's pieces, in the file's order, each beside the index of its GGUF tensor:
/// the one list `model_header` and `repack` both read.
pub fn all_pieces(
    h: &GgufHeader,
    names: &Names,
    family: &str,
) -> anyhow::Result<Vec<(usize, Piece)>> {
    let mut all = Vec::with_capacity(h.tensors.len());
    for (i, t) in h.tensors.iter().enumerate() {
        // Qwen3-Next as llama.cpp's converter wrote it before it split `in_proj_qkvz` (llama.cpp
        // still loads it, as "legacy"): each key head's q, k, v and z rows fused, not read here.
        if t.name.ends_with(".ssm_in.weight") {
            anyhow::bail!(
                "tensor {}: an older converter's fused in_proj_qkvz, which is not read: convert \
                 the checkpoint again with a current convert_hf_to_gguf.py (it writes attn_qkv \
                 and attn_gate)",
                t.name
            );
        }
        let pieces = pieces(t, names).ok_or_else(|| {
            anyhow::anyhow!("tensor {}: not a name of the {family} family", t.name)
        })?;
        all.extend(pieces.into_iter().map(|p| (i, p)));
    }
    Ok(all)
}
