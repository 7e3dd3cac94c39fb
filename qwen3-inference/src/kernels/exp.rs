//! A vectorizable `e^x` for the softmaxes (attention's, and the sampler's draw).

use super::madd;

/// `e^x` for a softmax (`x <= 0`), accurate to a few ulp, written so that a loop over it
/// vectorizes (no branches, no library call).
///
/// `e^x = 2^k e^r` with `k = round(x / ln 2)` and `r = x - k ln 2` in `[-ln2/2, ln2/2]`; `e^r` by
/// its Taylor series to degree 7 (truncation error below `0.35^8 / 8! = 6e-9`, relative), `2^k`
/// by writing `k + 127` into the exponent bits. Arguments below -87 (where `e^x` < 2^-125, far
/// below anything a softmax sum of ones can notice) are clamped there; `-inf` gives `e^-87` (in
/// attention's online softmax that only ever multiplies the initial zeros).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_with::<false>(x)
}

/// [`exp`] with its multiply-adds fused where `F` (`madd`): for the kernels `vectorized!`
/// compiles `fused<F>` (the vision tower's softmax), about half the instructions.
/// `exp_with::<false>` is [`exp`], bit for bit.
#[inline(always)]
pub fn exp_with<const F: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part with few mantissa bits (so k * LN2_HI is exact) and the rest.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer (round to nearest even), which then sits in
    // the low mantissa bits of the sum.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let kr = madd::<F>(x, LOG2E, ROUND);
    let k = kr - ROUND;
    let r = madd::<F>(-k, LN2_LO, madd::<F>(-k, LN2_HI, x));
    // Horner's rule from the highest term: 1 + r (1 + r (1/2 + r (1/6 + ...))).
    let m = |acc: f32, c: f32| madd::<F>(r, acc, c);
    let e_r = m(
        m(
            m(
                m(
                    m(m(m(1.0 / 5040.0, 1.0 / 720.0), 1.0 / 120.0), 1.0 / 24.0),
                    1.0 / 6.0,
                ),
                0.5,
            ),
            1.0,
        ),
        1.0,
    );
    // k is in [-126, 0]: the integer in kr's low bits, offset by the exponent bias.
    let two_k =
        f32::from_bits((kr.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127)) << 23);
    e_r * two_k
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest relative error of `f` against f64's `exp` over [-87, 0].
    fn worst_relative_error(f: impl Fn(f32) -> f32) -> f64 {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            worst = worst.max(((f(x) as f64 - want) / want).abs());
            x += 0.001_3;
        }
        worst
    }

    #[test]
    fn exp_is_accurate_to_a_few_ulp() {
        let worst = worst_relative_error(exp);
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "relative error {worst:e}"
        );
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
    }

    /// The fused form, as accurate (its multiply-adds round once, so if anything closer).
    #[test]
    fn fused_exp_is_accurate_to_a_few_ulp() {
        let worst = worst_relative_error(exp_with::<true>);
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "relative error {worst:e}"
        );
        assert_eq!(exp_with::<true>(0.0), 1.0);
    }
}
