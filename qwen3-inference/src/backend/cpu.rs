//! [`Backend`] on the CPU: host vectors, the SIMD kernels of [`crate::kernels`], and weights
//! borrowed zero-copy from the mmapped model file (on AVX-512, q4, q6, q8, Q4_K and Q6_K
//! matrices, on AVX2 Q4_K and Q6_K ones, from the copy in the kernels' order that `Model::load`
//! makes, `kernels/dot/interleaved.rs`).
//!
//! Each op is a thin call into its kernel; the kernels assert their slice lengths, so a wrong
//! count is a panic (a bug in the forward pass), never an out-of-bounds read.

use super::host::HostMemory;
use super::{AttentionShape, Backend, DeltaNetShape, RopeTable};
use crate::format::view::TensorView;
use crate::format::{DType, Reader};
use crate::kernels;
use crate::kernels::attention::{chunk_len, store_kv, Bf16, KvElem, KvType, KV_CHUNK};
use crate::pages::HugePages;
use anyhow::{bail, Context, Result};
use std::marker::PhantomData;

/// The CPU backend. It holds nothing; `'a` is the lifetime of the mapped model file its tensors
/// borrow from.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend<'a>(PhantomData<&'a ()>);

impl CpuBackend<'_> {
    pub const fn new() -> Self {
        CpuBackend(PhantomData)
    }

    /// How a file is best opened for this backend (`ModelFile::open_for`): a GGUF's Q8_0, Q5_0
    /// and Q4_0 matrices laid out at open in the interleaved order where this CPU's kernels read
    /// q8 or q4 in it (AVX-512), so that `Model::load` need not copy them again.
    pub fn reader() -> Reader {
        use kernels::dot::{dots, interleaved};
        Reader::Interleaved {
            q8: dots().q8_interleaved.is_some() && interleaved::interleaves_q8(32),
            q4: dots().q4_layout.interleaves() && interleaved::interleaves(32),
        }
    }
}

/// The CPU backend holds nothing (its lifetime only ties it to the model's tensors), so one
/// constant serves every caller: `Session::new(CPU, &model, context_len, KvType::F32)`.
pub const CPU: &CpuBackend<'static> = &CpuBackend::new();

/// The KV cache of every layer: per layer, a list of chunks of `KV_CHUNK` positions
/// (`kernels::attention::chunk_len` says their layout: every kv head's keys in transposed tiles,
/// then every kv head's values), each chunk its own [`HugePages`] (in f32, 2 MiB, one huge page,
/// for Qwen3's shapes; docs/performance.md says what huge pages buy attention). The elements are
/// f32 or bf16, as the session asked ([`KvType`]).
///
/// The cache grows a chunk at a time and never moves what it holds, so a long conversation costs
/// no copy, and memory is committed as positions arrive, not for the whole context at once (for
/// Qwen3-0.6B at 40960 positions that would be 9 GB). Committing a chunk (the kernel zeroing its
/// pages) costs time too, so it is not left to the token that first needs it, which would commit
/// a chunk for every layer at once: each layer allocates its next chunk ahead, at its own
/// position in the second half of the current one ([`ahead_at`]), one layer every few tokens.
pub struct CpuKvCache {
    chunks: KvChunks,
    /// The session's shape; `context_len` is the most positions the cache will ever hold.
    shape: AttentionShape,
}

/// `[layer][c]`: chunk `c` of each layer, holding positions `c * KV_CHUNK .. (c + 1) * KV_CHUNK`,
/// in the cache's element type.
enum KvChunks {
    F32(Vec<Vec<HugePages<f32>>>),
    Bf16(Vec<Vec<HugePages<Bf16>>>),
}

/// The position within a chunk at which `layer` (of `layers`) allocates its next chunk: spread
/// over the chunk's second half, so a short exchange allocates nothing ahead, and the layers do
/// not all allocate at the same token.
fn ahead_at(layer: usize, layers: usize) -> usize {
    KV_CHUNK / 2 + layer * (KV_CHUNK / 2) / layers.max(1)
}

impl CpuKvCache {
    /// An empty cache of `layers` layers for `shape`, in elements of `kv`: the first token
    /// allocates the first chunks.
    fn new(layers: usize, shape: AttentionShape, kv: KvType) -> CpuKvCache {
        let chunks = match kv {
            KvType::F32 => KvChunks::F32((0..layers).map(|_| Vec::new()).collect()),
            KvType::Bf16 => KvChunks::Bf16((0..layers).map(|_| Vec::new()).collect()),
        };
        CpuKvCache { chunks, shape }
    }

    /// Makes sure layer `layer` holds chunks for positions `0..positions`, plus its next chunk
    /// once `positions` passes the layer's [`ahead_at`] in the last one.
    fn reserve(&mut self, layer: usize, positions: usize) -> Result<()> {
        match &mut self.chunks {
            KvChunks::F32(c) => reserve(c, layer, positions, self.shape),
            KvChunks::Bf16(c) => reserve(c, layer, positions, self.shape),
        }
    }

    /// Elements the cache holds now, for every layer.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        let len = chunk_len(self.shape.n_kv_heads, self.shape.head_dim);
        let chunks = match &self.chunks {
            KvChunks::F32(c) => c.iter().map(Vec::len).sum::<usize>(),
            KvChunks::Bf16(c) => c.iter().map(Vec::len).sum(),
        };
        chunks * len
    }
}

/// [`CpuKvCache::reserve`] for one element type.
fn reserve<T: KvElem>(
    layers_chunks: &mut [Vec<HugePages<T>>],
    layer: usize,
    positions: usize,
    shape: AttentionShape,
) -> Result<()> {
    let context = shape.context_len;
    if positions > context {
        bail!("{positions} positions do not fit a KV cache of {context} (a bug in the caller)");
    }
    let len = chunk_len(shape.n_kv_heads, shape.head_dim);
    let layers = layers_chunks.len();
    let chunks = &mut layers_chunks[layer];
    let mut want = positions.div_ceil(KV_CHUNK);
    let last = positions.saturating_sub(1);
    if last % KV_CHUNK >= ahead_at(layer, layers) && want * KV_CHUNK < context {
        want += 1;
    }
    while chunks.len() < want {
        let mut chunk = HugePages::<T>::zeroed(len).with_context(|| {
            format!(
                "cannot allocate {:.1} MiB for the KV cache",
                (len * std::mem::size_of::<T>()) as f64 / 1048576.0
            )
        })?;
        // Commit it now: touching its pages here, not at the token that first needs it, is what
        // spreads the cost (see the type's comment). The writes are what commit.
        chunk.fill(T::zeroed());
        chunks.push(chunk);
    }
    Ok(())
}

/// `n_tok` tokens' keys and values (`[n_tok, n_kv_heads, head_dim]`) into positions `pos0 ..` of
/// one layer's chunks: token i's kv head h to position `pos0 + i` of the chunk that holds it, the
/// value to its row, the key to its tile's column.
fn store_tokens<T: KvElem>(
    chunks: &mut [HugePages<T>],
    shape: AttentionShape,
    k: &[f32],
    v: &[f32],
    n_tok: usize,
    pos0: usize,
) {
    let (nkv, hd) = (shape.n_kv_heads, shape.head_dim);
    for i in 0..n_tok {
        let pos = pos0 + i;
        for h in 0..nkv {
            let src = (i * nkv + h) * hd..(i * nkv + h + 1) * hd;
            store_kv(
                &mut chunks[pos / KV_CHUNK],
                h,
                pos,
                &k[src.clone()],
                &v[src],
            );
        }
    }
}

fn norm_weight<'t>(w: &TensorView<'t>) -> Result<&'t [f32]> {
    match w.data.dtype() {
        DType::F32 => Ok(w.data.f32()),
        _ => bail!("{} is not stored as f32", w.name),
    }
}

/// Its buffers are host vectors: [`host`](super::host)'s memory.
impl HostMemory for CpuBackend<'_> {}

impl<'a> Backend for CpuBackend<'a> {
    type Tensor = TensorView<'a>;
    type Rope = RopeTable;
    type KvCache = CpuKvCache;

    fn rope_table(&self, table: RopeTable) -> Result<RopeTable> {
        Ok(table)
    }

    fn kv_cache(
        &self,
        layers: usize,
        s: AttentionShape,
        _max_batch: usize,
        kv: KvType,
    ) -> Result<CpuKvCache> {
        Ok(CpuKvCache::new(layers, s, kv))
    }

    fn embed(
        &self,
        x: &mut Vec<f32>,
        table: &TensorView<'a>,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<()> {
        for (row, &tok) in x.chunks_exact_mut(hidden).zip(tokens) {
            kernels::embedding(row, table, tok as usize);
        }
        Ok(())
    }

    fn rmsnorm(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        w: &TensorView<'a>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let w = norm_weight(w)?;
        kernels::rmsnorm(&mut out[..rows * n], &x[..rows * n], w, eps);
        Ok(())
    }

    fn matmul(
        &self,
        y: &mut Vec<f32>,
        w: &TensorView<'a>,
        x: &Vec<f32>,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        kernels::matmul(&mut y[..n_tok * rows], &x[..n_tok * cols], w, n_tok);
        Ok(())
    }

    fn matmuls<const N: usize>(
        &self,
        ys: [&mut Vec<f32>; N],
        ws: [&TensorView<'a>; N],
        x: &Vec<f32>,
        n_tok: usize,
        rows: [usize; N],
        cols: usize,
    ) -> Result<()> {
        let mut ys = ys.into_iter().zip(rows);
        let outs: [&mut [f32]; N] = std::array::from_fn(|_| {
            let (y, r) = ys.next().expect("N outputs");
            &mut y[..n_tok * r]
        });
        kernels::matmuls(outs, &x[..n_tok * cols], ws, n_tok);
        Ok(())
    }

    fn add_bias(
        &self,
        x: &mut Vec<f32>,
        bias: &TensorView<'a>,
        n_tok: usize,
        n: usize,
    ) -> Result<()> {
        let bias = norm_weight(bias)?;
        for row in x[..n_tok * n].chunks_exact_mut(n) {
            kernels::add(row, &bias[..n]);
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        table: &RopeTable,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        let width = n_heads * head_dim;
        for (i, token) in x[..n_tok * width].chunks_exact_mut(width).enumerate() {
            kernels::rope(token, table, pos0 + i, head_dim);
        }
        Ok(())
    }

    fn rope_mrope(
        &self,
        x: &mut Vec<f32>,
        table: &RopeTable,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        positions: &[[u32; 3]],
        components: &[u8],
    ) -> Result<()> {
        super::host::check_mrope(table, n_tok, positions, components)?;
        let width = n_heads * head_dim;
        for (token, &thw) in x[..n_tok * width].chunks_exact_mut(width).zip(positions) {
            kernels::rope_mrope(token, table, thw, components, head_dim);
        }
        Ok(())
    }

    const TAKES_IMAGES: bool = true;

    fn store_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        cache.reserve(layer, pos0 + n_tok)?;
        let shape = cache.shape;
        match &mut cache.chunks {
            KvChunks::F32(c) => store_tokens(&mut c[layer], shape, k, v, n_tok, pos0),
            KvChunks::Bf16(c) => store_tokens(&mut c[layer], shape, k, v, n_tok, pos0),
        }
        Ok(())
    }

    fn attention(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        cache: &mut CpuKvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let s = cache.shape;
        let n = n_tok * s.n_heads * s.head_dim;
        let (out, q) = (&mut out[..n], &q[..n]);
        match &cache.chunks {
            KvChunks::F32(c) => kernels::attention(out, q, &c[layer], s, pos0, n_tok),
            KvChunks::Bf16(c) => kernels::attention(out, q, &c[layer], s, pos0, n_tok),
        }
        Ok(())
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        kernels::silu_mul(&mut gate[..n], &up[..n]);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        kernels::add(&mut x[..n], &y[..n]);
        Ok(())
    }

    fn check_layers(&self, _config: &crate::format::ModelConfig) -> Result<()> {
        // Every layer kind: Qwen3.5's through `kernels/delta_net.rs`.
        Ok(())
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, n: usize) -> Result<()> {
        super::hybrid_steps::sigmoid_mul(&super::hybrid_steps::FAST, x, gate, n)
    }

    fn causal_conv_silu(
        &self,
        x: &mut Vec<f32>,
        window: &mut Vec<f32>,
        w: &TensorView<'a>,
        rows: std::ops::Range<usize>,
        shape: DeltaNetShape,
    ) -> Result<()> {
        super::hybrid_steps::causal_conv_silu(
            &super::hybrid_steps::FAST,
            x,
            window,
            norm_weight(w)?,
            rows,
            shape,
        )
    }

    fn gated_delta_rule(
        &self,
        o: &mut Vec<f32>,
        qkv: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_log: &TensorView<'a>,
        dt_bias: &TensorView<'a>,
        state: &mut Vec<f32>,
        rows: std::ops::Range<usize>,
        pos0: usize,
        shape: DeltaNetShape,
    ) -> Result<()> {
        let (a_log, dt_bias) = (norm_weight(a_log)?, norm_weight(dt_bias)?);
        super::hybrid_steps::gated_delta_rule(
            &super::hybrid_steps::FAST,
            o,
            qkv,
            a,
            b,
            a_log,
            dt_bias,
            state,
            rows,
            pos0,
            shape,
        )
    }

    fn gated_rmsnorm(
        &self,
        o: &mut Vec<f32>,
        z: &Vec<f32>,
        w: &TensorView<'a>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        super::hybrid_steps::gated_rmsnorm(
            &super::hybrid_steps::FAST,
            o,
            z,
            norm_weight(w)?,
            rows,
            n,
            eps,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Memory;
    use crate::kernels::attention::KEY_TILE;

    /// Logits are read in place: no copy, and the staging buffer is never grown.
    #[test]
    fn read_borrows_the_buffer_itself() {
        let b = CpuBackend::new();
        let x = vec![1.0, 2.0, 3.0];
        let mut staging = Vec::new();
        let got = b.read(&x, 2, &mut staging).unwrap();
        assert_eq!(got, &[1.0, 2.0]);
        assert!(std::ptr::eq(got.as_ptr(), x.as_ptr()));
        assert!(staging.is_empty());
    }

    /// Chunks of `layer` the cache holds.
    fn chunks_of(cache: &CpuKvCache, layer: usize) -> usize {
        match &cache.chunks {
            KvChunks::F32(c) => c[layer].len(),
            KvChunks::Bf16(c) => c[layer].len(),
        }
    }

    /// Where chunk `c` of `layer` lies in memory.
    fn chunk_at(cache: &CpuKvCache, layer: usize, c: usize) -> *const u8 {
        match &cache.chunks {
            KvChunks::F32(ch) => ch[layer][c].as_ptr() as *const u8,
            KvChunks::Bf16(ch) => ch[layer][c].as_ptr() as *const u8,
        }
    }

    /// Element `i` of chunk `c` of `layer`, as an f32.
    fn element(cache: &CpuKvCache, layer: usize, c: usize, i: usize) -> f32 {
        match &cache.chunks {
            KvChunks::F32(ch) => ch[layer][c][i],
            KvChunks::Bf16(ch) => ch[layer][c][i].to_f32(),
        }
    }

    /// `store_kv` writes token i's kv head h at position `pos0 + i`, in the chunk that holds it,
    /// in the layout attention reads: per head, keys in transposed tiles, then values key-major;
    /// in f32 and in bf16 (the test's values are small integers, exact in both).
    #[test]
    fn store_kv_writes_into_the_chunk_of_each_position() {
        for kv in [KvType::F32, KvType::Bf16] {
            store_kv_writes(kv);
        }
    }

    fn store_kv_writes(kv: KvType) {
        let b = CpuBackend::new();
        let shape = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 3,
            context_len: 2 * KV_CHUNK,
        };
        let mut cache = b.kv_cache(2, shape, 2, kv).unwrap();
        // Two tokens, [2 tokens, 2 kv heads, 3]: value = 100 * token + 10 * head + i, at the
        // last position of chunk 0 and the first of chunk 1.
        let k: Vec<f32> = (0..12)
            .map(|j| (100 * (j / 6) + 10 * (j / 3 % 2) + j % 3) as f32)
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        let pos0 = KV_CHUNK - 1;
        b.store_kv(&mut cache, 1, &k, &v, 2, pos0).unwrap();
        assert_eq!(chunks_of(&cache, 0), 0);
        assert_eq!(chunks_of(&cache, 1), 2);
        let head_len = KV_CHUNK * 3;
        for (token, head) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let (pos, want) = (pos0 + token, (100 * token + 10 * head) as f32);
            let (c, j) = (pos / KV_CHUNK, pos % KV_CHUNK);
            // Both heads' keys, then both heads' values.
            let key = |i: usize| {
                let tile = head * head_len + (j / KEY_TILE) * 3 * KEY_TILE;
                element(&cache, 1, c, tile + i * KEY_TILE + j % KEY_TILE)
            };
            let value = |i: usize| element(&cache, 1, c, (2 + head) * head_len + j * 3 + i);
            for i in 0..3 {
                assert_eq!(key(i), want + i as f32, "{kv:?}");
                assert_eq!(value(i), -want - i as f32, "{kv:?}");
            }
        }
    }

    /// The cache grows a chunk at a time and never moves one: each layer allocates its next chunk
    /// at its own position (`ahead_at`), never past the context. Attention over a cache filled by
    /// one prefill and over one filled a token at a time gives the same bits at every position,
    /// across chunk ends.
    #[test]
    fn the_cache_grows_by_chunks_allocated_ahead() {
        for kv in [KvType::F32, KvType::Bf16] {
            cache_grows(kv);
        }
    }

    fn cache_grows(kv_type: KvType) {
        let b = CpuBackend::new();
        let layers = 3;
        let shape = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            context_len: 2 * KV_CHUNK + 10,
        };
        let width = 2 * 8;
        let value = |pos: usize, layer: usize, j: usize| {
            ((pos * 31 + layer * 7 + j * 3) % 17) as f32 * 0.25 - 2.0
        };
        let kv = |pos0: usize, n_tok: usize, layer: usize| {
            let k: Vec<f32> = (0..n_tok * width)
                .map(|j| value(pos0 + j / width, layer, j % width))
                .collect();
            let v: Vec<f32> = k.iter().map(|x| x * 0.5 + 1.0).collect();
            (k, v)
        };
        let q: Vec<f32> = (0..4 * 8).map(|j| value(j, 5, j)).collect();
        let attend = |cache: &mut CpuKvCache, layer: usize, pos: usize| {
            let mut out = vec![0.0; q.len()];
            b.attention(&mut out, &q, cache, layer, 1, pos).unwrap();
            out
        };

        let mut stepped = CpuKvCache::new(layers, shape, kv_type);
        let mut first_chunk = Vec::new();
        for pos in 0..shape.context_len {
            for layer in 0..layers {
                let (k, v) = kv(pos, 1, layer);
                b.store_kv(&mut stepped, layer, &k, &v, 1, pos).unwrap();
                // Chunks for every position so far, and the next one once past ahead_at.
                let ahead = pos % KV_CHUNK >= ahead_at(layer, layers)
                    && (pos / KV_CHUNK + 1) * KV_CHUNK < shape.context_len;
                assert_eq!(
                    chunks_of(&stepped, layer),
                    pos / KV_CHUNK + 1 + ahead as usize,
                    "layer {layer} at position {pos}"
                );
            }
            if pos == 0 {
                first_chunk = (0..layers).map(|l| chunk_at(&stepped, l, 0)).collect();
            }
        }
        // Three chunks per layer hold the context; none moved.
        assert_eq!(stepped.allocated(), layers * 3 * chunk_len(2, 8));
        let now: Vec<_> = (0..layers).map(|l| chunk_at(&stepped, l, 0)).collect();
        assert_eq!(now, first_chunk);
        // The layers allocated their second chunk at different positions.
        assert!(ahead_at(0, layers) < ahead_at(1, layers));
        assert!(ahead_at(1, layers) < ahead_at(2, layers));
        assert!(ahead_at(layers - 1, layers) < KV_CHUNK);

        // One prefill of 300 positions (across the first chunk's end), then one at a time.
        let mut prefilled = CpuKvCache::new(layers, shape, kv_type);
        for layer in 0..layers {
            let (k, v) = kv(0, 300, layer);
            b.store_kv(&mut prefilled, layer, &k, &v, 300, 0).unwrap();
        }
        for pos in 300..shape.context_len {
            for layer in 0..layers {
                let (k, v) = kv(pos, 1, layer);
                b.store_kv(&mut prefilled, layer, &k, &v, 1, pos).unwrap();
            }
        }
        for pos in [0, 1, KV_CHUNK - 1, KV_CHUNK, 299, 300, 2 * KV_CHUNK + 9] {
            for layer in 0..layers {
                assert_eq!(
                    attend(&mut stepped, layer, pos),
                    attend(&mut prefilled, layer, pos),
                    "layer {layer} at position {pos}"
                );
            }
        }
        assert!(b
            .store_kv(
                &mut stepped,
                0,
                &vec![0.0; width],
                &vec![0.0; width],
                1,
                shape.context_len
            )
            .is_err());
    }
}
