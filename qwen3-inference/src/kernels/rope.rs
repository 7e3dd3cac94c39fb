//! Rotary position embeddings (Su et al. 2021, "RoFormer") in HuggingFace's rotate-half layout.
//!
//! HF (`modeling_qwen3.py`, `apply_rotary_pos_emb`) pairs element `i` of a head with element
//! `i + head_dim/2` (not `2i` with `2i+1` as the paper and llama2.c do) and rotates the pair by the
//! angle `pos * inv_freq[i]`, where `inv_freq[i] = 1 / theta^(2i / head_dim)`:
//!
//! ```text
//! out[i]          = x[i] * cos - x[i + half] * sin
//! out[i + half]   = x[i + half] * cos + x[i] * sin
//! ```
//!
//! Long contexts scale the frequencies: YaRN ([`RopeScaling::Yarn`]) slows the slow rotations by
//! `factor`, keeps the fast ones, blends those between, and multiplies cos and sin by an
//! attention factor (so every q.k score by its square). Only the tables change; the rotation is
//! the same.
//!
//! Qwen3.5 rotates only the first quarter of each head (`partial_rotary_factor`): the table is
//! then built for that many dimensions, which it calls its rotary dimension, and [`rope`] leaves
//! the rest of each head as it is (transformers' `apply_rotary_pos_emb` concatenates them back
//! unrotated).

use crate::format::RopeScaling;

/// Precomputed `cos` and `sin` of every angle for positions `0..max_pos`: `[max_pos, dim/2]`,
/// `dim` the rotary dimension (`head_dim`, or the part of it that rotates).
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Builds the tables the way HF's `Qwen3RotaryEmbedding` does in float32, so rounding matches:
    /// `inv_freq` is an f32 tensor, the angle `pos * inv_freq` is an f32 product, and cos/sin are
    /// taken of that f32 angle. (At position 4000 an angle is ~4000 rad and one f32 ulp there is
    /// ~5e-4 rad, so computing the angle in f64 instead would *differ* from the reference.)
    pub fn new(head_dim: usize, theta: f64, max_pos: usize) -> RopeTable {
        RopeTable::with_scaling(head_dim, theta, RopeScaling::None, max_pos)
    }

    /// [`RopeTable::new`] with the frequencies and the factor of `scaling`, computed as
    /// transformers' `_compute_yarn_parameters` (modeling_rope_utils.py) computes them: in f32
    /// where it uses f32 tensors, in f64 where it uses Python floats.
    pub fn with_scaling(
        head_dim: usize,
        theta: f64,
        scaling: RopeScaling,
        max_pos: usize,
    ) -> RopeTable {
        let half = head_dim / 2;
        // pos_freqs = theta ** (arange(0, dim, 2) / dim), exponent and result in f32.
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                theta.powf(exponent as f64) as f32
            })
            .collect();
        // inv_freq = 1 / pos_freqs, the plain rotary embedding's frequencies.
        let mut inv_freq: Vec<f32> = pos_freqs.iter().map(|&p| 1.0 / p).collect();
        let mut scale = 1.0f32;
        if let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } = scaling
        {
            // The dimension pair that turns `rotations` times within the original context
            // (find_correction_dim), in f64 as Python computes it.
            let dim = head_dim as f64;
            let correction_dim = |rotations: f64| {
                dim * (original as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            // Pairs below `low` rotate fast enough to keep their frequency (extrapolation); those
            // above `high` are slowed by `factor` (interpolation); a linear ramp in between.
            let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, high) = (low.max(0.0), high.min(dim - 1.0));
            // linear_ramp_factor: a singular ramp is widened by 0.001.
            let high = if low == high { high + 0.001 } else { high };
            for (i, (f, &p)) in inv_freq.iter_mut().zip(&pos_freqs).enumerate() {
                // ramp = clamp((i - low) / (high - low), 0, 1), an f32 tensor op with Python
                // scalars, which torch applies in f32.
                let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let interpolated = 1.0 / (factor as f32 * p);
                let kept = 1.0 / p;
                // inv_freq = interpolated * (1 - extrapolation) + kept * extrapolation
                *f = interpolated * (1.0 - extrapolation) + kept * extrapolation;
            }
            scale = attention_factor as f32;
        }
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for pos in 0..max_pos {
            for &f in &inv_freq {
                let angle = pos as f32 * f;
                // cos = emb.cos() * attention_scaling, each an f32 op (no scaling: times 1).
                cos.push((angle as f64).cos() as f32 * scale);
                sin.push((angle as f64).sin() as f32 * scale);
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Positions the table covers.
    pub fn max_pos(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// `cos[pos][i]`, `[max_pos, head_dim / 2]`, for backends that keep their own copy.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// `sin[pos][i]`, `[max_pos, head_dim / 2]`.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// The dimensions of a head it rotates (the first of each head).
    pub fn rotary_dim(&self) -> usize {
        2 * self.half
    }

    /// Bytes held by the two tables.
    pub fn nbytes(&self) -> usize {
        (self.cos.len() + self.sin.len()) * 4
    }
}

vectorized! {
    /// Rotates the first [`RopeTable::rotary_dim`] values of every `head_dim`-long head in `x`
    /// (`[n, head_dim]`, all at position `pos`) in place.
    pub fn rope(x: &mut [f32], table: &RopeTable, pos: usize, head_dim: usize) {
        let half = table.half;
        let cos = &table.cos[pos * half..(pos + 1) * half];
        let sin = &table.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(head_dim) {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

/// Which position component (0 time, 1 height, 2 width) rotary frequency `j` follows in
/// M-RoPE, for `mrope_section = [s_t, s_h, s_w]` interleaved (`recomposition_frequencies` in
/// transformers' Qwen3-VL and Qwen3.5 text models): from frequency 1 on, every third is
/// height's while `j < 3 s_h`, from 2 on every third width's while `j < 3 s_w`, the rest time's:
/// ```text
/// [24, 20, 20]:  T H W T H W ... T H W  (j < 60)  T T T T  (60..64)
/// ```
pub fn mrope_component(j: usize, section: [usize; 3]) -> usize {
    if j % 3 == 1 && j < 3 * section[1] {
        1
    } else if j % 3 == 2 && j < 3 * section[2] {
        2
    } else {
        0
    }
}

/// M-RoPE (a prompt with images, Qwen3-VL and Qwen3.5): rotates the first
/// [`RopeTable::rotary_dim`] values of every head in `x` (`[n, head_dim]`, one token) as
/// [`rope`] does, frequency `i` by the angle of position `thw[components[i]]`: each frequency
/// turns with the token's time, height or width. A text token's three positions are equal, and
/// this is [`rope`] at that position, bit for bit (the same table entries). `components` has one
/// entry per frequency, positions are below the table's `max_pos` (the caller checks both).
pub fn rope_mrope(
    x: &mut [f32],
    table: &RopeTable,
    thw: [u32; 3],
    components: &[u8],
    head_dim: usize,
) {
    let half = table.half;
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        for (i, &c) in components.iter().enumerate().take(half) {
            let at = thw[c as usize] as usize * half + i;
            let (cos, sin) = (table.cos[at], table.sin[at]);
            let (a, b) = (lo[i], hi[i]);
            lo[i] = a * cos - b * sin;
            hi[i] = b * cos + a * sin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HF's formula written out literally: `q * cos + rotate_half(q) * sin`, with
    /// `rotate_half(x) = cat(-x[half:], x[:half])` and `cos = cat(freqs, freqs).cos()`, in f64.
    fn rotate_half_reference(x: &[f32], pos: usize, theta: f64) -> Vec<f32> {
        let d = x.len();
        let half = d / 2;
        let freq = |j: usize| {
            let i = j % half;
            pos as f64 / theta.powf((2 * i) as f64 / d as f64)
        };
        let rot: Vec<f64> = (0..d)
            .map(|j| {
                if j < half {
                    -(x[j + half] as f64)
                } else {
                    x[j - half] as f64
                }
            })
            .collect();
        (0..d)
            .map(|j| (x[j] as f64 * freq(j).cos() + rot[j] * freq(j).sin()) as f32)
            .collect()
    }

    #[test]
    fn matches_rotate_half_formula() {
        let head_dim = 16;
        let theta = 1_000_000.0;
        let table = RopeTable::new(head_dim, theta, 64);
        assert_eq!(table.max_pos(), 64);
        let x: Vec<f32> = (0..2 * head_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        for pos in [0, 1, 7, 63] {
            let mut got = x.clone();
            rope(&mut got, &table, pos, head_dim);
            for h in 0..2 {
                let want = rotate_half_reference(&x[h * head_dim..(h + 1) * head_dim], pos, theta);
                for (a, b) in got[h * head_dim..(h + 1) * head_dim].iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "pos {pos}: {a} vs {b}");
                }
            }
        }
        // Position 0 is the identity.
        let mut same = x.clone();
        rope(&mut same, &table, 0, head_dim);
        assert_eq!(same, x);
    }

    /// A token whose three positions are equal is rotated exactly as plain RoPE rotates it; an
    /// image token's frequencies each take their component's angle.
    #[test]
    fn mrope_with_equal_positions_is_rope() {
        let (head_dim, theta) = (16, 1e6);
        let table = RopeTable::new(head_dim, theta, 64);
        let x: Vec<f32> = (0..2 * head_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let components: Vec<u8> = (0..8)
            .map(|j| mrope_component(j, [4, 2, 2]) as u8)
            .collect();
        assert_eq!(components, [0, 1, 2, 0, 1, 2, 0, 0]);
        for pos in [0u32, 5, 63] {
            let (mut a, mut b) = (x.clone(), x.clone());
            rope(&mut a, &table, pos as usize, head_dim);
            rope_mrope(&mut b, &table, [pos; 3], &components, head_dim);
            assert_eq!(a, b, "position {pos}");
        }
        // (time 3, height 9, width 20): frequency 1 turns by height's angle, 2 by width's.
        let mut got = x.clone();
        rope_mrope(&mut got, &table, [3, 9, 20], &components, head_dim);
        for (i, pos) in [(0, 3), (1, 9), (2, 20), (6, 3)] {
            let mut want = x.clone();
            rope(&mut want, &table, pos, head_dim);
            assert_eq!(
                (got[i], got[i + 8]),
                (want[i], want[i + 8]),
                "frequency {i}"
            );
        }
    }
}
