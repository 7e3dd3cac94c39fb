//! Attention with no mask and no cache: every row of a frame attends to every row of it, as the
//! vision tower's blocks do (`Qwen3VLVisionAttention`, within one image). Per head:
//!
//! ```text
//! q, k, v: [n, hd]     scores = q k^T * scale   [n, n]     o = softmax(scores) v   [n, hd]
//! ```
//!
//! The decoder's attention kernels read one query against a cache; here every product is a
//! small matrix product whose inner dimension (hd, 64 or 72) is short, where the matmul kernels'
//! dot products spend as much time adding up their lanes as multiplying. So the products are
//! written the other way round, each a sum of rows scaled by a number (`acc += a * row`): a
//! register tile (`tile.rs`) of 6 query rows by 16 or 32 columns ([`WIDE`]), in plain loops
//! that `vectorized!` compiles per instruction set, each step one fused multiply-add where the
//! set has one (the baseline x86 multiplies, then adds):
//! the rows' partial sums stay in registers while a row of k^T (or of v) streams past once for
//! all of them, the keys in chunks that stay in cache while a task's query rows go over them.
//! The heads and blocks of query rows run on all threads.

use super::exp::exp_with;
use super::lanes::sum;
use super::tile::{self, row_blocks};
use rayon::prelude::*;
use std::ops::Range;

/// Query rows computed together, at most: their sums share each load of k^T and v (`tile.rs`).
const MAX_ROWS: usize = tile::ROWS;

/// Columns of a block of accumulators: one AVX-512 register a row, two AVX2 ones (measured best
/// of 8, 16, 32 and 64 columns by 2, 4, 6 and 8 rows on Zen 4, with separate multiplies and
/// adds; with fused ones, AVX2's 6 rows by 16 columns ran 8-10% faster than 4 by 16).
const LANES: usize = 16;
/// Columns of a block with AVX-512 (`vectorized!`'s `W`): two registers a row, twelve sums in
/// flight.
const WIDE: usize = 32;

// Why two widths: each multiply-add waits on the one before it into the same accumulator:
// with the tiles of 4 rows these kernels had, a block of 16 columns kept eight chains going with
// AVX2 (two registers a row) and four with AVX-512. Zen 4 runs a 512-bit operation as two
// halves, and four kept it as busy as more (16 columns measured best there, with separate
// multiplies and adds); Zen 5 runs two whole ones a cycle, and with 32 columns, eight chains, its
// scores and weighted sums ran about 1.4 times as fast (measured: docs/vision.md, "Attention").
// With 6 rows: twelve chains with AVX2 at 16 columns and with AVX-512 at 32. Every lane's sum is
// the same whatever the width, so the bits are too.

/// Query rows of one rayon task: they share each pass of k^T and v through the cache. A multiple
/// of a tile's rows (6), so that only an image's last task has a ragged block; its scores, 48
/// rows of 3072 keys, are 576 KiB, within a Zen 4 or Zen 5 core's 1 MiB L2.
const TASK_ROWS: usize = 48;
/// Keys a pass covers: a chunk of k^T (`[hd, KEYS]`) and of v (`[KEYS, hd]`), 128 KiB each at
/// hd 64, stays in the core's cache while the task's rows go over it. Without chunks a large
/// image's k^T and v (3 MiB a head at 3072 patches) came from memory for every tile of rows.
const KEYS: usize = 512;

/// The distance between rows of a head's k^T, in values: `n` rounded up to whole 64-byte lines,
/// and to an odd number of them. A column block of the scores reads one line from each of k^T's
/// `hd` rows. The L1 data cache has 64 sets of 64-byte lines (Zen 4 and 5, and Intel's cores),
/// the set chosen by address bits 6-11, so rows a multiple of 4 KiB apart (`n` a multiple of
/// 1024: a 1024 x 768 image's 3072 patches) put all `hd` lines in one set of 8 or 12 ways: they
/// evict each other, and the scores of that image ran at about half the speed the same code
/// reached with an odd stride (measured: docs/vision.md, "Attention"). Rows an odd number of
/// lines apart fall in `hd` different sets.
fn kt_stride(n: usize) -> usize {
    let lines = n.div_ceil(16);
    16 * (lines | 1)
}

/// Buffers [`frame_attention`] fills anew on each call, kept by the caller from call to call (a
/// tower's 24 blocks): made afresh each time, buffers this large are fresh pages from the kernel
/// every time (docs/vision.md, "Not done yet"). Their contents between calls do not matter.
#[derive(Default)]
pub struct FrameScratch {
    /// Each head's k^T, `[heads][hd, ld]`.
    kt: Vec<f32>,
    /// Each head's v, `[heads][n, hd]`.
    v: Vec<f32>,
    /// Each head's output, `[heads][n, hd]`, before it goes to its columns of `o`.
    o: Vec<f32>,
}

/// One frame's attention, every head: `q`, `k`, `v` and `o` are `[n, heads * hd]` (the heads side
/// by side in each row, as the tower's projections give them).
#[allow(clippy::too_many_arguments)]
pub fn frame_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &mut [f32],
    n: usize,
    heads: usize,
    hd: usize,
    scale: f32,
    scratch: &mut FrameScratch,
) {
    let d = heads * hd;
    assert!(q.len() == n * d && k.len() == n * d && v.len() == n * d && o.len() == n * d);
    let ld = kt_stride(n);
    let FrameScratch {
        kt: kts,
        v: vhs,
        o: ohs,
    } = scratch;
    // Every value is written below but k^T's padding, which is never read.
    kts.resize(heads * hd * ld, 0.0);
    vhs.resize(heads * n * hd, 0.0);
    ohs.resize(heads * n * hd, 0.0);
    // 1. Each head's k transposed, [hd, n] (a row of k^T: one dimension of every key), and v,
    //    [n, hd], gathered once.
    kts.par_chunks_exact_mut(hd * ld)
        .zip(vhs.par_chunks_exact_mut(n * hd))
        .enumerate()
        .for_each(|(h, (kt, vh))| {
            for j in 0..n {
                let (krow, vrow) = (&k[j * d + h * hd..][..hd], &v[j * d + h * hd..][..hd]);
                for (c, &kv) in krow.iter().enumerate() {
                    kt[c * ld + j] = kv;
                }
                vh[j * hd..(j + 1) * hd].copy_from_slice(vrow);
            }
        });
    // 2. Tasks: a head's block of TASK_ROWS query rows; each writes its rows of its head's
    //    output, [rows, hd]. A task's query rows and scores are scratch of the rayon job that
    //    runs it (`for_each_init`: one per split of the work, not one per task).
    let (kts, vhs) = (&*kts, &*vhs);
    ohs.par_chunks_exact_mut(n * hd)
        .enumerate()
        .for_each(|(h, oh)| {
            let (kt, vh) = (&kts[h * hd * ld..][..hd * ld], &vhs[h * n * hd..][..n * hd]);
            oh.par_chunks_mut(TASK_ROWS * hd).enumerate().for_each_init(
                || (Vec::new(), Vec::new()),
                |(qh, scores): &mut (Vec<f32>, Vec<f32>), (t, out)| {
                    let (r0, rows) = (t * TASK_ROWS, out.len() / hd);
                    qh.clear();
                    for i in r0..r0 + rows {
                        qh.extend_from_slice(&q[i * d + h * hd..][..hd]);
                    }
                    scores.resize(rows * n, 0.0);
                    out.fill(0.0);
                    task(qh, kt, ld, vh, scores, out, n, hd, scale);
                },
            );
        });
    // 3. Each head's output to its columns of `o`, row by row on all threads.
    let ohs = &*ohs;
    o.par_chunks_exact_mut(d).enumerate().for_each(|(j, row)| {
        for (h, oh) in row.chunks_exact_mut(hd).enumerate() {
            oh.copy_from_slice(&ohs[(h * n + j) * hd..][..hd]);
        }
    });
}

/// A task's query rows `q` ([r, hd]) of one head against its `kt` ([hd, n], rows `ld` apart) and
/// `v` ([n, hd]):
/// scores key chunk by key chunk, softmax, output into `o` ([r, hd], zeros) chunk by chunk, the
/// rows in blocks of [`MAX_ROWS`] (`tile::row_blocks`).
#[allow(clippy::too_many_arguments)]
fn task(
    q: &[f32],
    kt: &[f32],
    ld: usize,
    v: &[f32],
    scores: &mut [f32],
    o: &mut [f32],
    n: usize,
    hd: usize,
    scale: f32,
) {
    let blocks = || row_blocks(q.len() / hd);
    for j0 in (0..n).step_by(KEYS) {
        let keys = j0..KEYS.min(n - j0) + j0;
        for (i, r) in blocks() {
            let (qb, sb) = (&q[i * hd..][..r * hd], &mut scores[i * n..][..r * n]);
            scores_rows(qb, kt, ld, sb, n, hd, scale, keys.clone());
        }
    }
    for row in scores.chunks_exact_mut(n) {
        softmax(row);
    }
    for j0 in (0..n).step_by(KEYS) {
        let keys = j0..KEYS.min(n - j0) + j0;
        for (i, r) in blocks() {
            let (pb, ob) = (&scores[i * n..][..r * n], &mut o[i * hd..][..r * hd]);
            weighted_rows(pb, v, ob, n, hd, keys.clone());
        }
    }
}

vectorized! { fused<F, W>
    /// `scores[i][j] = scale * sum_c q[i][c] kt[c][j]` for the block's rows i (up to
    /// [`MAX_ROWS`]) and `keys`, in column blocks of [`WIDE`] values, then of [`LANES`].
    #[allow(clippy::too_many_arguments)]
    fn scores_rows(
        q: &[f32],
        kt: &[f32],
        ld: usize,
        scores: &mut [f32],
        n: usize,
        hd: usize,
        scale: f32,
        keys: Range<usize>,
    ) {
        // Wide blocks as far as they go whole, then the narrow ones: the edge of a chunk
        // stays on the fast path wherever 16 columns are left. Only the AVX-512 version (`W`)
        // has the wide blocks at all.
        let mid = match W {
            true => keys.start + (keys.end - keys.start) / WIDE * WIDE,
            false => keys.start,
        };
        if W {
            scores_cols::<WIDE, F>(q, kt, ld, scores, n, hd, scale, keys.start..mid);
        }
        scores_cols::<LANES, F>(q, kt, ld, scores, n, hd, scale, mid..keys.end);
    }
}

/// [`scores_rows`] in column blocks of `L`: a whole block is one register tile
/// ([`tile::tile`]: the block's query rows against `kt`'s rows, `ld` values apart, a ragged
/// block at the end of the keys too). Inlined into each instruction set's version.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_cols<const L: usize, const F: bool>(
    q: &[f32],
    kt: &[f32],
    ld: usize,
    scores: &mut [f32],
    n: usize,
    hd: usize,
    scale: f32,
    keys: Range<usize>,
) {
    let r = q.len() / hd;
    let qrows: [&[f32]; MAX_ROWS] = std::array::from_fn(|i| match i < r {
        true => &q[i * hd..][..hd],
        false => &[],
    });
    let mut j0 = keys.start;
    while j0 < keys.end {
        let w = L.min(keys.end - j0);
        let mut put = |i: usize, sums: &[f32]| {
            for (s, &x) in scores[i * n + j0..][..w].iter_mut().zip(sums) {
                *s = x * scale;
            }
        };
        if w == L {
            tile::tile::<L, F>(&qrows[..r], &kt[j0..], ld, |i, sums| put(i, sums));
        } else {
            tile::ragged::<L, F>((q, hd, r), hd, &kt[j0..], ld, w, &mut put);
        }
        j0 += w;
    }
}

/// Probabilities below this are taken as 0. Left as they are, the far tail of a peaked softmax
/// (e^-87 and the like) becomes subnormal floats in the products with v, each of which costs the
/// CPU a hundred cycles (measured: a tower's attention 4 times slower). Dropping them moves an
/// output by at most `n * 1e-20` of the largest value of v: nothing an f32 can hold.
const NEGLIGIBLE: f32 = 1e-20;

vectorized! { fused<F>
    /// A row of scores into probabilities: `e^(s - max) / sum`, the sum in lanes, the
    /// negligible ones 0. The exponential's multiply-adds fused where `F` (`exp_with`): the
    /// softmax was a sixth of the attention's time (AVX2, 3072 patches).
    fn softmax(row: &mut [f32]) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        for s in row.iter_mut() {
            *s = exp_with::<F>(*s - max);
        }
        let inv = 1.0 / sum(row);
        for s in row.iter_mut() {
            let p = *s * inv;
            *s = if p < NEGLIGIBLE { 0.0 } else { p };
        }
    }
}

vectorized! { fused<F, W>
    /// `o[i][c] += sum_j p[i][j] v[j][c]` for the block's rows i (up to [`MAX_ROWS`]) and keys
    /// `keys`, in column blocks of the head's columns, [`WIDE`] then [`LANES`] values.
    fn weighted_rows(
        p: &[f32],
        v: &[f32],
        o: &mut [f32],
        n: usize,
        hd: usize,
        keys: Range<usize>,
    ) {
        // As in `scores_rows`: wide blocks of the head's columns, then narrow ones.
        let mid = match W {
            true => hd / WIDE * WIDE,
            false => 0,
        };
        if W {
            weighted_cols::<WIDE, F>(p, v, o, n, hd, 0..mid, keys.clone());
        }
        weighted_cols::<LANES, F>(p, v, o, n, hd, mid..hd, keys);
    }
}

/// [`weighted_rows`] for the head's columns `cols`, in blocks of `L`: a whole block is one
/// register tile ([`tile::tile`]: the block's rows of probabilities over `keys` against `v`'s
/// rows, a ragged block at the end of the head too). Inlined into each instruction set's
/// version.
#[inline(always)]
fn weighted_cols<const L: usize, const F: bool>(
    p: &[f32],
    v: &[f32],
    o: &mut [f32],
    n: usize,
    hd: usize,
    cols: Range<usize>,
    keys: Range<usize>,
) {
    let r = p.len() / n;
    let prows: [&[f32]; MAX_ROWS] = std::array::from_fn(|i| match i < r {
        true => &p[i * n..][keys.clone()],
        false => &[],
    });
    for c0 in cols.clone().step_by(L) {
        let w = L.min(cols.end - c0);
        // Row j of v from column c0 starts `hd` values after row j - 1's.
        let b = &v[keys.start * hd + c0..];
        let mut put = |i: usize, sums: &[f32]| {
            for (x, &y) in o[i * hd + c0..][..w].iter_mut().zip(sums) {
                *x += y;
            }
        };
        match w == L {
            true => tile::tile::<L, F>(&prows[..r], b, hd, |i, s| put(i, s)),
            false => tile::ragged::<L, F>((&p[keys.start..], n, r), keys.len(), b, hd, w, &mut put),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::madd;

    /// Against the textbook form in f64, in every instruction set's version (fused or not), on
    /// sizes with ragged edges (rows not a multiple of 6 or of a task, columns not of `LANES`, a
    /// head of 72 as Qwen3.5's tower has).
    #[test]
    fn matches_the_textbook_form() {
        use super::super::{tests::FORCED_ISA, VectorIsa};
        for &isa in VectorIsa::ALL.iter().filter(|isa| isa.supported()) {
            // The tasks run on rayon's threads, where a forced version does not reach: one
            // thread of this test's own runs them all.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            pool.install(|| {
                FORCED_ISA.set(Some(isa));
                matches_the_textbook_form_in(isa);
                FORCED_ISA.set(None);
            });
        }
    }

    fn matches_the_textbook_form_in(isa: super::super::VectorIsa) {
        for (n, heads, hd) in [(1, 1, 8), (37, 2, 72), (70, 3, 64), (600, 1, 40)] {
            let d = heads * hd;
            let val = |i: usize, salt: usize| {
                (((i * 7919 + salt * 104_729) % 997) as f32 / 997.0 - 0.5) * 2.0
            };
            let q: Vec<f32> = (0..n * d).map(|i| val(i, 1)).collect();
            let k: Vec<f32> = (0..n * d).map(|i| val(i, 2)).collect();
            let v: Vec<f32> = (0..n * d).map(|i| val(i, 3)).collect();
            let scale = (hd as f32).powf(-0.5);
            let mut o = vec![0f32; n * d];
            frame_attention(
                &q,
                &k,
                &v,
                &mut o,
                n,
                heads,
                hd,
                scale,
                &mut FrameScratch::default(),
            );
            for h in 0..heads {
                for i in 0..n {
                    let s: Vec<f64> = (0..n)
                        .map(|j| {
                            (0..hd)
                                .map(|c| {
                                    q[i * d + h * hd + c] as f64 * k[j * d + h * hd + c] as f64
                                })
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for c in 0..hd {
                        let want: f64 = (0..n)
                            .map(|j| e[j] / total * v[j * d + h * hd + c] as f64)
                            .sum();
                        let got = o[i * d + h * hd + c] as f64;
                        assert!(
                            (got - want).abs() < 2e-6,
                            "{isa:?} n {n} head {h} row {i} col {c}: {got} {want}"
                        );
                    }
                }
            }
        }
    }

    /// Every instruction set's version that fuses its multiply-adds gives, bit for bit, what the
    /// same steps give written out one value at a time: each score one chain of multiply-adds
    /// over the head's dimensions, the softmax as `softmax` writes it, each output one chain over
    /// a chunk's keys added chunk by chunk. So the tiles' shapes (6 rows, 16 or 32 columns, the
    /// ragged rests) change no bit, on any machine, with one fused version or several. Sizes
    /// that reach each path: 10 rows (a tile and a rest of 4), 530 keys (a whole chunk of 512 in
    /// 32-column blocks, then 16 and a ragged 2), heads of 72 (64 and a ragged 8) and 48 (32 and
    /// 16).
    #[test]
    fn every_fused_isa_gives_the_bits_of_the_written_out_steps() {
        use super::super::{tests::FORCED_ISA, VectorIsa};
        let fused = |isa: &VectorIsa| *isa != VectorIsa::Baseline || super::super::BASELINE_FUSES;
        let isas: Vec<VectorIsa> = VectorIsa::ALL
            .iter()
            .copied()
            .filter(|isa| isa.supported() && fused(isa))
            .collect();
        if isas.is_empty() {
            eprintln!("skipped: no instruction set here fuses multiply-adds (x86 without AVX2)");
            return;
        }
        let rows = 10;
        for (n, hd) in [(530, 72), (61, 48)] {
            let x: Vec<f32> = (0..n * hd)
                .map(|i| ((i * 31 % 101) as f32 - 50.0) / 40.0)
                .collect();
            let ld = kt_stride(n);
            let mut kt = vec![0f32; hd * ld];
            for j in 0..n {
                for c in 0..hd {
                    kt[c * ld + j] = x[j * hd + c];
                }
            }
            let (q, v, scale) = (&x[..rows * hd], &x, 0.125);
            let mut want = vec![0f32; rows * hd];
            for (i, o) in want.chunks_exact_mut(hd).enumerate() {
                let mut p: Vec<f32> = (0..n)
                    .map(|j| {
                        let dot = (0..hd)
                            .fold(0f32, |a, c| madd::<true>(q[i * hd + c], kt[c * ld + j], a));
                        dot * scale
                    })
                    .collect();
                let max = p.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                p.iter_mut().for_each(|s| *s = exp_with::<true>(*s - max));
                let inv = 1.0 / sum(&p);
                p.iter_mut()
                    .for_each(|s| *s = if *s * inv < NEGLIGIBLE { 0.0 } else { *s * inv });
                for j0 in (0..n).step_by(KEYS) {
                    for (c, o) in o.iter_mut().enumerate() {
                        let keys = j0..KEYS.min(n - j0) + j0;
                        *o += keys.fold(0f32, |a, j| madd::<true>(p[j], v[j * hd + c], a));
                    }
                }
            }
            for &isa in &isas {
                FORCED_ISA.set(Some(isa));
                let (mut scores, mut o) = (vec![0f32; rows * n], vec![0f32; rows * hd]);
                task(q, &kt, ld, v, &mut scores, &mut o, n, hd, scale);
                FORCED_ISA.set(None);
                for (k, (got, want)) in o.iter().zip(&want).enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa:?} n {n} hd {hd} value {k}"
                    );
                }
            }
        }
    }
}
