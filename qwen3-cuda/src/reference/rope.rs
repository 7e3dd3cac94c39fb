//! Reference of `kernels/rope.cu`. Its cos/sin tables are qwen3-inference's
//! [`RopeTable`](qwen3_inference::backend::RopeTable), computed once on the host for every backend,
//! so the CPU and the GPU rotate by the same angles bit for bit.

/// Rotates `x` ([n_tok, n_heads, head_dim]) in place, token t at position `pos0 + t`:
/// `(a, b) = (x[i], x[i + h])` becomes `(a*cos - b*sin, b*cos + a*sin)` with h = head_dim / 2.
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], n_heads: usize, head_dim: usize, pos0: usize) {
    let half = head_dim / 2;
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let c = &cos[(pos0 + t) * half..(pos0 + t + 1) * half];
        let s = &sin[(pos0 + t) * half..(pos0 + t + 1) * half];
        for head in token.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * c[i] - b * s[i];
                hi[i] = b * c[i] + a * s[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::test_values;
    use qwen3_inference::backend::RopeTable;

    fn rope_tables(head_dim: usize, theta: f64, n_pos: usize) -> (Vec<f32>, Vec<f32>) {
        let t = RopeTable::new(head_dim, theta, n_pos);
        (t.cos().to_vec(), t.sin().to_vec())
    }

    /// HF's form, written out literally: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), with
    /// rotate_half(q) = cat(-q[h..], q[..h]), and angles in f64.
    #[test]
    fn matches_hf_rotate_half_in_f64() {
        let (n_tok, n_heads, hd, theta, pos0) = (3, 2, 128, 1_000_000.0, 5);
        let (cos, sin) = rope_tables(hd, theta, pos0 + n_tok);
        let x0 = test_values(n_tok * n_heads * hd, 11);
        let mut x = x0.clone();
        rope(&mut x, &cos, &sin, n_heads, hd, pos0);
        let h = hd / 2;
        for t in 0..n_tok {
            let pos = (pos0 + t) as f64;
            for head in 0..n_heads {
                let q = &x0[(t * n_heads + head) * hd..][..hd];
                for d in 0..hd {
                    let i = d % h;
                    let angle = pos / theta.powf((2 * i) as f64 / hd as f64);
                    let rot = if d < h {
                        -(q[d + h] as f64)
                    } else {
                        q[d - h] as f64
                    };
                    let want = q[d] as f64 * angle.cos() + rot * angle.sin();
                    let got = x[(t * n_heads + head) * hd + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "t{t} h{head} d{d}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Position 0 is the identity; theta is read, not assumed (10000 and 1e6 give other angles).
    #[test]
    fn position_zero_is_identity_and_theta_matters() {
        let (cos, sin) = rope_tables(8, 10_000.0, 2);
        let x0 = test_values(8, 1);
        let mut x = x0.clone();
        rope(&mut x, &cos, &sin, 1, 8, 0);
        assert_eq!(x, x0);
        let (cos2, _) = rope_tables(8, 1_000_000.0, 2);
        assert_ne!(cos[4..8], cos2[4..8]);
    }
}
