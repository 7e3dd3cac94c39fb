//! `qwen3 export FILE.gguf out.bin`: a GGUF file (llama.cpp's) -> model file + companions.
//!
//! Nothing is requantized: each tensor is written as the GGUF opens as a model
//! (`qwen3_inference::gguf::model::layout`), so the model file computes what the GGUF does, bit
//! for bit, and opens without the work done at a GGUF's open (`gguf/repack.rs`):
//!
//! ```text
//! F32, BF16            as they are
//! F16                  widened to f32 (exact)
//! Q8_0, Q5_0           q8 in groups of 32 (exact: their values and f16 scales fit)
//! Q4_0                 q4 in groups of 32 (exact)
//! Q4_K, Q5_K, Q6_K     their blocks as they are (format version 9)
//! qwen35's attn_q      HF's q_proj and output gate rows, gathered apart
//! qwen35's ssm_a       A_log = ln(-ssm_a), as the GGUF's open computes it
//! ```
//!
//! A `qwen35` GGUF's value heads stay in llama.cpp's tiled order (`format::ValueHeads`). The
//! tokenizer comes from `tokenizer.ggml.*`, the chat template from `tokenizer.chat_template`;
//! the multi-token-prediction layers, which the forward pass does not run, are left out.

use crate::check_cancel;
use crate::companions::Companions;
use anyhow::{ensure, Context, Result};
use qwen3_inference::chat::ChatTemplate;
use qwen3_inference::format::writer::ModelWriter;
use qwen3_inference::format::{ModelConfig, ModelFile};
use qwen3_inference::gguf::{self, GgufFile};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// What [`export_gguf`] wrote, for the log.
pub struct GgufExportSummary {
    pub config: ModelConfig,
    pub model_path: PathBuf,
    pub model_bytes: u64,
    /// The format version written: the oldest that holds the file (9 with K-quants or tiled
    /// value heads), so an older build reads what it can.
    pub version: u32,
    /// Each GGUF tensor type, how many tensors had it, and what it became.
    pub conversions: Vec<(String, usize, &'static str)>,
    pub tokenizer_path: PathBuf,
    pub tokenizer_note: String,
    pub template_path: PathBuf,
    /// `None` when the GGUF has no chat template (a base model): none is written.
    pub template_note: Option<String>,
    /// The multi-token-prediction layers left out, if the GGUF has any.
    pub left_out_note: Option<String>,
}

/// What a GGUF tensor of type `ggml` becomes in the model file.
fn becomes(ggml: &str) -> &'static str {
    match ggml {
        "F32" | "BF16" => "as it is",
        "F16" => "widened to f32 (exact)",
        "Q8_0" | "Q5_0" => "q8 in groups of 32 (exact)",
        "Q4_0" => "q4 in groups of 32 (exact)",
        _ => "its blocks as they are",
    }
}

/// Writes GGUF file `gguf` as model file `out` and its companions (see the module docs).
/// `progress` prints per-tensor progress to stderr; `cancel`, once set, stops the export between
/// chunks and removes what it wrote.
pub fn export_gguf(
    gguf: &Path,
    out: &Path,
    progress: bool,
    cancel: Option<&AtomicBool>,
) -> Result<GgufExportSummary> {
    // 1. The GGUF as a model (every check of `qwen3 inference FILE.gguf`), and its metadata.
    let file = ModelFile::open(gguf)?;
    let meta = GgufFile::open(gguf)?;
    let h = meta.header();
    let config = file.config().clone();
    let mut conversions: Vec<(String, usize, &'static str)> = Vec::new();
    for t in &h.tensors {
        let name = t.ggml_type.name;
        match conversions.iter_mut().find(|(n, _, _)| n == name) {
            Some(c) => c.1 += 1,
            None => conversions.push((name.to_string(), 1, becomes(name))),
        }
    }
    let left_out_note = Some(gguf::model::blocks(h)?.mtp)
        .filter(|&n| n > 0)
        .map(|n| {
            let s = if n == 1 { "" } else { "s" };
            format!(
                "{n} multi-token-prediction layer{s} left out (the forward pass does not run them)"
            )
        });

    // 2. The companions, under temporary names until the model file is complete.
    let companions = Companions::beside(out);
    let result = (|| -> Result<(String, Option<String>, u64, u32)> {
        let tokenizer = gguf::tokenizer::tokenizer_data(h, config.vocab_size)
            .with_context(|| format!("{}: the GGUF's tokenizer", gguf.display()))?;
        std::fs::write(&companions.tokenizer, tokenizer.to_bytes())
            .with_context(|| format!("{}: cannot write", companions.tokenizer.display()))?;
        let tokenizer_note = format!(
            "tokenizer: {} tokens from the GGUF's tokenizer.ggml.* ({:?} pre-tokenizer)",
            tokenizer.len(),
            tokenizer.split_pattern
        );
        let template_note = match gguf::tokenizer::template_file(h) {
            None => None,
            Some(t) => {
                // Compiled now, so that a template our Jinja engine cannot parse fails here.
                ChatTemplate::from_file(t.clone(), gguf)?;
                std::fs::write(&companions.template, t.to_json())
                    .with_context(|| format!("{}: cannot write", companions.template.display()))?;
                Some(format!(
                    "chat template: {} chars from the GGUF's tokenizer.chat_template",
                    t.chat_template.chars().count()
                ))
            }
        };
        check_cancel(cancel)?;
        // 3. The model file: each tensor's bytes as the GGUF opened them.
        let (bytes, version) = write_model(&file, out, progress, cancel)?;
        Ok((tokenizer_note, template_note, bytes, version))
    })();
    let (tokenizer_note, template_note, model_bytes, version) = match result {
        Ok(r) => r,
        Err(e) => {
            companions.discard();
            return Err(e);
        }
    };
    // 4. Into place (an older template beside `out` goes when the GGUF has none).
    let companions = companions.into_place(template_note.is_some())?;
    Ok(GgufExportSummary {
        config,
        model_path: out.to_path_buf(),
        model_bytes,
        version,
        conversions,
        tokenizer_path: companions.tokenizer,
        tokenizer_note,
        template_path: companions.template,
        template_note,
        left_out_note,
    })
}

/// Streams every tensor of `file` (a GGUF opened as a model) into model file `out`. Returns the
/// file's size and format version.
fn write_model(
    file: &ModelFile,
    out: &Path,
    progress: bool,
    cancel: Option<&AtomicBool>,
) -> Result<(u64, u32)> {
    let tensors = &file.header().tensors;
    let specs = tensors.iter().map(|t| t.spec()).collect();
    let mut w = ModelWriter::create(out, file.config(), specs)?;
    let version = w.version();
    let total = w.file_len();
    for (i, t) in tensors.iter().enumerate() {
        let bytes = file.tensor_bytes(&t.name)?;
        // The model file lays a tensor out as the GGUF's open does (values, then scales).
        ensure!(
            bytes.len() as u64 == w.entries()[i].nbytes,
            "tensor {}: {} bytes where the model file plans {}",
            t.name,
            bytes.len(),
            w.entries()[i].nbytes
        );
        w.begin(&t.name, t.dtype)?;
        for chunk in bytes.chunks(8 << 20) {
            check_cancel(cancel)?;
            w.data(chunk)?;
        }
        w.end()?;
        if progress {
            eprint!(
                "\r\x1b[2K[{}/{}] {} ({}, {:.1} of {:.1} MiB)",
                i + 1,
                tensors.len(),
                t.name,
                t.dtype,
                (w.entries()[i].offset + w.entries()[i].nbytes) as f64 / (1u64 << 20) as f64,
                total as f64 / (1u64 << 20) as f64
            );
        }
    }
    if progress {
        eprintln!();
    }
    w.finish()?;
    Ok((total, version))
}
