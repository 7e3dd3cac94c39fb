//! The forward pass, written once over a [`Backend`] (the CPU's SIMD kernels, or a GPU's), for a
//! step that may hold several sequences.
//!
//! A step runs `t` rows (tokens) through the model. The rows are split into [`Segment`]s, one per
//! sequence: a segment is a run of consecutive tokens of one sequence, at positions
//! `pos .. pos + len` of that sequence, with its own KV cache. A [`super::Session`] runs one
//! segment a step (its prompt, then one token at a time); the serving engine
//! ([`crate::engine`]) runs one row for each sequence that is decoding plus a chunk of a prompt,
//! so that each weight matrix is read once per step for all of them.
//!
//! What is shared and what is not:
//! - every weight product, RMSNorm, SwiGLU and residual add runs on all `t` rows at once; each of
//!   these computes a row the same way whatever the other rows are (the q8 path quantizes each
//!   activation row on its own, and the block product gives the bits of the one-row product:
//!   `kernels::dot`'s `prefill_rows_equal_decode_rows`);
//! - RoPE, the KV cache write and attention are per segment, with the segment's own positions
//!   and cache. Attention of a query reads keys `0 ..= its position` in a fixed order, whatever
//!   the chunk it came in.
//!
//! So a sequence's numbers do not depend on its neighbours in a step, nor on how its prompt was
//! cut into chunks: the engine's answers are batch-invariant (tested in `engine`).

mod attention;
mod linear_attention;
mod sparse_moe;

use super::moe::Routes;
use super::{Mixer, Mlp, Model, Qwen3DecoderLayer, Qwen3MLP};
use crate::backend::{AttentionShape, Backend, DeltaNetShape, KvType, RopeTable};
use anyhow::{bail, Result};

/// Most tokens run through the layers in one step. Longer prompts go in chunks of this many,
/// which bounds the scratch memory (~7 MB for Qwen3-0.6B) while keeping prefill matrix-matrix.
pub const MAX_BATCH: usize = 128;

/// The model's sizes, as `usize`, read once from its config.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    /// hidden_size
    pub d: usize,
    /// intermediate_size
    pub ff: usize,
    /// num_attention_heads
    pub nh: usize,
    /// num_key_value_heads
    pub nkv: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// The width of an output row: `vocab` logits, or an embedding model's `d` values.
    pub out: usize,
    pub eps: f32,
    /// Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob
    /// (zeros and false for dense models).
    pub experts: usize,
    pub top_k: usize,
    pub moe_ff: usize,
    pub norm_topk: bool,
    /// Qwen3.5-MoE: the shared expert's width (0 without one).
    pub shared_ff: usize,
    /// Qwen3.5's Gated DeltaNet layers' sizes (`None` without them).
    pub linear: Option<DeltaNetShape>,
}

/// What one sequence carries from step to step: the keys and values of its attention layers,
/// and, in a hybrid model (Qwen3.5), each Gated DeltaNet layer's state: its convolution's
/// window `[conv_dim, K - 1]` and its memory `[num_v_heads, dk, dv]`, whose size does not grow
/// with the context. [`Forward::new_cache`] makes one.
pub struct Cache<B: Backend> {
    /// Keys and values, one layer of the backend's cache per attention layer.
    pub kv: B::KvCache,
    /// `[window, memory]` of each linear layer, in layer order.
    linear: Vec<[B::Buf; 2]>,
}

/// One sequence's rows in a step: `len` consecutive rows of the step's tokens, at positions
/// `pos .. pos + len` of the sequence whose keys and values (and states) are `caches[seq]`. A
/// segment at position 0 starts its sequence: its linear layers' states start from zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Which of the step's caches is this sequence's.
    pub seq: usize,
    /// The position of the segment's first token (tokens already in `cache`).
    pub pos: usize,
    /// How many of the step's tokens are this sequence's.
    pub len: usize,
    /// How many of the segment's last rows the step returns logits for: 0 for a prompt's earlier
    /// chunks, 1 for a prompt's last chunk or a decoded token (its next token is sampled), more
    /// when a draft is verified (each drafted token's row tells whether the model agrees with the
    /// next; engine/draft.rs). At most `len`.
    pub logits: usize,
}

/// What a step's rows carry besides their token ids, in a prompt with images (Qwen3.5's and
/// Qwen3-VL's; docs/vision.md): each row's three M-RoPE positions, runs of rows whose input
/// vectors are given (an image's merged vectors, in place of its `<|image_pad|>` tokens'
/// embeddings), and Qwen3-VL's DeepStack features, added to those rows after the first layers.
/// The default is text: each row at its cache position, every input an embedding.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowInputs<'a> {
    /// `[time, height, width]` per row of the step (`vision::positions`); `None`: every row at
    /// its position in its sequence, as text.
    pub positions: Option<&'a [[u32; 3]]>,
    /// `(first row, values)`: the step's rows from `first` on take `values` (`[n, hidden]`)
    /// as their input vectors.
    pub embeddings: &'a [(usize, &'a [f32])],
    /// `(layer, first row, values)`: after decoder layer `layer`, the step's rows from `first`
    /// on add `values` (`[n, hidden]`) to their hidden states (`Qwen3VLTextModel`'s
    /// `_deepstack_process`: the image's DeepStack feature `layer` at its pads' rows).
    pub deepstack: &'a [(usize, usize, &'a [f32])],
}

/// A copy of a sequence's Gated DeltaNet states at one position (Qwen3.5), to take the sequence
/// back there later: keys and values need no copy (positions past it are overwritten), the
/// states do. [`Forward::new_snapshot`] makes one; [`Forward::save_state`] and
/// [`Forward::restore_state`] fill and use it.
pub struct StateSnapshot<B: Backend> {
    linear: Vec<[B::Buf; 2]>,
}

/// Activations of one step of up to `max_batch` rows, reused by every step.
struct Scratch<Buf> {
    /// The residual stream, `[t, hidden]`.
    x: Buf,
    /// Normalised input of a block, and later the block's output, `[t, hidden]`.
    xb: Buf,
    /// `q_proj(xb)` before q_norm, `[t, n_heads, head_dim]` (unused without q/k norms).
    q_raw: Buf,
    /// `k_proj(xb)` before k_norm, `[t, n_kv_heads, head_dim]`.
    k_raw: Buf,
    /// `[t, n_heads, head_dim]`
    q: Buf,
    /// `[t, n_kv_heads, head_dim]`
    k: Buf,
    /// `[t, n_kv_heads, head_dim]`
    v: Buf,
    /// Attention output, `[t, n_heads, head_dim]`.
    att: Buf,
    /// One segment's rows of q, k, v and the attention output, when a step holds several
    /// sequences (RoPE, the cache and attention take their rows from the start of a buffer).
    seg: [Buf; 4],
    /// `[t, intermediate]` (or an expert's `[t, moe_intermediate]`, or the shared expert's,
    /// whichever is widest)
    gate: Buf,
    /// `[t, intermediate]` (likewise)
    up: Buf,
    /// Qwen3-MoE: the router's logits `[t, num_experts]`, one expert's input rows `[t, hidden]`
    /// and output rows `[t, hidden]`, and the block's sum `[t, hidden]` (one value each in dense
    /// models).
    router: Buf,
    expert_in: Buf,
    expert_out: Buf,
    moe_out: Buf,
    /// The residual of each row whose logits are wanted, `[rows, hidden]`: the classifier's
    /// input.
    last: Buf,
    /// `[rows, vocab]`: their logits.
    logits: Buf,
    /// Gated attention: the output gate, `[t, n_heads, head_dim]` (one value without it).
    att_gate: Buf,
    /// Gated DeltaNet: `qkv` `[t, conv_dim]`, `z` and the output `o` `[t, value_dim]`, the raw
    /// write strengths `beta` and decays `decay` `[t, num_v_heads]` (one value each without it).
    qkv: Buf,
    z: Buf,
    o: Buf,
    beta: Buf,
    decay: Buf,
}

/// The forward pass's state that does not belong to one sequence: the model, the RoPE tables,
/// the scratch buffers of a step. Sequences bring their KV caches ([`Forward::new_cache`]).
pub struct Forward<'m, B: Backend> {
    backend: &'m B,
    model: &'m Model<'m, B::Tensor>,
    pub(super) dims: Dims,
    context_len: usize,
    /// Rows the scratch buffers hold.
    max_batch: usize,
    /// Rows whose logits one step can return.
    max_logits: usize,
    rope: B::Rope,
    /// M-RoPE (a model that takes images): which position component, time, height or width,
    /// each rotated frequency follows (`kernels::mrope_component`); empty for a text model.
    mrope: Vec<u8>,
    /// What the caches store keys and values as.
    kv: KvType,
    s: Scratch<B::Buf>,
    /// The logits on the host, when the backend's buffers are not (empty on the CPU).
    logits_host: Vec<f32>,
    /// Qwen3-MoE: the router's logits on the host (where the backend's buffers are not), and the
    /// step's routing decided from them.
    router_host: Vec<f32>,
    routes: Routes,
    /// When recording ([`Forward::record_routes`]): every sparse layer's choices, appended as
    /// they are made, for each row its `num_experts_per_tok` expert ids in ascending order.
    route_log: Option<Vec<u32>>,
    /// Qwen3.5-MoE: every row, and each row's shared-expert weight, for the step's sum.
    shared_rows: Vec<u32>,
    shared_weights: Vec<f32>,
    /// Layer `l`'s place among the attention layers (its layer of the KV cache), or among the
    /// linear ones (its state in [`Cache`]).
    slot: Vec<usize>,
}

impl<'m, B: Backend> Forward<'m, B> {
    /// The pass for sequences of up to `context_len` positions, steps of up to `max_batch` rows
    /// (at most [`MAX_BATCH`]) of which up to `max_logits` return logits, KV caches in `kv`.
    pub fn new(
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        context_len: usize,
        max_batch: usize,
        max_logits: usize,
        kv: KvType,
    ) -> Result<Self> {
        let c = model.config;
        let max = c.max_context() as usize;
        if context_len == 0 {
            bail!("context length must be at least 1");
        }
        if context_len > max {
            bail!(
                "context length {context_len} is larger than the model supports ({max} positions)"
            );
        }
        if max_batch == 0 || max_batch > MAX_BATCH || max_logits == 0 || max_logits > max_batch {
            bail!("a step of {max_batch} rows with {max_logits} logits: must be 1 ..= {MAX_BATCH}, logits at most rows");
        }
        backend.check_layers(c)?;
        let dims = Dims {
            d: c.hidden_size as usize,
            ff: c.intermediate_size as usize,
            nh: c.num_attention_heads as usize,
            nkv: c.num_key_value_heads as usize,
            head_dim: c.head_dim as usize,
            vocab: c.vocab_size as usize,
            out: match c.embedding {
                Some(_) => c.hidden_size as usize,
                None => c.vocab_size as usize,
            },
            eps: c.rms_norm_eps as f32,
            experts: c.moe.as_ref().map_or(0, |m| m.num_experts as usize),
            top_k: c.moe.as_ref().map_or(0, |m| m.num_experts_per_tok as usize),
            moe_ff: c
                .moe
                .as_ref()
                .map_or(0, |m| m.moe_intermediate_size as usize),
            norm_topk: c.moe.as_ref().is_some_and(|m| m.norm_topk_prob),
            shared_ff: c
                .moe
                .as_ref()
                .map_or(0, |m| m.shared_expert_intermediate_size as usize),
            linear: c.linear_attention.as_ref().map(|la| DeltaNetShape {
                num_k_heads: la.linear_num_key_heads as usize,
                num_v_heads: la.linear_num_value_heads as usize,
                head_k_dim: la.linear_key_head_dim as usize,
                head_v_dim: la.linear_value_head_dim as usize,
                conv_kernel: la.linear_conv_kernel_dim as usize,
                value_heads: la.value_heads,
            }),
        };
        let Dims {
            d,
            ff,
            nh,
            nkv,
            head_dim: hd,
            out,
            experts,
            moe_ff,
            shared_ff,
            ..
        } = dims;
        // Keys and values of one sequence. The config's sizes are bounded by validation, but
        // their product for a hostile file could still be absurd: refuse it instead of aborting
        // in the allocator.
        (nkv * context_len * hd)
            .checked_mul(c.attention_layers() as usize)
            .filter(|n| {
                n.checked_mul(2 * kv.bytes())
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                anyhow::anyhow!("a KV cache for {context_len} positions does not fit in memory")
            })?;
        let n = max_batch.min(context_len.max(max_logits));
        let b = backend;
        let seg = [
            b.alloc(n * nh * hd)?,
            b.alloc(n * nkv * hd)?,
            b.alloc(n * nkv * hd)?,
            b.alloc(n * nh * hd)?,
        ];
        // Each layer's place among its kind's layers.
        let slot = (0..c.num_hidden_layers)
            .map(|l| {
                (0..l)
                    .filter(|&k| c.is_attention(k) == c.is_attention(l))
                    .count()
            })
            .collect();
        let gate = match c.attn_output_gate {
            true => n * nh * hd,
            false => 1,
        };
        let [cd, vd, vh] = match dims.linear {
            Some(s) => [s.conv_dim(), s.value_dim(), s.num_v_heads].map(|x| n * x),
            None => [1; 3],
        };
        Ok(Forward {
            backend,
            model,
            dims,
            context_len,
            max_batch: n,
            max_logits,
            rope: b.rope_table(RopeTable::with_scaling(
                c.rotary_dim() as usize,
                c.rope_theta,
                c.rope_scaling,
                context_len,
            ))?,
            mrope: match &c.vision {
                Some(v) => {
                    let section = v.mrope_section.map(|n| n as usize);
                    (0..c.rotary_dim() as usize / 2)
                        .map(|j| crate::kernels::mrope_component(j, section) as u8)
                        .collect()
                }
                None => Vec::new(),
            },
            kv,
            s: Scratch {
                x: b.alloc(n * d)?,
                xb: b.alloc(n * d)?,
                q_raw: b.alloc(n * nh * hd)?,
                k_raw: b.alloc(n * nkv * hd)?,
                q: b.alloc(n * nh * hd)?,
                k: b.alloc(n * nkv * hd)?,
                v: b.alloc(n * nkv * hd)?,
                att: b.alloc(n * nh * hd)?,
                seg,
                gate: b.alloc(n * ff.max(moe_ff).max(shared_ff))?,
                up: b.alloc(n * ff.max(moe_ff).max(shared_ff))?,
                router: b.alloc((n * experts).max(1))?,
                expert_in: b.alloc(if experts > 0 { n * d } else { 1 })?,
                expert_out: b.alloc(if experts > 0 { n * d } else { 1 })?,
                moe_out: b.alloc(if experts > 0 { n * d } else { 1 })?,
                last: b.alloc(max_logits * d)?,
                logits: b.alloc(max_logits * out)?,
                att_gate: b.alloc(gate)?,
                qkv: b.alloc(cd)?,
                z: b.alloc(vd)?,
                o: b.alloc(vd)?,
                beta: b.alloc(vh)?,
                decay: b.alloc(vh)?,
            },
            logits_host: Vec::new(),
            router_host: Vec::new(),
            routes: Routes::default(),
            route_log: None,
            shared_rows: Vec::new(),
            shared_weights: Vec::new(),
            slot,
        })
    }

    /// An empty cache for one sequence of up to `context_len` positions: keys and values for
    /// the attention layers, a state for each linear layer.
    pub fn new_cache(&self) -> Result<Cache<B>> {
        let Dims {
            nh, nkv, head_dim, ..
        } = self.dims;
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim,
            context_len: self.context_len,
        };
        let c = self.model.config;
        let attention = c.attention_layers() as usize;
        let kv = self
            .backend
            .kv_cache(attention, shape, self.max_batch, self.kv)?;
        let linear = match self.dims.linear {
            Some(s) => (attention..c.num_hidden_layers as usize)
                .map(|_| {
                    let b = self.backend;
                    Ok([
                        b.alloc(s.conv_state_len())?,
                        b.alloc(s.recurrent_state_len())?,
                    ])
                })
                .collect::<Result<_>>()?,
            None => Vec::new(),
        };
        Ok(Cache { kv, linear })
    }

    /// Room for a copy of a sequence's linear states; `None` for a model without them.
    pub fn new_snapshot(&self) -> Result<Option<StateSnapshot<B>>> {
        let Some(s) = self.dims.linear else {
            return Ok(None);
        };
        let b = self.backend;
        let layers = self.model.layers.len() - self.model.config.attention_layers() as usize;
        let linear = (0..layers)
            .map(|_| {
                Ok([
                    b.alloc(s.conv_state_len())?,
                    b.alloc(s.recurrent_state_len())?,
                ])
            })
            .collect::<Result<_>>()?;
        Ok(Some(StateSnapshot { linear }))
    }

    /// `snapshot` = `cache`'s linear states.
    pub fn save_state(&self, cache: &Cache<B>, snapshot: &mut StateSnapshot<B>) -> Result<()> {
        self.copy_states(&mut snapshot.linear, &cache.linear)
    }

    /// `cache`'s linear states = `snapshot`.
    pub fn restore_state(&self, snapshot: &StateSnapshot<B>, cache: &mut Cache<B>) -> Result<()> {
        self.copy_states(&mut cache.linear, &snapshot.linear)
    }

    fn copy_states(&self, to: &mut [[B::Buf; 2]], from: &[[B::Buf; 2]]) -> Result<()> {
        let Some(s) = self.dims.linear else {
            return Ok(());
        };
        let lens = [s.conv_state_len(), s.recurrent_state_len()];
        for (t, f) in to.iter_mut().zip(from) {
            for k in 0..2 {
                self.backend.copy(&mut t[k], 0, &f[k], 0, lens[k])?;
            }
        }
        Ok(())
    }

    pub fn model(&self) -> &'m Model<'m, B::Tensor> {
        self.model
    }

    pub fn backend(&self) -> &'m B {
        self.backend
    }

    /// Positions each sequence may hold.
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    /// Rows one step may hold.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Rows of one step that may return logits.
    pub fn max_logits(&self) -> usize {
        self.max_logits
    }

    /// What the caches store keys and values as.
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// Starts (or stops) recording the experts each row chooses in each sparse layer, and returns
    /// what was recorded so far: per step, per sparse layer, per row, `num_experts_per_tok`
    /// expert ids in ascending order. Two runs of the same tokens through two files of one
    /// checkpoint (`qwen3 perplexity --base`) compare their logs to count re-routed tokens.
    pub fn record_routes(&mut self, on: bool) -> Vec<u32> {
        let log = self.route_log.take().unwrap_or_default();
        self.route_log = on.then(Vec::new);
        log
    }

    /// Vocabulary size: token ids are below it.
    pub fn vocab(&self) -> usize {
        self.dims.vocab
    }

    /// The width of a row of the step's output: the vocabulary's logits, or for an embedding
    /// model the final norm's output (`hidden_size`).
    pub fn out_width(&self) -> usize {
        self.dims.out
    }

    /// Runs one step: `tokens` are the rows, `segments` say whose they are, in order (their
    /// `len`s add up to `tokens.len()`). Returns the logits of each segment that asked for them,
    /// `[k, vocab]` in segment order. Errors, changing nothing, on a token outside the
    /// vocabulary, a segment past the context, or a step larger than the buffers.
    pub fn step(
        &mut self,
        tokens: &[u32],
        segments: &[Segment],
        caches: &mut [Cache<B>],
    ) -> Result<&[f32]> {
        let k = self.step_only(tokens, segments, caches)?;
        self.logits(k)
    }

    /// [`Forward::step`] without reading the logits back: returns how many rows of logits the
    /// step left for [`Forward::logits`].
    pub fn step_only(
        &mut self,
        tokens: &[u32],
        segments: &[Segment],
        caches: &mut [Cache<B>],
    ) -> Result<usize> {
        self.step_with(tokens, segments, caches, RowInputs::default())
    }

    /// [`Forward::step_only`] with `inputs` for rows that are not plain text (images).
    pub fn step_with(
        &mut self,
        tokens: &[u32],
        segments: &[Segment],
        caches: &mut [Cache<B>],
        inputs: RowInputs,
    ) -> Result<usize> {
        self.check(tokens, segments, caches.len(), inputs)?;
        let k: usize = segments.iter().map(|s| s.logits).sum();
        if k > self.max_logits {
            bail!(
                "{k} rows of logits in one step: at most {}",
                self.max_logits
            );
        }
        self.run(tokens, segments, caches, None, inputs)?;
        Ok(k)
    }

    /// The first `k` rows of logits of the last step, `[k, vocab]`, on the host.
    pub fn logits(&mut self, k: usize) -> Result<&[f32]> {
        let n = k.min(self.max_logits) * self.dims.out;
        self.backend.read(&self.s.logits, n, &mut self.logits_host)
    }

    /// One sequence's step that writes the logits of every row to `all` (`[t, vocab]`), for
    /// tests and evaluation.
    pub fn step_all_logits(
        &mut self,
        tokens: &[u32],
        segment: Segment,
        cache: &mut Cache<B>,
        all: &mut B::Buf,
        inputs: RowInputs,
    ) -> Result<()> {
        let segments = [Segment { seq: 0, ..segment }];
        self.check(tokens, &segments, 1, inputs)?;
        self.run(
            tokens,
            &segments,
            std::slice::from_mut(cache),
            Some(all),
            inputs,
        )
    }

    fn check(
        &self,
        tokens: &[u32],
        segments: &[Segment],
        caches: usize,
        inputs: RowInputs,
    ) -> Result<()> {
        if tokens.is_empty() {
            bail!("no tokens to run");
        }
        if tokens.len() > self.max_batch {
            bail!(
                "{} tokens in one step: at most {}",
                tokens.len(),
                self.max_batch
            );
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        let rows: usize = segments.iter().map(|s| s.len).sum();
        if rows != tokens.len() || segments.iter().any(|s| s.len == 0 || s.logits > s.len) {
            bail!(
                "the segments cover {rows} rows, the step has {}",
                tokens.len()
            );
        }
        for s in segments {
            if s.seq >= caches {
                bail!("segment of sequence {} in a step of {caches} caches", s.seq);
            }
            if s.pos + s.len > self.context_len {
                bail!(
                    "{} tokens do not fit: {} of {} context positions are used",
                    s.len,
                    s.pos,
                    self.context_len
                );
            }
        }
        // The rows' own inputs: a triple per row for a model with M-RoPE, vectors of the
        // hidden size within the step.
        if let Some(p) = inputs.positions {
            if self.mrope.is_empty() {
                bail!("M-RoPE positions given to a model without images");
            }
            if p.len() != tokens.len() {
                bail!("{} M-RoPE positions for {} rows", p.len(), tokens.len());
            }
        }
        let d = self.dims.d;
        let runs = inputs.embeddings.iter().map(|&(first, v)| (first, v));
        let deepstack = inputs.deepstack.iter().map(|&(_, first, v)| (first, v));
        for (first, values) in runs.chain(deepstack) {
            let n = values.len() / d;
            if values.len() % d != 0 || first + n > tokens.len() {
                bail!(
                    "{} input values from row {first} are not whole rows of {d} within the step's {}",
                    values.len(),
                    tokens.len()
                );
            }
        }
        let layers = self.model.layers.len();
        if let Some(&(l, _, _)) = inputs.deepstack.iter().find(|(l, _, _)| *l >= layers) {
            bail!("a DeepStack feature for layer {l} of a model of {layers} layers");
        }
        Ok(())
    }

    /// The forward pass of one checked step. With `all_logits`, it receives `[t, vocab]`;
    /// otherwise `self.s.logits` gets the logits of the segments that ask for them.
    fn run(
        &mut self,
        tokens: &[u32],
        segments: &[Segment],
        caches: &mut [Cache<B>],
        all_logits: Option<&mut B::Buf>,
        inputs: RowInputs,
    ) -> Result<()> {
        let (b, model) = (self.backend, self.model);
        let Dims { d, out, eps, .. } = self.dims;
        let t = tokens.len();

        // 1. Token embedding: row `token` of embed_tokens for each token.   x: [t, hidden]
        b.embed(&mut self.s.x, &model.embed_tokens, tokens, d)?;
        //    An image's rows take its merged vectors instead (transformers' `masked_scatter` of
        //    the image features over the `<|image_pad|>` embeddings).
        for &(first, values) in inputs.embeddings {
            b.write(&mut self.s.x, first * d, values)?;
        }
        //    A sequence that starts here starts its linear layers' states from zeros.
        if let Some(shape) = self.dims.linear {
            for seg in segments.iter().filter(|s| s.pos == 0) {
                for [window, memory] in caches[seg.seq].linear.iter_mut() {
                    b.zero(window, shape.conv_state_len())?;
                    b.zero(memory, shape.recurrent_state_len())?;
                }
            }
        }

        // 2. The decoder layers, each adding its attention and MLP outputs to the residual x.
        for (l, layer) in model.layers.iter().enumerate() {
            self.decoder_layer(l, layer, t, segments, caches, inputs.positions)?;
            //    Qwen3-VL: after layer l < the tower's DeepStack count, the images' rows add the
            //    tower's feature l (merged from an earlier block's patches).   x[rows] += ds_l
            //    The feature is laid out in xb (free until the next layer's norm), zero elsewhere.
            let mut here = inputs
                .deepstack
                .iter()
                .filter(|(dl, _, _)| *dl == l)
                .peekable();
            if here.peek().is_some() {
                b.zero(&mut self.s.xb, t * d)?;
                for &(_, first, values) in here {
                    b.write(&mut self.s.xb, first * d, values)?;
                }
                b.add(&mut self.s.x, &self.s.xb, t * d)?;
            }
        }

        // 3. Final RMSNorm and the classifier: logits = norm(x) @ lm_head^T.   [k, vocab]
        //    The classifier is the largest matrix of a small model (Qwen3-0.6B: 151936 x 1024),
        //    so it runs only for the rows whose next token is sampled: each segment's last row.
        //    An embedding model has no classifier: its output is norm(x) itself.   [k, hidden]
        let s = &mut self.s;
        match all_logits {
            Some(all) => {
                b.rmsnorm(&mut s.xb, &s.x, &model.norm, t, d, eps)?;
                match &model.lm_head {
                    Some(head) => b.matmul(all, head, &s.xb, t, out, d)?,
                    None => b.copy(all, 0, &s.xb, 0, t * d)?,
                }
            }
            None => {
                let (mut end, mut k) = (0, 0);
                for seg in segments.iter() {
                    end += seg.len;
                    // The segment's last `logits` rows, next to each other.   last: [k, hidden]
                    let n = seg.logits;
                    if n > 0 {
                        b.copy(&mut s.last, k * d, &s.x, (end - n) * d, n * d)?;
                        k += n;
                    }
                }
                if k > 0 {
                    b.rmsnorm(&mut s.xb, &s.last, &model.norm, k, d, eps)?;
                    match &model.lm_head {
                        Some(head) => b.matmul(&mut s.logits, head, &s.xb, k, out, d)?,
                        None => b.copy(&mut s.logits, 0, &s.xb, 0, k * d)?,
                    }
                }
            }
        }
        Ok(())
    }

    /// `Qwen3DecoderLayer.forward`: `x = x + attn(input_layernorm(x))`,
    /// then `x = x + mlp(post_attention_layernorm(x))`.
    fn decoder_layer(
        &mut self,
        l: usize,
        layer: &Qwen3DecoderLayer<B::Tensor>,
        t: usize,
        segments: &[Segment],
        caches: &mut [Cache<B>],
        positions: Option<&[[u32; 3]]>,
    ) -> Result<()> {
        let b = self.backend;
        let Dims { d, eps, .. } = self.dims;

        // 2a. Token mixer block.                                   xb = input_layernorm(x)
        b.rmsnorm(&mut self.s.xb, &self.s.x, &layer.input_layernorm, t, d, eps)?;
        match &layer.mixer {
            Mixer::Attention(attn) => {
                self.self_attention(l, attn, t, segments, caches, positions)?
            }
            Mixer::GatedDeltaNet(la) => self.linear_attention(l, la, t, segments, caches)?,
        }
        // self.s.xb now holds the mixer's output.                   x = x + mixer
        b.add(&mut self.s.x, &self.s.xb, t * d)?;

        // 2b. MLP block.                                    xb = post_attention_layernorm(x)
        b.rmsnorm(
            &mut self.s.xb,
            &self.s.x,
            &layer.post_attention_layernorm,
            t,
            d,
            eps,
        )?;
        match &layer.mlp {
            Mlp::Dense(mlp) => self.mlp(mlp, t)?,
            Mlp::Sparse(moe) => self.sparse_moe(moe, t)?,
        }
        b.add(&mut self.s.x, &self.s.xb, t * d) //                    x = x + mlp
    }

    /// `Qwen3MLP.forward` on the normalised input in `xb`; leaves `down(silu(gate(x)) * up(x))`
    /// in `xb`.
    fn mlp(&mut self, mlp: &Qwen3MLP<B::Tensor>, t: usize) -> Result<()> {
        let b = self.backend;
        let Dims { d, ff, .. } = self.dims;
        let s = &mut self.s;
        // gate, up: [t, intermediate], the two in one pass over xb.
        b.matmuls(
            [&mut s.gate, &mut s.up],
            [&mlp.gate_proj, &mlp.up_proj],
            &s.xb,
            t,
            [ff, ff],
            d,
        )?;
        b.silu_mul(&mut s.gate, &s.up, t * ff)?; //                    gate = silu(gate) * up
        b.matmul(&mut s.xb, &mlp.down_proj, &s.gate, t, d, ff) //      xb:   [t, hidden]
    }
}
