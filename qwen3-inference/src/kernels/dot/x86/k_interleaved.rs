//! GGUF's Q4_K and Q6_K on AVX-512 VNNI, on weights in the interleaved order
//! (`dot/k_interleaved.rs`): q4's and q6's tiles (`interleaved.rs`) with the K-quants' scales.
//! Per weight row, token and block of 16 groups of 32 (lane `l`: group `l`):
//!
//! ```text
//! Q4_K  isum = sum_k dot4(lo_k, x_k) + dot4(hi_k, x_4+k)         lane l: group l's sum(q qx)
//!       acc += float(isum) * xs * (d sc)  -  (dmin m) * xs sum(qx)
//! Q6_K  isum_a = -32 sum(qx) + sum_k dot4(lo_k, x_k)             sub-block 2l (values 0..16)
//!       isum_b = -32 sum(qx) + sum_k dot4(hi_k, x_4+k)           sub-block 2l + 1 (16..32)
//!       acc += (float(isum_a) d sc_a + float(isum_b) d sc_b) * xs
//! ```
//!
//! `d sc`, `dmin m` (Q4_K) and Q6_K's `d sc_a`, `d sc_b` are unpacked once a block for the 16
//! lanes: each float is an f16 times an integer of at most 8 bits, exact in an f32. (Q6_K's two
//! sums take their scales as floats, not with `vpmulld`: on Intel cores that is two micro-ops on
//! port 0, the port `vpdpbusd` needs; a Xeon's 128-token products ran 87-91 GMAC/s, not 75-81.) The
//! activations are the K-quants' (one scale a block of 256, `ActsK`), in the interleaved order
//! (`xi`) with each group's scale (`xs32`), Q4_K's `xs sum(qx)` a group (`mins`) and Q6_K's
//! corrections (`corr6`). Tiles: decode four rows, a prompt two rows by four tokens (as q4's),
//! each (row, token) making the same operations in the same order, so a prompt gets decode's
//! bits. A prompt of more than four tokens unpacks each block of 16 rows once, into a buffer
//! its tiles read for every token (`unpacked_tiles`).

use super::super::k_interleaved::k_blocks;
use super::super::k_quants::{self, GROUP};
use super::super::{for_each_tile, ActsQ8, TILE_BLOCK_ROWS};
use super::interleaved::{block_acts, sum16, sum16x4, weights, words, Q4, Q6};
use super::q4::prefetch_lines;
use crate::format::KQuant;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Tokens a prompt tile takes (two weight rows against up to this many).
const TOKENS: usize = 4;

/// The kinds, a const parameter of the tiles (`K`): Q4_K's bits a weight, or Q6_K's.
const Q4K: u8 = 4;
const Q6K: u8 = 6;

/// [`super::super::MatK`] on AVX-512 VNNI for Q4_K and Q6_K weights in the interleaved order.
/// Panics on Q5_K (never reordered: `KOrder::takes`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn mat_k_interleaved_avx512(
    kind: KQuant,
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    // Panics unless the weights are whole rows of blocks of `x.cols` and the activations hold
    // every K-quant form for `x.t` tokens (`xi`, `xs32`, `mins`, `corr6` among them): then every
    // read of `tile` is in bounds.
    let rows = k_quants::check(kind, w, x, out);
    let (t, cols, k) = (x.t, x.cols, &x.k);
    assert!(
        k.xi.len() == t * cols
            && k.xs32.len() == t * cols / GROUP
            && k.corr6.len() == t * cols / 16,
        "K-quants in the interleaved order: the activations lack that order's forms"
    );
    // SAFETY: `check` passed; the caller's features are the tiles'.
    unsafe {
        match kind {
            KQuant::Q4K => tiles::<Q4K>(w, x, out, rows, ahead),
            KQuant::Q6K => tiles::<Q6K>(w, x, out, rows, ahead),
            KQuant::Q5K => panic!("Q5_K weights are not interleaved"),
        }
    }
}

/// `out = w x` for `rows` rows of kind `K`. Caller guarantees what `check` checked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles<const K: u8>(w: &[u8], x: &ActsQ8, out: &mut [f32], rows: usize, ahead: usize) {
    let reach = w.len() + ahead;
    if x.t == 1 {
        // Four rows a tile: the token's activations are loaded once for the four, and the
        // blocks' bookkeeping shared. On a Zen 4 core a one-token Q4_K product ran at 41, 47 and
        // 53 GMAC/s with one, two and four rows from the caches, 38, 44 and 47 from memory (Q6_K
        // 31, 37, 40 and 29, 34, 35); the 0.6B shape's Q4_K_M decoded at 47, 54 and 60 tok/s on
        // one thread (docs/gguf.md). q4's tiles keep one row (their unpacking is cheaper, and
        // Zen 5 read four rows' streams slower: docs/kernels.md, "One row a decode tile").
        return for_each_tile(rows, 1, 4, 1, |m, _, r, _| {
            // SAFETY: row r exists (for_each_tile keeps it so); the rest is our caller's promise.
            unsafe {
                match m {
                    4 => tile::<K, 4, 1>(w, x, out, r, 0, Some(reach)),
                    3 => tile::<K, 3, 1>(w, x, out, r, 0, Some(reach)),
                    2 => tile::<K, 2, 1>(w, x, out, r, 0, Some(reach)),
                    _ => tile::<K, 1, 1>(w, x, out, r, 0, Some(reach)),
                }
            }
        });
    }
    if x.t > TOKENS {
        return unpacked_tiles::<K>(w, x, out, rows, reach);
    }
    for_each_tile(rows, x.t, 2, TOKENS, |m, n, r, i| {
        // Only a block of rows' first tokens ask for its weights ahead (as q4's tiles).
        let reach = (i == 0).then_some(reach);
        // SAFETY: rows r..r+m and tokens i..i+n exist (for_each_tile keeps them so); as above.
        unsafe {
            match (m, n) {
                (2, 4) => tile::<K, 2, 4>(w, x, out, r, i, reach),
                (2, 3) => tile::<K, 2, 3>(w, x, out, r, i, reach),
                (2, 2) => tile::<K, 2, 2>(w, x, out, r, i, reach),
                (2, _) => tile::<K, 2, 1>(w, x, out, r, i, reach),
                (_, 4) => tile::<K, 1, 4>(w, x, out, r, i, reach),
                (_, 3) => tile::<K, 1, 3>(w, x, out, r, i, reach),
                (_, 2) => tile::<K, 1, 2>(w, x, out, r, i, reach),
                _ => tile::<K, 1, 1>(w, x, out, r, i, reach),
            }
        }
    });
}

/// Where a tile's tokens start: their laid-out values, group scales, Q4_K's minimums' factors
/// and Q6_K's corrections.
struct Tokens<const N: usize> {
    x: [*const i8; N],
    xs: [*const f32; N],
    mins: [*const f32; N],
    corr: [*const i32; N],
}

/// `out[(r + a) * t + i + j]` for the `R` weight rows from `r` and the `N` tokens from `i`,
/// prefetching weights up to `reach` bytes from the start of `w` (`None`: none).
///
/// Caller guarantees the rows and tokens exist and what `check` checked. Then every read is in
/// bounds: an interleaved block of `n` groups from group `g0` lies at its GGUF blocks' bytes of
/// its row ([`k_blocks`]) and reads values `32 g0 .. 32 (g0 + n)` of a token's laid-out row,
/// entries `g0 .. g0 + n` of its scales and minimums' factors, `2 g0 .. 2 (g0 + n)` of its
/// corrections; the short block's vector loads are masked to its `n` lanes, and its scales'
/// loads sized to its bytes (`scales`: 8 of scales, 4 of minimums' nibbles, 2 or 4 of f16s).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const R: usize, const N: usize>(
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
    reach: Option<usize>,
) {
    let kind = kind::<K>();
    let row_bytes = kind.row_bytes(x.cols);
    let rows: [*const u8; R] = std::array::from_fn(|a| w.as_ptr().add((r + a) * row_bytes));
    let tokens = tokens::<N>(x, i);
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for (g0, n, at) in k_blocks(kind, x.cols) {
        let len = n / 8 * kind.block_bytes();
        // Row a's block asked for ahead just before it is read (spread among the arithmetic).
        let ask = |a: usize| {
            if let Some(reach) = reach {
                prefetch_lines(w, (r + a) * row_bytes + at, len, reach);
            }
        };
        match n {
            16 => block::<K, R, N, true>(&mut acc, &rows, &tokens, g0, at, n, ask),
            _ => block::<K, R, N, false>(&mut acc, &rows, &tokens, g0, at, n, ask),
        }
    }
    store(&acc, out, x.t, r, i);
}

/// The GGUF kind a const parameter `K` names.
const fn kind<const K: u8>() -> KQuant {
    if K == Q4K {
        KQuant::Q4K
    } else {
        KQuant::Q6K
    }
}

/// Where the `N` tokens from `i` start. Caller guarantees `x` holds them (as `check` checked).
#[inline]
unsafe fn tokens<const N: usize>(x: &ActsQ8, i: usize) -> Tokens<N> {
    let (k, cols, groups) = (&x.k, x.cols, x.cols / GROUP);
    Tokens {
        x: std::array::from_fn(|j| k.xi.as_ptr().add((i + j) * cols)),
        xs: std::array::from_fn(|j| k.xs32.as_ptr().add((i + j) * groups)),
        mins: std::array::from_fn(|j| k.mins.as_ptr().add((i + j) * groups)),
        corr: std::array::from_fn(|j| k.corr6.as_ptr().add((i + j) * 2 * groups)),
    }
}

/// Each (row, token)'s sum of its 16 lanes into `out[(r + a) * t + i + j]`. Caller guarantees
/// those entries exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn store<const R: usize, const N: usize>(
    acc: &[[__m512; N]; R],
    out: &mut [f32],
    t: usize,
    r: usize,
    i: usize,
) {
    for (a, acc_a) in acc.iter().enumerate() {
        let at = out.as_mut_ptr().add((r + a) * t + i);
        if N == 4 {
            _mm_storeu_ps(at, sum16x4([acc_a[0], acc_a[1], acc_a[2], acc_a[3]]));
        } else {
            for (j, &v) in acc_a.iter().enumerate() {
                *at.add(j) = sum16(v);
            }
        }
    }
}

/// A row's interleaved block as a prompt tile multiplies it: its eight byte vectors
/// ([`weights`], unshifted) and its two scale vectors ([`scales`]), 640 bytes.
#[derive(Clone, Copy)]
struct Unpacked {
    w: [__m512i; 8],
    s: [__m512; 2],
}

/// The block of `n` groups at `p` (16 when `FULL`), unpacked. Caller guarantees what
/// [`tile`]'s caller does for the block's bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack<const K: u8, const FULL: bool>(p: *const u8, n: usize) -> Unpacked {
    Unpacked {
        w: match K {
            Q4K => weights::<Q4, FULL>(p, n, false),
            _ => weights::<Q6, FULL>(p, n, false),
        },
        s: scales::<K, FULL>(p, n),
    }
}

thread_local! {
    /// A block of [`TILE_BLOCK_ROWS`] rows unpacked, kept between calls: it grows (once per
    /// thread and width) to 640 bytes a row's 512 columns, 20 KiB for 16 rows of 1024 columns,
    /// the first time a prompt meets a wider matrix; decode never touches it.
    static UNPACKED: RefCell<Vec<Unpacked>> = const { RefCell::new(Vec::new()) };
}

/// `out = w x` for a prompt of more tokens than a tile takes: each block of
/// [`TILE_BLOCK_ROWS`] rows is unpacked once, then its tiles read it for every token, in
/// [`for_each_tile`]'s order. Beside a (row, token) pair's 8 `vpdpbusd` a block, its `finish`
/// takes 5 vector operations, and a row's unpacking about 34 for Q6_K (values from two parts,
/// scales from bytes), shared by a tile's 4 tokens: about 8 more a pair, unless a row is
/// unpacked once for every token. The same operations make each (row, token)'s sums, so the
/// same bits. On an Emerald Rapids Xeon core, 1024 x 1024 against 128 tokens from the caches
/// (`KERNELS_BENCH=k_quants`, medians of six runs): Q6_K 89 -> 116 GMAC/s, Q4_K 106 -> 129.
///
/// Caller guarantees what `check` checked; `reach` as [`tile`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unpacked_tiles<const K: u8>(
    w: &[u8],
    x: &ActsQ8,
    out: &mut [f32],
    rows: usize,
    reach: usize,
) {
    let kind = kind::<K>();
    let row_bytes = kind.row_bytes(x.cols);
    let blocks: Vec<(usize, usize, usize)> = k_blocks(kind, x.cols).collect();
    let nb = blocks.len();
    UNPACKED.with_borrow_mut(|unpacked| {
        if unpacked.len() < TILE_BLOCK_ROWS * nb {
            // SAFETY: an `Unpacked` is vectors of plain bits; all zeros is a valid value.
            unpacked.resize(TILE_BLOCK_ROWS * nb, unsafe { std::mem::zeroed() });
        }
        for r0 in (0..rows).step_by(TILE_BLOCK_ROWS) {
            let r1 = (r0 + TILE_BLOCK_ROWS).min(rows);
            // Row r's block b at `unpacked[(r - r0) nb + b]`, each row's blocks asked for
            // ahead as it is read.
            for r in r0..r1 {
                for (b, &(_, n, at)) in blocks.iter().enumerate() {
                    let len = n / 8 * kind.block_bytes();
                    prefetch_lines(w, r * row_bytes + at, len, reach);
                    let p = w.as_ptr().add(r * row_bytes + at);
                    unpacked[(r - r0) * nb + b] = match n {
                        16 => unpack::<K, true>(p, n),
                        _ => unpack::<K, false>(p, n),
                    };
                }
            }
            let block = &unpacked[..(r1 - r0) * nb];
            for_each_tile(r1 - r0, x.t, 2, TOKENS, |m, n, a, i| {
                let u = &block[a * nb..];
                let r = r0 + a;
                // SAFETY: rows r..r+m and tokens i..i+n exist (for_each_tile keeps them so);
                // `u` holds their blocks; as above.
                unsafe {
                    match (m, n) {
                        (2, 4) => tile_unpacked::<K, 2, 4>(u, &blocks, x, out, r, i),
                        (2, 3) => tile_unpacked::<K, 2, 3>(u, &blocks, x, out, r, i),
                        (2, 2) => tile_unpacked::<K, 2, 2>(u, &blocks, x, out, r, i),
                        (2, _) => tile_unpacked::<K, 2, 1>(u, &blocks, x, out, r, i),
                        (_, 4) => tile_unpacked::<K, 1, 4>(u, &blocks, x, out, r, i),
                        (_, 3) => tile_unpacked::<K, 1, 3>(u, &blocks, x, out, r, i),
                        (_, 2) => tile_unpacked::<K, 1, 2>(u, &blocks, x, out, r, i),
                        _ => tile_unpacked::<K, 1, 1>(u, &blocks, x, out, r, i),
                    }
                }
            });
        }
    });
}

/// [`tile`] for rows already unpacked: row `r + a`'s block `b` at `u[a nb + b]` (`nb` the
/// row's blocks, `blocks` as [`k_blocks`] gives them). Caller guarantees what [`tile`]'s
/// caller does for the tokens and `out`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_unpacked<const K: u8, const R: usize, const N: usize>(
    u: &[Unpacked],
    blocks: &[(usize, usize, usize)],
    x: &ActsQ8,
    out: &mut [f32],
    r: usize,
    i: usize,
) {
    let nb = blocks.len();
    let tokens = tokens::<N>(x, i);
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for (b, &(g0, n, _)) in blocks.iter().enumerate() {
        let rows: [&Unpacked; R] = std::array::from_fn(|a| &u[a * nb + b]);
        match n {
            16 => against_tokens::<K, R, N, true>(&mut acc, &rows, &tokens, g0, n),
            _ => against_tokens::<K, R, N, false>(&mut acc, &rows, &tokens, g0, n),
        }
    }
    store(&acc, out, x.t, r, i);
}

/// Adds the interleaved block of `n` groups from group `g0` (16 when `FULL`, else 8), at byte
/// `at` of each row, into `acc`, calling `ask(a)` before row `a`'s block is read. Caller
/// guarantees what [`tile`]'s caller does.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// The indices pick a row's or token's pointers, weights and accumulator together.
#[allow(clippy::needless_range_loop)]
unsafe fn block<const K: u8, const R: usize, const N: usize, const FULL: bool>(
    acc: &mut [[__m512; N]; R],
    rows: &[*const u8; R],
    tokens: &Tokens<N>,
    g0: usize,
    at: usize,
    n: usize,
    ask: impl Fn(usize),
) {
    if N == 1 {
        // Decode: the token's activations held while each row is unpacked and used at once,
        // two chains of `vpdpbusd` (the low nibbles' and the high ones').
        let x = acts::<N, FULL>(tokens, 0, g0, n);
        for a in 0..R {
            ask(a);
            let p = rows[a].add(at);
            let s = scales::<K, FULL>(p, n);
            let mut isum = chains::<K, N, FULL>(tokens, 0, g0, n);
            // Q4_K leaves its high nibbles in place (16 times their value) and shifts their sum
            // once (exact: each product is a multiple of 16), as decode's q4 does.
            let wv = match K {
                Q4K => weights::<Q4, FULL>(p, n, true),
                _ => weights::<Q6, FULL>(p, n, false),
            };
            for k in 0..8 {
                isum[k / 4] = _mm512_dpbusd_epi32(isum[k / 4], wv[k], x[k]);
            }
            if K == Q4K {
                isum = [
                    _mm512_add_epi32(isum[0], _mm512_srai_epi32(isum[1], 4)),
                    isum[1],
                ];
            }
            finish::<K, N, FULL>(&mut acc[a][0], isum, &s, tokens, 0, g0, n);
        }
    } else {
        // A prompt of a few tokens: the rows unpacked once, then each token against them.
        let u: [Unpacked; R] = std::array::from_fn(|a| {
            ask(a);
            unpack::<K, FULL>(rows[a].add(at), n)
        });
        against_tokens::<K, R, N, FULL>(acc, &u.each_ref(), tokens, g0, n);
    }
}

/// The prompt tiles' block of `n` groups from `g0` (16 when `FULL`): each of the `N` tokens
/// against the `R` rows' unpacked block `u`, into `acc`. Caller guarantees what [`tile`]'s
/// caller does for the tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// The indices pick a row's or token's weights and accumulator together.
#[allow(clippy::needless_range_loop)]
unsafe fn against_tokens<const K: u8, const R: usize, const N: usize, const FULL: bool>(
    acc: &mut [[__m512; N]; R],
    u: &[&Unpacked; R],
    tokens: &Tokens<N>,
    g0: usize,
    n: usize,
) {
    for j in 0..N {
        let x = acts::<N, FULL>(tokens, j, g0, n);
        let mut isum = [chains::<K, N, FULL>(tokens, j, g0, n); R];
        for k in 0..8 {
            for a in 0..R {
                isum[a][k / 4] = _mm512_dpbusd_epi32(isum[a][k / 4], u[a].w[k], x[k]);
            }
        }
        for a in 0..R {
            if K == Q4K {
                isum[a] = [_mm512_add_epi32(isum[a][0], isum[a][1]), isum[a][1]];
            }
            finish::<K, N, FULL>(&mut acc[a][j], isum[a], &u[a].s, tokens, j, g0, n);
        }
    }
}

/// A row's block scales at `p` (the block's start), lane `l` for group `l`: Q4_K's `d sc_l` and
/// `dmin m_l`; Q6_K's `d sc_2l` and `d sc_2l+1`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn scales<const K: u8, const FULL: bool>(p: *const u8, n: usize) -> [__m512; 2] {
    // `n` bytes, one a lane.
    let bytes = |q: *const u8| match FULL {
        true => _mm_loadu_si128(q as *const __m128i),
        false => _mm_loadl_epi64(q as *const __m128i),
    };
    // The GGUF blocks' f16s at `q`, `per` of them a block, widened: block 0's in lanes 0..per,
    // block 1's next (a short block's lanes past its one block's are zero, as is what they
    // multiply: masked loads).
    let f16s = |q: *const u8, per: usize| {
        _mm512_zextps128_ps512(_mm_cvtph_ps(match (FULL, per) {
            (true, 2) => _mm_loadl_epi64(q as *const __m128i),
            (false, 2) | (true, _) => _mm_cvtsi32_si128((q as *const i32).read_unaligned()),
            (false, _) => _mm_cvtsi32_si128((q as *const u16).read_unaligned() as i32),
        }))
    };
    // Lanes 0..8 take entry `a` of the f16s, lanes 8..16 entry `b`.
    let halves = |a: i32, b: i32| _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    if K == Q4K {
        // In bytes (a lane each, 128 bits), then widened: sc = byte & 63; m = its low nibble
        // (lane i < n/2 the low nibble of byte i, lane n/2 + i the high one) | the scale
        // byte's top two bits at bits 4-5 (`vpternlogd 0xf8`: A | B & C).
        let s = p.add(16 * n);
        let scale = bytes(s);
        let sc = _mm_and_si128(scale, _mm_set1_epi8(63));
        let nibbles = match FULL {
            true => _mm_loadl_epi64(s.add(n) as *const __m128i),
            false => _mm_cvtsi32_si128((s.add(n) as *const i32).read_unaligned()),
        };
        let shifted = _mm_srli_epi16(nibbles, 4);
        let low = match FULL {
            true => _mm_unpacklo_epi64(nibbles, shifted),
            false => _mm_unpacklo_epi32(nibbles, shifted),
        };
        let top = _mm_and_si128(_mm_srli_epi16(scale, 2), _mm_set1_epi8(0x30));
        let m = _mm_ternarylogic_epi32::<0xf8>(top, low, _mm_set1_epi8(15));
        let dd = f16s(s.add(3 * n / 2), 2);
        [
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)),
                _mm512_permutexvar_ps(halves(0, 2), dd),
            ),
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m)),
                _mm512_permutexvar_ps(halves(1, 3), dd),
            ),
        ]
    } else {
        let s = p.add(24 * n);
        let d = _mm512_permutexvar_ps(halves(0, 1), f16s(s.add(2 * n), 1));
        let first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes(s)));
        let second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes(s.add(n))));
        [_mm512_mul_ps(first, d), _mm512_mul_ps(second, d)]
    }
}

/// Token `j`'s activations for the block of `n` groups from `g0`: the eight vectors that meet
/// the weights' eight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn acts<const N: usize, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> [__m512i; 8] {
    block_acts::<FULL>(tokens.x[j], g0, n)
}

/// The two chains' starting sums of token `j`'s block: zero for Q4_K; Q6_K's corrections of
/// its weights' `+ 32` (sub-blocks `2l`, then `2l + 1`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chains<const K: u8, const N: usize, const FULL: bool>(
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) -> [__m512i; 2] {
    if K == Q4K {
        return [_mm512_setzero_si512(); 2];
    }
    let c = tokens.corr[j].add(2 * g0) as *const u8;
    [words::<FULL>(c, n), words::<FULL>(c.add(4 * n), n)]
}

/// One (row, token) pair's block, in this order in every tile: Q4_K
/// `acc = fma(float(isum) xs, d sc, acc) - dmin m * mins`; Q6_K
/// `acc = fma(fma(float(isum_b), d sc_b, float(isum_a) d sc_a), xs, acc)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn finish<const K: u8, const N: usize, const FULL: bool>(
    acc: &mut __m512,
    isum: [__m512i; 2],
    s: &[__m512; 2],
    tokens: &Tokens<N>,
    j: usize,
    g0: usize,
    n: usize,
) {
    let xs = _mm512_castsi512_ps(words::<FULL>(tokens.xs[j].add(g0) as *const u8, n));
    if K == Q4K {
        let mins = _mm512_castsi512_ps(words::<FULL>(tokens.mins[j].add(g0) as *const u8, n));
        let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[0]), xs);
        *acc = _mm512_fnmadd_ps(s[1], mins, _mm512_fmadd_ps(v, s[0], *acc));
    } else {
        // |isum| < 16 (63 + 32) 128 < 2^24: exact as an f32.
        let v = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(isum[1]),
            s[1],
            _mm512_mul_ps(_mm512_cvtepi32_ps(isum[0]), s[0]),
        );
        *acc = _mm512_fmadd_ps(v, xs, *acc);
    }
}
