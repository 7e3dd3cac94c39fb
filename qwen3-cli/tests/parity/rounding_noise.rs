//! A backend for tests/parity.rs: the CPU backend with one of its roundings replaced by random
//! noise of the same size, to measure how far such rounding can move the logits.

use anyhow::Result;
use qwen3_inference::backend::{
    AttentionShape, Backend, CpuBackend, DeltaNetShape, HostMemory, KvType, RopeTable,
};
use qwen3_inference::format::view::TensorView;
use qwen3_inference::kernels::attention::{Bf16, KvElem};
use qwen3_inference::quant::quantize_q8;
use std::cell::{Cell, RefCell};

/// The CPU backend with a rounding of the computation replaced by noise of the same size, for the
/// noise draws of [`noise_sigmas`] and [`kv_bf16_sigmas`]:
/// - `w8a8_group`: W8A8's activation rounding. Before every matrix product, each activation is
///   moved by its own rounding error (per group, `quant`'s rule, exactly what the q8 kernels
///   do to it) with a random sign, the activations' counterpart of [`write_sign_flipped`]. The
///   products themselves run in f32 on the perturbed values. q/k/v (and gate/up) see the same
///   perturbed input, as they see the same quantized input in the q8 kernels.
/// - `kv_bf16`: the bf16 KV cache's rounding. Every key and value is moved by its own bf16
///   rounding error with a random sign, then stored in an f32 cache.
pub struct RoundingNoise<'a> {
    inner: CpuBackend<'a>,
    w8a8_group: Option<usize>,
    kv_bf16: bool,
    state: Cell<u64>,
    scratch: RefCell<Vec<f32>>,
}

impl RoundingNoise<'_> {
    pub fn new(w8a8_group: Option<usize>, kv_bf16: bool, seed: u64) -> Self {
        RoundingNoise {
            inner: CpuBackend::new(),
            w8a8_group,
            kv_bf16,
            state: Cell::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03),
            scratch: RefCell::new(Vec::new()),
        }
    }

    /// `e` or `-e`, at random.
    fn random_sign(&self, e: f32) -> f32 {
        let s = self
            .state
            .get()
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.state.set(s);
        if s >> 63 == 1 {
            e
        } else {
            -e
        }
    }

    /// `x[..n]` with every value moved by its W8A8 rounding error, signs drawn at random (as it
    /// is without `w8a8_group`).
    fn perturbed(&self, x: &[f32], n: usize) -> std::cell::RefMut<'_, Vec<f32>> {
        let mut out = self.scratch.borrow_mut();
        out.clear();
        out.extend_from_slice(&x[..n]);
        let Some(gs) = self.w8a8_group else {
            return out;
        };
        let (mut q, mut scale) = (vec![0i8; gs], [0f32]);
        for group in out.chunks_exact_mut(gs) {
            quantize_q8(group, gs, &mut q, &mut scale);
            for (v, &qi) in group.iter_mut().zip(&q) {
                *v += self.random_sign(qi as f32 * scale[0] - *v);
            }
        }
        out
    }

    /// `x` with every value moved by its bf16 rounding error, signs drawn at random.
    fn bf16_perturbed(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .map(|&v| v + self.random_sign(Bf16::from_f32(v).to_f32() - v))
            .collect()
    }
}

impl HostMemory for RoundingNoise<'_> {}

impl<'a> Backend for RoundingNoise<'a> {
    type Tensor = TensorView<'a>;
    type Rope = <CpuBackend<'a> as Backend>::Rope;
    type KvCache = <CpuBackend<'a> as Backend>::KvCache;

    fn rope_table(&self, table: RopeTable) -> Result<Self::Rope> {
        self.inner.rope_table(table)
    }
    fn kv_cache(
        &self,
        layers: usize,
        s: AttentionShape,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Self::KvCache> {
        self.inner.kv_cache(layers, s, max_batch, kv)
    }
    fn embed(
        &self,
        x: &mut Vec<f32>,
        table: &TensorView<'a>,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<()> {
        self.inner.embed(x, table, tokens, hidden)
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
        self.inner.rmsnorm(out, x, w, rows, n, eps)
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
        let x = self.perturbed(x, n_tok * cols);
        self.inner.matmul(y, w, &x, n_tok, rows, cols)
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
        let x = self.perturbed(x, n_tok * cols);
        self.inner.matmuls(ys, ws, &x, n_tok, rows, cols)
    }
    fn rope(
        &self,
        x: &mut Vec<f32>,
        table: &Self::Rope,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        self.inner.rope(x, table, n_tok, n_heads, head_dim, pos0)
    }
    fn store_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        if self.kv_bf16 {
            let (k, v) = (self.bf16_perturbed(k), self.bf16_perturbed(v));
            return self.inner.store_kv(cache, layer, &k, &v, n_tok, pos0);
        }
        self.inner.store_kv(cache, layer, k, v, n_tok, pos0)
    }
    fn attention(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        cache: &mut Self::KvCache,
        layer: usize,
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        self.inner.attention(out, q, cache, layer, n_tok, pos0)
    }
    fn add_bias(
        &self,
        x: &mut Vec<f32>,
        bias: &TensorView<'a>,
        n_tok: usize,
        n: usize,
    ) -> Result<()> {
        self.inner.add_bias(x, bias, n_tok, n)
    }
    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        self.inner.silu_mul(gate, up, n)
    }
    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        self.inner.add(x, y, n)
    }

    // Qwen3.5's steps, unperturbed (their inputs come from the perturbed products).
    fn check_layers(&self, c: &qwen3_inference::format::ModelConfig) -> Result<()> {
        self.inner.check_layers(c)
    }
    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, n: usize) -> Result<()> {
        self.inner.sigmoid_mul(x, gate, n)
    }
    fn causal_conv_silu(
        &self,
        x: &mut Vec<f32>,
        window: &mut Vec<f32>,
        w: &TensorView<'a>,
        rows: std::ops::Range<usize>,
        shape: DeltaNetShape,
    ) -> Result<()> {
        self.inner.causal_conv_silu(x, window, w, rows, shape)
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
        self.inner
            .gated_delta_rule(o, qkv, a, b, a_log, dt_bias, state, rows, pos0, shape)
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
        self.inner.gated_rmsnorm(o, z, w, rows, n, eps)
    }
}
