//! q4 weights against q8 activations (W4A8): the scalar reference, and the layout of the
//! activations that the SIMD versions read. Each group of `gs` weights is `gs / 2` packed bytes
//! and an f16 scale (`quant::quantize_q4`: byte `j` holds value `j` in its low nibble and value
//! `j + gs / 2` in its high one, each as `q + 8`), so a group's product is the integer sum
//! `sum_j (nibble_j - 8) * q_x[j]` times the two scales, as q8's is.
//!
//! ## The SIMD kernels' view: chunks of 64 bytes
//!
//! With groups of 32 (the default), 64 packed bytes hold four groups, 128 weights: a *chunk*.
//! One mask and one shift split a chunk's bytes into its low nibbles (the first 16 values of each
//! group) and its high nibbles (the last 16). Multiplying those by the activations needs the
//! activations in the same order, so [`ActsQ4Buf::lay_out`] rearranges each token's quantized
//! values once, per chunk; in the order [`Q4Layout::Halves`] (below: `Pairs` differs), the first
//! halves of the four groups, then their second halves:
//!
//! ```text
//! weights, 64 bytes:  [g0: v0|v16, v1|v17, .. v15|v31] [g1: ..] [g2: ..] [g3: ..]
//! low nibbles:        g0 v0..v15, g1 v0..v15, g2 v0..v15, g3 v0..v15
//! activations, 128:   g0 x0..x15, g1 x0..x15, g2 x0..x15, g3 x0..x15,    (for the low nibbles)
//!                     g0 x16..x31, g1 x16..x31, g2 x16..x31, g3 x16..x31 (for the high ones)
//! ```
//!
//! A byte dot product (`vpdpbusd`, `sdot`) adds four neighbouring products into each 32-bit
//! lane, so lane `l` (0..16) of a chunk sums 4 low and 4 high products of group `l / 4` (the
//! 512-bit kernel's lanes; NEON does a chunk in four quarters of 4, with the same lane
//! numbering). The nibbles are `q + 8`, so each lane's sum is
//! `8 * (its 8 activations)` too large: the layout holds that correction per lane, and a kernel
//! starts each lane's sum from it. A lane's integer sum is then exact; it is converted to f32
//! and multiplied by the activations' scale (also held per lane) and the weights' scale.
//!
//! That is [`Q4Layout::Halves`], which the NEON kernels read. The AVX2 kernel reads
//! [`Q4Layout::Pairs`]: a 256-bit vector holds half a chunk, and with `Halves` each half's 8 lanes
//! hold two groups (the first half groups 0 and 1, the second 2 and 3), so each half needs its own
//! conversion to f32 and its own multiplies by the scales. It regroups a chunk's weight bytes
//! into two vectors whose lane `l` holds the same group in both, with one `vpunpcklqdq` and one
//! `vpunpckhqdq` of the halves (64-bit pieces: `A` = bytes 0..8, 32..40, 16..24, 48..56 and `B`
//! = 8..16, 40..48, 24..32, 56..64, lanes of groups 0, 0, 2, 2, 1, 1, 3, 3 in both), and the
//! activations are laid out in that order: the two vectors' integer sums then add, and one
//! conversion and one scaling serve a whole chunk. A lane there sums 16 weights, so a chunk has
//! 8 lanes where `Halves` has 16.
//!
//! The AVX-512 kernels read [`Q4Layout::Interleaved`]: their weights are reordered when the model
//! is loaded so that a 512-bit vector's lane `l` holds group `l` of sixteen (`interleaved.rs`
//! describes that order and lays the activations out to match, one correction and one scale a
//! group).
//!
//! Other group sizes, and the columns after a row's last full chunk, take the reference.

use super::ActsQ8;

/// Weights per chunk: 64 packed bytes, four groups of 32.
pub const CHUNK: usize = 128;
/// The group size the SIMD kernels take.
pub const SIMD_GROUP: usize = 32;
/// 32-bit lanes per chunk in [`Q4Layout::Halves`]: one per 8 weights.
pub const LANES: usize = CHUNK / 8;

/// How a chunk's activations are ordered for a SIMD kernel (see the module's text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Q4Layout {
    /// The four groups' first halves, then their second halves; 16 lanes of 8 weights a chunk.
    #[default]
    Halves,
    /// For the AVX2 kernel: the activations of the two regrouped vectors `A`, `B` of a chunk's
    /// weight bytes, in each lane's order; 8 lanes of 16 weights a chunk.
    Pairs,
    /// For the AVX-512 kernels, whose weights are interleaved at load (`interleaved.rs`): each
    /// block of 16 groups in that order, one lane (correction, scale) per group.
    Interleaved,
}

/// Weight byte `k` of a chunk's 64 that vector `A` (`k < 32`) or `B` (`k >= 32`) of
/// [`Q4Layout::Pairs`] holds at position `k % 32`: 8-byte pieces 0, 4, 2, 6 of the chunk for
/// `A` (what `vpunpcklqdq` of its two 32-byte halves gives) and 1, 5, 3, 7 for `B`
/// (`vpunpckhqdq`).
pub const fn pairs_byte(k: usize) -> usize {
    const PIECES: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];
    8 * PIECES[k / 8] + k % 8
}

impl Q4Layout {
    /// Whether the kernels that read this layout read the weights interleaved
    /// (`interleaved.rs`; q4 and q6 in groups of 32, q8 in groups of 32 or 64) rather than in
    /// the file's order.
    pub const fn interleaves(self) -> bool {
        matches!(self, Q4Layout::Interleaved)
    }

    /// 32-bit lanes (entries of `corr` and `scales`) per chunk.
    pub const fn lanes(self) -> usize {
        match self {
            Q4Layout::Halves => LANES,
            Q4Layout::Pairs => LANES / 2,
            Q4Layout::Interleaved => CHUNK / SIMD_GROUP,
        }
    }

    /// The weight byte of a chunk's 64 that position `k` of the kernel's vectors holds: for
    /// Halves the bytes as they are, for Pairs vector A's, then B's ([`pairs_byte`]).
    pub const fn byte(self, k: usize) -> usize {
        match self {
            Q4Layout::Halves | Q4Layout::Interleaved => k,
            Q4Layout::Pairs => pairs_byte(k),
        }
    }

    /// The group (0..4) of a chunk whose activations lane `l` sums: the group of its first byte
    /// (every byte of a lane is in the same group: `lay_out` checks it). The kernels spread each
    /// group's weight scale to its lanes with this.
    pub const fn lane_group(self, l: usize) -> usize {
        self.byte(4 * l) / 16
    }

    /// Where the 32-byte vectors that a lane draws from start, among the 64 positions of
    /// [`Self::byte`]: lane `l` takes bytes `4l..4l + 4` of each (Halves: of the one vector it
    /// lies in, 16 lanes; Pairs: of both A and B, 8 lanes).
    pub const fn vectors(self) -> &'static [usize] {
        match self {
            Q4Layout::Halves | Q4Layout::Interleaved => &[0],
            Q4Layout::Pairs => &[0, 32],
        }
    }
}

/// The activations of `t` tokens in the q4 kernels' layout (see the module's text), which
/// AVX-512's q8 kernel on interleaved weights reads too (`interleaved.rs`). Empty when the group
/// size is not [`SIMD_GROUP`] (in [`Q4Layout::Interleaved`]: neither 32 nor 64); `chunks` is 0
/// (and the kernels take the reference) when a row is narrower than a chunk.
///
/// In [`Q4Layout::Interleaved`] the rows are laid out whole, sixteen groups a block
/// ([`super::interleaved::lay_out`]): `x` is `[t, cols]` and `corr` and `scales` are
/// `[t, cols / group_size]`, one entry a group.
#[derive(Clone, Copy, Default)]
pub struct ActsQ4<'a> {
    /// Full chunks per row (`cols / CHUNK`).
    pub chunks: usize,
    /// The order of each chunk's values (the kernel that reads them checks it).
    pub layout: Q4Layout,
    /// `[t, cols]`: each chunk's 128 values rearranged; values after the last chunk as they are
    /// (Interleaved: each block of groups rearranged, the last one short).
    pub x: &'a [i8],
    /// `[t, chunks * layout.lanes()]` (Interleaved: `[t, cols / group_size]`): `-8 * sum` of
    /// the activations each lane multiplies.
    pub corr: &'a [i32],
    /// `[t, chunks * layout.lanes()]` (Interleaved: `[t, cols / group_size]`): the activations'
    /// scale of each lane's group.
    pub scales: &'a [f32],
}

/// The buffers behind an [`ActsQ4`], reused from one product to the next.
#[derive(Default)]
pub struct ActsQ4Buf {
    x: Vec<i8>,
    corr: Vec<i32>,
    scales: Vec<f32>,
}

impl ActsQ4Buf {
    /// Lays out `q: [t, cols]` (scales `[t, cols / gs]`) for the q4 kernels, in `layout`.
    pub fn lay_out(
        &mut self,
        q: &[i8],
        scales: &[f32],
        t: usize,
        cols: usize,
        gs: usize,
        layout: Q4Layout,
    ) -> ActsQ4<'_> {
        // The interleaved order also serves q8 weights in groups of 64 (`interleaved.rs`).
        let lays_out = match layout {
            Q4Layout::Interleaved => super::interleaved::interleaves_q8(gs),
            _ => gs == SIMD_GROUP,
        };
        if !lays_out {
            return ActsQ4::default();
        }
        let (chunks, per) = (cols / CHUNK, cols / gs);
        self.x.clear();
        self.corr.clear();
        self.scales.clear();
        if layout == Q4Layout::Interleaved {
            // Each from a cache line's start (`acts::aligned`): the tiles load them a vector
            // at a time.
            let at = super::acts::aligned(&mut self.x, t * cols);
            let x = at..at + t * cols;
            let at = super::acts::aligned(&mut self.corr, t * per);
            let corr = at..at + t * per;
            for ((q, x), corr) in q
                .chunks_exact(cols)
                .zip(self.x[x.clone()].chunks_exact_mut(cols))
                .zip(self.corr[corr.clone()].chunks_exact_mut(per))
            {
                super::interleaved::lay_out(q, gs, x, corr);
            }
            let at = super::acts::aligned(&mut self.scales, t * per);
            let s = at..at + t * per;
            self.scales[s.clone()].copy_from_slice(&scales[..t * per]);
            return ActsQ4 {
                chunks,
                layout,
                x: &self.x[x],
                corr: &self.corr[corr],
                scales: &self.scales[s],
            };
        }
        let half = gs / 2;
        let order: [usize; CHUNK / 2] = std::array::from_fn(|k| layout.byte(k));
        for i in 0..t {
            let (row, s_row) = (
                &q[i * cols..(i + 1) * cols],
                &scales[i * per..(i + 1) * per],
            );
            for c in 0..chunks {
                let chunk = &row[c * CHUNK..(c + 1) * CHUNK];
                let start = self.x.len();
                // Weight byte b (group b / 16, its values b % 16 and b % 16 + 16) meets the
                // activations `lo(b)` (low nibble) and `lo(b) + 16` (high). Both layouts move
                // bytes in runs of 8 consecutive ones (`pairs_byte`), so each run of 8 positions
                // is 8 consecutive activations.
                let lo = |b: usize| (b / 16) * gs + b % 16;
                for part in [0, half] {
                    for run in order.chunks_exact(8) {
                        debug_assert!((0..8).all(|k| run[k] == run[0] + k) && run[0] % 8 == 0);
                        let from = lo(run[0]) + part;
                        self.x.extend_from_slice(&chunk[from..from + 8]);
                    }
                }
                let (x_lo, x_hi) = self.x[start..].split_at(CHUNK / 2);
                for l in 0..layout.lanes() {
                    let bytes = || {
                        layout
                            .vectors()
                            .iter()
                            .flat_map(move |&v| v + 4 * l..v + 4 * l + 4)
                    };
                    let sum: i32 = bytes().map(|k| x_lo[k] as i32 + x_hi[k] as i32).sum();
                    self.corr.push(-8 * sum);
                    let group = layout.lane_group(l);
                    debug_assert!(bytes().all(|k| order[k] / 16 == group));
                    self.scales.push(s_row[c * (CHUNK / gs) + group]);
                }
            }
            self.x.extend_from_slice(&row[chunks * CHUNK..]);
        }
        ActsQ4 {
            chunks,
            layout,
            x: &self.x,
            corr: &self.corr,
            scales: &self.scales,
        }
    }
}

/// `sum_g ws[g] * xs[g] * sum_{j in g} q_w[j] * q_x[j]` over one row: `w` its packed bytes
/// (`cols / 2`), `ws` its f16 scales, `x`/`xs` one activation row quantized per group of `gs`.
pub fn dot_q4_scalar(w: &[u8], ws: &[u16], x: &[i8], xs: &[f32], gs: usize) -> f32 {
    let half = gs / 2;
    let mut sum = 0.0f32;
    for (g, (wg, xg)) in w.chunks_exact(half).zip(x.chunks_exact(gs)).enumerate() {
        let mut isum = 0i32;
        for (j, &b) in wg.iter().enumerate() {
            isum += ((b & 15) as i32 - 8) * xg[j] as i32;
            isum += ((b >> 4) as i32 - 8) * xg[j + half] as i32;
        }
        sum += isum as f32 * (half::f16::from_bits(ws[g]).to_f32() * xs[g]);
    }
    sum
}

/// Checks the slices of a q4 product (`w: [rows, cols / 2]`, `ws: [rows, cols / gs]`, `out:
/// [rows, t]`) and, when the activations are laid out for the SIMD kernels, that the layout is
/// for groups of 32 and this width; returns `rows`. Panics on a mismatch (a caller's bug, not
/// bad input). The SIMD kernels' reads are in bounds because of what this checks.
pub(crate) fn check(w: &[u8], ws: &[u16], x: &ActsQ8, out: &[f32]) -> usize {
    check_packed(w, ws, x, out, x.cols / 2)
}

/// [`check`] for weights of `row_bytes` a row (q4: `cols / 2`, q6: `3 * cols / 4`).
pub(crate) fn check_packed(
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &[f32],
    row_bytes: usize,
) -> usize {
    let (cols, gs, t) = (x.cols, x.group_size, x.t);
    let rows = out.len() / t.max(1);
    assert!(
        out.len() == rows * t && w.len() == rows * row_bytes && ws.len() * gs == rows * cols,
        "q4/q6: slice lengths do not match [{rows}, {cols}] x [{t}, {cols}]"
    );
    if x.q4.layout == Q4Layout::Interleaved {
        let per = cols / gs;
        // (Groups of 64 laid out are q8's; q4 and q6 then take the reference, which reads the
        // values as they are.)
        assert!(
            x.q4.x.is_empty()
                || gs != SIMD_GROUP
                || (x.q4.x.len() == t * cols
                    && x.q4.corr.len() == t * per
                    && x.q4.scales.len() == t * per),
            "q4/q6: activations not laid out for [{t}, {cols}]"
        );
        return rows;
    }
    let lanes = x.q4.chunks * x.q4.layout.lanes();
    assert!(
        x.q4.chunks == 0
            || (gs == SIMD_GROUP
                && x.q4.chunks == cols / CHUNK
                && x.q4.x.len() == t * cols
                && x.q4.corr.len() == t * lanes
                && x.q4.scales.len() == t * lanes),
        "q4/q6: activations not laid out for [{t}, {cols}]"
    );
    rows
}

/// The reference product of the groups after a row's last full chunk, which the SIMD kernels
/// leave to it: `w_r`, `ws_r` one weight row, `x_r`, `xs_r` one token (either layout: the tail
/// is not rearranged).
pub(crate) fn tail(w_r: &[u8], ws_r: &[u16], x_r: &[i8], xs_r: &[f32], chunks: usize) -> f32 {
    let g = chunks * (CHUNK / SIMD_GROUP);
    if g == ws_r.len() {
        return 0.0;
    }
    let (b, c) = (chunks * CHUNK / 2, chunks * CHUNK);
    dot_q4_scalar(&w_r[b..], &ws_r[g..], &x_r[c..], &xs_r[g..], SIMD_GROUP)
}

/// `out[r, i]` (`[rows, t]`) = row `r` of the packed weights against activation row `i`, one
/// [`dot_q4_scalar`] per pair. `_ahead` is the prefetch hint the SIMD kernels take.
pub fn mat_q4_scalar(w: &[u8], ws: &[u16], x: &ActsQ8, out: &mut [f32], _ahead: usize) {
    check(w, ws, x, out);
    rows_with(dot_q4_scalar, w, ws, x, out, x.cols / 2);
}

/// One packed weight row (its bytes and f16 scales) against one activation row quantized per
/// group: [`dot_q4_scalar`], `q6::dot_q6_scalar`.
pub(crate) type DotPacked = fn(&[u8], &[u16], &[i8], &[f32], usize) -> f32;

/// The reference kernels' loop: `out[r, i]` = `dot` of weight row `r` (`row_bytes` packed bytes
/// and its f16 scales) with activation row `i`.
pub(crate) fn rows_with(
    dot: DotPacked,
    w: &[u8],
    ws: &[u16],
    x: &ActsQ8,
    out: &mut [f32],
    row_bytes: usize,
) {
    let (gs, t) = (x.group_size, x.t);
    if t == 0 {
        return;
    }
    let per = x.cols / gs;
    for (r, out_r) in out.chunks_exact_mut(t).enumerate() {
        let (w_r, ws_r) = (
            &w[r * row_bytes..(r + 1) * row_bytes],
            &ws[r * per..(r + 1) * per],
        );
        for (i, o) in out_r.iter_mut().enumerate() {
            *o = dot(w_r, ws_r, x.q_row(i), x.scales_row(i), gs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::ActsQ8Buf;
    use crate::quant::{dequantize_q4, quantize_q4};
    use crate::testing::next_values;

    /// The integer product equals the f64 product of the dequantized weights and activations.
    #[test]
    fn matches_the_dequantized_product() {
        let mut seed = 5;
        for gs in [32, 64, 128] {
            let (rows, cols, t) = (3, gs * 4, 2);
            let w = next_values(rows * cols, &mut seed);
            let x = next_values(t * cols, &mut seed);
            let mut packed = vec![0u8; rows * cols / 2];
            let mut scales = vec![0u16; rows * cols / gs];
            quantize_q4(&w, gs, &mut packed, &mut scales);
            let mut wd = vec![0f32; rows * cols];
            dequantize_q4(&packed, &scales, gs, &mut wd);
            let mut buf = ActsQ8Buf::default();
            let acts = buf.quantize_for_q4(&x, t, cols, gs);
            let mut out = vec![0f32; rows * t];
            mat_q4_scalar(&packed, &scales, &acts, &mut out, 0);
            for r in 0..rows {
                for i in 0..t {
                    let xq: Vec<f64> = (0..cols)
                        .map(|c| acts.q_row(i)[c] as f64 * acts.scales_row(i)[c / gs] as f64)
                        .collect();
                    let want: f64 = (0..cols).map(|c| wd[r * cols + c] as f64 * xq[c]).sum();
                    let got = out[r * t + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{gs} {r} {i}: {got} {want}"
                    );
                }
            }
        }
    }
}
