//! The elementwise steps: the SwiGLU gate, the vision tower's GELU and the residual add.

use super::exp::exp;

vectorized! {
    /// SwiGLU (Shazeer 2020) as Qwen3's MLP uses it: `gate[i] = silu(gate[i]) * up[i]`, with
    /// `silu(v) = v * sigmoid(v) = v / (1 + e^-v)`.
    ///
    /// `e^-v` overflows for very negative `v`, and [`exp`] takes only arguments `<= 0`, so the
    /// sigmoid is computed from `e = e^-|v|` on both sides: `1 / (1 + e)` for `v >= 0`, and
    /// `e / (1 + e)` (the same value, multiplied through by `e^v`) for `v < 0`. Both branches are
    /// a select, so the loop vectorizes, which a call to libm's `expf` per value prevents.
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len());
        for (g, &u) in gate.iter_mut().zip(up) {
            let v = *g;
            let e = exp(-v.abs());
            let sigmoid = if v >= 0.0 { 1.0 } else { e } / (1.0 + e);
            *g = v * sigmoid * u;
        }
    }
}

vectorized! {
    /// GELU, tanh form (`gelu_pytorch_tanh`, the vision tower's MLP), in place: `0.5 x (1 +
    /// tanh(u))`, u = sqrt(2/pi) (x + 0.044715 x^3), with `tanh(u) = sign(u) (1 - e) / (1 + e)`,
    /// e = e^(-2|u|) by [`exp`] (whose argument must not be positive), so that the loop
    /// vectorizes (libm's `tanhf` is a call per value).
    pub fn gelu_tanh(h: &mut [f32]) {
        const K: f32 = 0.797_884_6; // sqrt(2 / pi)
        for v in h.iter_mut() {
            let x = *v;
            let u = K * (x + 0.044715 * x * x * x);
            let e = exp(-2.0 * u.abs());
            let tanh = ((1.0 - e) / (1.0 + e)).copysign(u);
            *v = 0.5 * x * (1.0 + tanh);
        }
    }
}

vectorized! {
    /// The residual connection: `x[i] += y[i]`.
    pub fn add(x: &mut [f32], y: &[f32]) {
        assert_eq!(x.len(), y.len());
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_matches_formula() {
        let mut g = vec![
            -3.0f32, -0.5, 0.0, 0.5, 3.0, 30.0, -100.0, -20.0, 87.5, -1e-3, 1e-30,
        ];
        let up = vec![2.0f32; g.len()];
        let want: Vec<f32> = g
            .iter()
            .map(|&v| (v as f64 / (1.0 + (-(v as f64)).exp()) * 2.0) as f32)
            .collect();
        silu_mul(&mut g, &up);
        for (a, b) in g.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    /// Against the formula in f64, across the range where tanh bends and both tails.
    #[test]
    fn gelu_tanh_matches_the_formula() {
        let x: Vec<f32> = (0..2001).map(|i| (i as f32 - 1000.0) * 0.012).collect();
        let mut h = x.clone();
        gelu_tanh(&mut h);
        let k = (2.0 / std::f64::consts::PI).sqrt();
        for (&x, &g) in x.iter().zip(&h) {
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + (k * (x64 + 0.044715 * x64.powi(3))).tanh());
            assert!(
                (g as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "{x}: {g} vs {want}"
            );
        }
    }

    #[test]
    fn add_adds() {
        let mut x = vec![1.0, 2.0];
        add(&mut x, &[0.5, -2.0]);
        assert_eq!(x, vec![1.5, 0.0]);
    }
}
