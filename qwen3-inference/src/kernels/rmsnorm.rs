//! RMSNorm (Zhang & Sennrich 2019), as HuggingFace's `Qwen3RMSNorm` computes it in float32:
//! `y = w * (x * rsqrt(mean(x^2) + eps))`. No mean subtraction and no bias; the weight multiplies
//! as stored (not `1 + w`).

use super::lanes::sum_of_squares;

vectorized! {
    /// Normalises each `dim`-long row of `x` into `out` and scales it by `weight` (`[dim]`).
    /// Used for the hidden-size norms (rows = tokens) and the per-head q/k norms (rows = heads).
    pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
        let dim = weight.len();
        assert_eq!(x.len() % dim, 0, "rmsnorm: x is not a whole number of rows");
        assert_eq!(out.len(), x.len(), "rmsnorm: out and x differ in length");
        for (out, row) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
            // The squares summed in lanes (`lanes.rs`): as one chain of dependent additions this
            // showed in a one-thread decode step's profile, most of it in the per-head q/k norms
            // (measured: docs/performance.md, "Smaller steps").
            let sum_sq = sum_of_squares(row);
            let inv_rms = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
            for ((o, &v), &w) in out.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv_rms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_formula() {
        // Two rows of 4; eps large enough to matter.
        let x0 = vec![1.0, -2.0, 3.0, -4.0, 0.5, 0.5, 0.5, 0.5];
        let w = [0.5, 1.0, 1.5, 2.0];
        let eps = 0.1f32;
        let mut x = vec![0.0; 8];
        rmsnorm(&mut x, &x0, &w, eps);
        // Row 1: mean(x^2) = 30/4 = 7.5, rsqrt(7.6).
        let r = 1.0 / 7.6f32.sqrt();
        let want1 = [0.5 * r, -2.0 * r, 4.5 * r, -8.0 * r];
        // Row 2: mean = 0.25, rsqrt(0.35).
        let r2 = 1.0 / 0.35f32.sqrt();
        let want2 = [0.25 * r2, 0.5 * r2, 0.75 * r2, 1.0 * r2];
        for (a, b) in x.iter().zip(want1.iter().chain(&want2)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    /// Rows long enough for the 16 lanes and a tail, against the formula in f64.
    #[test]
    fn long_rows_match_f64() {
        for dim in [128, 1024 + 7] {
            let x: Vec<f32> = (0..2 * dim)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
                .collect();
            let w: Vec<f32> = (0..dim).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
            let mut out = vec![0.0; 2 * dim];
            rmsnorm(&mut out, &x, &w, 1e-6);
            for (r, row) in x.chunks(dim).enumerate() {
                let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                for (c, &v) in row.iter().enumerate() {
                    let want = w[c] as f64 * v as f64 * inv;
                    let got = out[r * dim + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{dim} {r} {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
