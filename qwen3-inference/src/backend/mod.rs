//! The seam between the forward pass and the hardware it runs on: the few operations a Qwen
//! forward pass needs (Qwen2, Qwen3, Qwen3-MoE, and Qwen3.5's hybrid layers), over buffers the
//! backend owns.
//!
//! The forward pass ([`crate::model::Forward`]) is written once against [`Backend`].
//! Implementations:
//! - [`PlainBackend`]: the math in textbook loops, no SIMD, no threads (`plain.rs`: read it
//!   first); the oracle the others are tested against;
//! - [`CpuBackend`]: host vectors and the SIMD kernels of [`crate::kernels`], weights borrowed from
//!   the mmapped model file (what `qwen3 inference` runs by default);
//! - in the `qwen3-cuda` crate, `ReferenceBackend` (host vectors, plain-Rust references of the CUDA
//!   kernels, same math in the same order) and `CudaBackend` (device memory, the CUDA kernels).
//!
//! What the trait leaves to each backend: where buffers live, how a weight tensor is stored, and
//! the layout of the KV cache (the CPU keeps each kv head's keys and values as one contiguous
//! block, keys in transposed tiles of 16 positions; the GPU keeps `[pos][kv_head][head_dim]` so
//! one chunk's keys are one copy).
//!
//! Buffers are allocated once at their largest size (a prefill chunk of `max_batch` tokens); every
//! op takes the counts it uses, so the same buffers serve a one-token decode step. Ops return
//! `Result` because a device can fail at any launch; the host backends' arithmetic does not, and
//! their memory operations ([`host`]) answer a range the forward pass never asks for with an
//! error rather than a panic.

mod cpu;
pub mod host;
mod hybrid_steps;
mod plain;

pub use crate::kernels::delta_net::DeltaNetShape;
pub use crate::kernels::{AttentionShape, KvType, RopeTable};
pub use cpu::{CpuBackend, CPU};
pub use host::HostMemory;
pub use plain::{weight, PlainBackend, PlainKvCache};

use crate::format::ModelConfig;
use anyhow::{bail, Result};
use std::ops::Range;

/// A backend's buffers: where activations live, and how values move between buffers and to and
/// from the host. Every operation takes the counts it uses and answers a range out of bounds with
/// an error. A backend whose buffers are host vectors gets all of it from [`host`] by saying so
/// ([`host::HostMemory`]); a device implements it over its own memory.
pub trait Memory {
    /// f32 activations.
    type Buf;

    /// A zeroed buffer of `len` values.
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    /// `dst[dst_offset..][..len] = src[src_offset..][..len]`.
    fn copy(
        &self,
        dst: &mut Self::Buf,
        dst_offset: usize,
        src: &Self::Buf,
        src_offset: usize,
        len: usize,
    ) -> Result<()>;
    /// `x[..len]` as a host slice. Host buffers are returned as they are; device buffers are
    /// copied into `staging` (grown to `len` on first use, so steady-state calls allocate nothing).
    fn read<'s>(
        &self,
        x: &'s Self::Buf,
        len: usize,
        staging: &'s mut Vec<f32>,
    ) -> Result<&'s [f32]>;

    /// `x[offset..][..src.len()] = src`: values from the host written into a buffer (an image's
    /// vectors in place of its tokens' embeddings). The default refuses; host vectors take any
    /// values. Whether a backend runs images at all is [`Backend::TAKES_IMAGES`], which the engine
    /// asks before it sends one.
    fn write(&self, _x: &mut Self::Buf, _offset: usize, _src: &[f32]) -> Result<()> {
        bail!("this backend does not take images")
    }
    /// `x[..n] = 0`.
    fn zero(&self, x: &mut Self::Buf, n: usize) -> Result<()>;
    /// Rows of `x` gathered into `out`: `out[i] = x[rows[i]]`. out: `[rows.len(), n]`;
    /// x: `[_, n]`. (A mixture of experts runs each expert on the rows routed to it.) By default
    /// one [`Memory::copy`] a row.
    fn gather_rows(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        rows: &[u32],
        n: usize,
    ) -> Result<()> {
        for (i, &r) in rows.iter().enumerate() {
            self.copy(out, i * n, x, r as usize * n, n)?;
        }
        Ok(())
    }
    /// Weighted rows added back: `out[rows[i]] += weights[i] * y[i]` (a product, then a sum, each
    /// rounded, as transformers' `index_add_` of `expert(x) * weight`). out: `[_, n]`;
    /// y: `[rows.len(), n]`. `rows` holds no row twice.
    fn scatter_add_rows(
        &self,
        out: &mut Self::Buf,
        y: &Self::Buf,
        rows: &[u32],
        weights: &[f32],
        n: usize,
    ) -> Result<()>;
}

/// The operations of a Qwen forward pass: Qwen2's, Qwen3's and Qwen3-MoE's layers, and, for a
/// backend that runs them ([`Backend::check_layers`]), Qwen3.5's Gated DeltaNet and gated attention.
/// Shapes in the comments are row-major; `n_tok` is the number of tokens in the batch, `pos0` the
/// position of the first one.
pub trait Backend: Memory {
    /// One weight tensor as the model file stores it: a matrix `[rows, cols]` in any of
    /// [`DType`](crate::format::DType)'s dtypes (f32, bf16, q8, q4, q6, or a GGUF's K-quant
    /// blocks), or a norm weight `[n]`, always f32. A backend refuses by name a dtype it has no
    /// kernel for when the weights are loaded.
    type Tensor;
    /// RoPE's cos and sin tables, in the backend's memory.
    type Rope;
    /// Keys and values of every layer (in the backend's own layout), plus whatever scratch its
    /// attention needs.
    type KvCache;

    /// Whether this backend runs every layer `config` asks for; an error naming the first it
    /// does not. By default, the layers of Qwen2, Qwen3 and Qwen3-MoE: a backend that runs
    /// Qwen3.5's (the ops at the end of this trait) says so.
    fn check_layers(&self, config: &ModelConfig) -> Result<()> {
        if config.linear_attention.is_some() {
            bail!("this backend does not run Gated DeltaNet layers (Qwen3.5's linear_attention)");
        }
        if config.attn_output_gate || config.partial_rotary_factor != 1.0 {
            bail!(
                "this backend does not run gated attention with a partial rotation (Qwen3.5's \
                 full_attention layers)"
            );
        }
        Ok(())
    }

    // ---- Allocated once per session. ----

    /// The tables computed on the host by [`RopeTable::new`], moved to the backend, so that every
    /// backend rotates by the same angles.
    fn rope_table(&self, table: RopeTable) -> Result<Self::Rope>;
    /// A zeroed cache for `layers` layers of `shape.context_len` positions, whose attention takes
    /// up to `max_batch` query tokens at a time, holding keys and values as `kv` says (a backend
    /// refuses a type it does not implement).
    fn kv_cache(
        &self,
        layers: usize,
        shape: AttentionShape,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Self::KvCache>;

    /// Whether this backend runs prompts with images ([`Memory::write`] and
    /// [`Backend::rope_mrope`]); the engine refuses an image request on one that does not. A
    /// constant of the type, so that a command can ask before it loads anything (the server's
    /// model card says whether it takes images: the CLI's `device::takes_images`).
    const TAKES_IMAGES: bool = false;

    // ---- The math. ----

    /// `x[i] = table[tokens[i]]`: rows of the embedding table (`[vocab, hidden]`), converted to
    /// f32.  x: `[tokens.len(), hidden]`. Token ids are checked by the caller.
    fn embed(
        &self,
        x: &mut Self::Buf,
        table: &Self::Tensor,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<()>;
    /// RMSNorm of each of `rows` rows of `n` values: `out = w * (x / sqrt(mean(x^2) + eps))`.
    /// out, x: `[rows, n]`; w: `[n]`.
    fn rmsnorm(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        w: &Self::Tensor,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()>;
    /// `y = x @ w^T`. y: `[n_tok, rows]`; w: `[rows, cols]`; x: `[n_tok, cols]`.
    fn matmul(
        &self,
        y: &mut Self::Buf,
        w: &Self::Tensor,
        x: &Self::Buf,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Products of one input with several matrices of the same width, `ys[k] = x @ ws[k]^T`
    /// (q/k/v, or gate/up). `ys[k]`: `[n_tok, rows[k]]`. A backend may run them as one pass (the
    /// CPU quantizes `x` once and its threads meet once); by default they run one by one.
    #[allow(clippy::too_many_arguments)]
    fn matmuls<const N: usize>(
        &self,
        ys: [&mut Self::Buf; N],
        ws: [&Self::Tensor; N],
        x: &Self::Buf,
        n_tok: usize,
        rows: [usize; N],
        cols: usize,
    ) -> Result<()> {
        for ((y, w), r) in ys.into_iter().zip(ws).zip(rows) {
            self.matmul(y, w, x, n_tok, r, cols)?;
        }
        Ok(())
    }
    /// A bias added to every row, in place: `x[i][j] += bias[j]`. x: `[n_tok, n]`; bias: `[n]`,
    /// f32 (Qwen2's q/k/v projections).
    fn add_bias(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Tensor,
        n_tok: usize,
        n: usize,
    ) -> Result<()>;
    /// Rotates every head of token `i` by the angles of position `pos0 + i`, in place.
    /// x: `[n_tok, n_heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buf,
        table: &Self::Rope,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()>;
    /// M-RoPE (a prompt with images; `kernels::rope_mrope`): rotates every head of token `i`
    /// as [`Backend::rope`] does, frequency `j` by the angle of position
    /// `positions[i][components[j]]` (time, height or width). x: `[n_tok, n_heads, head_dim]`;
    /// `components`: one per rotated frequency. The default refuses.
    #[allow(clippy::too_many_arguments)]
    fn rope_mrope(
        &self,
        _x: &mut Self::Buf,
        _table: &Self::Rope,
        _n_tok: usize,
        _n_heads: usize,
        _head_dim: usize,
        _positions: &[[u32; 3]],
        _components: &[u8],
    ) -> Result<()> {
        bail!("this backend does not take images (M-RoPE)")
    }
    /// Writes the keys and values of `n_tok` tokens into `layer`'s cache at positions
    /// `pos0 .. pos0 + n_tok`. k, v: `[n_tok, n_kv_heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn store_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()>;
    /// Causal grouped-query attention of `n_tok` query tokens at positions `pos0 ..` over
    /// `layer`'s cache: token `i` sees keys `0 ..= pos0 + i`.
    /// out, q: `[n_tok, n_heads, head_dim]`.
    fn attention(
        &self,
        out: &mut Self::Buf,
        q: &Self::Buf,
        cache: &mut Self::KvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()>;
    /// SwiGLU's gate, in place: `gate[i] = silu(gate[i]) * up[i]` for `i < n`.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, n: usize) -> Result<()>;
    /// The residual connection, in place: `x[i] += y[i]` for `i < n`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> Result<()>;

    // ---- Qwen3.5: the gated attention's gate and the Gated DeltaNet's steps. A backend that
    // runs them says so in `check_layers`. The gate, the convolution and the delta rule are new
    // primitives (none is a composition of the ops above), so their defaults refuse; the gated
    // norm is composed of three ops above by default. ----

    /// Attention's output gate, in place: `x[i] *= sigmoid(gate[i])` for `i < n`.
    fn sigmoid_mul(&self, _x: &mut Self::Buf, _gate: &Self::Buf, _n: usize) -> Result<()> {
        bail!("this backend does not run gated attention")
    }
    /// The causal depthwise convolution and SiLU of one sequence's rows `rows` of `x` (`[_,
    /// conv_dim]`), in place; `window` (`[conv_dim, K - 1]`, the sequence's last inputs) moves
    /// along. w: `[conv_dim, K]`, f32. (`kernels/delta_net.rs`, `causal_conv_silu`.)
    fn causal_conv_silu(
        &self,
        _x: &mut Self::Buf,
        _window: &mut Self::Buf,
        _w: &Self::Tensor,
        _rows: Range<usize>,
        _shape: DeltaNetShape,
    ) -> Result<()> {
        bail!("this backend does not run Gated DeltaNet layers")
    }
    /// The gated delta rule over one sequence's rows `rows`, the first at position `pos0`: from
    /// the convolved `qkv` (`[_, conv_dim]`) and the raw `a`, `b` (`[_, num_v_heads]`), with
    /// `A_log` and `dt_bias`, the sequence's memory `state` (`[vh, dk, dv]`) is updated and read
    /// into `o` (`[_, value_dim]`). Whole chunks of 64 positions run the chunked form, other
    /// tokens the recurrence (`kernels/delta_net.rs`, `gated_delta_rule`).
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        _o: &mut Self::Buf,
        _qkv: &Self::Buf,
        _a: &Self::Buf,
        _b: &Self::Buf,
        _a_log: &Self::Tensor,
        _dt_bias: &Self::Tensor,
        _state: &mut Self::Buf,
        _rows: Range<usize>,
        _pos0: usize,
        _shape: DeltaNetShape,
    ) -> Result<()> {
        bail!("this backend does not run Gated DeltaNet layers")
    }
    /// `Qwen3_5RMSNormGated` of each of `rows` rows of `n` values, in place:
    /// `o = w * (o / rms(o)) * silu(z)`. o, z: `[rows, n]`; w: `[n]`, f32. By default
    /// [`gated_rmsnorm_composed`]: [`Backend::rmsnorm`], then [`Backend::silu_mul`].
    fn gated_rmsnorm(
        &self,
        o: &mut Self::Buf,
        z: &Self::Buf,
        w: &Self::Tensor,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        gated_rmsnorm_composed(self, o, z, w, rows, n, eps)
    }
}

/// [`Backend::gated_rmsnorm`] composed of other ops, for a backend without a fused one: the norm
/// into a new buffer, `normed = w * (o / rms(o))` ([`Backend::rmsnorm`]), then the gate copied
/// into `o` and SwiGLU's gate product, `o = silu(z) * normed` ([`Backend::silu_mul`]). The same
/// products as the fused form, the factors of one multiplication swapped (`silu(z)` times
/// `w * (o / rms)`), so the same values wherever the backend's `silu` and norm are the ones its
/// fused form uses (the CPU backend's: bit for bit). A buffer allocated a call: the fallback's
/// price.
pub fn gated_rmsnorm_composed<B: Backend + ?Sized>(
    b: &B,
    o: &mut B::Buf,
    z: &B::Buf,
    w: &B::Tensor,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let len = rows * n;
    let mut normed = b.alloc(len)?;
    b.rmsnorm(&mut normed, o, w, rows, n, eps)?;
    b.copy(o, 0, z, 0, len)?;
    b.silu_mul(o, &normed, len)
}
