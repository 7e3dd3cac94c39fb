//! A prompt's matrix products end in a transposition: the kernels fill a block of weight rows for
//! every token, `[n, t]` (each weight row read once for all the tokens), and the output wants
//! `[t, rows]`, a token's values side by side (matmul.rs, `Scatter`). This writes
//!
//! ```text
//! out[i * ld + j] = block[j * t + i]        j < n (weight rows), i < t (tokens)
//! ```
//!
//! value by value in the plain version, and in tiles of 8 x 8 with AVX: eight rows of the block
//! loaded as eight vectors, turned into eight columns by 24 shuffles, stored as eight vectors
//! of the output's rows. Value by value it was a twentieth of a 448 x 448 image's encoding with
//! the AVX2 kernels on one thread (docs/vision.md, "Speed beside llama.cpp"), a load and a store
//! with an index check for each of the tower's 173 million outputs. Only values move, so every
//! version gives the same output.

/// `out[i * ld + j] = block[j * t + i]` for the `n = block.len() / t` rows of `block` and every
/// `i < t`, in the fastest version this CPU has.
///
/// # Safety
/// `t > 0`; `out` is valid for writes of `(t - 1) * ld + n` values, `n <= ld`, and nothing else
/// reads or writes `out[i * ld .. i * ld + n]` for any `i < t` meanwhile.
pub(super) unsafe fn transpose_into(block: &[f32], t: usize, out: *mut f32, ld: usize) {
    assert!(t > 0, "a transposition of no tokens");
    // The kernels' family, not only the CPU, chooses: a forced baseline (`QWEN3_KERNELS`, the
    // tests) takes the plain version, as it does for every other kernel.
    #[cfg(target_arch = "x86_64")]
    if super::vector_isa() != super::VectorIsa::Baseline && is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above); the caller's promise is passed on.
        return unsafe { transpose_avx(block, t, out, ld) };
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { transpose_plain(block, t, out, ld, 0..block.len() / t, 0..t) }
}

/// The plain version, for the rows `js` and the tokens `is` only (the AVX version's edges): 16
/// rows at a time, so that each token's 16 values fill one cache line of its output row while
/// the 16 rows of the block they come from stay in the L1 cache.
///
/// # Safety
/// As [`transpose_into`]'s, for `js` within `0..block.len() / t` and `is` within `0..t`.
unsafe fn transpose_plain(
    block: &[f32],
    t: usize,
    out: *mut f32,
    ld: usize,
    js: std::ops::Range<usize>,
    is: std::ops::Range<usize>,
) {
    let n = block.len() / t;
    assert!(block.len() == n * t && n <= ld && js.end <= n && is.end <= t);
    for j0 in js.clone().step_by(16) {
        let j1 = (j0 + 16).min(js.end);
        for i in is.clone() {
            for j in j0..j1 {
                // SAFETY: i < t and j < n <= ld (asserted), inside what the caller gave.
                unsafe { *out.add(i * ld + j) = block[j * t + i] };
            }
        }
    }
}

/// The AVX version: whole tiles of 8 rows by 8 tokens, the plain version for the rest.
///
/// # Safety
/// As [`transpose_into`]'s, and the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_avx(block: &[f32], t: usize, out: *mut f32, ld: usize) {
    let n = block.len() / t;
    assert!(block.len() == n * t && n <= ld);
    let (n8, t8) = (n / 8 * 8, t / 8 * 8);
    // Two tiles of rows for each 8 tokens, one after the other: a token's 16 values are one
    // 64-byte line of its output row, written whole while it is in the cache (a tile of 8 rows
    // at a time wrote each line in two halves, a whole pass over the tokens apart).
    for j16 in (0..n8).step_by(16) {
        for i0 in (0..t8).step_by(8) {
            for j0 in (j16..(j16 + 16).min(n8)).step_by(8) {
                // SAFETY: j0 + 8 <= n and i0 + 8 <= t; the caller's promise, passed on.
                unsafe { tile8(block, t, out, ld, j0, i0) }
            }
        }
    }
    // SAFETY (both): the caller's promise, for rows and tokens within the block.
    unsafe {
        // The tokens past the last whole tile, for the tiles' rows; then the rows past them.
        transpose_plain(block, t, out, ld, 0..n8, t8..t);
        transpose_plain(block, t, out, ld, n8..n, 0..t);
    }
}

/// Rows `j0 .. j0 + 8` of the block, tokens `i0 .. i0 + 8`: eight rows loaded as vectors, pairs
/// of rows interleaved, then pairs of pairs, then the two 128-bit halves swapped (the textbook
/// 8 x 8 transposition), each token's eight values stored to its output row.
///
/// # Safety
/// As [`transpose_into`]'s, with `j0 + 8 <= n` and `i0 + 8 <= t`; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn tile8(block: &[f32], t: usize, out: *mut f32, ld: usize, j0: usize, i0: usize) {
    use std::arch::x86_64::*;
    // SAFETY: row j0 + a of the block, values i0 .. i0 + 8: within it (unaligned loads).
    let r: [__m256; 8] = std::array::from_fn(|a| unsafe {
        _mm256_loadu_ps(block[(j0 + a) * t + i0..][..8].as_ptr())
    });
    let lo = |a: usize| _mm256_unpacklo_ps(r[a], r[a + 1]);
    let hi = |a: usize| _mm256_unpackhi_ps(r[a], r[a + 1]);
    let (t0, t1, t2, t3) = (lo(0), hi(0), lo(2), hi(2));
    let (t4, t5, t6, t7) = (lo(4), hi(4), lo(6), hi(6));
    let u = [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
        _mm256_shuffle_ps::<0x44>(t4, t6),
        _mm256_shuffle_ps::<0xEE>(t4, t6),
        _mm256_shuffle_ps::<0x44>(t5, t7),
        _mm256_shuffle_ps::<0xEE>(t5, t7),
    ];
    for i in 0..8 {
        // Token i0 + i: the low halves of u[0..4] for i < 4, the high halves for i >= 4.
        let c = match i < 4 {
            true => _mm256_permute2f128_ps::<0x20>(u[i], u[i + 4]),
            false => _mm256_permute2f128_ps::<0x31>(u[i - 4], u[i]),
        };
        // SAFETY: token i0 + i < t, values j0 .. j0 + 8 <= n <= ld of its output row: within
        // what the caller gave (unaligned stores).
        unsafe { _mm256_storeu_ps(out.add((i0 + i) * ld + j0), c) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{tests::FORCED_ISA, VectorIsa};

    /// Every version puts every value in its place, and touches nothing else: blocks with and
    /// without ragged edges, into a wider output whose other values must stay as they were.
    #[test]
    fn every_version_puts_each_value_in_its_place() {
        for isa in VectorIsa::ALL.iter().filter(|isa| isa.supported()) {
            for (n, t) in [(16, 8), (16, 784), (13, 21), (8, 1), (1, 9), (24, 17)] {
                let ld = n + 5;
                let block: Vec<f32> = (0..n * t).map(|v| v as f32).collect();
                let mut out = vec![-1.0f32; t * ld];
                FORCED_ISA.set(Some(*isa));
                // SAFETY: `out` holds t rows of ld >= n values, and nothing else touches it.
                unsafe { transpose_into(&block, t, out.as_mut_ptr(), ld) };
                FORCED_ISA.set(None);
                for i in 0..t {
                    for j in 0..ld {
                        let want = if j < n { block[j * t + i] } else { -1.0 };
                        assert_eq!(out[i * ld + j], want, "{isa:?} {n}x{t}: token {i}, row {j}");
                    }
                }
            }
        }
    }
}
