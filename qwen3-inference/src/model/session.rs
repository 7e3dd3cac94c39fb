//! One running sequence: the KV cache, the scratch buffers, and the forward pass.
//!
//! `Session::forward(tokens)` runs a batch of `t` tokens through the model at positions
//! `pos .. pos + t` and returns the logits of the last one. The prompt goes in as one call
//! (prefill: every weight matrix is read once for all `t` tokens), then each sampled token as a
//! call with `t = 1` (decode). Buffers are allocated once, in [`Session::new`]; a decode step
//! allocates nothing.

use super::{Model, Qwen3Attention, Qwen3DecoderLayer, Qwen3MLP};
use crate::kernels::{
    add, attention, embedding, matmul, rmsnorm, rope, silu_mul, AttentionShape, RopeTable,
};
use anyhow::{bail, Result};

/// Most tokens run through the layers at once. Longer prompts go in chunks of this many, which
/// bounds the scratch memory (~7 MB for Qwen3-0.6B) while keeping prefill matrix-matrix.
pub const MAX_BATCH: usize = 128;

/// The KV cache of every layer: `[layer][kv_head][pos][head_dim]`, keys and values apart.
///
/// Contiguous per kv head, so attention for one head streams one block of memory; sized by the
/// context the session was asked for, not the model's maximum.
struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    /// Floats per layer: `n_kv_heads * context_len * head_dim`.
    layer_len: usize,
}

/// Activations of one batch of up to `max_batch` tokens, reused by every call.
struct Scratch {
    /// The residual stream, `[t, hidden]`.
    x: Vec<f32>,
    /// Normalised input of a block, and later the block's output, `[t, hidden]`.
    xb: Vec<f32>,
    /// `[t, n_heads, head_dim]`
    q: Vec<f32>,
    /// `[t, n_kv_heads, head_dim]`
    k: Vec<f32>,
    /// `[t, n_kv_heads, head_dim]`
    v: Vec<f32>,
    /// Attention output, `[t, n_heads, head_dim]`.
    att: Vec<f32>,
    /// `[t, intermediate]`
    gate: Vec<f32>,
    /// `[t, intermediate]`
    up: Vec<f32>,
    /// Attention scores, `[n_heads, context_len]`.
    scores: Vec<f32>,
    /// `[vocab]`: the logits of the last token.
    logits: Vec<f32>,
}

/// A sequence being run through a [`Model`]: owns the KV cache and the scratch buffers.
pub struct Session<'m> {
    model: &'m Model<'m>,
    context_len: usize,
    max_batch: usize,
    /// Tokens already in the KV cache; the next token goes to this position.
    pos: usize,
    rope: RopeTable,
    cache: KvCache,
    s: Scratch,
}

/// Which logits a forward call computes. The classifier is the largest matrix of a small model
/// (Qwen3-0.6B: 151936 x 1024), so prefill runs it for the last token only.
#[derive(Clone, Copy, PartialEq)]
enum Logits {
    Last,
    All,
}

impl<'m> Session<'m> {
    /// A session with room for `context_len` tokens (prompt and generated together).
    pub fn new(model: &'m Model<'m>, context_len: usize) -> Result<Session<'m>> {
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
        let (d, hd) = (c.hidden_size as usize, c.head_dim as usize);
        let (nh, nkv) = (
            c.num_attention_heads as usize,
            c.num_key_value_heads as usize,
        );
        let ff = c.intermediate_size as usize;
        let max_batch = MAX_BATCH.min(context_len);
        let layer_len = nkv * context_len * hd;
        // Keys and values in f32. The config's sizes are bounded by validation, but their product
        // for a hostile file could still be absurd: refuse it instead of aborting in the allocator.
        let cache_len = layer_len
            .checked_mul(c.num_hidden_layers as usize)
            .filter(|n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                anyhow::anyhow!("a KV cache for {context_len} positions does not fit in memory")
            })?;
        Ok(Session {
            model,
            context_len,
            max_batch,
            pos: 0,
            rope: RopeTable::new(hd, c.rope_theta, context_len),
            cache: KvCache {
                k: vec![0.0; cache_len],
                v: vec![0.0; cache_len],
                layer_len,
            },
            s: Scratch {
                x: vec![0.0; max_batch * d],
                xb: vec![0.0; max_batch * d],
                q: vec![0.0; max_batch * nh * hd],
                k: vec![0.0; max_batch * nkv * hd],
                v: vec![0.0; max_batch * nkv * hd],
                att: vec![0.0; max_batch * nh * hd],
                gate: vec![0.0; max_batch * ff],
                up: vec![0.0; max_batch * ff],
                scores: vec![0.0; nh * context_len],
                logits: vec![0.0; c.vocab_size as usize],
            },
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

    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    /// Bytes held by the KV cache.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.model.kv_cache_bytes(self.context_len)
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
        for chunk in tokens.chunks(self.max_batch) {
            self.forward_batch(chunk, Logits::Last, &mut []);
        }
        Ok(&self.s.logits)
    }

    /// Like [`Session::forward`] but returns the logits of every token, `[tokens.len(), vocab]`
    /// (allocated per call: for tests and evaluation, not the generation loop).
    pub fn forward_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let vocab = self.model.config.vocab_size as usize;
        let mut all = vec![0.0; tokens.len() * vocab];
        for (chunk, out) in tokens
            .chunks(self.max_batch)
            .zip(all.chunks_mut(self.max_batch * vocab))
        {
            self.forward_batch(chunk, Logits::All, out);
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

    /// The forward pass for `t <= max_batch` tokens at positions `pos .. pos + t`.
    /// With `Logits::All`, `all_logits` receives `[t, vocab]`; otherwise `self.s.logits` gets the
    /// last token's.
    fn forward_batch(&mut self, tokens: &[u32], which: Logits, all_logits: &mut [f32]) {
        let model = self.model;
        let c = model.config;
        let t = tokens.len();
        let d = c.hidden_size as usize;
        let eps = c.rms_norm_eps as f32;

        // 1. Token embedding: row `token` of embed_tokens for each token.   x: [t, hidden]
        let x = &mut self.s.x[..t * d];
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            embedding(row, &model.embed_tokens, tok as usize);
        }

        // 2. The decoder layers, each adding its attention and MLP outputs to the residual x.
        for (l, layer) in model.layers.iter().enumerate() {
            self.decoder_layer(l, layer, t, eps);
        }

        // 3. Final RMSNorm and the classifier: logits = norm(x) @ lm_head^T.   [t, vocab]
        let x = &mut self.s.x[..t * d];
        match which {
            Logits::All => {
                rmsnorm(x, model.norm, eps);
                matmul(all_logits, x, &model.lm_head, t);
            }
            Logits::Last => {
                let last = &mut x[(t - 1) * d..];
                rmsnorm(last, model.norm, eps);
                matmul(&mut self.s.logits, last, &model.lm_head, 1);
            }
        }
        self.pos += t;
    }

    /// `Qwen3DecoderLayer.forward`: `x = x + attn(input_layernorm(x))`,
    /// then `x = x + mlp(post_attention_layernorm(x))`.
    fn decoder_layer(&mut self, l: usize, layer: &Qwen3DecoderLayer, t: usize, eps: f32) {
        let d = self.model.config.hidden_size as usize;

        // 2a. Attention block.
        let xb = &mut self.s.xb[..t * d];
        xb.copy_from_slice(&self.s.x[..t * d]);
        rmsnorm(xb, layer.input_layernorm, eps);
        self.self_attention(l, &layer.self_attn, t, eps);
        // self.s.xb now holds the attention output.             x = x + attn
        add(&mut self.s.x[..t * d], &self.s.xb[..t * d]);

        // 2b. MLP block.
        let xb = &mut self.s.xb[..t * d];
        xb.copy_from_slice(&self.s.x[..t * d]);
        rmsnorm(xb, layer.post_attention_layernorm, eps);
        self.mlp(&layer.mlp, t);
        add(&mut self.s.x[..t * d], &self.s.xb[..t * d]); //   x = x + mlp
    }

    /// `Qwen3Attention.forward` on the normalised input in `xb` (`[t, hidden]`); leaves the output
    /// (after o_proj) in `xb`.
    fn self_attention(&mut self, l: usize, attn: &Qwen3Attention, t: usize, eps: f32) {
        let c = self.model.config;
        let (d, hd) = (c.hidden_size as usize, c.head_dim as usize);
        let (nh, nkv) = (
            c.num_attention_heads as usize,
            c.num_key_value_heads as usize,
        );
        let s = &mut self.s;
        let (xb, q, k, v) = (
            &mut s.xb[..t * d],
            &mut s.q[..t * nh * hd],
            &mut s.k[..t * nkv * hd],
            &mut s.v[..t * nkv * hd],
        );

        // i. Projections.     q: [t, n_heads, head_dim]   k, v: [t, n_kv_heads, head_dim]
        matmul(q, xb, &attn.q_proj, t);
        matmul(k, xb, &attn.k_proj, t);
        matmul(v, xb, &attn.v_proj, t);

        // ii. Per-head RMSNorm of q and k over head_dim (Qwen3's q_norm/k_norm), before RoPE.
        rmsnorm(q, attn.q_norm, eps);
        rmsnorm(k, attn.k_norm, eps);

        // iii. RoPE: rotate each head of token i by the angles of its position pos + i.
        for i in 0..t {
            rope(
                &mut q[i * nh * hd..(i + 1) * nh * hd],
                &self.rope,
                self.pos + i,
            );
            rope(
                &mut k[i * nkv * hd..(i + 1) * nkv * hd],
                &self.rope,
                self.pos + i,
            );
        }

        // iv. Append k and v to this layer's cache at positions pos .. pos + t.
        //     cache[l][kv_head][pos][head_dim] <- k[i][kv_head][head_dim]
        let ctx = self.context_len;
        let layer_k = &mut self.cache.k[l * self.cache.layer_len..(l + 1) * self.cache.layer_len];
        let layer_v = &mut self.cache.v[l * self.cache.layer_len..(l + 1) * self.cache.layer_len];
        for i in 0..t {
            for h in 0..nkv {
                let src = (i * nkv + h) * hd..(i * nkv + h + 1) * hd;
                let at = (h * ctx + self.pos + i) * hd;
                layer_k[at..at + hd].copy_from_slice(&k[src.clone()]);
                layer_v[at..at + hd].copy_from_slice(&v[src]);
            }
        }

        // v. Causal grouped-query attention over the cache.      att: [t, n_heads, head_dim]
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            context_len: ctx,
        };
        let att = &mut s.att[..t * nh * hd];
        attention(att, q, layer_k, layer_v, &mut s.scores, shape, self.pos, t);

        // vi. Output projection back to the residual width.     xb: [t, hidden]
        matmul(xb, att, &attn.o_proj, t);
    }

    /// `Qwen3MLP.forward` on the normalised input in `xb`; leaves `down(silu(gate(x)) * up(x))`
    /// in `xb`.
    fn mlp(&mut self, mlp: &Qwen3MLP, t: usize) {
        let c = self.model.config;
        let (d, ff) = (c.hidden_size as usize, c.intermediate_size as usize);
        let s = &mut self.s;
        let (xb, gate, up) = (
            &mut s.xb[..t * d],
            &mut s.gate[..t * ff],
            &mut s.up[..t * ff],
        );
        matmul(gate, xb, &mlp.gate_proj, t); //    gate: [t, intermediate]
        matmul(up, xb, &mlp.up_proj, t); //        up:   [t, intermediate]
        silu_mul(gate, up); //                     gate = silu(gate) * up
        matmul(xb, gate, &mlp.down_proj, t); //    xb:   [t, hidden]
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
            c.max_batch = 3;
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
