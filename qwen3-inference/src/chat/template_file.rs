//! The template file (`<model>.template.json`): the model's own chat template, as exported.
//!
//! It is JSON so a reader can open it and see exactly what the runtime will render with:
//!
//! ```text
//! {
//!   "format": "pico-qwen chat template",
//!   "version": 1,
//!   "source": "tokenizer_config.json",           where the template came from
//!   "chat_template": "{%- if tools %} ...",      the raw Jinja source, unchanged
//!   "named_templates": {"tool_use": "..."},      the other named templates, if the model has several
//!   "special_tokens": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
//! }
//! ```
//!
//! `special_tokens` holds the values transformers passes to every template render
//! (`tokenizer.special_tokens_map`: bos/eos/unk/sep/pad/cls/mask tokens that are set, as strings).
//! Nothing in it is derived by us: the exporter copies it from the checkpoint
//! (`qwen3_export::hf::chat_template`), the runtime ([`super::ChatTemplate`]) renders it.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The value of the `format` field; anything else is not a template file.
pub const TEMPLATE_FORMAT: &str = "pico-qwen chat template";
/// Bumped on any change of the fields' meaning. A reader refuses any other version.
pub const TEMPLATE_VERSION: u32 = 1;

/// The special-token names transformers 5.23.0 passes to a chat template
/// (`PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES`, rendered through `special_tokens_map`).
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The parsed template file. See the module documentation for the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    pub format: String,
    pub version: u32,
    /// The checkpoint file(s) the templates were read from, for `qwen3 info` and error messages.
    pub source: String,
    /// The template transformers uses by default (the `"default"` one when there are several).
    pub chat_template: String,
    /// Every other named template (transformers picks `"tool_use"` when tools are given).
    #[serde(default)]
    pub named_templates: BTreeMap<String, String>,
    /// `bos_token`, `eos_token`, ... as strings; only those the checkpoint sets.
    #[serde(default)]
    pub special_tokens: BTreeMap<String, String>,
}

impl TemplateFile {
    /// A template file of the current version.
    pub fn new(
        source: String,
        chat_template: String,
        named_templates: BTreeMap<String, String>,
        special_tokens: BTreeMap<String, String>,
    ) -> TemplateFile {
        TemplateFile {
            format: TEMPLATE_FORMAT.to_string(),
            version: TEMPLATE_VERSION,
            source,
            chat_template,
            named_templates,
            special_tokens,
        }
    }

    /// Parses and checks a template file's text. `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<TemplateFile> {
        let f: TemplateFile = serde_json::from_str(text)
            .with_context(|| format!("{}: not a valid template file", path.display()))?;
        if f.format != TEMPLATE_FORMAT {
            anyhow::bail!(
                "{}: not a template file (format is {:?}, expected {:?})",
                path.display(),
                f.format,
                TEMPLATE_FORMAT
            );
        }
        if f.version != TEMPLATE_VERSION {
            anyhow::bail!(
                "{}: template file version {} is not supported (this build reads version {}); \
                 re-export the model",
                path.display(),
                f.version,
                TEMPLATE_VERSION
            );
        }
        if let Some(name) = f
            .special_tokens
            .keys()
            .find(|k| !SPECIAL_TOKEN_NAMES.contains(&k.as_str()))
        {
            anyhow::bail!("{}: unknown special token name {name:?}", path.display());
        }
        Ok(f)
    }

    /// Reads and checks the template file at `path`.
    pub fn read(path: &Path) -> Result<TemplateFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read template file", path.display()))?;
        TemplateFile::parse(&text, path)
    }

    /// The file's text: pretty JSON, ending in a newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("strings and maps always serialize");
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TemplateFile {
        let mut named = BTreeMap::new();
        named.insert("tool_use".to_string(), "{{ 'tools' }}".to_string());
        let mut special = BTreeMap::new();
        special.insert("eos_token".to_string(), "<|im_end|>".to_string());
        TemplateFile::new(
            "tokenizer_config.json".into(),
            "{{ messages }}".into(),
            named,
            special,
        )
    }

    #[test]
    fn round_trips_through_json() {
        let f = sample();
        let back = TemplateFile::parse(&f.to_json(), Path::new("t.json")).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn refuses_other_versions_and_formats() {
        let p = Path::new("m.template.json");
        let mut f = sample();
        f.version = TEMPLATE_VERSION + 1;
        let e = TemplateFile::parse(&f.to_json(), p).unwrap_err();
        assert!(format!("{e:#}").contains("m.template.json: template file version 2"));
        let mut f = sample();
        f.format = "something else".into();
        let e = TemplateFile::parse(&f.to_json(), p).unwrap_err();
        assert!(format!("{e:#}").contains("not a template file"));
        let e = TemplateFile::parse("{\"format\": 1", p).unwrap_err();
        assert!(format!("{e:#}").starts_with("m.template.json: not a valid template file"));
        let mut f = sample();
        f.special_tokens.insert("foo_token".into(), "x".into());
        let e = TemplateFile::parse(&f.to_json(), p).unwrap_err();
        assert!(format!("{e:#}").contains("unknown special token name \"foo_token\""));
    }
}
