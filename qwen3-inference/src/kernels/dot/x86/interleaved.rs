//! The AVX-512 VNNI q4, q6 and q8 kernels, on weights in the interleaved order
//! (`dot/interleaved.rs`): a block of 16 groups (of 32; q8's also of 64) is 512-bit vectors
//! whose lane `l` holds group `l` (q4: four, q6: six, q8: eight, or sixteen in groups of 64), so
//! per weight row, token and block:
//!
//! ```text
//! lo_k, hi_k = v_k & 15, (v_k >> 4) & 15          k = 0..4, the nibbles (q6: | two high bits << 4)
//! isum       = corr + sum_k dot4(lo_k, x_k) + dot4(hi_k, x_4+k)     16 lanes, lane l: group l, exact
//! acc       += float(isum) * x_scale * w_scale                       16 groups a conversion
//! ```
//!
//! (q8: `isum = corr + sum_k dot4(v_k, x_k)` over its eight or sixteen vectors, no unpacking),
//! and the row's value is `acc`'s 16 lanes added (`sum16`; a prompt tile's four tokens of a row
//! in one tree, `sum16x4`, with the same pairings) after its last block. No permute, no
//! lane addition: eight `vpdpbusd` and eight (q6: sixteen; q8: none) bitwise operations per 512
//! weights.
//! The three kinds share the tiles below, whose const parameter `KIND` says which they read.
//!
//! Decode (one token) takes one row a tile, the token's activations held in registers while
//! the row is unpacked and used; it asks for the weights ahead as the file-order q8 kernel
//! (`mat_q8_avx512`) does ([`PREFETCH_NEAR`]). A prompt's products (and a serving step's) take
//! tiles of two rows by four tokens: each row's block unpacked once for the four tokens, each
//! vector of a token's activations loaded once for both rows; q8 with one or two tokens takes
//! one row a tile, as decode does. Only the tiles of a block of rows' first tokens ask for its
//! weights ahead: the others find them in the caches. Every (row, token) pair adds the same integer sums
//! and makes the same float operations in the same order in both, so a prompt's tokens get
//! decode's bits.

use super::super::interleaved::GROUPS;
use super::super::q4::{Q4Layout, SIMD_GROUP};
use super::super::q6;
use super::super::{for_each_tile, ActsQ8};
use super::q4::prefetch_lines;
use super::PREFETCH_NEAR;
use std::arch::x86_64::*;

/// Tokens a prompt tile takes (two weight rows against up to this many).
const TOKENS: usize = 4;

/// q8 decode asks for the weights ahead this many vectors (128 bytes) at a time, spread among
/// the products: asked for a block at a time (1 KiB in groups of 64), a one-thread decode
/// product streamed a large matrix from memory 14% slower than the file-order kernel; two
/// vectors at a time, as fast (docs/kernels.md, "q8 in the interleaved order").
const PREFETCH_VECTORS: usize = 2;
// Decode's q8 loop takes the vectors two at a time (its two chains of sums), a prefetch every
// `PREFETCH_VECTORS` of them, and a group of 32 is eight vectors.
const _: () = assert!(
    PREFETCH_VECTORS.is_multiple_of(2) && (SIMD_GROUP / 4).is_multiple_of(PREFETCH_VECTORS)
);

/// The kinds of interleaved weights, a const parameter of the tiles (`KIND`): q4 and q6 in
/// groups of 32 (f16 scales), q8 in groups of 32 or 64 (f32 scales).
pub(super) const Q4: usize = 0;
pub(super) const Q6: usize = 1;
const Q8: usize = 2;
const Q8_64: usize = 3;

/// Bytes one group of a kind takes in a row: q4 16, q6 24, q8 32 (groups of 64: 64).
const fn group_bytes(kind: usize) -> usize {
    match kind {
        Q4 => 16,
        Q6 => 24,
        Q8 => 32,
        Q8_64 => 64,
        _ => unreachable!(),
    }
}

/// Values a group of a kind holds.
const fn group_size(kind: usize) -> usize {
    match kind {
        Q4 | Q6 | Q8 => SIMD_GROUP,
        Q8_64 => 64,
        _ => unreachable!(),
    }
}

/// Bytes of one weight scale: f16 for q4 and q6, f32 for q8.
const fn scale_bytes(kind: usize) -> usize {
    match kind {
        Q4 | Q6 => 2,
        Q8 | Q8_64 => 4,
        _ => unreachable!(),
    }
}

/// How far left the activations' correction `-8 sum(x)` is shifted: weights stored `q + 8` (q4),
/// `q + 32` (q6), `q + 128` (q8).
const fn corr_shift(kind: usize) -> u32 {
    match kind {
        Q4 => 0,
        Q6 => 2,
        Q8 | Q8_64 => 4,
        _ => unreachable!(),
    }
}

/// [`super::super::MatQ4`] on AVX-512 VNNI for interleaved q4 weights or (`SIX`) q6 ones,
/// reading the activations in [`Q4Layout::Interleaved`]. Groups of other sizes than 32 are not
/// interleaved and take the reference.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_interleaved_avx512<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = q6::check_either::<SIX>(w, ws, x, out);
    // (Activations in groups of 64 are laid out for q8 weights, which interleave at that size.)
    if x.q4.x.is_empty() || x.group_size != SIMD_GROUP {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    assert!(
        laid_out(x),
        "the AVX-512 q4 kernel reads activations laid out whole in Q4Layout::Interleaved"
    );
    let ws: &[u8] = bytemuck::cast_slice(ws);
    // SAFETY: `check_either` passed (the slices hold `rows` rows of `x.cols` columns in groups
    // of 32) and `laid_out` did (the activations are laid out whole in groups of 32), as
    // `tiles` requires.
    match SIX {
        true => tiles::<Q6>(w, ws, x, out, rows, ahead),
        false => tiles::<Q4>(w, ws, x, out, rows, ahead),
    }
}

/// [`super::super::MatQ8`] on AVX-512 VNNI for q8 weights interleaved in groups of 32 or 64
/// ([`super::super::Dots::q8_interleaved`]), reading the activations in
/// [`Q4Layout::Interleaved`]. Panics on other group sizes or activations not so laid out: the
/// weights of a matrix that does not interleave are read in the file's order, by another kernel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_q8_interleaved_avx512(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    let rows = x.check(w, ws, out);
    assert!(
        laid_out(x),
        "the AVX-512 q8 kernel on interleaved weights reads Q4Layout::Interleaved activations"
    );
    let (w, ws) = (bytemuck::cast_slice(w), bytemuck::cast_slice(ws));
    // SAFETY: `check` passed (the slices hold `rows` rows of `x.cols` columns in groups of
    // `x.group_size`) and `laid_out` did (the activations are laid out whole in those groups);
    // the match gives `tiles` the kind of that group size, as it requires.
    match x.group_size {
        32 => tiles::<Q8>(w, ws, x, out, rows, ahead),
        64 => tiles::<Q8_64>(w, ws, x, out, rows, ahead),
        gs => panic!("q8 weights in groups of {gs} are not interleaved"),
    }
}

/// Whether `x`'s activations are laid out in [`Q4Layout::Interleaved`] for all of its `t`
/// tokens: `t * cols` values and `t * cols / group_size` corrections and scales, which is what
/// [`tile`] reads.
fn laid_out(x: &ActsQ8) -> bool {
    let groups = x.t * (x.cols / x.group_size);
    x.q4.layout == Q4Layout::Interleaved
        && x.q4.x.len() == x.t * x.cols
        && x.q4.corr.len() == groups
        && x.q4.scales.len() == groups
}

/// `out = w x` for `rows` rows of weights of `KIND` (`w` their bytes, `ws` their scales' bytes).
///
/// Caller guarantees that `x.group_size == group_size(KIND)`, that `w` holds `rows` rows of
/// `x.cols` weights of `KIND` in those groups, `ws` a scale per group, `out` `rows * x.t`
/// values, and that [`laid_out`] holds for `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles<const KIND: usize>(
    w: &[u8],
    ws: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    rows: usize,
    ahead: usize,
) {
    // Bytes this thread may prefetch, counted from the start of `w`.
    let reach = w.len() + ahead;
    if x.t == 1 {
        // One row a tile: on Zen 5, tiles of four rows (four streams side by side) decoded the
        // 0.6B shape's q4 file slower on one thread than one row a tile (docs/kernels.md,
        // "One row a decode tile").
        return for_each_tile(rows, 1, 1, 1, |_, _, r, _| {
            // SAFETY: row r exists (for_each_tile keeps it so); the rest is our caller's promise.
            tile::<KIND, 1, 1>(w, ws, x, out, r, 0, Some(reach))
        });
    }
    // A few tokens (a serving step's) take one q8 row a tile: the product is bound by reading
    // the weights, and one stream a tile reads them faster (docs/kernels.md, "q8 in the
    // interleaved order").
    let tile_rows = match KIND >= Q8 && x.t <= 2 {
        true => 1,
        false => 2,
    };
    for_each_tile(rows, x.t, tile_rows, TOKENS, |m, n, r, i| {
        // A block of rows is read from memory by its first tokens' tiles, and from the caches by
        // the others (`for_each_tile` runs every token on a block before the next): only the
        // first ask for the weights ahead. Asked again by every tile, the prefetches and their
        // bounds checks were about a tenth of a prompt's instructions, for lines in L1 already.
        let reach = (i == 0).then_some(reach);
        // SAFETY: rows r..r+m and tokens i..i+n exist (for_each_tile keeps them so); as above.
        match (m, n) {
            (2, 4) => tile::<KIND, 2, 4>(w, ws, x, out, r, i, reach),
            (2, 3) => tile::<KIND, 2, 3>(w, ws, x, out, r, i, reach),
            (2, 2) => tile::<KIND, 2, 2>(w, ws, x, out, r, i, reach),
            (2, _) => tile::<KIND, 2, 1>(w, ws, x, out, r, i, reach),
            (_, 4) => tile::<KIND, 1, 4>(w, ws, x, out, r, i, reach),
            (_, 3) => tile::<KIND, 1, 3>(w, ws, x, out, r, i, reach),
            (_, 2) => tile::<KIND, 1, 2>(w, ws, x, out, r, i, reach),
            _ => tile::<KIND, 1, 1>(w, ws, x, out, r, i, reach),
        }
    });
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`,
/// prefetching weights up to `reach` bytes from the start of `w` (`None`: none).
///
/// Caller guarantees the rows and tokens exist and what [`tiles`]' caller does. Then every
/// read is in bounds: with `gs = group_size(KIND)` and `gb = group_bytes(KIND)`, a row is
/// `per = cols / gs` groups of `gb` bytes, and a block of `n` groups from group `g0` reads bytes
/// `gb g0 .. gb (g0 + n)` of its row, values `gs g0 .. gs (g0 + n)` of a token's laid-out row
/// and entries `g0 .. g0 + n` of its corrections and scales and of the row's weight scales; the
/// short block's loads are masked to its `n` lanes (words), and a masked load neither reads nor
/// faults past its mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const KIND: usize, const R: usize, const N: usize>(
    w: &[u8],
    ws: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: Option<usize>,
) {
    let (t, cols) = (x.t, x.cols);
    let (gb, sb) = (group_bytes(KIND), scale_bytes(KIND));
    let per = cols / group_size(KIND);
    let row_bytes = per * gb;
    let rows = Rows::<R> {
        w: std::array::from_fn(|a| w.as_ptr().add((r + a) * row_bytes)),
        ws: std::array::from_fn(|a| ws.as_ptr().add((r + a) * per * sb)),
    };
    let tokens = Tokens::<N> {
        x: std::array::from_fn(|j| x.q4.x.as_ptr().add((i + j) * cols)),
        corr: std::array::from_fn(|j| x.q4.corr.as_ptr().add((i + j) * per)),
        scale: std::array::from_fn(|j| x.q4.scales.as_ptr().add((i + j) * per)),
    };
    // The weight scales are a stream of their own (1/8 of q4's bytes, 1/12 of q6's, 1/8 of
    // q8's in groups of 32 and 1/16 in groups of 64): the tile's scales asked for at once,
    // `PREFETCH_NEAR / 16` bytes ahead in their stream; a few lines for a tile of rows of the
    // 0.6B shape, against the weights' 32 (see `block`).
    if reach.is_some() {
        let from = r * per * sb + PREFETCH_NEAR / 16;
        for line in (from..from + R * per * sb).step_by(64) {
            // A prefetch never faults; `wrapping_add` may point past `ws` without UB.
            _mm_prefetch::<_MM_HINT_T2>((ws.as_ptr() as *const i8).wrapping_add(line));
        }
    }
    // Bytes `at .. at + len` of the weights asked for ahead, up to `reach` (or not at all).
    let ask = |at: usize, len: usize| {
        if let Some(reach) = reach {
            prefetch_lines(w, at, len, reach);
        }
    };
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let full = per / GROUPS;
    for b in 0..full {
        let g0 = b * GROUPS;
        // The tile's rows are consecutive in memory: its weights are one stream, of which this
        // block reads its share, asked for ahead a row's piece at a time (`block`).
        let share = R * GROUPS * gb;
        let from = r * row_bytes + b * share;
        block::<KIND, R, N, true>(&mut acc, &rows, &tokens, g0, GROUPS, |a, at, len| {
            ask(from + a * (share / R) + at, len)
        });
    }
    let n = per - full * GROUPS;
    if n > 0 {
        let g0 = full * GROUPS;
        let from = r * row_bytes + R * g0 * gb;
        block::<KIND, R, N, false>(&mut acc, &rows, &tokens, g0, n, |a, at, len| {
            ask(from + a * n * gb + at, len)
        });
    }
    for (a, acc_a) in acc.iter().enumerate() {
        let at = out.as_mut_ptr().add((r + a) * t + i);
        if N == 4 {
            // A row's four tokens are four consecutive outputs: one tree for the four.
            _mm_storeu_ps(at, sum16x4([acc_a[0], acc_a[1], acc_a[2], acc_a[3]]));
        } else {
            for (j, &v) in acc_a.iter().enumerate() {
                *at.add(j) = sum16(v);
            }
        }
    }
}

/// Where a tile's weight rows start: their bytes and their scales' bytes.
struct Rows<const R: usize> {
    w: [*const u8; R],
    ws: [*const u8; R],
}

/// Where a tile's tokens start: their laid-out values, corrections and scales.
struct Tokens<const N: usize> {
    x: [*const i8; N],
    corr: [*const i32; N],
    scale: [*const f32; N],
}

/// `n` 32-bit words from `p` (16 when `FULL`, the others zero): a vector of a block whose
/// vectors are `4n` bytes apart.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn words<const FULL: bool>(p: *const u8, n: usize) -> __m512i {
    match FULL {
        true => _mm512_loadu_si512(p as *const __m512i),
        false => _mm512_maskz_loadu_epi32(((1u32 << n) - 1) as __mmask16, p as *const i32),
    }
}

/// Adds the block of `n` groups from `g0` (16 when `FULL`) into `acc`, calling `prefetch(a, at,
/// len)` before bytes `at .. at + len` of row `a`'s block are read (it asks for the bytes that
/// far ahead of them). Caller guarantees what [`tile`]'s caller does.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// The indices pick a row's or token's pointers, weights and accumulator together.
#[allow(clippy::needless_range_loop)]
unsafe fn block<const KIND: usize, const R: usize, const N: usize, const FULL: bool>(
    acc: &mut [[__m512; N]; R],
    rows: &Rows<R>,
    tokens: &Tokens<N>,
    g0: usize,
    n: usize,
    prefetch: impl Fn(usize, usize, usize),
) {
    let (gb, sb) = (group_bytes(KIND), scale_bytes(KIND));
    let d: [__m512; R] =
        std::array::from_fn(|a| weight_scales::<KIND, FULL>(rows.ws[a].add(g0 * sb), n));
    // `prefetch` asks for a piece of the weights ahead just before row `a`'s block is read, so
    // the prefetches (two per 64 bytes) are spread among the arithmetic. Asked for all at once
    // before the block (32 prefetches in a row for a decode tile of four rows), they made one
    // Zen 5 thread decode the 0.6B shape's q4 file 8% slower (measured: docs/kernels.md,
    // "AVX-512 on Zen 5"); the AVX2 kernels already ask a chunk at a time.
    if N == 1 && KIND >= Q8 {
        // Decode on q8: nothing to unpack, the token's vectors and the row's met one by one,
        // in two chains of sums added at the end (a whole block's: its 256-bit halves; a short
        // block's: its even and odd vectors).
        let x = tokens.x[0].add(g0 * group_size(KIND)) as *const u8;
        for a in 0..R {
            let w = rows.w[a].add(g0 * gb);
            let c = corr::<KIND, N, FULL>(tokens, 0, g0, n);
            let at = |m: usize| m * 4 * n;
            let isum = if FULL {
                // A whole block's vectors as 256-bit halves (groups 0-7 and 8-15), two chains:
                // on a Zen 4 core a stream of 256-bit loads outruns one of 512-bit loads (the
                // bandwidth probe: 34-35 GB/s against 32).
                let half = |v: *const u8| _mm256_loadu_si256(v as *const __m256i);
                let mut lo = _mm512_castsi512_si256(c);
                let mut hi = _mm512_extracti64x4_epi64::<1>(c);
                for m0 in (0..group_size(KIND) / 4).step_by(PREFETCH_VECTORS) {
                    prefetch(a, at(m0), at(PREFETCH_VECTORS));
                    for m in m0..m0 + PREFETCH_VECTORS {
                        let (wm, xm) = (w.add(at(m)), x.add(at(m)));
                        lo = _mm256_dpbusd_epi32(lo, half(wm), half(xm));
                        hi = _mm256_dpbusd_epi32(hi, half(wm.add(32)), half(xm.add(32)));
                    }
                }
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            } else {
                // A short block's masked vectors, even and odd.
                let (mut even, mut odd) = (c, _mm512_setzero_si512());
                for m0 in (0..group_size(KIND) / 4).step_by(PREFETCH_VECTORS) {
                    prefetch(a, at(m0), at(PREFETCH_VECTORS));
                    for m in (m0..m0 + PREFETCH_VECTORS).step_by(2) {
                        let (wm, xm) = (w.add(at(m)), x.add(at(m)));
                        even =
                            _mm512_dpbusd_epi32(even, words::<FULL>(wm, n), words::<FULL>(xm, n));
                        let (wm, xm) = (w.add(at(m + 1)), x.add(at(m + 1)));
                        odd = _mm512_dpbusd_epi32(odd, words::<FULL>(wm, n), words::<FULL>(xm, n));
                    }
                }
                _mm512_add_epi32(even, odd)
            };
            let scale = x_scales::<N, FULL>(tokens, 0, g0, n);
            finish(&mut acc[a][0], isum, scale, d[a]);
        }
    } else if N == 1 {
        // Decode: the token's activations stay in registers while each row is unpacked and used
        // at once. Its integer sum is two chains of `vpdpbusd` added at the end (one waits on
        // the other's latency otherwise); integer sums are exact, so the bits are a prompt's.
        for a in 0..R {
            prefetch(a, 0, n * gb);
            let mut isum = [
                corr::<KIND, N, FULL>(tokens, 0, g0, n),
                _mm512_setzero_si512(),
            ];
            let x = acts::<KIND, N, FULL>(tokens, 0, g0, n);
            // Decode's q4 leaves the high nibbles in place (16 times their value) and shifts
            // their integer sum once instead: a row's four shifts become one a token, which is
            // less work only for one token; q6's high bits would not fit above them.
            let wv = weights::<KIND, FULL>(rows.w[a].add(g0 * gb), n, KIND == Q4);
            for k in 0..8 {
                // q4: chain 0 the low nibbles, chain 1 the high ones; others alternate.
                let c = if KIND == Q4 { k / 4 } else { k % 2 };
                isum[c] = _mm512_dpbusd_epi32(isum[c], wv[k], x[k]);
            }
            let high = match KIND {
                // Exact: every product of the high nibbles is a multiple of 16.
                Q4 => _mm512_srai_epi32(isum[1], 4),
                _ => isum[1],
            };
            let isum = _mm512_add_epi32(isum[0], high);
            let scale = x_scales::<N, FULL>(tokens, 0, g0, n);
            finish(&mut acc[a][0], isum, scale, d[a]);
        }
    } else if KIND >= Q8 {
        // A prompt on q8: nothing to unpack, so vector by vector, each of the rows' vectors
        // loaded once for every token and each of a token's once for every row, the tile's
        // `R * N` sums held in registers throughout (with the weights' eight vectors held
        // instead, as q4's tiles do below, the compiler spilled registers).
        let mut isum: [[__m512i; R]; N] =
            std::array::from_fn(|j| [corr::<KIND, N, FULL>(tokens, j, g0, n); R]);
        for a in 0..R {
            prefetch(a, 0, n * gb);
        }
        for m in 0..group_size(KIND) / 4 {
            let wv: [__m512i; R] =
                std::array::from_fn(|a| words::<FULL>(rows.w[a].add(g0 * gb + m * 4 * n), n));
            for j in 0..N {
                let base = tokens.x[j].add(g0 * group_size(KIND)) as *const u8;
                let x = words::<FULL>(base.add(m * 4 * n), n);
                for a in 0..R {
                    isum[j][a] = _mm512_dpbusd_epi32(isum[j][a], wv[a], x);
                }
            }
        }
        for j in 0..N {
            let scale = x_scales::<N, FULL>(tokens, j, g0, n);
            for a in 0..R {
                finish(&mut acc[a][j], isum[j][a], scale, d[a]);
            }
        }
    } else {
        // A prompt on q4 or q6: the rows unpacked once, then each token against all of them,
        // each vector of its activations loaded once for every row (loads, not the products,
        // bound a tile that loads a token's activations for one row).
        let wv: [[__m512i; 8]; R] = std::array::from_fn(|a| {
            prefetch(a, 0, n * gb);
            weights::<KIND, FULL>(rows.w[a].add(g0 * gb), n, false)
        });
        for j in 0..N {
            let mut isum = [corr::<KIND, N, FULL>(tokens, j, g0, n); R];
            let x = acts::<KIND, N, FULL>(tokens, j, g0, n);
            for k in 0..8 {
                for a in 0..R {
                    isum[a] = _mm512_dpbusd_epi32(isum[a], wv[a][k], x[k]);
                }
            }
            let scale = x_scales::<N, FULL>(tokens, j, g0, n);
            for a in 0..R {
                finish(&mut acc[a][j], isum[a], scale, d[a]);
            }
        }
    }
}

/// Token `j`'s activations for the block of `n` groups from `g0`: the eight vectors that meet
/// the weights' eight (q4 and q6: the q8 tiles read theirs vector by vector in `block`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn acts<const KIND: usize, const N: usize, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> [__m512i; 8] {
    debug_assert!(KIND < Q8, "q8's tiles read their activations in `block`");
    block_acts::<FULL>(tokens.x[j], g0, n)
}

/// The eight vectors of the block of `n` groups from `g0` of a token's laid-out activations
/// `x` (groups of 32, the interleaved order): word `k` of each group is vector `k`. Shared with
/// the K-quants' tiles (`k_interleaved.rs`). Caller guarantees `x` holds those groups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn block_acts<const FULL: bool>(
    x: *const i8,
    g0: usize,
    n: usize,
) -> [__m512i; 8] {
    let base = x.add(g0 * SIMD_GROUP) as *const u8;
    std::array::from_fn(|k| words::<FULL>(base.add(k * 4 * n), n))
}

/// Token `j`'s corrections for the block of `n` groups from `g0`, for the weights' offset.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn corr<const KIND: usize, const N: usize, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> __m512i {
    let corr = words::<FULL>(tokens.corr[j].add(g0) as *const u8, n);
    match corr_shift(KIND) {
        0 => corr,
        2 => _mm512_slli_epi32(corr, 2),
        _ => _mm512_slli_epi32(corr, 4),
    }
}

/// Token `j`'s activation scales for the block of `n` groups from `g0`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn x_scales<const N: usize, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> __m512 {
    _mm512_castsi512_ps(words::<FULL>(tokens.scale[j].add(g0) as *const u8, n))
}

/// The weight scales of the `n` groups at `p` (f16 for q4 and q6, widened; f32 for q8).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn weight_scales<const KIND: usize, const FULL: bool>(p: *const u8, n: usize) -> __m512 {
    if scale_bytes(KIND) == 4 {
        return _mm512_castsi512_ps(words::<FULL>(p, n));
    }
    _mm512_cvtph_ps(match FULL {
        true => _mm256_loadu_si256(p as *const __m256i),
        false => _mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, p as *const i16),
    })
}

/// A q4 or q6 row's block of `n` groups at `p`, unpacked into the eight byte vectors that meet
/// the activations' eight: the low nibbles of its four vectors, then the high ones (q4: q + 8,
/// 0..=15; q6: q + 32, 0..=63); with `split` (q4 only), the high nibbles left in place, 16 times
/// their value. (q8's tiles read their weights vector by vector in `block`.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn weights<const KIND: usize, const FULL: bool>(
    p: *const u8,
    n: usize,
    split: bool,
) -> [__m512i; 8] {
    debug_assert!(KIND < Q8, "q8's tiles read their weights in `block`");
    let nibble = _mm512_set1_epi8(15);
    let v: [__m512i; 4] = std::array::from_fn(|k| words::<FULL>(p.add(k * 4 * n), n));
    let mut wv: [__m512i; 8] = std::array::from_fn(|k| match (k < 4, split) {
        (true, _) => _mm512_and_si512(v[k], nibble),
        (false, true) => _mm512_andnot_si512(nibble, v[k - 4]),
        (false, false) => _mm512_and_si512(_mm512_srli_epi16(v[k - 4], 4), nibble),
    });
    if KIND == Q6 {
        // High vector k / 2 holds word k's two-bit pieces at bits 4 (k % 2) (the low values')
        // and 4 (k % 2) + 2 (the high values'): each goes to bits 4-5 of its nibble,
        // `nibble | shifted & 0x30` (vpternlogd 0xf8: A | B & C).
        let bits_4_5 = _mm512_set1_epi8(0x30);
        let high: [__m512i; 2] = std::array::from_fn(|m| words::<FULL>(p.add((4 + m) * 4 * n), n));
        for k in 0..4 {
            let h = high[k / 2];
            let (lo, hi) = match k % 2 {
                0 => (_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2)),
                _ => (h, _mm512_srli_epi16(h, 2)),
            };
            wv[k] = _mm512_ternarylogic_epi32::<0xf8>(wv[k], lo, bits_4_5);
            wv[k + 4] = _mm512_ternarylogic_epi32::<0xf8>(wv[k + 4], hi, bits_4_5);
        }
    }
    wv
}

/// One (row, token) pair's block: `acc += float(isum) * xs * d`, in this order in every tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn finish(acc: &mut __m512, isum: __m512i, scale: __m512, d: __m512) {
    let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), scale);
    *acc = _mm512_fmadd_ps(v, d, *acc);
}

/// [`sum16`] of four vectors at once, in one tree over them side by side: the same additions of
/// the same lanes (`l` and `l + 8`, `l` and `l + 4`, `l` and `l + 2`, the last two), so the same
/// bits, in about 14 instructions where four `sum16` take about 32.
///
/// ```text
/// v8  = [a: q0+q2, q1+q3 | b: q0+q2, q1+q3]  [c: .. | d: ..]    quarters q: 4 lanes each
/// v4  = [a: q0+q1 | b | c | d]                                   one quarter per vector
/// v2  = lanes 0, 1 + lanes 2, 3 of each quarter; v1 = lane 0 + lane 1
/// ```
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum16x4(v: [__m512; 4]) -> __m128 {
    // 128-bit quarters 0, 1 of two vectors, and their quarters 2, 3: added, each vector's lanes
    // l + 8 (l < 8) in its two quarters.
    let halves = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    };
    let (ab, cd) = (halves(v[0], v[1]), halves(v[2], v[3]));
    // Quarter k: vector k's lanes l + 4 (l < 4).
    let v4 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
    );
    // Lanes 0, 1 of each quarter: l + 2; then lane 0: the last two.
    let v2 = _mm512_add_ps(v4, _mm512_shuffle_ps::<0b11_10_11_10>(v4, v4));
    let v1 = _mm512_add_ps(v2, _mm512_shuffle_ps::<0b01_01_01_01>(v2, v2));
    // Lane 0 of each quarter, the four sums.
    let first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps128(_mm512_permutexvar_ps(first, v1))
}

/// The sum of a (row, token) pair's 16 lanes of partial sums, in a fixed order: lanes `l` and
/// `l + 8`, then `l` and `l + 4`, then `l` and `l + 2`, then the last two.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum16(v: __m512) -> f32 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let v8 = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
    // movehl: lanes 2, 3 moved down.
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(v2) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(v2, v2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::next_values;

    /// `sum16x4` gives each vector's `sum16`, bit for bit, on values whose sums round at every
    /// step, and on infinities, NaN, signed zeros and subnormals.
    #[test]
    fn sum16x4_is_four_sum16() {
        if !super::super::has_avx512() {
            eprintln!("no AVX-512: skipping sum16x4");
            return;
        }
        let mut seed = 31;
        let mut cases: Vec<[f32; 64]> = (0..50)
            .map(|k| {
                let v = next_values(64, &mut seed);
                // Magnitudes spread over many octaves, so that the order of the additions shows.
                std::array::from_fn(|i| v[i] * 10f32.powi((i as i32 * 7 + k) % 13 - 6))
            })
            .collect();
        let special = [
            f32::INFINITY,
            f32::NAN,
            -0.0,
            0.0,
            f32::MIN_POSITIVE / 3.0,
            -1e30,
        ];
        cases.push(std::array::from_fn(|i| special[i % special.len()]));
        for c in &cases {
            // SAFETY: the CPU has AVX-512 F (checked above); the loads read 64 floats of `c`.
            let (got, want) = unsafe {
                let v: [__m512; 4] = std::array::from_fn(|k| _mm512_loadu_ps(c[16 * k..].as_ptr()));
                let mut got = [0f32; 4];
                _mm_storeu_ps(got.as_mut_ptr(), sum16x4(v));
                (got, v.map(|v| sum16(v)))
            };
            for k in 0..4 {
                assert!(
                    got[k].to_bits() == want[k].to_bits() || (got[k].is_nan() && want[k].is_nan()),
                    "vector {k}: {} vs {}",
                    got[k],
                    want[k]
                );
            }
        }
    }
}
