//! Models by ollama's names (`qwen3:0.6b-q8_0`, `library/qwen3:0.6b`, `hf.co/Qwen/Qwen3-0.6B-GGUF:Q8_0`):
//! the GGUF file ollama pulled, found through its manifest and run as it is, never copied.
//!
//! ollama keeps a name's manifest at `manifests/HOST/NAMESPACE/MODEL/TAG` under its models
//! directory (`OLLAMA_MODELS`, else `~/.ollama/models`), with `HOST` `registry.ollama.ai`,
//! `NAMESPACE` `library` and `TAG` `latest` when the name leaves them out (ollama's
//! `types/model/name.go`). The manifest is an OCI image manifest whose layer of media type
//! `application/vnd.ollama.image.model` is the GGUF file, stored as `blobs/sha256-HEX` for its
//! digest `sha256:HEX`. Its other layers (ollama's own Go template, parameters, licence) are
//! not read: the GGUF carries the chat template transformers renders.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The layer of an ollama manifest that holds the model's GGUF file.
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// ollama's models directory: `OLLAMA_MODELS`, else `~/.ollama/models`.
pub fn models_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("OLLAMA_MODELS").or_else(|| var("HOME").map(|h| h.join(".ollama/models")))
}

/// Where the manifest of `name` lies under `root`, if `name` is one ollama could give:
/// `[HOST/][NAMESPACE/]MODEL[:TAG]`, each part of letters, digits, `.`, `_` and `-`.
fn manifest_path(root: &Path, name: &str) -> Option<PathBuf> {
    let (path, tag) = match name.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, t),
        _ => (name, "latest"),
    };
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let parts: Vec<&str> = path.split('/').collect();
    let (host, namespace, model) = match parts[..] {
        [m] => ("registry.ollama.ai", "library", m),
        [n, m] => ("registry.ollama.ai", n, m),
        [h, n, m] => (h, n, m),
        _ => return None,
    };
    [host, namespace, model, tag]
        .iter()
        .all(|s| ok(s))
        .then(|| {
            root.join("manifests")
                .join(host)
                .join(namespace)
                .join(model)
                .join(tag)
        })
}

/// The GGUF file ollama holds for `name`; `None` when ollama has no model of that name (or no
/// models directory), so that the name can mean something else (a HuggingFace repository).
pub fn find(name: &str) -> Result<Option<PathBuf>> {
    let Some(root) = models_root() else {
        return Ok(None);
    };
    // As given, or lowercased: ollama matches names without regard to case.
    let Some(manifest) = [name.to_owned(), name.to_lowercase()]
        .iter()
        .filter_map(|n| manifest_path(&root, n))
        .find(|p| p.is_file())
    else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("{name}: ollama's manifest {}", manifest.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{name}: ollama's manifest {} is not JSON",
            manifest.display()
        )
    })?;
    let layers = json["layers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(layer) = layers.iter().find(|l| l["mediaType"] == MODEL_LAYER) else {
        bail!(
            "{name}: ollama's manifest {} has no model layer ({MODEL_LAYER})",
            manifest.display()
        );
    };
    let digest = layer["digest"].as_str().unwrap_or_default();
    let Some(hex) = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
    else {
        bail!("{name}: the model layer's digest {digest:?} is not sha256:HEX");
    };
    let blob = root.join("blobs").join(format!("sha256-{hex}"));
    if !blob.is_file() {
        bail!(
            "{name}: ollama's manifest names {}, which is missing (`ollama pull {name}` again)",
            blob.display()
        );
    }
    Ok(Some(blob))
}

/// Every model ollama holds: its name as ollama shows it (`qwen3:0.6b`, `me/tiny:q8`,
/// `hf.co/Qwen/Qwen3-0.6B-GGUF:Q8_0`) and its GGUF file. Manifests that do not lead to a file
/// are left out (running one by name says why).
pub fn list() -> Vec<(String, PathBuf)> {
    let Some(root) = models_root() else {
        return Vec::new();
    };
    let dirs = |p: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
            .collect()
    };
    let mut out = Vec::new();
    for (host, host_dir) in dirs(&root.join("manifests")) {
        for (namespace, ns_dir) in dirs(&host_dir) {
            for (model, model_dir) in dirs(&ns_dir) {
                for (tag, _) in dirs(&model_dir) {
                    // The shortest name that leads back here.
                    let name = match (host.as_str(), namespace.as_str()) {
                        ("registry.ollama.ai", "library") => format!("{model}:{tag}"),
                        ("registry.ollama.ai", ns) => format!("{ns}/{model}:{tag}"),
                        (h, ns) => format!("{h}/{ns}/{model}:{tag}"),
                    };
                    if let Ok(Some(file)) = find(&name) {
                        out.push((name, file));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_ollamas_manifests() {
        let root = Path::new("/m");
        let m = |n: &str| manifest_path(root, n).map(|p| p.display().to_string());
        let at = |s: &str| Some(format!("/m/manifests/{s}"));
        assert_eq!(m("qwen3"), at("registry.ollama.ai/library/qwen3/latest"));
        assert_eq!(
            m("qwen3:0.6b-q8_0"),
            at("registry.ollama.ai/library/qwen3/0.6b-q8_0")
        );
        assert_eq!(m("me/tiny:q8"), at("registry.ollama.ai/me/tiny/q8"));
        assert_eq!(
            m("hf.co/Qwen/Qwen3-0.6B-GGUF:Q8_0"),
            at("hf.co/Qwen/Qwen3-0.6B-GGUF/Q8_0")
        );
        for not in ["", "a/b/c/d", "../x", "x:../y", "/abs/path", "q w", "a//b"] {
            assert_eq!(m(not), None, "{not:?}");
        }
    }
}
