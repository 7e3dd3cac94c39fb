//! The AVX-512 kernels' interleaved order, as the kernels use it: the order itself (how q4, q6
//! and q8 rows are laid out, sixteen groups side by side) is `quant::interleaved`'s; here are the
//! copy of a file's matrices in that order made at load ([`interleave_file`]), a row read back
//! from it ([`interleaved_row`]), the activations laid out to meet it ([`lay_out`]), and the
//! weights of tests and benchmarks put in it.

use super::dots;
use super::k_interleaved::KOrder;
use super::q4::Q4Layout;
use crate::format::config::TOWER_PREFIX;
use crate::format::reader::Derived;
use crate::format::view::{OwnedTensorData, TensorData};
use crate::format::{DType, KQuant, ModelFile};
use crate::pages::HugePages;
use crate::quant::interleaved::file_group;
pub use crate::quant::interleaved::{
    blocks, interleave_q4, interleave_q6, interleave_q8, interleave_words, interleaves,
    interleaves_q8, put_q4_block, put_q6_block, GROUPS,
};
use crate::quant::{Q4, Q8};
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::collections::HashMap;

/// Row `r` (`out.len()` values) of a q8 or q4 matrix in the interleaved order, as f32: each
/// group's bytes put back in the file's order, then read as the file's are (`Q8::row`,
/// `Q4::row`). For an embedding table that is also the classifier and lies in this order alone
/// (a GGUF opened for the CPU's kernels, `format::Reader::Interleaved`): its rows are looked up
/// one token at a time, a copy in the file's order would be the table's size again.
pub fn interleaved_row(data: &TensorData, r: usize, out: &mut [f32]) {
    let cols = out.len();
    let gs = data.group_size().expect("a quantized matrix");
    // Group g's scale, and a buffer for one group's bytes in the file's order: at most 64 (q8
    // in groups of 64).
    let scale = |g: usize| r * cols / gs + g..r * cols / gs + g + 1;
    let mut group = [0u8; 64];
    match data.dtype() {
        DType::Q8 => {
            let Q8 { q, scales, .. } = data.q8();
            let row: &[u8] = bytemuck::cast_slice(&q[r * cols..(r + 1) * cols]);
            let group = &mut group[..gs];
            for (g, out) in out.chunks_exact_mut(gs).enumerate() {
                file_group(row, gs, g, group);
                // Stored plus 128 (`q ^ 0x80`, the module's text).
                group.iter_mut().for_each(|b| *b ^= 0x80);
                let (q, scales) = (bytemuck::cast_slice(group), &scales[scale(g)]);
                Q8 {
                    q,
                    scales,
                    group_size: gs,
                }
                .row(0, out);
            }
        }
        DType::Q4 => {
            let Q4 { packed, scales, .. } = data.q4();
            let row = &packed[r * cols / 2..(r + 1) * cols / 2];
            // A group of 32 q4 values is 16 bytes, interleaved as q8's words are.
            let group = &mut group[..gs / 2];
            for (g, out) in out.chunks_exact_mut(gs).enumerate() {
                file_group(row, gs / 2, g, group);
                let scales = &scales[scale(g)];
                Q4 {
                    packed: group,
                    scales,
                    group_size: gs,
                }
                .row(0, out);
            }
        }
        d => panic!("{d} has no interleaved rows to read"),
    }
}

/// Which order a matrix of [`interleave_file`] takes.
#[derive(Clone, Copy)]
enum Order {
    Q4,
    Q6,
    /// q8 in groups of this many.
    Q8(usize),
    /// GGUF's Q4_K or Q6_K (`k_interleaved.rs`), in a family's order.
    K(KOrder, KQuant),
}

/// Which dtypes' matrices a CPU's kernels read in an order of their own; each `false` keeps the
/// file's order for that dtype. One value for the text model's copy ([`interleave_file`]) and
/// the vision tower's ([`for_kernels`]).
#[derive(Clone, Copy, Debug)]
pub struct Reorders {
    /// q4 and q6 in groups of 32 (`Q4Layout::interleaves`).
    pub q4: bool,
    /// q8 in groups of 32 or 64 (`Dots::q8_interleaved`).
    pub q8: bool,
    /// GGUF's K-quants, in the order named (`Dots::k_interleaved`, `k_interleaved.rs`).
    pub k: Option<KOrder>,
}

impl Reorders {
    /// Every dtype that has an order of its own (tests: the copy's contents, whatever the CPU),
    /// the K-quants in this CPU's order where it has one (a copy in another family's order
    /// would be read wrong by this CPU's kernels).
    pub fn all() -> Reorders {
        let k = dots()
            .k_interleaved
            .map_or(KOrder::Groups, |(order, _)| order);
        Reorders {
            q4: true,
            q8: true,
            k: Some(k),
        }
    }

    /// What this CPU's kernels ([`dots`]) read reordered: AVX-512's all three; AVX2's and
    /// AVX-VNNI's Q4_K and Q6_K (eight rows side by side); NEON's none.
    pub fn of_this_cpu() -> Reorders {
        let d = dots();
        Reorders {
            q4: d.q4_layout.interleaves(),
            q8: d.q8_interleaved.is_some(),
            k: d.k_interleaved.map(|(order, _)| order),
        }
    }

    /// Whether any dtype is reordered (else no copy is made at all).
    pub fn any(self) -> bool {
        self.q4 || self.q8 || self.k.is_some()
    }
}

/// Every q4 and q6 matrix of `file` in groups of 32 where `reorders.q4`, every q8 one in groups
/// of 32 or 64 where `reorders.q8`, every Q4_K and Q6_K one in `reorders.k`'s order (where that
/// order's rows divide each of its matrices' rows, `KOrder::rows`), interleaved, in one
/// buffer of huge pages (each at a multiple of 64 bytes, laid out as in the file: its values, then its
/// scales), for [`ModelFile::derived`]. The rows are reordered in parallel; the file's bytes are
/// read once.
///
/// The embedding table is left out unless it is also the classifier (tied, in a model that
/// generates): otherwise only its rows are looked up, in the file's order, and a copy would be
/// memory for nothing (Qwen3-8B's untied q8 table: 622 MB). So is the vision tower.
pub fn interleave_file(file: &ModelFile, reorders: Reorders) -> Result<Derived> {
    let embedding_is_classifier = file.config().classifier_is_embedding();
    let mut jobs = Vec::new();
    let (mut at, mut len) = (HashMap::new(), 0usize);
    for info in &file.header().tensors {
        if info.name == "model.embed_tokens.weight" && !embedding_is_classifier {
            continue;
        }
        // Nor the vision tower's matrices: the text model never reads them, and the tower
        // makes its own copy when it is built (`vision/tower/matrix.rs`; a server's at its first
        // image).
        if info.name.starts_with(TOWER_PREFIX) {
            continue;
        }
        let t = file.tensor(&info.name)?;
        if t.interleaved.is_some() {
            // Laid out in this order at open (a GGUF's matrix, `format::Reader::Interleaved`).
            continue;
        }
        // A GGUF's Q8_0 repacked at open for any reader (`Reader::Any`) is read in the file's
        // order rather than copied a second time.
        let reorders = Reorders {
            q8: reorders.q8 && !file.is_repacked(&info.name),
            ..reorders
        };
        // The values' bytes (the tensor's first ones) and their order.
        let cols = *t.shape.last().context("a matrix without a shape")? as usize;
        // The rows of each matrix (of a stacked tensor's: each expert's).
        let rows = t.shape.iter().rev().nth(1).map_or(1, |&r| r as usize);
        let Some((values, order)) = order_of(&t.data, rows, reorders) else {
            continue;
        };
        // The tensor as the file lays it out (values, then its scales), the values reordered.
        let start = len.next_multiple_of(64);
        len = start + info.nbytes as usize;
        at.insert(info.name.clone(), start..len);
        let whole = file.tensor_bytes(&info.name)?;
        jobs.push((&whole[..values], whole, cols, order, start));
    }
    let mut bytes = HugePages::<u8>::zeroed(len).with_context(|| {
        format!(
            "cannot allocate {:.1} MiB for the quantized weights in the kernels' own order",
            len as f64 / 1048576.0
        )
    })?;
    // Each matrix's own part of the buffer, then the parts filled in parallel, a few rows a task.
    let mut rest: &mut [u8] = &mut bytes;
    let mut done = 0;
    let mut parts = Vec::with_capacity(jobs.len());
    for (packed, whole, cols, order, start) in jobs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - done);
        let (dst, tail) = tail.split_at_mut(whole.len());
        (rest, done) = (tail, start + whole.len());
        // The scales (and the padding before them) as they are.
        let (dst, scales) = dst.split_at_mut(packed.len());
        scales.copy_from_slice(&whole[packed.len()..]);
        parts.push((packed, cols, order, dst));
    }
    parts
        .into_par_iter()
        .for_each(|(packed, cols, order, dst)| reorder(order, packed, cols, dst));
    Ok(Derived::new(bytes, at))
}

/// The order `data`'s values take for the kernels, and how many bytes they are (a tensor's
/// first ones, before its scales); `None` where its dtype and group size keep the file's order
/// or `reorders` keeps it, or the order lays out more rows together than each of its matrices'
/// `rows` are a multiple of.
fn order_of(data: &TensorData, rows: usize, reorders: Reorders) -> Option<(usize, Order)> {
    let Reorders { q4, q8, k } = reorders;
    Some(match (data.dtype(), data.group_size()) {
        (DType::Q4, Some(gs)) if q4 && interleaves(gs) => (data.q4().packed.len(), Order::Q4),
        (DType::Q6, Some(gs)) if q4 && interleaves(gs) => (data.q6().packed.len(), Order::Q6),
        (DType::Q8, Some(gs)) if q8 && interleaves_q8(gs) => (data.q8().q.len(), Order::Q8(gs)),
        (DType::K(kind), _)
            if k.is_some_and(|o| o.takes(kind) && rows.is_multiple_of(o.rows())) =>
        {
            (data.k_quant().1.len(), Order::K(k?, kind))
        }
        _ => return None,
    })
}

/// `src`, a matrix's values (rows of `cols` weights) in the file's order, into `dst` in
/// `order`, a few rows a task on rayon's threads.
fn reorder(order: Order, src: &[u8], cols: usize, dst: &mut [u8]) {
    let row_bytes = match order {
        Order::Q4 => cols / 2,
        Order::Q6 => cols / 4 * 3,
        Order::Q8(_) => cols,
        Order::K(_, kind) => kind.row_bytes(cols),
    };
    // Whole sets of the rows an order lays out together.
    let together = match order {
        Order::K(o, _) => o.rows(),
        _ => 1,
    };
    let piece = row_bytes * (65536 / row_bytes).max(1).next_multiple_of(together);
    dst.par_chunks_mut(piece)
        .zip(src.par_chunks(piece))
        .for_each(|(d, s)| match order {
            Order::Q4 => interleave_q4(s, cols, d),
            Order::Q6 => interleave_q6(s, cols, d),
            Order::Q8(gs) => interleave_q8(s, cols, gs, d),
            Order::K(o, kind) => super::k_interleaved::interleave_k(o, kind, s, cols, d),
        });
}

/// A copy of `data` (a matrix of rows of `cols` weights, in the file's order) in the order this
/// CPU's kernels read, where they read one of their own (AVX-512's: q4 and q6, q8, Q4_K and
/// Q6_K; AVX2's: Q4_K and Q6_K); `None` where they read the file's. For a matrix that outlives
/// the file (the vision tower's), as [`interleave_file`] does for the text model's.
pub fn for_kernels(data: &TensorData, cols: usize) -> Option<OwnedTensorData> {
    // A 2-D matrix (the tower's): its rows, which only the K-quants' orders ask.
    let rows = match data.dtype() {
        DType::K(kind) => data.k_quant().1.len() / kind.row_bytes(cols).max(1),
        _ => 1,
    };
    let (_, order) = order_of(data, rows, Reorders::of_this_cpu())?;
    // The scales copied as they are; the values written over in the kernels' order.
    let mut copy = data.to_owned_data();
    reorder(order, data.value_bytes(), cols, copy.values_mut());
    Some(copy)
}

/// `packed` (q4 rows of `cols` weights, or q6 ones with `six`, in groups of `gs`, in the file's
/// order) in the order the kernels that read `layout` take: interleaved for groups of 32 when
/// `layout` says so, as it is otherwise. For tests and benchmarks, which make their weights in
/// the file's order.
pub fn packed_for_kernels(
    layout: Q4Layout,
    six: bool,
    packed: &[u8],
    cols: usize,
    gs: usize,
) -> Vec<u8> {
    if !(layout.interleaves() && interleaves(gs)) {
        return packed.to_vec();
    }
    let mut out = vec![0u8; packed.len()];
    match six {
        true => interleave_q6(packed, cols, &mut out),
        false => interleave_q4(packed, cols, &mut out),
    }
    out
}

/// q8 rows (`[rows, cols]`, groups of `gs`) as the kernels of `d` read them:
/// interleaved where `d` has [`super::Dots::q8_interleaved`] and the group size interleaves, as
/// they are otherwise. For tests and benchmarks, which make their weights in the file's order.
pub fn q8_for_kernels(d: &super::Dots, q: &[i8], cols: usize, gs: usize) -> Vec<i8> {
    if !(d.q8_interleaved.is_some() && interleaves_q8(gs)) {
        return q.to_vec();
    }
    let mut out = vec![0u8; q.len()];
    interleave_q8(bytemuck::cast_slice(q), cols, gs, &mut out);
    bytemuck::cast_slice(&out).to_vec()
}

/// One token's quantized activations `q` (a row, groups of `gs`: 32, or 64 for q8) in the order
/// the interleaved kernels read, into `x` (as long), and each group's correction `-8 * sum(q)` into
/// `corr` (one per group): q4 weights are stored as `q + 8`, so each lane's byte products are
/// `8 * sum(q)` too large (q6's `q + 32` and q8's `q + 128` take the correction 4 and 16 times,
/// in the kernel).
///
/// Block by block, as the weights: for vector `m` (`gs / 4` of them), for group `l`, the four
/// values `4m .. 4m + 4` of group `l`: in groups of 32, vectors 0-3 are the activations the low
/// nibbles of q4's four words meet and vectors 4-7 those the high ones meet; vector `m` is what
/// q8's word `m` meets.
pub fn lay_out(q: &[i8], gs: usize, x: &mut [i8], corr: &mut [i32]) {
    assert!(x.len() == q.len() && corr.len() == q.len() / gs);
    interleave_words(bytemuck::cast_slice(q), gs, bytemuck::cast_slice_mut(x));
    for (c, group) in corr.iter_mut().zip(q.chunks_exact(gs)) {
        *c = -8 * group.iter().map(|&v| v as i32).sum::<i32>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_q4;
    use crate::testing::next_values;

    /// The activations meet the weights of the same column: position `p` of the laid-out row
    /// holds the activation that weight byte `p % (4n)` of its vector multiplies (for groups
    /// of 32, vectors 0-3 meet q4's low nibbles, values `4k ..`, and 4-7 its high ones, values
    /// `16 + 4k ..`).
    #[test]
    fn activations_meet_their_weights() {
        for (gs, groups) in [(32, 1), (32, 16), (32, 21), (64, 1), (64, 16), (64, 19)] {
            let cols = gs * groups;
            let q: Vec<i8> = (0..cols).map(|c| (c % 251) as i8).collect();
            let (mut x, mut corr) = (vec![0i8; cols], vec![0i32; groups]);
            lay_out(&q, gs, &mut x, &mut corr);
            for (g0, n) in blocks(groups) {
                for m in 0..gs / 4 {
                    for l in 0..n {
                        for b in 0..4 {
                            let at = g0 * gs + m * 4 * n + 4 * l + b;
                            let col = (g0 + l) * gs + 4 * m + b;
                            assert_eq!(x[at], q[col], "{gs}: {groups} groups, position {at}");
                        }
                    }
                }
            }
            for (g, &c) in corr.iter().enumerate() {
                let sum: i32 = q[g * gs..(g + 1) * gs].iter().map(|&v| v as i32).sum();
                assert_eq!(c, -8 * sum);
            }
        }
    }

    /// A row of a q8 or q4 matrix in the interleaved order reads back, value for value, as the
    /// file's row does: rows of whole blocks and a short one, every row of three.
    #[test]
    fn interleaved_rows_read_back_as_the_files() {
        let mut seed = 11;
        for (gs, groups) in [
            (32, 1),
            (32, 16),
            (32, 20),
            (32, 35),
            (64, 3),
            (64, 16),
            (64, 19),
        ] {
            let (rows, cols) = (3, gs * groups);
            let w = next_values(rows * cols, &mut seed);
            // Every row read back from the interleaved order against the file's.
            let check = |file: TensorData, interleaved: TensorData, what: &str| {
                let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    file.row(r, &mut want);
                    interleaved_row(&interleaved, r, &mut got);
                    assert_eq!(got, want, "{what}: {groups} groups, row {r}");
                }
            };
            // q8
            let (mut q, mut scales) = (vec![0i8; rows * cols], vec![0f32; rows * groups]);
            crate::quant::quantize_q8(&w, gs, &mut q, &mut scales);
            let mut out = vec![0u8; q.len()];
            interleave_q8(bytemuck::cast_slice(&q), cols, gs, &mut out);
            let (group_size, scales) = (gs, &scales);
            let file = TensorData::from(Q8 {
                q: &q,
                scales,
                group_size,
            });
            let q = bytemuck::cast_slice(&out);
            let what = format!("q8 in groups of {gs}");
            check(
                file,
                TensorData::from(Q8 {
                    q,
                    scales,
                    group_size,
                }),
                &what,
            );
            // q4, in groups of 32 only
            if gs != 32 {
                continue;
            }
            let (mut p, mut scales) = (vec![0u8; rows * cols / 2], vec![0u16; rows * groups]);
            quantize_q4(&w, gs, &mut p, &mut scales);
            let mut out = vec![0u8; p.len()];
            interleave_q4(&p, cols, &mut out);
            let scales = &scales;
            let file = TensorData::from(Q4 {
                packed: &p,
                scales,
                group_size,
            });
            check(
                file,
                TensorData::from(Q4 {
                    packed: &out,
                    scales,
                    group_size,
                }),
                "q4",
            );
        }
    }

    /// The embedding table is copied into the kernels' order only when it is also the classifier
    /// (tied): an untied table is only ever read a row at a time, in the file's order, and a copy
    /// of it would be memory for nothing. The matrices around it are copied either way.
    #[test]
    fn only_a_tied_embedding_is_interleaved() {
        for tied in [true, false] {
            let dir = std::env::temp_dir().join(format!("pq-interleaved-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("q8-tied-{tied}.bin"));
            let mut c = crate::testing::model::config(crate::format::DType::Q8);
            (c.group_size, c.hidden_size, c.intermediate_size) = (32, 64, 64);
            c.tie_word_embeddings = tied;
            crate::testing::model::write_random_config(&path, &c);
            let file = ModelFile::open(&path).unwrap();
            let derived = interleave_file(&file, Reorders::all()).unwrap();
            let has = |name: &str| derived.get(name).is_some();
            assert_eq!(has("model.embed_tokens.weight"), tied, "tied: {tied}");
            assert_eq!(has("lm_head.weight"), !tied, "tied: {tied}");
            assert!(has("model.layers.0.mlp.down_proj.weight"), "tied: {tied}");
            drop(file);
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}
