//! The HuggingFace cache, laid out as Python's `huggingface_hub` lays it out (its guide
//! "Understand caching", and `file_download.py`):
//!
//! ```text
//! ROOT/models--ORG--NAME/
//!     blobs/<etag>                 each file's bytes, named by its etag
//!     refs/<revision>              a branch or tag: the commit hash it points to (a text file)
//!     snapshots/<commit>/<path>    the repository's files at that commit, as relative symlinks
//!                                  into blobs/
//! ```
//!
//! ROOT is `HF_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
//! `~/.cache/huggingface/hub` (huggingface_hub's `constants.py`). A snapshot directory is a
//! checkpoint directory as `export` reads it: the symlinks are followed like files.

use super::RepoRef;
use std::path::{Path, PathBuf};

/// The cache's root directory.
pub fn hub_cache() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var("HF_HUB_CACHE") {
        return p;
    }
    let home = var("HF_HOME").unwrap_or_else(|| {
        let cache = var("XDG_CACHE_HOME")
            .or_else(|| var("HOME").map(|h| h.join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        cache.join("huggingface")
    });
    home.join("hub")
}

/// `ROOT/models--ORG--NAME`.
pub fn repo_dir(root: &Path, id: &str) -> PathBuf {
    root.join(format!("models--{}", id.replace('/', "--")))
}

/// The files of a repository that `export` reads: the configs, the tokenizer, the safetensors
/// weights and their index. (Not `pytorch_model.bin`, README, images, ...)
#[cfg_attr(not(feature = "hub"), allow(dead_code))] // used by the downloader (and its tests)
pub fn is_needed(name: &str) -> bool {
    matches!(
        name,
        "config.json"
            | "generation_config.json"
            | "tokenizer.json"
            | "tokenizer_config.json"
            | "model.safetensors.index.json"
    ) || (name.ends_with(".safetensors") && !name.contains('/'))
}

/// The snapshot of `repo` in the cache under `root` when it holds everything export needs: the
/// commit of a branch or tag from `refs/`, or the commit given.
pub fn snapshot(root: &Path, repo: &RepoRef) -> Option<PathBuf> {
    snapshot_dir(root, repo).filter(|snap| is_complete(snap))
}

/// The snapshot directory of `repo` in the cache under `root`, whatever it holds: the commit of
/// a branch or tag from `refs/`, or the commit given; `None` if the cache has no such ref.
pub fn snapshot_dir(root: &Path, repo: &RepoRef) -> Option<PathBuf> {
    let dir = repo_dir(root, &repo.id);
    let commit = if repo.is_commit() {
        repo.revision.clone()
    } else {
        let r = std::fs::read_to_string(dir.join("refs").join(&repo.revision)).ok()?;
        r.trim().to_string()
    };
    Some(dir.join("snapshots").join(commit))
}

/// Whether `dir` holds config.json, tokenizer.json and every weight file: each shard the index
/// lists, or `model.safetensors`. (A file is there when it can be opened: a symlink into a blob
/// that is gone does not count.)
pub fn is_complete(dir: &Path) -> bool {
    let has = |name: &str| std::fs::File::open(dir.join(name)).is_ok();
    if !has("config.json") || !has("tokenizer.json") {
        return false;
    }
    match std::fs::read_to_string(dir.join("model.safetensors.index.json")) {
        Ok(text) => match shards(&text) {
            Some(files) => files.iter().all(|f| has(f)),
            None => false,
        },
        Err(_) => has("model.safetensors"),
    }
}

/// The shard files of a `model.safetensors.index.json` (the values of its `weight_map`).
pub fn shards(index: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(index).ok()?;
    let mut files: Vec<String> = v["weight_map"]
        .as_object()?
        .values()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    files.sort();
    files.dedup();
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_files_are_what_export_reads() {
        for yes in [
            "config.json",
            "tokenizer.json",
            "model-00001-of-00002.safetensors",
        ] {
            assert!(is_needed(yes), "{yes}");
        }
        for no in [
            "pytorch_model.bin",
            "README.md",
            "onnx/model.safetensors",
            "vocab.json",
        ] {
            assert!(!is_needed(no), "{no}");
        }
    }
}
