//! GGUF's Q4_K and Q6_K on AVX2 with eight weight rows side by side (`dot/k_interleaved.rs`,
//! [`KOrder::Rows8`]): a 32-bit lane is a row, so every sum stays in its row's lane and a set of
//! eight rows ends as one vector of eight products, with no adding across lanes. Per set of
//! eight rows, token and block of 256 (sub-block `j` of 32 values; `x` the token's int8 values,
//! one scale `xs` a block, `sum16` its sums of 16):
//!
//! ```text
//! lane r:  s_j   = sum_l q[r, j, l] x[j, l]      8 vpmaddubsw of (4 values x 8 rows) against a
//!                                                broadcast of 4 activations, added in 16 bits
//!          isum  = sum_j sc[r, j] s_j            one vpmaddwd a sub-block: sc as both words
//!          imin  = sum_j m[r, j] sum(x_j)        one vpmaddwd a sub-block, with its two sum16
//!          acc  += float(isum) (d[r] xs) - float(imin) (dmin[r] xs)
//! ```
//!
//! The 6-bit scales and minimums are unpacked for the eight rows at once (the three vectors of
//! the order's scale bytes, a few masks and shifts). In 16 bits a sub-block's 16 products a
//! lane add up to at most 8 * 2 * 15 * 128 = 30720; in 32, a block's to at most
//! 8 * 2 * 30720 * 63, and every integer sum is exact, so a prompt's tiles (up to [`TOKENS`]
//! tokens against the same unpacked weights) give each token decode's bits: the float steps are
//! the same for each token. Q6_K ([`tile6`]) is the same with its values made from two parts,
//! a sub-block of 16 and signed scales, and its offset of 32 in place of the minimums.
//!
//! Against the file-order kernel (`k_quants.rs`, a row at a time, the sub-blocks' sums across
//! lanes and their scales picked per pair): a third of the operations a block.

use super::super::k_interleaved::{KOrder, ROWS8_D, ROWS8_DMIN, ROWS8_Q6_D, ROWS8_SCALES};
use super::super::k_quants::{self, BLOCK};
use super::super::ActsQ8;
use super::q4::prefetch_lines;
use crate::format::KQuant;
use std::arch::x86_64::*;

/// Rows a set takes (a lane each).
const ROWS: usize = 8;

/// Tokens a prompt's tile takes: each token holds two vectors of 16-bit sums and one of 32-bit
/// ones through a pair, beside the unpacked weights: three tokens fill AVX2's sixteen registers.
const TOKENS: usize = 3;

/// [`super::super::MatK`] on AVX2 for Q4_K and Q6_K in [`KOrder::Rows8`]. Panics on Q5_K (never
/// reordered), or on rows not whole sets of eight (the order keeps the file's for such a
/// matrix).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat_k_rows8_avx2(
    kind: KQuant,
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    assert!(
        KOrder::Rows8.takes(kind),
        "{kind:?} is not laid out eight rows side by side"
    );
    // Panics unless the weights are whole rows of blocks of `x.cols`, the activations hold `t`
    // tokens with their scales and sums of 16, and `out` is `[rows, t]`.
    let rows = k_quants::check(kind, w, x, out);
    assert!(
        rows.is_multiple_of(ROWS),
        "{kind:?} eight rows side by side: {rows} rows are not whole sets of eight"
    );
    let (t, cols) = (x.t, x.cols);
    let (row, blocks) = (kind.row_bytes(cols), cols / BLOCK);
    let set = ROWS * row;
    let reach = w.len() + ahead;
    let k = &x.k;
    for (s, weights) in w.chunks_exact(set).enumerate() {
        let mut i = 0;
        while i < t {
            let n = (t - i).min(TOKENS);
            // Token j's values, block scales and sums of 16.
            let q = |j: usize| &k.q[(i + j) * cols..][..cols];
            let xs = |j: usize| &k.scales[(i + j) * blocks..][..blocks];
            let sums = |j: usize| &k.sums16[(i + j) * cols / 16..][..cols / 16];
            let (q2, xs2, sums2) = (|| [q(0), q(1)], || [xs(0), xs(1)], || [sums(0), sums(1)]);
            let q3 = || [q(0), q(1), q(2)];
            let (xs3, sums3) = (|| [xs(0), xs(1), xs(2)], || [sums(0), sums(1), sums(2)]);
            let at = (&mut *out, s, t, i);
            // The weights ahead, asked for block by block by the first tile of tokens.
            let ahead = if i == 0 { reach - s * set } else { 0 };
            // SAFETY: `check` gave every token `cols` values, `blocks` scales and `cols / 16`
            // sums, and `weights` is `blocks` sets of eight blocks; the caller, the features.
            unsafe {
                match (kind, n) {
                    (KQuant::Q4K, 1) => {
                        put(tile::<1>(weights, ahead, [q(0)], [xs(0)], [sums(0)]), at)
                    }
                    (KQuant::Q4K, 2) => put(tile::<2>(weights, ahead, q2(), xs2(), sums2()), at),
                    (KQuant::Q4K, _) => put(tile::<3>(weights, ahead, q3(), xs3(), sums3()), at),
                    (_, 1) => put(tile6::<1>(weights, ahead, [q(0)], [xs(0)], [sums(0)]), at),
                    (_, 2) => put(tile6::<2>(weights, ahead, q2(), xs2(), sums2()), at),
                    _ => put(tile6::<3>(weights, ahead, q3(), xs3(), sums3()), at),
                }
            }
            i += n;
        }
    }
}

/// Tokens `i..` of set `s`'s eight rows (lane `r` of `got[j]`: row `8s + r`, token `i + j`) into
/// `out`, `[rows, t]`. Caller guarantees AVX.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn put<const N: usize>(got: [__m256; N], at: (&mut [f32], usize, usize, usize)) {
    let (out, s, t, i) = at;
    if t == 1 {
        // Decode: the eight rows' values are next to each other.
        let row = &mut out[ROWS * s..ROWS * (s + 1)];
        // SAFETY: 8 floats into a slice of 8.
        return unsafe { _mm256_storeu_ps(row.as_mut_ptr(), got[0]) };
    }
    for (j, lanes) in got.iter().enumerate() {
        let mut v = [0f32; ROWS];
        // SAFETY: 8 floats into an array of 8.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), *lanes) };
        for (r, v) in v.into_iter().enumerate() {
            out[(s * ROWS + r) * t + i + j] = v;
        }
    }
}

/// One set of eight rows (`w`: its blocks, 1152 bytes each) against `N` tokens: lane `r` of
/// vector `j` is row `r`'s product with token `j`; each block first asks for the bytes
/// [`super::PREFETCH_NEAR`] and [`super::PREFETCH_FAR`] past it, up to `ahead` bytes from `w`'s
/// start. Caller guarantees AVX2, FMA and F16C, that
/// `w` holds `q[j].len() / 256` sets of blocks, and that each token has as many block scales
/// (`xs`) and sums of 16 (`sums`, 16 a block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const N: usize>(
    w: &[u8],
    ahead: usize,
    q: [&[i8]; N],
    xs: [&[f32]; N],
    sums: [&[i16]; N],
) -> [__m256; N] {
    let (m4, m6, m30) = (
        _mm256_set1_epi8(0x0f),
        _mm256_set1_epi8(0x3f),
        _mm256_set1_epi8(0x30),
    );
    // `vpshufb` picks: byte `b` of each 32-bit lane into both of its 16-bit words, zero-extended
    // (a sub-block's scale, or minimum, of each row as `vpmaddwd`'s pair).
    // SAFETY (both picks): this function's AVX2, which `per_lane` needs.
    let pick = |b: i32| unsafe {
        per_lane(|l| (4 * l + b) | (0x80 << 8) | (4 * l + b) << 16 | (0x80 << 24))
    };
    let picks = [pick(0), pick(1), pick(2), pick(3)];
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [_mm256_setzero_ps(); N];
    let set = ROWS * KQuant::Q4K.block_bytes();
    for b in 0..q[0].len() / BLOCK {
        // SAFETY: set `b` is bytes `set b.. + set` of `w` (the caller's length).
        let at = unsafe { w.as_ptr().add(b * set) };
        if ahead > 0 {
            prefetch_lines(w, b * set, set, ahead);
        }
        // SAFETY (every `load`): offsets below `set` (1152): the order's 36 vectors.
        let load = |o: usize| unsafe { _mm256_loadu_si256(at.add(o) as *const __m256i) };
        // 1. The scales and minimums, byte j of lane r being row r's sub-block j (or j + 4)
        //    (gguf's get_scale_min_k4): the scale bytes s0..s4, s4..s8, s8..s12 of each row
        //    are the three vectors `a`, `b`, `c`.
        let (a, bb, c) = (
            load(ROWS8_SCALES),
            load(ROWS8_SCALES + 32),
            load(ROWS8_SCALES + 64),
        );
        let high = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16::<2>(v), m30);
        // sc_j = s_j & 63 (j < 4); (s_j+4 & 15) | (s_j-4 >> 6) << 4 (j >= 4).
        let sc = [
            _mm256_and_si256(a, m6),
            _mm256_or_si256(_mm256_and_si256(c, m4), high(a)),
        ];
        // m_j = s_j+4 & 63 (j < 4); (s_j+4 >> 4) | (s_j >> 6) << 4 (j >= 4).
        let m = [
            _mm256_and_si256(bb, m6),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(c), m4), high(bb)),
        ];
        // 2. Each pair p of sub-blocks (2p: the low nibbles, 2p + 1: the high ones): eight
        //    words of 4 values a row, each against a broadcast of its 4 activations.
        let mut isum = [_mm256_setzero_si256(); N];
        for p in 0..4 {
            let mut lo16 = [_mm256_setzero_si256(); N];
            let mut hi16 = [_mm256_setzero_si256(); N];
            for k in 0..8 {
                let v = load(32 * (8 * p + k));
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                for j in 0..N {
                    // SAFETY: values 256b + 64p + 4k.. + 4 and 32 on of the token's
                    // `q[0].len()`, whole blocks (the caller's).
                    let x = unsafe { q[j].as_ptr().add(BLOCK * b + 64 * p + 4 * k) };
                    let (xl, xh) = unsafe { (broadcast4(x), broadcast4(x.add(32))) };
                    lo16[j] = _mm256_add_epi16(lo16[j], _mm256_maddubs_epi16(lo, xl));
                    hi16[j] = _mm256_add_epi16(hi16[j], _mm256_maddubs_epi16(hi, xh));
                }
            }
            let (s0, s1) = (2 * p, 2 * p + 1);
            let sc0 = _mm256_shuffle_epi8(sc[s0 / 4], picks[s0 % 4]);
            let sc1 = _mm256_shuffle_epi8(sc[s1 / 4], picks[s1 % 4]);
            for j in 0..N {
                let scaled = _mm256_add_epi32(
                    _mm256_madd_epi16(lo16[j], sc0),
                    _mm256_madd_epi16(hi16[j], sc1),
                );
                isum[j] = _mm256_add_epi32(isum[j], scaled);
            }
        }
        // 3. The minimums' part: m_j times the sub-block's two sums of 16, a `vpmaddwd`.
        let mut imin = [_mm256_setzero_si256(); N];
        for s in 0..8 {
            let ms = _mm256_shuffle_epi8(m[s / 4], picks[s % 4]);
            for j in 0..N {
                // SAFETY: sums 16b + 2s, + 1 of the token's (the caller's: 16 a block).
                let pair = unsafe { broadcast4(sums[j].as_ptr().add(16 * b + 2 * s) as *const i8) };
                imin[j] = _mm256_add_epi32(imin[j], _mm256_madd_epi16(ms, pair));
            }
        }
        // 4. One conversion a block: d[r] xs and dmin[r] xs (each an f16 times an f32).
        // SAFETY: the eight d and dmin (f16) at their offsets, 16 bytes each, below `set`.
        let (d, dmin) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(at.add(ROWS8_D) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(at.add(ROWS8_DMIN) as *const __m128i)),
            )
        };
        for j in 0..N {
            // SAFETY: block b's scale (the caller's length).
            let x = _mm256_set1_ps(unsafe { *xs[j].get_unchecked(b) });
            let (dx, mx) = (_mm256_mul_ps(d, x), _mm256_mul_ps(dmin, x));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), dx, acc[j]);
            mins[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[j]), mx, mins[j]);
        }
    }
    std::array::from_fn(|j| _mm256_sub_ps(acc[j], mins[j]))
}

/// [`tile`] for Q6_K: its sets of eight blocks (1680 bytes, `dot/k_interleaved.rs`), each value
/// `q + 32` (0..=63) made from its `ql` nibble and its two `qh` bits, a sub-block of 16 values
/// (four words of 4) scaled by its signed 8-bit scale. In 16 bits two products of a lane are at
/// most 2 * 2 * 63 * 128 = 32256, so each pair of words takes one `vpmaddwd` with the sub-block's
/// scale; the offset, `32 sc_s sum(x_s)` a sub-block, comes off the integer sum from the
/// activations' sums of 16, two sub-blocks a `vpmaddwd`. Caller guarantees what [`tile`]'s
/// does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile6<const N: usize>(
    w: &[u8],
    ahead: usize,
    q: [&[i8]; N],
    xs: [&[f32]; N],
    sums: [&[i16]; N],
) -> [__m256; N] {
    let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    // `vpshufb` picks of byte `a` and byte `b` of each 32-bit lane into the high bytes of its
    // two 16-bit words (then shifted down with their signs: the signed scales as `vpmaddwd`'s
    // pair).
    // SAFETY: this function's AVX2, which `per_lane` needs.
    let pick = |a: i32, b: i32| unsafe {
        per_lane(|l| 0x80 | (4 * l + a) << 8 | 0x80 << 16 | (4 * l + b) << 24)
    };
    let signed = |v: __m256i, p: __m256i| _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(v, p));
    let mut acc = [_mm256_setzero_ps(); N];
    let set = ROWS * KQuant::Q6K.block_bytes();
    for b in 0..q[0].len() / BLOCK {
        // SAFETY: set `b` is bytes `set b.. + set` of `w` (the caller's length).
        let at = unsafe { w.as_ptr().add(b * set) };
        if ahead > 0 {
            prefetch_lines(w, b * set, set, ahead);
        }
        // SAFETY (every `load`): words below 52, 32 bytes each: within the set's 1680 bytes.
        let load = |word: usize| unsafe { _mm256_loadu_si256(at.add(32 * word) as *const __m256i) };
        // 1. The offsets: -32 sum_s sc_s sum(x_s), the scales of sub-blocks 2u, 2u + 1 (word
        //    48 + u / 2, bytes 2u % 4 and + 1: the scales' words are 48..52) against their two
        //    sums of 16.
        let mut isum = [_mm256_setzero_si256(); N];
        for u in 0..8 {
            let bytes = (2 * (u % 2)) as i32;
            let sc = signed(load(48 + u / 2), pick(bytes, bytes + 1));
            for j in 0..N {
                // SAFETY: sums 16b + 2u, + 1 of the token's (the caller's: 16 a block).
                let pair = unsafe { broadcast4(sums[j].as_ptr().add(16 * b + 2 * u) as *const i8) };
                isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(sc, pair));
            }
        }
        for v in isum.iter_mut() {
            *v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(*v));
        }
        let mut scales = [_mm256_setzero_si256(); 4];
        // 2. Half n, words k and k + 1 of each of its four runs of 32 values (c: values
        //    128n + 32c + 4k..; sub-block 8n + 2c + k / 4): `ql` words 16n + 8c' + k (c' = c % 2;
        //    low nibbles for c < 2, high ones above), `qh` word 8n + k's bits 2c..2c + 2.
        for n in 0..2 {
            for k in (0..8).step_by(2) {
                // Run c's sub-block's scale in both words of each row's lane, sign-extended:
                // made for words 0 and 4, kept for 2 and 6.
                if k % 4 == 0 {
                    scales = std::array::from_fn(|c| {
                        let s = 8 * n + 2 * c + k / 4;
                        let byte = (s % 4) as i32;
                        signed(load(48 + s / 4), pick(byte, byte))
                    });
                }
                let parts =
                    |k: usize| (load(16 * n + k), load(16 * n + 8 + k), load(32 + 8 * n + k));
                let (l0, l1) = (parts(k), parts(k + 1));
                // Run c of words k and k + 1, q + 32 (0..=63) in each byte.
                let value = |(lo, hi, qh): (__m256i, __m256i, __m256i), c: usize| {
                    let nibbles = match c {
                        0 => _mm256_and_si256(lo, m4),
                        1 => _mm256_and_si256(hi, m4),
                        2 => _mm256_and_si256(_mm256_srli_epi16::<4>(lo), m4),
                        _ => _mm256_and_si256(_mm256_srli_epi16::<4>(hi), m4),
                    };
                    let bits = match c {
                        0 => _mm256_slli_epi16::<4>(qh),
                        1 => _mm256_slli_epi16::<2>(qh),
                        2 => qh,
                        _ => _mm256_srli_epi16::<2>(qh),
                    };
                    _mm256_or_si256(nibbles, _mm256_and_si256(bits, m30))
                };
                for (c, &sc) in scales.iter().enumerate() {
                    let (v0, v1) = (value(l0, c), value(l1, c));
                    for j in 0..N {
                        // SAFETY: values 256b + 128n + 32c + 4k.. + 8 of the token's (whole
                        // blocks, the caller's).
                        let x = unsafe { q[j].as_ptr().add(BLOCK * b + 128 * n + 32 * c + 4 * k) };
                        let (x0, x1) = unsafe { (broadcast4(x), broadcast4(x.add(4))) };
                        let two = _mm256_add_epi16(
                            _mm256_maddubs_epi16(v0, x0),
                            _mm256_maddubs_epi16(v1, x1),
                        );
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(two, sc));
                    }
                }
            }
        }
        // 3. One conversion a block: d[r] xs.
        // SAFETY: the eight d (f16), 16 bytes at their offset, below `set`.
        let d = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.add(ROWS8_Q6_D) as *const __m128i)) };
        for j in 0..N {
            // SAFETY: block b's scale (the caller's length).
            let x = _mm256_set1_ps(unsafe { *xs[j].get_unchecked(b) });
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(d, x), acc[j]);
        }
    }
    acc
}

/// A `vpshufb` control whose 32-bit lane `l` of each 128-bit half (0..4) is `lane(l)`: the
/// shuffle picks within halves, so both halves are the same.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn per_lane(lane: impl Fn(i32) -> i32) -> __m256i {
    let (a, b, c, d) = (lane(0), lane(1), lane(2), lane(3));
    _mm256_setr_epi32(a, b, c, d, a, b, c, d)
}

/// The 4 bytes at `p` in every 32-bit lane. Caller guarantees AVX2 and 4 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast4(p: *const i8) -> __m256i {
    // SAFETY: the caller's 4 bytes; an unaligned read.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}
