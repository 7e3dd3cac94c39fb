//! [`Backend`] on the CPU: host vectors, the SIMD kernels of [`crate::kernels`], and weights
//! borrowed zero-copy from the mmapped model file.
//!
//! Each op is a thin call into its kernel; the kernels assert their slice lengths, so a wrong
//! count is a panic (a bug in the forward pass), never an out-of-bounds read.

use super::{AttentionShape, Backend, RopeTable};
use crate::format::reader::{TensorData, TensorView};
use crate::kernels;
use crate::kernels::attention::{keys_len, store_key};
use crate::pages::HugePageF32s;
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
}

/// The KV cache of every layer, keys and values apart, each contiguous per kv head so attention
/// for one head streams one block of memory.
/// - values: `[layer][kv_head][pos][head_dim]`
/// - keys: `[layer][kv_head]` blocks of `kernels::attention::keys_len` floats, in tiles of
///   `KEY_TILE` positions stored transposed (`[tile][head_dim][KEY_TILE]`; why: `KEY_TILE`).
///
/// The blocks are laid out for `capacity` positions, which starts at [`INITIAL_KV_CAPACITY`] and
/// doubles (up to the session's context) when a token would not fit. Why not lay out the whole
/// context at once: the cache lives in huge pages ([`HugePageF32s`]; see docs/performance.md for
/// what they buy attention), and the first token touches every head's block, so each block would
/// take a 2 MiB page at once: 896 MiB for Qwen3-0.6B at 4096 positions before it has said a word.
/// Growing costs one copy of the cache per doubling.
pub struct CpuKvCache {
    k: HugePageF32s,
    v: HugePageF32s,
    layers: usize,
    /// Positions the blocks are laid out for: `capacity <= shape.context_len`.
    capacity: usize,
    /// The session's shape; `context_len` is the most positions the cache will ever hold.
    shape: AttentionShape,
}

/// Positions a CPU KV cache is first laid out for (or the context, if shorter): small, so a short
/// exchange commits little memory (Qwen3-0.6B: 28 MiB for 128 positions). Doubling from here
/// copies less in all than the final cache holds.
pub const INITIAL_KV_CAPACITY: usize = 128;

impl CpuKvCache {
    /// A zeroed cache of `layers` layers for `shape`, laid out for `capacity` positions at first.
    fn new(layers: usize, shape: AttentionShape, capacity: usize) -> Result<CpuKvCache> {
        let capacity = capacity.clamp(1, shape.context_len.max(1));
        let layout = AttentionShape {
            context_len: capacity,
            ..shape
        };
        let k_len = layers * shape.n_kv_heads * keys_len(&layout);
        let v_len = layers * shape.n_kv_heads * capacity * shape.head_dim;
        let alloc = |len| {
            HugePageF32s::zeroed(len).with_context(|| {
                format!("cannot allocate a KV cache for {capacity} positions ({len} floats)")
            })
        };
        Ok(CpuKvCache {
            k: alloc(k_len)?,
            v: alloc(v_len)?,
            layers,
            capacity,
            shape,
        })
    }

    /// The shape the blocks are laid out for now: the session's, with `capacity` positions.
    fn layout(&self) -> AttentionShape {
        AttentionShape {
            context_len: self.capacity,
            ..self.shape
        }
    }

    /// Floats of one kv head's keys, and of its values, in the current layout.
    fn head_lens(&self) -> (usize, usize) {
        let s = self.layout();
        (keys_len(&s), s.context_len * s.head_dim)
    }

    /// Layer `layer`'s keys and values: `[kv_head]` blocks of `head_lens()` floats.
    fn layer(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        let (kh, vh) = self.head_lens();
        let n = self.shape.n_kv_heads;
        (
            &mut self.k[layer * n * kh..][..n * kh],
            &mut self.v[layer * n * vh..][..n * vh],
        )
    }

    /// Makes room for positions `0..positions`, doubling the capacity until they fit. Each head's
    /// old block is a prefix of its new one (keys' tiles and values' positions are in position
    /// order), so growing copies every block to the start of its new place.
    fn reserve(&mut self, positions: usize) -> Result<()> {
        if positions <= self.capacity {
            return Ok(());
        }
        if positions > self.shape.context_len {
            bail!(
                "{positions} positions do not fit a KV cache of {} (a bug in the caller)",
                self.shape.context_len
            );
        }
        let mut capacity = self.capacity;
        while capacity < positions {
            capacity = capacity.saturating_mul(2);
        }
        let mut grown = CpuKvCache::new(self.layers, self.shape, capacity)?;
        let (kh, vh) = self.head_lens();
        let (new_kh, new_vh) = grown.head_lens();
        let heads = self.layers * self.shape.n_kv_heads;
        for h in 0..heads {
            grown.k[h * new_kh..][..kh].copy_from_slice(&self.k[h * kh..][..kh]);
            grown.v[h * new_vh..][..vh].copy_from_slice(&self.v[h * vh..][..vh]);
        }
        *self = grown;
        Ok(())
    }
}

fn norm_weight<'t>(w: &TensorView<'t>) -> Result<&'t [f32]> {
    match w.data {
        TensorData::F32(v) => Ok(v),
        _ => bail!("{} is not stored as f32", w.name),
    }
}

impl<'a> Backend for CpuBackend<'a> {
    type Tensor = TensorView<'a>;
    type Buf = Vec<f32>;
    type Rope = RopeTable;
    type KvCache = CpuKvCache;

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn rope_table(&self, table: RopeTable) -> Result<RopeTable> {
        Ok(table)
    }

    fn kv_cache(&self, layers: usize, s: AttentionShape, _max_batch: usize) -> Result<CpuKvCache> {
        CpuKvCache::new(layers, s, INITIAL_KV_CAPACITY)
    }

    fn copy(
        &self,
        dst: &mut Vec<f32>,
        dst_offset: usize,
        src: &Vec<f32>,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
        Ok(())
    }

    fn read<'s>(
        &self,
        x: &'s Vec<f32>,
        len: usize,
        _staging: &'s mut Vec<f32>,
    ) -> Result<&'s [f32]> {
        Ok(&x[..len])
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
            kernels::rope(token, table, pos0 + i);
        }
        Ok(())
    }

    fn store_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        // values[layer][kv_head][pos0 + i][..] <- v[i][kv_head][..], and the same key into its
        // tile's column.
        cache.reserve(pos0 + n_tok)?;
        let (nkv, hd) = (cache.shape.n_kv_heads, cache.shape.head_dim);
        let (k_head_len, v_head_len) = cache.head_lens();
        let (layer_k, layer_v) = cache.layer(layer);
        for i in 0..n_tok {
            for h in 0..nkv {
                let src = (i * nkv + h) * hd..(i * nkv + h + 1) * hd;
                let head_k = &mut layer_k[h * k_head_len..(h + 1) * k_head_len];
                store_key(head_k, pos0 + i, &k[src.clone()]);
                let at = h * v_head_len + (pos0 + i) * hd;
                layer_v[at..at + hd].copy_from_slice(&v[src]);
            }
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
        // The kernel sees the blocks as laid out now: a context of `capacity` positions.
        let s = cache.layout();
        let n = n_tok * s.n_heads * s.head_dim;
        let (keys, values) = cache.layer(layer);
        kernels::attention(&mut out[..n], &q[..n], keys, values, s, pos0, n_tok);
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
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// `store_kv` writes token i's kv head h at position `pos0 + i` of `[layer][h]`, in the layouts
    /// attention reads: values key-major, keys in transposed tiles.
    #[test]
    fn store_kv_layout_is_head_major() {
        let b = CpuBackend::new();
        let shape = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 3,
            context_len: 5,
        };
        let mut cache = b.kv_cache(2, shape, 2).unwrap();
        // Two tokens, [2 tokens, 2 kv heads, 3]: value = 100 * token + 10 * head + i.
        let k: Vec<f32> = (0..12)
            .map(|j| (100 * (j / 6) + 10 * (j / 3 % 2) + j % 3) as f32)
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        b.store_kv(&mut cache, 1, &k, &v, 2, 3).unwrap();
        // Five positions fit one tile of 16: a kv head's keys are 16 * 3 floats.
        assert_eq!(cache.head_lens(), (KEY_TILE * 3, 5 * 3));
        assert!(cache.layer(0).0.iter().all(|&x| x == 0.0));
        let (keys, values) = cache.layer(1);
        for (token, head) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let pos = 3 + token;
            let want = (100 * token + 10 * head) as f32;
            for i in 0..3 {
                assert_eq!(
                    keys[head * KEY_TILE * 3 + i * KEY_TILE + pos],
                    want + i as f32
                );
            }
            let at = (head * 5 + pos) * 3;
            assert_eq!(values[at..at + 3], [-want, -want - 1.0, -want - 2.0]);
        }
    }

    /// A cache that starts small and doubles as tokens arrive gives the same attention, bit for
    /// bit, after every token as one laid out for the whole context from the start.
    #[test]
    fn a_growing_cache_attends_like_a_full_one() {
        let b = CpuBackend::new();
        let shape = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            context_len: 70,
        };
        let (layers, width) = (2, 2 * 8);
        let mut growing = CpuKvCache::new(layers, shape, 3).unwrap();
        let mut full = CpuKvCache::new(layers, shape, 70).unwrap();
        let value = |pos: usize, layer: usize, j: usize| {
            ((pos * 31 + layer * 7 + j * 3) % 17) as f32 * 0.25 - 2.0
        };
        // Prefill of 5 tokens, then one token at a time up to the full context.
        let mut pos0 = 0;
        for n_tok in std::iter::once(5).chain(std::iter::repeat_n(1, 65)) {
            for layer in 0..layers {
                let k: Vec<f32> = (0..n_tok * width)
                    .map(|j| value(pos0 + j / width, layer, j))
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| x * 0.5 + 1.0).collect();
                let q: Vec<f32> = (0..n_tok * 4 * 8)
                    .map(|j| value(pos0, layer + 2, j))
                    .collect();
                let mut outs = [vec![0.0; q.len()], vec![0.0; q.len()]];
                for (cache, out) in [&mut growing, &mut full].into_iter().zip(&mut outs) {
                    b.store_kv(cache, layer, &k, &v, n_tok, pos0).unwrap();
                    b.attention(out, &q, cache, layer, n_tok, pos0).unwrap();
                }
                assert_eq!(
                    outs[0],
                    outs[1],
                    "layer {layer}, positions {pos0}..{}",
                    pos0 + n_tok
                );
            }
            pos0 += n_tok;
        }
        // 3 -> 6 -> 12 -> 24 -> 48 -> 96, clamped to the context.
        assert_eq!(growing.capacity, 70);
        assert!(b
            .store_kv(&mut growing, 0, &vec![0.0; width], &vec![0.0; width], 1, 70)
            .is_err());
    }
}
