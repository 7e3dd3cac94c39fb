//! `qwen3 list` and `qwen3 rm`: the models exported by name (`qwen3 chat Qwen/Qwen3-0.6B`
//! exports `Qwen--Qwen3-0.6B.bin` and its companions once into the models directory, see
//! `hub::models`), listed and removed by that name, as `ollama list` and `ollama rm` do.

use super::units::bytes;
use crate::hub::models::models_dir;
use anyhow::{bail, Context, Result};
use clap::Args;
use qwen3_inference::format::companion_paths;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ListArgs {
    /// The models directory (default: $QWEN3_MODELS_DIR, else ~/.local/share/qwen3/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct RmArgs {
    /// Models to remove, by the name they were exported by (`Qwen/Qwen3-0.6B`).
    #[arg(required = true)]
    pub names: Vec<String>,
    /// The models directory (default: $QWEN3_MODELS_DIR, else ~/.local/share/qwen3/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
}

/// A model file and its companions: what `rm` removes and `list` counts.
fn files(model: &Path) -> [PathBuf; 3] {
    let c = companion_paths(model);
    [model.to_path_buf(), c.tokenizer, c.template]
}

/// The name a file in the models directory was exported by: `Qwen--Qwen3-0.6B.bin` is
/// `Qwen/Qwen3-0.6B` (`hub::models::resolve` writes `/` as `--`).
fn name_of(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".bin")?;
    (!stem.ends_with(".tokenizer")).then(|| stem.replace("--", "/"))
}

pub fn list(args: ListArgs) -> Result<()> {
    let dir = models_dir(args.models_dir.as_deref());
    let mut rows = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let path = e.path();
            let Some(name) = name_of(&path) else { continue };
            let size: u64 = files(&path)
                .iter()
                .filter_map(|f| std::fs::metadata(f).ok())
                .map(|m| m.len())
                .sum();
            rows.push((name, size, "qwen3 export"));
        }
    }
    // The GGUF files ollama pulled, which run by their ollama name as they are; and those of
    // the HuggingFace cache, by their repository and quantization.
    for (name, file) in crate::hub::ollama::list() {
        let size = std::fs::metadata(&file).map_or(0, |m| m.len());
        rows.push((name, size, "ollama"));
    }
    for (name, file) in crate::hub::gguf_repo::list() {
        let size = crate::hub::gguf_repo::size(&file);
        rows.push((name, size, "HuggingFace cache"));
    }
    if rows.is_empty() {
        eprintln!(
            "no models in {} (a model named by its repository, as in `qwen3 chat Qwen/Qwen3-0.6B`, is exported there), nor in ollama's store, nor GGUF files in the HuggingFace cache",
            dir.display()
        );
        return Ok(());
    }
    rows.sort();
    let width = rows
        .iter()
        .map(|(n, _, _)| n.len())
        .max()
        .unwrap_or(0)
        .max(4);
    println!("{:width$}  {:>10}  FROM", "NAME", "SIZE");
    for (name, size, from) in rows {
        println!("{name:width$}  {:>10}  {from}", bytes(size));
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> Result<()> {
    let dir = models_dir(args.models_dir.as_deref());
    for name in &args.names {
        let model = dir.join(format!("{}.bin", name.replace('/', "--")));
        if !model.exists() {
            bail!(
                "{name}: no such model in {} (`qwen3 list` shows those there)",
                dir.display()
            );
        }
        for f in files(&model).iter().filter(|f| f.exists()) {
            std::fs::remove_file(f).with_context(|| format!("{}: cannot remove", f.display()))?;
        }
        eprintln!("removed {name}");
    }
    Ok(())
}
