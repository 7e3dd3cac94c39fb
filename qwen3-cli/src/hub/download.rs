//! Downloads into the HuggingFace cache with HuggingFace's own client, the `hf-hub` crate (its
//! blocking `ureq` API: no async runtime). It writes the cache in huggingface_hub's layout
//! (`cache.rs`), resumes a file cut off earlier from its `.part` (an HTTP `Range` request), sends
//! `HF_TOKEN` (or the token `huggingface-cli login` saved) for gated repositories, and talks to
//! `HF_ENDPOINT` when it is set (a mirror).

use super::cache::{is_needed, repo_dir};
use super::gguf_repo::{parts, pick, GgufRef};
use super::RepoRef;
use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::api::Progress;
use hf_hub::api::RepoInfo;
use hf_hub::{Cache, Repo, RepoType};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let (r, info) = file_list(root, repo, &ep)?;
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

/// A handle on `repo` at the hub `ep`, and the repository's file list.
fn file_list(root: &Path, repo: &RepoRef, ep: &str) -> Result<(Fetcher, RepoInfo)> {
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| Cache::new(root.to_path_buf()).token());
    let api: Api = ApiBuilder::from_cache(Cache::new(root.to_path_buf()))
        .with_endpoint(ep.to_string())
        .with_token(token)
        .with_progress(false)
        .with_retries(3)
        .build()
        .map_err(|e| explain(e, repo, ep, root))?;
    let hub_repo = Repo::with_revision(repo.id.clone(), RepoType::Model, repo.revision.clone());
    eprintln!("{repo}: not in the HuggingFace cache; downloading from {ep}");
    let (a, rr) = (api.clone(), hub_repo.clone());
    let info = watched(ep, "the file list", move |_| a.repo(rr).info())?
        .map_err(|e| explain(e, repo, ep, root))?;
    let r = Fetcher {
        api,
        repo: hub_repo,
    };
    Ok((r, info))
}

/// Downloads the GGUF file `r` names (`gguf_repo.rs`) into the cache under `root`, that file
/// only (a split file: each of its parts); returns its path (the first part's).
pub fn gguf_file(root: &Path, r: &GgufRef) -> Result<PathBuf> {
    let ep = endpoint();
    let (fetcher, info) = file_list(root, &r.repo, &ep)?;
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let file = pick(r, &files, true)?;
    // A split file's parts, each unless the cache has it already (a download cut short after
    // some parts starts again from the first one missing).
    let snapshot = super::cache::snapshot_dir(root, &r.repo);
    let mut paths = Vec::new();
    for part in parts(&file) {
        let cached = snapshot.as_ref().map(|dir| dir.join(&part));
        paths.push(match cached.filter(|p| std::fs::File::open(p).is_ok()) {
            Some(path) => path,
            None => fetch(&fetcher, &part, &r.repo, &ep, root)?,
        });
    }
    Ok(paths.swap_remove(0))
}

/// What a download thread needs to make its own handle on the repository.
struct Fetcher {
    api: Api,
    repo: Repo,
}

/// One file into the cache, unless it is there already; a progress bar on a terminal.
fn fetch(r: &Fetcher, file: &str, repo: &RepoRef, ep: &str, root: &Path) -> Result<PathBuf> {
    if !std::io::stderr().is_terminal() {
        eprintln!("{repo}: {file}");
    }
    let (api, hub_repo, name) = (r.api.clone(), r.repo.clone(), file.to_string());
    let result = watched(ep, file, move |beat| {
        let bar = std::io::stderr().is_terminal().then(Bar::default);
        api.repo(hub_repo)
            .download_with_progress(&name, Watched { beat, bar })
    })?;
    result.map_err(|e| explain(e, repo, ep, root).context(format!("downloading {file}")))
}

/// How long the hub may send nothing (no answer, no bytes) before a request is given up:
/// `QWEN3_HUB_TIMEOUT` seconds, 60 by default.
fn silence_limit() -> Duration {
    let s = std::env::var("QWEN3_HUB_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(60);
    Duration::from_secs(s)
}

/// The last sign of life of a request: milliseconds after `start`.
struct Beat {
    start: Instant,
    last_ms: AtomicU64,
}

impl Beat {
    fn alive(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        self.start.elapsed() - Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Runs `f`, a request to the hub at `ep` about `what`, on a thread of its own, and gives up with
/// an error naming the host if nothing comes for [`silence_limit`]: a host that never accepts the
/// connection, or accepts it and never answers (the hub client has no timeouts of its own). `f`
/// marks progress on the [`Beat`] it gets (a download's bytes); a request without progress has
/// the limit for all of it. A thread given up on is left to end with the process.
fn watched<T: Send + 'static>(
    ep: &str,
    what: &str,
    f: impl FnOnce(Arc<Beat>) -> T + Send + 'static,
) -> Result<T> {
    let limit = silence_limit();
    let beat = Arc::new(Beat {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let b = beat.clone();
    std::thread::spawn(move || {
        let _ = tx.send(f(b));
    });
    loop {
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(v) => return Ok(v),
            Err(RecvTimeoutError::Disconnected) => bail!("the download of {what} failed"),
            Err(RecvTimeoutError::Timeout) if beat.silent_for() > limit => {
                let host = ep.split("://").nth(1).unwrap_or(ep);
                let host = host.split('/').next().unwrap_or(host);
                bail!(
                    "{host} did not answer for {} s ({what}): the hub or the network is down or stalled (QWEN3_HUB_TIMEOUT sets the limit; --offline uses the HuggingFace cache only)",
                    limit.as_secs()
                );
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// A download's progress: the [`Beat`] that [`watched`] reads, and a bar on a terminal.
struct Watched {
    beat: Arc<Beat>,
    bar: Option<Bar>,
}

impl Progress for Watched {
    fn init(&mut self, size: usize, filename: &str) {
        self.beat.alive();
        if let Some(b) = &mut self.bar {
            b.init(size, filename);
        }
    }
    fn update(&mut self, size: usize) {
        self.beat.alive();
        if let Some(b) = &mut self.bar {
            b.update(size);
        }
    }
    fn finish(&mut self) {
        self.beat.alive();
        if let Some(b) = &mut self.bar {
            b.finish();
        }
    }
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
