//! The Qwen3 forward pass over a [`Backend`], as HuggingFace's Qwen3ForCausalLM computes it
//! (transformers, modeling_qwen3.py), one chunk of tokens at a time against a KV cache.
//!
//! Shapes below use n = tokens in the chunk, d = hidden_size, nq/nkv = query/kv heads,
//! hd = head_dim, ff = intermediate_size, V = vocab_size.

use crate::backend::Backend;
use crate::reference::attention::AttentionShape;
use crate::reference::rope::rope_tables;
use anyhow::{ensure, Result};
use qwen3_inference::format::ModelConfig;

/// One decoder layer's tensors.
pub struct LayerWeights<T> {
    pub input_norm: T,
    pub q_proj: T,
    pub k_proj: T,
    pub v_proj: T,
    pub q_norm: T,
    pub k_norm: T,
    pub o_proj: T,
    pub post_attention_norm: T,
    pub gate_proj: T,
    pub up_proj: T,
    pub down_proj: T,
}

/// Every tensor the forward pass reads, by HuggingFace name.
pub struct Weights<T> {
    pub embed_tokens: T,
    pub layers: Vec<LayerWeights<T>>,
    pub norm: T,
    /// `lm_head.weight`, or the embedding table again when the model ties them.
    pub lm_head: T,
}

impl<T> Weights<T> {
    /// Looks every tensor up through `get` (a model file view, or a device range).
    pub fn load(
        config: &ModelConfig,
        mut get: impl FnMut(&str) -> Result<T>,
    ) -> Result<Weights<T>> {
        let layers = (0..config.num_hidden_layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                Ok(LayerWeights {
                    input_norm: get(&format!("{p}.input_layernorm.weight"))?,
                    q_proj: get(&format!("{p}.self_attn.q_proj.weight"))?,
                    k_proj: get(&format!("{p}.self_attn.k_proj.weight"))?,
                    v_proj: get(&format!("{p}.self_attn.v_proj.weight"))?,
                    q_norm: get(&format!("{p}.self_attn.q_norm.weight"))?,
                    k_norm: get(&format!("{p}.self_attn.k_norm.weight"))?,
                    o_proj: get(&format!("{p}.self_attn.o_proj.weight"))?,
                    post_attention_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
                    gate_proj: get(&format!("{p}.mlp.gate_proj.weight"))?,
                    up_proj: get(&format!("{p}.mlp.up_proj.weight"))?,
                    down_proj: get(&format!("{p}.mlp.down_proj.weight"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if config.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        Ok(Weights {
            embed_tokens: get("model.embed_tokens.weight")?,
            layers,
            norm: get("model.norm.weight")?,
            lm_head: get(lm_head)?,
        })
    }
}

/// Sizes read from the model file, as usize.
#[derive(Debug, Clone, Copy)]
struct Dims {
    d: usize,
    ff: usize,
    nq: usize,
    nkv: usize,
    hd: usize,
    vocab: usize,
    eps: f32,
}

/// A generation's state on a backend: KV cache, RoPE tables, scratch buffers, position.
pub struct Session<'w, B: Backend> {
    backend: &'w B,
    weights: &'w Weights<B::Tensor>,
    dims: Dims,
    ctx: usize,
    max_chunk: usize,
    pos: usize,
    cos: B::Buf,
    sin: B::Buf,
    /// Per layer, [ctx, nkv, hd].
    k_cache: Vec<B::Buf>,
    v_cache: Vec<B::Buf>,
    x: B::Buf,      // [n, d] the residual stream
    xn: B::Buf,     // [n, d] normalised input of a block
    q_raw: B::Buf,  // [n, nq*hd]
    q: B::Buf,      // [n, nq*hd]
    k_raw: B::Buf,  // [n, nkv*hd]
    k: B::Buf,      // [n, nkv*hd]
    v: B::Buf,      // [n, nkv*hd]
    att: B::Buf,    // [n, nq*hd]
    scores: B::Buf, // [n, nq, ctx]
    proj: B::Buf,   // [n, d]
    gate: B::Buf,   // [n, ff]
    up: B::Buf,     // [n, ff]
    act: B::Buf,    // [n, ff]
    last: B::Buf,   // [d]
    logits: B::Buf, // [V]
}

impl<'w, B: Backend> Session<'w, B> {
    /// A session of `ctx` positions that runs prompts in chunks of up to `max_chunk` tokens.
    pub fn new(
        backend: &'w B,
        weights: &'w Weights<B::Tensor>,
        config: &ModelConfig,
        ctx: usize,
        max_chunk: usize,
    ) -> Result<Self> {
        ensure!(
            ctx >= 1 && max_chunk >= 1,
            "context and chunk size must be at least 1"
        );
        ensure!(
            ctx <= config.max_position_embeddings as usize,
            "context {ctx} exceeds the model's {} positions",
            config.max_position_embeddings
        );
        let dims = Dims {
            d: config.hidden_size as usize,
            ff: config.intermediate_size as usize,
            nq: config.num_attention_heads as usize,
            nkv: config.num_key_value_heads as usize,
            hd: config.head_dim as usize,
            vocab: config.vocab_size as usize,
            eps: config.rms_norm_eps as f32,
        };
        let Dims {
            d,
            ff,
            nq,
            nkv,
            hd,
            vocab,
            ..
        } = dims;
        let n = max_chunk;
        let (cos, sin) = rope_tables(hd, config.rope_theta, ctx);
        let b = backend;
        let caches = |_| b.alloc(ctx * nkv * hd);
        Ok(Session {
            backend,
            weights,
            dims,
            ctx,
            max_chunk,
            pos: 0,
            cos: b.upload(&cos)?,
            sin: b.upload(&sin)?,
            k_cache: (0..weights.layers.len())
                .map(caches)
                .collect::<Result<_>>()?,
            v_cache: (0..weights.layers.len())
                .map(caches)
                .collect::<Result<_>>()?,
            x: b.alloc(n * d)?,
            xn: b.alloc(n * d)?,
            q_raw: b.alloc(n * nq * hd)?,
            q: b.alloc(n * nq * hd)?,
            k_raw: b.alloc(n * nkv * hd)?,
            k: b.alloc(n * nkv * hd)?,
            v: b.alloc(n * nkv * hd)?,
            att: b.alloc(n * nq * hd)?,
            scores: b.alloc(n * nq * ctx)?,
            proj: b.alloc(n * d)?,
            gate: b.alloc(n * ff)?,
            up: b.alloc(n * ff)?,
            act: b.alloc(n * ff)?,
            last: b.alloc(d)?,
            logits: b.alloc(vocab)?,
        })
    }

    /// Positions already in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Positions the KV cache holds.
    pub fn context_len(&self) -> usize {
        self.ctx
    }

    /// Forgets every position from `pos` on (e.g. to re-run a chat turn); later tokens overwrite
    /// those cache rows.
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        ensure!(
            pos <= self.pos,
            "cannot truncate to {pos}: only {} positions are filled",
            self.pos
        );
        self.pos = pos;
        Ok(())
    }

    /// Runs `tokens` through the model after everything already in the cache, and returns the
    /// logits (`[V]`) of the last one. A prompt is processed in chunks of `max_chunk` tokens.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        ensure!(!tokens.is_empty(), "no tokens to run");
        ensure!(
            self.pos + tokens.len() <= self.ctx,
            "{} tokens after position {} exceed the context of {}",
            tokens.len(),
            self.pos,
            self.ctx
        );
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.dims.vocab) {
            anyhow::bail!(
                "token id {bad} is outside the vocabulary of {}",
                self.dims.vocab
            );
        }
        let mut last_len = 0;
        for chunk in tokens.chunks(self.max_chunk) {
            self.chunk(chunk)?;
            last_len = chunk.len();
        }
        self.logits_of_last(last_len)
    }

    fn chunk(&mut self, tokens: &[u32]) -> Result<()> {
        let b = self.backend;
        let w = self.weights;
        let Dims {
            d,
            ff,
            nq,
            nkv,
            hd,
            eps,
            ..
        } = self.dims;
        let n = tokens.len();
        let pos0 = self.pos;
        let shape = AttentionShape {
            n_heads: nq,
            n_kv: nkv,
            head_dim: hd,
            ctx: self.ctx,
            pos0,
        };

        // x: [n, d] = embed_tokens[tokens]
        b.embed(&mut self.x, &w.embed_tokens, tokens, d)?;
        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block: x += o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v))
            b.rmsnorm(&mut self.xn, &self.x, &lw.input_norm, n, d, eps)?;
            b.matmul(&mut self.q_raw, &lw.q_proj, &self.xn, n, nq * hd, d)?;
            b.matmul(&mut self.k_raw, &lw.k_proj, &self.xn, n, nkv * hd, d)?;
            b.matmul(&mut self.v, &lw.v_proj, &self.xn, n, nkv * hd, d)?;
            // Qwen3's per-head RMSNorm of q and k, before RoPE: rows = n * heads, width hd.
            b.rmsnorm(&mut self.q, &self.q_raw, &lw.q_norm, n * nq, hd, eps)?;
            b.rmsnorm(&mut self.k, &self.k_raw, &lw.k_norm, n * nkv, hd, eps)?;
            b.rope(&mut self.q, &self.cos, &self.sin, n, nq, hd, pos0)?;
            b.rope(&mut self.k, &self.cos, &self.sin, n, nkv, hd, pos0)?;
            // The cache is token-major, so this chunk's keys and values are one contiguous copy.
            let at = pos0 * nkv * hd;
            b.copy(&mut self.k_cache[l], at, &self.k, 0, n * nkv * hd)?;
            b.copy(&mut self.v_cache[l], at, &self.v, 0, n * nkv * hd)?;
            b.attention(
                &mut self.att,
                &mut self.scores,
                &self.q,
                &self.k_cache[l],
                &self.v_cache[l],
                n,
                shape,
            )?;
            b.matmul(&mut self.proj, &lw.o_proj, &self.att, n, d, nq * hd)?;
            b.add_assign(&mut self.x, &self.proj, n * d)?;

            // MLP block: x += down_proj(silu(gate_proj(x')) * up_proj(x')), x' = norm(x)
            b.rmsnorm(&mut self.xn, &self.x, &lw.post_attention_norm, n, d, eps)?;
            b.matmul(&mut self.gate, &lw.gate_proj, &self.xn, n, ff, d)?;
            b.matmul(&mut self.up, &lw.up_proj, &self.xn, n, ff, d)?;
            b.silu_mul(&mut self.act, &self.gate, &self.up, n * ff)?;
            b.matmul(&mut self.proj, &lw.down_proj, &self.act, n, d, ff)?;
            b.add_assign(&mut self.x, &self.proj, n * d)?;
        }
        self.pos += n;
        Ok(())
    }

    /// Final norm and classifier on the last row of the last chunk (`n` rows in `x`).
    fn logits_of_last(&mut self, n: usize) -> Result<Vec<f32>> {
        let b = self.backend;
        let Dims { d, vocab, eps, .. } = self.dims;
        b.copy(&mut self.last, 0, &self.x, (n - 1) * d, d)?;
        b.rmsnorm(&mut self.xn, &self.last, &self.weights.norm, 1, d, eps)?;
        b.matmul(
            &mut self.logits,
            &self.weights.lm_head,
            &self.xn,
            1,
            vocab,
            d,
        )?;
        b.download(&self.logits, 0, vocab)
    }
}
