//! `qwen3 export <hf_dir | ORG/NAME[@REV] | FILE.gguf> <out.bin>`: HuggingFace checkpoint ->
//! model file + companions. A repository id is looked up in the HuggingFace cache, and
//! downloaded into it when it is not there (`crate::hub`). A GGUF file is copied tensor by
//! tensor as it runs, requantizing nothing (`qwen3_export::gguf`).

use anyhow::{bail, Context, Result};
use clap::Args;
use qwen3_export::gguf::export_gguf;
use qwen3_export::{export, ExportOptions, Interrupted};
use qwen3_inference::format::{DType, MixDType, Q4Mix};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Args)]
pub struct ExportArgs {
    /// HuggingFace checkpoint directory (config.json, *.safetensors, tokenizer.json, ...), or a
    /// repository id such as Qwen/Qwen3-0.6B (@REVISION optional): taken from the HuggingFace
    /// cache, downloaded into it if missing (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE are honoured);
    /// or a GGUF file, or a hub repository's GGUF by its quantization
    /// (Qwen/Qwen3-0.6B-GGUF:Q8_0), whose tensors are written as they run (no flag below
    /// applies).
    pub hf_dir: PathBuf,
    /// Model file to write; the tokenizer and template files are written beside it.
    pub out: PathBuf,
    /// Values per scale for `--dtype q8` (default 64) or q4 (default 32); must divide every
    /// matrix row length.
    #[arg(long)]
    pub group_size: Option<u32>,
    /// How to store the matrices: q8 (group-wise INT8), q4 (group-wise 4-bit; the embedding
    /// table, the classifier and the sensitive layers' v_proj and down_proj in 6 bits, see
    /// --tables and --sensitive), bf16, or f32. Norms are always f32.
    /// [default: q8]
    #[arg(long)]
    pub dtype: Option<String>,
    /// With `--dtype q4`: how to store the embedding table and the classifier, q6 (the default,
    /// as llama.cpp's Q4_K_M), q8 (more accurate, larger) or q4 (smaller, faster decode; what
    /// each costs: docs/quantization.md). As llama-quantize's --token-embedding-type /
    /// --output-tensor-type.
    #[arg(long, value_parser = ["q8", "q6", "q4"])]
    pub tables: Option<String>,
    /// With `--dtype q4`: how to store v_proj and down_proj in half the layers (the first and
    /// last eighth and every third between, llama.cpp Q4_K_M's choice), q6 (the default, as
    /// Q4_K_M), q8 (more accurate, larger) or q4 (smaller, faster decode; docs/quantization.md).
    #[arg(long, value_parser = ["q8", "q6", "q4"])]
    pub sensitive: Option<String>,
    /// With a repository id: use the HuggingFace cache only, never the network (as
    /// HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
}

pub fn run(args: ExportArgs) -> Result<()> {
    if super::model_text::is_gguf(&args.hf_dir) {
        return run_gguf(&args, &args.hf_dir);
    }
    // A hub repository's GGUF file (`ORG/NAME-GGUF:Q8_0`), from the cache or downloaded.
    let gguf = args
        .hf_dir
        .to_str()
        .and_then(crate::hub::gguf_repo::GgufRef::parse);
    if let Some(r) = gguf.filter(|_| !args.hf_dir.exists()) {
        let file = crate::hub::gguf_repo::gguf_file(&r, crate::hub::offline(args.offline))?;
        return run_gguf(&args, &file);
    }
    // q6 is a dtype of tensors inside q4 files (--tables, --sensitive), not of a file.
    let name = args.dtype.as_deref().unwrap_or("q8");
    let Some(dtype) = DType::parse(name).filter(|&d| d != DType::Q6) else {
        bail!("--dtype {name:?}: expected q8, q4, bf16 or f32");
    };
    let group_size = args
        .group_size
        .unwrap_or(if dtype == DType::Q4 { 32 } else { 64 });
    // Said before the export starts, so that a user can stop it and choose again.
    if let Some(why) = qwen3_inference::kernels::dot::scalar_only(dtype, group_size as usize) {
        eprintln!("warning: {why}, many times slower (--group-size 32 avoids it)");
    }
    let source = match args.hf_dir.to_str().and_then(crate::hub::RepoRef::parse) {
        Some(repo) if !args.hf_dir.exists() => {
            crate::hub::checkpoint_dir(&repo, crate::hub::offline(args.offline))?
        }
        _ => args.hf_dir.clone(),
    };
    let start = std::time::Instant::now();
    let interrupted = on_ctrl_c()?;
    for (flag, value) in [("--tables", &args.tables), ("--sensitive", &args.sensitive)] {
        if value.is_some() && dtype != DType::Q4 {
            bail!("{flag} applies to --dtype q4 only");
        }
    }
    // clap accepts only the names MixDType::parse knows.
    let finer = |flag: &Option<String>, default: MixDType| {
        flag.as_deref().and_then(MixDType::parse).unwrap_or(default)
    };
    let q4_mix = Q4Mix {
        tables: finer(&args.tables, Q4Mix::default().tables),
        sensitive: finer(&args.sensitive, Q4Mix::default().sensitive),
    };
    let opts = ExportOptions {
        dtype,
        group_size,
        q4_mix,
        progress: std::io::stderr().is_terminal(),
        cancel: Some(interrupted),
    };
    let s = stop_if_interrupted(export(&source, &args.out, &opts), &args.out)?;
    let c = &s.config;
    let storage = match dtype {
        DType::Q8 => format!("q8, group size {}", c.group_size),
        DType::Q4 => format!(
            "q4 (embedding and classifier {}, sensitive layers {}), group size {}",
            q4_mix.tables.dtype(),
            q4_mix.sensitive.dtype(),
            c.group_size
        ),
        other => other.to_string(),
    };
    println!(
        "{}: {}{} ({} layers, hidden {}), {} from {} weights, {} in {:.1} s",
        s.model_path.display(),
        c.architecture,
        if c.embedding.is_some() {
            ", an embedding model"
        } else {
            ""
        },
        c.num_hidden_layers,
        c.hidden_size,
        storage,
        s.source_dtypes.join("+"),
        super::units::bytes(s.model_bytes),
        start.elapsed().as_secs_f64()
    );
    if dtype == DType::Q4 {
        eprintln!("note: q4 costs accuracy that q8 does not; measure it on your model with `qwen3 perplexity --base` (docs/quantization.md)");
    }
    if let Some(note) = &s.left_out_note {
        println!("{}: {note}", s.model_path.display());
    }
    if let Some(note) = &s.bf16_note {
        println!("{}: {note}", s.model_path.display());
    }
    println!("{}: {}", s.tokenizer_path.display(), s.tokenizer_note);
    println!("{}: {}", s.template_path.display(), s.template_note);
    Ok(())
}

/// Ctrl-C stops an export between chunks; it then removes its partial files and fails with
/// `Interrupted` (exit 130, as a shell reports a process ended by SIGINT).
fn on_ctrl_c() -> Result<&'static AtomicBool> {
    static INTERRUPTED: AtomicBool = AtomicBool::new(false);
    ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))
        .context("cannot install the Ctrl-C handler")?;
    Ok(&INTERRUPTED)
}

/// An export's result; an interrupted one ends the process with 130.
fn stop_if_interrupted<T>(r: Result<T>, out: &Path) -> Result<T> {
    match r {
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("\nexport of {}: {e}", out.display());
            std::process::exit(130);
        }
        r => r,
    }
}

/// `qwen3 export FILE.gguf out.bin`: the GGUF's tensors as it runs them (`qwen3_export::gguf`).
fn run_gguf(args: &ExportArgs, gguf: &Path) -> Result<()> {
    let flags = [
        ("--dtype", args.dtype.is_some()),
        ("--group-size", args.group_size.is_some()),
        ("--tables", args.tables.is_some()),
        ("--sensitive", args.sensitive.is_some()),
    ];
    if let Some((flag, _)) = flags.iter().find(|(_, given)| *given) {
        bail!(
            "{flag}: a GGUF file is exported as it is, requantizing nothing (to change its \
             types, export the HuggingFace checkpoint, or use llama-quantize)"
        );
    }
    let start = std::time::Instant::now();
    let interrupted = on_ctrl_c()?;
    let progress = std::io::stderr().is_terminal();
    let s = stop_if_interrupted(
        export_gguf(gguf, &args.out, progress, Some(interrupted)),
        &args.out,
    )?;
    let c = &s.config;
    println!(
        "{}: {} ({} layers, hidden {}), {} in {:.1} s, format version {}",
        s.model_path.display(),
        c.architecture,
        c.num_hidden_layers,
        c.hidden_size,
        super::units::bytes(s.model_bytes),
        start.elapsed().as_secs_f64(),
        s.version
    );
    // Each GGUF type and what it became: every one is lossless.
    let types: Vec<String> = s
        .conversions
        .iter()
        .map(|(ggml, n, became)| format!("{n} {ggml} {became}"))
        .collect();
    println!(
        "{}: lossless, as the GGUF runs: {}",
        s.model_path.display(),
        types.join(", ")
    );
    if let Some(note) = &s.left_out_note {
        println!("{}: {note}", s.model_path.display());
    }
    println!("{}: {}", s.tokenizer_path.display(), s.tokenizer_note);
    match &s.template_note {
        Some(note) => println!("{}: {note}", s.template_path.display()),
        None => println!(
            "{}: none written: the GGUF has no chat template (tokenizer.chat_template)",
            s.template_path.display()
        ),
    }
    Ok(())
}
