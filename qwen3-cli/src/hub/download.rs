//! Downloads into the HuggingFace cache with HuggingFace's own client, the `hf-hub` crate (its
//! blocking `ureq` API: no async runtime). It writes the cache in huggingface_hub's layout
//! (`cache.rs`), resumes a file cut off earlier from its `.part` (an HTTP `Range` request), sends
//! `HF_TOKEN` (or the token `huggingface-cli login` saved) for gated repositories, and talks to
//! `HF_ENDPOINT` when it is set (a mirror).

use super::cache::{is_needed, repo_dir};
use super::RepoRef;
use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// The hub, or the mirror `HF_ENDPOINT` names.
fn endpoint() -> String {
    let e = std::env::var("HF_ENDPOINT").unwrap_or_default();
    match e.trim_end_matches('/') {
        "" => "https://huggingface.co".to_string(),
        e => e.to_string(),
    }
}

/// Downloads what export needs of `repo` into the cache under `root`; returns its snapshot
/// directory. config.json comes first and is checked: an architecture we do not run fails
/// before the weights are fetched.
pub fn snapshot(root: &Path, repo: &RepoRef) -> Result<PathBuf> {
    let ep = endpoint();
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| Cache::new(root.to_path_buf()).token());
    let api: Api = ApiBuilder::from_cache(Cache::new(root.to_path_buf()))
        .with_endpoint(ep.clone())
        .with_token(token)
        .with_progress(false)
        .with_retries(3)
        .build()
        .map_err(|e| explain(e, repo, &ep, root))?;
    let r = api.repo(Repo::with_revision(
        repo.id.clone(),
        RepoType::Model,
        repo.revision.clone(),
    ));
    eprintln!("{repo}: not in the HuggingFace cache; downloading from {ep}");
    let info = r.info().map_err(|e| explain(e, repo, &ep, root))?;
    let mut files: Vec<String> = info
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .filter(|f| is_needed(f))
        .collect();
    if !files.iter().any(|f| f == "config.json") {
        bail!(
            "{repo}: no config.json at {ep}/{}: not a transformers checkpoint",
            repo.id
        );
    }
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        bail!("{repo}: no .safetensors weights (export reads safetensors, not pytorch_model.bin)");
    }
    // 1. config.json first: refuse an architecture we do not run before gigabytes of weights.
    let config = fetch(&r, "config.json", repo, &ep, root)?;
    let json = qwen3_export::hf::config::read_json(&config)?;
    qwen3_export::hf::config::parse_config(&json)
        .with_context(|| format!("{repo}: cannot export it"))?;
    files.retain(|f| f != "config.json");
    // 2. The rest, small files first.
    files.sort_by_key(|f| (f.ends_with(".safetensors"), f.clone()));
    for f in &files {
        fetch(&r, f, repo, &ep, root)?;
    }
    Ok(config
        .parent()
        .context("config.json has no directory")?
        .to_path_buf())
}

/// One file into the cache, unless it is there already; a progress bar on a terminal.
fn fetch(r: &ApiRepo, file: &str, repo: &RepoRef, ep: &str, root: &Path) -> Result<PathBuf> {
    let result = if std::io::stderr().is_terminal() {
        r.download_with_progress(file, Bar::default())
    } else {
        eprintln!("{repo}: {file}");
        r.download(file)
    };
    result.map_err(|e| explain(e, repo, ep, root).context(format!("downloading {file}")))
}

/// One line per failure, saying what to do.
fn explain(e: ApiError, repo: &RepoRef, ep: &str, root: &Path) -> anyhow::Error {
    match e {
        ApiError::TooManyRetries(inner) => explain(*inner, repo, ep, root),
        ApiError::RequestError(err) => match *err {
            ureq::Error::Status(code, resp) => {
                let kind = resp.header("X-Error-Code").unwrap_or("").to_string();
                let msg = resp.header("X-Error-Message").unwrap_or("").to_string();
                match (code, kind.as_str()) {
                    (401 | 403, "GatedRepo") => anyhow!(
                        "{repo} is gated: accept its licence on {ep}/{} and set HF_TOKEN to a token of that account",
                        repo.id
                    ),
                    (404, "RevisionNotFound") => {
                        anyhow!("{repo}: no revision {:?} in {}", repo.revision, repo.id)
                    }
                    (401 | 404, _) => anyhow!(
                        "{repo}: no such model at {ep} (or it is private: set HF_TOKEN){}",
                        if msg.is_empty() { String::new() } else { format!(" ({msg})") }
                    ),
                    (403, _) => anyhow!("{repo}: access refused by {ep} (HTTP 403; HF_TOKEN?)"),
                    _ => anyhow!("{repo}: {ep} answered HTTP {code} {msg}"),
                }
            }
            ureq::Error::Transport(t) => anyhow!(
                "{repo}: cannot reach {ep} ({t}): no network? `--offline` uses the HuggingFace cache only"
            ),
        },
        ApiError::IoError(io) if io.raw_os_error() == Some(libc::ENOSPC) => anyhow!(
            "{repo}: the disk is full while downloading into {} (free some space, or set HF_HUB_CACHE to another disk; the download resumes where it stopped)",
            root.display()
        ),
        ApiError::LockAcquisition(p) => anyhow!(
            "{repo}: another process is downloading the same file ({})",
            p.display()
        ),
        other => anyhow!("{repo}: {other} (cache: {})", repo_dir(root, &repo.id).display()),
    }
}

/// A progress bar per file (indicatif), counting from what a resumed download already had.
#[derive(Default)]
struct Bar(Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        let bar = indicatif::ProgressBar::new(size as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(filename.to_string());
        if let Some(old) = self.0.replace(bar) {
            old.finish_and_clear();
        }
    }
    fn update(&mut self, size: usize) {
        if let Some(b) = &self.0 {
            b.inc(size as u64);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = &self.0 {
            b.finish();
        }
    }
}
