//! A repository id where a model file is expected (`qwen3 inference Qwen/Qwen3-0.6B`): exported
//! once into a models directory, and that file used on every later run.

use super::{checkpoint_dir, RepoRef};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Where models named by their repository id are exported: `--models-dir`, else
/// `QWEN3_MODELS_DIR`, else `$XDG_DATA_HOME/qwen3/models` (`~/.local/share/qwen3/models`).
pub fn models_dir(flag: Option<&Path>) -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = flag
        .map(Path::to_path_buf)
        .or_else(|| var("QWEN3_MODELS_DIR"))
    {
        return dir;
    }
    let data = var("XDG_DATA_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("qwen3").join("models")
}

/// The repository `model` names, when it names one: not an existing path, and not a missing
/// `x.bin` (a missing model file, which opening reports, not a repository named `x.bin`).
pub fn as_repo(model: &Path) -> Option<RepoRef> {
    let is_file_name = model.extension().is_some_and(|e| e == "bin");
    if model.exists() || is_file_name {
        return None;
    }
    model.to_str().and_then(RepoRef::parse)
}

/// The model file for `model`: `model` itself when it is a file (or anything that is not a
/// repository id: opening it then says what is wrong); for a repository id, its export in the
/// models directory, made now if it is not there yet.
pub fn resolve(model: &Path, dir_flag: Option<&Path>, offline: bool) -> Result<PathBuf> {
    if model.exists() {
        return Ok(model.to_path_buf());
    }
    // A name ollama has pulled: its GGUF file.
    if let Some(name) = model.to_str() {
        if let Some(file) = super::ollama::find(name)? {
            eprintln!("{name}: ollama's {}", file.display());
            return Ok(file);
        }
        // A hub repository's GGUF file (`ORG/NAME-GGUF:Q8_0`): run as it is, not exported.
        if let Some(r) = super::gguf_repo::GgufRef::parse(name) {
            return super::gguf_repo::gguf_file(&r, super::offline(offline));
        }
    }
    // `models/qwen3.bin` that does not exist is a missing model file (opening it says so), not
    // a repository named `qwen3.bin`.
    let is_file_name = model.extension().is_some_and(|e| e == "bin");
    let Some(repo) = model
        .to_str()
        .and_then(RepoRef::parse)
        .filter(|_| !is_file_name)
    else {
        return Ok(model.to_path_buf());
    };
    let dir = models_dir(dir_flag);
    let file = dir.join(format!("{}.bin", repo.to_string().replace('/', "--")));
    if file.exists() {
        eprintln!("{repo}: {}", file.display());
        return Ok(file);
    }
    let checkpoint = checkpoint_dir(&repo, super::offline(offline))?;
    let group = group_size(&checkpoint)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create the models directory", dir.display()))?;
    eprintln!(
        "{repo}: exporting it once to {} (q8, group size {group}); later runs use that file",
        file.display()
    );
    // A `qwen3 export` of its own: Ctrl-C during it removes its partial files (the export
    // command's handler), whatever handler this command installs later.
    let exe = std::env::current_exe().context("cannot find the qwen3 executable")?;
    let status = std::process::Command::new(exe)
        .arg("export")
        .arg(&checkpoint)
        .arg(&file)
        .args(["--group-size", &group.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run qwen3 export")?;
    if !status.success() {
        bail!(
            "{repo}: the export to {} failed (see above)",
            file.display()
        );
    }
    Ok(file)
}

/// The q8 group size for a checkpoint: 64, the default, or the largest valid one below it (one
/// that divides every matrix row, `qwen3_export::valid_group_sizes`; 64 divides every real
/// model's rows, the tiny test checkpoints' not always).
fn group_size(checkpoint: &Path) -> Result<u32> {
    let json = qwen3_export::hf::config::read_json(&checkpoint.join("config.json"))?;
    let c = qwen3_export::hf::config::parse_config(&json)?;
    let valid = qwen3_export::valid_group_sizes(&c);
    Ok(valid.into_iter().filter(|&g| g <= 64).max().unwrap_or(1))
}
