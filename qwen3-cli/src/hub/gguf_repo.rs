//! A GGUF file of a hub repository by name, as llama.cpp's `-hf` and ollama's `hf.co/` take
//! it: `ORG/NAME:QUANT` (`Qwen/Qwen3-0.6B-GGUF:Q8_0`, a revision as `ORG/NAME@REV:QUANT`). A
//! repository whose name ends in `GGUF` may leave the quantization out: Q4_K_M, llama.cpp's
//! default, or else the repository's only GGUF file.
//!
//! The file is looked for in the HuggingFace cache (`cache.rs`), and downloaded into it when it
//! is not there: that one file (or, for a file split in parts, `-00001-of-00003.gguf` and the
//! rest, every part), not the repository's other quantizations. It then runs as any GGUF file
//! does, mapped, from its first part (docs/gguf.md).

use super::RepoRef;
use anyhow::{bail, Result};
use qwen3_inference::gguf::SplitName;
use std::path::{Path, PathBuf};

/// A repository and the quantization asked for (`None`: the default, see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufRef {
    pub repo: RepoRef,
    pub quant: Option<String>,
}

impl GgufRef {
    /// `ORG/NAME[@REV]:QUANT`, or `ORG/NAME[@REV]` where NAME ends in `GGUF` (any case); `None`
    /// for anything else (a safetensors repository, a path, an ollama name without an org).
    pub fn parse(s: &str) -> Option<GgufRef> {
        let (name, quant) = match s.rsplit_once(':') {
            Some((name, q)) => {
                if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return None;
                }
                (name, Some(q.to_string()))
            }
            None => (s, None),
        };
        let repo = RepoRef::parse(name)?;
        let gguf_repo = repo.id.to_ascii_lowercase().ends_with("gguf");
        (quant.is_some() || gguf_repo).then_some(GgufRef { repo, quant })
    }
}

impl std::fmt::Display for GgufRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => write!(f, "{}", self.repo),
        }
    }
}

/// Whether file name `name` carries quantization `quant` as a whole word: `Qwen3-0.6B-Q8_0.gguf`
/// has `Q8_0` (any case), `x-Q4_K_M.gguf` has `Q4_K_M` but not `Q4_K`.
fn has_quant(name: &str, quant: &str) -> bool {
    let (name, quant) = (name.to_ascii_lowercase(), quant.to_ascii_lowercase());
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    stem.match_indices(&quant).any(|(at, _)| {
        !word(stem[..at].chars().next_back()) && !word(stem[at + quant.len()..].chars().next())
    })
}

/// The repository file `r` names among `files` (paths in the repository; `whole`: all of them,
/// not only those a cache holds): its quantization's GGUF file (see the module docs), or the
/// first part of one split in parts, when every part is there ([`parts`] names them all).
/// Vision projectors (`mmproj`) are not models.
pub fn pick(r: &GgufRef, files: &[String], whole: bool) -> Result<String> {
    let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
    let models: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| !base(f).to_ascii_lowercase().contains("mmproj"))
        .collect();
    if models.is_empty() {
        bail!("{r}: the repository holds no GGUF file");
    }
    let quant = r.quant.as_deref().unwrap_or("Q4_K_M");
    let found: Vec<&String> = models
        .iter()
        .copied()
        .filter(|f| has_quant(&base(f), quant))
        .collect();
    // One entry a file: a split file's parts are one file, named by its first part.
    let (found, all) = (by_file(&found), by_file(&models));
    let found = match (found.as_slice(), &r.quant) {
        ([], None) if whole && all.len() == 1 => all,
        _ => found,
    };
    match found.as_slice() {
        [(one, None)] => Ok(one.to_string()),
        [] => {
            let mut names: Vec<String> = models.iter().map(|f| base(f)).collect();
            names.sort();
            bail!(
                "{r}: no {quant} GGUF file in the repository; it has {}",
                names.join(", ")
            )
        }
        [(_, Some(missing))] => Err(MissingParts {
            what: format!(
                "{r}: {quant} is a GGUF file split in parts, of which {}",
                if whole { "the repository" } else { "the cache" }
            ),
            missing: missing.clone(),
            why: "",
        }
        .into()),
        many => {
            let names: Vec<&str> = many.iter().map(|(f, _)| f.as_str()).collect();
            bail!(
                "{r}: {} GGUF files match {quant} ({}); name the file's quantization exactly",
                many.len(),
                names.join(", ")
            )
        }
    }
}

/// A file split in parts, some of which are not there: which, and where they were looked for.
#[derive(Debug)]
pub struct MissingParts {
    /// "ORG/NAME:QUANT: Q4_K_M is a GGUF file split in parts, of which the cache".
    what: String,
    missing: Vec<String>,
    /// Why they count as missing, when they are listed but do not open.
    why: &'static str,
}

impl std::fmt::Display for MissingParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} lacks {}{}",
            self.what,
            self.missing.join(", "),
            self.why
        )
    }
}

impl std::error::Error for MissingParts {}

/// `names` one entry a file, in order: a file's name, or a split file's first part's with the
/// parts `names` lacks (`None`: it has them all).
fn by_file(names: &[&String]) -> Vec<(String, Option<Vec<String>>)> {
    let mut files: Vec<(String, Option<Vec<String>>)> = Vec::new();
    for f in names {
        let all = parts(f);
        if files.iter().any(|(first, _)| *first == all[0]) {
            continue;
        }
        let missing: Vec<String> = all
            .iter()
            .filter(|p| !names.iter().any(|n| n == p))
            .cloned()
            .collect();
        files.push((all[0].clone(), Some(missing).filter(|m| !m.is_empty())));
    }
    files
}

/// The bytes of GGUF file `path` (a split file's first part: every part's, beside it).
pub fn size(path: &Path) -> u64 {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    parts(name)
        .iter()
        .filter_map(|p| std::fs::metadata(path.with_file_name(p)).ok())
        .map(|m| m.len())
        .sum()
}

/// Every part of the file `name` is part of (its own name alone when it is not split), in
/// order: `PREFIX-00001-of-0000N.gguf` to `PREFIX-0000N-of-0000N.gguf`.
pub fn parts(name: &str) -> Vec<String> {
    match SplitName::parse(name) {
        Some(split) => (1..=split.count).map(|k| split.part_name(k)).collect(),
        None => vec![name.to_string()],
    }
}

/// The files of the snapshot directory `dir` (relative paths, one folder deep at most, as the
/// hub's GGUF repositories lay them out).
fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        match std::fs::read_dir(e.path()) {
            Ok(sub) => files.extend(
                sub.flatten()
                    .map(|s| format!("{name}/{}", s.file_name().to_string_lossy())),
            ),
            Err(_) => files.push(name),
        }
    }
    files.sort();
    files
}

/// The GGUF file `r` names (a split file's first part): from the HuggingFace cache when it is
/// there (files that open, every part: a symlink into a blob that is gone does not count), else
/// downloaded into it (unless `offline`).
pub fn gguf_file(r: &GgufRef, offline: bool) -> Result<PathBuf> {
    let root = super::cache::hub_cache();
    let snapshot = super::cache::snapshot_dir(&root, &r.repo);
    let found = snapshot.as_ref().map(|dir| -> Result<PathBuf> {
        let first = pick(r, &snapshot_files(dir), false)?;
        let gone: Vec<String> = (parts(&first).into_iter())
            .filter(|p| std::fs::File::open(dir.join(p)).is_err())
            .collect();
        if gone.is_empty() {
            return Ok(dir.join(first));
        }
        Err(MissingParts {
            what: format!("{r}: the cache"),
            missing: gone,
            why: " (their links point to blobs that are gone)",
        }
        .into())
    });
    let cached = match found {
        Some(Ok(path)) => Some(path),
        // Offline, a split file the cache holds part of is named with what it lacks, not
        // reported as absent (online, the download fetches only the missing parts).
        Some(Err(e)) if offline && e.is::<MissingParts>() => bail!(
            "{e}, and offline (--offline or HF_HUB_OFFLINE) forbids downloading {}",
            if e.downcast_ref::<MissingParts>()
                .is_some_and(|m| m.missing.len() == 1)
            {
                "it"
            } else {
                "them"
            }
        ),
        _ => None,
    };
    super::cached_or_downloaded(super::Wanted::Gguf(r), &root, cached, offline)
}

/// The GGUF files of the HuggingFace cache (each repository's `main`), by the name that runs
/// each: `ORG/NAME:QUANT`, the quantization being the last word of the file's name
/// (`Qwen3-0.6B-Q8_0.gguf`: `Q8_0`) when that name picks the file back.
pub fn list() -> Vec<(String, PathBuf)> {
    let root = super::cache::hub_cache();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return found;
    };
    for e in entries.flatten() {
        let dir = e.file_name().to_string_lossy().to_string();
        let Some(id) = dir
            .strip_prefix("models--")
            .map(|n| n.replacen("--", "/", 1))
        else {
            continue;
        };
        let Some(repo) = RepoRef::parse(&id) else {
            continue;
        };
        let Some(snap) = super::cache::snapshot_dir(&root, &repo) else {
            continue;
        };
        let files = snapshot_files(&snap);
        for f in files
            .iter()
            .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        {
            let base = f.rsplit('/').next().unwrap_or(f);
            // A split file by its first part, named without the part's number.
            let stem = match SplitName::parse(base) {
                Some(split) if split.part == 1 => split.prefix,
                Some(_) => continue,
                None => &base[..base.len() - ".gguf".len()],
            };
            let Some(quant) = stem.rsplit(['-', '.']).next().filter(|q| *q != stem) else {
                continue;
            };
            let r = GgufRef {
                repo: repo.clone(),
                quant: Some(quant.to_string()),
            };
            let path = snap.join(f);
            let present = parts(f).iter().all(|p| snap.join(p).exists());
            if pick(&r, &files, false).ok().as_deref() == Some(f) && present {
                found.push((r.to_string(), path));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_parse_as_llama_cpp_and_ollama_take_them() {
        let r = GgufRef::parse("Qwen/Qwen3-0.6B-GGUF:Q8_0").unwrap();
        assert_eq!(
            (
                r.repo.id.as_str(),
                r.repo.revision.as_str(),
                r.quant.as_deref()
            ),
            ("Qwen/Qwen3-0.6B-GGUF", "main", Some("Q8_0"))
        );
        let r = GgufRef::parse("unsloth/Qwen3.5-4B-GGUF@v2:q4_k_m").unwrap();
        assert_eq!(
            (r.repo.revision.as_str(), r.quant.as_deref()),
            ("v2", Some("q4_k_m"))
        );
        assert_eq!(GgufRef::parse("Qwen/Qwen3-0.6B-GGUF").unwrap().quant, None);
        // A safetensors repository, an ollama name, a path, an empty or odd quantization.
        for not in [
            "Qwen/Qwen3-0.6B",
            "qwen3:0.6b",
            "./a/b:Q8_0",
            "a/b:",
            "a/b:Q8-0",
        ] {
            assert_eq!(GgufRef::parse(not), None, "{not}");
        }
    }

    #[test]
    fn the_quantization_picks_one_file() {
        let repo = files(&[
            "README.md",
            "Qwen3-0.6B-Q4_K_M.gguf",
            "Qwen3-0.6B-Q4_K_S.gguf",
            "Qwen3-0.6B-Q8_0.gguf",
            "Qwen3-0.6B-BF16.gguf",
            "mmproj-Qwen3-0.6B-F16.gguf",
        ]);
        let pick_ = |name: &str| pick(&GgufRef::parse(name).unwrap(), &repo, true);
        assert_eq!(pick_("o/x-GGUF:q8_0").unwrap(), "Qwen3-0.6B-Q8_0.gguf");
        assert_eq!(pick_("o/x-GGUF").unwrap(), "Qwen3-0.6B-Q4_K_M.gguf");
        assert_eq!(pick_("o/x-GGUF:BF16").unwrap(), "Qwen3-0.6B-BF16.gguf");
        let e = pick_("o/x-GGUF:Q4_K").unwrap_err().to_string();
        assert!(
            e.contains("no Q4_K GGUF file") && e.contains("Qwen3-0.6B-Q8_0.gguf"),
            "{e}"
        );
        assert!(!e.contains("mmproj"), "{e}");
        let split = files(&[
            "Q4_K_M/Qwen3.5-397B-Q4_K_M-00001-of-00002.gguf",
            "Q4_K_M/Qwen3.5-397B-Q4_K_M-00002-of-00002.gguf",
        ]);
        let q4_k_m = GgufRef::parse("o/x-GGUF:Q4_K_M").unwrap();
        assert_eq!(pick(&q4_k_m, &split, true).unwrap(), split[0]);
        assert_eq!(parts(&split[0]), split);
        assert_eq!(parts(&split[1]), split);
        assert_eq!(parts("a-Q8_0.gguf"), ["a-Q8_0.gguf"]);
        // A part missing (from a cache that holds only one): not found, named.
        let e = pick(&q4_k_m, &split[1..], false).unwrap_err();
        assert!(
            e.to_string().contains(
                "Q4_K_M is a GGUF file split in parts, of which the cache lacks \
                 Q4_K_M/Qwen3.5-397B-Q4_K_M-00001-of-00002.gguf"
            ),
            "{e}"
        );
        // Two split files of one quantization: as ambiguous as two files.
        let mut two = split.clone();
        two.extend(files(&[
            "b-Q4_K_M-00001-of-00002.gguf",
            "b-Q4_K_M-00002-of-00002.gguf",
        ]));
        let e = pick(&q4_k_m, &two, true).unwrap_err().to_string();
        assert!(e.contains("2 GGUF files match Q4_K_M"), "{e}");
        // A repository's only file, split, named without its quantization.
        let only = GgufRef::parse("o/x-GGUF").unwrap();
        assert_eq!(pick(&only, &split, true).unwrap(), split[0]);
        // Not a split's name: no five digits, a part past the count, not a GGUF.
        for not in [
            "a-1-of-2.gguf",
            "a-00003-of-00002.gguf",
            "a-00001-to-00002.gguf",
            "a-00001-of-00002",
        ] {
            assert_eq!(SplitName::parse(not), None, "{not}");
        }
        let one = files(&["tiny.gguf"]);
        let default = GgufRef::parse("o/x-GGUF").unwrap();
        assert_eq!(pick(&default, &one, true).unwrap(), "tiny.gguf");
        // A cache's one file is not the repository's only one.
        assert!(pick(&default, &one, false).is_err());
        assert!(pick(&default, &files(&["a.bin"]), true).is_err());
    }
}
