//! One running sequence: the KV cache, the scratch buffers, and the forward pass, written once
//! over a [`Backend`] (the CPU's SIMD kernels, or a GPU's).
//!
//! `Session::forward(tokens)` runs a batch of `t` tokens through the model at positions
//! `pos .. pos + t` and returns the logits of the last one. The prompt goes in as one call
//! (prefill: every weight matrix is read once for all `t` tokens), then each sampled token as a
//! call with `t = 1` (decode). Buffers are allocated once, in [`Session::with_backend`]; a decode
//! step allocates nothing.

use super::{Model, Qwen3Attention, Qwen3DecoderLayer, Qwen3MLP};
use crate::backend::{AttentionShape, Backend, CpuBackend, KvType, RopeTable};
use anyhow::{bail, Result};

/// Most tokens run through the layers at once. Longer prompts go in chunks of this many, which
/// bounds the scratch memory (~7 MB for Qwen3-0.6B) while keeping prefill matrix-matrix.
pub const MAX_BATCH: usize = 128;

/// The model's sizes, as `usize`, read once from its config.
#[derive(Clone, Copy)]
struct Dims {
    /// hidden_size
    d: usize,
    /// intermediate_size
    ff: usize,
    /// num_attention_heads
    nh: usize,
    /// num_key_value_heads
    nkv: usize,
    head_dim: usize,
    vocab: usize,
    eps: f32,
}

/// Activations of one batch of up to `max_batch` tokens, reused by every call.
struct Scratch<Buf> {
    /// The residual stream, `[t, hidden]`.
    x: Buf,
    /// Normalised input of a block, and later the block's output, `[t, hidden]`.
    xb: Buf,
    /// `q_proj(xb)` before q_norm, `[t, n_heads, head_dim]`.
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
    /// `[t, intermediate]`
    gate: Buf,
    /// `[t, intermediate]`
    up: Buf,
    /// The last token's residual, `[hidden]`: the classifier's input.
    last: Buf,
    /// `[vocab]`: the logits of the last token.
    logits: Buf,
}

/// A sequence being run through a [`Model`] on backend `B`: owns the KV cache and the scratch
/// buffers.
pub struct Session<'m, B: Backend> {
    backend: &'m B,
    model: &'m Model<'m, B::Tensor>,
    dims: Dims,
    context_len: usize,
    /// Tokens the scratch buffers hold.
    max_batch: usize,
    /// Tokens per forward chunk (at most `max_batch`).
    batch: usize,
    /// Tokens already in the KV cache; the next token goes to this position.
    pos: usize,
    rope: B::Rope,
    cache: B::KvCache,
    /// What the cache stores keys and values as.
    kv: KvType,
    s: Scratch<B::Buf>,
    /// The logits on the host, when the backend's buffers are not (empty on the CPU).
    logits_host: Vec<f32>,
}

/// The CPU backend holds nothing, so one constant serves every CPU session.
const CPU: &CpuBackend<'static> = &CpuBackend::new();

impl<'m, 'a: 'm> Session<'m, CpuBackend<'a>> {
    /// A session on the CPU with room for `context_len` tokens (prompt and generated together),
    /// its KV cache in f32.
    pub fn new(model: &'m Model<'a>, context_len: usize) -> Result<Self> {
        Session::with_kv_cache(CPU, model, context_len, KvType::F32)
    }

    /// [`Session::new`] with the KV cache holding keys and values as `kv` says.
    pub fn with_kv(model: &'m Model<'a>, context_len: usize, kv: KvType) -> Result<Self> {
        Session::with_kv_cache(CPU, model, context_len, kv)
    }
}

impl<'m, B: Backend> Session<'m, B> {
    /// A session on `backend` with room for `context_len` tokens (prompt and generated
    /// together). `model` holds the backend's tensors (`Model::load_with`).
    pub fn with_backend(
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        context_len: usize,
    ) -> Result<Self> {
        Session::with_kv_cache(backend, model, context_len, KvType::F32)
    }

    /// [`Session::with_backend`], the KV cache holding keys and values as `kv` says.
    pub fn with_kv_cache(
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        context_len: usize,
        kv: KvType,
    ) -> Result<Self> {
        let c = model.config;
        let max = c.max_position_embeddings as usize;
        if context_len == 0 {
            bail!("context length must be at least 1");
        }
        if context_len > max {
            bail!(
                "context length {context_len} is larger than the model supports ({max} positions)"
            );
        }
        let dims = Dims {
            d: c.hidden_size as usize,
            ff: c.intermediate_size as usize,
            nh: c.num_attention_heads as usize,
            nkv: c.num_key_value_heads as usize,
            head_dim: c.head_dim as usize,
            vocab: c.vocab_size as usize,
            eps: c.rms_norm_eps as f32,
        };
        let Dims {
            d,
            ff,
            nh,
            nkv,
            head_dim: hd,
            vocab,
            ..
        } = dims;
        let layers = model.layers.len();
        // Keys and values. The config's sizes are bounded by validation, but their product for a
        // hostile file could still be absurd: refuse it instead of aborting in the allocator.
        (nkv * context_len * hd)
            .checked_mul(layers)
            .filter(|n| {
                n.checked_mul(2 * kv.bytes())
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                anyhow::anyhow!("a KV cache for {context_len} positions does not fit in memory")
            })?;
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            context_len,
        };
        let n = MAX_BATCH.min(context_len);
        let b = backend;
        Ok(Session {
            backend,
            model,
            dims,
            context_len,
            max_batch: n,
            batch: n,
            pos: 0,
            rope: b.rope_table(RopeTable::new(hd, c.rope_theta, context_len))?,
            cache: b.kv_cache(layers, shape, n, kv)?,
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
                gate: b.alloc(n * ff)?,
                up: b.alloc(n * ff)?,
                last: b.alloc(d)?,
                logits: b.alloc(vocab)?,
            },
            logits_host: Vec::new(),
        })
    }

    /// Tokens in the KV cache (the position the next token gets).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Positions this session holds.
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    pub fn model(&self) -> &'m Model<'m, B::Tensor> {
        self.model
    }

    pub fn backend(&self) -> &'m B {
        self.backend
    }

    /// What the KV cache stores keys and values as.
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// Bytes held by the KV cache.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.model.kv_cache_bytes(self.context_len, self.kv)
    }

    /// Runs later prompts in chunks of at most `n` tokens (1 ..= the batch the buffers were
    /// sized for, [`MAX_BATCH`] or the context if shorter). For tests: chunked prefill must give
    /// the same logits as one pass.
    pub fn set_max_batch(&mut self, n: usize) -> Result<()> {
        if n == 0 || n > self.max_batch {
            bail!("batch of {n} tokens: must be 1 ..= {}", self.max_batch);
        }
        self.batch = n;
        Ok(())
    }

    /// Forgets every token from position `pos` on, so the next `forward` continues from there.
    /// The chat rewinds to where the last answer began and re-feeds it in its rendered form; the
    /// cache entries before `pos` stay valid because attention is causal.
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos > self.pos {
            bail!(
                "cannot truncate to position {pos}: only {} tokens are in the cache",
                self.pos
            );
        }
        self.pos = pos;
        Ok(())
    }

    /// Runs `tokens` at positions `pos .. pos + tokens.len()` and returns the last token's logits
    /// (`[vocab]`). Errors (nothing changes) if a token id is outside the vocabulary or the tokens
    /// do not fit in the context.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check(tokens)?;
        for chunk in tokens.chunks(self.batch) {
            self.forward_batch(chunk, None)?;
        }
        let vocab = self.dims.vocab;
        self.backend
            .read(&self.s.logits, vocab, &mut self.logits_host)
    }

    /// Like [`Session::forward`] but returns the logits of every token, `[tokens.len(), vocab]`
    /// (allocated per call: for tests and evaluation, not the generation loop).
    pub fn forward_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let vocab = self.dims.vocab;
        let mut chunk_logits = self.backend.alloc(self.batch * vocab)?;
        let mut staging = Vec::new();
        let mut all = Vec::with_capacity(tokens.len() * vocab);
        for chunk in tokens.chunks(self.batch) {
            self.forward_batch(chunk, Some(&mut chunk_logits))?;
            let rows = self
                .backend
                .read(&chunk_logits, chunk.len() * vocab, &mut staging)?;
            all.extend_from_slice(rows);
        }
        Ok(all)
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("no tokens to run");
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        if self.pos + tokens.len() > self.context_len {
            bail!(
                "{} tokens do not fit: {} of {} context positions are used",
                tokens.len(),
                self.pos,
                self.context_len
            );
        }
        Ok(())
    }

    /// The forward pass for `t <= batch` tokens at positions `pos .. pos + t`. With
    /// `all_logits`, it receives `[t, vocab]`; otherwise `self.s.logits` gets the last token's.
    fn forward_batch(&mut self, tokens: &[u32], all_logits: Option<&mut B::Buf>) -> Result<()> {
        let (b, model) = (self.backend, self.model);
        let Dims { d, vocab, eps, .. } = self.dims;
        let t = tokens.len();

        // 1. Token embedding: row `token` of embed_tokens for each token.   x: [t, hidden]
        b.embed(&mut self.s.x, &model.embed_tokens, tokens, d)?;

        // 2. The decoder layers, each adding its attention and MLP outputs to the residual x.
        for (l, layer) in model.layers.iter().enumerate() {
            self.decoder_layer(l, layer, t)?;
        }

        // 3. Final RMSNorm and the classifier: logits = norm(x) @ lm_head^T.   [t, vocab]
        //    The classifier is the largest matrix of a small model (Qwen3-0.6B: 151936 x 1024),
        //    so generation runs it for the last token only.
        let s = &mut self.s;
        match all_logits {
            Some(all) => {
                b.rmsnorm(&mut s.xb, &s.x, &model.norm, t, d, eps)?;
                b.matmul(all, &model.lm_head, &s.xb, t, vocab, d)?;
            }
            None => {
                b.copy(&mut s.last, 0, &s.x, (t - 1) * d, d)?; //   last: [1, hidden]
                b.rmsnorm(&mut s.xb, &s.last, &model.norm, 1, d, eps)?;
                b.matmul(&mut s.logits, &model.lm_head, &s.xb, 1, vocab, d)?;
            }
        }
        self.pos += t;
        Ok(())
    }

    /// `Qwen3DecoderLayer.forward`: `x = x + attn(input_layernorm(x))`,
    /// then `x = x + mlp(post_attention_layernorm(x))`.
    fn decoder_layer(
        &mut self,
        l: usize,
        layer: &Qwen3DecoderLayer<B::Tensor>,
        t: usize,
    ) -> Result<()> {
        let b = self.backend;
        let Dims { d, eps, .. } = self.dims;

        // 2a. Attention block.                                     xb = input_layernorm(x)
        b.rmsnorm(&mut self.s.xb, &self.s.x, &layer.input_layernorm, t, d, eps)?;
        self.self_attention(l, &layer.self_attn, t)?;
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
        self.mlp(&layer.mlp, t)?;
        b.add(&mut self.s.x, &self.s.xb, t * d) //                    x = x + mlp
    }

    /// `Qwen3Attention.forward` on the normalised input in `xb` (`[t, hidden]`); leaves the output
    /// (after o_proj) in `xb`.
    fn self_attention(
        &mut self,
        l: usize,
        attn: &Qwen3Attention<B::Tensor>,
        t: usize,
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
        let pos = self.pos;
        let s = &mut self.s;

        // i. Projections, the three in one pass over xb.
        //    q: [t, n_heads, head_dim]   k, v: [t, n_kv_heads, head_dim]
        b.matmuls(
            [&mut s.q_raw, &mut s.k_raw, &mut s.v],
            [&attn.q_proj, &attn.k_proj, &attn.v_proj],
            &s.xb,
            t,
            [nh * hd, nkv * hd, nkv * hd],
            d,
        )?;

        // ii. Per-head RMSNorm of q and k over head_dim (Qwen3's q_norm/k_norm), before RoPE:
        //     rows = t * heads, each head_dim wide.
        b.rmsnorm(&mut s.q, &s.q_raw, &attn.q_norm, t * nh, hd, eps)?;
        b.rmsnorm(&mut s.k, &s.k_raw, &attn.k_norm, t * nkv, hd, eps)?;

        // iii. RoPE: rotate each head of token i by the angles of its position pos + i.
        b.rope(&mut s.q, &self.rope, t, nh, hd, pos)?;
        b.rope(&mut s.k, &self.rope, t, nkv, hd, pos)?;

        // iv. Append k and v to this layer's cache at positions pos .. pos + t.
        b.store_kv(&mut self.cache, l, &s.k, &s.v, t, pos)?;

        // v. Causal grouped-query attention over the cache: token i sees positions 0 ..= pos + i;
        //    query head h reads kv head h / (n_heads / n_kv_heads).   att: [t, n_heads, head_dim]
        b.attention(&mut s.att, &s.q, &mut self.cache, l, t, pos)?;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DType, ModelFile};
    use crate::model::test_model::write_random;
    use std::path::PathBuf;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pq-session-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join("m.bin")
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// Prefill in one pass, token-by-token decode, and chunked prefill (batches smaller than the
    /// prompt) must give the same logits at every position: the KV cache and positions are right.
    #[test]
    fn prefill_equals_token_by_token_decode() {
        for dt in [DType::F32, DType::Bf16, DType::Q8] {
            let p = tmp(dt.name());
            write_random(&p, dt);
            let file = ModelFile::open(&p).unwrap();
            let model = Model::load(&file).unwrap();
            let vocab = 40;
            let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % vocab).collect();

            let mut a = Session::new(&model, 32).unwrap();
            let all = a.forward_all_logits(&tokens).unwrap();
            assert_eq!(a.pos(), 20);
            assert!(all.iter().all(|v| v.is_finite()));

            let mut b = Session::new(&model, 32).unwrap();
            for (i, &tok) in tokens.iter().enumerate() {
                let logits = b.forward(&[tok]).unwrap();
                let want = &all[i * vocab as usize..(i + 1) * vocab as usize];
                assert!(max_diff(logits, want) < 1e-5, "{dt} pos {i}");
            }

            let mut c = Session::new(&model, 32).unwrap();
            c.set_max_batch(3).unwrap();
            let last = c.forward(&tokens).unwrap();
            assert!(
                max_diff(last, &all[19 * vocab as usize..]) < 1e-5,
                "{dt} chunked"
            );

            // Rewind and re-run the tail: the same logits again.
            c.truncate(12).unwrap();
            let again = c.forward(&tokens[12..]).unwrap();
            assert!(
                max_diff(again, &all[19 * vocab as usize..]) < 1e-5,
                "{dt} truncate"
            );

            // Different prefixes give different logits (the test can fail).
            let mut d = Session::new(&model, 32).unwrap();
            let other = d.forward(&tokens[1..]).unwrap();
            assert!(max_diff(other, &all[19 * vocab as usize..]) > 1e-3);
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let p = tmp("bad");
        write_random(&p, DType::F32);
        let file = ModelFile::open(&p).unwrap();
        let model = Model::load(&file).unwrap();
        assert!(Session::new(&model, 0).is_err());
        let e = Session::new(&model, 65).err().unwrap().to_string();
        assert!(e.contains("larger than the model supports"), "{e}");
        let mut s = Session::new(&model, 4).unwrap();
        assert!(s.forward(&[]).is_err());
        assert!(s
            .forward(&[40])
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
        assert!(s
            .forward(&[1, 2, 3, 4, 5])
            .unwrap_err()
            .to_string()
            .contains("do not fit"));
        assert_eq!(s.pos(), 0);
        s.forward(&[1, 2, 3, 4]).unwrap();
        assert!(s.forward(&[1]).is_err());
        assert!(s.truncate(5).is_err());
        s.truncate(0).unwrap();
        s.forward(&[1]).unwrap();
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }
}
