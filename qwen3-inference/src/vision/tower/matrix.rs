//! The tower's matrices as the model file stores them, copied out of the mapping once at load
//! (the tower outlives no file, and owns what it reads), in the file's dtype, whatever it is
//! (`format::view::OwnedTensorData`), with a second copy in the order this CPU's kernels read
//! where they read one of their own (`kernels/dot/interleaved.rs`). The products then run on the
//! same kernels as the text model's, in the file's dtype: a bf16 or q8 tower is 3 times faster
//! than one widened to f32 (docs/vision.md) and takes a half or a quarter of the memory.

use crate::format::view::{OwnedTensorData, TensorData, TensorView};
use crate::kernels::dot::interleaved;

/// One matrix, owned, in the file's dtype: `data` in the file's order, `kernel` the same values
/// in the kernels' order where that differs.
#[derive(Clone, Debug)]
pub struct Matrix {
    data: OwnedTensorData,
    kernel: Option<OwnedTensorData>,
}

impl Matrix {
    /// A copy of matrix `t` (`[rows, cols]`, in the file's order).
    pub fn copy_of(t: &TensorView) -> Matrix {
        let cols = t.shape.last().copied().unwrap_or(1) as usize;
        Matrix {
            data: t.data.to_owned_data(),
            kernel: interleaved::for_kernels(&t.data, cols),
        }
    }

    /// A matrix of f32 values (a checkpoint's, read by a test).
    pub fn from_f32(values: &[f32]) -> Matrix {
        Matrix {
            data: TensorData::from_f32(values).to_owned_data(),
            kernel: None,
        }
    }

    /// Its first `n` values as f32 (a bias, a norm, the position table).
    pub fn into_f32(self, n: usize) -> Vec<f32> {
        let data = self.data.data();
        (0..n).map(|i| data.value(i)).collect()
    }

    /// The matrix as the kernels take a weight of `shape` (`[rows, cols]`).
    pub fn view<'a>(&'a self, shape: &'a [u64; 2]) -> TensorView<'a> {
        TensorView {
            name: "vision tower",
            shape,
            data: self.data.data(),
            interleaved: self.kernel.as_ref().map(|k| k.data()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_q4, quantize_q6, quantize_q8, Q4, Q6, Q8};

    /// Each stored form multiplies as its f32 values do (within the activations' rounding), and
    /// reads back value for value.
    #[test]
    fn each_dtype_multiplies_as_its_values() {
        let (rows, cols, n) = (8usize, 64usize, 3usize);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 60.0)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 50.0)
            .collect();
        let shape = [rows as u64, cols as u64];
        let mut q = vec![0i8; w.len()];
        let mut s8 = vec![0f32; w.len() / 32];
        quantize_q8(&w, 32, &mut q, &mut s8);
        let mut p4 = vec![0u8; w.len() / 2];
        let mut s4 = vec![0u16; w.len() / 32];
        quantize_q4(&w, 32, &mut p4, &mut s4);
        let mut p6 = vec![0u8; w.len() / 4 * 3];
        let mut s6 = vec![0u16; w.len() / 32];
        quantize_q6(&w, cols, 32, &mut p6, &mut s6);
        let bf16: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let stored = [
            TensorData::from_f32(&w),
            TensorData::from_bf16(&bf16),
            TensorData::from(Q6 {
                packed: &p6,
                scales: &s6,
                group_size: 32,
                cols,
            }),
            TensorData::from(Q8 {
                q: &q,
                scales: &s8,
                group_size: 32,
            }),
            TensorData::from(Q4 {
                packed: &p4,
                scales: &s4,
                group_size: 32,
            }),
        ];
        for data in stored {
            let file = TensorView {
                name: "w",
                shape: &shape,
                data,
                interleaved: None,
            };
            let m = Matrix::copy_of(&file);
            let v = m.view(&shape);
            let values: Vec<f32> = (0..w.len())
                .map(|i| crate::backend::weight(&v, i))
                .collect();
            let want: Vec<f32> = (0..w.len())
                .map(|i| crate::backend::weight(&file, i))
                .collect();
            assert_eq!(values, want);
            let mut y = vec![0f32; n * rows];
            crate::kernels::matmul(&mut y, &x, &v, n);
            for (r, yr) in y.chunks_exact(rows).enumerate() {
                for (o, &got) in yr.iter().enumerate() {
                    let exact: f32 = (0..cols)
                        .map(|c| x[r * cols + c] * want[o * cols + c])
                        .sum();
                    // Quantized weights meet quantized activations (W8A8): within 2%.
                    assert!(
                        (got - exact).abs() < 0.02 * (1.0 + exact.abs()),
                        "{got} {exact}"
                    );
                }
            }
        }
    }
}
