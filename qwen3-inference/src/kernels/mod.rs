//! Matrix-vector and matrix-matrix products for q8, bf16 and f32 weights. (Placeholder.)

pub mod dot;
