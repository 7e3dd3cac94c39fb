//! The vision tower of Qwen3-VL and Qwen3.5, in its textbook form: transformers'
//! `Qwen3VLVisionModel` (`Qwen3_5VisionModel` is the same without DeepStack), step by step, in
//! plain loops over f32 values with f64 sums.
//!
//! ```text
//! patches [N, 3*T*p*p]                      (N patches of one or more images, processor.rs)
//!  1. patch_embed: x = patches W^T + b      [N, D]   (a Conv3d whose stride is its kernel)
//!  2. x += pos_embed, bilinear from its learned sqrt(P) x sqrt(P) grid to each image's grid
//!  3. each block:  x += proj(attention(LN1(x)))   bidirectional, within one image's frame,
//!                                                 2-D RoPE (row, column) on q and k
//!                  x += fc2(gelu_tanh(fc1(LN2(x))))
//!                  after the blocks DeepStack lists: a merger's output kept (Qwen3-VL)
//!  4. merger: LN(x), every 2x2 patches side by side [N/4, 4D], fc2(gelu(fc1(.)))  [N/4, E]
//! ```
//! The merged rows (E = the language model's width) replace the prompt's `<|image_pad|>`
//! tokens; Qwen3-VL adds each DeepStack feature to the hidden states of the first text layers.

use anyhow::{anyhow, bail, ensure, Result};

use super::processor::merge_order;

mod fast;
mod matrix;

pub use matrix::Matrix;

/// How the tower computes. `Plain` is the textbook form in this file: loops over f32 values with
/// f64 sums, the reference. `Fast` runs the same steps with every product on the matmul kernels
/// (SIMD, all threads) and attention within an image as two products per head, in f32
/// (`tower/fast.rs`); it is tested against `Plain` and against transformers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    Plain,
    Fast,
}
use crate::format::config::TOWER_PREFIX;
use crate::format::ModelFile;
/// The tower's shape: data of the model file's header (format/config/vision.rs).
pub use crate::format::VisionConfig;
use crate::kernels;

/// `y = x W^T + b`, W stored [out, in] as transformers' `nn.Linear` stores it, in the file's
/// dtype.
#[derive(Clone, Debug)]
struct Linear {
    weight: Matrix,
    bias: Vec<f32>,
    out: usize,
    inp: usize,
}

impl Linear {
    /// `x` [n, in] -> [n, out], as `math` says.
    fn apply(&self, x: &[f32], math: Math) -> Vec<f32> {
        let mut y = Vec::new();
        self.apply_into(x, &mut y, math);
        y
    }

    /// [`Linear::apply`] into `y`, resized to [n, out] (its memory kept from a step before).
    fn apply_into(&self, x: &[f32], y: &mut Vec<f32>, math: Math) {
        y.resize(x.len() / self.inp * self.out, 0.0);
        match math {
            Math::Plain => self.forward(x, y),
            Math::Fast => fast::linear(self, x, y),
        }
    }

    /// `x` [n, in] -> `y` [n, out], each sum in f64 over the weights' values (a quantized
    /// weight read as the value it stands for).
    fn forward(&self, x: &[f32], y: &mut [f32]) {
        let shape = [self.out as u64, self.inp as u64];
        let w = self.weight.view(&shape);
        for (xi, yi) in x.chunks_exact(self.inp).zip(y.chunks_exact_mut(self.out)) {
            for (o, (yo, b)) in yi.iter_mut().zip(&self.bias).enumerate() {
                let dot: f64 = xi
                    .iter()
                    .enumerate()
                    .map(|(k, &a)| a as f64 * crate::backend::weight(&w, o * self.inp + k) as f64)
                    .sum();
                *yo = (dot + *b as f64) as f32;
            }
        }
    }
}

/// `nn.LayerNorm(width, eps=1e-6)`: `(x - mean) / sqrt(var + eps) * w + b` over each row.
#[derive(Clone, Debug)]
struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl LayerNorm {
    /// The tower's blocks and mergers make their norms with `eps=1e-6` in transformers' code
    /// (`Qwen3VLVisionBlock`, `Qwen3VLVisionPatchMerger`, and Qwen3.5's the same), not from the
    /// config.
    const EPS: f64 = 1e-6;

    /// Every row of `x`: in f64 with `Math::Plain`; with `Math::Fast` on all threads, in f32
    /// on the kernels ([`kernels::layer_norm`], its sums in lanes).
    fn forward(&self, x: &[f32], math: Math) -> Vec<f32> {
        let mut y = Vec::new();
        self.forward_into(x, &mut y, math);
        y
    }

    /// [`LayerNorm::forward`] into `y`, resized to `x`'s length.
    fn forward_into(&self, x: &[f32], y: &mut Vec<f32>, math: Math) {
        let width = self.weight.len();
        y.resize(x.len(), 0.0);
        match math {
            Math::Plain => x
                .chunks_exact(width)
                .zip(y.chunks_exact_mut(width))
                .for_each(|(xi, yi)| self.row(xi, yi)),
            Math::Fast => fast::rows(x, y, width, |xi, yi| {
                kernels::layer_norm(yi, xi, &self.weight, &self.bias, Self::EPS as f32)
            }),
        }
    }

    fn row(&self, xi: &[f32], yi: &mut [f32]) {
        let width = self.weight.len();
        let mean = xi.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
        let var = xi.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / width as f64;
        let inv = 1.0 / (var + Self::EPS).sqrt();
        for (j, (o, &v)) in yi.iter_mut().zip(xi).enumerate() {
            *o = ((v as f64 - mean) * inv * self.weight[j] as f64 + self.bias[j] as f64) as f32;
        }
    }
}

/// A block's intermediate values, kept from block to block of one pass: made anew in each
/// step, an output this large is fresh pages from the kernel every time (about a million page
/// faults for a 1024 x 768 image: docs/vision.md, "Not done yet").
#[derive(Default)]
struct BlockBuffers {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    y: Vec<f32>,
    h: Vec<f32>,
    attention: kernels::FrameScratch,
}

/// One `Qwen3VLVisionBlock`: pre-norm attention and MLP, each added to the stream.
#[derive(Clone, Debug)]
struct VisionBlock {
    norm1: LayerNorm,
    norm2: LayerNorm,
    /// `attn.qkv` [3D, D] and `attn.proj` [D, D].
    qkv: Linear,
    proj: Linear,
    /// `mlp.linear_fc1` [I, D] and `mlp.linear_fc2` [D, I].
    fc1: Linear,
    fc2: Linear,
}

/// `Qwen3VLVisionPatchMerger`: 2x2 neighbouring patches (consecutive rows, processor.rs's order)
/// side by side, then an MLP to the language model's width. The final merger normalises each
/// patch before the concatenation (a norm D wide); DeepStack's (`use_postshuffle_norm`) the
/// concatenation (4D wide). [N, D] read as [N/4, 4D] is the concatenation, so both are the same
/// code over rows of the norm's width.
#[derive(Clone, Debug)]
struct PatchMerger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl PatchMerger {
    /// `x` [N, D] -> [N/4, E].
    fn forward(&self, x: &[f32], math: Math) -> Vec<f32> {
        let h = self.norm.forward(x, math);
        let mut h = self.fc1.apply(&h, math);
        match math {
            Math::Plain => h.iter_mut().for_each(|v| *v = gelu_erf(*v)),
            // The same function on all threads: one f64 erf a value, the slowest step left on
            // one thread while the other waited (8% of a two-thread 448 x 448 encoding).
            Math::Fast => fast::each(&mut h, gelu_erf),
        }
        self.fc2.apply(&h, math)
    }
}

/// What the tower gives for a batch of images.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionOutput {
    /// [patches / merge^2, out_hidden_size]: the vectors that replace the image's tokens.
    pub merged: Vec<f32>,
    /// One [patches / merge^2, out_hidden_size] per DeepStack block (Qwen3-VL; empty for Qwen3.5).
    pub deepstack: Vec<Vec<f32>>,
}

/// The tower's weights, f32.
#[derive(Clone, Debug)]
pub struct VisionTower {
    pub config: VisionConfig,
    /// `patch_embed.proj`: the Conv3d's [D, 3, T, p, p] kernel read as [D, 3*T*p*p].
    patch_embed: Linear,
    /// `pos_embed.weight` [P, D].
    pos_embed: Vec<f32>,
    blocks: Vec<VisionBlock>,
    merger: PatchMerger,
    deepstack: Vec<PatchMerger>,
}

impl VisionTower {
    /// Builds the tower from its tensors: `tensor(name, shape)` returns the tensor of that name
    /// (transformers' names inside the tower: `blocks.0.attn.qkv.weight`; the caller adds the
    /// checkpoint's prefix), its shape checked: the matrices are kept as they come, the vectors
    /// (biases, norms, the position table) read as f32.
    pub fn load(
        config: VisionConfig,
        mut tensor: impl FnMut(&str, &[usize]) -> Result<Matrix>,
    ) -> Result<VisionTower> {
        let t: &mut Tensors = &mut tensor;
        let (d, i, e) = (
            config.hidden_size,
            config.intermediate_size,
            config.out_hidden_size,
        );
        let (c, tp, p) = (
            config.in_channels,
            config.temporal_patch_size,
            config.patch_size,
        );
        let patch_embed = Linear {
            weight: t("patch_embed.proj.weight", &[d, c, tp, p, p])?,
            bias: vector(t, "patch_embed.proj.bias", &[d])?,
            out: d,
            inp: config.patch_len(),
        };
        let pos_embed = vector(t, "pos_embed.weight", &[config.num_position_embeddings, d])?;
        let mut blocks = Vec::with_capacity(config.depth);
        for l in 0..config.depth {
            let b = format!("blocks.{l}");
            blocks.push(VisionBlock {
                norm1: layer_norm(t, &format!("{b}.norm1"), d)?,
                norm2: layer_norm(t, &format!("{b}.norm2"), d)?,
                qkv: linear(t, &format!("{b}.attn.qkv"), 3 * d, d)?,
                proj: linear(t, &format!("{b}.attn.proj"), d, d)?,
                fc1: linear(t, &format!("{b}.mlp.linear_fc1"), i, d)?,
                fc2: linear(t, &format!("{b}.mlp.linear_fc2"), d, i)?,
            });
        }
        let m4 = d * config.spatial_merge_size * config.spatial_merge_size;
        let mut merger = |name: &str, norm_width: usize| -> Result<PatchMerger> {
            Ok(PatchMerger {
                norm: layer_norm(t, &format!("{name}.norm"), norm_width)?,
                fc1: linear(t, &format!("{name}.linear_fc1"), m4, m4)?,
                fc2: linear(t, &format!("{name}.linear_fc2"), e, m4)?,
            })
        };
        let deepstack = (0..config.deepstack_visual_indexes.len())
            .map(|j| merger(&format!("deepstack_merger_list.{j}"), m4))
            .collect::<Result<Vec<_>>>()?;
        let merger = merger("merger", d)?;
        Ok(VisionTower {
            config,
            patch_embed,
            pos_embed,
            blocks,
            merger,
            deepstack,
        })
    }

    /// The tower a model file carries (format version 8: `vision` in its config, the tensors
    /// `model.visual.*`), its matrices copied in their dtype; `None` for a text-only file.
    pub fn from_file(file: &ModelFile) -> Result<Option<VisionTower>> {
        let Some(vision) = &file.config().vision else {
            return Ok(None);
        };
        VisionTower::load(vision.tower.clone(), |name, shape| {
            let t = file.tensor(&format!("{TOWER_PREFIX}{name}"))?;
            // The reader checked each tensor's shape against the config's; the patch
            // embedding's kernel is stored flat ([D, 3*T*p*p]), so only the counts are compared.
            let n: usize = shape.iter().product();
            let have: u64 = t.shape.iter().product();
            ensure!(
                have == n as u64,
                "{TOWER_PREFIX}{name}: {have} values, the tower needs {n}"
            );
            Ok(Matrix::copy_of(&t))
        })
        .map(Some)
    }

    /// Runs the tower over the patches of `grids.len()` images (each `(t, h, w)` in patches, as
    /// the processor gives them, their patches one after the other).
    pub fn forward(&self, patches: &[f32], grids: &[[usize; 3]]) -> Result<VisionOutput> {
        self.forward_with(patches, grids, Math::Plain)
    }

    /// [`VisionTower::forward`] computed as `math` says.
    pub fn forward_with(
        &self,
        patches: &[f32],
        grids: &[[usize; 3]],
        math: Math,
    ) -> Result<VisionOutput> {
        let cfg = &self.config;
        let (d, m) = (cfg.hidden_size, cfg.spatial_merge_size);
        // Patches in all: each grid's t * h * w, checked, as they come from a request.
        let n = grids.iter().try_fold(0usize, |n, g| {
            g[0].checked_mul(g[1])
                .and_then(|v| v.checked_mul(g[2]))
                .and_then(|v| v.checked_add(n))
        });
        let n = n.ok_or_else(|| anyhow!("the grids {grids:?} overflow"))?;
        ensure!(
            n.checked_mul(cfg.patch_len()) == Some(patches.len()),
            "{} values are not the {n} patches of {} values the grids {grids:?} need",
            patches.len(),
            cfg.patch_len()
        );
        if let Some(g) = grids.iter().find(|g| g[1] % m != 0 || g[2] % m != 0) {
            bail!(
                "a grid of {}x{} patches is not whole {m}x{m} blocks",
                g[1],
                g[2]
            );
        }
        // 1. Patch embedding: the Conv3d's kernel covers the whole patch, so it is one product.
        let mut x = self.patch_embed.apply(patches, math);
        // 2. Per frame of each image: its patches' (row, column), for the rotary embedding; the
        //    learned positions resampled to its grid, added; its range of patches, within which
        //    attention stays.
        let (mut rows_cols, mut frames) = (Vec::with_capacity(n), Vec::new());
        for &[t, h, w] in grids {
            for _frame in 0..t {
                let first = rows_cols.len();
                for i in 0..h * w {
                    let (row, col) = merge_order(i, w, m);
                    let pos = self.position_embedding(row, col, h, w);
                    let p = first + i;
                    x[p * d..(p + 1) * d]
                        .iter_mut()
                        .zip(pos)
                        .for_each(|(v, e)| *v += e);
                    rows_cols.push((row, col));
                }
                frames.push(first..rows_cols.len());
            }
        }
        let (cos, sin) = self.rotary(&rows_cols);
        // 3. The blocks.
        let mut deepstack = Vec::new();
        let mut buffers = BlockBuffers::default();
        for (l, block) in self.blocks.iter().enumerate() {
            self.block(block, &mut x, &frames, (&cos, &sin), math, &mut buffers);
            if let Some(j) = cfg.deepstack_visual_indexes.iter().position(|&b| b == l) {
                deepstack.push(self.deepstack[j].forward(&x, math));
            }
        }
        // 4. The merger.
        Ok(VisionOutput {
            merged: self.merger.forward(&x, math),
            deepstack,
        })
    }
}

/// A tensor source: `(name, shape) -> tensor` (see [`VisionTower::load`]).
type Tensors<'a> = dyn FnMut(&str, &[usize]) -> Result<Matrix> + 'a;

/// A vector's (or the position table's) f32 values.
fn vector(t: &mut Tensors, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let n = shape.iter().product();
    Ok(t(name, shape)?.into_f32(n))
}

/// An `nn.Linear(inp, out)`'s weight [out, inp] and bias [out].
fn linear(t: &mut Tensors, name: &str, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear {
        weight: t(&format!("{name}.weight"), &[out, inp])?,
        bias: vector(t, &format!("{name}.bias"), &[out])?,
        out,
        inp,
    })
}

/// An `nn.LayerNorm(width)`'s weight and bias.
fn layer_norm(t: &mut Tensors, name: &str, width: usize) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: vector(t, &format!("{name}.weight"), &[width])?,
        bias: vector(t, &format!("{name}.bias"), &[width])?,
    })
}

impl VisionTower {
    /// The learned position of the patch at (`row`, `col`) of an `h x w` grid: the table's
    /// S x S grid resampled bilinearly with the corners aligned (`F.interpolate(...,
    /// mode="bilinear", align_corners=True)`), in f32 as transformers' gather computes it
    /// (`get_vision_interpolation_indices_and_weights`):
    /// ```text
    /// src = index * (S - 1) / max(size - 1, 1);  taps floor(src), floor(src) + 1 (clamped to S - 1)
    /// weight of a tap = max(0, 1 - |src - tap|);  pos = sum over the 2 x 2 taps of w_row w_col E[tap]
    /// ```
    fn position_embedding(&self, row: usize, col: usize, h: usize, w: usize) -> Vec<f32> {
        let side = self.config.position_grid_side();
        let axis = |index: usize, size: usize| -> [(usize, f32); 2] {
            let src = (index as f32 * (side - 1) as f32) / size.saturating_sub(1).max(1) as f32;
            let floor = src.floor();
            [0usize, 1].map(|o| {
                let tap = (floor as usize + o).min(side - 1);
                (tap, (1.0 - (src - floor - o as f32).abs()).max(0.0))
            })
        };
        let d = self.config.hidden_size;
        let mut out = vec![0f32; d];
        for (ht, hw) in axis(row, h) {
            for (wt, ww) in axis(col, w) {
                let weight = hw * ww;
                let e = &self.pos_embed[(ht * side + wt) * d..][..d];
                out.iter_mut().zip(e).for_each(|(o, &v)| *o += v * weight);
            }
        }
        out
    }

    /// The 2-D rotary embedding's cos and sin per patch, [N, head_dim] each
    /// (`Qwen3VLVisionRotaryEmbedding`): a quarter of the head's frequencies turn with the row,
    /// a quarter with the column, and the halves of the head repeat them, as RoPE's
    /// rotate-half pairs (j, j + head_dim/2) need:
    /// ```text
    /// inv[j] = 1 / theta^(2j / (hd/2)),  j < hd/4
    /// angles = [row * inv, col * inv, row * inv, col * inv]       (hd values)
    /// ```
    fn rotary(&self, rows_cols: &[(usize, usize)]) -> (Vec<f32>, Vec<f32>) {
        let hd = self.config.head_dim();
        let spatial = hd / 2;
        let theta = self.config.rope_theta as f32;
        let inv: Vec<f32> = (0..spatial / 2)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / spatial as f32))
            .collect();
        let (mut cos, mut sin) = (
            Vec::with_capacity(rows_cols.len() * hd),
            Vec::with_capacity(rows_cols.len() * hd),
        );
        for &(row, col) in rows_cols {
            let angles: Vec<f32> = inv
                .iter()
                .map(|&f| row as f32 * f)
                .chain(inv.iter().map(|&f| col as f32 * f))
                .collect();
            for _half in 0..2 {
                cos.extend(angles.iter().map(|&a| (a as f64).cos() as f32));
                sin.extend(angles.iter().map(|&a| (a as f64).sin() as f32));
            }
        }
        (cos, sin)
    }

    /// One block over `x` [N, D], in place. `frames`: the patch ranges attention stays within.
    fn block(
        &self,
        b: &VisionBlock,
        x: &mut [f32],
        frames: &[std::ops::Range<usize>],
        (cos, sin): (&[f32], &[f32]),
        math: Math,
        buffers: &mut BlockBuffers,
    ) {
        let (d, heads, hd) = (
            self.config.hidden_size,
            self.config.num_heads,
            self.config.head_dim(),
        );
        let n = x.len() / d;
        // a. q, k, v [N, D] each (head after head), from one product [N, 3D]; b. RoPE on q and
        //    k (`rope`). Patch by patch, on all threads with `Math::Fast` (each patch's values
        //    are the same either way).
        let BlockBuffers {
            normed,
            qkv,
            q,
            k,
            v,
            o,
            y,
            h,
            attention,
        } = buffers;
        b.norm1.forward_into(x, normed, math);
        b.qkv.apply_into(normed, qkv, math);
        for buf in [&mut *q, &mut *k, &mut *v, &mut *o] {
            buf.clear();
            buf.resize(n * d, 0.0);
        }
        let qkv = &*qkv;
        let split = |p: usize, qp: &mut [f32], kp: &mut [f32], vp: &mut [f32]| {
            let src = &qkv[p * 3 * d..(p + 1) * 3 * d];
            qp.copy_from_slice(&src[..d]);
            kp.copy_from_slice(&src[d..2 * d]);
            vp.copy_from_slice(&src[2 * d..]);
            let (c, s) = (&cos[p * hd..(p + 1) * hd], &sin[p * hd..(p + 1) * hd]);
            for head in qp.chunks_exact_mut(hd).chain(kp.chunks_exact_mut(hd)) {
                rope(head, c, s);
            }
        };
        match math {
            Math::Plain => {
                let rows = q.chunks_exact_mut(d).zip(k.chunks_exact_mut(d));
                for (p, ((qp, kp), vp)) in rows.zip(v.chunks_exact_mut(d)).enumerate() {
                    split(p, qp, kp, vp);
                }
            }
            Math::Fast => fast::patches(q, k, v, d, split),
        }
        // c. Attention within each frame, every patch seeing every other (not causal):
        //    softmax(q k^T / sqrt(hd)) v, per head.
        let scale = (hd as f64).powf(-0.5) as f32;
        if math == Math::Fast {
            fast::attention(q, k, v, o, frames, heads, hd, scale, attention);
        }
        for frame in frames.iter().filter(|_| math == Math::Plain) {
            for head in 0..heads {
                let col = head * hd..(head + 1) * hd;
                for i in frame.clone() {
                    let qi = &q[i * d..][col.clone()];
                    let scores: Vec<f32> = frame
                        .clone()
                        .map(|j| {
                            let kj = &k[j * d..][col.clone()];
                            (qi.iter()
                                .zip(kj)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>() as f32)
                                * scale
                        })
                        .collect();
                    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let e: Vec<f64> = scores.iter().map(|&s| ((s - max) as f64).exp()).collect();
                    let total: f64 = e.iter().sum();
                    let oi = &mut o[i * d..][col.clone()];
                    for (c, out) in oi.iter_mut().enumerate() {
                        let mut acc = 0f64;
                        for (pj, j) in e.iter().zip(frame.clone()) {
                            acc += (pj / total) * v[j * d + head * hd + c] as f64;
                        }
                        *out = acc as f32;
                    }
                }
            }
        }
        // d. x += proj(o); then the MLP: x += fc2(gelu_tanh(fc1(LN2(x)))).
        b.proj.apply_into(o, y, math);
        add(x, y, math);
        b.norm2.forward_into(x, normed, math);
        b.fc1.apply_into(normed, h, math);
        match math {
            Math::Plain => h.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
            Math::Fast => fast::gelu_tanh(h),
        }
        b.fc2.apply_into(h, y, math);
        add(x, y, math);
    }
}

/// RoPE on one head in place, `x cos + rotate_half(x) sin` with `rotate_half(x) = (-x2, x1)`
/// (x1, x2 the head's halves): each pair (x1[j], x2[j]) becomes
/// `(x1 cos[j] - x2 sin[j], x2 cos[j + hd/2] + x1 sin[j + hd/2])`.
fn rope(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    debug_assert!(
        head.len().is_multiple_of(2),
        "a head of odd width has no halves"
    );
    let half = head.len() / 2;
    let (x1, x2) = head.split_at_mut(half);
    for (j, (a, b)) in x1.iter_mut().zip(x2.iter_mut()).enumerate() {
        let (v1, v2) = (*a, *b);
        *a = v1 * cos[j] + -v2 * sin[j];
        *b = v2 * cos[half + j] + v1 * sin[half + j];
    }
}

/// `x += y`, value by value (on all threads with `Math::Fast`: the same sums either way).
fn add(x: &mut [f32], y: &[f32], math: Math) {
    match math {
        Math::Plain => x.iter_mut().zip(y).for_each(|(a, b)| *a += b),
        Math::Fast => fast::add(x, y),
    }
}

/// GELU with tanh (`gelu_pytorch_tanh`): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// GELU as `nn.GELU()` computes it: 0.5 x (1 + erf(x / sqrt(2))).
fn gelu_erf(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// The error function to about 1e-15: its Maclaurin series below |x| = 2.5 (alternating terms
/// that lose at most 3 of f64's 16 digits there), 1 - erfc(x) above, erfc(x) by its continued
/// fraction (Abramowitz and Stegun 7.1.14) evaluated from the 60th term back.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.5 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...)))))
        let mut f = a;
        for k in (1..=60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Python's math.erf (the C library's, within an ulp), on both sides of the switch at 2.5.
        for (x, want) in [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.4999, 0.9995928300996666),
            (2.5, 0.999593047982555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
            (6.0, 1.0),
            (-1.0, -0.8427007929497149),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-14,
                "erf({x}) = {} not {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn the_config_takes_transformers_defaults_and_refuses_what_is_not_built() {
        let base = serde_json::json!({
            "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "out_hidden_size": 2048, "num_position_embeddings": 2304,
        });
        // Qwen3-VL without the key: DeepStack after blocks 8, 16, 24; Qwen3.5: none.
        let vl = VisionConfig::from_json("qwen3_vl", &base).unwrap();
        assert_eq!(
            (
                vl.deepstack_visual_indexes.clone(),
                vl.head_dim(),
                vl.rope_theta
            ),
            (vec![8, 16, 24], 72, 10000.0)
        );
        assert!(VisionConfig::from_json("qwen3_5", &base)
            .unwrap()
            .deepstack_visual_indexes
            .is_empty());
        for (key, value, says) in [
            ("hidden_act", serde_json::json!("gelu"), "hidden_act"),
            (
                "num_position_embeddings",
                serde_json::json!(2300),
                "not a square grid",
            ),
            ("num_heads", serde_json::json!(5), "multiple of 4"),
            (
                "deepstack_visual_indexes",
                serde_json::json!([3, 30]),
                "block 30 of 27",
            ),
            ("depth", serde_json::json!(0), "vision_config.depth"),
        ] {
            let mut bad = base.clone();
            bad[key] = value;
            let e = VisionConfig::from_json("qwen3_vl", &bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{key}: {e}");
        }
    }

    #[test]
    fn patches_in_merger_order_land_where_the_processor_put_them() {
        // A 4 x 6 grid, merge 2: the first four patches are the top-left 2 x 2 block.
        let order: Vec<_> = (0..8).map(|i| merge_order(i, 6, 2)).collect();
        assert_eq!(
            order,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        assert_eq!(merge_order(23, 6, 2), (3, 5));
    }
}
