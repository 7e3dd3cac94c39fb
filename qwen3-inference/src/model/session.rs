//! One running sequence: its KV cache and position, over the [`Forward`] pass (the CPU's SIMD
//! kernels, or a GPU's).
//!
//! `Session::forward(tokens)` runs a batch of `t` tokens through the model at positions
//! `pos .. pos + t` and returns the logits of the last one. The prompt goes in as one call
//! (prefill: every weight matrix is read once for all `t` tokens), then each sampled token as a
//! call with `t = 1` (decode). Buffers are allocated once, in [`Session::new`]; a decode
//! step allocates nothing. Many sequences at once are the serving engine's ([`crate::engine`]),
//! over the same [`Forward`].

use super::forward::{Cache, Forward, RowInputs, Segment, MAX_BATCH};
use super::Model;
use crate::backend::{Backend, KvType};
use anyhow::{bail, Result};

/// A sequence being run through a [`Model`] on backend `B`: owns the KV cache; the forward pass
/// owns the scratch buffers.
pub struct Session<'m, B: Backend> {
    fwd: Forward<'m, B>,
    /// Tokens per forward chunk (at most the step's rows).
    batch: usize,
    /// Tokens already in the KV cache; the next token goes to this position.
    pos: usize,
    cache: Cache<B>,
    /// After a prompt with images (M-RoPE): the rotary position of the token at cache position
    /// `p` is `p + rope_offset` (transformers' `rope_deltas`: an image moves the text after it
    /// by its longer side, not by its token count, so the offset is negative). 0 for text.
    rope_offset: i64,
    /// Those positions, a triple per row of a chunk (reused: decode allocates nothing).
    positions: Vec<[u32; 3]>,
    /// The cache positions of the last call with images (`forward_with`), where the offset was
    /// set: truncating before it forgets the offset, into it is refused.
    images_at: Option<std::ops::Range<usize>>,
}

impl<'m, B: Backend> Session<'m, B> {
    /// A session on `backend` with room for `context_len` tokens (prompt and generated
    /// together), its KV cache holding keys and values as `kv` says (f32 is HF's float32).
    /// `model` holds the backend's tensors (`Model::load`, or `Model::load_with` for a device).
    pub fn new(
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        context_len: usize,
        kv: KvType,
    ) -> Result<Self> {
        let fwd = Forward::new(backend, model, context_len, MAX_BATCH, 1, kv)?;
        Ok(Session {
            batch: fwd.max_batch(),
            pos: 0,
            cache: fwd.new_cache()?,
            rope_offset: 0,
            positions: Vec::new(),
            images_at: None,
            fwd,
        })
    }

    /// See [`Forward::record_routes`].
    pub fn record_routes(&mut self, on: bool) -> Vec<u32> {
        self.fwd.record_routes(on)
    }

    /// Tokens in the KV cache (the position the next token gets).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Positions this session holds.
    pub fn context_len(&self) -> usize {
        self.fwd.context_len()
    }

    pub fn model(&self) -> &'m Model<'m, B::Tensor> {
        self.fwd.model()
    }

    pub fn backend(&self) -> &'m B {
        self.fwd.backend()
    }

    /// What the KV cache stores keys and values as.
    pub fn kv_type(&self) -> KvType {
        self.fwd.kv_type()
    }

    /// Bytes held by the KV cache.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.model()
            .kv_cache_bytes(self.context_len(), self.kv_type())
    }

    /// Runs later prompts in chunks of at most `n` tokens (1 ..= the batch the buffers were
    /// sized for, [`MAX_BATCH`] or the context if shorter). For tests: chunked prefill must give
    /// the same logits as one pass.
    pub fn set_max_batch(&mut self, n: usize) -> Result<()> {
        let max = self.fwd.max_batch();
        if n == 0 || n > max {
            bail!("batch of {n} tokens: must be 1 ..= {max}");
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
        if let Some(at) = self.images_at.clone().filter(|at| pos < at.end) {
            if pos > at.start {
                bail!(
                    "cannot truncate to position {pos}: inside the prompt with images at {} .. {}",
                    at.start,
                    at.end
                );
            }
            // Before the images: the text there is at its own positions again.
            self.rope_offset = 0;
            self.images_at = None;
        }
        self.pos = pos;
        Ok(())
    }

    /// Runs `tokens` at positions `pos .. pos + tokens.len()` and returns the last token's logits
    /// (`[vocab]`). Errors (nothing changes) if a token id is outside the vocabulary or the tokens
    /// do not fit in the context.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.forward_with(tokens, RowInputs::default())
    }

    /// [`Session::forward`] of a prompt with images: `inputs` gives every token's M-RoPE
    /// positions and the images' vectors at their rows (rows counted from this call's first
    /// token; `vision::positions`). The tokens after it go on from the largest of its positions
    /// plus one, as transformers' `rope_deltas` has them.
    pub fn forward_with(&mut self, tokens: &[u32], inputs: RowInputs) -> Result<&[f32]> {
        self.check(tokens, inputs)?;
        let n_chunks = tokens.len().div_ceil(self.batch);
        for (i, chunk) in tokens.chunks(self.batch).enumerate() {
            let seg = Segment {
                seq: 0,
                pos: self.pos,
                len: chunk.len(),
                logits: usize::from(i + 1 == n_chunks),
            };
            let start = i * self.batch;
            self.fill_positions(inputs, start, chunk.len());
            let (runs, deepstack) = chunk_runs(inputs, start, chunk.len(), self.hidden());
            let rows = chunk_inputs(&self.positions, &runs, &deepstack);
            let caches = std::slice::from_mut(&mut self.cache);
            self.fwd.step_with(chunk, &[seg], caches, rows)?;
            self.pos += chunk.len();
        }
        self.after(inputs);
        // The last chunk's logits, read back once.
        self.fwd.logits(1)
    }

    /// Like [`Session::forward`] but returns the logits of every token, `[tokens.len(), vocab]`
    /// (allocated per call: for tests and evaluation, not the generation loop).
    pub fn forward_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_all_logits_with(tokens, RowInputs::default())
    }

    /// [`Session::forward_all_logits`] of a prompt with images (see [`Session::forward_with`]).
    pub fn forward_all_logits_with(
        &mut self,
        tokens: &[u32],
        inputs: RowInputs,
    ) -> Result<Vec<f32>> {
        self.check(tokens, inputs)?;
        let vocab = self.fwd.out_width();
        let b = self.fwd.backend();
        let mut chunk_logits = b.alloc(self.batch * vocab)?;
        let mut staging = Vec::new();
        let mut all = Vec::with_capacity(tokens.len() * vocab);
        for (i, chunk) in tokens.chunks(self.batch).enumerate() {
            let seg = Segment {
                seq: 0,
                pos: self.pos,
                len: chunk.len(),
                logits: 0,
            };
            let start = i * self.batch;
            self.fill_positions(inputs, start, chunk.len());
            let (runs, deepstack) = chunk_runs(inputs, start, chunk.len(), self.hidden());
            let rows = chunk_inputs(&self.positions, &runs, &deepstack);
            self.fwd
                .step_all_logits(chunk, seg, &mut self.cache, &mut chunk_logits, rows)?;
            self.pos += chunk.len();
            all.extend_from_slice(b.read(&chunk_logits, chunk.len() * vocab, &mut staging)?);
        }
        self.after(inputs);
        Ok(all)
    }

    /// Fills `positions` for the call's rows `start .. start + len`: the call's own M-RoPE
    /// positions, or after an image each row's cache position plus the offset; nothing for text.
    fn fill_positions(&mut self, inputs: RowInputs, start: usize, len: usize) {
        self.positions.clear();
        match inputs.positions {
            Some(p) => self.positions.extend_from_slice(&p[start..start + len]),
            None if self.rope_offset != 0 => {
                let first = self.pos as i64 + self.rope_offset;
                self.positions
                    .extend((0..len as i64).map(|i| [(first + i) as u32; 3]));
            }
            None => {}
        }
    }

    fn hidden(&self) -> usize {
        self.model().config.hidden_size as usize
    }

    /// After a call with M-RoPE positions, the tokens after it go on from the largest plus one
    /// (`self.pos` is already past the call).
    fn after(&mut self, inputs: RowInputs) {
        if let Some(p) = inputs.positions {
            let next = p.iter().flatten().max().map_or(0, |&m| m as i64 + 1);
            self.rope_offset = next - self.pos as i64;
            self.images_at = Some(self.pos - p.len()..self.pos);
        }
    }

    /// The whole call's checks, before any chunk runs (each chunk is checked again).
    fn check(&self, tokens: &[u32], inputs: RowInputs) -> Result<()> {
        if tokens.is_empty() {
            bail!("no tokens to run");
        }
        if let Some(p) = inputs.positions {
            if p.len() != tokens.len() {
                bail!("{} M-RoPE positions for {} tokens", p.len(), tokens.len());
            }
        }
        let d = self.hidden();
        let runs = inputs.embeddings.iter().map(|&(first, v)| (first, v));
        let deepstack = inputs.deepstack.iter().map(|&(_, first, v)| (first, v));
        for (first, values) in runs.chain(deepstack) {
            if values.len() % d != 0 || first + values.len() / d > tokens.len() {
                bail!(
                    "{} input values from row {first} are not whole rows of {d} within the {} tokens",
                    values.len(),
                    tokens.len()
                );
            }
        }
        let vocab = self.model().config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        if self.pos + tokens.len() > self.context_len() {
            bail!(
                "{} tokens do not fit: {} of {} context positions are used",
                tokens.len(),
                self.pos,
                self.context_len()
            );
        }
        Ok(())
    }
}

/// A chunk's [`RowInputs`]: the positions [`Session::fill_positions`] left (none: text), and its
/// runs.
fn chunk_inputs<'a>(
    positions: &'a [[u32; 3]],
    runs: &'a [(usize, &'a [f32])],
    deepstack: &'a [(usize, usize, &'a [f32])],
) -> RowInputs<'a> {
    RowInputs {
        positions: (!positions.is_empty()).then_some(positions),
        embeddings: runs,
        deepstack,
    }
}

/// The parts of `inputs`' runs of image rows (and of their DeepStack features) that fall in the
/// call's rows `start .. start + len`, counted from `start`.
#[allow(clippy::type_complexity)]
fn chunk_runs<'a>(
    inputs: RowInputs<'a>,
    start: usize,
    len: usize,
    d: usize,
) -> (Vec<(usize, &'a [f32])>, Vec<(usize, usize, &'a [f32])>) {
    // The rows `first ..` of `values` within the chunk: (row in the chunk, its values).
    let clip = |first: usize, values: &'a [f32]| {
        let (lo, hi) = (
            first.max(start),
            (first + values.len() / d).min(start + len),
        );
        (lo < hi).then(|| (lo - start, &values[(lo - first) * d..(hi - first) * d]))
    };
    let runs = inputs
        .embeddings
        .iter()
        .filter_map(|&(first, values)| clip(first, values))
        .collect();
    let deepstack = inputs
        .deepstack
        .iter()
        .filter_map(|&(l, first, values)| clip(first, values).map(|(row, v)| (l, row, v)))
        .collect();
    (runs, deepstack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CPU;
    use crate::format::{DType, ModelFile};
    use crate::testing::model::write_random;
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
        for dt in [DType::F32, DType::Bf16, DType::Q8, DType::Q4, DType::Q6] {
            let p = tmp(dt.name());
            write_random(&p, dt);
            let file = ModelFile::open(&p).unwrap();
            let model = Model::load(&file).unwrap();
            let vocab = 40;
            let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % vocab).collect();

            let mut a = Session::new(CPU, &model, 32, KvType::F32).unwrap();
            let all = a.forward_all_logits(&tokens).unwrap();
            assert_eq!(a.pos(), 20);
            assert!(all.iter().all(|v| v.is_finite()));

            let mut b = Session::new(CPU, &model, 32, KvType::F32).unwrap();
            for (i, &tok) in tokens.iter().enumerate() {
                let logits = b.forward(&[tok]).unwrap();
                let want = &all[i * vocab as usize..(i + 1) * vocab as usize];
                assert!(max_diff(logits, want) < 1e-5, "{dt} pos {i}");
            }

            let mut c = Session::new(CPU, &model, 32, KvType::F32).unwrap();
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
            let mut d = Session::new(CPU, &model, 32, KvType::F32).unwrap();
            let other = d.forward(&tokens[1..]).unwrap();
            assert!(max_diff(other, &all[19 * vocab as usize..]) > 1e-3);
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }

    /// A q4 model whose rows are wide enough for the SIMD kernels (an odd number of whole
    /// chunks of 128 and a tail of groups; on AVX-512 a whole block of 16 groups and a short one;
    /// the embedding and sensitive layers q6): a 20-token prompt in one pass gives every position
    /// the very bits that decoding the tokens one by one and a prompt cut in pieces of 6 give.
    #[test]
    fn q4_prompt_in_one_pass_gives_decodes_bits() {
        let mut c = crate::testing::model::config(DType::Q4);
        (c.group_size, c.hidden_size, c.intermediate_size) = (32, 416, 640);
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim) = (4, 2, 32);
        let p = tmp("q4-wide");
        crate::testing::model::write_random_config(&p, &c);
        let file = ModelFile::open(&p).unwrap();
        let model = Model::load(&file).unwrap();
        let vocab = c.vocab_size as usize;
        let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % vocab as u32).collect();
        let mut a = Session::new(CPU, &model, 32, KvType::F32).unwrap();
        let all = a.forward_all_logits(&tokens).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut b = Session::new(CPU, &model, 32, KvType::F32).unwrap();
        for (i, &tok) in tokens.iter().enumerate() {
            let logits = b.forward(&[tok]).unwrap();
            assert_eq!(
                bits(logits),
                bits(&all[i * vocab..(i + 1) * vocab]),
                "pos {i}"
            );
        }
        let mut d = Session::new(CPU, &model, 32, KvType::F32).unwrap();
        d.set_max_batch(6).unwrap();
        let last = d.forward(&tokens).unwrap();
        assert_eq!(bits(last), bits(&all[19 * vocab..]), "in pieces of 6");
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let p = tmp("bad");
        write_random(&p, DType::F32);
        let file = ModelFile::open(&p).unwrap();
        let model = Model::load(&file).unwrap();
        assert!(Session::new(CPU, &model, 0, KvType::F32).is_err());
        let e = Session::new(CPU, &model, 65, KvType::F32)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("larger than the model supports"), "{e}");
        let mut s = Session::new(CPU, &model, 4, KvType::F32).unwrap();
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
