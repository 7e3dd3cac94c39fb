//! The steps of a Gated DeltaNet layer between its projections (steps 2 to 6 of
//! `model/gated_delta_net.rs`, which explains them), for one sequence's run of tokens, in plain
//! loops over host slices: the causal convolution with its window of past inputs
//! ([`causal_conv_silu`]), the gated delta rule with its memory ([`gated_delta_rule`]), and the
//! gated RMSNorm of the output ([`gated_rmsnorm`]). The backends run these; the textbook layer
//! (`model/gated_delta_net.rs`) runs them too, and its test holds them to transformers'.

use super::delta_rule::{self, HeadInputs};
use super::textbook::{inv_rms, sigmoid, silu};
use crate::format::ValueHeads;

/// The sizes of a Gated DeltaNet, from the config's `linear_*` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
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
    /// The value heads' order, which decides the key head each reads ([`Self::key_head`]).
    pub value_heads: ValueHeads,
}

impl DeltaNetShape {
    /// All key heads' sizes together (the queries' too).
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// All value heads' sizes together.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// The convolution's channels: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The key head value head `h` reads: its group's (`h / (vh / kh)`) in HF's order, `h % kh`
    /// in a GGUF's ([`ValueHeads`]).
    pub fn key_head(&self, h: usize) -> usize {
        match self.value_heads {
            ValueHeads::Grouped => h / (self.num_v_heads / self.num_k_heads),
            ValueHeads::Tiled => h % self.num_k_heads,
        }
    }

    /// Values of the convolution's window, `[conv_dim, K - 1]`.
    pub fn conv_state_len(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1)
    }

    /// Values of the memory, `[num_v_heads, head_k_dim, head_v_dim]`.
    pub fn recurrent_state_len(&self) -> usize {
        self.num_v_heads * self.head_k_dim * self.head_v_dim
    }
}

/// Step 2: each channel's causal convolution over its last `K` inputs, then SiLU, in place, for
/// the tokens `x: [n, conv_dim]` in order. `w: [conv_dim, K]`; `window: [conv_dim, K - 1]` holds
/// each channel's last `K - 1` inputs, oldest first (zeros before a sequence's first token), and
/// is moved along by `n`.
pub fn causal_conv_silu(x: &mut [f32], window: &mut [f32], w: &[f32], s: DeltaNetShape) {
    let (cd, k) = (s.conv_dim(), s.conv_kernel);
    for token in x.chunks_exact_mut(cd) {
        for (ch, v) in token.iter_mut().enumerate() {
            let w = &w[ch * k..(ch + 1) * k];
            let kept = &mut window[ch * (k - 1)..(ch + 1) * (k - 1)];
            // y = w[K-1] x_t + sum_j w[j] x_(t-K+1+j): the newest input takes the last tap.
            let mut y = w[k - 1] * *v;
            for (j, &p) in kept.iter().enumerate() {
                y += w[j] * p;
            }
            if k > 1 {
                kept.rotate_left(1);
                kept[k - 2] = *v;
            }
            *v = silu(y);
        }
    }
}

/// Steps 3 to 5 for the tokens of one sequence, in order, the first at position `pos0`: from
/// the convolved `qkv: [n, conv_dim]` and the raw `a`, `b: [n, num_v_heads]`, each value head's
/// memory in `state: [vh, dk, dv]` is updated and read; `o: [n, value_dim]`.
///
/// Which form runs each token depends on its position alone, not on how a prompt was cut into
/// steps: the tokens of a whole chunk of [`delta_rule::CHUNK`] positions (from a multiple of
/// it) that this call holds run the chunked form, as transformers runs a prompt's chunks; every
/// other token runs the recurrence, as transformers runs a decoded token. A serving engine that
/// cuts prompts at multiples of the chunk then computes every token the same way alone or beside
/// others (`engine/mod.rs`).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    o: &mut [f32],
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    pos0: usize,
    s: DeltaNetShape,
) {
    let (dk, dv, vh) = (s.head_k_dim, s.head_v_dim, s.num_v_heads);
    let (kd, vd, cd) = (s.key_dim(), s.value_dim(), s.conv_dim());
    let n = qkv.len() / cd;
    // 3. Unit-length queries and keys per head (FLA's l2norm, eps inside the root), queries
    //    scaled by 1 / sqrt(dk) as attention's are.
    // 4. Each value head's write strength and decay.
    let scale = 1.0 / (dk as f32).sqrt();
    let (mut q, mut k) = (vec![0.0f32; n * kd], vec![0.0f32; n * kd]);
    let (mut beta, mut g) = (vec![0.0f32; n * vh], vec![0.0f32; n * vh]);
    for i in 0..n {
        let row = &qkv[i * cd..(i + 1) * cd];
        q[i * kd..(i + 1) * kd].copy_from_slice(&row[..kd]);
        k[i * kd..(i + 1) * kd].copy_from_slice(&row[kd..2 * kd]);
        for (qh, kh) in q[i * kd..(i + 1) * kd]
            .chunks_exact_mut(dk)
            .zip(k[i * kd..(i + 1) * kd].chunks_exact_mut(dk))
        {
            l2norm(qh);
            l2norm(kh);
            qh.iter_mut().for_each(|x| *x *= scale);
        }
        for h in 0..vh {
            let (gh, bh) = decay_and_strength(a[i * vh + h], b[i * vh + h], a_log[h], dt_bias[h]);
            (g[i * vh + h], beta[i * vh + h]) = (gh, bh);
        }
    }

    let runs = runs_by_form(pos0, n);

    // 5. Each value head's memory over the tokens, reading its key head's q and k (value heads
    //    share key heads as GQA's query heads share KV heads).
    let column = |m: &[f32], width: usize, at: usize, len: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|i| m[i * width + at * len..i * width + (at + 1) * len].to_vec())
            .collect()
    };
    let c = delta_rule::CHUNK;
    for h in 0..vh {
        let kh = s.key_head(h);
        let (qh, khs) = (column(&q, kd, kh, dk), column(&k, kd, kh, dk));
        let vhs: Vec<f32> = (0..n)
            .flat_map(|i| qkv[i * cd + 2 * kd + h * dv..i * cd + 2 * kd + (h + 1) * dv].to_vec())
            .collect();
        let (gh, bh) = (column(&g, vh, h, 1), column(&beta, vh, h, 1));
        let sh = &mut state[h * dk * dv..(h + 1) * dk * dv];
        let mut oh = vec![0.0f32; n * dv];
        for &(first, end, whole) in &runs {
            let head = HeadInputs {
                q: &qh[first * dk..end * dk],
                k: &khs[first * dk..end * dk],
                v: &vhs[first * dv..end * dv],
                g: &gh[first..end],
                beta: &bh[first..end],
            };
            let out = &mut oh[first * dv..end * dv];
            match whole {
                true => delta_rule::chunked(&head, sh, out, c),
                false => delta_rule::recurrent(&head, sh, out),
            }
        }
        for i in 0..n {
            o[i * vd + h * dv..i * vd + (h + 1) * dv].copy_from_slice(&oh[i * dv..(i + 1) * dv]);
        }
    }
}

/// The tokens `0..n` of a call whose first is at position `pos0`, cut into runs by the form that
/// computes them: `(first, end, chunked)`, the chunked runs being whole chunks of
/// [`delta_rule::CHUNK`] that start at a multiple of it ([`gated_delta_rule`] says why).
pub(crate) fn runs_by_form(pos0: usize, n: usize) -> Vec<(usize, usize, bool)> {
    let c = delta_rule::CHUNK;
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let whole = (pos0 + i).is_multiple_of(c) && i + c <= n;
        let end = match whole {
            true => i + c,
            // Up to the next whole chunk's start, or the end.
            false => (i + 1..n)
                .find(|&j| (pos0 + j).is_multiple_of(c) && j + c <= n)
                .unwrap_or(n),
        };
        runs.push((i, end, whole));
        i = end;
    }
    runs
}

/// Step 6, `Qwen3_5RMSNormGated`: each row of `dv` values of `o` normalised, scaled by `w`, then
/// gated by `silu(z)`, in place: `o = (w * (o / rms(o))) * silu(z)`. o, z: `[rows, dv]`.
pub fn gated_rmsnorm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let dv = w.len();
    for (oh, zh) in o.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
        let inv = inv_rms(oh, eps);
        for ((x, &wi), &zi) in oh.iter_mut().zip(w).zip(zh) {
            *x = wi * (*x * inv) * silu(zi);
        }
    }
}

/// Step 4 for one token and value head, from its raw `a` and `b`: the log of its decay, `g =
/// -exp(A_log) softplus(a + dt_bias)`, and its write strength, `beta = sigmoid(b)`.
pub(crate) fn decay_and_strength(a: f32, b: f32, a_log: f32, dt_bias: f32) -> (f32, f32) {
    (-a_log.exp() * softplus(a + dt_bias), sigmoid(b))
}

/// `log(1 + e^x)`, as torch's `F.softplus` computes it (the input itself above 20, where the
/// two agree to f32's precision).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x / sqrt(sum(x^2) + 1e-6)` (transformers' `l2norm`, FLA's convention).
pub(crate) fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}
