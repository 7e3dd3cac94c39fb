//! Reference of `kernels/elementwise.cu`.

/// `gate[i] = silu(gate[i]) * up[i]`, `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = (*g / (1.0 + (-*g).exp())) * u;
    }
}

/// `x[i] += y[i]` (the residual connection).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x[i] += bias[i % n]`: a bias added to every row of `x` (`[rows, n]`), as `add_bias` does.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    let n = bias.len();
    for (i, a) in x.iter_mut().enumerate() {
        *a += bias[i % n];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_matches_f64() {
        let gate = [-20.0f32, -1.5, 0.0, 0.25, 3.0, 30.0];
        let up = [0.5f32, -2.0, 7.0, 1.0, -0.75, 2.0];
        let mut out = gate;
        silu_mul(&mut out, &up);
        for i in 0..6 {
            let g = gate[i] as f64;
            let want = g / (1.0 + (-g).exp()) * up[i] as f64;
            assert!(
                (out[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-6),
                "{i}"
            );
        }
    }

    #[test]
    fn add_assign_adds() {
        let mut x = [1.0f32, 2.0];
        add_assign(&mut x, &[0.5, -2.0]);
        assert_eq!(x, [1.5, 0.0]);
    }

    #[test]
    fn add_bias_adds_the_bias_to_every_row() {
        let mut x = [1.0f32, 2.0, 3.0, 10.0, 20.0, 30.0];
        add_bias(&mut x, &[0.5, -1.0, 0.25]);
        assert_eq!(x, [1.5, 1.0, 3.25, 10.5, 19.0, 30.25]);
    }
}
