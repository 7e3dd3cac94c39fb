//! Token embedding: one row of the `[vocab, hidden]` table, converted to f32 on the fly.
//! Only the rows of the tokens being run are ever converted: the table stays as stored in the
//! mmap (for Qwen3-0.6B at q8 that is 156 MB instead of a 622 MB f32 copy).

use super::dot::interleaved::interleaved_row;
use crate::format::view::TensorView;

/// Writes row `token` of `table` (`[vocab, hidden]`) into `out` (`[hidden]`), read as the
/// table's dtype says ([`TensorData::row`](crate::format::view::TensorData::row)), or from the
/// kernels' interleaved order where the table lies in that order alone (a tied GGUF table opened
/// for the CPU's kernels, `format::Reader::Interleaved`: it is the classifier too).
/// The caller checks `token < vocab` (an out-of-range id is bad input, not a bug).
pub fn embedding(out: &mut [f32], table: &TensorView, token: usize) {
    assert_eq!(out.len(), table.shape[1] as usize);
    match (table.data.is_kernels_only(), table.interleaved) {
        (true, Some(interleaved)) => interleaved_row(&interleaved, token, out),
        _ => table.data.row(token, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::view::TensorData;
    use crate::quant::Q8;

    #[test]
    fn reads_the_right_row_of_each_dtype() {
        let shape = [3u64, 4];
        let f: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut out = [0f32; 4];
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::from_f32(&f),
            interleaved: None,
        };
        embedding(&mut out, &t, 2);
        assert_eq!(out, [8.0, 9.0, 10.0, 11.0]);
        let b: Vec<u16> = f.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::from_bf16(&b),
            interleaved: None,
        };
        embedding(&mut out, &t, 1);
        assert_eq!(out, [4.0, 5.0, 6.0, 7.0]);
        let q: Vec<i8> = (0..12).map(|i| i as i8).collect();
        let s = [1.0f32, 2.0, 0.5, 0.25, 3.0, -1.0];
        let t = TensorView {
            name: "e",
            shape: &shape,
            data: TensorData::from(Q8 {
                q: &q,
                scales: &s,
                group_size: 2,
            }),
            interleaved: None,
        };
        embedding(&mut out, &t, 2);
        assert_eq!(out, [8.0 * 3.0, 9.0 * 3.0, -10.0, -11.0]);
    }
}
