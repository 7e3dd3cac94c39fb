//! llama.cpp's converter's GGUFs of the fixtures read as models: their configs, their tensors'
//! names and shapes, and the names llama.cpp writes for every architecture.

use super::*;

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

/// llama-quantize writes a one-row matrix as a vector (ggml drops its trailing dimension of 1):
/// Qwen3.5-MoE's shared-expert gates, `[1, hidden]` as the converter writes them, are `[hidden]`
/// in every file it quantized. They read as the config's `[1, hidden]`; a vector of another
/// length is still refused by name.
#[test]
fn a_one_row_matrix_stored_as_a_vector_reads_as_the_matrix() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    let file = GgufFile::open(&root.join("tiny-qwen3_5moe-f32-sharded-f32.gguf")).unwrap();
    let c = model::model_config(file.header()).unwrap();
    let hidden = c.hidden_size as u64;
    let mut h = file.header().clone();
    fn gates(h: &mut crate::gguf::GgufHeader) -> Vec<&mut crate::gguf::GgufTensor> {
        let shexp =
            |t: &&mut crate::gguf::GgufTensor| t.name.ends_with("ffn_gate_inp_shexp.weight");
        h.tensors.iter_mut().filter(shexp).collect()
    }
    assert_eq!(gates(&mut h).len(), c.num_hidden_layers as usize);
    for t in gates(&mut h) {
        assert_eq!(t.dims, [hidden, 1], "the converter's {}", t.name);
        t.dims = vec![hidden];
    }
    let pieces = model::check_tensors(&h, &c).unwrap();
    let gate = |l: usize| format!("model.layers.{l}.mlp.shared_expert_gate.weight");
    for l in 0..c.num_hidden_layers as usize {
        let (_, p) = pieces.iter().find(|(_, p)| p.name == gate(l)).unwrap();
        assert_eq!(p.shape, [1, hidden], "{}", gate(l));
    }
    gates(&mut h)[0].dims = vec![hidden - 1];
    let err = model::check_tensors(&h, &c).unwrap_err().to_string();
    assert!(
        err.contains("ffn_gate_inp_shexp") && err.contains("the config implies"),
        "{err}"
    );
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
