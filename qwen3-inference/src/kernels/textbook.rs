//! The few formulas the textbook forms (`delta_rule.rs`, `delta_net.rs`, and the model's
//! `gated_delta_net.rs` and `gated_attention.rs`) share, in plain loops.

/// `a . b`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `w x` for `w: [rows, x.len()]`.
pub fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len()).map(|row| dot(row, x)).collect()
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)` (SiLU).
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `1 / sqrt(mean(x^2) + eps)`: what an RMSNorm multiplies `x` by before its gain.
pub fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (ms + eps).sqrt()
}
