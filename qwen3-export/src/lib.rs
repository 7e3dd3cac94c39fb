//! HuggingFace Qwen3 (or Qwen2) checkpoint directory -> pico-qwen model file, tokenizer file, template file.
//!
//! The steps, in order:
//! 1. read config.json (+ generation_config.json) into a [`ModelConfig`], refusing what we do not
//!    implement;
//! 2. open the safetensors shards and check that every tensor the model needs is there with the
//!    right shape and a supported dtype, and that nothing unexpected is (before writing a byte);
//! 3. write the tokenizer and template files under temporary names;
//! 4. stream the tensors, one at a time, into the model file (quantizing matrices for q8);
//! 5. rename everything into place. A failure at any step leaves no output that looks complete.
//!
//! Before step 1 the destination is checked (its directory exists and takes files; it is not
//! itself a directory), so that a mistake there fails at once, under the name the user gave.
//! [`ExportOptions::cancel`] (the CLI sets it on Ctrl-C) stops the export between chunks, and the
//! temporary files go with the error.

#![forbid(unsafe_code)]

mod companions;
use companions::Companions;
pub mod gguf;
pub mod hf;

use anyhow::{bail, Context, Result};
use hf::checkpoint::{to_bf16_bits, to_f32, Checkpoint, TensorMeta};
use qwen3_inference::format::writer::ModelWriter;
use qwen3_inference::format::{
    expected_tensors, stays_bf16, tensor_specs_with, DType, ExpectedTensor, ModelConfig, Q4Mix,
    TensorKind,
};
use qwen3_inference::quant::{quantize_q4, quantize_q6, quantize_q8};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// How to store the model.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub dtype: DType,
    /// Values per q8 or q4 scale (ignored for bf16 and f32).
    pub group_size: u32,
    /// q4 only: which tensors keep more bits (default: the tables and the sensitive layers).
    pub q4_mix: Q4Mix,
    /// Print per-tensor progress to stderr.
    pub progress: bool,
    /// Set (by a Ctrl-C handler) to stop the export: it is checked between chunks of a few MB,
    /// and the export then fails with [`Interrupted`], having removed what it wrote.
    pub cancel: Option<&'static AtomicBool>,
}

/// The error of an export stopped through [`ExportOptions::cancel`].
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted; the partial files were removed")
    }
}

impl std::error::Error for Interrupted {}

/// Fails with [`Interrupted`] once `cancel` is set.
fn check_cancel(cancel: Option<&AtomicBool>) -> Result<()> {
    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Err(Interrupted.into());
    }
    Ok(())
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            dtype: DType::Q8,
            group_size: 64,
            q4_mix: Q4Mix::default(),
            progress: false,
            cancel: None,
        }
    }
}

/// What an export produced.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    pub config: ModelConfig,
    pub model_path: PathBuf,
    pub model_bytes: u64,
    pub tokenizer_path: PathBuf,
    pub tokenizer_note: String,
    pub template_path: PathBuf,
    pub template_note: String,
    /// Source dtypes seen, for the log (e.g. "bf16").
    pub source_dtypes: Vec<&'static str>,
    /// Tensors of the checkpoint's other parts that the model file leaves out (Qwen3.5's
    /// vision tower and multi-token-prediction layer), said for the log; `None` if there were
    /// none.
    pub left_out_note: Option<String>,
    /// The matrices that stay bf16 because the group size does not divide their rows
    /// (`format::stays_bf16`), said for the log; `None` if there are none.
    pub bf16_note: Option<String>,
}

/// Tensor `name` of the model file, found in the checkpoint: under its own name, or where the
/// family's layout keeps it (`hf/qwen3_5.rs`).
fn source_tensor(ckpt: &Checkpoint, config: &ModelConfig, name: &str) -> Result<TensorMeta> {
    if let Some(t) = hf::qwen3_5::source(ckpt, config, name)? {
        return Ok(t);
    }
    match hf::vision::source(ckpt, name)? {
        Some(t) => Ok(t),
        None => ckpt.tensor(name),
    }
}

/// Tensors a checkpoint may carry that the forward pass recomputes or does not need.
fn is_ignorable(name: &str) -> bool {
    // Old checkpoints saved the rotary inverse frequencies as buffers; we recompute them from
    // rope_theta (HF does too).
    name.ends_with(".rotary_emb.inv_freq")
}

/// Divisors of the row lengths of every quantized matrix: the group sizes with which no matrix of
/// the model stays bf16 (`format::stays_bf16`; any divisor of hidden_size is accepted).
pub fn valid_group_sizes(c: &ModelConfig) -> Vec<u32> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = expected_tensors(c)
        .iter()
        .filter(|t| t.kind == TensorKind::Matrix)
        .map(|t| *t.shape.last().unwrap_or(&1))
        .fold(0, gcd);
    (1..=g.min(4096))
        .filter(|d| g % d == 0)
        .map(|d| d as u32)
        .collect()
}

/// Exports `hf_dir` to `out` (and its companion files). See the module docs for the steps.
pub fn export(hf_dir: &Path, out: &Path, opts: &ExportOptions) -> Result<ExportSummary> {
    let out_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !out_dir.is_dir() {
        bail!(
            "{}: cannot write: directory {} does not exist",
            out.display(),
            out_dir.display()
        );
    }
    // What would otherwise fail only at the end, after minutes of work.
    if out.is_dir() {
        bail!(
            "{}: is a directory; give the model file's path, such as {}",
            out.display(),
            out.join("model.bin").display()
        );
    }
    probe_writable(out, out_dir)?;
    if !hf_dir.is_dir() {
        bail!("{}: not a directory", hf_dir.display());
    }

    // 1. Config.
    let mut config = hf::config::load_config(hf_dir)?;
    config.dtype = opts.dtype;
    let grouped = matches!(opts.dtype, DType::Q8 | DType::Q4);
    config.group_size = if grouped { opts.group_size } else { 0 };
    if opts.q4_mix != Q4Mix::default() && opts.dtype != DType::Q4 {
        bail!(
            "a mix of q4 and finer tensors (--tables, --sensitive) needs --dtype q4, got {}",
            opts.dtype
        );
    }
    if opts.dtype == DType::Q4 && !opts.group_size.is_multiple_of(2) {
        bail!(
            "q4 packs two values a byte: the group size must be even, got {}",
            opts.group_size
        );
    }
    // A group size must divide hidden_size, the row length of nearly every matrix; a matrix whose
    // rows it does not divide stays bf16 (`format::stays_bf16`), said below.
    if grouped && (opts.group_size == 0 || !config.hidden_size.is_multiple_of(opts.group_size)) {
        let list: Vec<String> = (1..=config.hidden_size.min(4096))
            .filter(|d| config.hidden_size.is_multiple_of(*d))
            .map(|v| v.to_string())
            .collect();
        bail!(
            "{}: group size {} does not divide hidden_size {}; valid group sizes: {} (a matrix whose rows one does not divide stays bf16)",
            hf_dir.join("config.json").display(),
            opts.group_size,
            config.hidden_size,
            list.join(", ")
        );
    }

    // 2. Weights: check everything before writing anything.
    let mut ckpt = Checkpoint::open(hf_dir)?;
    if let Some(m) = &config.moe {
        ckpt.expect_experts(config.hidden_size.into(), m.moe_intermediate_size.into());
    }
    let has_lm_head = ckpt.contains("lm_head.weight");
    if !config.tie_word_embeddings && !has_lm_head {
        bail!(
            "{}: tie_word_embeddings is false but the checkpoint has no lm_head.weight",
            hf_dir.join("config.json").display()
        );
    }
    let expected = expected_tensors(&config);
    let mut source_dtypes: Vec<&'static str> = Vec::new();
    for e in &expected {
        let t = source_tensor(&ckpt, &config, &e.name)
            .with_context(|| format!("{}", hf_dir.display()))?;
        if t.shape != e.shape {
            bail!(
                "{}: tensor {} has shape {:?}, config.json implies {:?}",
                t.file.display(),
                e.name,
                t.shape,
                e.shape
            );
        }
        if !source_dtypes.contains(&t.dtype.name()) {
            source_dtypes.push(t.dtype.name());
        }
    }
    let mut left_out = [0usize; 2];
    for name in ckpt.names() {
        let tied_head = name == "lm_head.weight" && config.tie_word_embeddings;
        // transformers 5's fused experts, read above through their per-expert names.
        let fused = config.moe.is_some() && hf::checkpoint::is_fused_expert_tensor(name);
        let tower_kept = config.vision.is_some() && hf::vision::is_tower(name);
        if !tower_kept && hf::qwen3_5::is_other_part(name) {
            left_out[name.starts_with("mtp.") as usize] += 1;
            continue;
        }
        let gathered = config.architecture
            == qwen3_inference::format::architecture::QWEN3_NEXT.name
            && hf::qwen3_5::is_read_through(name);
        if !tied_head
            && !fused
            && !gathered
            && !is_ignorable(name)
            && !expected.iter().any(|e| e.name == name)
        {
            bail!(
                "{}: unexpected tensor {name} (an option this runtime does not implement?)",
                hf_dir.display()
            );
        }
    }

    let parts = [
        "of the vision tower (model.visual.; no preprocessor_config.json)",
        "of the multi-token-prediction layer (mtp.)",
    ];
    let left: Vec<String> = left_out
        .iter()
        .zip(parts)
        .filter(|(&n, _)| n > 0)
        .map(|(n, part)| format!("{n} tensors {part}"))
        .collect();
    let left_out_note = (!left.is_empty()).then(|| {
        format!(
            "left out {}: the text model does not use them",
            left.join(" and ")
        )
    });

    let ungrouped: Vec<&ExpectedTensor> = expected
        .iter()
        .filter(|e| e.kind == TensorKind::Matrix && stays_bf16(&config, &e.shape))
        .collect();
    let bf16_note = (!ungrouped.is_empty()).then(|| {
        let mut widths: Vec<u64> = ungrouped
            .iter()
            .filter_map(|e| e.shape.last().copied())
            .collect();
        widths.sort_unstable();
        widths.dedup();
        let widths: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
        format!(
            "{} matrices stay bf16: the group size {} does not divide their rows ({} wide)",
            ungrouped.len(),
            config.group_size,
            widths.join(", ")
        )
    });

    // 3. Companion files, under temporary names until the model file is complete.
    let companions = Companions::beside(out);
    let result = (|| -> Result<(String, String, u64)> {
        let tokenizer_note =
            hf::tokenizer_json::export_tokenizer(hf_dir, &companions.tokenizer, config.vocab_size)?;
        let template_note = hf::chat_template::export_chat_template(hf_dir, &companions.template)?;
        check_cancel(opts.cancel)?;
        // 4. The model file.
        let model_bytes = write_model(&ckpt, &config, out, opts)?;
        Ok((tokenizer_note, template_note, model_bytes))
    })();
    let (tokenizer_note, template_note, model_bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            companions.discard();
            return Err(e);
        }
    };
    // 5. Into place.
    let companions = companions.into_place(true)?;
    Ok(ExportSummary {
        config,
        model_path: out.to_path_buf(),
        model_bytes,
        tokenizer_path: companions.tokenizer,
        tokenizer_note,
        template_path: companions.template,
        template_note,
        source_dtypes,
        left_out_note,
        bf16_note,
    })
}

/// Creates and removes an empty file beside `out`, so that a destination we cannot write to is
/// reported under the name the user gave (not a temporary one) before any work is done.
fn probe_writable(out: &Path, out_dir: &Path) -> Result<()> {
    let probe = out_dir.join(format!(".qwen3-export-probe.{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "{}: cannot write there (directory {})",
                out.display(),
                out_dir.display()
            )
        }),
    }
}

/// Streams every expected tensor into the model file. Returns the file's size.
fn write_model(
    ckpt: &Checkpoint,
    config: &ModelConfig,
    out: &Path,
    opts: &ExportOptions,
) -> Result<u64> {
    let progress = opts.progress;
    let specs = tensor_specs_with(config, opts.q4_mix);
    let mut w = ModelWriter::create(out, config, specs.clone())?;
    let total = w.file_len();
    let n = specs.len();
    // Reused buffers: a chunk of source rows, its f32 values, its output encoding.
    let (mut raw, mut values) = (Vec::new(), Vec::new());
    let (mut bf16, mut q, mut scales) = (Vec::new(), Vec::new(), Vec::new());
    let (mut packed, mut scales16) = (Vec::new(), Vec::new());
    for (i, spec) in specs.iter().enumerate() {
        let t = source_tensor(ckpt, config, &spec.name)?;
        let rows = t.numel() / t.row_len();
        // Qwen3.5's RMSNorms multiply by 1 + w: the file stores 1 + w (hf/qwen3_5.rs).
        let one_plus = hf::qwen3_5::stores_one_plus(config, &spec.name);
        // About 4 MB of source bytes at a time, whole rows (so q8 groups never straddle chunks).
        let chunk_rows = ((4 << 20) / (t.row_len() * t.bytes_per_value())).max(1);
        w.begin(&spec.name, spec.dtype)?;
        let mut tensor_scales: Vec<f32> = Vec::new();
        let mut tensor_scales16: Vec<u16> = Vec::new();
        let mut first = 0;
        while first < rows {
            // A failure here drops `w`, whose temporary file goes with it.
            check_cancel(opts.cancel)?;
            let nrows = chunk_rows.min(rows - first);
            ckpt.read_rows(&t, first, nrows, &mut raw)?;
            match spec.dtype {
                DType::F32 => {
                    values.clear();
                    to_f32(t.dtype, &raw, &mut values);
                    if one_plus {
                        values.iter_mut().for_each(|v| *v += 1.0);
                    }
                    w.data(bytemuck::cast_slice(&values))?;
                }
                DType::Bf16 => {
                    bf16.clear();
                    to_bf16_bits(t.dtype, &raw, &mut bf16);
                    w.data(bytemuck::cast_slice(&bf16))?;
                }
                DType::Q8 => {
                    values.clear();
                    to_f32(t.dtype, &raw, &mut values);
                    let gs = spec.group_size as usize;
                    q.resize(values.len(), 0i8);
                    scales.resize(values.len() / gs, 0f32);
                    quantize_q8(&values, gs, &mut q, &mut scales);
                    w.data(bytemuck::cast_slice(&q))?;
                    tensor_scales.extend_from_slice(&scales);
                }
                DType::Q4 => {
                    values.clear();
                    to_f32(t.dtype, &raw, &mut values);
                    let gs = spec.group_size as usize;
                    packed.resize(values.len() / 2, 0u8);
                    scales16.resize(values.len() / gs, 0u16);
                    quantize_q4(&values, gs, &mut packed, &mut scales16);
                    w.data(&packed)?;
                    tensor_scales16.extend_from_slice(&scales16);
                }
                DType::Q6 => {
                    values.clear();
                    to_f32(t.dtype, &raw, &mut values);
                    let gs = spec.group_size as usize;
                    packed.resize(values.len() / 4 * 3, 0u8);
                    scales16.resize(values.len() / gs, 0u16);
                    quantize_q6(
                        &values,
                        t.row_len() as usize,
                        gs,
                        &mut packed,
                        &mut scales16,
                    );
                    w.data(&packed)?;
                    tensor_scales16.extend_from_slice(&scales16);
                }
                DType::K(_) => {
                    bail!(
                        "{}: the exporter does not write GGUF's {}",
                        spec.name,
                        spec.dtype
                    )
                }
            }
            first += nrows;
        }
        // After the values, their groups' scales in the dtype's width (its table row's).
        match spec.dtype.scale_bytes() {
            Some(4) => w.q8_scales(&tensor_scales)?,
            Some(2) => w.f16_scales(&tensor_scales16)?,
            Some(n) => unreachable!("{}: no writer for {n}-byte scales", spec.dtype),
            None => {}
        }
        w.end()?;
        if progress {
            let e = &w.entries()[i];
            eprint!(
                "\r\x1b[2K[{}/{}] {} ({} -> {}, {:.1} of {:.1} MiB)",
                i + 1,
                n,
                spec.name,
                t.dtype.name(),
                spec.dtype,
                (e.offset + e.nbytes) as f64 / (1u64 << 20) as f64,
                total as f64 / (1u64 << 20) as f64
            );
        }
    }
    if progress {
        eprintln!();
    }
    w.finish()?;
    Ok(total)
}
