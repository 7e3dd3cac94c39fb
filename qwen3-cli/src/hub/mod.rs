//! Models by name: a HuggingFace repository id (`Qwen/Qwen3-0.6B`, or with a revision,
//! `Qwen/Qwen3-0.6B@main`, `@<commit>`) instead of a checkpoint directory or a model file.
//!
//! A name resolves to a checkpoint directory in the HuggingFace cache, the one Python's
//! `huggingface_hub` fills (`cache.rs`): a model any tool downloaded once is used as it is, with
//! no network. What the cache lacks is downloaded into it from the hub, or the mirror
//! `HF_ENDPOINT` names (`download.rs`, HuggingFace's `hf-hub` crate): only the files `export`
//! reads. `--offline` or `HF_HUB_OFFLINE=1` never touches the network.
//!
//! A name ollama has pulled (`qwen3:0.6b-q8_0`) is its GGUF file, run as it is (`ollama.rs`); a
//! hub repository's GGUF file by its quantization (`Qwen/Qwen3-0.6B-GGUF:Q8_0`) too
//! (`gguf_repo.rs`).
//!
//! `qwen3 export NAME out.bin` exports that directory; `qwen3 inference NAME` (and `chat`,
//! `generate`, `serve`, `batch`) export it once into a models directory (`models.rs`) and reuse
//! the file on later runs.

pub mod cache;
#[cfg(feature = "hub")]
mod download;
pub mod gguf_repo;
pub mod models;
pub mod ollama;

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// A repository id and the revision asked for (`main` when none is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `ORG/NAME`.
    pub id: String,
    /// A branch, a tag or a commit hash.
    pub revision: String,
}

impl RepoRef {
    /// Parses `ORG/NAME` or `ORG/NAME@REVISION`; `None` for anything else (a path, for instance).
    /// The hub's rule for names: letters, digits, `-`, `_`, `.`; neither part empty.
    pub fn parse(s: &str) -> Option<RepoRef> {
        let (id, revision) = match s.split_once('@') {
            Some((id, rev)) if !rev.is_empty() => (id, rev),
            Some(_) => return None,
            None => (s, "main"),
        };
        let (org, name) = id.split_once('/')?;
        let ok = |p: &str| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        (ok(org) && ok(name)).then(|| RepoRef {
            id: id.to_string(),
            revision: revision.to_string(),
        })
    }

    /// Whether the revision is a full commit hash (40 hex digits).
    pub fn is_commit(&self) -> bool {
        self.revision.len() == 40 && self.revision.chars().all(|c| c.is_ascii_hexdigit())
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.revision.as_str() {
            "main" => write!(f, "{}", self.id),
            rev => write!(f, "{}@{rev}", self.id),
        }
    }
}

/// Whether `--offline` or `HF_HUB_OFFLINE` (huggingface_hub's values for true) forbid the
/// network.
pub fn offline(flag: bool) -> bool {
    flag || std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.to_ascii_uppercase().as_str()))
}

/// What a name asks the hub for: a checkpoint's files (`export` reads them), or one GGUF file.
#[derive(Clone, Copy)]
enum Wanted<'a> {
    Checkpoint(&'a RepoRef),
    Gguf(&'a gguf_repo::GgufRef),
}

impl std::fmt::Display for Wanted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wanted::Checkpoint(r) => r.fmt(f),
            Wanted::Gguf(r) => r.fmt(f),
        }
    }
}

/// The checkpoint directory of `repo`: its snapshot in the HuggingFace cache when every file
/// export needs is there, else downloaded into the cache first (unless `offline`).
pub fn checkpoint_dir(repo: &RepoRef, offline: bool) -> Result<PathBuf> {
    let root = cache::hub_cache();
    let cached = cache::snapshot(&root, repo);
    cached_or_downloaded(Wanted::Checkpoint(repo), &root, cached, offline)
}

/// `cached` (what the HuggingFace cache under `root` holds of `wanted`) when there is one, else
/// `wanted` downloaded into that cache, unless `offline` forbids it; the one place both kinds of
/// name meet the network.
fn cached_or_downloaded(
    wanted: Wanted,
    root: &Path,
    cached: Option<PathBuf>,
    offline: bool,
) -> Result<PathBuf> {
    if let Some(path) = cached {
        eprintln!("{wanted}: in the HuggingFace cache, {}", path.display());
        return Ok(path);
    }
    if offline {
        bail!(
            "{wanted}: not in the HuggingFace cache ({}), and offline (--offline or HF_HUB_OFFLINE) forbids downloading it",
            root.display()
        );
    }
    download(root, wanted)
}

#[cfg(feature = "hub")]
fn download(root: &Path, wanted: Wanted) -> Result<PathBuf> {
    match wanted {
        Wanted::Checkpoint(repo) => download::snapshot(root, repo),
        Wanted::Gguf(r) => download::gguf_file(root, r),
    }
}

#[cfg(not(feature = "hub"))]
fn download(root: &Path, wanted: Wanted) -> Result<PathBuf> {
    bail!(
        "{wanted}: not in the HuggingFace cache ({}), and this qwen3 was built without downloads (the `hub` feature)",
        root.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_parse_and_paths_do_not() {
        let r = RepoRef::parse("Qwen/Qwen3-0.6B").unwrap();
        assert_eq!(
            (r.id.as_str(), r.revision.as_str()),
            ("Qwen/Qwen3-0.6B", "main")
        );
        let r = RepoRef::parse("Qwen/Qwen2.5-0.5B-Instruct@v1.0").unwrap();
        assert_eq!(r.revision, "v1.0");
        assert_eq!(r.to_string(), "Qwen/Qwen2.5-0.5B-Instruct@v1.0");
        let sha = "a".repeat(40);
        assert!(RepoRef::parse(&format!("a/b@{sha}")).unwrap().is_commit());
        for not in [
            "model.bin",
            "./Qwen/x",
            "/abs/dir",
            "a/b/c",
            "a/",
            "/b",
            "a/b@",
            "../x",
            "a b/c",
        ] {
            assert_eq!(RepoRef::parse(not), None, "{not}");
        }
    }
}
