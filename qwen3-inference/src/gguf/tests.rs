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
        "../../../fixtures/gguf/dequant-reference.json"
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

/// llama.cpp's converter's GGUF of tiny-f32-tied-gqa2 (fixtures/gguf/, f32) read as a model:
/// the config config.json gives, and every tensor of the model file under its own name and
/// shape, each once.
#[test]
fn a_converted_checkpoint_reads_as_its_config_says() {
    use crate::format::{expected_tensors, DType};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let file = GgufFile::open(&root.join("gguf/tiny-f32-tied-gqa2-f32.gguf")).unwrap();
    let hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/tiny-f32-tied-gqa2/config.json")).unwrap(),
    )
    .unwrap();
    let c = model::model_config(file.header()).unwrap();
    let n = |k: &str| hf[k].as_u64().unwrap() as u32;
    assert_eq!(c.architecture, hf["architectures"][0].as_str().unwrap());
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (
            n("hidden_size"),
            n("intermediate_size"),
            n("num_hidden_layers")
        )
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (
            n("num_attention_heads"),
            n("num_key_value_heads"),
            n("head_dim")
        )
    );
    assert_eq!(
        (c.vocab_size, c.max_position_embeddings),
        (n("vocab_size"), n("max_position_embeddings"))
    );
    // The file holds both as f32: equal once rounded to f32, as the forward pass uses them.
    assert_eq!(
        c.rope_theta as f32,
        hf["rope_theta"].as_f64().unwrap() as f32
    );
    assert_eq!(
        c.rms_norm_eps as f32,
        hf["rms_norm_eps"].as_f64().unwrap() as f32
    );
    assert_eq!(
        c.tie_word_embeddings,
        hf["tie_word_embeddings"].as_bool().unwrap()
    );
    // generation_config.json's eos ids (the GGUF's eos and <|endoftext|>) and sampling defaults.
    let gen: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/tiny-f32-tied-gqa2/generation_config.json"))
            .unwrap(),
    )
    .unwrap();
    let eos: Vec<u32> = gen["eos_token_id"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(c.eos_token_ids, eos);
    assert_eq!(c.eos_token_ids[0], n("eos_token_id"));
    assert_eq!(
        (
            c.generation.temperature,
            c.generation.top_p,
            c.generation.top_k
        ),
        (
            Some(gen["temperature"].as_f64().unwrap() as f32),
            Some(gen["top_p"].as_f64().unwrap() as f32),
            Some(gen["top_k"].as_u64().unwrap() as u32)
        )
    );
    assert!(c.qk_norm && !c.attention_bias);
    // Every tensor the model file would hold, found once, with its shape.
    model::check_tensors(file.header(), &c).unwrap();
    let tensors = &file.header().tensors;
    for e in expected_tensors(&c) {
        let found: Vec<_> = tensors
            .iter()
            .filter(|t| names::hf_name(&t.name).as_deref() == Some(e.name.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "{}", e.name);
        assert_eq!(names::hf_shape(found[0]), e.shape, "{}", e.name);
        assert_eq!(found[0].ggml_type.name, "F32", "{}", e.name);
    }
    assert_eq!(tensors.len(), expected_tensors(&c).len());
    assert_eq!(c.dtype, DType::F32);
}

/// llama.cpp's `qwen35` and `qwen35moe` GGUFs of the Qwen3.5 fixtures read as their
/// config.json's `text_config` says: the MTP layer not counted, the hybrid layers from
/// `recurrent_layers`, the Gated DeltaNets' sizes from `ssm.*`, a quarter of each head rotated,
/// the value heads in the converter's tiled order, the shared expert; and every tensor found.
#[test]
fn converted_qwen3_5s_read_as_their_configs_say() {
    use crate::format::{LayerType, ValueHeads};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    for (name, gguf) in [
        ("tiny-qwen3_5-bf16", "tiny-qwen3_5-bf16-bf16.gguf"),
        (
            "tiny-qwen3_5moe-f32-sharded",
            "tiny-qwen3_5moe-f32-sharded-f32.gguf",
        ),
    ] {
        let file = GgufFile::open(&root.join("gguf").join(gguf)).unwrap();
        let hf: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("models").join(name).join("config.json")).unwrap(),
        )
        .unwrap();
        let t = &hf["text_config"];
        let n = |k: &str| t[k].as_u64().unwrap() as u32;
        let c = model::model_config(file.header()).unwrap();
        let moe = t.get("num_experts").is_some();
        let arch = match moe {
            true => "Qwen3_5MoeForCausalLM",
            false => "Qwen3_5ForCausalLM",
        };
        assert_eq!(c.architecture, arch, "{name}");
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.head_dim),
            (n("hidden_size"), n("num_hidden_layers"), n("head_dim")),
            "{name}"
        );
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads),
            (n("num_attention_heads"), n("num_key_value_heads")),
            "{name}"
        );
        assert_eq!(
            c.partial_rotary_factor,
            t["rope_parameters"]["partial_rotary_factor"]
                .as_f64()
                .unwrap(),
            "{name}"
        );
        assert!(
            c.attn_output_gate && c.qk_norm && !c.attention_bias,
            "{name}"
        );
        let la = c.linear_attention.as_ref().unwrap();
        let types: Vec<&str> = t["layer_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ours: Vec<&str> = la.layer_types.iter().map(|l| LayerType::name(*l)).collect();
        assert_eq!(ours, types, "{name}");
        assert_eq!(
            (
                la.linear_num_key_heads,
                la.linear_num_value_heads,
                la.linear_key_head_dim,
                la.linear_value_head_dim,
                la.linear_conv_kernel_dim
            ),
            (
                n("linear_num_key_heads"),
                n("linear_num_value_heads"),
                n("linear_key_head_dim"),
                n("linear_value_head_dim"),
                n("linear_conv_kernel_dim")
            ),
            "{name}"
        );
        assert_eq!(la.value_heads, ValueHeads::Tiled);
        match &c.moe {
            Some(m) => {
                assert!(moe && m.norm_topk_prob, "{name}");
                assert_eq!(
                    (
                        m.num_experts,
                        m.num_experts_per_tok,
                        m.moe_intermediate_size,
                        m.shared_expert_intermediate_size
                    ),
                    (
                        n("num_experts"),
                        n("num_experts_per_tok"),
                        n("moe_intermediate_size"),
                        n("shared_expert_intermediate_size")
                    ),
                    "{name}"
                );
            }
            None => {
                assert!(!moe, "{name}");
                assert_eq!(c.intermediate_size, n("intermediate_size"), "{name}");
            }
        }
        // Every tensor of the text model, once; the MTP layer's left out.
        let pieces = model::check_tensors(file.header(), &c).unwrap();
        assert_eq!(pieces.len(), crate::format::expected_tensors(&c).len());
        assert!(file
            .header()
            .tensors
            .iter()
            .any(|t| t.name.contains(".nextn.")));
    }
}

/// llama.cpp's converter's `qwen3next` GGUF of a Qwen3-Next whose layers are all sparse: the
/// config as HF's says (its keys at the top), the value heads in HF's order (the converter
/// reorders only Qwen3.5's), every layer with its router, and every tensor found (`ssm_ba` as
/// `in_proj_b` and `in_proj_a`).
#[test]
fn a_converted_qwen3_next_reads_as_its_config_says() {
    use crate::format::ValueHeads;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let file = GgufFile::open(&root.join("gguf/tiny-qwen3next-sparse-bf16-bf16.gguf")).unwrap();
    let hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/tiny-qwen3next-sparse-bf16/config.json"))
            .unwrap(),
    )
    .unwrap();
    let n = |k: &str| hf[k].as_u64().unwrap() as u32;
    let c = model::model_config(file.header()).unwrap();
    assert_eq!(c.architecture, "Qwen3NextForCausalLM");
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.intermediate_size),
        (
            n("hidden_size"),
            n("num_hidden_layers"),
            n("intermediate_size")
        )
    );
    assert_eq!(c.partial_rotary_factor, 0.25);
    let la = c.linear_attention.as_ref().unwrap();
    assert_eq!(la.value_heads, ValueHeads::Grouped);
    assert_eq!(
        (la.linear_num_key_heads, la.linear_num_value_heads),
        (n("linear_num_key_heads"), n("linear_num_value_heads"))
    );
    let m = c.moe.as_ref().unwrap();
    assert!(m.norm_topk_prob && m.mlp_only_layers.is_empty());
    assert_eq!(
        (m.num_experts, m.shared_expert_intermediate_size),
        (n("num_experts"), n("shared_expert_intermediate_size"))
    );
    let pieces = model::check_tensors(file.header(), &c).unwrap();
    assert_eq!(pieces.len(), crate::format::expected_tensors(&c).len());
    // An older converter's fused `ssm_in` in place of `attn_qkv`: refused by name, saying what
    // to do.
    let mut old = file.header().clone();
    let t = (old.tensors.iter_mut())
        .find(|t| t.name == "blk.0.attn_qkv.weight")
        .unwrap();
    t.name = "blk.0.ssm_in.weight".into();
    let e = model::check_tensors(&old, &c).unwrap_err().to_string();
    assert!(
        e.contains("blk.0.ssm_in.weight") && e.contains("convert the checkpoint again"),
        "{e}"
    );
}

/// Qwen3.5's pieces: a gated `attn_q` as every other run of `head_dim` rows (the query's, then
/// the gate's), `ssm_a` turned back into `A_log`, a multi-token-prediction layer's tensors left
/// out, and a block past them all unknown.
#[test]
fn qwen3_5_tensors_map_to_the_model_files() {
    let f32t = GGML_TYPES
        .iter()
        .copied()
        .find(|t| t.name == "F32")
        .unwrap();
    let names = names::Names {
        layers: 4,
        blocks: 5,
        gated_query_rows: Some(8),
        fused_ba_rows: Some(2),
    };
    // 2 heads of 8: rows 0-7 query, 8-15 gate, 16-23 query, 24-31 gate; 64 columns.
    let q = GgufTensor {
        name: "blk.3.attn_q.weight".into(),
        dims: vec![64, 32],
        ggml_type: f32t,
        start: 1024,
        nbytes: 32 * 64 * 4,
    };
    let pieces = names::pieces(&q, &names).unwrap();
    let row = 64 * 4;
    let rows = |p: &names::Piece| p.take.ranges(&q);
    assert_eq!(pieces[0].name, "model.layers.3.self_attn.q_proj.weight");
    assert_eq!(
        pieces[1].name,
        "model.layers.3.self_attn.output_gate.weight"
    );
    assert_eq!(pieces[0].shape, vec![16, 64]);
    assert_eq!(
        rows(&pieces[0]),
        [1024..1024 + 8 * row, 1024 + 16 * row..1024 + 24 * row]
    );
    assert_eq!(
        rows(&pieces[1]),
        [
            1024 + 8 * row..1024 + 16 * row,
            1024 + 24 * row..1024 + 32 * row
        ]
    );
    assert!(pieces.iter().all(|p| !p.take.in_place()));
    let a = GgufTensor {
        name: "blk.0.ssm_a".into(),
        dims: vec![4],
        nbytes: 16,
        ..q.clone()
    };
    let p = names::pieces(&a, &names).unwrap();
    assert_eq!(
        (p[0].name.as_str(), &p[0].take),
        ("model.layers.0.linear_attn.A_log", &names::Take::ALog)
    );
    // Block 4 is the MTP layer's; block 5 is past the file's blocks.
    for (name, n) in [
        ("blk.4.attn_q.weight", Some(0)),
        ("blk.4.nextn.eh_proj.weight", Some(0)),
    ] {
        let t = GgufTensor {
            name: name.into(),
            ..q.clone()
        };
        assert_eq!(names::pieces(&t, &names).map(|p| p.len()), n, "{name}");
    }
    let past = GgufTensor {
        name: "blk.5.nextn.eh_proj.weight".into(),
        ..q.clone()
    };
    assert_eq!(names::pieces(&past, &names), None);
    // Damage: a gated query of no rows or no bytes, an `ssm_a` not in F32: not mapped (refused
    // by name at open), never a division by zero or `-exp(A_log)` read as `A_log`.
    for (dims, nbytes) in [(vec![64, 0], 0), (vec![0, 32], 0), (vec![64, 32], 0)] {
        let t = GgufTensor {
            dims,
            nbytes,
            ..q.clone()
        };
        assert_eq!(names::pieces(&t, &names), None, "{:?}", t.dims);
    }
    let f16 = GGML_TYPES
        .iter()
        .copied()
        .find(|t| t.name == "F16")
        .unwrap();
    let a16 = GgufTensor {
        ggml_type: f16,
        nbytes: 8,
        ..a
    };
    assert_eq!(names::pieces(&a16, &names), None);
    // Qwen3-Next's fused `b` and `a` (2 key heads of 2 value heads): rows 0-1 b, 2-3 a, 4-5 b,
    // 6-7 a.
    let ba = GgufTensor {
        name: "blk.1.ssm_ba.weight".into(),
        dims: vec![64, 8],
        nbytes: 8 * 64 * 4,
        ..q.clone()
    };
    let p = names::pieces(&ba, &names).unwrap();
    let rows = |p: &names::Piece| p.take.ranges(&ba);
    assert_eq!(p[0].name, "model.layers.1.linear_attn.in_proj_b.weight");
    assert_eq!(p[1].name, "model.layers.1.linear_attn.in_proj_a.weight");
    assert_eq!((&p[0].shape, &p[1].shape), (&vec![4, 64], &vec![4, 64]));
    assert_eq!(
        rows(&p[0]),
        [1024..1024 + 2 * row, 1024 + 4 * row..1024 + 6 * row]
    );
    assert_eq!(
        rows(&p[1]),
        [
            1024 + 2 * row..1024 + 4 * row,
            1024 + 6 * row..1024 + 8 * row
        ]
    );
    // Rows that are not whole pairs of runs: not mapped.
    let odd = GgufTensor {
        dims: vec![64, 6],
        nbytes: 6 * 64 * 4,
        ..ba
    };
    assert_eq!(names::pieces(&odd, &names), None);
}

/// Names and refusals of the mapping.
/// A mixture of experts' stacked tensor (`[experts, rows, cols]`, ggml's dims the other way)
/// becomes one model-file tensor an expert, each the next run of its bytes; its router keeps its
/// own name.
#[test]
fn stacked_experts_split_into_the_model_files_per_expert_tensors() {
    let bf16 = GGML_TYPES
        .iter()
        .copied()
        .find(|t| t.name == "BF16")
        .unwrap();
    let t = GgufTensor {
        name: "blk.1.ffn_down_exps.weight".into(),
        dims: vec![32, 64, 8],
        ggml_type: bf16,
        start: 4096,
        nbytes: 32 * 64 * 8 * 2,
    };
    let names = names::Names {
        layers: 2,
        blocks: 2,
        gated_query_rows: None,
        fused_ba_rows: None,
    };
    let pieces = names::pieces(&t, &names).unwrap();
    assert_eq!(pieces.len(), 8);
    for (e, p) in pieces.iter().enumerate() {
        assert_eq!(
            p.name,
            format!("model.layers.1.mlp.experts.{e}.down_proj.weight")
        );
        assert_eq!(p.shape, vec![64, 32]);
        assert_eq!(
            p.take,
            names::Take::Bytes {
                offset: e as u64 * 4096,
                nbytes: 4096
            }
        );
    }
    assert_eq!(
        names::hf_name("blk.0.ffn_gate_inp.weight").as_deref(),
        Some("model.layers.0.mlp.gate.weight")
    );
    // Bytes that do not split into whole experts, or a stack of no experts: not a known name.
    assert_eq!(
        names::pieces(
            &GgufTensor {
                nbytes: 4095,
                ..t.clone()
            },
            &names
        ),
        None
    );
    assert_eq!(
        names::pieces(
            &GgufTensor {
                dims: vec![32, 64, 0],
                ..t
            },
            &names
        ),
        None
    );
}

#[test]
fn names_map_as_llama_cpp_writes_them() {
    for (gguf, hf) in [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
        (
            "blk.27.ffn_down.weight",
            "model.layers.27.mlp.down_proj.weight",
        ),
        (
            "blk.0.attn_k_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
        ),
        // Qwen3.5's.
        ("blk.0.ssm_a", "model.layers.0.linear_attn.A_log"),
        ("blk.0.ssm_dt.bias", "model.layers.0.linear_attn.dt_bias"),
        (
            "blk.0.attn_qkv.weight",
            "model.layers.0.linear_attn.in_proj_qkv.weight",
        ),
        (
            "blk.0.attn_gate.weight",
            "model.layers.0.linear_attn.in_proj_z.weight",
        ),
        (
            "blk.0.ssm_alpha.weight",
            "model.layers.0.linear_attn.in_proj_a.weight",
        ),
        (
            "blk.0.ssm_beta.weight",
            "model.layers.0.linear_attn.in_proj_b.weight",
        ),
        (
            "blk.0.ssm_out.weight",
            "model.layers.0.linear_attn.out_proj.weight",
        ),
        (
            "blk.1.post_attention_norm.weight",
            "model.layers.1.post_attention_layernorm.weight",
        ),
        (
            "blk.1.ffn_gate_inp_shexp.weight",
            "model.layers.1.mlp.shared_expert_gate.weight",
        ),
    ] {
        assert_eq!(names::hf_name(gguf).as_deref(), Some(hf), "{gguf}");
    }
    for other in [
        "blk.x.attn_q.weight",
        "blk.0.ssm_a.weight",
        "blk.0.attn_q.scale",
        "rope_freqs.weight",
    ] {
        assert_eq!(names::hf_name(other), None, "{other}");
    }
    let header = |arch: &str| {
        let b = Builder::default().kv_str("general.architecture", arch);
        parse(&b.bytes(3)).unwrap()
    };
    let err = model::model_config(&header("llama"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("GGUF architecture llama"), "{err}");
    let err = model::model_config(&header("qwen3"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token_embd.weight") || err.contains("is missing"),
        "{err}"
    );
}

/// The tokenizer of llama.cpp's GGUF of tiny-f32-tied-gqa2 encodes every text of the tokenizer
/// corpus (combining marks, special and added tokens, digits, whitespace, emoji) to the ids
/// HuggingFace's tokenizer gives with the tokenizer.json it was converted from
/// (fixtures/gguf/tiny-tokenizer-cases.json), and decodes them back as the tokenizer.json's
/// own export does.
#[test]
fn a_converted_tokenizer_gives_huggingfaces_ids() {
    use crate::tokenizer::Tokenizer;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let file = GgufFile::open(&root.join("gguf/tiny-f32-tied-gqa2-f32.gguf")).unwrap();
    let c = model::model_config(file.header()).unwrap();
    let data = tokenizer::tokenizer_data(file.header(), c.vocab_size).unwrap();
    // Qwen's: no bos framing a text, NFC, Qwen2's regex, the eos the config names.
    assert_eq!(
        (data.bos_id, data.prefix.len(), data.suffix.len()),
        (None, 0, 0)
    );
    assert_eq!(data.normalizer, crate::tokenizer::Normalizer::Nfc);
    assert_eq!(data.split_pattern, crate::tokenizer::SplitPattern::Qwen2);
    assert_eq!(data.eos_id, c.eos_token_ids.first().copied());
    let added: Vec<_> = data
        .added
        .iter()
        .map(|t| (t.content.as_str(), t.special))
        .collect();
    assert_eq!(
        added,
        [
            ("<|endoftext|>", true),
            ("<|im_start|>", true),
            ("<|im_end|>", true),
            ("<think>", false),
            ("</think>", false)
        ]
    );
    let tok = Tokenizer::from_data(data);
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("gguf/tiny-tokenizer-cases.json")).unwrap(),
    )
    .unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() > 100);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text), want, "{text:?}");
    }
    assert!(
        tokenizer::chat_template(file.header()).is_some_and(|t| t.contains("<|im_start|>")),
        "the chat template"
    );
}

/// Qwen's fill-in-the-middle and repository tokens look special (`<|...|>`), so llama.cpp's
/// converter types them CONTROL; HF's tokenizer.json marks them not special (Qwen3's:
/// fixtures/tokenizer/tokenizer.json), and so does the reader.
#[test]
fn tokens_that_only_look_special_are_not() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let file = GgufFile::open(&root.join("gguf/tiny-f32-tied-gqa2-f32.gguf")).unwrap();
    let mut h = file.header().clone();
    // Token 505 (<think>, user-defined) becomes <|fim_prefix|>, typed as the converter types it.
    for (key, value) in h.metadata.iter_mut() {
        match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", Value::Array(t)) => {
                t[505] = Value::Str("<|fim_prefix|>".into())
            }
            ("tokenizer.ggml.token_type", Value::Array(t)) => t[505] = Value::I32(3),
            _ => {}
        }
    }
    let data = tokenizer::tokenizer_data(&h, 512).unwrap();
    let special = |content: &str| {
        data.added
            .iter()
            .find(|t| t.content == content)
            .unwrap()
            .special
    };
    assert!(!special("<|fim_prefix|>"));
    assert!(special("<|im_end|>"));
}

/// A GGUF tokenizer this reader cannot run is refused by name: another kind of tokenizer,
/// another pre-tokenizer, a merge of tokens the vocabulary lacks, a token after the padding.
#[test]
fn a_foreign_tokenizer_is_refused_by_name() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let file = GgufFile::open(&root.join("gguf/tiny-f32-tied-gqa2-f32.gguf")).unwrap();
    let good = file.header().clone();
    let err_with = |change: &dyn Fn(&mut GgufHeader)| {
        let mut h = good.clone();
        change(&mut h);
        format!("{:#}", tokenizer::tokenizer_data(&h, 512).unwrap_err())
    };
    let set = |h: &mut GgufHeader, k: &str, v: Value| {
        h.metadata.iter_mut().find(|(key, _)| key == k).unwrap().1 = v;
    };
    let err = err_with(&|h| set(h, "tokenizer.ggml.model", Value::Str("llama".into())));
    assert!(err.contains("tokenizer.ggml.model \"llama\""), "{err}");
    let err = err_with(&|h| set(h, "tokenizer.ggml.pre", Value::Str("llama-bpe".into())));
    assert!(err.contains("tokenizer.ggml.pre \"llama-bpe\""), "{err}");
    let err = err_with(&|h| {
        let Some((_, Value::Array(m))) = h
            .metadata
            .iter_mut()
            .find(|(k, _)| k == "tokenizer.ggml.merges")
        else {
            panic!()
        };
        m[0] = Value::Str("xyzzy plugh".into());
    });
    assert!(err.contains("merge 0 \"xyzzy plugh\""), "{err}");
    let err = err_with(&|h| {
        let Some((_, Value::Array(t))) = h
            .metadata
            .iter_mut()
            .find(|(k, _)| k == "tokenizer.ggml.token_type")
        else {
            panic!()
        };
        t[10] = Value::I32(5);
    });
    assert!(err.contains("token 11 follows an unused"), "{err}");
    let err = err_with(&|h| h.metadata.retain(|(k, _)| k != "tokenizer.ggml.tokens"));
    assert!(err.contains("tokenizer.ggml.tokens is missing"), "{err}");
    // More tokens than the embedding has rows.
    let err = format!("{:#}", tokenizer::tokenizer_data(&good, 100).unwrap_err());
    assert!(err.contains("embedding has 100 rows"), "{err}");
}

/// A converted checkpoint maps to the model file's header, its tensors where the GGUF holds
/// them; a ggml type that does not run yet is refused by name, with the types that do.
#[test]
fn a_converted_checkpoint_maps_to_a_model_files_header() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let path = root.join("gguf/tiny-f32-tied-gqa2-f32.gguf");
    let file = GgufFile::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let h = model::model_header(file.header(), len).unwrap();
    assert_eq!(h.tensors.len(), file.header().tensors.len());
    let q = h
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.1.self_attn.q_proj.weight")
        .unwrap();
    let g = file
        .header()
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.attn_q.weight")
        .unwrap();
    assert_eq!((q.offset, q.nbytes), (g.start, g.nbytes));
    assert_eq!(q.shape, [g.dims[1], g.dims[0]]);
    let err = header_with_up_proj_as(3);
    assert!(
        err.contains(
            "tensor blk.0.ffn_up.weight is Q4_1: GGUF files of F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, \
             Q5_K and Q6_K tensors run so far"
        ),
        "{err}"
    );
}

/// The error `model_header` gives for tiny-f32-tied-gqa2's converted GGUF with layer 0's
/// `ffn_up` relabelled as ggml type `id` (its header edited after it was read).
fn header_with_up_proj_as(id: u32) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf/tiny-f32-tied-gqa2-f32.gguf");
    let file = GgufFile::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let mut k = file.header().clone();
    let t = k
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_up.weight")
        .unwrap();
    t.ggml_type = GgmlType::from_id(id).unwrap();
    format!("{:#}", model::model_header(&k, len).unwrap_err())
}

/// A Q4_K matrix whose rows are not whole blocks of 256 (a header the reader would refuse,
/// here edited after it was read) is refused by name, not read past its bytes.
#[test]
fn a_k_quant_matrix_of_partial_blocks_is_refused() {
    let err = header_with_up_proj_as(12);
    assert!(
        err.contains("tensor blk.0.ffn_up.weight: 40960 bytes of Q4_K for a [160, 64] matrix"),
        "{err}"
    );
}

/// llama.cpp's converter's Q8_0 GGUF of tiny-f32-tied-gqa2, opened as a model file: every Q8_0
/// matrix becomes q8 in groups of 32 whose values are, bit for bit, what ggml's dequantization
/// gives (`blocks::dequantize`, itself checked against gguf-py), and the norms stay f32 in place.
#[test]
fn q8_0_tensors_open_as_q8_with_the_files_values() {
    let counts = quantized_tensors_have_the_files_values("tiny-f32-tied-gqa2-q8_0");
    assert_eq!(
        counts,
        [("F32", 9), ("Q8_0", 15)]
            .map(|(k, v)| (k.to_string(), v))
            .into()
    );
}

/// llama-quantize's Q4_K_M of tiny-f32-tied-gqa2, whose 64-wide rows take its fallbacks: every
/// Q5_0 matrix becomes q8 in groups of 32 (values q - 16), as every Q8_0 one, each value bit for
/// bit ggml's.
#[test]
fn q5_0_tensors_open_as_q8_with_the_files_values() {
    let counts = quantized_tensors_have_the_files_values("tiny-f32-tied-gqa2-q4_k_m");
    let want = [("F32", 9), ("Q5_0", 12), ("Q8_0", 3)];
    assert_eq!(counts, want.map(|(k, v)| (k.to_string(), v)).into());
}

/// The converter's `--outtype f16` of tiny-f32-tied-gqa2 (ollama's `fp16` tags are such files):
/// every F16 tensor opens as f32, each value bit for bit ggml's.
#[test]
fn f16_tensors_open_as_f32_with_the_files_values() {
    let counts = quantized_tensors_have_the_files_values("tiny-f32-tied-gqa2-f16");
    let want = [("F16", 15), ("F32", 9)];
    assert_eq!(counts, want.map(|(k, v)| (k.to_string(), v)).into());
}

/// llama-quantize's Q5_K_M of tiny-bf16-tied-k256: its Q5_K and Q6_K blocks stay where they lie,
/// each value bit for bit ggml's as the model file's view reads it.
#[test]
fn q5_k_m_tensors_open_in_place_with_the_files_values() {
    let counts = quantized_tensors_have_the_files_values("tiny-bf16-tied-k256-q5_k_m");
    let want = [("F32", 9), ("Q5_K", 12), ("Q6_K", 3)];
    assert_eq!(counts, want.map(|(k, v)| (k.to_string(), v)).into());
}

/// llama-quantize's Q4_0 of tiny-bf16-tied-k256 (Q4_0, with its embedding table in Q6_K): every
/// Q4_0 matrix becomes q4 in groups of 32, the Q6_K table stays where it lies, each value bit
/// for bit ggml's.
#[test]
fn q4_0_tensors_open_as_q4_with_the_files_values() {
    let counts = quantized_tensors_have_the_files_values("tiny-bf16-tied-k256-q4_0");
    let want = [("F32", 9), ("Q4_0", 14), ("Q6_K", 1)];
    assert_eq!(counts, want.map(|(k, v)| (k.to_string(), v)).into());
}

/// Opens fixtures/gguf/`name`.gguf as a model file and checks that every tensor's values, as the
/// model file's view of it holds them, are bit for bit what ggml's dequantization gives
/// (`blocks::dequantize`, itself checked against gguf-py); returns how many tensors of each
/// ggml type it checked.
fn quantized_tensors_have_the_files_values(
    name: &str,
) -> std::collections::BTreeMap<String, usize> {
    use crate::format::view::TensorData;
    use crate::format::ModelFile;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let path = root.join(format!("gguf/{name}.gguf"));
    let gguf = GgufFile::open(&path).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for t in &gguf.header().tensors {
        let name = names::hf_name(&t.name).unwrap();
        let view = file.tensor(&name).unwrap();
        let numel = t.dims.iter().product::<u64>() as usize;
        let mut want = vec![0f32; numel];
        blocks::dequantize(t.ggml_type, gguf.data(t), &mut want).unwrap();
        let got: Vec<f32> = match view.data {
            TensorData::Q8 {
                q,
                scales,
                group_size,
            } => {
                assert_eq!(group_size, 32, "{name}");
                q.iter()
                    .enumerate()
                    .map(|(i, &v)| v as f32 * scales[i / group_size])
                    .collect()
            }
            TensorData::Q4 {
                packed,
                scales,
                group_size,
            } => {
                assert_eq!(group_size, 32, "{name}");
                let mut out = vec![0f32; numel];
                crate::quant::dequantize_q4(packed, scales, group_size, &mut out);
                out
            }
            TensorData::F32(v) => v.to_vec(),
            // Read where it lies: each value as the kernels' reference reads it
            // (`k_quant_value`, the plain backend's), against the whole-block dequantization.
            TensorData::K(kind, b) => (0..numel)
                .map(|i| {
                    let block = &b[i / 256 * kind.block_bytes()..][..kind.block_bytes()];
                    blocks::k_quant_value(kind, block, i % 256)
                })
                .collect(),
            other => panic!("{name}: {other:?}"),
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{name}");
        *counts.entry(t.ggml_type.name.to_string()).or_insert(0) += 1;
    }
    counts
}
