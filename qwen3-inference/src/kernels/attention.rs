//! Causal grouped-query attention over the KV cache, as HF's `eager_attention_forward` computes it:
//! `softmax(q k^T * head_dim^-0.5 + causal_mask) v`, softmax in f32.
//!
//! Grouped-query attention (Ainslie et al. 2023): `n_heads` query heads share `n_kv_heads` key and
//! value heads; query head `h` reads kv head `h / (n_heads / n_kv_heads)` (HF's `repeat_kv`
//! repeats each kv head that many times, consecutively).

use super::exp::exp;
use super::lanes::sum;
use super::team::Team;
use super::{vector_isa, VectorIsa};
use rayon::prelude::*;
use std::ops::Range;

/// Keys are cached in tiles of this many positions, transposed: a tile holds `k[pos][d]` of
/// `KEY_TILE` consecutive positions as `[head_dim][KEY_TILE]`.
///
/// The scores of a tile's keys are then `KEY_TILE` independent sums: for each dimension `d`, one
/// multiply-add of `q[d]` with a contiguous row of `KEY_TILE` floats (one AVX-512 register), and
/// no horizontal sum at all; a key-major layout needs one horizontal sum of `head_dim` products per
/// key and head. Values stay key-major (`[pos][head_dim]`): they are summed weighted by position,
/// which is a multiply-add of whole rows.
pub const KEY_TILE: usize = 16;

/// Positions per chunk of the KV cache. The cache of one layer is a list of chunks, each holding
/// `KV_CHUNK` positions of every kv head ([`chunk_len`] floats), so it grows a chunk at a time
/// and never moves what it holds. For every Qwen3 size (8 kv heads of 128) a layer's chunk is
/// 2 MiB, one huge page. A multiple of [`BLOCK`] and [`KEY_TILE`]: no block of keys straddles
/// two chunks.
pub const KV_CHUNK: usize = 256;

/// The element type of a session's KV cache (`--kv-cache`): see [`KvElem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// Exact: the default.
    #[default]
    F32,
    /// Half the memory and the bytes attention reads, keys and values rounded to bf16.
    Bf16,
}

impl KvType {
    /// The name `--kv-cache` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::Bf16 => "bf16",
        }
    }

    /// Bytes of one stored key or value element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::Bf16 => 2,
        }
    }
}

/// What the KV cache stores a key or value element as.
///
/// - `f32`: the activations as computed, so attention is exactly HF's float32 reference.
/// - [`Bf16`]: the upper half of an f32's bits (`torch.bfloat16`: 8 significant bits), rounded
///   to nearest. The cache takes half the memory, and attention half the bytes a token, which is
///   what bounds it at long contexts; keys and values lose the precision they lose when HF runs
///   Qwen3 in bf16 (the `torch_dtype` its config names). Widening back is a 16-bit shift, which
///   vectorizes.
pub trait KvElem: bytemuck::Pod + Send + Sync {
    /// `x` as stored.
    fn from_f32(x: f32) -> Self;
    /// The stored value, exactly, as an f32.
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// A bfloat16: the upper 16 bits of an f32 (sign, 8 exponent bits, 7 mantissa bits), as
/// `torch.bfloat16` stores it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

// SAFETY: `Bf16` is `repr(transparent)` over a `u16`: no padding, and every bit pattern is a
// valid value (Zeroable: all zeros is +0.0).
unsafe impl bytemuck::Zeroable for Bf16 {}
// SAFETY: as above; it is also `Copy` and `'static`, as `Pod` requires.
unsafe impl bytemuck::Pod for Bf16 {}

impl KvElem for Bf16 {
    /// Round to nearest, ties to even: add half a unit of the kept part (less one, plus the
    /// kept part's lowest bit, which breaks ties toward even) and drop the low 16 bits. Too
    /// large a value rounds to infinity, as in IEEE rounding; NaN stays a (quiet) NaN.
    #[inline(always)]
    fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16((b >> 16) as u16 | 0x0040);
        }
        let round = 0x7fff + ((b >> 16) & 1);
        Bf16((b.wrapping_add(round) >> 16) as u16)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// Elements of one layer's chunk: the `KV_CHUNK` keys of every kv head in tiles (`[n_kv_heads]
/// [KV_CHUNK / KEY_TILE][head_dim][KEY_TILE]`), then their `KV_CHUNK` values (`[n_kv_heads]
/// [KV_CHUNK][head_dim]`). Attention for one kv head streams two runs of memory per chunk, its
/// keys and its values.
pub fn chunk_len(n_kv_heads: usize, head_dim: usize) -> usize {
    n_kv_heads * 2 * KV_CHUNK * head_dim
}

/// Writes the key `k` and value `v` (`[head_dim]` each) of kv head `h` at position `pos` into the
/// layer's chunk that holds `pos` (chunk `pos / KV_CHUNK`), as `T`.
pub fn store_kv<T: KvElem>(chunk: &mut [T], h: usize, pos: usize, k: &[f32], v: &[f32]) {
    let hd = k.len();
    let (key_range, value_range) = head_ranges(chunk.len(), h, hd);
    let (keys, values) = chunk.split_at_mut(value_range.start);
    let keys = &mut keys[key_range];
    let values = &mut values[..KV_CHUNK * hd];
    let j = pos % KV_CHUNK;
    let tile = &mut keys[(j / KEY_TILE) * hd * KEY_TILE..][..hd * KEY_TILE];
    for (d, &x) in k.iter().enumerate() {
        tile[d * KEY_TILE + j % KEY_TILE] = T::from_f32(x);
    }
    for (dst, &x) in values[j * hd..(j + 1) * hd].iter_mut().zip(v) {
        *dst = T::from_f32(x);
    }
}

/// The sizes attention needs.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions one kv head holds in the cache (its stride, in rows of `head_dim`).
    pub context_len: usize,
}

/// Attention for `t` query tokens at positions `start_pos .. start_pos + t`.
///
/// - `q`, `out`: `[t, n_heads, head_dim]`
/// - `chunks`: one layer's KV cache, chunk `c` holding positions `c * KV_CHUNK ..` as
///   [`chunk_len`] says. They already hold positions `0 .. start_pos + t` (these tokens included).
///
/// Query `i` sees cache positions `0 ..= start_pos + i` (the causal mask: never a later token).
///
/// The work splits into one task per (token, kv head): the task computes the `group` query
/// heads that share that kv head, so each key and value row is read once for all of them (with
/// Qwen3-0.6B's 16 query and 8 kv heads, half the cache traffic of one head at a time). Each task
/// runs [`attend_body`].
pub fn attention<T: KvElem, C: AsRef<[T]> + Sync>(
    out: &mut [f32],
    q: &[f32],
    chunks: &[C],
    s: AttentionShape,
    start_pos: usize,
    t: usize,
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let width = s.n_heads * hd;
    assert_eq!(q.len(), t * width);
    assert_eq!(out.len(), t * width);
    assert!(start_pos + t <= s.context_len);
    assert!(
        start_pos + t <= chunks.len() * KV_CHUNK,
        "the cache lacks chunks"
    );
    let len = chunk_len(s.n_kv_heads, hd);
    assert!(chunks.iter().all(|c| c.as_ref().len() == len));
    let attend = attend_fn::<T>();
    // out[i][kv * group .. (kv + 1) * group][..]: the group's heads are consecutive (repeat_kv),
    // so each task's output is one contiguous block of group * head_dim values.
    if t == 1 {
        // Decode: the kv heads are parts of a job of the decode team (team.rs), each thread
        // owning a run of them, as in the products around attention.
        let block = group * hd;
        Team::current().split([out], block, |_, start, part, _| {
            for (j, out_g) in part.chunks_mut(block).enumerate() {
                let kv = start / block + j;
                let q_g = &q[kv * block..(kv + 1) * block];
                attend_head(attend, out_g, q_g, chunks, kv, start_pos + 1, hd);
            }
        });
        return;
    }
    out.par_chunks_mut(group * hd)
        .zip(q.par_chunks(group * hd))
        .enumerate()
        .for_each(|(task, (out_g, q_g))| {
            let (i, kv) = (task / s.n_kv_heads, task % s.n_kv_heads);
            let n_keys = start_pos + i + 1;
            attend_head(attend, out_g, q_g, chunks, kv, n_keys, hd);
        });
}

/// One task: the query heads of `q` (`[group, head_dim]`, all reading kv head `kv`) over keys
/// `0 .. n_keys`, into `out`. Heads go `MAX_GROUP` at a time; for each pass, `attend` takes the
/// chunks in order, carrying the online softmax's running maximum and sum from one to the next,
/// and the output is normalised at the end.
fn attend_head<T: KvElem, C: AsRef<[T]>>(
    attend: AttendFn<T>,
    out: &mut [f32],
    q: &[f32],
    chunks: &[C],
    kv: usize,
    n_keys: usize,
    hd: usize,
) {
    let scale = (hd as f32).powf(-0.5);
    let group = q.len() / hd;
    for g0 in (0..group).step_by(MAX_GROUP) {
        let gn = (group - g0).min(MAX_GROUP);
        let q = &q[g0 * hd..(g0 + gn) * hd];
        let o = &mut out[g0 * hd..(g0 + gn) * hd];
        o.fill(0.0);
        let mut pass = Pass {
            hd,
            scale,
            m: [f32::NEG_INFINITY; MAX_GROUP],
            l: [0f32; MAX_GROUP],
        };
        for (c, chunk) in chunks.iter().take(n_keys.div_ceil(KV_CHUNK)).enumerate() {
            // This kv head's keys (tiles) and values in the chunk. The tile holding the last key
            // may hold later positions too, or stale ones; their scores are computed and never
            // used.
            let (keys, values) = head_of(chunk.as_ref(), kv, hd);
            let n = (n_keys - c * KV_CHUNK).min(KV_CHUNK);
            attend(o, q, keys, values, n, &mut pass);
        }
        // Normalise: o_g / l_g.
        for (g, o_g) in o.chunks_exact_mut(hd).enumerate() {
            let inv = 1.0 / pass.l[g];
            for x in o_g {
                *x *= inv;
            }
        }
    }
}

/// Kv head `kv`'s keys (tiles) and values in a layer's chunk (see [`chunk_len`]).
fn head_of<T>(chunk: &[T], kv: usize, hd: usize) -> (&[T], &[T]) {
    let (keys, values) = head_ranges(chunk.len(), kv, hd);
    (&chunk[keys], &chunk[values])
}

/// Where kv head `kv`'s keys and values lie in a layer's chunk of `len` floats: the keys of
/// every head fill the first half, their values the second (see [`chunk_len`]).
fn head_ranges(len: usize, kv: usize, hd: usize) -> (Range<usize>, Range<usize>) {
    let (at, n) = (kv * KV_CHUNK * hd, KV_CHUNK * hd);
    (at..at + n, len / 2 + at..len / 2 + at + n)
}

/// One pass of up to [`MAX_GROUP`] query heads over their kv head's chunks: the head size, the
/// scores' scale, and the online softmax's running maximum `m` and sum `l` per query head.
struct Pass {
    hd: usize,
    scale: f32,
    m: [f32; MAX_GROUP],
    l: [f32; MAX_GROUP],
}

/// `o[g] += e^(score - m) v` over the keys of one chunk, for the query heads `g` of one pass
/// (at most [`MAX_GROUP`]), updating `pass` (see [`attend_body`]). `o`, `q`: `[heads, head_dim]`;
/// `keys`, `values`: one kv head's part of a chunk, of which the first `n_keys` positions count.
type AttendFn<T> =
    fn(o: &mut [f32], q: &[f32], keys: &[T], values: &[T], n: usize, pass: &mut Pass);

/// [`attend_body`] for cache elements `T`, compiled for the instruction set of the chosen kernel
/// family ([`vector_isa`]). The body is plain Rust whose loops are elementwise or written in independent
/// lanes, which the compiler turns into vector instructions of whatever width the enabled
/// features give (SSE2 or NEON by default, AVX2 or AVX-512 in the wrappers below). Every version
/// does the same operations in the same order, so all give bit-identical results (tested).
fn attend_fn<T: KvElem>() -> AttendFn<T> {
    match vector_isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only chosen when the CPU has AVX-512F.
        VectorIsa::Avx512 => |o, q, k, v, n, p| unsafe { attend_avx512(o, q, k, v, n, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only chosen when the CPU has AVX2.
        VectorIsa::Avx2 => |o, q, k, v, n, p| unsafe { attend_avx2(o, q, k, v, n, p) },
        VectorIsa::Baseline => attend_body,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_avx512<T: KvElem>(
    o: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    n: usize,
    p: &mut Pass,
) {
    attend_body(o, q, k, v, n, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_avx2<T: KvElem>(
    o: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    n: usize,
    p: &mut Pass,
) {
    attend_body(o, q, k, v, n, p)
}

/// Keys scored per step of the online softmax.
const BLOCK: usize = 64;
/// Query heads handled per pass over the keys (larger groups take several passes).
const MAX_GROUP: usize = 8;

/// Attention of the query heads of one pass over one chunk of their kv head's keys and values,
/// with the online softmax (Milakov and Gimelshein 2018, "Online normalizer calculation for
/// softmax"; the same recurrence as FlashAttention): for each block of keys, the scores of the
/// block, then the running maximum `m`, and the running sum `l` and output `o` rescaled by
/// `e^(m_old - m)`. After the last chunk `o / l` is exactly `softmax(scores) values`, up to f32
/// rounding, with no buffer of `n_keys` scores: long contexts cost the same per key as short
/// ones. ([`attend_head`] takes the chunks in order and divides by `l`.)
#[inline(always)]
fn attend_body<T: KvElem>(
    o: &mut [f32],
    q: &[f32],
    keys: &[T],
    values: &[T],
    n_keys: usize,
    pass: &mut Pass,
) {
    let (hd, scale) = (pass.hd, pass.scale);
    let gn = q.len() / hd;
    // Local copies: as locals the compiler keeps them in registers across the blocks.
    let (mut m, mut l) = (pass.m, pass.l);
    let mut p = [[0f32; BLOCK]; MAX_GROUP];
    for j0 in (0..n_keys).step_by(BLOCK) {
        let nb = (n_keys - j0).min(BLOCK);
        // 1. Scores of this block, a tile of keys at a time, each tile read once for the
        //    whole group: p[g][b] = (q_g . k_{j0+b}) * head_dim^-0.5
        for t0 in (0..nb).step_by(KEY_TILE) {
            let tile = &keys[(j0 + t0) * hd..(j0 + t0 + KEY_TILE) * hd];
            for g in 0..gn {
                let scores = &mut p[g][t0..t0 + KEY_TILE];
                tile_scores(&q[g * hd..(g + 1) * hd], tile, scale, scores);
            }
        }
        for g in 0..gn {
            // 2. New running maximum; rescale what was accumulated under the old one.
            let block_max = p[g][..nb].iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let m_new = m[g].max(block_max);
            let c = exp(m[g] - m_new);
            m[g] = m_new;
            // 3. p = e^(score - m), summed into l.
            for v in p[g][..nb].iter_mut() {
                *v = exp(*v - m_new);
            }
            l[g] = l[g] * c + sum(&p[g][..nb]);
            if c != 1.0 {
                for x in &mut o[g * hd..(g + 1) * hd] {
                    *x *= c;
                }
            }
        }
        // 4. o_g += p[g][b] * v_{j0+b}, each value row read once for the whole group.
        let block = &values[j0 * hd..(j0 + nb) * hd];
        if hd == QWEN3_HEAD_DIM {
            // Two heads at a time, their output rows held in registers for the block.
            let mut g = 0;
            while g < gn {
                if gn - g >= 2 {
                    add_values::<T, 2, QWEN3_HEAD_DIM>(&mut o[g * hd..], &p[g..], block);
                    g += 2;
                } else {
                    add_values::<T, 1, QWEN3_HEAD_DIM>(&mut o[g * hd..], &p[g..], block);
                    g += 1;
                }
            }
        } else {
            for (b, v) in block.chunks_exact(hd).enumerate() {
                for g in 0..gn {
                    let w = p[g][b];
                    for (x, &vv) in o[g * hd..(g + 1) * hd].iter_mut().zip(v) {
                        *x += w * vv.to_f32();
                    }
                }
            }
        }
    }
    pass.m = m;
    pass.l = l;
}

/// `scores[b] = (q . k_b) * scale` for the [`KEY_TILE`] keys of one tile (`[head_dim][KEY_TILE]`).
/// Each lane is one key's sum over `d`, kept as four partial sums (`d` mod 4) so consecutive
/// multiply-adds do not wait on each other, added in a fixed order at the end.
#[inline(always)]
fn tile_scores<T: KvElem>(q: &[f32], tile: &[T], scale: f32, scores: &mut [f32]) {
    // Four dimensions a step, into four named accumulators (an array indexed by `d % 4` would
    // live in memory, every step a load and a store).
    let (mut a0, mut a1, mut a2, mut a3) = (
        [0f32; KEY_TILE],
        [0f32; KEY_TILE],
        [0f32; KEY_TILE],
        [0f32; KEY_TILE],
    );
    let rows = tile.chunks_exact(4 * KEY_TILE);
    let qs = q.chunks_exact(4);
    let tail = (rows.remainder(), qs.remainder());
    for (r, qd) in rows.zip(qs) {
        for lane in 0..KEY_TILE {
            a0[lane] += qd[0] * r[lane].to_f32();
            a1[lane] += qd[1] * r[KEY_TILE + lane].to_f32();
            a2[lane] += qd[2] * r[2 * KEY_TILE + lane].to_f32();
            a3[lane] += qd[3] * r[3 * KEY_TILE + lane].to_f32();
        }
    }
    // head_dim not a multiple of 4: the last dimensions go to the first accumulators.
    for ((row, &qd), a) in tail
        .0
        .chunks_exact(KEY_TILE)
        .zip(tail.1)
        .zip([&mut a0, &mut a1, &mut a2])
    {
        for lane in 0..KEY_TILE {
            a[lane] += qd * row[lane].to_f32();
        }
    }
    for (lane, s) in scores.iter_mut().enumerate() {
        *s = ((a0[lane] + a1[lane]) + (a2[lane] + a3[lane])) * scale;
    }
}

/// Qwen3's head_dim (every released size): [`add_values`] is compiled for it, other sizes take
/// a loop over memory that does the same additions in the same order.
const QWEN3_HEAD_DIM: usize = 128;

/// `o[g] += sum_b p[g][b] * v[b]` for `G` heads, with `o`'s `G` rows of `HD` values held in
/// registers (AVX-512: 8 per row) across the whole block instead of loaded and stored per key.
#[inline(always)]
fn add_values<T: KvElem, const G: usize, const HD: usize>(
    o: &mut [f32],
    p: &[[f32; BLOCK]],
    block: &[T],
) {
    let mut acc = [[0f32; HD]; G];
    for (g, a) in acc.iter_mut().enumerate() {
        a.copy_from_slice(&o[g * HD..(g + 1) * HD]);
    }
    for (b, v) in block.chunks_exact(HD).enumerate() {
        for (a, p) in acc.iter_mut().zip(p) {
            let w = p[b];
            for (x, &vv) in a.iter_mut().zip(v) {
                *x += w * vv.to_f32();
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        o[g * HD..(g + 1) * HD].copy_from_slice(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::lcg;

    /// Textbook attention in f64: per query head, the full softmax over keys 0..=pos of its kv
    /// head (found by repeating kv heads as HF's repeat_kv does).
    #[test]
    fn matches_naive_softmax_attention() {
        // Short: one block of keys. Long: several blocks (the online softmax's rescaling), a
        // group of 10 query heads (two passes of MAX_GROUP), and a head_dim with a remainder
        // after the lanes. Then a head_dim that is not a multiple of 4 (the scores' last
        // dimensions), and Qwen3's 128 (the values summed in registers), last with queries on
        // both sides of a chunk's end.
        for (s, start, t) in [
            (
                AttentionShape {
                    n_heads: 4,
                    n_kv_heads: 2,
                    head_dim: 8,
                    context_len: 10,
                },
                4,
                3,
            ),
            (
                AttentionShape {
                    n_heads: 20,
                    n_kv_heads: 2,
                    head_dim: 24,
                    context_len: 300,
                },
                200,
                5,
            ),
            (
                AttentionShape {
                    n_heads: 2,
                    n_kv_heads: 1,
                    head_dim: 18,
                    context_len: 40,
                },
                30,
                2,
            ),
            (
                AttentionShape {
                    n_heads: 6,
                    n_kv_heads: 2,
                    head_dim: QWEN3_HEAD_DIM,
                    context_len: 100,
                },
                60,
                3,
            ),
            (
                AttentionShape {
                    n_heads: 4,
                    n_kv_heads: 2,
                    head_dim: QWEN3_HEAD_DIM,
                    context_len: 3 * KV_CHUNK,
                },
                2 * KV_CHUNK - 2,
                4,
            ),
        ] {
            check_against_naive::<f32>(s, start, t);
            check_against_naive::<Bf16>(s, start, t);
        }
    }

    /// Attention over a cache of `T` against the naive formula in f64 over the keys and values
    /// as the cache holds them (rounded to `T`, then widened exactly).
    fn check_against_naive<T: KvElem>(s: AttentionShape, start: usize, t: usize) {
        let mut seed = 3;
        let kv_len = s.n_kv_heads * s.context_len * s.head_dim;
        let k: Vec<f32> = (0..kv_len).map(|_| lcg(&mut seed) * 2.0).collect();
        let v: Vec<f32> = (0..kv_len).map(|_| lcg(&mut seed)).collect();
        let width = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..t * width).map(|_| lcg(&mut seed) * 2.0).collect();
        let mut out = vec![0f32; t * width];
        attention(&mut out, &q, &cache_of::<T>(&k, &v, s), s, start, t);
        let stored = |x: f32| T::from_f32(x).to_f32() as f64;

        let hd = s.head_dim;
        for i in 0..t {
            let pos = start + i;
            for h in 0..s.n_heads {
                // repeat_kv: kv head for query head h.
                let kvh = h * s.n_kv_heads / s.n_heads;
                let key = |j: usize, c: usize| stored(k[(kvh * s.context_len + j) * hd + c]);
                let val = |j: usize, c: usize| stored(v[(kvh * s.context_len + j) * hd + c]);
                let qv = |c: usize| q[i * width + h * hd + c] as f64;
                let logits: Vec<f64> = (0..=pos)
                    .map(|j| (0..hd).map(|c| qv(c) * key(j, c)).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let z: f64 = logits.iter().map(|l| l.exp()).sum();
                for c in 0..hd {
                    let want: f64 = (0..=pos).map(|j| logits[j].exp() / z * val(j, c)).sum();
                    let got = out[i * width + h * hd + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "token {i} head {h} [{c}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The chunks of a layer's cache holding key-major `k` and `v` (`[n_kv_heads, context_len,
    /// head_dim]`), every float not written NaN (stale lanes must not leak into a result).
    fn cache_of<T: KvElem>(k: &[f32], v: &[f32], s: AttentionShape) -> Vec<Vec<T>> {
        let (hd, n) = (s.head_dim, s.context_len);
        let len = chunk_len(s.n_kv_heads, hd);
        let mut chunks = vec![vec![T::from_f32(f32::NAN); len]; n.div_ceil(KV_CHUNK)];
        for h in 0..s.n_kv_heads {
            for pos in 0..n {
                let at = (h * n + pos) * hd;
                let (k, v) = (&k[at..at + hd], &v[at..at + hd]);
                store_kv(&mut chunks[pos / KV_CHUNK], h, pos, k, v);
            }
        }
        chunks
    }

    /// Every compiled version of the attention body gives the same bits: the lanes make the
    /// order of every addition explicit. Run with head_dim 40 (the loop over memory) and 128
    /// (the values summed in registers), a group of 3 (a pair and a single head), and keys in two
    /// chunks that end inside a tile whose other lanes hold NaN: they must not leak into the
    /// result.
    #[test]
    fn every_isa_gives_identical_results() {
        every_isa_identical::<f32>();
        every_isa_identical::<Bf16>();
    }

    fn every_isa_identical<T: KvElem>() {
        for hd in [40, QWEN3_HEAD_DIM] {
            let (group, n_keys) = (3, 300);
            let s = AttentionShape {
                n_heads: group,
                n_kv_heads: 1,
                head_dim: hd,
                context_len: n_keys,
            };
            let mut seed = 5;
            let q: Vec<f32> = (0..group * hd).map(|_| lcg(&mut seed) * 3.0).collect();
            let k: Vec<f32> = (0..n_keys * hd).map(|_| lcg(&mut seed)).collect();
            let v: Vec<f32> = (0..n_keys * hd).map(|_| lcg(&mut seed)).collect();
            let chunks = cache_of::<T>(&k, &v, s);
            let mut want = vec![0f32; group * hd];
            attend_head(attend_body, &mut want, &q, &chunks, 0, n_keys, hd);
            assert!(want.iter().all(|x| x.is_finite()), "head_dim {hd}");
            let mut got = vec![0f32; group * hd];
            attend_head(attend_fn::<T>(), &mut got, &q, &chunks, 0, n_keys, hd);
            assert_eq!(got, want, "head_dim {hd}");
        }
    }

    /// The cache's bf16 rounding is IEEE round-to-nearest-even, as the `half` crate's: checked on
    /// ties in both directions, values that round up into the next binade and to infinity,
    /// subnormals, zeros, infinities, and a sweep of bit patterns; NaN stays NaN.
    #[test]
    fn bf16_rounds_to_nearest_even() {
        let mut bits: Vec<u32> = vec![
            0x3f80_8000, // 1 + 2^-8: a tie, rounds down to even 1.0
            0x3f81_8000, // a tie above an odd value: rounds up
            0x3f80_8001, // just above a tie: up
            0x3fff_ffff, // rounds up into the next binade (2.0)
            0x7f7f_ffff, // f32::MAX: beyond bf16's largest, rounds to infinity
            0x0000_8001, // a subnormal
            0x0000_0000,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            bits.push(x);
        }
        for b in bits {
            let f = f32::from_bits(b);
            let ours = Bf16::from_f32(f);
            if f.is_nan() {
                assert!(ours.to_f32().is_nan(), "{b:#x}");
                continue;
            }
            assert_eq!(ours.0, half::bf16::from_f32(f).to_bits(), "{b:#x}");
            assert_eq!(ours.to_f32(), half::bf16::from_f32(f).to_f32(), "{b:#x}");
        }
    }
}
