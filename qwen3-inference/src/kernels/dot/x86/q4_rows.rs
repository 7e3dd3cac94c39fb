//! The AVX-512 q4 and q6 product for prompts: sixteen weight rows in the lanes of a vector.
//!
//! The step kernel (`q4.rs`) puts a row's weights along a vector's lanes, so every row and token
//! ends in a sum across lanes, and each step's weights are unpacked again for every few tokens.
//! Here the lanes are the rows: a chunk (128 weights, four groups) of 16 rows is loaded, one
//! 64-byte vector a row, and transposed as a 16 x 16 matrix of 32-bit words, so that vector `d`
//! holds word `d` of every row: four nibble bytes, weights `4s ..` (low nibbles) and `16 + 4s ..`
//! (high nibbles) of group `d / 4`, `s = d % 4`. A block of 16 rows is unpacked and transposed
//! once into a buffer (`Block`) and read from the nearer caches for every tile of [`TILE`]
//! tokens, so a prompt unpacks each weight once.
//!
//! ## The step kernel's bits
//!
//! The engine promises that a prompt run in one pass leaves the KV cache that the same tokens
//! decoded one by one would, and that a request's tokens do not depend on what else a server
//! step runs (`engine/mod.rs`). Decode takes the step kernel, so this product computes every
//! (row, token) with the step kernel's f32 operations, on the same values, in the same order.
//! The step kernel keeps 16 lanes of partial sums for a row and a token; in its step at chunks
//! `c`, `c + 1`, even lane `q` takes a whole group of chunk `c + q / 8` (group
//! `Q4Layout::PairsWide.lane_group(q % 8)`: the odd lane's integer sum added in, `dot/q4.rs`)
//! and odd lanes stay 0:
//!
//! ```text
//! isum  = corr + dot(w, x) over the group's 32 weights    exact; corr = -8 * sum(x) (q6: -32)
//! acc[q] = fma(float(isum) * x_scale, w_scale, acc[q])
//! ```
//!
//! and at the end it adds the 16 lanes in a fixed tree (`q4.rs`, `sum16`). Here partial sum `q`
//! of token `j` is a vector whose lane `a` is row `a`'s: the same groups in the same order
//! (chunks `q / 8`, `q / 8 + 2`, ...), each term from the same exact integer and the same
//! scales by the same two roundings, and the 16 vectors added in the same tree
//! (`sum16_across`). The same IEEE operations on the same values give the same bits, so the
//! test `gives_the_step_kernels_bits` compares them bit for bit. A group of 16 rows and a token
//! takes 8 `vpdpbusd` (the activations broadcast four at a time), one conversion and two
//! scalings, with no sum across lanes and no unpacking.
//!
//! `QWEN3_Q4_PROMPT=step` keeps prompts on the step kernel (the same bits, slower: for
//! measuring).

use super::super::q4::{Q4Layout, CHUNK, SIMD_GROUP};
use super::super::q6;
use super::super::ActsQ8;
use super::q4::sum16_across;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows a block: the lanes of a 512-bit vector of i32.
const ROWS: usize = 16;

/// Tokens a tile: each has a vector of integer sums and one of f32 sums.
const TILE: usize = 8;

/// Tokens from which the AVX-512 q4 kernel hands a product to this one: a prompt's products
/// (`matmul.rs` runs 16 tokens or fewer, a serving step's, as decode's).
pub(super) const ROWS_FROM: usize = 17;

/// Whether the environment keeps prompts on the step kernel: `QWEN3_Q4_PROMPT=step` (read once).
pub(super) fn step_requested() -> bool {
    static STEP_ASKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STEP_ASKED.get_or_init(|| std::env::var("QWEN3_Q4_PROMPT").is_ok_and(|v| v == "step"))
}

/// Groups in `chunks` full chunks.
const fn chunks_groups(chunks: usize) -> usize {
    chunks * (CHUNK / SIMD_GROUP)
}

/// A block's unpacked weights and scales, reused from one block to the next.
#[derive(Default)]
struct Block {
    /// `[groups, 8, ROWS, 4]`: for group `g` and step `s`, weights `4s .. 4s + 4` of the group,
    /// of each row, as unsigned bytes (q4: `q + 8`, q6: `q + 32`).
    w: Vec<u8>,
    /// `[groups, ROWS]`: each row's group scale, widened.
    scales: Vec<f32>,
}

thread_local! {
    static BLOCK: RefCell<Block> = RefCell::new(Block::default());
}

/// [`super::super::MatQ4`] on AVX-512 VNNI, for q4 weights or (`SIX`) q6 ones (`dot/q6.rs`),
/// with its checks: [`rows_product`] for callers that have not made them (the tests; the step
/// kernel, which has, calls `rows_product` itself).
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn mat_q4_rows_avx512<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    ahead: usize,
) {
    q6::check_either::<SIX>(w, ws, x, out);
    if x.q4.chunks == 0 {
        return q6::reference_either::<SIX>(w, ws, x, out, ahead);
    }
    assert_eq!(
        x.q4.layout,
        Q4Layout::PairsWide,
        "the AVX-512 q4 rows product reads Q4Layout::PairsWide"
    );
    rows_product::<SIX>(w, ws, x, out);
}

/// The product of `rows = out.len() / x.t` weight rows with the prompt's tokens. Reads the plain
/// activation rows and the corrections and scales of `x.q4`. Does not prefetch: a prompt's
/// product is bound by arithmetic, and a block's rows are read once.
///
/// Caller guarantees that `q6::check_either::<SIX>` passed, that `x.q4.chunks > 0`, and that the
/// layout is `Q4Layout::PairsWide` (8 lanes a chunk, an even lane's correction the whole
/// group's), as `mat_q4_avx512` checks before it calls this.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_product<const SIX: bool>(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
) {
    let rows = out.len() / x.t;
    let (t, cols, chunks) = (x.t, x.cols, x.q4.chunks);
    let (row_bytes, per) = (q6::row_bytes::<SIX>(cols), cols / SIMD_GROUP);
    let geo = Geometry {
        w,
        ws,
        row_bytes,
        per,
        chunks,
    };
    for r0 in (0..rows).step_by(ROWS) {
        let m = (rows - r0).min(ROWS);
        // SAFETY: rows r0 .. r0 + m exist, `check_either` proved every slice has the length of
        // its shape (and `x.q4` the corrections and scales of `chunks` chunks, 8 lanes each:
        // the layout is PairsWide), the caller's word.
        buffered::<SIX>(&geo, x, out, r0, m);
        if chunks_groups(chunks) < per {
            // The columns after the last full chunk: the reference's product.
            for r in r0..r0 + m {
                let (w_r, ws_r) = (
                    &w[r * row_bytes..(r + 1) * row_bytes],
                    &ws[r * per..(r + 1) * per],
                );
                for i in 0..t {
                    out[r * t + i] +=
                        q6::tail_either::<SIX>(w_r, ws_r, x.q_row(i), x.scales_row(i), chunks);
                }
            }
        }
    }
}

/// The weights of one product.
struct Geometry<'a> {
    w: &'a [u8],
    ws: &'a [u16],
    row_bytes: usize,
    per: usize,
    chunks: usize,
}

/// Rows `r0 .. r0 + m` against all tokens, the block unpacked once into a buffer and then read
/// for each tile of up to [`TILE`] tokens. Caller guarantees what [`rows_product`]'s callers do, that the rows exist and `m <=
/// ROWS`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn buffered<const SIX: bool>(
    geo: &Geometry,
    x: &ActsQ8,
    out: &mut [f32],
    r0: usize,
    m: usize,
) {
    let groups = chunks_groups(geo.chunks);
    BLOCK.with(|cell| {
        let mut block = cell.borrow_mut();
        block.w.resize(groups * 8 * ROWS * 4, 0);
        block.scales.resize(groups * ROWS, 0.0);
        for c in 0..geo.chunks {
            let words = chunk_words::<SIX>(geo, r0, m, c);
            let scales = chunk_scales(geo, r0, m, c);
            for (gc, &group_scales) in scales.iter().enumerate() {
                let g = 4 * c + gc;
                let kw = group_weights::<SIX>(&words, gc);
                for (s, v) in kw.iter().enumerate() {
                    let at = block.w.as_mut_ptr().add((g * 8 + s) * 64);
                    // SAFETY: within `block.w`, resized for `groups` groups above.
                    _mm512_storeu_si512(at as *mut __m512i, *v);
                }
                _mm512_storeu_ps(block.scales.as_mut_ptr().add(g * ROWS), group_scales);
            }
        }
        let mut i = 0;
        while i < x.t {
            let n = (x.t - i).min(TILE);
            // SAFETY: tokens i .. i + n exist, the block holds `groups` groups, and the layout
            // is PairsWide (asserted by the caller).
            match n {
                8 => from_block::<8, SIX>(&block, x, out, r0, m, i),
                7 => from_block::<7, SIX>(&block, x, out, r0, m, i),
                6 => from_block::<6, SIX>(&block, x, out, r0, m, i),
                5 => from_block::<5, SIX>(&block, x, out, r0, m, i),
                4 => from_block::<4, SIX>(&block, x, out, r0, m, i),
                3 => from_block::<3, SIX>(&block, x, out, r0, m, i),
                2 => from_block::<2, SIX>(&block, x, out, r0, m, i),
                _ => from_block::<1, SIX>(&block, x, out, r0, m, i),
            }
            i += n;
        }
    })
}

/// Tokens `i .. i + N` against the unpacked block, the step kernel's arithmetic (the module's
/// text). Caller guarantees those tokens exist, the block holds `chunks_groups(x.q4.chunks)`
/// groups, and `x.q4` is laid out in `Q4Layout::PairsWide` (8 lanes of corrections and scales
/// a chunk).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn from_block<const N: usize, const SIX: bool>(
    block: &Block,
    x: &ActsQ8,
    out: &mut [f32],
    r0: usize,
    m: usize,
    i: usize,
) {
    const L: usize = Q4Layout::PairsWide.lanes();
    let (cols, chunks) = (x.cols, x.q4.chunks);
    let lanes = chunks * L;
    // parts[q][j]: the step kernel's lane q for token i + j, of the 16 rows. Its odd lanes
    // stay 0 (`Q4Layout::PairsWide`), and so do these.
    let mut parts = [[_mm512_setzero_ps(); N]; 2 * L];
    for (q, part) in parts.iter_mut().enumerate().step_by(2) {
        let l = q % L;
        let gc = Q4Layout::PairsWide.lane_group(l);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut c = q / L;
        while c < chunks {
            let g = 4 * c + gc;
            // SAFETY: group g < chunks * 4 lies within the block (the caller's word).
            let at = block.w.as_ptr().add(g * 8 * 64);
            let kw: [__m512i; 8] =
                std::array::from_fn(|s| _mm512_loadu_si512(at.add(s * 64) as *const __m512i));
            let scales = _mm512_loadu_ps(block.scales.as_ptr().add(g * ROWS));
            let lane = i * lanes + L * c + l;
            for (j, acc_j) in acc.iter_mut().enumerate() {
                // SAFETY: token i + j exists, lane `L * c + l` < chunks * 8 and group g's 32
                // values lie within its row (`check_either` proved the lengths).
                let at = lane + j * lanes;
                // The even lane's correction is the whole group's (`Q4Layout::PairsWide`); q6
                // weights are q + 32, four times q4's offset of 8.
                let corr = *x.q4.corr.get_unchecked(at);
                let corr = if SIX { corr << 2 } else { corr };
                let row = x.q.as_ptr().add((i + j) * cols + g * SIMD_GROUP);
                let mut isum = _mm512_set1_epi32(corr);
                for (s, &v) in kw.iter().enumerate() {
                    // Activations 4s .. 4s + 4 of the group, in every lane.
                    let four = (row.add(4 * s) as *const i32).read_unaligned();
                    isum = _mm512_dpbusd_epi32(isum, v, _mm512_set1_epi32(four));
                }
                let xs = _mm512_set1_ps(*x.q4.scales.get_unchecked(at));
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), xs);
                *acc_j = _mm512_fmadd_ps(v, scales, *acc_j);
            }
            c += 2;
        }
        *part = acc;
    }
    for j in 0..N {
        let sum = sum16_across(&std::array::from_fn(|q| parts[q][j]));
        let mut lanes = [0f32; ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        for (a, &v) in lanes.iter().enumerate().take(m) {
            out[(r0 + a) * x.t + i + j] = v;
        }
    }
}

/// Chunk `c` of rows `r0 .. r0 + m` as 32-bit words: `[0]` word `d` of the 64 nibble bytes of
/// every row (lane `a` row `r0 + a`; lanes from `m` zero), and for q6 `[1]` word `e` (0..8) of
/// its 32 high bytes. Caller guarantees the rows and the chunk exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_words<const SIX: bool>(
    geo: &Geometry,
    r0: usize,
    m: usize,
    c: usize,
) -> [[__m512i; ROWS]; 2] {
    let chunk_bytes = q6::row_bytes::<SIX>(CHUNK);
    let at = |a: usize| {
        geo.w
            .as_ptr()
            .add((r0 + a) * geo.row_bytes + c * chunk_bytes)
    };
    let mut nib: [__m512i; ROWS] = std::array::from_fn(|a| match a < m {
        // SAFETY: the chunk's 64 nibble bytes of an existing row.
        true => _mm512_loadu_si512(at(a) as *const __m512i),
        false => _mm512_setzero_si512(),
    });
    transpose16(&mut nib);
    let mut high = [_mm512_setzero_si512(); ROWS];
    if SIX {
        for (a, h) in high.iter_mut().enumerate().take(m) {
            // SAFETY: the chunk's 32 high bytes, after its nibbles.
            *h = _mm512_zextsi256_si512(_mm256_loadu_si256(at(a).add(64) as *const __m256i));
        }
        transpose16(&mut high);
    }
    [nib, high]
}

/// Group `gc` (0..4) of a transposed chunk as 8 vectors of unsigned bytes: steps 0..4 the low
/// nibbles of words `4gc ..`, 4..8 their high nibbles; for q6 with each value's top two bits
/// from the high words (word `(gc % 2) * 4 + s`, bits 0-3 for groups 0 and 1, 4-7 for 2 and 3:
/// `dot/q6.rs`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_weights<const SIX: bool>(words: &[[__m512i; ROWS]; 2], gc: usize) -> [__m512i; 8] {
    let nibble = _mm512_set1_epi8(15);
    let bits_4_5 = _mm512_set1_epi8(0x30);
    let mut kw = [_mm512_setzero_si512(); 8];
    for s in 0..4 {
        let v = words[0][4 * gc + s];
        let mut lo = _mm512_and_si512(v, nibble);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        if SIX {
            let h = words[1][(gc % 2) * 4 + s];
            let h = if gc >= 2 { _mm512_srli_epi16(h, 4) } else { h };
            // lo |= (h << 4) & 0x30; hi |= (h << 2) & 0x30 (vpternlogd 0xf8: A | B & C)
            lo = _mm512_ternarylogic_epi32::<0xf8>(lo, _mm512_slli_epi16(h, 4), bits_4_5);
            hi = _mm512_ternarylogic_epi32::<0xf8>(hi, _mm512_slli_epi16(h, 2), bits_4_5);
        }
        kw[s] = lo;
        kw[4 + s] = hi;
    }
    kw
}

/// The four groups' scales of chunk `c` for rows `r0 .. r0 + m` (lanes from `m` zero), widened.
/// Caller guarantees the rows and the chunk exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_scales(geo: &Geometry, r0: usize, m: usize, c: usize) -> [__m512; 4] {
    // Lane a gathers row r0 + a's scales 4c, 4c + 1 (one 32-bit word) and 4c + 2, 4c + 3.
    let rows = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let at = _mm512_mullo_epi32(rows, _mm512_set1_epi32((2 * geo.per) as i32));
    let mask: __mmask16 = if m == ROWS { 0xffff } else { (1 << m) - 1 };
    let base = geo.ws.as_ptr().add(r0 * geo.per + 4 * c) as *const i32;
    let zero = _mm512_setzero_si512();
    // SAFETY: lane a < m reads 4 bytes at scales 4c (and 4c + 2) of row r0 + a, within its
    // `per >= 4c + 4` scales; masked-off lanes read nothing.
    let pair = [
        _mm512_mask_i32gather_epi32::<1>(zero, mask, at, base),
        _mm512_mask_i32gather_epi32::<1>(zero, mask, at, base.add(1)),
    ];
    let widen = |v: __m512i| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    [
        widen(pair[0]),
        widen(_mm512_srli_epi32(pair[0], 16)),
        widen(pair[1]),
        widen(_mm512_srli_epi32(pair[1], 16)),
    ]
}

/// 16 vectors of 16 32-bit words, transposed: afterwards `r[d]` lane `a` is what `r[a]` lane `d`
/// was. Four rounds: words, then pairs of words, then 128-bit quarters twice.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: &mut [__m512i; ROWS]) {
    let mut t = [_mm512_setzero_si512(); ROWS];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for k in 0..4 {
        let b = 4 * k;
        r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    for h in 0..2 {
        let b = 8 * h;
        for k in 0..4 {
            t[b + k] = _mm512_shuffle_i32x4::<0x88>(r[b + k], r[b + 4 + k]);
            t[b + 4 + k] = _mm512_shuffle_i32x4::<0xdd>(r[b + k], r[b + 4 + k]);
        }
    }
    for k in 0..8 {
        r[k] = _mm512_shuffle_i32x4::<0x88>(t[k], t[8 + k]);
        r[8 + k] = _mm512_shuffle_i32x4::<0xdd>(t[k], t[8 + k]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::q4::mat_q4_scalar;
    use super::super::super::q6::mat_q6_scalar;
    use super::super::q4::mat_q4_avx512;
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::testing::next_values;

    /// `w` (`[rows, cols]`) packed as q4 or (`six`) q6 in groups of 32.
    fn pack(six: bool, w: &[f32], cols: usize) -> (Vec<u8>, Vec<u16>) {
        let mut ws = vec![0u16; w.len() / 32];
        let mut p = vec![0u8; if six { w.len() / 4 * 3 } else { w.len() / 2 }];
        match six {
            true => crate::quant::quantize_q6(w, cols, 32, &mut p, &mut ws),
            false => crate::quant::quantize_q4(w, 32, &mut p, &mut ws),
        }
        (p, ws)
    }

    /// This product, whatever the environment says (the CPU has AVX-512: checked by callers).
    fn product(six: bool, p: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32]) {
        // SAFETY: the callers checked `has_avx512()`, all the target features name.
        unsafe {
            match six {
                true => mat_q4_rows_avx512::<true>(p, ws, x, out, 0),
                false => mat_q4_rows_avx512::<false>(p, ws, x, out, 0),
            }
        }
    }

    /// Against the scalar references (`q4.rs`, `q6.rs`), for blocks of 16 rows and rows after
    /// them, tiles of 8 tokens and fewer, rows of whole chunks and with a tail, and rows
    /// narrower than a chunk (the reference itself).
    #[test]
    fn matches_the_reference() {
        if !super::super::has_avx512() {
            eprintln!("no AVX-512 VNNI: skipping the AVX-512 prompt product");
            return;
        }
        let mut seed = 23;
        for six in [false, true] {
            for (rows, t, groups) in [
                (37, 17, 17),
                (16, 20, 8),
                (19, 33, 7),
                (3, 17, 9),
                (5, 2, 4),
                (17, 9, 3),
            ] {
                let cols = 32 * groups;
                let w = next_values(rows * cols, &mut seed);
                let x = next_values(t * cols, &mut seed);
                let (p, ws) = pack(six, &w, cols);
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4_as(&x, t, cols, 32, Q4Layout::PairsWide);
                let (mut got, mut want) = (vec![f32::NAN; rows * t], vec![0f32; rows * t]);
                product(six, &p, &ws, &acts, &mut got);
                match six {
                    true => mat_q6_scalar(&p, &ws, &acts, &mut want, 0),
                    false => mat_q4_scalar(&p, &ws, &acts, &mut want, 0),
                }
                for (k, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                        "six={six} {rows}x{cols} t={t} [{k}]: {g} vs {e}"
                    );
                }
            }
        }
    }

    /// Every (row, token) gets the step kernel's bits: a prompt's product here against each
    /// token decoded alone and against the step kernel's tiles of a serving step (2 to 16
    /// tokens), for blocks of 16 rows and rows after them, an odd number of chunks (a lone last
    /// one), a tail after the chunks, and the sign of the scales both ways. So a prompt's tokens
    /// also get the same bits however the prompt is cut.
    #[test]
    fn gives_the_step_kernels_bits() {
        if !super::super::has_avx512() {
            eprintln!("no AVX-512 VNNI: skipping the AVX-512 prompt product");
            return;
        }
        let mut seed = 29;
        for six in [false, true] {
            for (rows, t, groups) in [(35, 40, 9), (16, 17, 8), (21, 19, 28), (3, 33, 13)] {
                let cols = 32 * groups;
                let w = next_values(rows * cols, &mut seed);
                let x = next_values(t * cols, &mut seed);
                let (p, ws) = pack(six, &w, cols);
                let mut buf = ActsQ8Buf::default();
                let mut all = vec![f32::NAN; rows * t];
                let acts = buf.quantize_for_q4_as(&x, t, cols, 32, Q4Layout::PairsWide);
                product(six, &p, &ws, &acts, &mut all);
                // Decode (one token), and the step kernel's tiles of a serving step.
                for n in [1, 5, 16] {
                    for from in (0..t).step_by(n) {
                        let n = n.min(t - from);
                        let x_part = &x[from * cols..(from + n) * cols];
                        let acts = buf.quantize_for_q4_as(x_part, n, cols, 32, Q4Layout::PairsWide);
                        let mut part = vec![f32::NAN; rows * n];
                        // SAFETY: the CPU has AVX-512 VNNI (checked above), all it uses; fewer
                        // than ROWS_FROM tokens take the step kernel.
                        unsafe {
                            match six {
                                true => mat_q4_avx512::<true>(&p, &ws, &acts, &mut part, 0),
                                false => mat_q4_avx512::<false>(&p, &ws, &acts, &mut part, 0),
                            }
                        }
                        for r in 0..rows {
                            for i in 0..n {
                                assert_eq!(
                                    part[r * n + i].to_bits(),
                                    all[r * t + from + i].to_bits(),
                                    "six={six} {rows}x{cols} row {r} token {} of {n}: {} vs {}",
                                    from + i,
                                    part[r * n + i],
                                    all[r * t + from + i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// What the step kernel's arithmetic here rests on: in `Q4Layout::Pairs` lanes `2k` and
    /// `2k + 1` sum halves of one group, and the even lanes take each group once.
    #[test]
    fn neighbouring_lanes_share_a_group() {
        let layout = Q4Layout::PairsWide;
        let mut seen = [false; 4];
        for l in (0..8).step_by(2) {
            let g = layout.lane_group(l);
            assert_eq!(g, layout.lane_group(l + 1), "lanes {l}, {}", l + 1);
            assert!(!seen[g], "group {g} twice");
            seen[g] = true;
        }
    }

    /// Every weight at the top (q4 15, q6 63) or bottom (0) of its stored range and every
    /// activation at +-127: exact integer sums, `level * cols`.
    #[test]
    fn at_the_extremes() {
        if !super::super::has_avx512() {
            eprintln!("no AVX-512 VNNI: skipping the AVX-512 prompt product");
            return;
        }
        let (rows, t, cols) = (17, 18, 32 * 12);
        for six in [false, true] {
            for byte in [0xffu8, 0x00] {
                for sign in [1.0f32, -1.0] {
                    let len = if six {
                        rows * cols / 4 * 3
                    } else {
                        rows * cols / 2
                    };
                    let (p, ws) = (vec![byte; len], vec![0x3c00u16; rows * cols / 32]); // f16 1.0
                    let x = vec![sign; t * cols];
                    let mut buf = ActsQ8Buf::default();
                    let acts = buf.quantize_for_q4_as(&x, t, cols, 32, Q4Layout::PairsWide);
                    let (offset, top) = if six { (32.0, 63.0) } else { (8.0, 15.0) };
                    let level = if byte == 0 { -offset } else { top - offset };
                    let want = sign * level * cols as f32;
                    let mut got = vec![f32::NAN; rows * t];
                    product(six, &p, &ws, &acts, &mut got);
                    for (k, &g) in got.iter().enumerate() {
                        assert!(
                            (g - want).abs() <= 1e-5 * want.abs(),
                            "six={six} byte={byte:#x} sign={sign} [{k}]: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The transpose moves word `d` of vector `a` to word `a` of vector `d`.
    #[test]
    fn transpose16_transposes() {
        if !super::super::has_avx512() {
            eprintln!("no AVX-512: skipping the AVX-512 transpose");
            return;
        }
        let m: Vec<i32> = (0..256).collect();
        // SAFETY: the CPU has AVX-512 F (checked above); the loads and stores are within `m`
        // and `got`.
        unsafe {
            let mut r: [__m512i; ROWS] = std::array::from_fn(|a| {
                _mm512_loadu_si512(m.as_ptr().add(16 * a) as *const __m512i)
            });
            transpose16(&mut r);
            for (d, v) in r.iter().enumerate() {
                let mut got = [0i32; 16];
                _mm512_storeu_si512(got.as_mut_ptr() as *mut __m512i, *v);
                let want: Vec<i32> = (0..16).map(|a| 16 * a + d as i32).collect();
                assert_eq!(got.to_vec(), want, "vector {d}");
            }
        }
    }
}
