//! A model's tokenizer and chat template: the companion files `qwen3 export` writes beside a
//! model file (`x.tokenizer.bin`, `x.template.json`), or, for a GGUF file, its own metadata
//! (`tokenizer.ggml.*` and `tokenizer.chat_template`, read by `gguf/tokenizer.rs`). Every
//! command that reads text finds them here, so a GGUF file runs wherever a model file does.

use anyhow::{bail, Context, Result};
use qwen3_inference::chat::ChatTemplate;
use qwen3_inference::format::companion_paths;
use qwen3_inference::gguf::{self, GgufFile};
use qwen3_inference::tokenizer::Tokenizer;
use std::io::Read;
use std::path::Path;

/// Whether `model` is a GGUF file (by its first bytes; `false` if it cannot be read).
pub fn is_gguf(model: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(model)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|_| gguf::is_gguf(&magic))
}

/// The tokenizer of `model`: its tokenizer file, or a GGUF's own.
pub fn tokenizer(model: &Path) -> Result<Tokenizer> {
    if is_gguf(model) {
        let file = GgufFile::open(model)?;
        let h = file.header();
        // The embedding's rows where the file describes a model; the tokens alone otherwise.
        let rows = match gguf::model::model_config(h) {
            Ok(c) => c.vocab_size,
            Err(_) => match h.get("tokenizer.ggml.tokens") {
                Some(gguf::Value::Array(t)) => u32::try_from(t.len())?,
                _ => 0,
            },
        };
        let data = gguf::tokenizer::tokenizer_data(h, rows)
            .with_context(|| format!("{}: the GGUF's tokenizer", model.display()))?;
        return Ok(Tokenizer::from_data(data));
    }
    let path = companion_paths(model).tokenizer;
    if !path.exists() {
        bail!(
            "{}: tokenizer file not found (`qwen3 export` writes it beside the model file)",
            path.display()
        );
    }
    Tokenizer::open(&path)
}

/// The chat template of `model`, or `None` where it has none (a model exported without one,
/// a GGUF without `tokenizer.chat_template`): such a model still completes text.
pub fn template(model: &Path) -> Result<Option<ChatTemplate>> {
    if is_gguf(model) {
        let file = GgufFile::open(model)?;
        let h = file.header();
        let Some(file) = gguf::tokenizer::template_file(h) else {
            return Ok(None);
        };
        return ChatTemplate::from_file(file, model).map(Some);
    }
    let path = companion_paths(model).template;
    match path.exists() {
        true => ChatTemplate::open(&path).map(Some),
        false => Ok(None),
    }
}

/// [`template`], where a command needs one: a missing template is an error that says where it
/// was looked for.
pub fn needed_template(model: &Path) -> Result<ChatTemplate> {
    match template(model)? {
        Some(t) => Ok(t),
        None if is_gguf(model) => bail!(
            "{}: the GGUF file has no chat template (tokenizer.chat_template)",
            model.display()
        ),
        None => bail!(
            "{}: template file not found (`qwen3 export` writes it beside the model file)",
            companion_paths(model).template.display()
        ),
    }
}
