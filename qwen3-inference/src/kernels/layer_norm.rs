//! LayerNorm (Ba et al. 2016), as `nn.LayerNorm` computes it in float32 (the vision tower's
//! norms): `y = (x - mean) / sqrt(var + eps) * w + b` over each row, the variance the biased one
//! (divided by the row's length).

use super::lanes::{sum, sum_of_squares};

vectorized! {
    /// Normalises each `dim`-long row of `x` into `out` (`dim` = `weight.len()`), scaled by
    /// `weight` and shifted by `bias`. The variance is taken from the deviations (written to
    /// `out` first), not as `mean(x^2) - mean^2`, which cancels when the mean is large against the
    /// spread; both sums in lanes (`lanes.rs`).
    pub fn layer_norm(out: &mut [f32], x: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
        let dim = weight.len();
        assert!(dim > 0, "layer_norm: rows of no values");
        assert_eq!(bias.len(), dim, "layer_norm: weight and bias differ in length");
        assert_eq!(x.len() % dim, 0, "layer_norm: x is not a whole number of rows");
        assert_eq!(out.len(), x.len(), "layer_norm: out and x differ in length");
        for (out, row) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
            let mean = sum(row) / dim as f32;
            for (o, &v) in out.iter_mut().zip(row) {
                *o = v - mean;
            }
            let inv = 1.0 / (sum_of_squares(out) / dim as f32 + eps).sqrt();
            for ((o, &w), &b) in out.iter_mut().zip(weight).zip(bias) {
                *o = *o * inv * w + b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows long enough for the 16 lanes and a tail, one of them far from zero (a large mean
    /// against its spread), against the formula in f64.
    #[test]
    fn matches_f64() {
        for dim in [16, 1024 + 7] {
            let x: Vec<f32> = (0..3 * dim)
                .map(|i| {
                    ((i * 37 % 101) as f32 - 50.0) * 0.03 + if i >= 2 * dim { 300.0 } else { 0.0 }
                })
                .collect();
            let w: Vec<f32> = (0..dim).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..dim).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
            let mut out = vec![0.0; 3 * dim];
            layer_norm(&mut out, &x, &w, &b, 1e-6);
            for (r, row) in x.chunks(dim).enumerate() {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
                let inv = 1.0 / (var + 1e-6).sqrt();
                for (j, &v) in row.iter().enumerate() {
                    let want = (v as f64 - mean) * inv * w[j] as f64 + b[j] as f64;
                    let got = out[r * dim + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "dim {dim} row {r} [{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
