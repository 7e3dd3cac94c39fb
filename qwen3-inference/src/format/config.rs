//! The config block of the model file: everything the forward pass and the sampler need from
//! config.json and generation_config.json, plus how the matrices are stored.

use super::bytes::{ByteReader, ByteWriter};
use super::DType;
use anyhow::{bail, Result};

/// Sampling defaults a model ships in generation_config.json. Each is optional: a checkpoint may
/// omit any of them, and then the sampler's own default applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `do_sample: false` in generation_config.json means greedy decoding.
    pub do_sample: Option<bool>,
}

/// The model's hyper-parameters, named as in HuggingFace's `Qwen3Config` / `Qwen2Config`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `architectures[0]` of config.json: one of [`ARCHITECTURES`].
    pub architecture: String,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_hidden_layers: u32,
    pub num_attention_heads: u32,
    pub num_key_value_heads: u32,
    /// Width of one attention head. Qwen3 sets it explicitly (0.6B: 128, not 1024/16).
    pub head_dim: u32,
    pub vocab_size: u32,
    pub max_position_embeddings: u32,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends a generation (config.json and generation_config.json, merged).
    pub eos_token_ids: Vec<u32>,
    pub generation: GenerationDefaults,
    /// How the matrices are stored (norm weights are always f32).
    pub dtype: DType,
    /// Values per q8 group along each row (0 when `dtype` is not q8).
    pub group_size: u32,
    /// q, k and v projections add a bias (`q_proj.bias`, ...): Qwen2's attention (always on in
    /// transformers' `Qwen2Attention`; `attention_bias` in `Qwen3Config`, off in every Qwen3).
    pub attention_bias: bool,
    /// Each head of q and k is RMS-normalised before RoPE (`q_norm`, `k_norm`): new in Qwen3,
    /// absent in Qwen2.
    pub qk_norm: bool,
}

/// The architectures whose forward pass this crate runs (`config.json`'s `architectures`). They
/// differ only in data: Qwen2 has q/k/v biases and no q/k norms (see [`ModelConfig::qk_norm`]).
pub const ARCHITECTURES: [&str; 2] = ["Qwen3ForCausalLM", "Qwen2ForCausalLM"];

/// Sentinel for "absent" in the optional u32 fields.
const NONE_U32: u32 = u32::MAX;

impl ModelConfig {
    /// Checks the invariants the forward pass relies on. Called by the writer and the reader, so a
    /// config that breaks them can neither be written nor loaded.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if !ARCHITECTURES.contains(&self.architecture.as_str()) {
            bail!(
                "config: architecture {} is not supported (supported: {})",
                self.architecture,
                ARCHITECTURES.join(", ")
            );
        }
        for (name, v) in positive {
            if v == 0 {
                bail!("config: {name} is 0");
            }
        }
        // Sizes beyond these would not fit any machine; refusing them keeps size arithmetic in
        // u64/usize far from overflow on a hostile file.
        if self.hidden_size > 1 << 20
            || self.intermediate_size > 1 << 22
            || self.num_hidden_layers > 4096
            || self.num_attention_heads > 4096
            || self.head_dim > 1 << 16
            || self.vocab_size > 1 << 24
        {
            bail!("config: a size is implausibly large ({self:?})");
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "config: head_dim {} is odd; rotary embeddings rotate pairs",
                self.head_dim
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!(
                "config: rope_theta {} is not a positive number",
                self.rope_theta
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            bail!(
                "config: rms_norm_eps {} is not a non-negative number",
                self.rms_norm_eps
            );
        }
        for &id in self.eos_token_ids.iter().chain(self.bos_token_id.iter()) {
            if id >= self.vocab_size {
                bail!(
                    "config: token id {id} is outside the vocabulary ({})",
                    self.vocab_size
                );
            }
        }
        match self.dtype {
            DType::Q8 => {
                if self.group_size == 0 {
                    bail!("config: q8 with group size 0");
                }
            }
            DType::Q4 => {
                if self.group_size == 0 || !self.group_size.is_multiple_of(2) {
                    bail!(
                        "config: q4 needs an even group size, got {}",
                        self.group_size
                    );
                }
            }
            DType::Q6 => bail!("config: q6 is not a file's dtype (q4 files keep tensors in it)"),
            _ => {
                if self.group_size != 0 {
                    bail!(
                        "config: group size {} given for {}",
                        self.group_size,
                        self.dtype
                    );
                }
            }
        }
        Ok(())
    }

    /// Appends the config block (layout in docs/format.md).
    pub fn encode(&self, w: &mut ByteWriter) {
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
        };
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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
        }
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
                c.encode(&mut w);
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
        c.encode(&mut w);
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
    }
}
