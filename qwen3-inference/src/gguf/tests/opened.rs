//! The fixtures' GGUFs opened as model files: their tokenizers give HuggingFace's ids, their
//! tensors the files' values in this format's dtypes, and what is not read yet is refused.

use super::*;

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
    use crate::format::{DType, ModelFile};
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
        // Read where it lies: each value as the plain backend reads it (`TensorData::value`:
        // a K-quant's through `k_quant_value`), against the whole-block dequantization.
        match view.data.dtype() {
            DType::Q8 | DType::Q4 => assert_eq!(view.data.group_size(), Some(32), "{name}"),
            DType::F32 | DType::K(_) => {}
            other => panic!("{name}: {other}"),
        }
        let got: Vec<f32> = (0..numel).map(|i| view.data.value(i)).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{name}");
        *counts.entry(t.ggml_type.name.to_string()).or_insert(0) += 1;
    }
    counts
}

/// Laid out for the CPU's kernels (`format::Reader::Interleaved` where the kernels read an order
/// of their own), each Q8_0, Q5_0 and Q4_0 matrix of a GGUF is this format's layout of it
/// (`ModelFile::open`'s, whose values the tests above hold to ggml's) rearranged exactly as
/// `interleave_q8` and `interleave_q4` rearrange a model file's matrix for those kernels, its
/// scales the same; an embedding table that is not also the classifier (its rows only looked
/// up) keeps the file's order, as does every other tensor. Forced here whatever this CPU's
/// kernels read.
#[test]
fn matrices_laid_out_for_the_kernels_are_the_files_rearranged() {
    use crate::format::mapped::MappedFile;
    use crate::format::Reader;
    use crate::format::{DType, ModelFile};
    use crate::quant::interleaved::{interleave_q4, interleave_q8};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    // (fixture, matrices reordered, the embedding table among them): the first two tied, their
    // tables Q8_0 (the Q4_K_M's a fallback: rows of 64); the Q4_0's table tied but Q6_K, as
    // llama-quantize keeps it; Qwen3.5's untied.
    let cases = [
        ("tiny-f32-tied-gqa2-q8_0", 15, true),
        ("tiny-f32-tied-gqa2-q4_k_m", 15, true),
        ("tiny-bf16-tied-k256-q4_0", 14, false),
        ("tiny-qwen3_5-bf16-q8_0", 65, false),
    ];
    for (name, reordered, tied) in cases {
        let path = root.join(format!("{name}.gguf"));
        let any = ModelFile::open(&path).unwrap();
        let first = MappedFile::map(&std::fs::File::open(&path).unwrap()).unwrap();
        let (g, mmap) = open_parts(&path, first).unwrap();
        let layout = model::layout(&g, mmap.len() as u64).unwrap();
        let reader = Reader::Interleaved { q8: true, q4: true };
        let (derived, names) = repack::repack(&g, &layout, &mmap, &|_| {}, reader).unwrap();
        let derived = derived.unwrap();
        assert_eq!(names.len(), reordered, "{name}");
        let embedding = names.contains("model.embed_tokens.weight");
        assert_eq!(embedding, tied, "{name}");
        for info in &any.header().tensors {
            let Some(got) = derived.get(&info.name) else {
                continue;
            };
            let file_order = any.tensor_bytes(&info.name).unwrap();
            let data = any.tensor(&info.name).unwrap().data;
            if !names.contains(&info.name) {
                assert_eq!(got, file_order, "{name} {}", info.name);
                continue;
            }
            let cols = info.shape[1] as usize;
            let values = match data.dtype() {
                DType::Q8 => data.q8().q.len(),
                DType::Q4 => data.q4().packed.len(),
                other => panic!("{name} {}: {other} laid out for the kernels", info.name),
            };
            let mut want = vec![0u8; values];
            match data.dtype() {
                DType::Q8 => interleave_q8(&file_order[..values], cols, 32, &mut want),
                _ => interleave_q4(&file_order[..values], cols, &mut want),
            }
            assert!(got[..values] == want[..], "{name} {}: values", info.name);
            assert!(
                got[values..] == file_order[values..],
                "{name} {}",
                info.name
            );
        }
    }
}

/// A model file opened for the CPU's kernels hands each matrix laid out in their order as its
/// view's `interleaved` form, and refuses, loudly, to read it in the file's order; a tied
/// embedding table so laid out gives the file's rows to a lookup (`kernels::embedding`), an
/// untied one stays in the file's order.
#[test]
fn a_matrix_in_the_kernels_order_is_not_read_as_the_files() {
    use crate::format::{ModelFile, Reader};
    use crate::kernels::embedding;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    let reader = crate::backend::CpuBackend::reader();
    let reorders = reader
        != (Reader::Interleaved {
            q8: false,
            q4: false,
        });
    for (name, tied) in [
        ("tiny-f32-tied-gqa2-q8_0", true),
        ("tiny-qwen3_5-bf16-q8_0", false),
    ] {
        let path = root.join(format!("{name}.gguf"));
        let file = ModelFile::open_for(&path, reader).unwrap();
        let any = ModelFile::open(&path).unwrap();
        let table = file.tensor("model.embed_tokens.weight").unwrap();
        let cols = table.shape[1] as usize;
        let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
        for token in [0, 1, 17, table.shape[0] as usize - 1] {
            embedding(&mut got, &table, token);
            any.tensor("model.embed_tokens.weight")
                .unwrap()
                .data
                .row(token, &mut want);
            assert_eq!(got, want, "{name}: token {token}");
        }
        assert_eq!(table.interleaved.is_some(), tied && reorders, "{name}");
        let t = file.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
        if !reorders {
            println!("skipped: this CPU's kernels read q8 in the file's order");
            assert!(t.interleaved.is_none());
            continue;
        }
        assert!(t.interleaved.is_some(), "{name}");
        let read = std::panic::catch_unwind(|| t.data.value(0));
        assert!(read.is_err(), "{name}: read in the file's order");
    }
}
