//! The reader on files built here byte by byte: one that reads back as written, and every way
//! of damaging it refused by name (every truncation too), never a panic.

use super::*;

/// A GGUF file's bytes, written as the layout in the module's text says.
#[derive(Default)]
struct Builder {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Builder {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn kv(mut self, key: &str, ty: u32, value: &[u8]) -> Self {
        Self::string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }
    fn kv_str(self, key: &str, value: &str) -> Self {
        let mut v = Vec::new();
        Self::string(&mut v, value);
        self.kv(key, 8, &v)
    }
    /// A tensor of `ty` and `dims`, its bytes `fill`, at the next aligned offset of the data.
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, nbytes: usize, fill: u8) -> Self {
        let offset = self.data.len().next_multiple_of(32);
        self.data.resize(offset, 0);
        self.data.extend(std::iter::repeat_n(fill, nbytes));
        Self::string(&mut self.tensors, name);
        self.tensors.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.tensors.extend(d.to_le_bytes());
        }
        self.tensors.extend(ty.to_le_bytes());
        self.tensors.extend((offset as u64).to_le_bytes());
        self.n_tensors += 1;
        self
    }
    fn bytes(&self, version: u32) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.tensors);
        out.resize(out.len().next_multiple_of(32), 0);
        out.extend(&self.data);
        out
    }
}

/// Two tensors (an F32 vector and a Q8_0 matrix of 2 rows of 64) and metadata of several types.
fn sample() -> Builder {
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend(2u64.to_le_bytes());
    for t in ["a", "bc"] {
        Builder::string(&mut tokens, t);
    }
    Builder::default()
        .kv_str("general.architecture", "qwen3")
        .kv("qwen3.block_count", 4, &28u32.to_le_bytes())
        .kv("qwen3.rope.freq_base", 6, &1e6f32.to_le_bytes())
        .kv("tokenizer.ggml.tokens", 9, &tokens)
        .kv("tokenizer.ggml.add_bos_token", 7, &[0])
        .tensor("output_norm.weight", &[64], 0, 256, 1)
        .tensor("token_embd.weight", &[64, 2], 8, 2 * 2 * 34, 2)
}

#[test]
fn reads_back_what_was_written() {
    for version in [2, 3] {
        let bytes = sample().bytes(version);
        let h = parse(&bytes).unwrap();
        assert_eq!(h.version, version);
        assert_eq!(h.architecture(), Some("qwen3"));
        assert_eq!(h.get("qwen3.block_count").and_then(Value::as_u64), Some(28));
        assert_eq!(h.get("qwen3.rope.freq_base"), Some(&Value::F32(1e6)));
        assert_eq!(
            h.get("tokenizer.ggml.tokens"),
            Some(&Value::Array(vec![
                Value::Str("a".into()),
                Value::Str("bc".into())
            ]))
        );
        assert_eq!(
            h.get("tokenizer.ggml.add_bos_token"),
            Some(&Value::Bool(false))
        );
        let [norm, embd] = &h.tensors[..] else {
            panic!("{:?}", h.tensors)
        };
        assert_eq!((norm.ggml_type.name, norm.nbytes), ("F32", 256));
        assert_eq!(
            (embd.ggml_type.name, embd.nbytes, &embd.dims[..]),
            ("Q8_0", 136, &[64, 2][..])
        );
        assert!(h.data_start.is_multiple_of(32));
        assert!(bytes[norm.start as usize..][..256].iter().all(|&b| b == 1));
        assert!(bytes[embd.start as usize..][..136].iter().all(|&b| b == 2));
    }
}

/// Every prefix of a good file is refused as truncated (or, within the magic, as not GGUF).
#[test]
fn every_truncation_is_refused() {
    let bytes = sample().bytes(3);
    for n in 0..bytes.len() {
        let err = format!("{:#}", parse(&bytes[..n]).unwrap_err());
        assert!(
            err.contains("truncated")
                || err.contains("more than the")
                || (n < 4 && err.contains("truncated")),
            "{n}: {err}"
        );
    }
}

/// What a damaged header says.
#[test]
fn damage_is_named() {
    let refused = |bytes: Vec<u8>, want: &str| {
        let err = format!("{:#}", parse(&bytes).unwrap_err());
        assert!(err.contains(want), "expected {want:?} in {err:?}");
    };
    refused(b"GGML\x03\0\0\0".to_vec(), "not a GGUF file");
    refused(sample().bytes(1), "GGUF version 1");
    // A tensor type ggml does not define, and one it removed (Q4_2).
    refused(
        Builder::default().tensor("t", &[32], 99, 4, 0).bytes(3),
        "unknown ggml type 99",
    );
    refused(
        Builder::default().tensor("t", &[32], 4, 4, 0).bytes(3),
        "unknown ggml type 4",
    );
    // Rows that no whole number of Q4_K blocks (256 values) tiles.
    refused(
        Builder::default()
            .tensor("blk.0.attn_q.weight", &[64, 64], 12, 4096, 0)
            .bytes(3),
        "blk.0.attn_q.weight: rows of 64 values, not a whole number of Q4_K's blocks of 256",
    );
    // A tensor whose bytes run past the end (its dims say more than was written).
    refused(
        Builder::default()
            .tensor("t", &[64, 1000], 0, 256, 0)
            .bytes(3),
        "truncated: t (F32 [64, 1000]",
    );
    refused(
        Builder::default()
            .tensor("t", &[u64::MAX, 4], 0, 4, 0)
            .bytes(3),
        "overflows",
    );
    refused(
        Builder::default().tensor("t", &[], 0, 0, 0).bytes(3),
        "0 dimensions",
    );
    refused(
        Builder::default().kv("b", 7, &[2]).bytes(3),
        "b: bool byte 2, expected 0 or 1",
    );
    refused(
        Builder::default().kv("x", 13, &[]).bytes(3),
        "x: unknown value type 13",
    );
    refused(
        Builder::default()
            .kv("k", 0, &[1])
            .kv("k", 0, &[2])
            .bytes(3),
        "metadata key k twice",
    );
    refused(
        Builder::default()
            .kv("general.alignment", 4, &24u32.to_le_bytes())
            .bytes(3),
        "general.alignment",
    );
    // A count far beyond the file: refused before anything is allocated for it.
    let mut huge = sample().bytes(3);
    huge[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    refused(huge, "the tensor count 1152921504606846976: more than the");
    let mut array = 0u32.to_le_bytes().to_vec();
    array.extend((1u64 << 62).to_le_bytes());
    refused(
        Builder::default().kv("a", 9, &array).bytes(3),
        "a 4611686018427387904: more than the",
    );
}

/// The type table matches gguf-py's sizes for the types the hub's Qwen files use.
#[test]
fn block_sizes_are_ggmls() {
    let size = |name: &str| {
        let t = GGML_TYPES.iter().find(|t| t.name == name).unwrap();
        (t.block_values, t.block_bytes)
    };
    assert_eq!(size("Q8_0"), (32, 34));
    assert_eq!(size("Q4_0"), (32, 18));
    assert_eq!(size("Q4_K"), (256, 144));
    assert_eq!(size("Q5_K"), (256, 176));
    assert_eq!(size("Q6_K"), (256, 210));
    assert_eq!(size("IQ4_XS"), (256, 136));
    assert_eq!(size("BF16"), (1, 2));
    let mut ids: Vec<u32> = GGML_TYPES.iter().map(|t| t.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), GGML_TYPES.len(), "ids in order, each once");
}

/// The dequantization goldens (fixtures/gguf/dequant-reference.json, written by
/// scripts/make_gguf_fixtures.py with gguf-py): per case, the ggml type's name, the blocks' bytes
/// and the f32 bits gguf-py dequantizes them to. Also read by `repack.rs`'s tests.
pub(super) fn dequant_reference_cases() -> Vec<(String, Vec<u8>, Vec<u32>)> {
    let reference: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../fixtures/gguf/dequant-reference.json"
    ))
    .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    cases
        .iter()
        .map(|case| {
            let hex = case["bytes"].as_str().unwrap();
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let bits: Vec<u32> = case["f32_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (case["type"].as_str().unwrap().to_string(), bytes, bits)
        })
        .collect()
}

/// Each block type the hub's Qwen GGUFs use, dequantized here and by gguf-py
/// (fixtures/gguf/dequant-reference.json, scripts/make_gguf_fixtures.py): the same f32 bits.
#[test]
fn dequantization_gives_gguf_pys_bits() {
    let cases = dequant_reference_cases();
    assert_eq!(cases.len(), 8);
    for (name, bytes, want) in &cases {
        let ty = *GGML_TYPES.iter().find(|t| t.name == name).unwrap();
        let mut got = vec![f32::NAN; want.len()];
        blocks::dequantize(ty, bytes, &mut got).unwrap();
        for (i, (g, &w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w,
                "{name} value {i}: {g} vs {}",
                f32::from_bits(w)
            );
        }
    }
    // A type not read yet is named, with the list of those that are.
    let iq = *GGML_TYPES.iter().find(|t| t.name == "IQ4_XS").unwrap();
    let err = blocks::dequantize(iq, &[0; 136], &mut [0.0; 256]).unwrap_err();
    assert!(
        err.to_string()
            .contains("IQ4_XS is not read yet; these are: F32, F16, BF16, Q8_0"),
        "{err}"
    );
}

mod converted;
mod opened;
mod split;
