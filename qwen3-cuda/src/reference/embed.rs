//! Reference of `kernels/embed.cu`.

use qwen3_inference::format::view::TensorData;
use qwen3_inference::format::DType;

/// `out[t, :] = E[tokens[t], :]`, dequantized; E: [vocab, cols]; out: [tokens.len(), cols].
/// Token ids must be below the vocabulary size (the caller checks).
pub fn embed(out: &mut [f32], table: &TensorData<'_>, tokens: &[u32], cols: usize) {
    assert_eq!(out.len(), tokens.len() * cols);
    for (&tok, row) in tokens.iter().zip(out.chunks_exact_mut(cols)) {
        let start = tok as usize * cols;
        for (c, o) in row.iter_mut().enumerate() {
            let i = start + c;
            *o = match table.dtype() {
                DType::K(_) => {
                    panic!("the CUDA backend has no K-quant kernels (it refuses such files)")
                }
                _ => table.value(i),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwen3_inference::quant::{dequantize_q8, quantize_q8, Q8};

    /// A gathered q8 row is exactly the dequantized row of the table.
    #[test]
    fn q8_rows_equal_dequantized_rows() {
        let (vocab, cols, gs) = (5, 64, 16);
        let w: Vec<f32> = (0..vocab * cols)
            .map(|i| ((i * 37) % 101) as f32 - 50.0)
            .collect();
        let mut q = vec![0i8; w.len()];
        let mut s = vec![0.0; w.len() / gs];
        quantize_q8(&w, gs, &mut q, &mut s);
        let mut deq = vec![0.0; w.len()];
        dequantize_q8(&q, &s, gs, &mut deq);
        let tokens = [4u32, 0, 4, 2];
        let mut out = vec![0.0; tokens.len() * cols];
        let table = TensorData::from(Q8 {
            q: &q,
            scales: &s,
            group_size: gs,
        });
        embed(&mut out, &table, &tokens, cols);
        for (t, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            assert_eq!(
                out[t * cols..(t + 1) * cols],
                deq[tok * cols..(tok + 1) * cols]
            );
        }
    }

    #[test]
    fn bf16_rows_are_the_upper_halves() {
        let bits: Vec<u16> = vec![0x3f80, 0x4000, 0xc040, 0x0000];
        let mut out = vec![0.0; 2];
        embed(&mut out, &TensorData::from_bf16(&bits), &[1], 2);
        assert_eq!(out, [-3.0, 0.0]);
        embed(&mut out, &TensorData::from_bf16(&bits), &[0], 2);
        assert_eq!(out, [1.0, 2.0]);
    }
}
