//! Step 2a of a decoder layer for a softmax-attention layer (`Qwen3Attention`, and Qwen3.5's
//! gated attention): the projections and q/k norms run on every row of the step at once; RoPE,
//! the KV cache and attention run per sequence, each segment at its own positions and over its
//! own cache (see the parent module's comment on what is shared).

use super::{Cache, Dims, Forward, Scratch, Segment};
use crate::backend::Backend;
use crate::model::Qwen3Attention;
use anyhow::Result;

impl<'m, B: Backend> Forward<'m, B> {
    /// `Qwen3Attention.forward` on the normalised input in `xb` (`[t, hidden]`); leaves the output
    /// (after o_proj) in `xb`.
    pub(super) fn self_attention(
        &mut self,
        l: usize,
        attn: &Qwen3Attention<B::Tensor>,
        t: usize,
        segments: &[Segment],
        caches: &mut [Cache<B>],
        positions: Option<&[[u32; 3]]>,
    ) -> Result<()> {
        let b = self.backend;
        let Dims {
            d,
            nh,
            nkv,
            head_dim: hd,
            eps,
            ..
        } = self.dims;
        // This layer's layer of the KV cache (which holds the attention layers only).
        let kv_layer = self.slot[l];
        let s = &mut self.s;

        // i. Projections, the three in one pass over xb.
        //    q: [t, n_heads, head_dim]   k, v: [t, n_kv_heads, head_dim]
        //    With q/k norms (Qwen3), q and k land in q_raw/k_raw, the norms' inputs.
        //    Qwen3.5: the output gate too, `[t, n_heads, head_dim]`, in the same pass.
        let (q, k) = match attn.qk_norm {
            Some(_) => (&mut s.q_raw, &mut s.k_raw),
            None => (&mut s.q, &mut s.k),
        };
        match &attn.output_gate {
            None => b.matmuls(
                [&mut *q, &mut *k, &mut s.v],
                [&attn.q_proj, &attn.k_proj, &attn.v_proj],
                &s.xb,
                t,
                [nh * hd, nkv * hd, nkv * hd],
                d,
            )?,
            Some(gate) => b.matmuls(
                [&mut *q, &mut *k, &mut s.v, &mut s.att_gate],
                [&attn.q_proj, &attn.k_proj, &attn.v_proj, gate],
                &s.xb,
                t,
                [nh * hd, nkv * hd, nkv * hd, nh * hd],
                d,
            )?,
        }

        // ii. Qwen2: the projections' biases, one per output row: q += b_q, k += b_k, v += b_v.
        if let Some([bq, bk, bv]) = &attn.qkv_bias {
            b.add_bias(q, bq, t, nh * hd)?;
            b.add_bias(k, bk, t, nkv * hd)?;
            b.add_bias(&mut s.v, bv, t, nkv * hd)?;
        }
        //     Qwen3: per-head RMSNorm of q and k over head_dim (q_norm/k_norm), before RoPE:
        //     rows = t * heads, each head_dim wide.
        if let Some([q_norm, k_norm]) = &attn.qk_norm {
            b.rmsnorm(&mut s.q, &s.q_raw, q_norm, t * nh, hd, eps)?;
            b.rmsnorm(&mut s.k, &s.k_raw, k_norm, t * nkv, hd, eps)?;
        }

        // iii-v. Per sequence: RoPE at its positions, its cache, attention over its cache.
        let rope = Rope {
            table: &self.rope,
            mrope: &self.mrope,
        };
        match segments {
            // One sequence: its rows are the whole buffers.
            [seg] => {
                let Scratch { q, k, v, att, .. } = &mut *s;
                let cache = &mut caches[seg.seq].kv;
                seq_attention(
                    b,
                    rope.at(positions),
                    self.dims,
                    kv_layer,
                    seg,
                    cache,
                    [q, k, v, att],
                )?
            }
            // Several: each segment's rows are copied to the start of `seg`, and its output back.
            _ => {
                let [sq, sk, sv, satt] = &mut s.seg;
                let mut r0 = 0;
                for seg in segments {
                    let n = seg.len;
                    b.copy(sq, 0, &s.q, r0 * nh * hd, n * nh * hd)?;
                    b.copy(sk, 0, &s.k, r0 * nkv * hd, n * nkv * hd)?;
                    b.copy(sv, 0, &s.v, r0 * nkv * hd, n * nkv * hd)?;
                    let bufs = [&mut *sq, &mut *sk, &mut *sv, &mut *satt];
                    let cache = &mut caches[seg.seq].kv;
                    let rows = positions.map(|p| &p[r0..r0 + n]);
                    seq_attention(b, rope.at(rows), self.dims, kv_layer, seg, cache, bufs)?;
                    b.copy(&mut s.att, r0 * nh * hd, satt, 0, n * nh * hd)?;
                    r0 += n;
                }
            }
        }

        //     Qwen3.5: the output gated, value by value.     att = att * sigmoid(gate)
        if attn.output_gate.is_some() {
            b.sigmoid_mul(&mut s.att, &s.att_gate, t * nh * hd)?;
        }

        // vi. Output projection back to the residual width.     xb: [t, hidden]
        b.matmul(&mut s.xb, &attn.o_proj, &s.att, t, d, nh * hd)
    }
}

/// The rotary embedding of a step: the table, and with images the M-RoPE components.
struct Rope<'a, R> {
    table: &'a R,
    mrope: &'a [u8],
}

/// How one segment's rows rotate: at their cache positions, or at their M-RoPE positions.
struct SegmentRope<'a, R> {
    table: &'a R,
    mrope: Option<(&'a [[u32; 3]], &'a [u8])>,
}

impl<'a, R> Rope<'a, R> {
    /// The rotation of rows whose M-RoPE positions are `positions` (`None`: text).
    fn at(&self, positions: Option<&'a [[u32; 3]]>) -> SegmentRope<'a, R> {
        SegmentRope {
            table: self.table,
            mrope: positions.map(|p| (p, self.mrope)),
        }
    }
}

/// Steps iii to v of attention for one sequence, whose `seg.len` rows start at the beginning of
/// `q`, `k`, `v` and `att`.
fn seq_attention<B: Backend>(
    b: &B,
    rope: SegmentRope<B::Rope>,
    dims: Dims,
    l: usize,
    seg: &Segment,
    cache: &mut B::KvCache,
    [q, k, v, att]: [&mut B::Buf; 4],
) -> Result<()> {
    let Dims {
        nh,
        nkv,
        head_dim: hd,
        ..
    } = dims;
    let (n, pos) = (seg.len, seg.pos);

    // iii. RoPE: rotate each head of token i by the angles of its position pos + i; with
    //      images, each frequency by its component's position (time, height or width).
    match rope.mrope {
        None => {
            b.rope(q, rope.table, n, nh, hd, pos)?;
            b.rope(k, rope.table, n, nkv, hd, pos)?;
        }
        Some((positions, components)) => {
            b.rope_mrope(q, rope.table, n, nh, hd, positions, components)?;
            b.rope_mrope(k, rope.table, n, nkv, hd, positions, components)?;
        }
    }

    // iv. Append k and v to this layer's cache at positions pos .. pos + n.
    b.store_kv(cache, l, k, v, n, pos)?;

    // v. Causal grouped-query attention over the cache: token i sees positions 0 ..= pos + i;
    //    query head h reads kv head h / (n_heads / n_kv_heads).   att: [n, n_heads, head_dim]
    b.attention(att, q, cache, l, n, pos)
}
