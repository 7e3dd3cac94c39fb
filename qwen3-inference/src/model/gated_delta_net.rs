//! Qwen3.5's Gated DeltaNet layer in textbook loops: the linear attention that three of every
//! four Qwen3.5 and Qwen3.6 layers (and Qwen3-Next's) run instead of softmax attention.
//!
//! This is `Qwen3_5GatedDeltaNet` of transformers' `models/qwen3_5/modeling_qwen3_5.py`, one
//! sequence, one token at a time, f32 weights: the oracle that the backends' versions are to be
//! tested against, as [`crate::backend::PlainBackend`] is for the rest of the forward pass. Its
//! own test compares it with transformers' outputs (`fixtures/qwen3_5_layers/gated_delta_net.json`).
//!
//! ## What the layer computes
//!
//! Where attention keeps every past key and value (a cache that grows with the context), a
//! DeltaNet layer keeps, per value head, one `[dk, dv]` matrix `S`: an associative memory that
//! maps keys to values, updated by each token and read by its query. For token `t` with input
//! `x: [hidden]` (shapes for one token; `kh` key heads, `vh` value heads, `vh / kh` value heads
//! share a key head, as GQA shares a KV head):
//!
//! ```text
//! 1. qkv = in_proj_qkv x                  [2 kh dk + vh dv]    q, k, v side by side
//!    z   = in_proj_z x                    [vh dv]              the output gate
//!    b   = in_proj_b x,  a = in_proj_a x  [vh]                 the write strength and the decay
//! 2. qkv = silu(causal_conv1d(qkv))       each channel against its own last K inputs
//! 3. q, k = l2norm(q), l2norm(k) per head;  q /= sqrt(dk)
//! 4. beta = sigmoid(b)                    in (0, 1): how much of the new value to write
//!    g    = -exp(A_log) * softplus(a + dt_bias)    < 0: log of the state's decay
//! 5. per value head (its key head's q and k):
//!    S     = exp(g) S                     forget a little of everything
//!    delta = beta (v - S^T k)             what the memory gets wrong about k's value
//!    S     = S + k delta^T                write the correction (the delta rule)
//!    o     = S^T q                        [dv]: read the memory with the query
//! 6. o = rmsnorm(o) * norm.weight * silu(z)    per value head (`Qwen3_5RMSNormGated`)
//! 7. out = out_proj o                     [hidden]
//! ```
//!
//! The state a sequence carries is `S` for every value head and the convolution's last `K - 1`
//! inputs ([`DeltaNetState`]): a fixed size, whatever the context. Step 5 runs one token by the
//! recurrence and a prompt in chunks of 64 tokens as products of matrices, as transformers does
//! (`kernels/delta_rule.rs`: the two agree to rounding). Steps 2 to 6 are
//! `kernels/delta_net.rs`, which the backends run too.

use crate::kernels::delta_net::{self, DeltaNetShape};
use crate::kernels::textbook::matvec;
use anyhow::{bail, Result};

/// The sizes of a Gated DeltaNet layer, from the config's `linear_*` keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatedDeltaNetConfig {
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `linear_num_key_heads`: query and key heads.
    pub num_k_heads: usize,
    /// `linear_num_value_heads`: value heads, a multiple of the key heads.
    pub num_v_heads: usize,
    /// `linear_key_head_dim`.
    pub head_k_dim: usize,
    /// `linear_value_head_dim`.
    pub head_v_dim: usize,
    /// `linear_conv_kernel_dim`: the causal convolution's width `K`.
    pub conv_kernel: usize,
    /// `rms_norm_eps`, which the gated norm takes.
    pub eps: f32,
}

impl GatedDeltaNetConfig {
    /// `key_dim`: all key heads' sizes together (the queries' too).
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// `value_dim`: all value heads' sizes together.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// `conv_dim`: the channels of the convolution, q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The sizes the kernels take.
    pub fn shape(&self) -> DeltaNetShape {
        DeltaNetShape {
            num_k_heads: self.num_k_heads,
            num_v_heads: self.num_v_heads,
            head_k_dim: self.head_k_dim,
            head_v_dim: self.head_v_dim,
            conv_kernel: self.conv_kernel,
            // transformers' order (the layer's test reads its weights).
            value_heads: crate::format::ValueHeads::Grouped,
        }
    }

    /// Refuses sizes the layer cannot run: value heads that do not share key heads evenly, a
    /// convolution narrower than one input, an empty head.
    pub fn check(&self) -> Result<()> {
        if self.num_k_heads == 0 || !self.num_v_heads.is_multiple_of(self.num_k_heads) {
            bail!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                self.num_v_heads,
                self.num_k_heads
            );
        }
        if self.conv_kernel == 0 || self.head_k_dim == 0 || self.head_v_dim == 0 {
            bail!(
                "linear_conv_kernel_dim, linear_key_head_dim and linear_value_head_dim must be > 0"
            );
        }
        Ok(())
    }
}

/// The weights of one layer (`linear_attn.*` in a checkpoint), row-major f32.
pub struct GatedDeltaNet<'a> {
    pub config: GatedDeltaNetConfig,
    /// `in_proj_qkv.weight`: `[conv_dim, hidden]`.
    pub in_proj_qkv: &'a [f32],
    /// `in_proj_z.weight`: `[value_dim, hidden]`.
    pub in_proj_z: &'a [f32],
    /// `in_proj_b.weight`: `[num_v_heads, hidden]`.
    pub in_proj_b: &'a [f32],
    /// `in_proj_a.weight`: `[num_v_heads, hidden]`.
    pub in_proj_a: &'a [f32],
    /// `conv1d.weight`: `[conv_dim, 1, K]` stored, read as `[conv_dim, K]` (one filter a channel;
    /// no bias).
    pub conv1d: &'a [f32],
    /// `dt_bias`: `[num_v_heads]`.
    pub dt_bias: &'a [f32],
    /// `A_log`: `[num_v_heads]`, the log of each head's decay rate.
    pub a_log: &'a [f32],
    /// `norm.weight`: `[head_v_dim]`, the gated RMSNorm's gain (one for every head).
    pub norm: &'a [f32],
    /// `out_proj.weight`: `[hidden, value_dim]`.
    pub out_proj: &'a [f32],
}

/// What one sequence carries from token to token through one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNetState {
    /// `[conv_dim, K - 1]`: each channel's last `K - 1` convolution inputs, oldest first (zeros
    /// before the first token).
    pub conv: Vec<f32>,
    /// `[num_v_heads, head_k_dim, head_v_dim]`: each value head's memory `S`.
    pub recurrent: Vec<f32>,
    /// Tokens seen: the next token's position (which picks the delta rule's form).
    pub tokens: usize,
}

impl DeltaNetState {
    /// The state before a sequence's first token: all zeros.
    pub fn new(c: &GatedDeltaNetConfig) -> Self {
        DeltaNetState {
            conv: vec![0.0; c.conv_dim() * (c.conv_kernel - 1)],
            recurrent: vec![0.0; c.num_v_heads * c.head_k_dim * c.head_v_dim],
            tokens: 0,
        }
    }
}

impl GatedDeltaNet<'_> {
    /// Checks that every weight has its shape's length.
    pub fn check(&self) -> Result<()> {
        let c = &self.config;
        c.check()?;
        let h = c.hidden_size;
        for (name, len, want) in [
            ("in_proj_qkv", self.in_proj_qkv.len(), c.conv_dim() * h),
            ("in_proj_z", self.in_proj_z.len(), c.value_dim() * h),
            ("in_proj_b", self.in_proj_b.len(), c.num_v_heads * h),
            ("in_proj_a", self.in_proj_a.len(), c.num_v_heads * h),
            ("conv1d", self.conv1d.len(), c.conv_dim() * c.conv_kernel),
            ("dt_bias", self.dt_bias.len(), c.num_v_heads),
            ("A_log", self.a_log.len(), c.num_v_heads),
            ("norm", self.norm.len(), c.head_v_dim),
            ("out_proj", self.out_proj.len(), h * c.value_dim()),
        ] {
            if len != want {
                bail!("linear_attn.{name}: {len} values, expected {want}");
            }
        }
        Ok(())
    }

    /// Runs the tokens `x: [t, hidden]` in order through the layer, from and into `state`;
    /// `out: [t, hidden]`.
    pub fn forward(&self, state: &mut DeltaNetState, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.check()?;
        let c = &self.config;
        let h = c.hidden_size;
        if !x.len().is_multiple_of(h) || out.len() != x.len() {
            bail!(
                "gated delta net: input of {} and output of {} values for hidden size {h}",
                x.len(),
                out.len()
            );
        }
        if state.conv.len() != c.conv_dim() * (c.conv_kernel - 1)
            || state.recurrent.len() != c.num_v_heads * c.head_k_dim * c.head_v_dim
        {
            bail!("gated delta net: a state of another layer's shape");
        }
        let t = x.len() / h;
        let shape = c.shape();
        let (cd, vd, vh) = (c.conv_dim(), c.value_dim(), c.num_v_heads);

        // 1. The projections of every token: qkv: [t, conv_dim], z: [t, value_dim],
        //    b, a: [t, vh].
        let project =
            |w: &[f32]| -> Vec<f32> { x.chunks_exact(h).flat_map(|x| matvec(w, x)).collect() };
        let (mut qkv, z) = (project(self.in_proj_qkv), project(self.in_proj_z));
        let (b, a) = (project(self.in_proj_b), project(self.in_proj_a));
        debug_assert_eq!((qkv.len(), b.len()), (t * cd, t * vh));

        // 2. The causal convolution over each channel's last K inputs, then SiLU.
        delta_net::causal_conv_silu(&mut qkv, &mut state.conv, self.conv1d, shape);

        // 3-5. Unit q and k, beta and g, then each value head's memory over the tokens: whole
        //      chunks of 64 positions in the chunked form, other tokens by the recurrence.
        let mut o = vec![0.0f32; t * vd];
        delta_net::gated_delta_rule(
            &mut o,
            &qkv,
            &a,
            &b,
            self.a_log,
            self.dt_bias,
            &mut state.recurrent,
            state.tokens,
            shape,
        );
        state.tokens += t;

        // 6. The gated RMSNorm, per value head: normalise, scale by the gain, gate by silu(z).
        delta_net::gated_rmsnorm(&mut o, &z, self.norm, c.eps);

        // 7. Back to the residual stream.
        for (o, out) in o.chunks_exact(vd).zip(out.chunks_exact_mut(h)) {
            out.copy_from_slice(&matvec(self.out_proj, o));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::reference_json::{floats, max_rel_diff, read};
    use serde_json::Value;

    fn config(r: &Value) -> GatedDeltaNetConfig {
        let c = &r["config"];
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        GatedDeltaNetConfig {
            hidden_size: n("hidden_size"),
            num_k_heads: n("linear_num_key_heads"),
            num_v_heads: n("linear_num_value_heads"),
            head_k_dim: n("linear_key_head_dim"),
            head_v_dim: n("linear_value_head_dim"),
            conv_kernel: n("linear_conv_kernel_dim"),
            eps: c["rms_norm_eps"].as_f64().unwrap() as f32,
        }
    }

    /// transformers' conv state keeps the last K inputs, this one the last K - 1.
    fn last_inputs(hf: &[f32], c: &GatedDeltaNetConfig) -> Vec<f32> {
        let k = c.conv_kernel;
        hf.chunks_exact(k).flat_map(|ch| ch[1..].to_vec()).collect()
    }

    /// The 70-token prompt in one call (the chunked rule: a chunk of 64 and one of 6) and the
    /// decoded tokens one call each (the recurrence) give transformers' outputs (computed the
    /// same two ways), and the states it keeps after the prompt and at the end.
    #[test]
    fn matches_transformers() {
        let r = read("qwen3_5_layers/gated_delta_net.json");
        let c = config(&r);
        let w = |name: &str| floats(&r["weights"][name]["values"]);
        let weights = [
            "in_proj_qkv.weight",
            "in_proj_z.weight",
            "in_proj_b.weight",
            "in_proj_a.weight",
            "conv1d.weight",
            "dt_bias",
            "A_log",
            "norm.weight",
            "out_proj.weight",
        ]
        .map(w);
        let layer = GatedDeltaNet {
            config: c,
            in_proj_qkv: &weights[0],
            in_proj_z: &weights[1],
            in_proj_b: &weights[2],
            in_proj_a: &weights[3],
            conv1d: &weights[4],
            dt_bias: &weights[5],
            a_log: &weights[6],
            norm: &weights[7],
            out_proj: &weights[8],
        };
        let (x, want) = (floats(&r["input"]), floats(&r["output"]));
        let prompt = r["prompt_tokens"].as_u64().unwrap() as usize;
        let h = c.hidden_size;
        let mut state = DeltaNetState::new(&c);
        let mut out = vec![f32::NAN; x.len()];
        layer
            .forward(&mut state, &x[..prompt * h], &mut out[..prompt * h])
            .unwrap();
        let d = max_rel_diff(
            &state.recurrent,
            &floats(&r["recurrent_state_after_prompt"]),
        );
        assert!(d < 1e-5, "recurrent state after the prompt: {d}");
        let hf_conv = last_inputs(&floats(&r["conv_state_after_prompt"]), &c);
        let d = max_rel_diff(&state.conv, &hf_conv);
        assert!(d < 1e-5, "conv state after the prompt: {d}");
        for t in prompt..x.len() / h {
            let (x_t, out_t) = (&x[t * h..(t + 1) * h], &mut out[t * h..(t + 1) * h]);
            layer.forward(&mut state, x_t, out_t).unwrap();
        }
        let d = max_rel_diff(&out, &want);
        assert!(d < 1e-5, "outputs: {d}");
        let d = max_rel_diff(&state.recurrent, &floats(&r["recurrent_state"]));
        assert!(d < 1e-5, "recurrent state: {d}");
        let d = max_rel_diff(&state.conv, &last_inputs(&floats(&r["conv_state"]), &c));
        assert!(d < 1e-5, "conv state: {d}");

        // The test can fail: without the decay (g = 0) the outputs move.
        let no_decay = vec![f32::NEG_INFINITY; c.num_v_heads];
        let forgetless = GatedDeltaNet {
            a_log: &no_decay,
            ..layer
        };
        let mut state = DeltaNetState::new(&c);
        let mut other = vec![0.0; x.len()];
        forgetless.forward(&mut state, &x, &mut other).unwrap();
        assert!(max_rel_diff(&other, &want) > 1e-2);
    }

    /// Shapes that do not fit are errors that name them.
    #[test]
    fn bad_shapes_are_errors() {
        let c = GatedDeltaNetConfig {
            hidden_size: 4,
            num_k_heads: 2,
            num_v_heads: 3,
            head_k_dim: 2,
            head_v_dim: 2,
            conv_kernel: 4,
            eps: 1e-6,
        };
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("multiple of linear_num_key_heads"), "{e}");
    }
}
