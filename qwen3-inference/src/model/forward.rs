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

use super::moe::Routes;
use super::{Mlp, Model, Qwen3Attention, Qwen3DecoderLayer, Qwen3MLP, Qwen3MoeSparseMoeBlock};
use crate::backend::{AttentionShape, Backend, KvType, RopeTable};
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
}

/// One sequence's rows in a step: `len` consecutive rows of the step's tokens, at positions
/// `pos .. pos + len` of the sequence whose keys and values are `caches[seq]`.
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
    /// `[t, intermediate]` (or an expert's `[t, moe_intermediate]`, whichever is wider)
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
            ..
        } = dims;
        // Keys and values of one sequence. The config's sizes are bounded by validation, but
        // their product for a hostile file could still be absurd: refuse it instead of aborting
        // in the allocator.
        (nkv * context_len * hd)
            .checked_mul(model.layers.len())
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
        Ok(Forward {
            backend,
            model,
            dims,
            context_len,
            max_batch: n,
            max_logits,
            rope: b.rope_table(RopeTable::with_scaling(
                hd,
                c.rope_theta,
                c.rope_scaling,
                context_len,
            ))?,
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
                gate: b.alloc(n * ff.max(moe_ff))?,
                up: b.alloc(n * ff.max(moe_ff))?,
                router: b.alloc((n * experts).max(1))?,
                expert_in: b.alloc(if experts > 0 { n * d } else { 1 })?,
                expert_out: b.alloc(if experts > 0 { n * d } else { 1 })?,
                moe_out: b.alloc(if experts > 0 { n * d } else { 1 })?,
                last: b.alloc(max_logits * d)?,
                logits: b.alloc(max_logits * out)?,
            },
            logits_host: Vec::new(),
            router_host: Vec::new(),
            routes: Routes::default(),
            route_log: None,
        })
    }

    /// An empty KV cache for one sequence of up to `context_len` positions.
    pub fn new_cache(&self) -> Result<B::KvCache> {
        let Dims {
            nh, nkv, head_dim, ..
        } = self.dims;
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim,
            context_len: self.context_len,
        };
        self.backend
            .kv_cache(self.model.layers.len(), shape, self.max_batch, self.kv)
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
        caches: &mut [B::KvCache],
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
        caches: &mut [B::KvCache],
    ) -> Result<usize> {
        self.check(tokens, segments, caches.len())?;
        let k: usize = segments.iter().map(|s| s.logits).sum();
        if k > self.max_logits {
            bail!(
                "{k} rows of logits in one step: at most {}",
                self.max_logits
            );
        }
        self.run(tokens, segments, caches, None)?;
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
        cache: &mut B::KvCache,
        all: &mut B::Buf,
    ) -> Result<()> {
        let segments = [Segment { seq: 0, ..segment }];
        self.check(tokens, &segments, 1)?;
        self.run(tokens, &segments, std::slice::from_mut(cache), Some(all))
    }

    fn check(&self, tokens: &[u32], segments: &[Segment], caches: usize) -> Result<()> {
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
        Ok(())
    }

    /// The forward pass of one checked step. With `all_logits`, it receives `[t, vocab]`;
    /// otherwise `self.s.logits` gets the logits of the segments that ask for them.
    fn run(
        &mut self,
        tokens: &[u32],
        segments: &[Segment],
        caches: &mut [B::KvCache],
        all_logits: Option<&mut B::Buf>,
    ) -> Result<()> {
        let (b, model) = (self.backend, self.model);
        let Dims { d, out, eps, .. } = self.dims;
        let t = tokens.len();

        // 1. Token embedding: row `token` of embed_tokens for each token.   x: [t, hidden]
        b.embed(&mut self.s.x, &model.embed_tokens, tokens, d)?;

        // 2. The decoder layers, each adding its attention and MLP outputs to the residual x.
        for (l, layer) in model.layers.iter().enumerate() {
            self.decoder_layer(l, layer, t, segments, caches)?;
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
        caches: &mut [B::KvCache],
    ) -> Result<()> {
        let b = self.backend;
        let Dims { d, eps, .. } = self.dims;

        // 2a. Attention block.                                     xb = input_layernorm(x)
        b.rmsnorm(&mut self.s.xb, &self.s.x, &layer.input_layernorm, t, d, eps)?;
        self.self_attention(l, &layer.self_attn, t, segments, caches)?;
        // self.s.xb now holds the attention output.                 x = x + attn
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

    /// `Qwen3Attention.forward` on the normalised input in `xb` (`[t, hidden]`); leaves the output
    /// (after o_proj) in `xb`.
    fn self_attention(
        &mut self,
        l: usize,
        attn: &Qwen3Attention<B::Tensor>,
        t: usize,
        segments: &[Segment],
        caches: &mut [B::KvCache],
    ) -> Result<()> {
        let b = self.backend;
        let Dims {
            d,
            nh,
            nkv,
            head_dim: hd,
            eps,
            ..
        } = self.dims;
        let s = &mut self.s;

        // i. Projections, the three in one pass over xb.
        //    q: [t, n_heads, head_dim]   k, v: [t, n_kv_heads, head_dim]
        //    With q/k norms (Qwen3), q and k land in q_raw/k_raw, the norms' inputs.
        let (q, k) = match attn.qk_norm {
            Some(_) => (&mut s.q_raw, &mut s.k_raw),
            None => (&mut s.q, &mut s.k),
        };
        b.matmuls(
            [&mut *q, &mut *k, &mut s.v],
            [&attn.q_proj, &attn.k_proj, &attn.v_proj],
            &s.xb,
            t,
            [nh * hd, nkv * hd, nkv * hd],
            d,
        )?;

        // ii. Qwen2: the projections' biases, one per output row: q += b_q, k += b_k, v += b_v.
        if let Some([bq, bk, bv]) = &attn.qkv_bias {
            b.add_bias(q, bq, t, nh * hd)?;
            b.add_bias(k, bk, t, nkv * hd)?;
            b.add_bias(&mut s.v, bv, t, nkv * hd)?;
        }
        //     Qwen3: per-head RMSNorm of q and k over head_dim (q_norm/k_norm), before RoPE:
        //     rows = t * heads, each head_dim wide.
        if let Some([q_norm, k_norm]) = &attn.qk_norm {
            b.rmsnorm(&mut s.q, &s.q_raw, q_norm, t * nh, hd, eps)?;
            b.rmsnorm(&mut s.k, &s.k_raw, k_norm, t * nkv, hd, eps)?;
        }

        // iii-v. Per sequence: RoPE at its positions, its cache, attention over its cache.
        match segments {
            // One sequence: its rows are the whole buffers.
            [seg] => {
                let Scratch { q, k, v, att, .. } = &mut *s;
                let cache = &mut caches[seg.seq];
                seq_attention(b, &self.rope, self.dims, l, seg, cache, [q, k, v, att])?
            }
            // Several: each segment's rows are copied to the start of `seg`, and its output back.
            _ => {
                let [sq, sk, sv, satt] = &mut s.seg;
                let mut r0 = 0;
                for seg in segments {
                    let n = seg.len;
                    b.copy(sq, 0, &s.q, r0 * nh * hd, n * nh * hd)?;
                    b.copy(sk, 0, &s.k, r0 * nkv * hd, n * nkv * hd)?;
                    b.copy(sv, 0, &s.v, r0 * nkv * hd, n * nkv * hd)?;
                    let bufs = [&mut *sq, &mut *sk, &mut *sv, &mut *satt];
                    let cache = &mut caches[seg.seq];
                    seq_attention(b, &self.rope, self.dims, l, seg, cache, bufs)?;
                    b.copy(&mut s.att, r0 * nh * hd, satt, 0, n * nh * hd)?;
                    r0 += n;
                }
            }
        }

        // vi. Output projection back to the residual width.     xb: [t, hidden]
        b.matmul(&mut s.xb, &attn.o_proj, &s.att, t, d, nh * hd)
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

impl<'m, B: Backend> Forward<'m, B> {
    /// `Qwen3MoeSparseMoeBlock.forward` on the normalised input in `xb` (`[t, hidden]`); leaves
    /// the weighted sum of each row's chosen experts in `xb`. The routing math is in
    /// [`super::moe`].
    fn sparse_moe(&mut self, moe: &Qwen3MoeSparseMoeBlock<B::Tensor>, t: usize) -> Result<()> {
        let b = self.backend;
        let Dims {
            d,
            experts,
            top_k,
            moe_ff: mff,
            norm_topk,
            ..
        } = self.dims;
        let s = &mut self.s;

        // i. The router's logits, f32 weights and f32 activations: z = xb @ gate^T.
        //    router: [t, num_experts]
        b.matmul(&mut s.router, &moe.gate, &s.xb, t, experts, d)?;

        // ii. Routing on the host: softmax, top-k, renormalised; grouped by expert.
        let logits = b.read(&s.router, t * experts, &mut self.router_host)?;
        self.routes.route(logits, t, experts, top_k, norm_topk);
        if let Some(log) = &mut self.route_log {
            // Row r's experts, ascending: each expert's rows are ascending, so a pass over the
            // experts in order lists each row's choices in order.
            let start = log.len();
            log.resize(start + t * top_k, 0);
            let mut filled = vec![0usize; t];
            for (e, rows) in self.routes.rows.iter().enumerate() {
                for &r in rows {
                    let r = r as usize;
                    log[start + r * top_k + filled[r]] = e as u32;
                    filled[r] += 1;
                }
            }
        }

        // iii. Each chosen expert once, on all the rows that chose it, its weighted output
        //      added to those rows, experts in ascending order.      moe_out: [t, hidden]
        b.zero(&mut s.moe_out, t * d)?;
        for (e, expert) in moe.experts.iter().enumerate() {
            let (rows, weights) = (&self.routes.rows[e], &self.routes.weights[e]);
            let n = rows.len();
            if n == 0 {
                continue;
            }
            b.gather_rows(&mut s.expert_in, &s.xb, rows, d)?; //      expert_in: [n, hidden]
            b.matmuls(
                [&mut s.gate, &mut s.up],
                [&expert.gate_proj, &expert.up_proj],
                &s.expert_in,
                n,
                [mff, mff],
                d,
            )?;
            b.silu_mul(&mut s.gate, &s.up, n * mff)?; //         gate = silu(gate) * up
            b.matmul(&mut s.expert_out, &expert.down_proj, &s.gate, n, d, mff)?;
            b.scatter_add_rows(&mut s.moe_out, &s.expert_out, rows, weights, d)?;
        }
        b.copy(&mut s.xb, 0, &s.moe_out, 0, t * d)
    }
}

/// Steps iii to v of attention for one sequence, whose `seg.len` rows start at the beginning of
/// `q`, `k`, `v` and `att`.
fn seq_attention<B: Backend>(
    b: &B,
    rope: &B::Rope,
    dims: Dims,
    l: usize,
    seg: &Segment,
    cache: &mut B::KvCache,
    [q, k, v, att]: [&mut B::Buf; 4],
) -> Result<()> {
    let Dims {
        nh,
        nkv,
        head_dim: hd,
        ..
    } = dims;
    let (n, pos) = (seg.len, seg.pos);

    // iii. RoPE: rotate each head of token i by the angles of its position pos + i.
    b.rope(q, rope, n, nh, hd, pos)?;
    b.rope(k, rope, n, nkv, hd, pos)?;

    // iv. Append k and v to this layer's cache at positions pos .. pos + n.
    b.store_kv(cache, l, k, v, n, pos)?;

    // v. Causal grouped-query attention over the cache: token i sees positions 0 ..= pos + i;
    //    query head h reads kv head h / (n_heads / n_kv_heads).   att: [n, n_heads, head_dim]
    b.attention(att, q, cache, l, n, pos)
}
