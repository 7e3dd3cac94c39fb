//! sentence-transformers' files beside a checkpoint, which say that it is an embedding model and
//! how a text's vector is made from the hidden states: `modules.json` lists the pipeline
//! (`Transformer`, then `Pooling`, then optionally `Normalize`), and the pooling module's
//! `config.json` its mode. Qwen3-Embedding ships exactly `Transformer`, `Pooling` with
//! `pooling_mode_lasttoken`, `Normalize` (sentence-transformers' `models/Pooling.py` and
//! `models/Normalize.py` define them). Anything else is refused by name rather than guessed.

use super::config::read_json;
use anyhow::{bail, Result};
use qwen3_inference::format::EmbeddingConfig;
use serde_json::Value;
use std::path::Path;

/// The pooling modes of sentence-transformers' `Pooling` config, and the one implemented.
const POOLING_MODES: [&str; 6] = [
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
];
const LAST_TOKEN: &str = "pooling_mode_lasttoken";

/// The embedding head `hf_dir`'s sentence-transformers files describe, or `None` when it has no
/// `modules.json` with a `Pooling` module (a language model).
pub fn embedding_config(hf_dir: &Path) -> Result<Option<EmbeddingConfig>> {
    let path = hf_dir.join("modules.json");
    if !path.exists() {
        return Ok(None);
    }
    let modules = read_json(&path)?;
    let Some(list) = modules.as_array() else {
        bail!("{}: not a list of modules", path.display());
    };
    let (mut pooling, mut normalize) = (None, false);
    for m in list {
        let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
        let dir = m.get("path").and_then(Value::as_str).unwrap_or("");
        match ty.rsplit('.').next().unwrap_or("") {
            "Transformer" => {}
            "Pooling" => pooling = Some(dir.to_string()),
            "Normalize" => normalize = true,
            other => bail!(
                "{}: module {other:?} ({ty}) is not supported: only Transformer, Pooling (last token) and Normalize",
                path.display()
            ),
        }
    }
    let Some(dir) = pooling else {
        return Ok(None);
    };
    // Pooling's config: exactly one mode on, and it must be the last token's.
    let cfg_path = hf_dir.join(&dir).join("config.json");
    let cfg = read_json(&cfg_path)?;
    let on: Vec<&str> = POOLING_MODES
        .into_iter()
        .filter(|k| cfg.get(*k).and_then(Value::as_bool).unwrap_or(false))
        .collect();
    if on != [LAST_TOKEN] {
        bail!(
            "{}: pooling {on:?} is not supported: only {LAST_TOKEN} (Qwen3-Embedding's)",
            cfg_path.display()
        );
    }
    Ok(Some(EmbeddingConfig { normalize }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(modules: &str, pooling: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "pq-st-{}-{}",
            std::process::id(),
            modules.len() * 31 + pooling.len()
        ));
        std::fs::create_dir_all(d.join("1_Pooling")).unwrap();
        std::fs::write(d.join("modules.json"), modules).unwrap();
        std::fs::write(d.join("1_Pooling/config.json"), pooling).unwrap();
        d
    }

    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    /// Qwen3-Embedding's files give last-token pooling and normalisation; mean pooling, a Dense
    /// module, or no files at all are told apart.
    #[test]
    fn reads_qwen3_embedding_and_refuses_the_rest() {
        let last = r#"{"word_embedding_dimension": 64, "pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false}"#;
        let d = dir_with(MODULES, last);
        let e = embedding_config(&d).unwrap().unwrap();
        assert!(e.normalize);
        std::fs::remove_dir_all(&d).unwrap();

        let mean = r#"{"word_embedding_dimension": 64, "pooling_mode_mean_tokens": true}"#;
        let d = dir_with(MODULES, mean);
        let err = format!("{:#}", embedding_config(&d).unwrap_err());
        assert!(err.contains("pooling_mode_mean_tokens"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();

        let dense = MODULES.replace("models.Normalize", "models.Dense");
        let d = dir_with(&dense, last);
        let err = format!("{:#}", embedding_config(&d).unwrap_err());
        assert!(err.contains("Dense"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();

        assert!(embedding_config(Path::new("/nonexistent"))
            .unwrap()
            .is_none());
    }
}
