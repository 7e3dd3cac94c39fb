//! An embedding model's vector (Qwen3-Embedding): the last token's output row, made unit length,
//! and cut to fewer dimensions when a client asks (Matryoshka representation learning: the model
//! is trained so that a prefix of its vector is itself a good embedding).
//!
//! The engine pools (engine/mod.rs, an embedding request's last row); the server's
//! `/v1/embeddings` and `qwen3 embed` truncate.

/// The vector of an embedding model's last token's output row: as it is, or divided by its
/// length (sentence-transformers' `Normalize`: `x / max(|x|, 1e-12)`, as torch's `F.normalize`).
pub fn pooled(row: &[f32], normalize: bool) -> Vec<f32> {
    if !normalize {
        return row.to_vec();
    }
    let scale = 1.0 / length(row).max(1e-12);
    row.iter().map(|&x| (x as f64 * scale) as f32).collect()
}

/// The first `n` values of `v`, scaled back to length 1 (OpenAI's `dimensions`; Qwen3-Embedding's
/// model card cuts and normalises the same way).
pub fn truncate(v: &mut Vec<f32>, n: usize) {
    v.truncate(n);
    let scale = 1.0 / length(v).max(1e-12);
    for x in v.iter_mut() {
        *x = (*x as f64 * scale) as f32;
    }
}

/// The Euclidean length of `v`, summed in f64.
fn length(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_and_truncation_give_unit_vectors() {
        assert_eq!(pooled(&[3.0, 4.0], false), vec![3.0, 4.0]);
        assert_eq!(pooled(&[3.0, 4.0], true), vec![0.6, 0.8]);
        // A zero row stays zero (the 1e-12 floor), not NaN.
        assert_eq!(pooled(&[0.0, 0.0], true), vec![0.0, 0.0]);
        let mut v = vec![3.0, 4.0, 12.0];
        truncate(&mut v, 2);
        assert_eq!(v, vec![0.6, 0.8]);
    }
}
