//! The CPU references as a [`Backend`]: host vectors, weights borrowed from the mapped model file,
//! and for each op the reference of its kernel.
//!
//! `qwen3_inference::model::Session` run on this backend is the GPU's forward pass with every
//! kernel replaced by its reference: the same buffers, op order, KV cache layout and positions.
//! That is how the GPU path's orchestration is tested against transformers on machines without a
//! GPU (tests/hf_parity.rs), and what tests/gpu.rs compares the device with.

use super::attention::AttentionShape as KernelShape;
use crate::reference;
use anyhow::{bail, ensure, Result};
use qwen3_inference::backend::host::HostMemory;
use qwen3_inference::backend::{AttentionShape, Backend, KvType, RopeTable};
use qwen3_inference::format::view::TensorView;
use qwen3_inference::format::DType;
use std::marker::PhantomData;

/// The references as a backend. `'a` is the lifetime of the mapped model file.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceBackend<'a>(PhantomData<&'a ()>);

impl ReferenceBackend<'_> {
    pub const fn new() -> Self {
        ReferenceBackend(PhantomData)
    }
}

/// The KV cache in the GPU's layout: per layer `[context_len, n_kv_heads, head_dim]`
/// (token-major, so one chunk's keys are one contiguous copy).
pub struct ReferenceKvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    shape: AttentionShape,
}

/// RoPE's tables as the GPU holds them: `[context_len, head_dim / 2]` each.
pub struct ReferenceRope {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

fn norm_weight<'t>(w: &TensorView<'t>) -> Result<&'t [f32]> {
    match w.data.dtype() {
        DType::F32 => Ok(w.data.f32()),
        _ => anyhow::bail!("{}: norm weights must be f32", w.name),
    }
}

/// Its buffers are host vectors: [`host`](qwen3_inference::backend::host)'s memory, whose
/// `scatter_add_rows` is elementwise.cu's arithmetic (per value a product, then a sum).
impl HostMemory for ReferenceBackend<'_> {}

impl<'a> Backend for ReferenceBackend<'a> {
    type Tensor = TensorView<'a>;
    type Rope = ReferenceRope;
    type KvCache = ReferenceKvCache;

    fn rope_table(&self, table: RopeTable) -> Result<ReferenceRope> {
        Ok(ReferenceRope {
            cos: table.cos().to_vec(),
            sin: table.sin().to_vec(),
        })
    }

    fn kv_cache(
        &self,
        layers: usize,
        shape: AttentionShape,
        _max_batch: usize,
        kv: KvType,
    ) -> Result<ReferenceKvCache> {
        if kv != KvType::F32 {
            bail!("this backend keeps its KV cache in f32 only; --kv-cache {kv:?} is for the CPU");
        }
        let len = shape.context_len * shape.n_kv_heads * shape.head_dim;
        Ok(ReferenceKvCache {
            k: vec![vec![0.0; len]; layers],
            v: vec![vec![0.0; len]; layers],
            shape,
        })
    }

    fn embed(
        &self,
        x: &mut Vec<f32>,
        table: &TensorView<'a>,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<()> {
        reference::embed::embed(&mut x[..tokens.len() * hidden], &table.data, tokens, hidden);
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
        reference::rmsnorm::rmsnorm(&mut out[..rows * n], &x[..rows * n], norm_weight(w)?, eps);
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
        ensure!(
            w.shape == [rows as u64, cols as u64],
            "matmul: {} is {:?}, [{rows}, {cols}] needed",
            w.name,
            w.shape
        );
        reference::matmul::matmul(
            &mut y[..n_tok * rows],
            &w.data,
            &x[..n_tok * cols],
            rows,
            cols,
        );
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        table: &ReferenceRope,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        reference::rope::rope(
            &mut x[..n_tok * n_heads * head_dim],
            &table.cos,
            &table.sin,
            n_heads,
            head_dim,
            pos0,
        );
        Ok(())
    }

    fn store_kv(
        &self,
        cache: &mut ReferenceKvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        // Token-major: positions pos0 .. pos0 + n_tok are one block of n_tok * n_kv * head_dim.
        let width = cache.shape.n_kv_heads * cache.shape.head_dim;
        let (at, n) = (pos0 * width, n_tok * width);
        cache.k[layer][at..at + n].copy_from_slice(&k[..n]);
        cache.v[layer][at..at + n].copy_from_slice(&v[..n]);
        Ok(())
    }

    fn attention(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        cache: &mut ReferenceKvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let s = cache.shape;
        let n = n_tok * s.n_heads * s.head_dim;
        let shape = KernelShape {
            n_heads: s.n_heads,
            n_kv: s.n_kv_heads,
            head_dim: s.head_dim,
            ctx: s.context_len,
            pos0,
        };
        reference::attention::attention(
            &mut out[..n],
            &q[..n],
            &cache.k[layer],
            &cache.v[layer],
            shape,
        );
        Ok(())
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        reference::elementwise::silu_mul(&mut gate[..n], &up[..n]);
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
        reference::elementwise::add_bias(&mut x[..n_tok * n], &bias[..n]);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        reference::elementwise::add_assign(&mut x[..n], &y[..n]);
        Ok(())
    }
}
