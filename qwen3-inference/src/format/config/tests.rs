//! Round trips of the config block through every format version, and the configs it refuses.

use super::*;
use crate::format::bytes::{ByteReader, ByteWriter};

/// A small valid config for format tests.
pub fn tiny_config(dtype: DType) -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3ForCausalLM".into(),
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        vocab_size: 100,
        max_position_embeddings: 512,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: vec![1, 2],
        generation: GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            ..Default::default()
        },
        dtype,
        group_size: if matches!(dtype, DType::Q8 | DType::Q4) {
            32
        } else {
            0
        },
        attention_bias: false,
        qk_norm: true,
        rope_scaling: RopeScaling::None,
        moe: None,
        embedding: None,
        partial_rotary_factor: 1.0,
        attn_output_gate: false,
        linear_attention: None,
        vision: None,
    }
}

/// Qwen3.5's layers on the tiny config: three Gated DeltaNets, then gated attention over a
/// quarter of each head.
pub fn tiny_qwen3_5_config(dtype: DType) -> ModelConfig {
    use LayerType::{FullAttention as F, LinearAttention as L};
    ModelConfig {
        architecture: "Qwen3_5ForCausalLM".into(),
        num_hidden_layers: 4,
        partial_rotary_factor: 0.25,
        attn_output_gate: true,
        linear_attention: Some(LinearAttentionConfig {
            layer_types: vec![L, L, L, F],
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 8,
            linear_conv_kernel_dim: 4,
            value_heads: Default::default(),
        }),
        ..tiny_config(dtype)
    }
}

/// Version 9's byte: a GGUF's tiled value heads round-trip (what `qwen3 export FILE.gguf`
/// writes), grouped ones still need only version 7, and a tiled byte without linear attention
/// is refused.
#[test]
fn tiled_value_heads_round_trip_in_version_9() {
    let mut c = tiny_qwen3_5_config(DType::Q8);
    c.linear_attention.as_mut().unwrap().value_heads = ValueHeads::Tiled;
    assert_eq!(c.since_version(), 9);
    let mut w = ByteWriter::default();
    c.encode(&mut w, 9);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 9).unwrap(), c);
    assert_eq!(r.remaining(), 0);
    let grouped = tiny_qwen3_5_config(DType::Q8);
    let mut w = ByteWriter::default();
    grouped.encode(&mut w, 9);
    assert_eq!(
        ModelConfig::decode(&mut ByteReader::new(&w.buf), 9).unwrap(),
        grouped
    );
    let mut w = ByteWriter::default();
    tiny_config(DType::Q8).encode(&mut w, 9);
    *w.buf.last_mut().unwrap() = 1;
    let e = ModelConfig::decode(&mut ByteReader::new(&w.buf), 9).unwrap_err();
    assert!(
        e.to_string().contains("tiled without linear attention"),
        "{e}"
    );
}

/// Version 7's block round-trips, and a version 7 reader reads what older writers wrote.
#[test]
fn linear_attention_round_trips_in_version_7() {
    let c = tiny_qwen3_5_config(DType::Q8);
    assert_eq!(c.since_version(), 7);
    assert_eq!(c.rotary_dim(), 8);
    assert_eq!(c.attention_layers(), 1);
    assert!(!c.is_attention(0) && c.is_attention(3));
    // Three layers of a window [96, 3] and a memory [4, 16, 8], f32.
    assert_eq!(c.linear_state_bytes(), 4 * 3 * (96 * 3 + 4 * 16 * 8));
    let mut w = ByteWriter::default();
    c.encode(&mut w, 7);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 7).unwrap(), c);
    assert_eq!(r.remaining(), 0);
    // Refused: a layer type per layer is missing; linear layers on another architecture.
    let mut bad = c.clone();
    bad.linear_attention.as_mut().unwrap().layer_types.pop();
    assert!(bad.validate().is_err());
    let mut bad = c.clone();
    bad.architecture = "Qwen3ForCausalLM".into();
    assert!(bad.validate().is_err());
    let mut bad = c.clone();
    bad.partial_rotary_factor = 0.01;
    assert!(bad.validate().is_err());
    // Qwen3.5-MoE: experts with a shared expert, in the same block.
    let moe = ModelConfig {
        architecture: "Qwen3_5MoeForCausalLM".into(),
        moe: Some(MoeConfig {
            shared_expert_intermediate_size: 48,
            mlp_only_layers: vec![],
            ..tiny_moe_yarn_config(DType::Q8).moe.unwrap()
        }),
        ..c
    };
    let mut w = ByteWriter::default();
    moe.encode(&mut w, 7);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 7).unwrap(), moe);
    assert_eq!(r.remaining(), 0);
}

/// Qwen3-30B-A3B's experts and Qwen3's documented YaRN, on the tiny config.
pub fn tiny_moe_yarn_config(dtype: DType) -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3MoeForCausalLM".into(),
        rope_scaling: RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 128,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        },
        moe: Some(MoeConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![1],
            shared_expert_intermediate_size: 0,
        }),
        ..tiny_config(dtype)
    }
}

/// Version 5's block round-trips; the oldest version a config needs is what it holds.
#[test]
fn moe_and_yarn_round_trip_in_version_5() {
    let c = tiny_moe_yarn_config(DType::Q4);
    assert_eq!(c.since_version(), 5);
    assert_eq!(tiny_config(DType::Q8).since_version(), 2);
    let mut w = ByteWriter::default();
    c.encode(&mut w, 5);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 5).unwrap(), c);
    assert_eq!(r.remaining(), 0);
    // A dense model without scaling writes the two "none" bytes in version 5.
    let c = tiny_config(DType::Bf16);
    let mut w = ByteWriter::default();
    c.encode(&mut w, 5);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 5).unwrap(), c);
    assert_eq!(r.remaining(), 0);
}

/// The sparse layers: `(l + 1) % step == 0` and not in `mlp_only_layers`.
#[test]
fn sparse_layers_follow_step_and_mlp_only_layers() {
    let mut m = tiny_moe_yarn_config(DType::F32).moe.unwrap();
    assert_eq!(
        (0..4).map(|l| m.is_sparse(l)).collect::<Vec<_>>(),
        [true, false, true, true]
    );
    m.decoder_sparse_step = 2;
    m.mlp_only_layers.clear();
    assert_eq!(
        (0..4).map(|l| m.is_sparse(l)).collect::<Vec<_>>(),
        [false, true, false, true]
    );
}

#[test]
fn config_round_trips() {
    for dt in [DType::F32, DType::Bf16, DType::Q8, DType::Q4] {
        for qwen2 in [false, true] {
            let mut c = tiny_config(dt);
            if qwen2 {
                c.architecture = "Qwen2ForCausalLM".into();
                (c.attention_bias, c.qk_norm) = (true, false);
            }
            let mut w = ByteWriter::default();
            c.encode(&mut w, 2);
            let mut r = ByteReader::new(&w.buf);
            assert_eq!(ModelConfig::decode(&mut r, 2).unwrap(), c);
            assert_eq!(r.remaining(), 0);
        }
    }
}

/// A version 1 config block (the same bytes without the two flags) is a Qwen3 model.
#[test]
fn version_1_config_is_qwen3() {
    let c = tiny_config(DType::Q8);
    let mut w = ByteWriter::default();
    c.encode(&mut w, 2);
    let v1 = &w.buf[..w.buf.len() - 2];
    let mut r = ByteReader::new(v1);
    let got = ModelConfig::decode(&mut r, 1).unwrap();
    assert_eq!(got, c);
    assert!(got.qk_norm && !got.attention_bias);
    assert_eq!(r.remaining(), 0);
}

#[test]
fn invalid_configs_are_refused() {
    let mut c = tiny_config(DType::Q8);
    c.num_key_value_heads = 3;
    assert!(c.validate().is_err());
    let mut c = tiny_config(DType::Q8);
    c.eos_token_ids = vec![100];
    assert!(c.validate().is_err());
    let mut c = tiny_config(DType::F32);
    c.group_size = 64;
    assert!(c.validate().is_err());
    // experts on a dense architecture, none on Qwen3-MoE, top-k beyond the experts
    let mut c = tiny_config(DType::F32);
    c.moe = tiny_moe_yarn_config(DType::F32).moe;
    assert!(c.validate().is_err());
    let mut c = tiny_moe_yarn_config(DType::F32);
    c.moe = None;
    assert!(c.validate().is_err());
    let mut c = tiny_moe_yarn_config(DType::F32);
    c.moe.as_mut().unwrap().num_experts_per_tok = 9;
    assert!(c.validate().is_err());
    let mut c = tiny_moe_yarn_config(DType::F32);
    c.rope_scaling = RopeScaling::Yarn {
        factor: 0.0,
        original_max_position_embeddings: 64,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    assert!(c.validate().is_err());
}

/// A tiny tower on the tiny Qwen3.5 config: patch 4, merge 2 (no DeepStack, as Qwen3.5's).
pub fn tiny_vision_config(dtype: DType) -> ModelConfig {
    let c = tiny_qwen3_5_config(dtype);
    ModelConfig {
        vision: Some(VisionInput {
            tower: VisionConfig {
                depth: 2,
                hidden_size: 32,
                intermediate_size: 48,
                num_heads: 2,
                in_channels: 3,
                patch_size: 4,
                temporal_patch_size: 2,
                spatial_merge_size: 2,
                out_hidden_size: c.hidden_size as usize,
                num_position_embeddings: 16,
                deepstack_visual_indexes: vec![],
                rope_theta: 10000.0,
            },
            processor: ImageProcessor {
                patch_size: 4,
                temporal_patch_size: 2,
                merge_size: 2,
                min_pixels: 64,
                max_pixels: 4096,
                image_mean: [0.5; 3],
                image_std: [0.25, 0.5, 0.75],
                rescale_factor: 1.0 / 255.0,
            },
            image_token_id: 97,
            vision_start_token_id: 95,
            vision_end_token_id: 96,
            // The tiny Qwen3.5 rotates 8 of 32 dimensions: 4 frequencies.
            mrope_section: [2, 1, 1],
        }),
        ..c
    }
}

/// Version 8's vision block round-trips; what the tower, the processor and the text model must
/// agree on is refused by name.
#[test]
fn vision_round_trips_in_version_8() {
    let c = tiny_vision_config(DType::Q8);
    assert_eq!(c.since_version(), 8);
    let mut w = ByteWriter::default();
    c.encode(&mut w, 8);
    let mut r = ByteReader::new(&w.buf);
    assert_eq!(ModelConfig::decode(&mut r, 8).unwrap(), c);
    assert_eq!(r.remaining(), 0);
    // Version 8 without a tower reads back as version 7's config.
    let text = tiny_qwen3_5_config(DType::Q8);
    let mut w = ByteWriter::default();
    text.encode(&mut w, 8);
    assert_eq!(
        ModelConfig::decode(&mut ByteReader::new(&w.buf), 8).unwrap(),
        text
    );
    let refused = |edit: fn(&mut VisionInput), want: &str| {
        let mut bad = c.clone();
        edit(bad.vision.as_mut().unwrap());
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    };
    refused(
        |v| v.processor.patch_size = 8,
        "differ from the processor's",
    );
    refused(
        |v| v.tower.out_hidden_size = 48,
        "not the text model's hidden_size",
    );
    refused(|v| v.image_token_id = 100, "outside the vocabulary");
    // DeepStack (Qwen3-VL): its features go to the first text layers, one each.
    let mut deepstack = c.clone();
    deepstack
        .vision
        .as_mut()
        .unwrap()
        .tower
        .deepstack_visual_indexes = vec![0, 1];
    deepstack.validate().unwrap();
    refused(
        |v| v.tower.deepstack_visual_indexes = vec![1; 5],
        "5 DeepStack features for 4 text layers",
    );
    refused(
        |v| v.mrope_section = [2, 2, 1],
        "not the 4 rotary frequencies",
    );
    // A decoded block is checked before the text model's checks: a zero-sized tower.
    let mut bad = c.clone();
    bad.vision.as_mut().unwrap().tower.num_heads = 0;
    let mut w = ByteWriter::default();
    bad.encode(&mut w, 8);
    let e = ModelConfig::decode(&mut ByteReader::new(&w.buf), 8).unwrap_err();
    assert!(e.to_string().contains("a size is 0"), "{e}");
}
