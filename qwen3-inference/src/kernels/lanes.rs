//! Sums of f32 in independent lanes.
//!
//! A plain `.sum()` over f32 is one chain of dependent additions (the compiler may not reorder
//! them, as that would change the rounding), about four cycles a value. Kept as [`LANES`]
//! independent partial sums the loop vectorizes, and adding the lanes in a fixed pairwise order
//! gives the same bits at every vector width (SSE2, AVX2, AVX-512, NEON).

/// Width of the partial sums: one AVX-512 register of f32.
pub const LANES: usize = 16;

/// `sum(f(a[i]))` in [`LANES`] partial sums (the values past the last whole group of `LANES` go
/// into the first lanes), then the fixed tree of [`sum_lanes`].
#[inline(always)]
pub fn sum_by(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    for (i, &x) in chunks.remainder().iter().enumerate() {
        acc[i] += f(x);
    }
    for c in chunks {
        for i in 0..LANES {
            acc[i] += f(c[i]);
        }
    }
    sum_lanes(&acc)
}

/// `v` where `cond` holds, else `+0.0`, by masking the bits. Written as `if cond { v } else {
/// 0.0 }` inside a sum, the compiler keeps a branch per value and does not vectorize the loop
/// (adding `+0.0` is not a no-op for `-0.0`, so the select cannot become a skipped addition):
/// a pass over the vocabulary then takes several times as long (measured: docs/sampling.md,
/// "Making it cheap").
#[inline(always)]
pub fn select(cond: bool, v: f32) -> f32 {
    f32::from_bits(v.to_bits() & 0u32.wrapping_sub(cond as u32))
}

/// `sum(a)`.
#[inline(always)]
pub fn sum(a: &[f32]) -> f32 {
    sum_by(a, |x| x)
}

/// `sum(a^2)`.
#[inline(always)]
pub fn sum_of_squares(a: &[f32]) -> f32 {
    sum_by(a, |x| x * x)
}

/// Sum of the lanes in a fixed pairwise order.
///
/// Not inlined: inlined, the compiler vectorized the partial sums to fit this tree, in pairs of
/// lanes, and left half of [`sum_by`]'s loop scalar (a step of 16 values with AVX2: 8 `vaddss`
/// and 4 two-lane `vaddps`, where two eight-lane `vaddps` do). Out of line, the loop keeps whole
/// vectors and this runs once a call.
#[inline(never)]
fn sum_lanes(a: &[f32; LANES]) -> f32 {
    let mut h = *a;
    let mut n = LANES / 2;
    while n > 0 {
        for i in 0..n {
            h[i] += h[i + n];
        }
        n /= 2;
    }
    h[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_match_f64() {
        for n in [0, 1, 15, 16, 17, 100, 1031] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
                .collect();
            let want: f64 = a.iter().map(|&v| v as f64).sum();
            let want_sq: f64 = a.iter().map(|&v| v as f64 * v as f64).sum();
            assert!((sum(&a) as f64 - want).abs() <= 1e-4, "{n}");
            assert!(
                (sum_of_squares(&a) as f64 - want_sq).abs() <= 1e-6 * want_sq.max(1.0),
                "{n}"
            );
        }
    }
}
