//! The list of dtypes ([`DType`]: how a tensor's values are stored), and every fact the file
//! format knows of each, in one table ([`TABLE`]): its code in a file, the format version that
//! brought it, its name, and how its values and scales are laid out. Where each dtype's other
//! parts live, and what adding one takes, is ARCHITECTURE.md's "A dtype".

use super::align_up;

/// How a tensor's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE f32, 4 bytes a value. Norm weights always; matrices with `--dtype f32`.
    F32,
    /// bfloat16 (the top 16 bits of an f32), 2 bytes a value.
    Bf16,
    /// Group-wise symmetric INT8: 1 byte a value plus one f32 scale per `group_size` values.
    Q8,
    /// Group-wise symmetric 4-bit: two values a byte plus one f16 scale per `group_size` values
    /// (`quant::quantize_q4`). A q4 file keeps some tensors in q6 or q8 ([`Q4Mix`](super::Q4Mix)).
    Q4,
    /// Group-wise symmetric 6-bit: three bytes for four values plus one f16 scale per
    /// `group_size` values (`quant::quantize_q6`). Only inside q4 files, not a file's dtype.
    Q6,
    /// One of GGUF's K-quants ([`KQuant`]: Q4_K, Q5_K, Q6_K), its blocks of 256 weights as
    /// llama.cpp writes them, each holding its own scales (`gguf/blocks.rs` draws them). Only in
    /// a GGUF file, read where it lies; `group_size` is the block's 256.
    K(KQuant),
}

/// How a dtype's values lie in the data section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Each value in `bytes` bytes, no scales (f32, bf16).
    Plain { bytes: u64 },
    /// Groups of `group_size` values, `num / den` bytes a value, and after the values (padded
    /// to [`super::ALIGN`]) one scale of `scale_bytes` a group; a group size must be a multiple
    /// of `multiple` (q4 packs pairs, q6 runs of 32).
    Grouped {
        num: u64,
        den: u64,
        scale_bytes: u64,
        multiple: u64,
    },
    /// GGUF's K-quants: blocks of [`K_BLOCK`] weights that hold their own scales, of the bytes
    /// [`KQuant::block_bytes`] says for the dtype's kind.
    Blocks,
}

/// One dtype's facts.
pub(crate) struct Facts {
    pub dtype: DType,
    /// Its code in a file's tensor table.
    pub code: u8,
    /// The format version that brought it: a file of an older version holding it is refused.
    pub since_version: u32,
    /// Its name (`--dtype`, `qwen3 info`); ggml's for the K-quants.
    pub name: &'static str,
    /// Whether a user names it as an export's dtype or a mix's part (`--dtype`, `--tables`): the
    /// K-quants come only from GGUF files.
    pub user_named: bool,
    pub layout: Layout,
}

/// Every dtype, the finest first: one row each.
pub(crate) const TABLE: [Facts; 8] = [
    Facts {
        dtype: DType::F32,
        code: 0,
        since_version: 1,
        name: "f32",
        user_named: true,
        layout: Layout::Plain { bytes: 4 },
    },
    Facts {
        dtype: DType::Bf16,
        code: 1,
        since_version: 1,
        name: "bf16",
        user_named: true,
        layout: Layout::Plain { bytes: 2 },
    },
    Facts {
        dtype: DType::Q8,
        code: 2,
        since_version: 1,
        name: "q8",
        user_named: true,
        // f32 scales.
        layout: Layout::Grouped {
            num: 1,
            den: 1,
            scale_bytes: 4,
            multiple: 1,
        },
    },
    // A GGUF's blocks, read where they lie, and copied as they are by `qwen3 export FILE.gguf`.
    Facts {
        dtype: DType::K(KQuant::Q6K),
        code: 6,
        since_version: 9,
        name: "Q6_K",
        user_named: false,
        layout: Layout::Blocks,
    },
    Facts {
        dtype: DType::Q6,
        code: 4,
        since_version: 4,
        name: "q6",
        user_named: true,
        // Four values in three bytes, f16 scales.
        layout: Layout::Grouped {
            num: 3,
            den: 4,
            scale_bytes: 2,
            multiple: 32,
        },
    },
    Facts {
        dtype: DType::K(KQuant::Q5K),
        code: 7,
        since_version: 9,
        name: "Q5_K",
        user_named: false,
        layout: Layout::Blocks,
    },
    Facts {
        dtype: DType::K(KQuant::Q4K),
        code: 5,
        since_version: 9,
        name: "Q4_K",
        user_named: false,
        layout: Layout::Blocks,
    },
    Facts {
        dtype: DType::Q4,
        code: 3,
        since_version: 3,
        name: "q4",
        user_named: true,
        // Two values a byte, f16 scales.
        layout: Layout::Grouped {
            num: 1,
            den: 2,
            scale_bytes: 2,
            multiple: 2,
        },
    },
];

/// GGUF's K-quants: blocks of 256 weights that hold their own scales (`gguf/blocks.rs` draws
/// each), read where the GGUF holds them (`kernels/dot/k_quants.rs`). A file's dtype
/// [`DType::K`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    /// 256 weights in 144 bytes, `w = (d * sc) * q - dmin * m` per sub-block of 32.
    Q4K,
    /// Q4_K with a fifth bit a weight: 256 weights in 176 bytes.
    Q5K,
    /// 256 weights in 210 bytes, `w = (d * sc) * (q - 32)` per sub-block of 16.
    Q6K,
}

impl KQuant {
    /// Bytes of a block: `d`, `dmin`, 12 scale bytes, (Q5_K: 32 bytes of fifth bits,) 128 of
    /// nibbles; Q6_K: 128 bytes of low bits, 64 of high bits, 16 scales, `d`.
    pub const fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => 144,
            KQuant::Q5K => 176,
            KQuant::Q6K => 210,
        }
    }

    /// Bytes of a row of `cols` weights (whole blocks).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / K_BLOCK as usize * self.block_bytes()
    }

    /// ggml's name of the type (its row's in [`TABLE`]).
    pub fn name(self) -> &'static str {
        DType::K(self).name()
    }
}

impl DType {
    /// Every dtype, the finest first.
    pub const ALL: [DType; 8] = {
        let mut all = [DType::F32; 8];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].dtype;
            i += 1;
        }
        all
    };

    /// This dtype's row of [`TABLE`].
    pub(crate) fn facts(self) -> &'static Facts {
        TABLE
            .iter()
            .find(|f| f.dtype == self)
            .expect("every dtype has a row")
    }

    pub fn code(self) -> u8 {
        self.facts().code
    }

    /// The format version that brought this dtype: a file of an older version holding it is
    /// refused.
    pub fn since_version(self) -> u32 {
        self.facts().since_version
    }

    pub fn from_code(code: u8) -> Option<DType> {
        TABLE.iter().find(|f| f.code == code).map(|f| f.dtype)
    }

    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// Bytes of one group's scale, stored after the values (q8: an f32, 4; q4 and q6: an f16,
    /// 2); `None` for a dtype without group scales (f32, bf16, and the K-quants, whose blocks
    /// hold theirs). Read from the dtype's [`TABLE`] row (`Layout::Grouped`).
    pub fn scale_bytes(self) -> Option<u64> {
        match self.facts().layout {
            Layout::Grouped { scale_bytes, .. } => Some(scale_bytes),
            Layout::Plain { .. } | Layout::Blocks => None,
        }
    }

    /// Whether a tensor of this dtype has a scale per group of `group_size` values
    /// ([`Self::scale_bytes`]): q8, q4, q6.
    pub fn grouped(self) -> bool {
        self.scale_bytes().is_some()
    }

    /// GGUF's K-quants, whose blocks of 256 weights hold their own scales ([`KQuant`]).
    pub fn is_k_quant(self) -> bool {
        self.k_quant().is_some()
    }

    /// Which K-quant this is, if it is one.
    pub fn k_quant(self) -> Option<KQuant> {
        match self {
            DType::K(k) => Some(k),
            _ => None,
        }
    }

    /// The file dtypes a user names (`--dtype`): the K-quants come only from GGUF files.
    pub fn parse(s: &str) -> Option<DType> {
        TABLE
            .iter()
            .find(|f| f.user_named && f.name == s)
            .map(|f| f.dtype)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes of the values of `numel` weights stored as `dtype`, without q8's, q4's and q6's scales
/// (a K-quant's whole blocks, scales and all). `None` on overflow.
pub fn value_bytes(dtype: DType, numel: u64) -> Option<u64> {
    match dtype.facts().layout {
        Layout::Plain { bytes } => numel.checked_mul(bytes),
        Layout::Grouped { num, den, .. } => Some(numel / den * num),
        Layout::Blocks => (numel / K_BLOCK).checked_mul(dtype.k_quant()?.block_bytes() as u64),
    }
}

/// Weights in a block of GGUF's K-quants ([`KQuant`]); their `group_size`.
pub const K_BLOCK: u64 = 256;

/// Bytes a tensor of `dtype` and `shape` occupies in the data section (q8, q4, q6: values, padding
/// to [`super::ALIGN`], scales; a K-quant: its blocks, `group_size` [`K_BLOCK`] and rows of whole
/// blocks). `None` when the shape overflows or the group size does not fit it.
pub fn tensor_nbytes(dtype: DType, shape: &[u64], group_size: u32) -> Option<u64> {
    let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    let gs = group_size as u64;
    match dtype.facts().layout {
        // A rank-0 f32 or bf16 tensor is one value.
        Layout::Plain { .. } => value_bytes(dtype, numel),
        Layout::Blocks => {
            let cols = *shape.last()?;
            (gs == K_BLOCK && cols.is_multiple_of(K_BLOCK)).then(|| value_bytes(dtype, numel))?
        }
        Layout::Grouped {
            scale_bytes,
            multiple,
            ..
        } => {
            let cols = *shape.last()?;
            if gs == 0 || !gs.is_multiple_of(multiple) || !cols.is_multiple_of(gs) {
                return None;
            }
            align_up(value_bytes(dtype, numel)?)?
                .checked_add((numel / gs).checked_mul(scale_bytes)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_dtype_and_one_code_each() {
        for (i, f) in TABLE.iter().enumerate() {
            assert_eq!(DType::from_code(f.code), Some(f.dtype), "{}", f.name);
            assert_eq!(DType::ALL[i], f.dtype);
            assert_eq!(f.dtype.facts().name, f.name);
            assert!(TABLE.iter().filter(|g| g.code == f.code).count() == 1);
            assert!(TABLE.iter().filter(|g| g.dtype == f.dtype).count() == 1);
            assert_eq!(DType::parse(f.name).is_some(), f.user_named);
            // A K-quant's kind is its dtype's, and its layout blocks.
            assert_eq!(f.layout == Layout::Blocks, f.dtype.k_quant().is_some());
            if let Some(k) = f.dtype.k_quant() {
                assert_eq!(k.name(), f.name);
            }
        }
        assert_eq!(DType::from_code(8), None);
        // The sizes the file format has always had.
        assert_eq!(value_bytes(DType::Q6, 128), Some(96));
        assert_eq!(value_bytes(DType::Q4, 128), Some(64));
        assert_eq!(tensor_nbytes(DType::Q8, &[2, 64], 32), Some(128 + 4 * 4));
        assert_eq!(tensor_nbytes(DType::Q4, &[2, 64], 32), Some(64 + 4 * 2));
        assert_eq!(tensor_nbytes(DType::Q6, &[2, 64], 16), None);
        assert_eq!(
            tensor_nbytes(DType::K(KQuant::Q4K), &[2, 256], 256),
            Some(2 * 144)
        );
        assert_eq!(tensor_nbytes(DType::F32, &[], 0), Some(4));
        assert_eq!(tensor_nbytes(DType::Q8, &[], 32), None);
    }
}
