//! The register tile of the small f32 matrix products (the vision tower's attention, the chunked
//! delta rule): R rows of `a` against the rows of `b`,
//!
//! ```text
//! acc[r][l] = sum_t a_r[t] * b[t * stride + l]      r < R, l < L, t < k (each a_r k values long)
//! ```
//!
//! Each step loads one row of `b` (L values) once for all R rows and broadcasts one value of
//! each row of `a`: R x L multiply-adds for L / lanes loads and R broadcasts. The sums of a lane
//! are added in the order of `t`, one multiply-add at a time ([`madd`]), whatever R and L are, so
//! the tile's shape never changes a bit of the result.
//!
//! Why six rows: each multiply-add waits on the one before it into the same sum (four cycles on
//! Zen 4), and a core starts two a cycle, so about eight sums must be in flight to keep it busy,
//! and the loads of `b` and the broadcasts must not outnumber the multiply-adds. AVX2 has 16
//! vector registers: 6 rows of 16 columns (12 registers of sums, 2 of `b`, 1 broadcast) is the
//! tile of the BLIS and OpenBLAS kernels for Haswell (4 rows are 8 sums, with 6 loads and
//! broadcasts for 8 multiply-adds). AVX-512, with 32 registers of 16 values, takes 6 rows of 32
//! columns.
//!
//! The sums are named variables, an array of L a row, written out by a macro for each R: kept as
//! one `[[f32; L]; R]` array the compiler left them on the stack, each multiply-add a store and a
//! load (measured 4 times slower in the tower's attention and 9 times in the delta rule's
//! products).

use super::madd;

/// The rows of a tile: six, for every instruction set (AVX-512's 32 registers would hold 8). Each
/// shape of tile is compiled into every version of its callers, so another shape would grow
/// every binary (and the GPU kit, which carries them, has a size limit). SSE2's 16 registers of
/// 4 values hold fewer than the 24 a tile of 16 columns needs: the baseline x86 version spills.
pub(crate) const ROWS: usize = 6;

/// Defines `$name<L, F>(a, b, stride) -> [[f32; L]; R]` for the R rows named `$a` (sums `$s`):
/// a macro, so that another R is one line.
macro_rules! tile {
    ($(#[$attr:meta])* $name:ident, $r:literal: $($a:ident $s:ident),+) => {
        $(#[$attr])*
        #[inline(always)]
        pub(crate) fn $name<const L: usize, const F: bool>(
            a: [&[f32]; $r],
            b: &[f32],
            stride: usize,
        ) -> [[f32; L]; $r] {
            let k = a[0].len();
            // Every row of `a` cut to the first one's length: `t < k` then needs no check.
            let [$($a),+] = a.map(|row| &row[..k]);
            assert!(k == 0 || b.len() >= (k - 1) * stride + L, "b has fewer than k rows");
            $(let mut $s = [0f32; L];)+
            // Row t of b starts `stride` values after row t - 1's.
            for (t, brow) in b.chunks(stride).take(k).enumerate() {
                let brow: &[f32; L] = brow[..L].try_into().unwrap();
                $(
                    let x = $a[t];
                    for l in 0..L {
                        $s[l] = madd::<F>(x, brow[l], $s[l]);
                    }
                )+
            }
            [$($s),+]
        }
    };
}

tile!(
    /// Six rows: 12 registers of sums at 16 columns with AVX2, 12 at 32 with AVX-512.
    tile6, 6: a0 s0, a1 s1, a2 s2, a3 s3, a4 s4, a5 s5
);

/// `put(r, sums of row r)` for the rows `a` (at most [`ROWS`]) against `b` (`acc` above), in one
/// tile. Fewer rows (the ragged rest of a product) take a whole tile too, the missing rows filled
/// with the first one and their sums dropped: six rows' work at a tile's speed, where a row at a
/// time waits on each multiply-add before the next (a row of 16 columns is one or two chains of
/// sums). The chunked delta rule's products of 64 rows end in 4.
#[inline(always)]
pub(crate) fn tile<const L: usize, const F: bool>(
    a: &[&[f32]],
    b: &[f32],
    stride: usize,
    mut put: impl FnMut(usize, &[f32; L]),
) {
    assert!(a.len() <= ROWS, "a tile is at most {ROWS} rows");
    let Some(&first) = a.first() else { return };
    let rows: [&[f32]; ROWS] = std::array::from_fn(|r| a.get(r).copied().unwrap_or(first));
    let sums = tile6::<L, F>(rows, b, stride);
    for (r, s) in sums.iter().enumerate().take(a.len()) {
        put(r, s);
    }
}

/// [`tile`] for a block of fewer than L columns (the ragged edge of a product): the `rows` rows of
/// `a`, `k` values each, `a_stride` apart, against the first `width` columns of `b`'s rows;
/// `put(r, sums)` with those columns' sums, each in the same order as a tile's. Plain loops, the
/// sums in an array. Inlined beside a caller's tile, it hands the sums out by iterating over the
/// array: written as `put(r, &acc[r][..width])` for each `r`, it cost the tile its registers (the
/// compiler spilled the tile's sums too; the tower's attention ran a third slower with AVX2).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ragged<const L: usize, const F: bool>(
    (a, a_stride, rows): (&[f32], usize, usize),
    k: usize,
    b: &[f32],
    stride: usize,
    width: usize,
    mut put: impl FnMut(usize, &[f32]),
) {
    assert!(
        rows <= ROWS && width <= L,
        "a tile is at most {ROWS} rows by {L} columns"
    );
    assert!(
        k == 0 || b.len() >= (k - 1) * stride + width,
        "b has fewer than k rows"
    );
    let mut acc = [[0f32; L]; ROWS];
    for t in 0..k {
        let brow = &b[t * stride..][..width];
        for (r, s) in acc.iter_mut().enumerate().take(rows) {
            let x = a[r * a_stride + t];
            for (s, &y) in s.iter_mut().zip(brow) {
                *s = madd::<F>(x, y, *s);
            }
        }
    }
    for (r, s) in acc.iter().enumerate().take(rows) {
        put(r, &s[..width]);
    }
}

/// The rows of a product taken [`ROWS`] at a time, then the ragged rest: each block's first row
/// and length.
pub(crate) fn row_blocks(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows)
        .step_by(ROWS)
        .map(move |i| (i, ROWS.min(rows - i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile, its ragged rows and a ragged block of columns against the sums written out,
    /// bit for bit (the same multiply-adds in the same order), at a stride wider than the tile.
    #[test]
    fn tiles_equal_their_sums() {
        let (k, stride) = (13, 37);
        let val = |i: usize| ((i * 7919 % 211) as f32 - 105.0) / 17.0;
        let a: Vec<Vec<f32>> = (0..ROWS)
            .map(|r| (0..k).map(|t| val(r * 100 + t)).collect())
            .collect();
        let b: Vec<f32> = (0..k * stride).map(|i| val(i + 5000)).collect();
        let want = |r: usize, l: usize| {
            (0..k).fold(0f32, |s, t| madd::<true>(a[r][t], b[t * stride + l], s))
        };
        let rows: Vec<&[f32]> = a.iter().map(|r| &r[..]).collect();
        let flat = a.concat();
        for n in 1..=ROWS {
            for width in [32, 31, 17, 1] {
                let mut seen = 0;
                let mut check = |r: usize, sums: &[f32]| {
                    assert_eq!(sums.len(), width);
                    for (l, x) in sums.iter().enumerate() {
                        assert_eq!(x.to_bits(), want(r, l).to_bits(), "{n} rows: {r} {l}");
                    }
                    seen += 1;
                };
                match width {
                    32 => tile::<32, true>(&rows[..n], &b, stride, |r, s| check(r, s)),
                    _ => ragged::<32, true>((&flat, k, n), k, &b, stride, width, &mut check),
                }
                assert_eq!(seen, n, "{n} rows, {width} columns");
            }
        }
    }

    #[test]
    fn row_blocks_cover_the_rows_once() {
        let blocks = |rows| row_blocks(rows).collect::<Vec<_>>();
        assert_eq!(blocks(16), [(0, 6), (6, 6), (12, 4)]);
        assert_eq!(blocks(12), [(0, 6), (6, 6)]);
        assert_eq!(blocks(3), [(0, 3)]);
        assert_eq!(blocks(0), []);
    }
}
