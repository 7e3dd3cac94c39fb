//! The architectures whose forward pass this crate runs, one row each: the name config.json
//! gives (`architectures[0]`, what a model file records), the name a GGUF file gives
//! (`general.architecture`, which ollama also shows as a model's family), and what its layers
//! hold. They differ only in data: Qwen2 has q/k/v biases and no q/k norms; Qwen3-MoE is Qwen3 with
//! mixture-of-experts MLPs; Qwen3.5 is Qwen3 with Gated DeltaNet layers among gated attention ones
//! (the exporter reads its multimodal checkpoints' text model under this name); Qwen3-Next
//! computes what Qwen3.5-MoE does (its router's renormalisation and its dense layers as its config
//! says). The exporter's table of checkpoint families (`qwen3-export/src/hf/family.rs`) names its
//! rows by these.

/// One architecture the forward pass runs.
#[derive(Debug, PartialEq, Eq)]
pub struct Architecture {
    /// config.json's name, as a model file records it.
    pub name: &'static str,
    /// A GGUF's `general.architecture` (and the key prefix of its hyperparameters).
    pub gguf: &'static str,
    /// Mixture-of-experts MLPs ([`super::ModelConfig::moe`]).
    pub experts: bool,
    /// Gated DeltaNet layers ([`super::ModelConfig::linear_attention`]).
    pub linear_attention: bool,
    /// Biases on q, k and v, where a GGUF's metadata does not say (Qwen2's).
    pub attention_bias: bool,
    /// RMSNorms on each head's queries and keys (Qwen3's, absent from Qwen2).
    pub qk_norm: bool,
}

pub const QWEN3: Architecture = Architecture {
    name: "Qwen3ForCausalLM",
    gguf: "qwen3",
    experts: false,
    linear_attention: false,
    attention_bias: false,
    qk_norm: true,
};
pub const QWEN2: Architecture = Architecture {
    name: "Qwen2ForCausalLM",
    gguf: "qwen2",
    experts: false,
    linear_attention: false,
    attention_bias: true,
    qk_norm: false,
};
pub const QWEN3_MOE: Architecture = Architecture {
    name: "Qwen3MoeForCausalLM",
    gguf: "qwen3moe",
    experts: true,
    ..QWEN3
};
pub const QWEN3_5: Architecture = Architecture {
    name: "Qwen3_5ForCausalLM",
    gguf: "qwen35",
    linear_attention: true,
    ..QWEN3
};
pub const QWEN3_5_MOE: Architecture = Architecture {
    name: "Qwen3_5MoeForCausalLM",
    gguf: "qwen35moe",
    experts: true,
    linear_attention: true,
    ..QWEN3
};
pub const QWEN3_NEXT: Architecture = Architecture {
    name: "Qwen3NextForCausalLM",
    gguf: "qwen3next",
    ..QWEN3_5_MOE
};

/// Every architecture the forward pass runs.
pub const ARCHITECTURES: [Architecture; 6] =
    [QWEN3, QWEN2, QWEN3_MOE, QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT];

impl Architecture {
    /// The row of config.json's name `name`, if the forward pass runs it.
    pub fn named(name: &str) -> Option<&'static Architecture> {
        ARCHITECTURES.iter().find(|a| a.name == name)
    }

    /// The row of a GGUF's `general.architecture` `gguf`, if the forward pass runs it.
    pub fn of_gguf(gguf: &str) -> Option<&'static Architecture> {
        ARCHITECTURES.iter().find(|a| a.gguf == gguf)
    }

    /// Every row's `field`, for an error that lists what runs ("qwen3, qwen2, ...").
    pub fn list(field: fn(&Architecture) -> &'static str) -> String {
        ARCHITECTURES
            .iter()
            .map(field)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_is_one_row() {
        for a in &ARCHITECTURES {
            assert_eq!(Architecture::named(a.name), Some(a));
            assert_eq!(Architecture::of_gguf(a.gguf), Some(a));
        }
        assert_eq!(Architecture::named("LlamaForCausalLM"), None);
        assert!(Architecture::list(|a| a.gguf).starts_with("qwen3, qwen2, qwen3moe"));
    }
}
