//! [`Backend`] on the CPU: host vectors, the SIMD kernels of [`crate::kernels`], and weights
//! borrowed zero-copy from the mmapped model file.
//!
//! Each op is a thin call into its kernel; the kernels assert their slice lengths, so a wrong
//! count is a panic (a bug in the forward pass), never an out-of-bounds read.

use super::{AttentionShape, Backend, RopeTable};
use crate::format::reader::{TensorData, TensorView};
use crate::kernels;
use crate::kernels::attention::{keys_len, store_key};
use anyhow::{bail, Result};
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
/// for one head streams one block of memory; sized by the context the session was asked for, not
/// the model's maximum.
/// - values: `[layer][kv_head][pos][head_dim]`
/// - keys: `[layer][kv_head]` blocks of `kernels::attention::keys_len` floats, in tiles of
///   `KEY_TILE` positions stored transposed (`[tile][head_dim][KEY_TILE]`; why: `KEY_TILE`).
pub struct CpuKvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    /// Floats per layer of keys: `n_kv_heads * keys_len`.
    k_layer_len: usize,
    /// Floats per layer of values: `n_kv_heads * context_len * head_dim`.
    v_layer_len: usize,
    shape: AttentionShape,
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
        let k_layer_len = s.n_kv_heads * keys_len(&s);
        let v_layer_len = s.n_kv_heads * s.context_len * s.head_dim;
        Ok(CpuKvCache {
            k: vec![0.0; layers * k_layer_len],
            v: vec![0.0; layers * v_layer_len],
            k_layer_len,
            v_layer_len,
            shape: s,
        })
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
        let s = cache.shape;
        let (nkv, hd, ctx) = (s.n_kv_heads, s.head_dim, s.context_len);
        let k_head_len = keys_len(&s);
        let layer_k = &mut cache.k[layer * cache.k_layer_len..(layer + 1) * cache.k_layer_len];
        let layer_v = &mut cache.v[layer * cache.v_layer_len..(layer + 1) * cache.v_layer_len];
        for i in 0..n_tok {
            for h in 0..nkv {
                let src = (i * nkv + h) * hd..(i * nkv + h + 1) * hd;
                let head_k = &mut layer_k[h * k_head_len..(h + 1) * k_head_len];
                store_key(head_k, pos0 + i, &k[src.clone()]);
                let at = (h * ctx + pos0 + i) * hd;
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
        let s = cache.shape;
        let n = n_tok * s.n_heads * s.head_dim;
        kernels::attention(
            &mut out[..n],
            &q[..n],
            &cache.k[layer * cache.k_layer_len..(layer + 1) * cache.k_layer_len],
            &cache.v[layer * cache.v_layer_len..(layer + 1) * cache.v_layer_len],
            s,
            pos0,
            n_tok,
        );
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
        let keys = &cache.k[cache.k_layer_len..];
        let values = &cache.v[cache.v_layer_len..];
        // Five positions fit one tile of 16: a kv head's keys are 16 * 3 floats.
        assert_eq!(cache.k_layer_len, 2 * KEY_TILE * 3);
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
        assert!(cache.k[..cache.k_layer_len].iter().all(|&x| x == 0.0));
    }
}
