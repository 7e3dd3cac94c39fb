//! The seam between the forward pass and the hardware it runs on: the handful of operations a
//! Qwen3 forward pass needs, over buffers the backend owns.
//!
//! Two implementations exist: [`ReferenceBackend`] (host memory, the CPU references of the
//! kernels) and `cuda::CudaBackend` (device memory, the kernels). [`crate::forward`] is written
//! once against this trait and runs on either, which is how the GPU's orchestration (buffer sizes,
//! offsets, KV cache writes, causal positions) is tested on machines without a GPU.
//! Proposal for the lead: the CPU forward pass in qwen3-inference can implement this trait with its
//! SIMD kernels (`Buf = Vec<f32>`, `Tensor = TensorData<'a>`) and drive one forward pass for both.
//!
//! Buffers are allocated once at their largest size; every op takes the element counts it uses,
//! so a buffer sized for a prefill chunk serves a one-token decode step too.

use crate::reference;
use crate::reference::attention::AttentionShape;
use anyhow::{ensure, Result};
use qwen3_inference::format::reader::TensorData;
use std::marker::PhantomData;

pub trait Backend {
    /// f32 activations.
    type Buf;
    /// One stored weight tensor (q8, bf16 or f32 as the file has it).
    type Tensor;

    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    fn download(&self, x: &Self::Buf, offset: usize, len: usize) -> Result<Vec<f32>>;
    /// `dst[dst_offset..][..len] = src[src_offset..][..len]`.
    fn copy(
        &self,
        dst: &mut Self::Buf,
        dst_offset: usize,
        src: &Self::Buf,
        src_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// out: [tokens.len(), cols] = rows `tokens` of `table` ([vocab, cols]).
    fn embed(
        &self,
        out: &mut Self::Buf,
        table: &Self::Tensor,
        tokens: &[u32],
        cols: usize,
    ) -> Result<()>;
    /// out, x: `[rows, n]`; w: `[n]` f32.
    fn rmsnorm(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        w: &Self::Tensor,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()>;
    /// y: [n_tok, rows] = x: [n_tok, cols] times w: [rows, cols] transposed.
    fn matmul(
        &self,
        y: &mut Self::Buf,
        w: &Self::Tensor,
        x: &Self::Buf,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// x: [n_tok, n_heads, head_dim] rotated in place, token t at position pos0 + t.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buf,
        cos: &Self::Buf,
        sin: &Self::Buf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()>;
    /// out: [n_tok, n_heads, head_dim]; caches: [ctx, n_kv, head_dim]; scores: scratch of
    /// n_tok * n_heads * ctx values.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        out: &mut Self::Buf,
        scores: &mut Self::Buf,
        q: &Self::Buf,
        k_cache: &Self::Buf,
        v_cache: &Self::Buf,
        n_tok: usize,
        shape: AttentionShape,
    ) -> Result<()>;
    /// out[..n] = silu(gate[..n]) * up[..n].
    fn silu_mul(
        &self,
        out: &mut Self::Buf,
        gate: &Self::Buf,
        up: &Self::Buf,
        n: usize,
    ) -> Result<()>;
    /// x[..n] += y[..n].
    fn add_assign(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> Result<()>;
}

/// The CPU references as a backend: host vectors, weights borrowed from the mapped model file.
#[derive(Default)]
pub struct ReferenceBackend<'a> {
    _weights: PhantomData<&'a ()>,
}

impl<'a> ReferenceBackend<'a> {
    pub fn new() -> Self {
        Self::default()
    }
}

fn norm_weights<'t>(w: &TensorData<'t>) -> Result<&'t [f32]> {
    match *w {
        TensorData::F32(v) => Ok(v),
        _ => anyhow::bail!("norm weights must be f32"),
    }
}

impl<'a> Backend for ReferenceBackend<'a> {
    type Buf = Vec<f32>;
    type Tensor = TensorData<'a>;

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, x: &Vec<f32>, offset: usize, len: usize) -> Result<Vec<f32>> {
        ensure!(offset + len <= x.len(), "download out of bounds");
        Ok(x[offset..offset + len].to_vec())
    }
    fn copy(
        &self,
        dst: &mut Vec<f32>,
        dst_offset: usize,
        src: &Vec<f32>,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        ensure!(
            dst_offset + len <= dst.len() && src_offset + len <= src.len(),
            "copy out of bounds"
        );
        dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
        Ok(())
    }
    fn embed(
        &self,
        out: &mut Vec<f32>,
        table: &TensorData<'a>,
        tokens: &[u32],
        cols: usize,
    ) -> Result<()> {
        reference::embed::embed(&mut out[..tokens.len() * cols], table, tokens, cols);
        Ok(())
    }
    fn rmsnorm(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        w: &TensorData<'a>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        reference::rmsnorm::rmsnorm(&mut out[..rows * n], &x[..rows * n], norm_weights(w)?, eps);
        Ok(())
    }
    fn matmul(
        &self,
        y: &mut Vec<f32>,
        w: &TensorData<'a>,
        x: &Vec<f32>,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        reference::matmul::matmul(&mut y[..n_tok * rows], w, &x[..n_tok * cols], rows, cols);
        Ok(())
    }
    fn rope(
        &self,
        x: &mut Vec<f32>,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        reference::rope::rope(
            &mut x[..n_tok * n_heads * head_dim],
            cos,
            sin,
            n_heads,
            head_dim,
            pos0,
        );
        Ok(())
    }
    fn attention(
        &self,
        out: &mut Vec<f32>,
        _scores: &mut Vec<f32>,
        q: &Vec<f32>,
        k_cache: &Vec<f32>,
        v_cache: &Vec<f32>,
        n_tok: usize,
        s: AttentionShape,
    ) -> Result<()> {
        let n = n_tok * s.n_heads * s.head_dim;
        reference::attention::attention(&mut out[..n], &q[..n], k_cache, v_cache, s);
        Ok(())
    }
    fn silu_mul(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        reference::elementwise::silu_mul(&mut out[..n], &gate[..n], &up[..n]);
        Ok(())
    }
    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        reference::elementwise::add_assign(&mut x[..n], &y[..n]);
        Ok(())
    }
}
