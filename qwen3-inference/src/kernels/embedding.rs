//! Token embedding: one row of the `[vocab, hidden]` table, converted to f32 on the fly.
//! Only the rows of the tokens being run are ever converted: the table stays as stored in the
//! mmap (for Qwen3-0.6B at q8 that is 156 MB instead of a 622 MB f32 copy).

use crate::format::view::{TensorData, TensorView};
use crate::gguf::blocks::k_quant_blocks;
use crate::quant::{dequantize_q4, dequantize_q6_row, dequantize_q8};

/// Writes row `token` of `table` (`[vocab, hidden]`) into `out` (`[hidden]`).
/// The caller checks `token < vocab` (an out-of-range id is bad input, not a bug).
pub fn embedding(out: &mut [f32], table: &TensorView, token: usize) {
    let hidden = table.shape[1] as usize;
    assert_eq!(out.len(), hidden);
    let span = token * hidden..(token + 1) * hidden;
    match table.data {
        TensorData::F32(v) => out.copy_from_slice(&v[span]),
        TensorData::Bf16(v) => {
            for (o, &b) in out.iter_mut().zip(&v[span]) {
                *o = f32::from_bits((b as u32) << 16);
            }
        }
        TensorData::Q8 {
            q,
            scales,
            group_size,
        } => {
            let per_row = hidden / group_size;
            let s = &scales[token * per_row..(token + 1) * per_row];
            dequantize_q8(&q[span], s, group_size, out);
        }
        TensorData::Q4 {
            packed,
            scales,
            group_size,
        } => {
            let per_row = hidden / group_size;
            let s = &scales[token * per_row..(token + 1) * per_row];
            let row = &packed[token * hidden / 2..(token + 1) * hidden / 2];
            dequantize_q4(row, s, group_size, out);
        }
        TensorData::Q6 {
            packed,
            scales,
            group_size,
            cols,
        } => dequantize_q6_row(packed, scales, cols, group_size, token, out),
        TensorData::K(kind, blocks) => {
            let row = kind.row_bytes(hidden);
            k_quant_blocks(kind, &blocks[token * row..(token + 1) * row], out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_right_row_of_each_dtype() {
        let shape = [3u64, 4];
        let f: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut out = [0f32; 4];
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::F32(&f),
            interleaved: None,
        };
        embedding(&mut out, &t, 2);
        assert_eq!(out, [8.0, 9.0, 10.0, 11.0]);
        let b: Vec<u16> = f.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::Bf16(&b),
            interleaved: None,
        };
        embedding(&mut out, &t, 1);
        assert_eq!(out, [4.0, 5.0, 6.0, 7.0]);
        let q: Vec<i8> = (0..12).map(|i| i as i8).collect();
        let s = [1.0f32, 2.0, 0.5, 0.25, 3.0, -1.0];
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::Q8 {
                q: &q,
                scales: &s,
                group_size: 2,
            },
            interleaved: None,
        };
        embedding(&mut out, &t, 2);
        assert_eq!(out, [8.0 * 3.0, 9.0 * 3.0, -10.0, -11.0]);
    }
}
