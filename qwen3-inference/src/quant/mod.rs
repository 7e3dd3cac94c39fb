//! Group-wise quantization: the model file's own dtypes, one module each. [`q8`] symmetric INT8,
//! [`q4`] symmetric 4-bit, [`q6`] symmetric 6-bit (what a q4 file keeps finer). Each module holds
//! its dtype's packing, its values as a tensor borrowed from a file ([`Q8`], [`Q4`], [`Q6`]: what
//! `format::view::TensorData` hands the kernels) and its scalar reading; the products are the
//! kernels' (`kernels/dot/`), and `format/dtype.rs` holds the file's table of every dtype.
//! [`interleaved`] is the other order of their rows that the AVX-512 kernels read.
//!
//! A row of weights is cut into groups of `group_size` consecutive values. Each group `w` gets one
//! scale `s` and stores integers `q`; the value it stands for is `q * s`. Because rounding moves a
//! value by at most half a step, the error of every dequantized value is at most `s / 2`.
//! Symmetric (no zero point) keeps the dot product a plain sum of `q_w * q_x` per group, which is
//! what integer SIMD instructions compute. See docs/quantization.md.

pub mod interleaved;
pub mod q4;
pub mod q6;
pub mod q8;

pub use q4::{dequantize_q4, q4_int, q4_value, quantize_q4, Q4};
pub use q6::{dequantize_q6_row, q6_int, q6_unpack_block, q6_value, quantize_q6, Q6, Q6_BLOCK};
pub use q8::{dequantize_q8, quantize_q8, Q8};

/// `round_half_even(v)` clamped to [-N, N - 1], the integers of a symmetric grid of `2N` levels
/// (q4: N = 8, q6: N = 32), in a form the compiler vectorizes (the scale search runs it 27 times
/// a value): adding and subtracting 1.5 * 2^23 rounds to an integer in the default
/// round-to-nearest-even mode, exactly for |v| < 2^22; larger values land far outside the grid
/// and are clamped as they would be. (`f32::round_ties_even` is a library call on baseline
/// x86-64, which made the export more than twice as slow.)
#[inline]
fn level<const N: i32>(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    ((v + MAGIC) - MAGIC).clamp(-N as f32, (N - 1) as f32)
}

/// The f16 scale of a group on the grid [-N, N - 1] (`N` = 8 for q4, 32 for q6): of `m / -N`
/// (`m` the value of largest magnitude, which lands on -N exactly) and the least-squares refits
/// of the divisors `-(N - 1.5), -(N - 1.25), ..., -(N + 1.5)`, the one with the smallest squared
/// error after f16 rounding. See [`quantize_q4`].
fn scale_for<const N: i32>(group: &[f32]) -> half::f16 {
    let m = group
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    if m == 0.0 {
        return half::f16::ZERO;
    }
    // The squared error of scale `d`, each value rounded to its nearest level.
    let error = |d: f32| lanes_sum(group, |x| (x - level::<N>(x / d) * d).powi(2));
    let mut best = half::f16::from_f32(m / -(N as f32));
    let mut best_error = error(best.to_f32());
    for step in 0..=12 {
        let d = m / -(N as f32 - 1.5 + 0.25 * step as f32);
        // Least squares for the integers this `d` gives.
        let wq = lanes_sum(group, |x| x * level::<N>(x / d));
        let qq = lanes_sum(group, |x| level::<N>(x / d).powi(2));
        let fitted = half::f16::from_f32(wq / qq);
        let e = error(fitted.to_f32());
        if fitted.to_f32() != 0.0 && e < best_error {
            (best, best_error) = (fitted, e);
        }
    }
    best
}

/// `sum f(x)` over `values`, in eight running sums (one vector's lanes) added at the end: with a
/// single running sum every addition waits for the one before (the compiler may not reorder
/// float additions), which made a 1.7B-shaped q4 export take 68 s instead of 43.
#[inline]
fn lanes_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut eights = values.chunks_exact(8);
    for e in &mut eights {
        for (l, &x) in lanes.iter_mut().zip(e) {
            *l += f(x);
        }
    }
    let tail: f32 = eights.remainder().iter().map(|&x| f(x)).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Group `g`'s scale in a q4 or q6 tensor (stored as f16 bits).
#[inline]
pub fn f16_scale(scales: &[u16], g: usize) -> f32 {
    half::f16::from_bits(scales[g]).to_f32()
}
