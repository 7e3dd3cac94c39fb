//! GGUF's Q4_K, Q5_K and Q6_K blocks against q8 activations on AVX2 and on AVX-512, read where
//! the GGUF holds them (`dot/k_quants.rs` has the scalar reference and the math). Q5_K is Q4_K
//! with a fifth bit a weight, ORed in above the nibble.
//!
//! A block's 256 weights meet 256 activations under one scale (`x = xs qx`, quantized per block
//! as llama.cpp's Q8_K: `dot/k_quants.rs`), so its sub-blocks' products, each times its integer
//! scale, add up as integers, converted and scaled once a block:
//!
//! ```text
//! AVX2     two groups of 32 whose weights share 32 bytes at once, the activations laid out to
//!          match (`ActsK`): two vpmaddubsw (u8 x i8 pairs, 16 bits) added, vpmaddwd with the
//!          sub-blocks' integer scales (32 bits), added to the block's integer lanes
//! AVX-512  two groups a 512-bit vector (their 64 activations are contiguous), vpdpbusd; two
//!          such vectors packed to 16 bits, vpmaddwd with the sub-blocks' integer scales, added
//!          to the block's integer lanes
//! both     one conversion and one multiply-add by d xs a block
//!
//! Q4_K, Q5_K: - dmin m xs sum(qx)                        once a block, 8 lanes (sub-blocks)
//! Q6_K:   - 32 sc sum(qx)  (the weights are q + 32)      once a block, in the integer lanes,
//!                                                        from the sums of 16
//! ```
//!
//! The activations' sums of 16 values and the AVX2 order are made once, when they are quantized
//! ([`ActsQ8::k`]). A row meets up to [`TOKENS`] tokens at once (a prompt's), its blocks
//! unpacked once for them, and each (row, token) runs decode's operations in decode's order, so
//! a prompt gets decode's bits.

use super::super::k_quants::{BLOCK, GROUP};
use super::super::ActsQ8;
use crate::format::KQuant;
use crate::gguf::blocks::scales_mins;
use std::arch::x86_64::*;

/// [`super::super::MatK`] on AVX2.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat_k_avx2(kind: KQuant, w: &[u8], x: &ActsQ8, out: &mut [f32], ahead: usize) {
    // SAFETY: `mat_k` calls the tile only on what `check` checked (its contract), and the
    // caller's AVX2, FMA and F16C are the features `tiles_avx2` needs.
    let reach = Some(w.len() + ahead);
    unsafe {
        match kind {
            KQuant::Q4K => mat_k(kind, w, x, out, tiles_avx2::<4>, reach),
            KQuant::Q5K => mat_k(kind, w, x, out, tiles_avx2::<5>, reach),
            KQuant::Q6K => mat_k(kind, w, x, out, tiles_avx2::<6>, reach),
        }
    }
}

/// [`super::super::MatK`] on AVX-512 (F, BW, VL, VNNI).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_k_avx512(
    kind: KQuant,
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    // SAFETY: as `mat_k_avx2`, with the AVX-512 features `tiles_avx512` needs.
    let reach = Some(w.len() + ahead);
    unsafe {
        match kind {
            KQuant::Q4K => mat_k(kind, w, x, out, tiles_avx512::<4>, reach),
            KQuant::Q5K => mat_k(kind, w, x, out, tiles_avx512::<5>, reach),
            KQuant::Q6K => mat_k(kind, w, x, out, tiles_avx512::<6>, reach),
        }
    }
}

/// Rows `r0..r1` of a matrix (`row` bytes each) against one tile of 1 to [`TOKENS`] tokens, the
/// tokens `first..` of `t`: `out[r * t + first + j]` is row `r`'s product with the tile's token
/// `j`. With `reach`, each row first prefetches (see [`mat_k`]).
#[derive(Clone, Copy)]
struct Rows {
    r0: usize,
    r1: usize,
    row: usize,
    t: usize,
    first: usize,
    reach: Option<usize>,
}

/// The products of [`Rows`] of the matrix `w` with `tokens`, written into `out` (`[rows, t]`).
///
/// # Safety
/// The CPU has the tile's features; `w` is the matrix, rows of `row` bytes, each whole blocks
/// of its type of every token's `cols` weights (`x.len()`); `out` is `[rows, t]`; each token's
/// `xs` holds `cols / 256` scales and `sums` `cols / 16` sums; `tokens` holds 1 to [`TOKENS`]
/// tokens.
type Tile = unsafe fn(w: &[u8], rows: Rows, tokens: &[Token], out: &mut [f32]);

/// The products of `w` (whole blocks of `x.cols`) with the tokens of `x`: each row against
/// tiles of up to [`TOKENS`] tokens, its blocks unpacked once a tile (`tile`).
///
/// `reach`: with `Some`, each row first asks for the bytes [`super::PREFETCH_NEAR`] and
/// [`super::PREFETCH_FAR`] past it, up to `reach` bytes from the start of `w` (the q4 kernels'
/// prefetch, `q4::prefetch_lines`). AVX2 asks: on a Zen 3 VM a one-thread decode of
/// Qwen3.5-0.8B's Q4_K_M ran 13.8 tok/s against 13.0 without (medians of six alternated runs),
/// two threads 24.0 against 21.6. AVX-512 asks too: on a Sapphire Rapids-class Xeon VM
/// (2026-12-03) its kernel without the prefetch streamed a 65536 x 1024 Q4_K matrix from memory
/// at 15-17 GMAC/s and with it at 31-32 (Q6_K 12 and 26), and a one-thread decode of Qwen3-0.6B's
/// shape in Q4_K_M ran 27.3-27.4 tok/s against 17.2-17.5 (two threads 49.9-50.6 against
/// 31.8-32.9; two alternated rounds). On a Zen 4 VM (2026-11) the same prefetch had made that
/// decode slower, 31-32 tok/s against 33-37 (three rounds): not measured there since; if it
/// still loses there, spreading a row's prefetches among its arithmetic (as the interleaved
/// kernels do, `interleaved.rs`) is what helped the q4 kernels on Zen 5.
///
/// Each token's slices are made once a call, not once a row: made per row and tile, they cost a
/// one-thread decode of that Q4_K_M 9% (11.0 tok/s against 12.2, six alternated runs).
///
/// # Safety
/// The CPU has `tile`'s features.
unsafe fn mat_k(
    kind: KQuant,
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    tile: Tile,
    reach: Option<usize>,
) {
    // Panics unless the weights are whole blocks of `cols`, the activations in groups of 32 with
    // their sums of 16, and `out` is `[rows, t]`: then every token below has what `Tile` needs.
    let rows = super::super::k_quants::check(kind, w, x, out);
    let (t, cols, row) = (x.t, x.cols, kind.row_bytes(x.cols));
    let (blocks, per16, per32) = (cols / BLOCK, cols / 16, cols / GROUP);
    let k = &x.k;
    // Each token's slices, made once for every weight row.
    let tokens: Vec<Token> = (0..t)
        .map(|i| Token {
            x: &k.q[i * cols..(i + 1) * cols],
            xs: &k.scales[i * blocks..(i + 1) * blocks],
            sums: &k.sums16[i * per16..(i + 1) * per16],
            kx: &k.x[i * cols..(i + 1) * cols],
            kx6: &k.x6[i * cols..(i + 1) * cols],
            kmins: &k.mins[i * per32..(i + 1) * per32],
        })
        .collect();
    // A prompt's tiles go over [`ROWS`] rows at a time, so that a tile's activations stay in the
    // nearest cache while they meet those rows (a prompt of 128 tokens is 200 KB of them, read
    // once a row otherwise), and the rows' blocks stay there for the next tile.
    for r0 in (0..rows).step_by(ROWS) {
        for (n, tile_tokens) in tokens.chunks(TOKENS).enumerate() {
            let rows = Rows {
                r0,
                r1: (r0 + ROWS).min(rows),
                row,
                t,
                first: n * TOKENS,
                // The next rows' bytes, asked for once (decode has one tile).
                reach: reach.filter(|_| n == 0),
            };
            // SAFETY: `check` gave the lengths `Tile` asks; the caller, the features.
            unsafe { tile(w, rows, tile_tokens, out) };
        }
    }
}

/// `$dot::<n, $($c),*>` of each of `$rows` with the tile's `n` tokens (1 to [`TOKENS`]), into
/// `$out`. The rows' loop is written out in each tile, where the product is inlined: one call a
/// row through a pointer cost the file-order AVX-512 products of 1024-column rows 6-8% on a Zen
/// 4 core (kernel bench, one token).
macro_rules! by_tokens {
    ($dot:ident $(, $c:expr)*; $w:expr, $rows:expr, $tokens:expr, $out:expr) => {{
        let tk = |j: usize| $tokens[j];
        match $tokens.len() {
            1 => each_row!($w, $rows, $out, |w_r| $dot::<1 $(, $c)*>(w_r, [tk(0)])),
            2 => each_row!($w, $rows, $out, |w_r| $dot::<2 $(, $c)*>(w_r, [tk(0), tk(1)])),
            3 => each_row!($w, $rows, $out, |w_r| $dot::<3 $(, $c)*>(w_r, [tk(0), tk(1), tk(2)])),
            4 => each_row!($w, $rows, $out, |w_r| {
                $dot::<4 $(, $c)*>(w_r, [tk(0), tk(1), tk(2), tk(3)])
            }),
            n => unreachable!("a tile of {n} tokens: `mat_k` makes tiles of 1 to {TOKENS}"),
        }
    }};
}

/// For each row of `$rows`: its prefetch, then `$dot` of its bytes `$w_r` into `$out`.
macro_rules! each_row {
    ($w:expr, $rows:expr, $out:expr, |$w_r:ident| $dot:expr) => {{
        let Rows {
            r0,
            r1,
            row,
            t,
            first,
            reach,
        } = $rows;
        for r in r0..r1 {
            if let Some(reach) = reach {
                super::q4::prefetch_lines($w, r * row, row, reach);
            }
            let $w_r = &$w[r * row..(r + 1) * row];
            let got = $dot;
            $out[r * t + first..r * t + first + got.len()].copy_from_slice(&got);
        }
    }};
}

/// [`Tile`] on AVX2 for blocks of `BITS` bits a weight (4: Q4_K, 5: Q5_K, 6: Q6_K); its
/// contract: AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<const BITS: u8>(w: &[u8], rows: Rows, tokens: &[Token], out: &mut [f32]) {
    // SAFETY: the caller keeps `Tile`'s contract, which is the dot products'.
    unsafe {
        match BITS {
            6 => by_tokens!(dot_q6_k; w, rows, tokens, out),
            5 => by_tokens!(dot_q4_k, true; w, rows, tokens, out),
            _ => by_tokens!(dot_q4_k, false; w, rows, tokens, out),
        }
    }
}

/// [`Tile`] on AVX-512, as [`tiles_avx2`]; its contract: AVX-512 F, BW, VL, VNNI, and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles_avx512<const BITS: u8>(w: &[u8], rows: Rows, tokens: &[Token], out: &mut [f32]) {
    // SAFETY: as `tiles_avx2`.
    unsafe {
        match BITS {
            6 => by_tokens!(dot_q6_k_512; w, rows, tokens, out),
            5 => by_tokens!(dot_q4_k_512, true; w, rows, tokens, out),
            _ => by_tokens!(dot_q4_k_512, false; w, rows, tokens, out),
        }
    }
}

/// Tokens a tile takes: each block of a weight row unpacked once for all of them.
const TOKENS: usize = 4;

/// Rows a prompt's tiles go over before the next tile (see [`mat_k`]): 16 rows of Q6_K of 1024
/// columns are 13 KB, which with a tile's activations (6.5 KB) fit a 32 KB first-level cache.
const ROWS: usize = 16;

/// One token's activations as [`ActsK`](super::super::k_quants::ActsK) holds them: its `cols`
/// int8 values, their scales (one a block), their sums per 16; and for the AVX2 kernels the
/// same values in pairs of groups and the minimums' factors.
#[derive(Clone, Copy)]
struct Token<'a> {
    x: &'a [i8],
    xs: &'a [f32],
    sums: &'a [i16],
    kx: &'a [i8],
    kx6: &'a [i8],
    kmins: &'a [f32],
}

/// One Q4_K row (with `FIVE`, Q5_K) against `N` tokens, a pair of sub-blocks at a time in the
/// activations' order of [`ActsK`](super::super::k_quants::ActsK): the pair's two vectors of
/// weights meet their 64 activations in two `vpmaddubsw`, added in 16 bits (at most
/// 2 * 2 * 31 * 127), then one `vpmaddwd` with the sub-blocks' integer scales (lane by lane:
/// `sc_2p` or `sc_2p+1`), added to the block's integer lanes. A block's lanes are then
/// converted and scaled by `d xs` once, and its minimums' part, `dmin m_j xs sum(qx_j)`, taken
/// from the activations' precomputed `xs sum(qx_j)`. Caller guarantees AVX2, FMA and F16C, and
/// `Tile`'s lengths.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k<const N: usize, const FIVE: bool>(w: &[u8], tokens: [Token; N]) -> [f32; N] {
    let kind = if FIVE { KQuant::Q5K } else { KQuant::Q4K };
    let nibble = _mm256_set1_epi8(15);
    let sixteen = _mm256_set1_epi8(16);
    // A's shifts: even lanes keep the low nibbles, odd lanes bring the high ones down.
    let shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [_mm256_setzero_ps(); N];
    for (b, block) in w.chunks_exact(kind.block_bytes()).enumerate() {
        // Q5_K: 32 bytes of fifth bits (bit i of byte l: value l of sub-block i) before the
        // nibbles.
        let (qh, qs) = match FIVE {
            true => (&block[16..48], &block[48..]),
            false => (&block[16..16], &block[16..]),
        };
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (sc, m) = scales_mins(&block[4..16]);
        // Lane j: dmin m_j; and word j of each 128-bit half: sc_j (16 bits), for the pairs'
        // `vpshufb` picks below.
        let dm = _mm256_mul_ps(bytes_as_lanes(m), _mm256_set1_ps(dmin));
        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let qh = match FIVE {
            // SAFETY: qh is 32 bytes (Q5_K's). B's bits are A's with neighbouring lanes swapped.
            true => {
                let a = _mm256_loadu_si256(qh.as_ptr() as *const __m256i);
                [a, _mm256_shuffle_epi32::<0xb1>(a)]
            }
            false => [_mm256_setzero_si256(); 2],
        };
        // Each token's integer sum of the block's scaled products, lane by lane (at most
        // 4 * 2 * 63 * 2 * 2 * 31 * 128 in magnitude).
        let mut isums = [_mm256_setzero_si256(); N];
        for p in 0..BLOCK / 64 {
            // SAFETY: qs is 128 bytes (a whole block's), so bytes 32p..32p + 32 are in it.
            let v = _mm256_loadu_si256(qs.as_ptr().add(32 * p) as *const __m256i);
            let mut ab = [v, _mm256_shuffle_epi32::<0xb1>(v)]
                .map(|v| _mm256_and_si256(_mm256_srlv_epi32(v, shifts), nibble));
            if FIVE {
                // q + 16 where the value's fifth bit is set: bit 2p (even lanes) or 2p + 1 (odd
                // lanes) of its qh byte, which lies where the value's nibble lies.
                let (lo, hi) = (1u64 << (2 * p), 1u64 << (2 * p + 1));
                let bit = _mm256_set1_epi64x(((hi << 32 | lo) * 0x0101_0101) as i64);
                for (q, h) in ab.iter_mut().zip(qh) {
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
                    *q = _mm256_or_si256(*q, _mm256_and_si256(set, sixteen));
                }
            }
            // Lane l: sub-block 2p (even l) or 2p + 1's scale in both 16-bit halves
            // (`vpmaddwd`'s pairs): words 2p and 2p + 1 picked by bytes (`vpshufb`, within
            // 128-bit halves; on a Zen 3 core 0.18 ns a shuffle against `vpermd`'s 0.49, a loop
            // of each alone).
            let scp = _mm256_shuffle_epi8(sc, pick_words(2 * p, 2 * p + 1, 2 * p, 2 * p + 1));
            let pair = 4 * b + p;
            for (k, tk) in tokens.iter().enumerate() {
                // SAFETY: pair `pair` of the row is laid-out values 64 pair.. + 64 (the
                // caller's lengths).
                let at = tk.kx.as_ptr().add(64 * pair);
                let xa = _mm256_loadu_si256(at as *const __m256i);
                let xb = _mm256_loadu_si256(at.add(32) as *const __m256i);
                let q16 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(ab[0], xa),
                    _mm256_maddubs_epi16(ab[1], xb),
                );
                isums[k] = _mm256_add_epi32(isums[k], _mm256_madd_epi16(q16, scp));
            }
        }
        for (k, tk) in tokens.iter().enumerate() {
            // SAFETY: block b's scale is `xs[b]`, its 8 groups `mins` 8b..8b + 8 (the
            // caller's lengths).
            let dx = _mm256_set1_ps(d * *tk.xs.get_unchecked(b));
            let kmins = _mm256_loadu_ps(tk.kmins.as_ptr().add(8 * b));
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isums[k]), dx, acc[k]);
            mins[k] = _mm256_fmadd_ps(dm, kmins, mins[k]);
        }
    }
    std::array::from_fn(|k| sum8(_mm256_sub_ps(acc[k], mins[k])))
}

/// The `vpshufb` bytes that fill each 32-bit lane with one 16-bit word twice: in the low 128-bit
/// half, lanes 0 and 2 with word `a`, lanes 1 and 3 with word `b`; in the high half, `c` and `d`
/// (words 0..8 of that half). Caller guarantees AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pick_words(a: usize, b: usize, c: usize, d: usize) -> __m256i {
    let twice = |w: usize| {
        (2 * w as i32) | (2 * w as i32 + 1) << 8 | (2 * w as i32) << 16 | (2 * w as i32 + 1) << 24
    };
    _mm256_setr_epi32(
        twice(a),
        twice(b),
        twice(a),
        twice(b),
        twice(c),
        twice(d),
        twice(c),
        twice(d),
    )
}

/// The 8 bytes of `v` as 8 float lanes, byte j in lane j. Caller guarantees AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes_as_lanes(v: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
}

/// One Q6_K row against `N` tokens, as [`dot_q4_k`]: a pair of groups `4m + c`, `4m + c + 2`
/// shares 32 bytes of `ql` (low and high nibbles) and 32 of `qh` (bits `2c` and `2c + 4`), in the
/// activations' order of [`ActsK`](super::super::k_quants::ActsK)'s `x6`. The weights are `q +
/// 32` (0..=63), so two `vpmaddubsw` add up in 16 bits (at most 2 * 2 * 63 * 127 = 32004), and
/// the offset, `32 sc_s sum(qx_s)` a sub-block, comes off the block's integer lanes from the
/// activations' sums of 16.
/// Caller guarantees AVX2, FMA and F16C, and `Tile`'s lengths.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k<const N: usize>(w: &[u8], tokens: [Token; N]) -> [f32; N] {
    let (nibble, bits_4_5) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
    let shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, block) in w.chunks_exact(KQuant::Q6K.block_bytes()).enumerate() {
        let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        // SAFETY: 16 scale bytes.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales.as_ptr() as *const __m128i));
        // Per half n of the block, word j of each 128-bit half: sub-block 8n + j's scale (16
        // bits), for the pairs' `vpshufb` picks below.
        let dup = [
            _mm256_permute2x128_si256::<0x00>(sc16, sc16),
            _mm256_permute2x128_si256::<0x11>(sc16, sc16),
        ];
        // Each token's integer sum of the block's scaled products, less the weights' offset:
        // lane g starts at -32 (sc_2g sum(qx_2g) + sc_2g+1 sum(qx_2g+1)), one `vpmaddwd` of
        // the scales and the sums of 16 (at most 32 * 2 * 128 * 16 * 128, and the products'
        // 4 * 2 * 128 * 2 * 2 * 63 * 128, in magnitude).
        let mut isums: [__m256i; N] = std::array::from_fn(|k| {
            // SAFETY: 16 sums from 16b (the caller's lengths).
            let sums16 = _mm256_loadu_si256(tokens[k].sums.as_ptr().add(16 * b) as *const __m256i);
            _mm256_slli_epi32(
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(sc16, sums16)),
                5,
            )
        });
        for (n, dup) in dup.iter().enumerate() {
            // SAFETY: qh is 64 bytes: these are bytes 32n..32n + 32, and B's with neighbouring
            // lanes swapped.
            let h = _mm256_loadu_si256(qh.as_ptr().add(32 * n) as *const __m256i);
            let h = [h, _mm256_shuffle_epi32::<0xb1>(h)];
            for c in 0..2 {
                // SAFETY: ql is 128 bytes: bytes 64n + 32c.. + 32 are in it.
                let v = _mm256_loadu_si256(ql.as_ptr().add(64 * n + 32 * c) as *const __m256i);
                // The high bits: 2c of the qh byte (even lanes), 2c + 4 (odd), moved to 4-5.
                let hs = _mm256_setr_epi32(
                    2 * c as i32,
                    2 * c as i32 + 4,
                    2 * c as i32,
                    2 * c as i32 + 4,
                    2 * c as i32,
                    2 * c as i32 + 4,
                    2 * c as i32,
                    2 * c as i32 + 4,
                );
                let ab = [(v, h[0]), (_mm256_shuffle_epi32::<0xb1>(v), h[1])].map(|(v, h)| {
                    let lo = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), nibble);
                    let hi = _mm256_slli_epi16(_mm256_srlv_epi32(h, hs), 4);
                    _mm256_or_si256(lo, _mm256_and_si256(hi, bits_4_5))
                });
                // Lanes 0..4 hold the groups' first sub-blocks of 16, lanes 4..8 their second:
                // sub-blocks 2c, 2c + 4 (even and odd lanes) of the half, then 2c + 1, 2c + 5.
                let (s0, s1) = (2 * c, 2 * c + 4);
                let scp = _mm256_shuffle_epi8(*dup, pick_words(s0, s1, s0 + 1, s1 + 1));
                let pair = 4 * b + 2 * n + c;
                // The pair's product as in `dot_q4_k`, written out in both: made one inlined
                // helper, it cost the Q4_K prompt product a quarter of its speed on a Zen 3
                // (kernel bench, 42 against 30-32 GMAC/s, three runs each), the compiler
                // allocating the four-token tile's registers worse.
                for (k, tk) in tokens.iter().enumerate() {
                    // SAFETY: pair `pair` of the row is laid-out values 64 pair.. + 64 and scales
                    // 2 pair.. + 2 (the caller's lengths).
                    let at = tk.kx6.as_ptr().add(64 * pair);
                    let xa = _mm256_loadu_si256(at as *const __m256i);
                    let xb = _mm256_loadu_si256(at.add(32) as *const __m256i);
                    let q16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(ab[0], xa),
                        _mm256_maddubs_epi16(ab[1], xb),
                    );
                    isums[k] = _mm256_add_epi32(isums[k], _mm256_madd_epi16(q16, scp));
                }
            }
        }
        for (k, tk) in tokens.iter().enumerate() {
            // SAFETY: block b's scale is `xs[b]` (the caller's lengths).
            let dx = _mm256_set1_ps(d * *tk.xs.get_unchecked(b));
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isums[k]), dx, acc[k]);
        }
    }
    acc.map(|a| sum8(a))
}

/// One Q4_K row (with `FIVE`, Q5_K) against `N` tokens on AVX-512: [`dot_q4_k`]'s sums, two
/// sub-blocks a vector (their 64 activations are contiguous), `vpdpbusd` for the byte products.
/// A vector's 16 lanes are sub-block 2p's (0..8) and 2p + 1's (8..16), each a sum of four
/// products (at most 4 * 31 * 128, which 16 bits hold); two such vectors, packed to 16 bits
/// (`vpackssdw`, lane by lane of 128 bits), take their sub-blocks' integer scales in one
/// `vpmaddwd` ([`scaled_sum`]); the block's lanes are converted and scaled by `d xs` once, and
/// its minimums' part taken from the activations' `xs sum(qx_j)`, as on AVX2. Caller
/// guarantees AVX-512 F, BW, VL, VNNI and F16C, and `Tile`'s lengths.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_k_512<const N: usize, const FIVE: bool>(w: &[u8], tokens: [Token; N]) -> [f32; N] {
    let kind = if FIVE { KQuant::Q5K } else { KQuant::Q4K };
    let nibble = _mm512_set1_epi8(15);
    let sixteen = _mm512_set1_epi8(16);
    // The 32 bytes of a pair of sub-blocks in both halves of a vector: the low half keeps the
    // low nibbles (the first sub-block), the high half shifts the high ones down.
    let halves = per_half(0, 4);
    // Two vectors of sums packed and paired (`vpackssdw`, `vpmaddwd`): 128-bit lane L of the
    // result holds, in its 32-bit lanes, the first vector's lanes 4L..4L + 4 in pairs, then
    // the second's: sub-blocks (a, a, b, b) with a = 2p (L < 2) or 2p + 1, b = a + 2. `first`
    // picks those sub-blocks of a block's pairs 0 and 1 (sub-blocks 0..4), `second` of 2 and 3.
    let first = _mm512_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2, 1, 1, 3, 3, 1, 1, 3, 3);
    let second = _mm512_add_epi32(first, _mm512_set1_epi32(4));
    let mut acc = [_mm512_setzero_ps(); N];
    let mut mins = [_mm256_setzero_ps(); N];
    for (b, block) in w.chunks_exact(kind.block_bytes()).enumerate() {
        let (qh, qs) = match FIVE {
            true => (&block[16..48], &block[48..]),
            false => (&block[16..16], &block[16..]),
        };
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (sc, m) = scales_mins(&block[4..16]);
        // Lane j: dmin m_j; and sc_j in both 16-bit halves of 32-bit lane j (`vpmaddwd`'s
        // pairs), picked for each packed pair of vectors.
        let dm = _mm256_mul_ps(bytes_as_lanes(m), _mm256_set1_ps(dmin));
        let sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
        let sc = _mm512_zextsi256_si512(_mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)));
        let scales = [
            _mm512_permutexvar_epi32(first, sc),
            _mm512_permutexvar_epi32(second, sc),
        ];
        let mut q = [_mm512_setzero_si512(); BLOCK / 64];
        for (p, q) in q.iter_mut().enumerate() {
            // SAFETY: qs is 128 bytes (a whole block's), so bytes 32p..32p + 32 are in it.
            let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                qs.as_ptr().add(32 * p) as *const __m256i
            ));
            *q = _mm512_and_si512(_mm512_srlv_epi16(v, halves), nibble);
            if FIVE {
                // q + 16 where bit 2p (low half) or 2p + 1 (high half) of the value's qh byte
                // is set.
                // SAFETY: qh is 32 bytes (Q5_K's).
                let bits =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.as_ptr() as *const __m256i));
                let set =
                    _mm512_test_epi8_mask(bits, per_half_bytes(1u8 << (2 * p), 1u8 << (2 * p + 1)));
                *q = _mm512_mask_add_epi8(*q, set, *q, sixteen);
            }
        }
        for (k, tk) in tokens.iter().enumerate() {
            // SAFETY: block b's 8 groups are values 256b.. + 256 of `x`, scales and `mins`
            // 8b..8b + 8 (the caller's lengths).
            let at = tk.x.as_ptr().add(BLOCK * b);
            let isum = scaled_sum(at, &q, &scales);
            let dx = _mm512_set1_ps(d * *tk.xs.get_unchecked(b));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dx, acc[k]);
            let kmins = _mm256_loadu_ps(tk.kmins.as_ptr().add(8 * b));
            mins[k] = _mm256_fmadd_ps(dm, kmins, mins[k]);
        }
    }
    std::array::from_fn(|k| sum8(_mm256_sub_ps(halves_added(acc[k]), mins[k])))
}

/// One Q6_K row against `N` tokens on AVX-512: [`dot_q6_k`] two groups a vector (64 values of a
/// half, four sub-blocks of 16), `vpdpbusd` for the byte products (each lane four products of
/// `q + 32` and an activation, at most 4 * 63 * 128, which 16 bits hold). As in
/// [`dot_q4_k_512`], two vectors packed to 16 bits take their sub-blocks' integer scales in one
/// `vpmaddwd` ([`scaled_sum`]); the offsets of the weights' + 32, `32 sc_s sum(qx_s)` a
/// sub-block, are the activations' sums of 16 times the scales in one more `vpmaddwd`, a group a
/// lane, taken off the integer lanes; the block's lanes are converted and scaled by `d xs` once.
/// Caller guarantees what [`dot_q4_k_512`]'s does.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q6_k_512<const N: usize>(w: &[u8], tokens: [Token; N]) -> [f32; N] {
    let nibble = _mm512_set1_epi8(15);
    let bits_4_5 = _mm512_set1_epi8(0x30);
    // A group's high bits (two a value, at bits 2c of its `qh` byte for chunk c) moved to bits
    // 4-5: chunks 0 and 1 shifted left by 4 and 2, chunks 2 and 3 right by 0 and 2.
    let (left, right) = (per_half(4, 2), per_half(0, 2));
    // Half n's two vectors (pairs 0 and 1: sub-blocks 8n + 4 pair + lane / 4) packed and paired:
    // 128-bit lane L of the result holds sub-blocks (8n + L, 8n + L, 8n + 4 + L, 8n + 4 + L),
    // whose scales `by_sub_block[n]` picks.
    let by_sub_block = [
        _mm512_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7),
        _mm512_setr_epi32(8, 8, 12, 12, 9, 9, 13, 13, 10, 10, 14, 14, 11, 11, 15, 15),
    ];
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, block) in w.chunks_exact(KQuant::Q6K.block_bytes()).enumerate() {
        let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        // SAFETY: 16 scale bytes. Lane s of `sc16`: sc_s (16 bits); of `sc`: sc_s in both
        // 16-bit halves (`vpmaddwd`'s pairs).
        let bytes = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
        let sc16 = _mm256_cvtepi8_epi16(bytes);
        let sc = _mm512_cvtepi8_epi32(bytes);
        let sc = _mm512_or_si512(
            _mm512_and_si512(sc, _mm512_set1_epi32(0xffff)),
            _mm512_slli_epi32(sc, 16),
        );
        let sc = by_sub_block.map(|pick| _mm512_permutexvar_epi32(pick, sc));
        // Vector 2n + pair: chunks 2 pair, 2 pair + 1 of half n (values 128n + 64 pair.. + 64),
        // each value q + 32.
        let mut q = [_mm512_setzero_si512(); 4];
        for n in 0..2 {
            // SAFETY: ql is 128 bytes, qh 64: bytes 64n..64n + 64 and 32n..32n + 32.
            let low = _mm512_loadu_si512(ql.as_ptr().add(64 * n) as *const __m512i);
            let high = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                qh.as_ptr().add(32 * n) as *const __m256i
            ));
            let lo = [
                _mm512_and_si512(low, nibble),
                _mm512_and_si512(_mm512_srli_epi16(low, 4), nibble),
            ];
            let hi = [
                _mm512_sllv_epi16(high, left),
                _mm512_srlv_epi16(high, right),
            ];
            for pair in 0..2 {
                // lo | hi & 0x30 (vpternlogd 0xf8: A | B & C).
                q[2 * n + pair] = _mm512_ternarylogic_epi32::<0xf8>(lo[pair], hi[pair], bits_4_5);
            }
        }
        for (k, tk) in tokens.iter().enumerate() {
            // SAFETY: block b's 8 groups are values 256b.. + 256 of `x`, scales 8b..8b + 8 and
            // sums of 16 16b..16b + 16 (the caller's lengths).
            let at = tk.x.as_ptr().add(BLOCK * b);
            let isum = scaled_sum(at, &q, &sc);
            // Group j's offset, 32 (sc_2j sum(qx_2j) + sc_2j+1 sum(qx_2j+1)), off the sum.
            let sums16 = _mm256_loadu_si256(tk.sums.as_ptr().add(16 * b) as *const __m256i);
            let off = _mm256_slli_epi32(_mm256_madd_epi16(sums16, sc16), 5);
            let isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(off));
            let dx = _mm512_set1_ps(d * *tk.xs.get_unchecked(b));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dx, acc[k]);
        }
    }
    std::array::from_fn(|k| sum8(halves_added(acc[k])))
}

/// A block's four vectors of weights `q` (bytes 0..=63) against its 256 activations at `x`, as
/// integer lanes: the byte products of each vector (`vpdpbusd`, four a lane, at most
/// 4 * 63 * 128, which 16 bits hold), two vectors packed to 16 bits (`vpackssdw`, lane by lane
/// of 128 bits) and scaled by their sub-blocks' integer scales in one `vpmaddwd` (`scales[n]`
/// for vectors `2n` and `2n + 1`, picked to match the packing), the two halves added. Q4_K and
/// Q6_K share it; each picks its scales. Caller guarantees AVX-512 F, BW and VNNI, and 256
/// activations at `x`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scaled_sum(x: *const i8, q: &[__m512i; 4], scales: &[__m512i; 2]) -> __m512i {
    let dot = |v: usize| {
        // SAFETY: the caller's: bytes 64v..64v + 64 of the block's activations.
        let xv = unsafe { _mm512_loadu_si512(x.add(64 * v) as *const __m512i) };
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[v], xv)
    };
    let half =
        |n: usize| _mm512_madd_epi16(_mm512_packs_epi32(dot(2 * n), dot(2 * n + 1)), scales[n]);
    _mm512_add_epi32(half(0), half(1))
}

/// 16-bit lanes of `lo` in the low 256 bits, of `hi` in the high: the shift counts of a vector
/// holding two 32-byte pieces.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn per_half(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi))
}

/// Bytes of `lo` in the low 256 bits, of `hi` in the high.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn per_half_bytes(lo: u8, hi: u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi8(lo as i8), _mm256_set1_epi8(hi as i8))
}

/// The low 8 lanes of `v` plus its high 8.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn halves_added(v: __m512) -> __m256 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), high)
}

/// The f16 at byte `at` of `b`, widened. Caller guarantees F16C.
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The sum of 8 lanes, in a fixed order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum8(v: __m256) -> f32 {
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(v2) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(v2, v2))
}
