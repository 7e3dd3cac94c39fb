//! The config block's bytes: [`ModelConfig::encode`] and [`ModelConfig::decode`], field by
//! field in the order docs/format.md lays them out, each format version's fields where that
//! version added them.

use super::*;
use crate::format::bytes::{ByteReader, ByteWriter};

impl ModelConfig {
    /// Appends the config block (layout in docs/format.md) as format `version` lays it out (the
    /// writer passes at least [`ModelConfig::since_version`]).
    pub fn encode(&self, w: &mut ByteWriter, version: u32) {
        w.string(&self.architecture);
        for v in [
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size,
            self.max_position_embeddings,
        ] {
            w.u32(v);
        }
        w.f64(self.rope_theta);
        w.f64(self.rms_norm_eps);
        w.u8(self.tie_word_embeddings as u8);
        w.u32(self.bos_token_id.unwrap_or(NONE_U32));
        w.u32(self.eos_token_ids.len() as u32);
        for &id in &self.eos_token_ids {
            w.u32(id);
        }
        // Generation defaults: a presence bitmask, then every field (absent ones as zero).
        let g = &self.generation;
        let mask = (g.temperature.is_some() as u8)
            | (g.top_p.is_some() as u8) << 1
            | (g.top_k.is_some() as u8) << 2
            | (g.min_p.is_some() as u8) << 3
            | (g.repetition_penalty.is_some() as u8) << 4
            | (g.do_sample.is_some() as u8) << 5;
        w.u8(mask);
        w.f32(g.temperature.unwrap_or(0.0));
        w.f32(g.top_p.unwrap_or(0.0));
        w.u32(g.top_k.unwrap_or(0));
        w.f32(g.min_p.unwrap_or(0.0));
        w.f32(g.repetition_penalty.unwrap_or(0.0));
        w.u8(g.do_sample.unwrap_or(false) as u8);
        w.u8(self.dtype.code());
        w.u32(self.group_size);
        // Since format version 2.
        w.u8(self.attention_bias as u8);
        w.u8(self.qk_norm as u8);
        if version < 5 {
            return;
        }
        // Since format version 5: RoPE scaling (type 0: none, 1: YaRN, then its parameters),
        // then the experts (a presence flag, then the MoeConfig fields).
        match self.rope_scaling {
            RopeScaling::None => w.u8(0),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                w.u8(1);
                w.f64(factor);
                w.u32(original_max_position_embeddings);
                w.f64(beta_fast);
                w.f64(beta_slow);
                w.f64(attention_factor);
                w.u8(truncate as u8);
            }
        }
        match &self.moe {
            None => w.u8(0),
            Some(m) => {
                w.u8(1);
                w.u32(m.num_experts);
                w.u32(m.num_experts_per_tok);
                w.u32(m.moe_intermediate_size);
                w.u8(m.norm_topk_prob as u8);
                w.u32(m.decoder_sparse_step);
                w.u32(m.mlp_only_layers.len() as u32);
                for &l in &m.mlp_only_layers {
                    w.u32(l);
                }
            }
        }
        if version < 6 {
            return;
        }
        // Since format version 6: the embedding head (a presence flag, then `normalize`).
        match &self.embedding {
            None => w.u8(0),
            Some(e) => {
                w.u8(1);
                w.u8(e.normalize as u8);
            }
        }
        if version < 7 {
            return;
        }
        // Since format version 7: the partial rotation, the output gate, then the linear
        // attention layers (a presence flag, their sizes, one layer type code a layer).
        w.f64(self.partial_rotary_factor);
        w.u8(self.attn_output_gate as u8);
        match &self.linear_attention {
            None => w.u8(0),
            Some(la) => {
                w.u8(1);
                for v in [
                    la.linear_num_key_heads,
                    la.linear_num_value_heads,
                    la.linear_key_head_dim,
                    la.linear_value_head_dim,
                    la.linear_conv_kernel_dim,
                ] {
                    w.u32(v);
                }
                w.u32(la.layer_types.len() as u32);
                for t in &la.layer_types {
                    w.u8(*t as u8);
                }
            }
        }
        // The experts' shared expert (0: none, or no experts).
        w.u32(
            self.moe
                .as_ref()
                .map_or(0, |m| m.shared_expert_intermediate_size),
        );
        if version < 8 {
            return;
        }
        // Since format version 8: the vision block (a presence flag, then vision.rs's fields).
        match &self.vision {
            None => w.u8(0),
            Some(v) => {
                w.u8(1);
                v.encode(w);
            }
        }
        if version < 9 {
            return;
        }
        // Since format version 9: the order of the Gated DeltaNets' value heads (0 grouped, as
        // HF's; 1 tiled, as a GGUF's; 0 without linear attention).
        let tiled =
            self.linear_attention.as_ref().map(|la| la.value_heads) == Some(ValueHeads::Tiled);
        w.u8(tiled as u8);
    }

    /// Reads a config block written by [`ModelConfig::encode`] in format `version` and validates
    /// it. Version 1 had no architecture flags: every version 1 file is a Qwen3 model.
    pub fn decode(r: &mut ByteReader<'_>, version: u32) -> Result<ModelConfig> {
        let architecture = r.string("architecture")?;
        let hidden_size = r.u32("hidden_size")?;
        let intermediate_size = r.u32("intermediate_size")?;
        let num_hidden_layers = r.u32("num_hidden_layers")?;
        let num_attention_heads = r.u32("num_attention_heads")?;
        let num_key_value_heads = r.u32("num_key_value_heads")?;
        let head_dim = r.u32("head_dim")?;
        let vocab_size = r.u32("vocab_size")?;
        let max_position_embeddings = r.u32("max_position_embeddings")?;
        let rope_theta = r.f64("rope_theta")?;
        let rms_norm_eps = r.f64("rms_norm_eps")?;
        let tie_word_embeddings = match r.u8("tie_word_embeddings")? {
            0 => false,
            1 => true,
            v => bail!("corrupt header: tie_word_embeddings is {v}, not 0 or 1"),
        };
        let bos = r.u32("bos_token_id")?;
        let n_eos = r.count(4, "eos id count")?;
        let mut eos_token_ids = Vec::with_capacity(n_eos);
        for _ in 0..n_eos {
            eos_token_ids.push(r.u32("eos id")?);
        }
        let mask = r.u8("generation mask")?;
        let has = |bit: u8| mask & (1 << bit) != 0;
        let temperature = r.f32("temperature")?;
        let top_p = r.f32("top_p")?;
        let top_k = r.u32("top_k")?;
        let min_p = r.f32("min_p")?;
        let repetition_penalty = r.f32("repetition_penalty")?;
        let do_sample = r.u8("do_sample")? != 0;
        let generation = GenerationDefaults {
            temperature: has(0).then_some(temperature),
            top_p: has(1).then_some(top_p),
            top_k: has(2).then_some(top_k),
            min_p: has(3).then_some(min_p),
            repetition_penalty: has(4).then_some(repetition_penalty),
            do_sample: has(5).then_some(do_sample),
        };
        let code = r.u8("dtype")?;
        let Some(dtype) = DType::from_code(code) else {
            bail!("corrupt header: unknown dtype code {code}");
        };
        let group_size = r.u32("group_size")?;
        let flag = |r: &mut ByteReader<'_>, name: &str| -> Result<bool> {
            match r.u8(name)? {
                0 => Ok(false),
                1 => Ok(true),
                v => bail!("corrupt header: {name} is {v}, not 0 or 1"),
            }
        };
        let (attention_bias, qk_norm) = if version >= 2 {
            (flag(r, "attention_bias")?, flag(r, "qk_norm")?)
        } else {
            (false, true)
        };
        let (mut rope_scaling, mut moe) = (RopeScaling::None, None);
        if version >= 5 {
            rope_scaling = match r.u8("rope scaling type")? {
                0 => RopeScaling::None,
                1 => RopeScaling::Yarn {
                    factor: r.f64("yarn factor")?,
                    original_max_position_embeddings: r
                        .u32("yarn original_max_position_embeddings")?,
                    beta_fast: r.f64("yarn beta_fast")?,
                    beta_slow: r.f64("yarn beta_slow")?,
                    attention_factor: r.f64("yarn attention_factor")?,
                    truncate: flag(r, "yarn truncate")?,
                },
                v => bail!("corrupt header: rope scaling type {v}"),
            };
            if flag(r, "experts")? {
                let num_experts = r.u32("num_experts")?;
                let num_experts_per_tok = r.u32("num_experts_per_tok")?;
                let moe_intermediate_size = r.u32("moe_intermediate_size")?;
                let norm_topk_prob = flag(r, "norm_topk_prob")?;
                let decoder_sparse_step = r.u32("decoder_sparse_step")?;
                let n = r.count(4, "mlp_only_layers count")?;
                let mut mlp_only_layers = Vec::with_capacity(n);
                for _ in 0..n {
                    mlp_only_layers.push(r.u32("mlp_only_layers")?);
                }
                moe = Some(MoeConfig {
                    num_experts,
                    num_experts_per_tok,
                    moe_intermediate_size,
                    norm_topk_prob,
                    decoder_sparse_step,
                    mlp_only_layers,
                    shared_expert_intermediate_size: 0,
                });
            }
        }
        let mut embedding = None;
        if version >= 6 && flag(r, "embedding")? {
            embedding = Some(EmbeddingConfig {
                normalize: flag(r, "embedding normalize")?,
            });
        }
        let (mut partial_rotary_factor, mut attn_output_gate, mut linear_attention) =
            (1.0, false, None);
        if version >= 7 {
            partial_rotary_factor = r.f64("partial_rotary_factor")?;
            attn_output_gate = flag(r, "attn_output_gate")?;
            if flag(r, "linear attention")? {
                let linear_num_key_heads = r.u32("linear_num_key_heads")?;
                let linear_num_value_heads = r.u32("linear_num_value_heads")?;
                let linear_key_head_dim = r.u32("linear_key_head_dim")?;
                let linear_value_head_dim = r.u32("linear_value_head_dim")?;
                let linear_conv_kernel_dim = r.u32("linear_conv_kernel_dim")?;
                let n = r.count(1, "layer_types count")?;
                let mut layer_types = Vec::with_capacity(n);
                for _ in 0..n {
                    layer_types.push(match r.u8("layer type")? {
                        0 => LayerType::FullAttention,
                        1 => LayerType::LinearAttention,
                        v => bail!("corrupt header: layer type code {v}"),
                    });
                }
                linear_attention = Some(LinearAttentionConfig {
                    layer_types,
                    linear_num_key_heads,
                    linear_num_value_heads,
                    linear_key_head_dim,
                    linear_value_head_dim,
                    linear_conv_kernel_dim,
                    // What a model file holds (HF's order; see ValueHeads).
                    value_heads: ValueHeads::Grouped,
                });
            }
            let shared = r.u32("shared_expert_intermediate_size")?;
            match moe.as_mut() {
                Some(m) => m.shared_expert_intermediate_size = shared,
                None if shared > 0 => {
                    bail!("corrupt header: a shared expert of {shared} without experts")
                }
                None => {}
            }
        }
        let mut vision = None;
        if version >= 8 && flag(r, "vision")? {
            vision = Some(VisionInput::decode(r)?);
        }
        if version >= 9 && flag(r, "value heads tiled")? {
            let Some(la) = linear_attention.as_mut() else {
                bail!("corrupt header: value heads tiled without linear attention");
            };
            la.value_heads = ValueHeads::Tiled;
        }
        let c = ModelConfig {
            architecture,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            rope_theta,
            rms_norm_eps,
            tie_word_embeddings,
            bos_token_id: (bos != NONE_U32).then_some(bos),
            eos_token_ids,
            generation,
            dtype,
            group_size,
            attention_bias,
            qk_norm,
            rope_scaling,
            moe,
            embedding,
            partial_rotary_factor,
            attn_output_gate,
            linear_attention,
            vision,
        };
        c.validate()?;
        Ok(c)
    }
}
