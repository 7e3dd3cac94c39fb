//! AVX2's q8 products in groups of 32 and 64: a GGUF's Q8_0 matrices, the q8 ones of a q4 file
//! (`format::Q4Mix`, groups of 32) and a q8 file's (64). Eight groups share a vector: lane `l`
//! ends with the whole integer sum of group `l` of the eight, so one conversion and two
//! multiplies scale eight groups.
//!
//! ## Why
//!
//! In the file's order a group of 32 is one 256-bit vector (of 64, two), and its byte products
//! (`vpmaddubsw`, then `vpmaddwd`) leave its sum spread over all eight lanes: the file-order
//! kernels (`avx2.rs`, `tile_q8_avx2`, which other multiples of 32 take) convert, scale and add
//! every group of every (row, token) pair on its own, about as much work as the group's byte
//! products for groups of 32 and half as much for 64. Here, for each run of eight groups from
//! group `g` of a row and a token:
//!
//! ```text
//! isum[l]  = sum of w * x over the GS values of group g + l      l = 0 .. 8, exact integers
//! acc     += float(isum) * xs[g .. g + 8] * ws[g .. g + 8]        one conversion, two multiplies
//! result   = acc's eight lanes added (hsum256)
//! ```
//!
//! (a last run of fewer than eight groups has zeros in its other lanes: no products, no scales).
//!
//! **Decode** (one token) reads the row in the file's order, once: eight groups' vectors of
//! partial sums are added across ([`lanes_of`]: two rounds of `vphaddd`, then the halves
//! swapped and added) into one vector whose lane `l` is group `l`'s sum. **A serving step** (a
//! few tokens, one per sequence) does the same for a row and up to four tokens at a time
//! ([`tile_file`]: each weight vector loaded and made absolute once for them, the additions
//! across made as the groups come).
//!
//! **A prompt** reads each weight row once for every token. A block of 16 rows is first put in
//! the interleaved order (`dot/interleaved.rs`: a vector holds word `k`, four bytes, of each of
//! eight groups), into a buffer of this thread, and the activations are laid out in the same
//! order once per product ([`ActsQ8::interleaved`]); then each vector's byte products add into
//! their own group's lane directly, for a row and four tokens at a time, and the reordering
//! costs a copy of the block's bytes against `t` passes over them. With a few tokens (a serving
//! step's, below [`reorder_from`]) that copy would cost more than it saves.
//!
//! The integer sums are exact in any order, and the float steps are the same in the same order
//! in every path, so a prompt's tokens get decode's bits, alone or beside others.

use super::super::interleaved::{blocks, interleave_words, GROUPS};
use super::super::q4::ActsQ4;
use super::super::ActsQ8;
use super::avx2::{dot4, hsum256};
use super::{prefetch_ahead, PREFETCH_FAR, PREFETCH_NEAR};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// A 256-bit vector's bytes: a group of 32 is one, a group of 64 two.
const VECTOR: usize = 32;

/// Groups a run covers: one per 32-bit lane.
const LANES: usize = 8;

/// Tokens a prompt tile takes (one weight row each): its four sums and four accumulators, the
/// weights' vector and its absolute value fit AVX2's sixteen registers.
const TOKENS: usize = 4;

/// Weight rows reordered at a time, then read by every token (as `for_each_tile`'s blocks).
const BLOCK_ROWS: usize = 16;

/// Tokens from which a product in groups of `gs` reorders its weights: below, a row takes
/// [`tile_file`] a few tokens at a time. Groups of 32: at 8 and 16 tokens the reordering
/// product ran 1.13-1.22 times the file-order tile it replaced (docs/kernels.md, "q8 in groups
/// of 32 and 64 on AVX2"). Groups of 64: the copy of a block's rows pays from about 16 tokens
/// (at 2-4 tokens it ran at half the speed of reading the file's order).
pub(super) const fn reorder_from(gs: usize) -> usize {
    match gs {
        32 => 8,
        _ => 16,
    }
}

/// A block of weight rows as the prompt tile reads them ([`tile`]): in the interleaved order,
/// with each group's sign correction. `vpmaddubsw` multiplies unsigned by signed bytes, so a
/// signed weight's sign must move onto the activation: `sign(x, w)` (`vpsignb`) runs on the
/// ports the products run on, once for every (row, token) pair. The tile takes `x ^ m` instead
/// (`m` all ones where `w < 0`, made once a weight vector for the tile's tokens), a bitwise xor
/// that any vector port runs, which for a negative weight is `|w| (-x - 1) = w x - |w|`; the
/// group's exact sum is then the tile's plus
///
/// ```text
/// C = sum of |w| over the group's negative weights         (one per row and group, made here)
/// ```
///
/// (the products stay in `vpmaddubsw`'s range: `|w| <= 128` and `x ^ m` in [-128, 127], so a
/// pair's sum is in [-32768, 32512]). The whole blocks of 16 groups take this form; a row's
/// ragged last block, read by masked loads, keeps `vpsignb` (the same exact sums).
///
/// Measured: the prompt product 58-62 -> 62-69 GMAC/s in groups of 64 and 53-58 -> 58-63 in
/// groups of 32 (1024 x 1024 and 1024 x 4096 by 128 tokens, 256 x 1024 by 784; AVX2 kernels
/// on Zen 4; docs/kernels.md). Keeping `|w|` and `m` in the block instead of making them in
/// the tile measured no faster, and slower on wide rows (twice the bytes).
struct Block {
    w: Vec<u8>,
    corr: Vec<i32>,
}

impl Block {
    /// `rows` (file order, `cols` bytes each, groups of `GS`) into the block's first rows.
    ///
    /// Caller guarantees the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn fill<const GS: usize>(&mut self, rows: &[i8], cols: usize) {
        let (n, per) = (rows.len() / cols, cols / GS);
        if self.w.len() < n * cols {
            self.w.resize(n * cols, 0);
        }
        if self.corr.len() < n * per {
            self.corr.resize(n * per, 0);
        }
        let src: &[u8] = bytemuck::cast_slice(rows);
        for (s, d) in src.chunks_exact(cols).zip(self.w.chunks_exact_mut(cols)) {
            // SAFETY: the CPU has AVX2 (our caller's promise); `s` and `d` are one row each.
            unsafe { reorder_row::<GS>(s, d) };
        }
        // C of each group: |min(w, 0)| (128 for -128, as an unsigned byte), summed by
        // `vpsadbw` against zero (eight bytes to a 64-bit lane).
        let zero = _mm256_setzero_si256();
        for (g, c) in rows.chunks_exact(GS).zip(&mut self.corr) {
            let mut sum = zero;
            for v in g.chunks_exact(VECTOR) {
                // SAFETY: `v` is 32 bytes.
                let v = unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) };
                let magnitudes = _mm256_abs_epi8(_mm256_min_epi8(v, zero));
                sum = _mm256_add_epi64(sum, _mm256_sad_epu8(magnitudes, zero));
            }
            let half = _mm_add_epi64(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            *c = (_mm_cvtsi128_si64(half) + _mm_extract_epi64::<1>(half)) as i32;
        }
    }
}

thread_local! {
    /// The prompt tile's block of rows, kept between calls. It grows (once per thread and
    /// width) the first time a product of [`reorder_from`] tokens or more meets a wider matrix:
    /// a prompt's, or a serving step's of that many sequences; decode never touches it.
    static BLOCK: RefCell<Block> = const {
        RefCell::new(Block { w: Vec::new(), corr: Vec::new() })
    };
}

/// [`super::super::MatQ8`] on AVX2 for groups of `GS` (32 or 64), after the caller's `x.check`
/// returned `rows`; byte products by the instructions `P` names ([`super::avx2::MADDUBS`]).
///
/// Caller guarantees the CPU has AVX2, FMA and the instructions `P` names, and that
/// `x.check(w, ws, out)` passed with `x.group_size == GS`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn mat_q8_lanes_avx2<const GS: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    out: &mut [f32],
    rows: usize,
    ahead: usize,
) {
    let (t, cols) = (x.t, x.cols);
    let per = cols / GS;
    let row = |r: usize| (&w[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
    let acts = x.interleaved().filter(|_| t >= reorder_from(GS));
    let Some(acts) = acts else {
        for r in 0..rows {
            let (w_r, ws_r) = row(r);
            // As in mat_q8_avx2: prefetch no further than the bytes this thread reads next, and
            // with the row's first tokens only (the others find the row in cache).
            let after = (rows - r - 1) * cols + ahead;
            if t == 1 {
                let (x_0, xs_0) = (x.q_row(0), &x.scales[..per]);
                out[r] = if after >= PREFETCH_FAR {
                    dot_q8_lanes_avx2::<PREFETCH_FAR, GS, P>(w_r, ws_r, x_0, xs_0)
                } else if after >= PREFETCH_NEAR {
                    dot_q8_lanes_avx2::<PREFETCH_NEAR, GS, P>(w_r, ws_r, x_0, xs_0)
                } else {
                    dot_q8_lanes_avx2::<0, GS, P>(w_r, ws_r, x_0, xs_0)
                };
                continue;
            }
            let mut i = 0;
            while i < t {
                let n = (t - i).min(TOKENS);
                let o = &mut out[r * t + i..r * t + i + n];
                // The first tokens' pass reads the row from memory: ask for what follows.
                let reach = match i == 0 {
                    true if after >= PREFETCH_FAR => PREFETCH_FAR,
                    true if after >= PREFETCH_NEAR => PREFETCH_NEAR,
                    _ => 0,
                };
                // SAFETY: the CPU has AVX2, FMA and `P`'s instructions (our caller's promise);
                // `check` proved the row, its scales and tokens i..i+n whole.
                unsafe {
                    match n {
                        4 => tile_file::<GS, P, 4>(w_r, ws_r, x, i, o, reach),
                        3 => tile_file::<GS, P, 3>(w_r, ws_r, x, i, o, reach),
                        2 => tile_file::<GS, P, 2>(w_r, ws_r, x, i, o, reach),
                        _ => tile_file::<GS, P, 1>(w_r, ws_r, x, i, o, reach),
                    }
                }
                i += n;
            }
        }
        return;
    };
    BLOCK.with(|cell| {
        let block = &mut *cell.borrow_mut();
        for r0 in (0..rows).step_by(BLOCK_ROWS) {
            let n_rows = (rows - r0).min(BLOCK_ROWS);
            // SAFETY: the CPU has AVX2 (our caller's promise).
            unsafe { block.fill::<GS>(&w[r0 * cols..(r0 + n_rows) * cols], cols) };
            let mut i = 0;
            while i < t {
                let n = (t - i).min(TOKENS);
                for a in 0..n_rows {
                    let w_r = Row {
                        w: &block.w[a * cols..(a + 1) * cols],
                        corr: &block.corr[a * per..(a + 1) * per],
                        scales: row(r0 + a).1,
                    };
                    let o = &mut out[(r0 + a) * t + i..(r0 + a) * t + i + n];
                    // SAFETY: the CPU has AVX2, FMA and `P`'s instructions (our caller's
                    // promise); the activations are laid out whole (`interleaved` checked
                    // their lengths) and hold tokens i..i+n; the row is `cols` bytes in groups
                    // of GS.
                    unsafe {
                        match n {
                            4 => tile::<GS, P, 4>(w_r, acts, i, o),
                            3 => tile::<GS, P, 3>(w_r, acts, i, o),
                            2 => tile::<GS, P, 2>(w_r, acts, i, o),
                            _ => tile::<GS, P, 1>(w_r, acts, i, o),
                        }
                    }
                }
                i += n;
            }
        }
    });
}

/// One row of groups of `GS` (`src`) in the interleaved order, into `dst` (as long): what
/// [`interleave_words`] writes, each whole half block (8 groups) by transposes of eight vectors
/// (vector `l` eight words of group `l`, in; vector `k` word `k` of each group, out), one for
/// groups of 32 and two (words 0-7, then 8-15) for groups of 64.
///
/// Caller guarantees the CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn reorder_row<const GS: usize>(src: &[u8], dst: &mut [u8]) {
    assert!(src.len() == dst.len() && src.len().is_multiple_of(GS));
    let whole = src.len() / (GS * GROUPS) * GS * GROUPS;
    for at in (0..whole).step_by(GS * GROUPS) {
        for half in 0..2 {
            let from = at + half * GS * LANES;
            // Words 8c .. 8c + 8 of each group of the half: a group of 64 is two such runs.
            for c in 0..GS / VECTOR {
                // SAFETY: run c of group l of the half is bytes from + GS l + 32 c .. + 32 of
                // `src`, below `whole`; vector 8c + k of the block goes to bytes at + 64 (8c +
                // k) + 32 half .. + 32 of `dst`.
                let groups: [__m256i; LANES] = std::array::from_fn(|l| {
                    let p = src.as_ptr().add(from + GS * l + VECTOR * c);
                    _mm256_loadu_si256(p as *const __m256i)
                });
                for (k, v) in transpose8(groups).into_iter().enumerate() {
                    let to = at + (LANES * c + k) * 4 * GROUPS + half * 4 * LANES;
                    _mm256_storeu_si256(dst.as_mut_ptr().add(to) as *mut __m256i, v);
                }
            }
        }
    }
    // A last block of fewer than 16 groups lies as a block of its own would from its start.
    interleave_words(&src[whole..], GS, &mut dst[whole..]);
}

/// The 8 x 8 transpose of 32-bit words: word `k` of vector `l` to word `l` of vector `k`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: [__m256i; LANES]) -> [__m256i; LANES] {
    // Pairs of words ([r0_0 r1_0 r0_1 r1_1 | r0_4 r1_4 r0_5 r1_5], ...), then of pairs, then
    // the 128-bit halves.
    let lo32 = |a, b| _mm256_unpacklo_epi32(a, b);
    let hi32 = |a, b| _mm256_unpackhi_epi32(a, b);
    let t = [
        lo32(r[0], r[1]),
        hi32(r[0], r[1]),
        lo32(r[2], r[3]),
        hi32(r[2], r[3]),
        lo32(r[4], r[5]),
        hi32(r[4], r[5]),
        lo32(r[6], r[7]),
        hi32(r[6], r[7]),
    ];
    let lo64 = |a, b| _mm256_unpacklo_epi64(a, b);
    let hi64 = |a, b| _mm256_unpackhi_epi64(a, b);
    // u[k] for rows 0-3 and u[4 + k] for rows 4-7: words k and k + 4 of four rows.
    let u = [
        lo64(t[0], t[2]),
        hi64(t[0], t[2]),
        lo64(t[1], t[3]),
        hi64(t[1], t[3]),
        lo64(t[4], t[6]),
        hi64(t[4], t[6]),
        lo64(t[5], t[7]),
        hi64(t[5], t[7]),
    ];
    std::array::from_fn(|k| match k < 4 {
        true => _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k]),
        false => _mm256_permute2x128_si256::<0x31>(u[k - 4], u[k]),
    })
}

/// `sum_g ws[g] xs[g] sum_{c in g} w[c] x[c]` over groups of `GS` in the file's order, in
/// runs of eight groups (the module's text); prefetches the weights `REACH` bytes ahead as
/// `avx2.rs`'s `group_q8_avx2` does (see [`PREFETCH_NEAR`]).
///
/// Caller guarantees the CPU has AVX2, FMA and the instructions `P` names.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_q8_lanes_avx2<const REACH: usize, const GS: usize, const P: u8>(
    w: &[i8],
    ws: &[f32],
    x: &[i8],
    xs: &[f32],
) -> f32 {
    let groups = ws.len().min(xs.len()).min(w.len() / GS).min(x.len() / GS);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut g = 0;
    // SAFETY: group g + l < groups is read at [(g + l) GS, (g + l + 1) GS) of w and x, and
    // scales g .. g + m of ws and xs with g + m <= groups; a prefetch never faults, and
    // `wrapping_add` may point past the slice without UB.
    while g < groups {
        let m = (groups - g).min(LANES);
        let at = g * GS;
        let sums: [__m256i; LANES] = std::array::from_fn(|l| match l < m {
            true => {
                let zero = _mm256_setzero_si256();
                (0..GS / VECTOR).fold(zero, |sum, c| {
                    let at = at + GS * l + VECTOR * c;
                    // A line (64 bytes) ahead at a time, among the products.
                    if at.is_multiple_of(64) {
                        prefetch_ahead(wp.wrapping_add(at), REACH);
                    }
                    let wv = _mm256_loadu_si256(wp.add(at) as *const __m256i);
                    let xv = _mm256_loadu_si256(xp.add(at) as *const __m256i);
                    dot4::<P>(sum, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
                })
            }
            false => _mm256_setzero_si256(),
        });
        let (xs_g, ws_g) = (scales(xs.as_ptr().add(g), m), scales(ws.as_ptr().add(g), m));
        acc = finish(acc, lanes_of(sums), xs_g, ws_g);
        g += LANES;
    }
    hsum256(acc)
}

/// Weight row `w` (in the file's order) with scales `ws` against tokens `i .. i + N` of `x`, into
/// `out` (`N` values): decode's sums and steps ([`dot_q8_lanes_avx2`]: each group's integer sum put
/// in its lane of a run of eight by [`lanes_of`], then [`finish`]), so the same bits, with each
/// weight vector loaded and made absolute once for the `N` tokens. A serving step's few tokens
/// take it, where reordering the rows would cost more than it saves. Prefetches the weights
/// `reach` bytes ahead as decode does ([`PREFETCH_NEAR`], [`PREFETCH_FAR`] or 0: a value
/// given at run time, not a parameter of the compiled code as in decode, which keeps the
/// binary smaller; the test is one predictable branch a line).
///
/// Caller guarantees the CPU has AVX2, FMA and the instructions `P` names, that `w` and `ws` are
/// one row (`w.len() / GS` groups, as many scales) and that `x` holds tokens `i .. i + N` of
/// `w.len()` values each.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_file<const GS: usize, const P: u8, const N: usize>(
    w: &[i8],
    ws: &[f32],
    x: &ActsQ8,
    i: usize,
    out: &mut [f32],
    reach: usize,
) {
    let (cols, per) = (w.len(), ws.len());
    let wp = w.as_ptr();
    let xp: [*const i8; N] = std::array::from_fn(|j| x.q.as_ptr().add((i + j) * cols));
    let xs: [*const f32; N] = std::array::from_fn(|j| x.scales.as_ptr().add((i + j) * per));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut g = 0;
    while g < per {
        let m = (per - g).min(LANES);
        // Group g + l's integer sums for every token (eight partial sums a vector), zero past
        // the run's m groups.
        let group = |l: usize| -> [__m256i; N] {
            let mut s = [_mm256_setzero_si256(); N];
            if l < m {
                for c in 0..GS / VECTOR {
                    let at = (g + l) * GS + VECTOR * c;
                    // A line ahead at a time (see dot_q8_lanes_avx2).
                    if reach > 0 && at.is_multiple_of(64) {
                        prefetch_ahead(wp.wrapping_add(at), reach);
                    }
                    let wv = _mm256_loadu_si256(wp.add(at) as *const __m256i);
                    let aw = _mm256_sign_epi8(wv, wv);
                    for (j, s_j) in s.iter_mut().enumerate() {
                        let xv = _mm256_loadu_si256(xp[j].add(at) as *const __m256i);
                        *s_j = dot4::<P>(*s_j, aw, _mm256_sign_epi8(xv, wv));
                    }
                }
            }
            s
        };
        // [`lanes_of`]'s additions, made as the groups come, so that a token holds a few
        // vectors at a time instead of eight: pairs of groups, then pairs of pairs.
        let h = |a: [__m256i; N], b: [__m256i; N]| -> [__m256i; N] {
            std::array::from_fn(|j| _mm256_hadd_epi32(a[j], b[j]))
        };
        let quad = |l: usize| {
            let low = h(group(l), group(l + 1));
            h(low, h(group(l + 2), group(l + 3)))
        };
        let (lo4, hi4) = (quad(0), quad(4));
        let ws_g = scales(ws.as_ptr().add(g), m);
        for j in 0..N {
            let sums = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(lo4[j], hi4[j]),
                _mm256_permute2x128_si256::<0x31>(lo4[j], hi4[j]),
            );
            let xs_g = scales(xs[j].add(g), m);
            acc[j] = finish(acc[j], sums, xs_g, ws_g);
        }
        g += LANES;
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum256(a);
    }
}

/// One weight row of a [`Block`] (`cols` bytes in the interleaved order), each group's sign
/// correction and scale.
#[derive(Clone, Copy)]
struct Row<'a> {
    w: &'a [u8],
    corr: &'a [i32],
    scales: &'a [f32],
}

/// Weight row `w` against tokens `i .. i + N` of `acts`, into `out` (`N` values):
///
/// ```text
/// isum[l] = C[l] + sum over group l's words k of dot4(|w|_k, x_k ^ m_k)   (exact: see Block)
/// ```
///
/// Caller guarantees the CPU has AVX2, FMA and the instructions `P` names, that `acts` holds
/// whole laid-out rows of `cols` values for tokens `i .. i + N` and their `cols / GS` scales,
/// and that the row's fields hold `cols` bytes and `cols / GS` entries. Then every read is in
/// bounds: a block of `n` groups from group `g0` is bytes `GS g0 .. GS (g0 + n)` of the row and of
/// each token's, vector `k` (of `GS / 4`) of it the `4n` bytes from `GS g0 + 4nk`; a run from group
/// `lo` of the block reads `4 min(8, n - lo)` of them from `4 lo` on (the scales and corrections
/// likewise, entries `g0 + lo ..`), and a masked load neither reads nor faults past its mask.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const GS: usize, const P: u8, const N: usize>(
    w: Row,
    acts: &ActsQ4,
    i: usize,
    out: &mut [f32],
) {
    let cols = w.w.len();
    let per = cols / GS;
    let w_row = w.w.as_ptr();
    let x_row: [*const u8; N] =
        std::array::from_fn(|j| acts.x.as_ptr().add((i + j) * cols) as *const u8);
    let xs_row: [*const f32; N] = std::array::from_fn(|j| acts.scales.as_ptr().add((i + j) * per));
    let mut acc = [_mm256_setzero_ps(); N];
    for (g0, n) in blocks(per) {
        let block = g0 * GS;
        if n == GROUPS {
            // A whole block: vector k of half h at 64 k + 32 h, so each stream is one pointer
            // and the offsets are constants (with a run-time stride the compiler kept a pointer
            // per vector, on the stack).
            for h in 0..2 {
                let at = block + 4 * LANES * h;
                let wp = w_row.add(at);
                let xp: [*const u8; N] = std::array::from_fn(|j| x_row[j].add(at));
                let g = g0 + LANES * h;
                let c = _mm256_loadu_si256(w.corr.as_ptr().add(g) as *const __m256i);
                let mut isum = [c; N];
                let zero = _mm256_setzero_si256();
                for k in 0..GS / 4 {
                    let off = 4 * GROUPS * k;
                    let wv = _mm256_loadu_si256(wp.add(off) as *const __m256i);
                    let (aw, m) = (_mm256_abs_epi8(wv), _mm256_cmpgt_epi8(zero, wv));
                    for j in 0..N {
                        let xv = _mm256_loadu_si256(xp[j].add(off) as *const __m256i);
                        isum[j] = dot4::<P>(isum[j], aw, _mm256_xor_si256(xv, m));
                    }
                }
                let ws_g = _mm256_loadu_ps(w.scales.as_ptr().add(g));
                for j in 0..N {
                    let xs_g = _mm256_loadu_ps(xs_row[j].add(g));
                    acc[j] = finish(acc[j], isum[j], xs_g, ws_g);
                }
            }
            continue;
        }
        let mut lo = 0;
        while lo < n {
            let m = (n - lo).min(LANES);
            let mask = first(m);
            let load = |p: *const u8| match m {
                LANES => _mm256_loadu_si256(p as *const __m256i),
                _ => _mm256_maskload_epi32(p as *const i32, mask),
            };
            let mut isum = [_mm256_setzero_si256(); N];
            for k in 0..GS / 4 {
                let at = block + k * 4 * n + 4 * lo;
                let wv = load(w_row.add(at));
                let aw = _mm256_sign_epi8(wv, wv);
                for j in 0..N {
                    let xv = load(x_row[j].add(at));
                    isum[j] = dot4::<P>(isum[j], aw, _mm256_sign_epi8(xv, wv));
                }
            }
            let ws_g = scales(w.scales.as_ptr().add(g0 + lo), m);
            for j in 0..N {
                let xs_g = scales(xs_row[j].add(g0 + lo), m);
                acc[j] = finish(acc[j], isum[j], xs_g, ws_g);
            }
            lo += LANES;
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum256(a);
    }
}

/// `acc + float(isum) * xs * ws`: one (row, token) pair's run of eight groups, in this order in
/// decode and in a prompt.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish(acc: __m256, isum: __m256i, xs: __m256, ws: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), xs), ws, acc)
}

/// The vector whose lane `l` is the sum of `sums[l]`'s eight lanes.
///
/// `vphaddd(a, b)` adds neighbouring lanes within each 128-bit half: `[a0+a1, a2+a3, b0+b1,
/// b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]`. Two rounds over `sums[0..4]` give `[s0, s1, s2, s3 |
/// s0', s1', s2', s3']` (`s`: the sum of lanes 0-3, `s'`: of lanes 4-7), likewise for
/// `sums[4..8]`; the two low halves side by side plus the two high halves side by side is the
/// answer.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lanes_of(sums: [__m256i; LANES]) -> __m256i {
    let h = |a, b| _mm256_hadd_epi32(a, b);
    let lo4 = h(h(sums[0], sums[1]), h(sums[2], sums[3]));
    let hi4 = h(h(sums[4], sums[5]), h(sums[6], sums[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo4, hi4),
        _mm256_permute2x128_si256::<0x31>(lo4, hi4),
    )
}

/// `m` (at most 8) scales from `p`, zero in the lanes after them. Caller guarantees `p .. p +
/// m` is in bounds (a masked load reads nothing past its mask).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales(p: *const f32, m: usize) -> __m256 {
    match m {
        LANES => _mm256_loadu_ps(p),
        _ => _mm256_maskload_ps(p, first(m)),
    }
}

/// The mask of lanes `0 .. m`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn first(m: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(m as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposes write what the scalar rule writes: rows of one to five whole blocks, with
    /// and without a short last block (of 1, 8, 9 and 15 groups).
    #[test]
    fn reordered_rows_are_the_interleaved_order() {
        if !super::super::has_avx2() {
            eprintln!("no AVX2: skipping the AVX2 reordering of q8 rows");
            return;
        }
        for gs in [32, 64] {
            for groups in [1, 8, 9, 15, 16, 17, 24, 25, 31, 32, 45, 80] {
                let src: Vec<u8> = (0..groups * gs).map(|i| (i * 7 + i / 256) as u8).collect();
                let (mut want, mut got) = (vec![0u8; src.len()], vec![0u8; src.len()]);
                interleave_words(&src, gs, &mut want);
                // SAFETY: has_avx2() said the CPU has AVX2.
                match gs {
                    32 => unsafe { reorder_row::<32>(&src, &mut got) },
                    _ => unsafe { reorder_row::<64>(&src, &mut got) },
                }
                assert_eq!(got, want, "{groups} groups of {gs}");
            }
        }
    }
}
