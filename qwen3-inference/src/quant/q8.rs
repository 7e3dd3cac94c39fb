//! q8: group-wise symmetric INT8, one f32 scale a group. Each group `w` gets the scale
//! `s = max|w| / 127` and stores `q = round_half_even(w / s)`, an integer in [-127, 127].

/// Quantizes `w` (a whole tensor, row-major, rows a multiple of `group_size` long) into `q` and
/// one scale per group in `scales`. An all-zero group gets scale 0 and zeros, not NaN.
pub fn quantize_q8(w: &[f32], group_size: usize, q: &mut [i8], scales: &mut [f32]) {
    assert!(group_size > 0 && w.len().is_multiple_of(group_size));
    assert_eq!(q.len(), w.len());
    assert_eq!(scales.len(), w.len() / group_size);
    for ((group, qg), scale) in w
        .chunks_exact(group_size)
        .zip(q.chunks_exact_mut(group_size))
        .zip(scales.iter_mut())
    {
        let max_abs = group.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let s = max_abs / 127.0;
        *scale = s;
        if s == 0.0 {
            qg.fill(0);
            continue;
        }
        for (qi, &x) in qg.iter_mut().zip(group) {
            // |x / s| <= 127 up to rounding of the division; clamp guards that last ulp.
            *qi = (x / s).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// Dequantizes one run of values: `out[i] = q[i] * scales[i / group_size]`, where `q` starts at
/// a group boundary.
pub fn dequantize_q8(q: &[i8], scales: &[f32], group_size: usize, out: &mut [f32]) {
    for ((qg, og), &s) in q
        .chunks(group_size)
        .zip(out.chunks_mut(group_size))
        .zip(scales)
    {
        for (o, &v) in og.iter_mut().zip(qg) {
            *o = v as f32 * s;
        }
    }
}

/// A q8 tensor as a model file holds it, borrowed: `q` row-major, `scales[g]` multiplies
/// `q[g * group_size .. (g + 1) * group_size]`.
#[derive(Debug, Clone, Copy)]
pub struct Q8<'a> {
    pub q: &'a [i8],
    pub scales: &'a [f32],
    pub group_size: usize,
}

impl Q8<'_> {
    /// The value at row-major index `i`: `q[i] * scale`.
    #[inline]
    pub fn value(&self, i: usize) -> f32 {
        self.q[i] as f32 * self.scales[i / self.group_size]
    }

    /// Row `r` of a tensor `out.len()` wide, dequantized into `out`.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let (cols, gs) = (out.len(), self.group_size);
        let q = &self.q[r * cols..(r + 1) * cols];
        dequantize_q8(q, &self.scales[r * cols / gs..(r + 1) * cols / gs], gs, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::lcg;

    #[test]
    fn error_is_at_most_half_a_step() {
        let mut seed = 7;
        for gs in [32, 64, 128] {
            let w: Vec<f32> = (0..gs * 50)
                .map(|i| lcg(&mut seed) * (1.0 + (i / gs) as f32))
                .collect();
            let mut q = vec![0i8; w.len()];
            let mut s = vec![0f32; w.len() / gs];
            quantize_q8(&w, gs, &mut q, &mut s);
            let mut back = vec![0f32; w.len()];
            dequantize_q8(&q, &s, gs, &mut back);
            for (i, (&a, &b)) in w.iter().zip(&back).enumerate() {
                let step = s[i / gs];
                // Half a step, plus f32 rounding of the product q*s.
                assert!(
                    (a - b).abs() <= step * 0.5 * (1.0 + 1e-5) + f32::EPSILON * a.abs(),
                    "value {i}: {a} -> {b}, step {step}"
                );
            }
            // The largest value of each group maps to +-127 exactly.
            for (g, grp) in q.chunks(gs).enumerate() {
                assert_eq!(
                    grp.iter().map(|v| v.unsigned_abs()).max(),
                    Some(127),
                    "group {g}"
                );
            }
        }
    }

    #[test]
    fn zero_group_gives_zeros_not_nan() {
        let w = [0.0f32; 64];
        let mut q = [1i8; 64];
        let mut s = [1.0f32; 1];
        quantize_q8(&w, 64, &mut q, &mut s);
        assert_eq!(s[0], 0.0);
        assert!(q.iter().all(|&v| v == 0));
        let mut back = [1.0f32; 64];
        dequantize_q8(&q, &s, 64, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn ties_round_to_even() {
        // max|w| = 127 makes the scale exactly 1, so w / s = w and the ties are exact.
        let mut w = vec![0.0f32; 8];
        w[0] = 127.0;
        w[1] = 0.5;
        w[2] = 1.5;
        w[3] = 2.5;
        w[4] = -0.5;
        w[5] = -1.5;
        w[6] = 126.5;
        let mut q = vec![0i8; 8];
        let mut s = vec![0f32; 1];
        quantize_q8(&w, 8, &mut q, &mut s);
        assert_eq!(s[0], 1.0);
        assert_eq!(q, vec![127, 0, 2, 2, 0, -2, 126, 0]);
    }
}
