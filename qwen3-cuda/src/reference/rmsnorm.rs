//! Reference of `kernels/rmsnorm.cu`.

use super::reduce::block_sum;
use crate::kernels::rmsnorm_block_dim;

/// `out[r, i] = (x[r, i] * (1 / sqrt(mean(x[r, :]^2) + eps))) * w[i]`.
/// x, out: `[rows, n]`; w: `[n]`. Thread t of a row's block sums squares of `x[t], x[t + T], ...` with
/// fma (T = [`rmsnorm_block_dim`]); the block sum follows `block_sum`'s tree.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let n = w.len();
    assert_eq!(x.len() % n, 0);
    assert_eq!(out.len(), x.len());
    let threads = rmsnorm_block_dim(n);
    let mut per_thread = vec![0.0f32; threads];
    for (xr, outr) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        for (t, ss) in per_thread.iter_mut().enumerate() {
            *ss = 0.0;
            for &v in xr.iter().skip(t).step_by(threads) {
                *ss = v.mul_add(v, *ss);
            }
        }
        let ss = block_sum(&per_thread);
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((o, &v), &wi) in outr.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * wi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::test_values;

    fn naive(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, wi)| v * r * wi).collect()
    }

    /// Hidden-size rows (1024, 4 values a thread), head rows (128), and an odd width that leaves
    /// threads idle; weights away from 1.0 so dropping them (or using 1 + w) fails.
    #[test]
    fn matches_naive_f64() {
        for (rows, n) in [(3, 1024), (16, 128), (2, 40)] {
            let x = test_values(rows * n, n as u64);
            let w: Vec<f32> = test_values(n, 7).iter().map(|v| 1.0 + 0.5 * v).collect();
            let eps = 1e-6f32;
            let mut out = vec![0.0; rows * n];
            rmsnorm(&mut out, &x, &w, eps);
            let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
            for (r, xr) in x.chunks(n).enumerate() {
                let x64: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
                let want = naive(&x64, &w64, eps as f64);
                for (i, want) in want.iter().enumerate() {
                    let got = out[r * n + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{rows}x{n} [{r},{i}]"
                    );
                }
            }
        }
    }

    /// eps is used, not a constant: an all-zero row gives 0 * 1/sqrt(eps) = 0, and a tiny row is
    /// scaled by exactly 1/sqrt(ms + eps).
    #[test]
    fn eps_is_the_argument() {
        let x = vec![1e-3f32; 128];
        let w = vec![1.0f32; 128];
        let mut a = vec![0.0; 128];
        let mut b = vec![0.0; 128];
        rmsnorm(&mut a, &x, &w, 1e-6);
        rmsnorm(&mut b, &x, &w, 1e-2);
        assert!((a[0] - 1e-3 / (1e-6f32 + 1e-6).sqrt()).abs() < 1e-4);
        assert!((b[0] - 1e-3 / (1e-6f32 + 1e-2).sqrt()).abs() < 1e-6);
    }
}
