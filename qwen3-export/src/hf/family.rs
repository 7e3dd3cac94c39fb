//! The model families a checkpoint may be, as data: one row of [`FAMILIES`] each, holding what
//! tells them apart where config.json is silent (transformers' config classes' defaults) and
//! what the model file records. The forward pass is one for all of them; these rows, and the
//! flags they set in `ModelConfig`, are all that differ. A family's tensor names and layouts
//! live beside it (`qwen3_5.rs` for the hybrid models, `vision.rs` for a tower).
//!
//! Adding a family that computes what one of these does is a row; one that computes something
//! new is a row, the flags it sets in `ModelConfig`, and the forward pass's case for them.

use super::{qwen3_5, vision};
use qwen3_inference::format::architecture::{
    Architecture, QWEN2, QWEN3, QWEN3_5, QWEN3_5_MOE, QWEN3_MOE, QWEN3_NEXT,
};

/// What `head_dim` is when config.json does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDim {
    /// The config class's own default (Qwen3Config's 128: not hidden / heads, which it usually
    /// differs from; Qwen3.5's 256).
    Default(u32),
    /// `getattr(config, "head_dim", hidden // heads)`, as Qwen2Attention and Qwen3MoeAttention
    /// take it.
    Ratio,
}

/// One family.
pub struct Family {
    /// What config.json's `architectures` may say.
    pub checkpoints: &'static [&'static str],
    /// The `model_type`s that stand for it when `architectures` is absent.
    pub model_types: &'static [&'static str],
    /// The architecture the model file records (the forward pass's case; whether its layers
    /// hold experts or Gated DeltaNets is that row's).
    pub architecture: &'static Architecture,
    /// The text model's keys may be under `text_config` (a vision-language checkpoint's).
    pub text_config: bool,
    pub head_dim: HeadDim,
    /// `rope_theta` when neither the top level nor `rope_parameters` gives it.
    pub rope_theta: f64,
    /// The router renormalises the chosen experts' probabilities whatever config.json's
    /// `norm_topk_prob` says (`Qwen3_5MoeTopKRouter`, `Qwen3VLMoeTextTopKRouter`); otherwise the
    /// key decides, as in `Qwen3MoeSparseMoeBlock`.
    pub renormalises: bool,
    /// `num_experts`, `num_experts_per_tok` and `moe_intermediate_size` when config.json does
    /// not say: the config class's defaults (zeros for a dense family).
    pub expert_defaults: [u32; 3],
}

/// Every family, in the order a refusal lists them.
pub static FAMILIES: [Family; 8] = [
    Family {
        checkpoints: &["Qwen3ForCausalLM"],
        model_types: &["qwen3"],
        architecture: &QWEN3,
        text_config: false,
        head_dim: HeadDim::Default(128),
        rope_theta: 10_000.0,
        renormalises: false,
        expert_defaults: [0, 0, 0],
    },
    Family {
        checkpoints: &["Qwen2ForCausalLM"],
        model_types: &["qwen2"],
        architecture: &QWEN2,
        text_config: false,
        head_dim: HeadDim::Ratio,
        rope_theta: 10_000.0,
        renormalises: false,
        expert_defaults: [0, 0, 0],
    },
    Family {
        checkpoints: &["Qwen3MoeForCausalLM"],
        model_types: &["qwen3_moe"],
        architecture: &QWEN3_MOE,
        text_config: false,
        head_dim: HeadDim::Ratio,
        rope_theta: 10_000.0,
        renormalises: false,
        expert_defaults: [128, 8, 768],
    },
    // Qwen3-Next: Qwen3.5-MoE's layers, its keys at the top, kept under its own name.
    Family {
        checkpoints: &[QWEN3_NEXT.name],
        model_types: &["qwen3_next"],
        architecture: &QWEN3_NEXT,
        text_config: false,
        head_dim: HeadDim::Default(qwen3_5::DEFAULT_HEAD_DIM),
        rope_theta: 10_000.0,
        renormalises: false,
        expert_defaults: [512, 10, 512],
    },
    // Qwen3.5 and Qwen3.6: the text model of a vision-language checkpoint.
    Family {
        checkpoints: &qwen3_5::CHECKPOINTS,
        model_types: &["qwen3_5", "qwen3_5_text"],
        architecture: &QWEN3_5,
        text_config: true,
        head_dim: HeadDim::Default(qwen3_5::DEFAULT_HEAD_DIM),
        rope_theta: 10_000.0,
        renormalises: false,
        expert_defaults: [0, 0, 0],
    },
    Family {
        checkpoints: &qwen3_5::MOE_CHECKPOINTS,
        model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
        architecture: &QWEN3_5_MOE,
        text_config: true,
        head_dim: HeadDim::Default(qwen3_5::DEFAULT_HEAD_DIM),
        rope_theta: 10_000.0,
        renormalises: true,
        expert_defaults: [128, 8, 512],
    },
    // Qwen3-VL: a Qwen3 text model (interleaved M-RoPE, DeepStack) under `text_config`, beside
    // its vision tower (vision.rs); Qwen3VLTextConfig's `default_theta` is 500000.
    Family {
        checkpoints: &[vision::QWEN3_VL],
        model_types: &[],
        architecture: &QWEN3,
        text_config: true,
        head_dim: HeadDim::Default(128),
        rope_theta: 500_000.0,
        renormalises: false,
        expert_defaults: [0, 0, 0],
    },
    // Qwen3-VL-MoE: a Qwen3-MoE text model (M-RoPE, DeepStack) under `text_config`, beside its
    // tower; Qwen3VLMoeTextConfig's `head_dim` is hidden / heads when absent, its `default_theta`
    // 500000. Its experts are fused and transposed in the hub's files (checkpoint.rs).
    Family {
        checkpoints: &[vision::QWEN3_VL_MOE],
        model_types: &[],
        architecture: &QWEN3_MOE,
        text_config: true,
        head_dim: HeadDim::Ratio,
        rope_theta: 500_000.0,
        renormalises: true,
        expert_defaults: [60, 4, 1408],
    },
];

/// The family of a checkpoint whose config.json says `architecture`.
pub fn by_checkpoint(architecture: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.checkpoints.contains(&architecture))
}

/// The family of a config.json without `architectures`, by its `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// Every checkpoint architecture the exporter reads, for a refusal's list.
pub fn supported() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.checkpoints.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_exports_as_an_architecture_the_format_knows() {
        use qwen3_inference::format::ARCHITECTURES;
        for f in &FAMILIES {
            assert!(
                ARCHITECTURES.contains(f.architecture),
                "{}",
                f.architecture.name
            );
            for c in f.checkpoints {
                assert!(
                    std::ptr::eq(by_checkpoint(c).unwrap(), f),
                    "{c} in two rows"
                );
            }
        }
        // The refusal's list, as users have seen it.
        assert_eq!(
            supported().join(", "),
            "Qwen3ForCausalLM, Qwen2ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, \
             Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM, \
             Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, \
             Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration"
        );
    }
}
