//! The q4 (W4A8) kernels on x86-64: AVX-512 VNNI on 512-bit vectors, one chunk of four groups
//! per step, and AVX2 (with `vpmaddubsw`, AVX-VNNI's or AVX-512's `vpdpbusd`) on 256-bit ones,
//! a chunk in two halves. Both read the activations in the layout `dot/q4.rs` describes, for
//! groups of 32; other group sizes take the reference.
//!
//! One step, for a chunk of 64 packed bytes (128 weights) of one row and one token:
//!
//! ```text
//! lo, hi   = bytes & 15, (bytes >> 4) & 15             the nibbles, q + 8, unsigned
//! isum     = corr + dot4(lo, x_lo) + dot4(hi, x_hi)    16 lanes, exact: sum(q * x) per 8 weights
//! acc     += float(isum) * x_scale * w_scale           each lane's group's scales
//! ```
//!
//! The weights' f16 scales are widened 16 at a time (`vcvtph2ps`) and spread to the lanes of
//! their group by one permute. Each (row, token) pair of a tile has its own accumulator, so a
//! tile's multiply-adds do not wait on each other (the AVX2 kernel, with one row a tile, gives
//! each half of a chunk its own). Every tile shape runs the same steps in the same order for
//! each pair, so decode (tiles of one token) and prefill give a prompt's tokens the same bits.
//!
//! The same kernels take q6 weights (`SIX`): a chunk is then 96 bytes, the nibbles as above and
//! 32 high bytes whose bits are ORed in above the nibbles, and the correction is taken four
//! times (`dot/q6.rs`).

use super::super::q4::{self, CHUNK, LANES};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::avx2::{dot8, hsum256};
use super::{PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;

/// [`super::super::MatQ4`] on AVX-512 VNNI, for q4 weights or (`SIX`) q6 ones (`dot/q6.rs`).
/// Decode (`t = 1`) takes four rows a tile, asking for the weights ahead as the q8 kernel does
/// (see [`PREFETCH_NEAR`]); prefill tiles are two weight rows against four tokens, each chunk of
/// weights unpacked once for four tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_q4_avx512<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.chunks == 0 {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    // Bytes this thread may prefetch, counted from the start of `w`. (A prompt's product, bound
    // by arithmetic, measured slower without the prefetches too.)
    let reach = w.len() + ahead;
    if x.t == 1 {
        // Decode: four rows a tile, the fixed costs of a tile (its setup, the sums across lanes)
        // shared by four rows' streams.
        return for_each_tile(rows, 1, 4, 1, |m, _, r, _| {
            // SAFETY: rows r..r+m exist (for_each_tile keeps them so) and `check_either` passed.
            match m {
                4 => tile_avx512::<4, 1, SIX>(w, ws, x, out, r, 0, reach),
                _ => tile_avx512::<1, 1, SIX>(w, ws, x, out, r, 0, reach),
            }
        });
    }
    for_each_tile(rows, x.t, 2, 4, |m, n, r, i| {
        // SAFETY: rows r..r+m and tokens i..i+n are in range (for_each_tile keeps them so), and
        // `q6::check_either` proved every slice has the length of its shape and the layout is for
        // groups of 32 and `chunks = cols / 128`.
        match (m, n) {
            (2, 4) => tile_avx512::<2, 4, SIX>(w, ws, x, out, r, i, reach),
            (2, 3) => tile_avx512::<2, 3, SIX>(w, ws, x, out, r, i, reach),
            (2, 2) => tile_avx512::<2, 2, SIX>(w, ws, x, out, r, i, reach),
            (2, _) => tile_avx512::<2, 1, SIX>(w, ws, x, out, r, i, reach),
            (_, 4) => tile_avx512::<1, 4, SIX>(w, ws, x, out, r, i, reach),
            (_, 3) => tile_avx512::<1, 3, SIX>(w, ws, x, out, r, i, reach),
            (_, 2) => tile_avx512::<1, 2, SIX>(w, ws, x, out, r, i, reach),
            _ => tile_avx512::<1, 1, SIX>(w, ws, x, out, r, i, reach),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`.
/// Prefetches weights up to `reach` bytes from the start of `w`. Caller guarantees the rows and
/// tokens exist, that `q6::check_either::<SIX>` passed and that `x.q4.chunks > 0`.
/// Then every read is in bounds: chunk `c < chunks = cols / 128` reads bytes `bc .. bc + b` of a
/// weight row (`b` = 64 for q4, 96 for q6: the nibbles, then 32 high bytes), within its
/// `cols / 128 * b` bytes, values `128c .. 128c + 128 <= cols` of a token's laid-out row, lanes
/// `16c .. 16c + 16 <= lanes` of its corrections and scales; the weight scales are read by a masked load
/// of `4 * n4` values from `4c`, which stays within `4 * chunks <= per` (masked-off elements are
/// not read and cannot fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_avx512<const R: usize, const N: usize, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: usize,
) {
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * LANES,
    );
    let chunk_bytes = q6::row_bytes::<SIX>(CHUNK);
    let w_at: [usize; R] = std::array::from_fn(|a| (r + a) * row_bytes);
    let w_row: [*const u8; R] = w_at.map(|at| w.as_ptr().add(at));
    let ws_row: [*const u16; R] = std::array::from_fn(|a| ws.as_ptr().add((r + a) * per));
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols));
    let corr_row: [*const i32; N] =
        std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * lanes));
    let xs_row: [*const f32; N] =
        std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * lanes));
    let (nibble, bits_4_5) = (_mm512_set1_epi8(15), _mm512_set1_epi8(0x30));
    // Lane l of chunk k (0..4) of a window of 16 groups has group 4k + l / 4.
    let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let idx: [__m512i; 4] =
        std::array::from_fn(|k| _mm512_add_epi32(spread, _mm512_set1_epi32(4 * k as i32)));
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    // Adds chunk c (the k-th of its window, whose weight scales are `d16`) into `acc`.
    let mut step = |c: usize, k: usize, d16: &[__m512; R]| {
        let off = chunk_bytes * c;
        for at in w_at {
            for dist in [PREFETCH_NEAR, PREFETCH_FAR] {
                if at + off + dist < reach {
                    // A prefetch never faults and has no effect on the program's meaning;
                    // `wrapping_add` may point past `w` (into the `ahead` bytes) without UB.
                    let p = w.as_ptr().wrapping_add(at + off + dist);
                    _mm_prefetch::<_MM_HINT_T2>(p as *const i8);
                }
            }
        }
        let wv: [__m512i; R] =
            std::array::from_fn(|a| _mm512_loadu_si512(w_row[a].add(off) as *const __m512i));
        let mut lo = wv.map(|v| _mm512_and_si512(v, nibble));
        let mut hi = wv.map(|v| _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
        if SIX {
            // The 32 high bytes after the nibbles: for nibble bytes 0..32 their bits 0-3, for
            // 32..64 their bits 4-7; `h` holds both, each nibble byte's pair at bits 0-1 (low
            // value) and 2-3 (high value), and each pair goes to bits 4-5 of its value.
            for a in 0..R {
                let hb = _mm256_loadu_si256(w_row[a].add(off + 64) as *const __m256i);
                let h =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 4));
                let h_lo = _mm512_and_si512(_mm512_slli_epi16(h, 4), bits_4_5);
                let h_hi = _mm512_and_si512(_mm512_slli_epi16(h, 2), bits_4_5);
                lo[a] = _mm512_or_si512(lo[a], h_lo);
                hi[a] = _mm512_or_si512(hi[a], h_hi);
            }
        }
        let d = d16.map(|v| _mm512_permutexvar_ps(idx[k], v));
        for j in 0..N {
            let x_lo = _mm512_loadu_si512(x_row[j].add(CHUNK * c) as *const __m512i);
            let x_hi = _mm512_loadu_si512(x_row[j].add(CHUNK * c + 64) as *const __m512i);
            let corr = _mm512_loadu_si512(corr_row[j].add(LANES * c) as *const __m512i);
            // q6 weights are q + 32, four times q4's offset of 8.
            let corr = if SIX {
                _mm512_slli_epi32(corr, 2)
            } else {
                corr
            };
            let xs = _mm512_loadu_ps(xs_row[j].add(LANES * c));
            for a in 0..R {
                let isum = _mm512_dpbusd_epi32(corr, lo[a], x_lo);
                let isum = _mm512_dpbusd_epi32(isum, hi[a], x_hi);
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), xs);
                acc[a][j] = _mm512_fmadd_ps(v, d[a], acc[a][j]);
            }
        }
    };
    let mut c = 0;
    while c < chunks {
        // The weight scales of the next (up to) 16 groups, widened from f16; a masked load
        // reads no scale past the row's full chunks.
        let n4 = (chunks - c).min(4);
        let mask: __mmask16 = if n4 == 4 { 0xffff } else { (1 << (4 * n4)) - 1 };
        let d16: [__m512; R] = std::array::from_fn(|a| {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                ws_row[a].add(4 * c) as *const i16,
            ))
        });
        for k in 0..n4 {
            step(c + k, k, &d16);
        }
        c += n4;
    }
    for (a, acc_a) in acc.iter().enumerate() {
        let (w_r, ws_r) = (
            &w[w_at[a]..w_at[a] + row_bytes],
            &ws[(r + a) * per..(r + a + 1) * per],
        );
        for (j, &acc_aj) in acc_a.iter().enumerate() {
            let sum = _mm512_reduce_add_ps(acc_aj);
            let tail =
                q6::tail_either::<SIX>(w_r, ws_r, x.q_row(i + j), x.scales_row(i + j), chunks);
            *out.get_unchecked_mut((r + a) * t + i + j) = sum + tail;
        }
    }
}

/// [`super::super::MatQ4`] on AVX2, multiplying bytes with the instructions `P` names (see
/// [`super::avx2::MADDUBS`]). As [`mat_q4_avx512`], with a chunk in two halves of 32 bytes and
/// tiles of one row by four tokens (sixteen 256-bit registers hold no more accumulators).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat_q4_avx2<const P: u8, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.chunks == 0 {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    let reach = w.len() + ahead;
    for_each_tile(rows, x.t, 1, 4, |_, n, r, i| {
        // SAFETY: as in mat_q4_avx512 (and the CPU has what `P` names: the dispatch's word).
        match n {
            4 => tile_avx2::<4, P, SIX>(w, ws, x, out, r, i, reach),
            3 => tile_avx2::<3, P, SIX>(w, ws, x, out, r, i, reach),
            2 => tile_avx2::<2, P, SIX>(w, ws, x, out, r, i, reach),
            _ => tile_avx2::<1, P, SIX>(w, ws, x, out, r, i, reach),
        }
    });
}

/// [`tile_avx512`] on 256-bit vectors for one weight row: the two halves of a chunk go to the
/// two accumulators. Caller guarantees what [`tile_avx512`]'s does, and that the CPU has the
/// instructions `P` names.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const N: usize, const P: u8, const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: usize,
) {
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per, lanes) = (
        q6::row_bytes::<SIX>(cols),
        cols / q4::SIMD_GROUP,
        chunks * LANES,
    );
    let chunk_bytes = q6::row_bytes::<SIX>(CHUNK);
    let w_at = r * row_bytes;
    let (w_row, ws_row) = (w.as_ptr().add(w_at), &ws[r * per..(r + 1) * per]);
    let x_row: [*const i8; N] = std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols));
    let corr_row: [*const i32; N] =
        std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * lanes));
    let xs_row: [*const f32; N] =
        std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * lanes));
    let (nibble, bits_4_5) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
    // Lane l of half h (0..2) of a chunk has the chunk's group 2h + l / 4.
    let spread = [
        _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0),
        _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2),
    ];
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for c in 0..chunks {
        let off = chunk_bytes * c;
        for dist in [PREFETCH_NEAR, PREFETCH_FAR] {
            if w_at + off + dist < reach {
                // As in tile_avx512: a hint, and `wrapping_add` may point past `w`.
                let p = w.as_ptr().wrapping_add(w_at + off + dist);
                _mm_prefetch::<_MM_HINT_T2>(p as *const i8);
            }
        }
        // The chunk's four weight scales, widened from f16 (8 bytes from 4c: within `per`).
        let d4 = _mm_cvtph_ps(_mm_loadl_epi64(ws_row.as_ptr().add(4 * c) as *const __m128i));
        let d8 = _mm256_castps128_ps256(d4);
        // q6: the chunk's high bytes, each nibble's two high bits moved to bits 4-5 (`dot/q6.rs`):
        // for the first half's low and high values, then the second half's.
        let high = match SIX {
            true => {
                let hb = _mm256_loadu_si256(w_row.add(off + 64) as *const __m256i);
                let keep = |v: __m256i| _mm256_and_si256(v, bits_4_5);
                [
                    [
                        keep(_mm256_slli_epi16(hb, 4)),
                        keep(_mm256_slli_epi16(hb, 2)),
                    ],
                    [keep(hb), keep(_mm256_srli_epi16(hb, 2))],
                ]
            }
            false => [[_mm256_setzero_si256(); 2]; 2],
        };
        for (h, acc_h) in acc.iter_mut().enumerate() {
            let wv = _mm256_loadu_si256(w_row.add(off + 32 * h) as *const __m256i);
            let mut lo = _mm256_and_si256(wv, nibble);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nibble);
            if SIX {
                lo = _mm256_or_si256(lo, high[h][0]);
                hi = _mm256_or_si256(hi, high[h][1]);
            }
            let d = _mm256_permutevar8x32_ps(d8, spread[h]);
            for j in 0..N {
                let x_lo = _mm256_loadu_si256(x_row[j].add(CHUNK * c + 32 * h) as *const __m256i);
                let x_hi =
                    _mm256_loadu_si256(x_row[j].add(CHUNK * c + 64 + 32 * h) as *const __m256i);
                let at = LANES * c + 8 * h;
                let corr = _mm256_loadu_si256(corr_row[j].add(at) as *const __m256i);
                // q6 weights are q + 32, four times q4's offset of 8.
                let corr = if SIX {
                    _mm256_slli_epi32(corr, 2)
                } else {
                    corr
                };
                // Weights are at most 63 and activations in [-127, 127], as dot8 asks.
                let isum = dot8::<P>(corr, lo, x_lo, hi, x_hi);
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_loadu_ps(xs_row[j].add(at)));
                acc_h[j] = _mm256_fmadd_ps(v, d, acc_h[j]);
            }
        }
    }
    let w_r = &w[w_at..w_at + row_bytes];
    for (j, (&first, &second)) in acc[0].iter().zip(&acc[1]).enumerate() {
        let sum = hsum256(_mm256_add_ps(first, second));
        let tail = q6::tail_either::<SIX>(w_r, ws_row, x.q_row(i + j), x.scales_row(i + j), chunks);
        *out.get_unchecked_mut(r * t + i + j) = sum + tail;
    }
}

#[cfg(test)]
mod tests {
    use super::super::avx2::EVEX_VNNI;
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::testing::next_values;

    /// The AVX2 kernel with `vpdpbusd` for its byte products (AVX-VNNI's form, here in its EVEX
    /// encoding, which AVX-512 machines run) against the reference: `dots()` hands that path out
    /// only on AVX-VNNI CPUs, which no machine here has.
    #[test]
    fn avx2_kernel_with_vnni_matches_the_reference() {
        if !(super::super::has_avx512() && super::super::has_avx2()) {
            eprintln!("no AVX-512 VNNI: skipping the EVEX form of the AVX2 q4 and q6 kernels");
            return;
        }
        let mut seed = 21;
        for six in [false, true] {
            for (rows, t, groups) in [(5, 1, 17), (3, 6, 8), (2, 2, 3), (2, 3, 7)] {
                let (gs, cols) = (32, 32 * groups);
                let w = next_values(rows * cols, &mut seed);
                let x = next_values(t * cols, &mut seed);
                let mut ws = vec![0u16; w.len() / gs];
                let packed = match six {
                    true => {
                        let mut p = vec![0u8; w.len() / 4 * 3];
                        crate::quant::quantize_q6(&w, cols, gs, &mut p, &mut ws);
                        p
                    }
                    false => {
                        let mut p = vec![0u8; w.len() / 2];
                        crate::quant::quantize_q4(&w, gs, &mut p, &mut ws);
                        p
                    }
                };
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4(&x, t, cols, gs);
                let (mut got, mut want) = (vec![f32::NAN; rows * t], vec![0f32; rows * t]);
                // SAFETY: the CPU has AVX-512 VNNI with VL (has_avx512) and AVX2, FMA, F16C
                // (has_avx2), all that this form of the kernel uses.
                match six {
                    true => unsafe {
                        mat_q4_avx2::<EVEX_VNNI, true>(&packed, &ws, &acts, &mut got, 0)
                    },
                    false => unsafe {
                        mat_q4_avx2::<EVEX_VNNI, false>(&packed, &ws, &acts, &mut got, 0)
                    },
                }
                match six {
                    true => q6::mat_q6_scalar(&packed, &ws, &acts, &mut want, 0),
                    false => q4::mat_q4_scalar(&packed, &ws, &acts, &mut want, 0),
                }
                for (k, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                        "{six} [{k}] {g} vs {e}"
                    );
                }
            }
        }
    }
}
