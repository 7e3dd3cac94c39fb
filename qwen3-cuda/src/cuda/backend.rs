//! qwen3-inference's [`Backend`] on a CUDA device: device buffers, the kernels of
//! `qwen3-cuda/kernels/`. `qwen3_inference::model::Session` runs the forward pass over it.
//!
//! Every launch goes to the runtime's one stream, so kernels run in the order the forward pass
//! issues them; the host waits only in `read` (the logits). Each `unsafe` launch is sound
//! when (a) the arguments match the kernel's C signature in type and order, and (b) every index
//! the kernel computes stays inside the buffers it is given. (a) is checked by reading the two
//! side by side; (b) is what the length checks before each launch establish, using the index
//! ranges stated in each kernel's header comment.

use super::runtime::CudaRuntime;
use super::weights::{DeviceTensor, DeviceWeights};
use crate::kernels::{
    check_matmul_shape, quant_of, rmsnorm_block_dim, ATTENTION_BLOCK_DIM, ELEMENTWISE_BLOCK_DIM,
    MATMUL_ROWS_PER_BLOCK, MATMUL_TOK_TILE,
};
use anyhow::{bail, ensure, Result};
use cudarc::driver::{CudaSlice, DriverError, LaunchConfig, PushKernelArg};
use qwen3_inference::backend::{AttentionShape, Backend, KvType, Memory, RopeTable};
use qwen3_inference::format::{DType, ModelFile};

pub struct CudaBackend {
    pub runtime: CudaRuntime,
    pub weights: DeviceWeights,
}

impl CudaBackend {
    /// Opens device `ordinal` (probing first: a missing driver, device or NVRTC is an error, never
    /// a panic) and uploads `file` to it in one copy.
    pub fn load(ordinal: usize, file: &ModelFile) -> Result<CudaBackend> {
        let runtime = CudaRuntime::open(ordinal)?;
        let weights = DeviceWeights::upload(&runtime.stream, file)?;
        Ok(CudaBackend { runtime, weights })
    }
}

/// The KV cache on the device: per layer `[context_len, n_kv_heads, head_dim]` (token-major, so
/// one chunk's keys are one contiguous copy), and the attention kernel's score scratch.
pub struct CudaKvCache {
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    /// `[max_batch, n_heads, context_len]`: one row of scores per (query token, head) block.
    scores: CudaSlice<f32>,
    shape: AttentionShape,
}

/// RoPE's tables on the device, `[context_len, head_dim / 2]` each.
pub struct CudaRope {
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
}

fn err(e: DriverError) -> anyhow::Error {
    anyhow::anyhow!("CUDA: {e}")
}

fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| anyhow::anyhow!("size {n} too large for a CUDA kernel argument"))
}

fn grid(blocks: usize, tokens: usize, threads: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (int(blocks)? as u32, int(tokens)? as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn need(buf: &CudaSlice<f32>, len: usize, what: &str) -> Result<()> {
    ensure!(
        buf.len() >= len,
        "{what}: buffer of {} values, {len} needed",
        buf.len()
    );
    Ok(())
}

fn need_tensor(t: &DeviceTensor, dtype: Option<DType>, numel: usize, what: &str) -> Result<()> {
    let have = t.shape.iter().product::<usize>();
    ensure!(
        have == numel,
        "{what}: tensor of {have} values, {numel} needed"
    );
    if let Some(dt) = dtype {
        ensure!(t.dtype == dt, "{what}: tensor is {}, {dt} needed", t.dtype);
    }
    Ok(())
}

impl Memory for CudaBackend {
    type Buf = CudaSlice<f32>;

    fn alloc(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.runtime.stream.alloc_zeros(len.max(1)).map_err(err)
    }

    fn copy(
        &self,
        dst: &mut CudaSlice<f32>,
        dst_offset: usize,
        src: &CudaSlice<f32>,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        need(dst, dst_offset + len, "copy")?;
        need(src, src_offset + len, "copy")?;
        let mut to = dst.slice_mut(dst_offset..dst_offset + len);
        self.runtime
            .stream
            .memcpy_dtod(&src.slice(src_offset..src_offset + len), &mut to)
            .map_err(err)
    }

    fn read<'s>(
        &self,
        x: &'s CudaSlice<f32>,
        len: usize,
        staging: &'s mut Vec<f32>,
    ) -> Result<&'s [f32]> {
        need(x, len, "read")?;
        if staging.len() < len {
            staging.resize(len, 0.0);
        }
        let stream = &self.runtime.stream;
        stream
            .memcpy_dtoh(&x.slice(0..len), &mut staging[..len])
            .map_err(err)?;
        // A copy to pageable memory returns when complete; synchronising says so explicitly
        // and surfaces any error of the kernels queued before it.
        stream.synchronize().map_err(err)?;
        Ok(&staging[..len])
    }

    fn zero(&self, x: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        need(x, n, "zero")?;
        self.runtime
            .stream
            .memset_zeros(&mut x.slice_mut(..n))
            .map_err(err)
    }

    fn scatter_add_rows(
        &self,
        out: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        rows: &[u32],
        weights: &[f32],
        n: usize,
    ) -> Result<()> {
        ensure!(
            rows.len() == weights.len(),
            "scatter_add_rows: {} rows, {} weights",
            rows.len(),
            weights.len()
        );
        if rows.is_empty() {
            return Ok(());
        }
        let total = rows.len() * n;
        need(y, total, "scatter_add_rows")?;
        let top = *rows.iter().max().unwrap_or(&0) as usize;
        need(out, (top + 1) * n, "scatter_add_rows")?;
        // The routing lives on the host (it was decided there from the router's logits): a few
        // bytes uploaded per expert and step.
        let stream = &self.runtime.stream;
        let rows_d = stream.clone_htod(rows).map_err(err)?;
        let weights_d = stream.clone_htod(weights).map_err(err)?;
        let cfg = grid(
            total.div_ceil(ELEMENTWISE_BLOCK_DIM),
            1,
            ELEMENTWISE_BLOCK_DIM,
        )?;
        let (nr_i, n_i) = (int(rows.len())?, int(n)?);
        int(total)?;
        let mut b = stream.launch_builder(&self.runtime.functions.scatter_add_rows);
        b.arg(out)
            .arg(y)
            .arg(&rows_d)
            .arg(&weights_d)
            .arg(&nr_i)
            .arg(&n_i);
        // SAFETY: scatter_add_rows(out, y, rows, weights, n_rows, n); thread i < n_rows * n
        // (which fits an int, checked) reads y[i] (y holds n_rows * n, checked) and
        // weights[i / n], and writes out[rows[i / n] * n + i % n], below (max(rows) + 1) * n
        // (checked). Rows are distinct (one expert a token), so no two threads write one value.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Tensor = DeviceTensor;
    type Rope = CudaRope;
    type KvCache = CudaKvCache;

    fn rope_table(&self, table: RopeTable) -> Result<CudaRope> {
        let stream = &self.runtime.stream;
        Ok(CudaRope {
            cos: stream.clone_htod(table.cos()).map_err(err)?,
            sin: stream.clone_htod(table.sin()).map_err(err)?,
        })
    }

    fn kv_cache(
        &self,
        layers: usize,
        shape: AttentionShape,
        max_batch: usize,
        kv: KvType,
    ) -> Result<CudaKvCache> {
        if kv != KvType::F32 {
            bail!("this backend keeps its KV cache in f32 only; --kv-cache {kv:?} is for the CPU");
        }
        let len = shape.context_len * shape.n_kv_heads * shape.head_dim;
        let per_layer =
            || -> Result<Vec<CudaSlice<f32>>> { (0..layers).map(|_| self.alloc(len)).collect() };
        Ok(CudaKvCache {
            k: per_layer()?,
            v: per_layer()?,
            scores: self.alloc(max_batch * shape.n_heads * shape.context_len)?,
            shape,
        })
    }

    fn embed(
        &self,
        out: &mut CudaSlice<f32>,
        table: &DeviceTensor,
        tokens: &[u32],
        cols: usize,
    ) -> Result<()> {
        let (n, vocab) = (tokens.len(), table.rows());
        ensure!(
            table.cols() == cols,
            "embed: table has {} columns, {cols} asked",
            table.cols()
        );
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {t} is outside the vocabulary of {vocab}");
        }
        need(out, n * cols, "embed")?;
        let ids = self.runtime.stream.clone_htod(tokens).map_err(err)?;
        let f = &self.runtime.functions;
        let cfg = grid(
            cols.div_ceil(ELEMENTWISE_BLOCK_DIM),
            n,
            ELEMENTWISE_BLOCK_DIM,
        )?;
        let cols_i = int(cols)?;
        let values = self.weights.view(&table.values);
        let mut b = match table.dtype {
            DType::Q8 => self.runtime.stream.launch_builder(&f.embed_q8),
            DType::Q6 => self.runtime.stream.launch_builder(&f.embed_q6),
            DType::Bf16 => self.runtime.stream.launch_builder(&f.embed_bf16),
            DType::F32 => self.runtime.stream.launch_builder(&f.embed_f32),
            // Unreachable in practice: DeviceWeights::upload refuses a q4 embedding table.
            DType::Q4 => bail!("embed: no CUDA kernel reads a q4 embedding table"),
            // Unreachable in practice: DeviceWeights::upload refuses GGUF's K-quants.
            DType::K(_) => {
                bail!("embed: no CUDA kernel reads {}", table.dtype)
            }
        };
        b.arg(out).arg(&ids).arg(&values);
        let scales = self.weights.view(&table.scales);
        let gs = int(table.group_size)?;
        if matches!(table.dtype, DType::Q8 | DType::Q6) {
            b.arg(&scales).arg(&gs);
        }
        b.arg(&cols_i);
        // SAFETY: embed_{q8,q6,bf16,f32}(out, tokens, values[, scales, gs], cols) as in embed.cu.
        // Every id is below `vocab` (checked), so rows read lie inside the table's ranges; out
        // holds n * cols values (checked).
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn rmsnorm(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &DeviceTensor,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        need_tensor(w, Some(DType::F32), n, "rmsnorm")?;
        need(out, rows * n, "rmsnorm")?;
        need(x, rows * n, "rmsnorm")?;
        let cfg = grid(rows, 1, rmsnorm_block_dim(n))?;
        let n_i = int(n)?;
        let wv = self.weights.view(&w.values);
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.rmsnorm_f32);
        b.arg(out).arg(x).arg(&wv).arg(&n_i).arg(&eps);
        // SAFETY: rmsnorm_f32(out, x, w, n, eps); block r touches x/out[r*n .. r*n + n] for
        // r < rows, and w[0..n]; all lengths checked above.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn matmul(
        &self,
        y: &mut CudaSlice<f32>,
        w: &DeviceTensor,
        x: &CudaSlice<f32>,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        ensure!(
            w.shape == [rows, cols],
            "matmul: weight {:?}, [{rows}, {cols}] needed",
            w.shape
        );
        check_matmul_shape(cols, quant_of(w.dtype, w.group_size)).map_err(anyhow::Error::msg)?;
        need(y, n_tok * rows, "matmul")?;
        need(x, n_tok * cols, "matmul")?;
        let cfg = grid(
            rows.div_ceil(MATMUL_ROWS_PER_BLOCK),
            n_tok.div_ceil(MATMUL_TOK_TILE),
            32 * MATMUL_ROWS_PER_BLOCK,
        )?;
        let (rows_i, cols_i, n_i, gs_i) = (int(rows)?, int(cols)?, int(n_tok)?, int(w.group_size)?);
        let f = &self.runtime.functions;
        let values = self.weights.view(&w.values);
        let scales = self.weights.view(&w.scales);
        let mut b = match w.dtype {
            DType::Q8 => self.runtime.stream.launch_builder(&f.matmul_q8),
            DType::Q4 => self.runtime.stream.launch_builder(&f.matmul_q4),
            DType::Q6 => self.runtime.stream.launch_builder(&f.matmul_q6),
            DType::Bf16 => self.runtime.stream.launch_builder(&f.matmul_bf16),
            DType::F32 => self.runtime.stream.launch_builder(&f.matmul_f32),
            // Unreachable in practice: DeviceWeights::upload refuses GGUF's K-quants.
            DType::K(_) => {
                bail!("matmul: no CUDA kernel reads {}", w.dtype)
            }
        };
        b.arg(y).arg(&values);
        if w.dtype.grouped() {
            b.arg(&scales).arg(&gs_i);
        }
        b.arg(x).arg(&rows_i).arg(&cols_i).arg(&n_i);
        // SAFETY: matmul_{q8,q4,q6}(y, values, scales, gs, x, rows, cols, n_tok) /
        // matmul_{bf16,f32}(y, w, x, rows, cols, n_tok) as in matmul.cu. Warps with row >= rows
        // return; token t < n_tok reads x[t*cols .. +cols] and writes y[t*rows + row]; the weight
        // ranges hold rows*cols values (shape checked here, byte ranges at upload); cols % 4 == 0
        // and, for q8, gs % 4 == 0 and gs | cols, so every 4-wide load stays within one row and
        // one group, 16-byte aligned; for q4, gs % 8 == 0 and gs | cols, so a lane's four columns
        // are four aligned bytes of one half of one group; for q6, gs % 32 == 0 and gs | cols, so
        // its two 4-byte loads lie inside the row's block, aligned (matmul.cu).
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        table: &CudaRope,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        let half = head_dim / 2;
        need(x, n_tok * n_heads * head_dim, "rope")?;
        need(&table.cos, (pos0 + n_tok) * half, "rope cos")?;
        need(&table.sin, (pos0 + n_tok) * half, "rope sin")?;
        let cfg = grid(n_heads, n_tok, 64)?;
        let (h_i, hd_i, p_i) = (int(n_heads)?, int(head_dim)?, int(pos0)?);
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.rope);
        b.arg(x)
            .arg(&table.cos)
            .arg(&table.sin)
            .arg(&h_i)
            .arg(&hd_i)
            .arg(&p_i);
        // SAFETY: rope(x, cos, sin, n_heads, head_dim, pos0); block (h, t) touches
        // x[(t*n_heads + h)*head_dim ..][..head_dim] and table rows pos0 + t < pos0 + n_tok.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn store_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        // Token-major: positions pos0 .. pos0 + n_tok are one block of n_tok * n_kv * head_dim.
        ensure!(
            layer < cache.k.len(),
            "store_kv: layer {layer} of {}",
            cache.k.len()
        );
        let width = cache.shape.n_kv_heads * cache.shape.head_dim;
        let (at, n) = (pos0 * width, n_tok * width);
        self.copy(&mut cache.k[layer], at, k, 0, n)?;
        self.copy(&mut cache.v[layer], at, v, 0, n)
    }

    fn attention(
        &self,
        out: &mut CudaSlice<f32>,
        q: &CudaSlice<f32>,
        cache: &mut CudaKvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let s = cache.shape;
        let n = n_tok * s.n_heads * s.head_dim;
        ensure!(
            layer < cache.k.len(),
            "attention: layer {layer} of {}",
            cache.k.len()
        );
        ensure!(
            s.n_kv_heads > 0 && s.n_heads.is_multiple_of(s.n_kv_heads),
            "attention: {} heads over {} kv heads",
            s.n_heads,
            s.n_kv_heads
        );
        ensure!(
            pos0 + n_tok <= s.context_len,
            "attention: positions beyond the context"
        );
        let (k_cache, v_cache) = (&cache.k[layer], &cache.v[layer]);
        need(out, n, "attention")?;
        need(q, n, "attention")?;
        need(
            &cache.scores,
            n_tok * s.n_heads * s.context_len,
            "attention scores",
        )?;
        need(
            k_cache,
            s.context_len * s.n_kv_heads * s.head_dim,
            "k cache",
        )?;
        need(
            v_cache,
            s.context_len * s.n_kv_heads * s.head_dim,
            "v cache",
        )?;
        let cfg = grid(s.n_heads, n_tok, ATTENTION_BLOCK_DIM)?;
        let scale = (s.head_dim as f64).powf(-0.5) as f32;
        let (h_i, kv_i, hd_i, ctx_i, p_i) = (
            int(s.n_heads)?,
            int(s.n_kv_heads)?,
            int(s.head_dim)?,
            int(s.context_len)?,
            int(pos0)?,
        );
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.attention);
        b.arg(out)
            .arg(&mut cache.scores)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache);
        b.arg(&h_i)
            .arg(&kv_i)
            .arg(&hd_i)
            .arg(&ctx_i)
            .arg(&p_i)
            .arg(&scale);
        // SAFETY: attention(out, scores, q, k_cache, v_cache, n_heads, n_kv, head_dim, ctx, pos0,
        // scale). Block (h, t) reads keys/values j <= pos0 + t < ctx (checked) of kv head
        // h / (n_heads / n_kv) < n_kv, and touches q/out/scores rows (t, h) only.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn silu_mul(&self, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>, n: usize) -> Result<()> {
        need(gate, n, "silu_mul")?;
        need(up, n, "silu_mul")?;
        let cfg = grid(n.div_ceil(ELEMENTWISE_BLOCK_DIM), 1, ELEMENTWISE_BLOCK_DIM)?;
        let n_i = int(n)?;
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.silu_mul);
        b.arg(gate).arg(up).arg(&n_i);
        // SAFETY: silu_mul(gate, up, n); thread i < n touches index i only.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn add_bias(
        &self,
        x: &mut CudaSlice<f32>,
        bias: &DeviceTensor,
        n_tok: usize,
        n: usize,
    ) -> Result<()> {
        need_tensor(bias, Some(DType::F32), n, "add_bias")?;
        let total = n_tok * n;
        need(x, total, "add_bias")?;
        let cfg = grid(
            total.div_ceil(ELEMENTWISE_BLOCK_DIM),
            1,
            ELEMENTWISE_BLOCK_DIM,
        )?;
        let (n_i, total_i) = (int(n)?, int(total)?);
        let bv = self.weights.view(&bias.values);
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.add_bias);
        b.arg(x).arg(&bv).arg(&n_i).arg(&total_i);
        // SAFETY: add_bias(x, bias, n, total); thread i < total touches x[i] and reads
        // bias[i % n]; x holds total values and bias n (both checked above).
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
        need(x, n, "add")?;
        need(y, n, "add")?;
        let cfg = grid(n.div_ceil(ELEMENTWISE_BLOCK_DIM), 1, ELEMENTWISE_BLOCK_DIM)?;
        let n_i = int(n)?;
        let mut b = self
            .runtime
            .stream
            .launch_builder(&self.runtime.functions.add_assign);
        b.arg(x).arg(y).arg(&n_i);
        // SAFETY: add_assign(x, y, n); thread i < n touches index i only.
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }
}
