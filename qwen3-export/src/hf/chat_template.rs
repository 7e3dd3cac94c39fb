//! The checkpoint's chat template(s) -> the pico-qwen template file (`<model>.template.json`).
//!
//! Where transformers 5.23.0 (`PreTrainedTokenizerBase.from_pretrained` on a local directory)
//! finds the template, in its order:
//! 1. `chat_template.jinja` in the checkpoint directory, plus every
//!    `additional_chat_templates/<name>.jinja`; these take priority over tokenizer_config.json;
//! 2. otherwise `chat_template` in `tokenizer_config.json`: a string, or a list of
//!    `{"name": ..., "template": ...}` (the one named `"default"` is used unless tools are given
//!    and one is named `"tool_use"`).
//!
//! The special tokens a template may reference (`bos_token`, `eos_token`, ...) come from
//! tokenizer_config.json, either as strings or as AddedToken objects `{"content": "...", ...}`.
//! The Jinja source is stored unchanged; the runtime renders it (see `docs/chat.md`).

use anyhow::{Context, Result};
use qwen3_inference::chat::template_file::SPECIAL_TOKEN_NAMES;
use qwen3_inference::chat::{ChatTemplate, TemplateFile};
use qwen3_inference::format::atomic::write_atomic;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Reads the chat template(s) and special tokens of `hf_dir` and writes the template file to
/// `out` atomically. A checkpoint without a chat template is an error naming the file.
/// Returns a one-line summary for the export log.
pub fn export_chat_template(hf_dir: &Path, out: &Path) -> Result<String> {
    let file = read_chat_template(hf_dir)?;
    // Compile it now, so a template our Jinja engine cannot parse fails the export, not the chat.
    ChatTemplate::from_file(file.clone(), &hf_dir.join(&file.source))?;
    write_atomic(out, file.to_json().as_bytes())?;
    let named = if file.named_templates.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = file.named_templates.keys().map(String::as_str).collect();
        format!(" and {} named ({})", names.len(), names.join(", "))
    };
    Ok(format!(
        "chat template: {} chars from {}{named}, special tokens: {}",
        file.chat_template.chars().count(),
        file.source,
        if file.special_tokens.is_empty() {
            "none".to_string()
        } else {
            file.special_tokens
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    ))
}

/// Builds the template file's contents from a checkpoint directory (see the module docs).
pub fn read_chat_template(hf_dir: &Path) -> Result<TemplateFile> {
    let config_path = hf_dir.join("tokenizer_config.json");
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("{}: cannot read", config_path.display()))?;
    let config: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: malformed JSON", config_path.display()))?;
    let Value::Object(config) = config else {
        anyhow::bail!("{}: not a JSON object", config_path.display());
    };

    let mut special_tokens = BTreeMap::new();
    for name in SPECIAL_TOKEN_NAMES {
        let token = match config.get(name) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => s.clone(),
            // AddedToken serialized as {"__type": "AddedToken", "content": "...", ...}.
            Some(Value::Object(o)) => match o.get("content") {
                Some(Value::String(s)) => s.clone(),
                _ => anyhow::bail!(
                    "{}: {name} is an object without a \"content\" string",
                    config_path.display()
                ),
            },
            Some(other) => anyhow::bail!(
                "{}: {name} must be a string or an AddedToken object, not {other}",
                config_path.display()
            ),
        };
        special_tokens.insert(name.to_string(), token);
    }

    let (source, mut templates) = match read_jinja_files(hf_dir)? {
        Some(found) => found,
        None => (
            "tokenizer_config.json".to_string(),
            templates_from_config(&config, &config_path)?,
        ),
    };
    let default = templates.remove("default").with_context(|| {
        format!(
            "{}: the model has several chat templates ({}) and none is named \"default\"",
            hf_dir.join(&source).display(),
            templates.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    })?;
    Ok(TemplateFile::new(
        source,
        default,
        templates,
        special_tokens,
    ))
}

/// `chat_template` of tokenizer_config.json as a name -> source map (a lone string is "default").
fn templates_from_config(
    config: &serde_json::Map<String, Value>,
    path: &Path,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    match config.get("chat_template") {
        None | Some(Value::Null) => anyhow::bail!(
            "{}: no chat_template (and no chat_template.jinja beside it): this checkpoint has no \
             chat template, so it cannot chat",
            path.display()
        ),
        Some(Value::String(s)) => {
            out.insert("default".to_string(), s.clone());
        }
        Some(Value::Array(list)) => {
            for (i, item) in list.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                let (Some(name), Some(template)) = (name, template) else {
                    anyhow::bail!(
                        "{}: chat_template[{i}] must have \"name\" and \"template\" strings",
                        path.display()
                    );
                };
                out.insert(name.to_string(), template.to_string());
            }
            if out.is_empty() {
                anyhow::bail!("{}: chat_template is an empty list", path.display());
            }
        }
        Some(other) => anyhow::bail!(
            "{}: chat_template must be a string or a list of named templates, not {}",
            path.display(),
            match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                _ => "an object",
            }
        ),
    }
    Ok(out)
}

/// `chat_template.jinja` and `additional_chat_templates/*.jinja`, if the checkpoint has them.
fn read_jinja_files(hf_dir: &Path) -> Result<Option<(String, BTreeMap<String, String>)>> {
    let mut out = BTreeMap::new();
    let mut sources = Vec::new();
    let main = hf_dir.join("chat_template.jinja");
    if main.is_file() {
        let s = std::fs::read_to_string(&main)
            .with_context(|| format!("{}: cannot read", main.display()))?;
        out.insert("default".to_string(), s);
        sources.push("chat_template.jinja".to_string());
    }
    let dir = hf_dir.join("additional_chat_templates");
    if dir.is_dir() {
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("{}: cannot list", dir.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("{}: cannot list", dir.display()))?
                .path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".jinja"))
            else {
                continue;
            };
            let s = std::fs::read_to_string(&path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            out.insert(name.to_string(), s);
            if !sources.iter().any(|s| s.starts_with("additional")) {
                sources.push("additional_chat_templates/".to_string());
            }
        }
    }
    if out.is_empty() {
        Ok(None)
    } else {
        Ok(Some((sources.join(" + "), out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwen3_inference::chat::Message;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/chat")
    }

    /// A fresh temporary directory under the target dir (no tempfile crate).
    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "pico-qwen-chat-export-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn hf_dir_with_config(name: &str, config: &Value) -> PathBuf {
        let d = temp_dir(name.trim_end_matches(".json"));
        std::fs::write(
            d.join("tokenizer_config.json"),
            serde_json::to_string(config).unwrap(),
        )
        .unwrap();
        d
    }

    /// Exports the template of fixture `config`, then renders every case of fixture `cases`
    /// (rendered by transformers 5.23.0) and compares the text exactly.
    fn export_and_render_cases(config: &str, cases: &str, expect_cases: usize) -> ChatTemplate {
        let text = std::fs::read_to_string(fixtures().join(config)).unwrap();
        let d = hf_dir_with_config(config, &serde_json::from_str(&text).unwrap());
        let out = d.join("m.template.json");
        export_chat_template(&d, &out).unwrap();
        let t = ChatTemplate::open(&out).unwrap();
        let cases = load_cases(cases);
        assert_eq!(cases.len(), expect_cases);
        for case in cases {
            let (messages, tools, gen, thinking, rendered) = case_parts(&case);
            let got = t
                .render_json(&messages, tools.as_deref(), gen, thinking)
                .unwrap_or_else(|e| panic!("{}: {e:#}", case["name"]));
            assert_eq!(got, rendered, "case {}", case["name"]);
            // The typed API gives the same text wherever the messages fit `Message`.
            if let Ok(typed) = serde_json::from_value::<Vec<Message>>(Value::Array(messages)) {
                assert_eq!(t.render(&typed, gen, thinking).unwrap(), rendered);
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
        t
    }

    #[test]
    fn qwen3_export_renders_every_hf_case() {
        let t = export_and_render_cases(
            "qwen3-tokenizer_config.json",
            "chat-template-cases.json",
            13,
        );
        assert_eq!(t.special_token("eos_token"), Some("<|im_end|>"));
        assert_eq!(t.special_token("pad_token"), Some("<|endoftext|>"));
        assert_eq!(t.special_token("bos_token"), None);
        assert_eq!(t.default_thinking(), Some(true));
    }

    #[test]
    fn deepseek_r1_0528_qwen3_export_renders_every_hf_case() {
        let t = export_and_render_cases(
            "deepseek-r1-0528-qwen3-tokenizer_config.json",
            "deepseek-r1-0528-qwen3-cases.json",
            8,
        );
        // AddedToken objects in tokenizer_config.json become their content.
        assert_eq!(
            t.special_token("bos_token"),
            Some("<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>")
        );
        // This template has no enable_thinking switch.
        assert_eq!(t.default_thinking(), None);
    }

    fn load_cases(name: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["cases"].as_array().unwrap().clone()
    }

    type CaseParts = (Vec<Value>, Option<Vec<Value>>, bool, Option<bool>, String);

    fn case_parts(case: &Value) -> CaseParts {
        let messages = case["messages"].as_array().unwrap().clone();
        let tools = case["tools"].as_array().cloned();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let thinking = case["template_kwargs"]
            .get("enable_thinking")
            .and_then(Value::as_bool);
        let rendered = case["rendered"].as_str().unwrap().to_string();
        (messages, tools, gen, thinking, rendered)
    }

    #[test]
    fn added_token_objects_and_named_templates() {
        let config = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "chat_template": [
                {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"},
                {"name": "tool_use", "template": "{{ bos_token }}tools: {{ tools|length }} {{ messages[0].content }}"}
            ]
        });
        let d = hf_dir_with_config("named", &config);
        let out = d.join("m.template.json");
        export_chat_template(&d, &out).unwrap();
        let t = ChatTemplate::open(&out).unwrap();
        assert_eq!(t.file().special_tokens.len(), 2);
        assert_eq!(t.special_token("bos_token"), Some("<s>"));
        let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
        assert_eq!(t.render_json(&msgs, None, true, None).unwrap(), "<s>hi");
        let tools = [serde_json::json!({"type": "function"})];
        assert_eq!(
            t.render_json(&msgs, Some(&tools), true, None).unwrap(),
            "<s>tools: 1 hi"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn chat_template_jinja_takes_priority() {
        let d = hf_dir_with_config("jinja", &serde_json::json!({"chat_template": "config"}));
        std::fs::write(d.join("chat_template.jinja"), "file\n").unwrap();
        let f = read_chat_template(&d).unwrap();
        assert_eq!(f.chat_template, "file\n");
        assert_eq!(f.source, "chat_template.jinja");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_checkpoints_are_clear_errors() {
        let err = |d: &Path| {
            let out = d.join("m.template.json");
            let e = format!("{:#}", export_chat_template(d, &out).unwrap_err());
            assert!(!out.exists(), "no output after an error");
            e
        };
        let d = temp_dir("missing");
        let e = err(&d);
        assert!(e.contains("tokenizer_config.json: cannot read"), "{e}");
        std::fs::write(d.join("tokenizer_config.json"), "{\"eos_token\": ").unwrap();
        assert!(err(&d).contains("tokenizer_config.json: malformed JSON"));
        std::fs::write(d.join("tokenizer_config.json"), "{\"eos_token\": \"x\"}").unwrap();
        assert!(err(&d).contains("tokenizer_config.json: no chat_template"));
        std::fs::write(d.join("tokenizer_config.json"), "{\"chat_template\": 3}").unwrap();
        assert!(err(&d).contains("chat_template must be a string or a list"));
        std::fs::write(
            d.join("tokenizer_config.json"),
            r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
        )
        .unwrap();
        assert!(err(&d).contains("none is named \"default\""));
        std::fs::write(
            d.join("tokenizer_config.json"),
            r#"{"chat_template": "{% if %}"}"#,
        )
        .unwrap();
        assert!(err(&d).contains("chat template does not compile"));
        // transformers' {% generation %} extension tag (assistant masks) is not supported.
        std::fs::write(
            d.join("tokenizer_config.json"),
            r#"{"chat_template": "{% generation %}x{% endgeneration %}"}"#,
        )
        .unwrap();
        let e = err(&d);
        assert!(
            e.contains("tokenizer_config.json: chat template does not compile"),
            "{e}"
        );
        std::fs::write(
            d.join("tokenizer_config.json"),
            r#"{"chat_template": "x", "eos_token": 5}"#,
        )
        .unwrap();
        assert!(err(&d).contains("eos_token must be a string or an AddedToken object"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
