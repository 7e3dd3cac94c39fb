//! `qwen3 export <hf_dir> <out.bin>`: HuggingFace checkpoint -> model file + companions.

use anyhow::{bail, Result};
use clap::Args;
use qwen3_export::{export, ExportOptions};
use qwen3_inference::format::DType;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExportArgs {
    /// HuggingFace checkpoint directory (config.json, *.safetensors, tokenizer.json, ...).
    pub hf_dir: PathBuf,
    /// Model file to write; the tokenizer and template files are written beside it.
    pub out: PathBuf,
    /// Values per INT8 scale for `--dtype q8`; must divide every matrix row length.
    #[arg(long, default_value_t = 64)]
    pub group_size: u32,
    /// How to store the matrices: q8 (group-wise INT8), bf16, or f32. Norms are always f32.
    #[arg(long, default_value = "q8")]
    pub dtype: String,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let Some(dtype) = DType::parse(&args.dtype) else {
        bail!("--dtype {:?}: expected q8, bf16 or f32", args.dtype);
    };
    let start = std::time::Instant::now();
    let opts = ExportOptions {
        dtype,
        group_size: args.group_size,
        progress: std::io::stderr().is_terminal(),
    };
    let s = export(&args.hf_dir, &args.out, &opts)?;
    let c = &s.config;
    let storage = match dtype {
        DType::Q8 => format!("q8, group size {}", c.group_size),
        other => other.to_string(),
    };
    println!(
        "{}: {} ({} layers, hidden {}), {} from {} weights, {:.1} MB in {:.1} s",
        s.model_path.display(),
        c.architecture,
        c.num_hidden_layers,
        c.hidden_size,
        storage,
        s.source_dtypes.join("+"),
        s.model_bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    println!("{}: {}", s.tokenizer_path.display(), s.tokenizer_note);
    println!("{}: {}", s.template_path.display(), s.template_note);
    Ok(())
}
