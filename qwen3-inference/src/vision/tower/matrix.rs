//! The tower's matrices as the model file stores them, copied out of the mapping once at load
//! (the tower outlives no file, and owns what it reads): f32, bf16, q8, or q4/q6 with the copy
//! in the order this CPU's kernels read. The products then run on the same kernels as the text
//! model's, in the file's dtype: a bf16 or q8 tower is 3 times faster than one widened to f32
//! (docs/vision.md) and takes a half or a quarter of the memory.

use crate::format::view::{TensorData, TensorView};
use crate::format::DType;
use crate::kernels::dot::{dots, interleaved};
use crate::quant::{Q4, Q6, Q8};

/// One matrix, owned, in the file's dtype.
#[derive(Clone, Debug)]
pub enum Matrix {
    F32(Vec<f32>),
    /// bfloat16 bit patterns.
    Bf16(Vec<u16>),
    /// int8 values, a scale per group of `group_size` (`quant::quantize_q8`); `kernel`: the
    /// same values in the order the kernels read (`kernels/dot/interleaved.rs`), when that
    /// order differs.
    Q8 {
        q: Vec<i8>,
        kernel: Option<Vec<i8>>,
        scales: Vec<f32>,
        group_size: usize,
    },
    /// q4 (or q6, `six`) values packed as the file packs them, `cols` to a row; `kernel`: the
    /// same values in the order the kernels read (`kernels/dot/interleaved.rs`), when that order
    /// differs.
    Packed {
        six: bool,
        packed: Vec<u8>,
        kernel: Option<Vec<u8>>,
        scales: Vec<u16>,
        group_size: usize,
        cols: usize,
    },
}

impl Matrix {
    /// A copy of matrix `t` (`[rows, cols]`). GGUF's K-quants (a GGUF file has no tower today)
    /// are widened to f32.
    pub fn copy_of(t: &TensorView) -> Matrix {
        let cols = t.shape.last().copied().unwrap_or(1) as usize;
        match t.data.dtype() {
            DType::F32 => Matrix::F32(t.data.f32().to_vec()),
            DType::Bf16 => Matrix::Bf16(t.data.bf16().to_vec()),
            DType::Q8 => {
                let Q8 {
                    q,
                    scales,
                    group_size,
                } = t.data.q8();
                Matrix::Q8 {
                    q: q.to_vec(),
                    kernel: (dots().q8_interleaved.is_some()
                        && interleaved::interleaves_q8(group_size))
                    .then(|| interleaved::q8_for_kernels(dots(), q, cols, group_size)),
                    scales: scales.to_vec(),
                    group_size,
                }
            }
            DType::Q4 => {
                let Q4 {
                    packed,
                    scales,
                    group_size,
                } = t.data.q4();
                Matrix::packed(false, packed, scales, group_size, cols)
            }
            DType::Q6 => {
                let Q6 {
                    packed,
                    scales,
                    group_size,
                    cols,
                } = t.data.q6();
                Matrix::packed(true, packed, scales, group_size, cols)
            }
            DType::K(_) => {
                let n: u64 = t.shape.iter().product();
                Matrix::F32((0..n as usize).map(|i| t.data.value(i)).collect())
            }
        }
    }

    fn packed(six: bool, packed: &[u8], scales: &[u16], gs: usize, cols: usize) -> Matrix {
        let layout = dots().q4_layout;
        let kernel = (layout.interleaves() && interleaved::interleaves(gs))
            .then(|| interleaved::packed_for_kernels(layout, six, packed, cols, gs));
        Matrix::Packed {
            six,
            packed: packed.to_vec(),
            kernel,
            scales: scales.to_vec(),
            group_size: gs,
            cols,
        }
    }

    /// Its first `n` values as f32 (a bias, a norm, the position table).
    pub fn into_f32(self, n: usize) -> Vec<f32> {
        match self {
            Matrix::F32(v) => v,
            m => {
                let shape = [1, n as u64];
                let v = m.view(&shape);
                (0..n).map(|i| v.data.value(i)).collect()
            }
        }
    }

    /// The matrix as the kernels take a weight of `shape` (`[rows, cols]`).
    pub fn view<'a>(&'a self, shape: &'a [u64; 2]) -> TensorView<'a> {
        let (data, interleaved) = match self {
            Matrix::F32(v) => (TensorData::from_f32(v), None),
            Matrix::Bf16(v) => (TensorData::from_bf16(v), None),
            Matrix::Q8 {
                q,
                kernel,
                scales,
                group_size,
            } => {
                let data = |q| {
                    TensorData::from(Q8 {
                        q,
                        scales,
                        group_size: *group_size,
                    })
                };
                (data(q), kernel.as_deref().map(data))
            }
            Matrix::Packed {
                six,
                packed,
                kernel,
                scales,
                group_size,
                cols,
            } => {
                let data = |packed| match six {
                    true => TensorData::from(Q6 {
                        packed,
                        scales,
                        group_size: *group_size,
                        cols: *cols,
                    }),
                    false => TensorData::from(Q4 {
                        packed,
                        scales,
                        group_size: *group_size,
                    }),
                };
                (data(packed), kernel.as_deref().map(data))
            }
        };
        TensorView {
            name: "vision tower",
            shape,
            data,
            interleaved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_q4, quantize_q8};

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
        let stored = [
            TensorData::from_f32(&w),
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
