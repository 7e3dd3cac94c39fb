//! `qwen3 chat-template <model.bin> <messages.json>`: render a conversation with the model's chat
//! template (the `<model>.template.json` companion), exactly as HuggingFace
//! `tokenizer.apply_chat_template(messages, tokenize=False, ...)` does; with `--ids`, the token ids
//! (`tokenize=True`) as one JSON array.
//!
//! `messages.json` is either a list of messages in HuggingFace's form
//! (`[{"role": "user", "content": "..."}, ...]`, optional `reasoning_content`, `tool_calls`) or an
//! object `{"messages": [...], "tools": [...]}` for tool use.

use anyhow::{Context, Result};
use clap::Args;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ChatTemplateArgs {
    /// Model file; its template file (`<model>.template.json`) is read.
    pub model: PathBuf,
    /// Conversation: a JSON list of messages, or {"messages": [...], "tools": [...]}; `-` reads
    /// it from stdin.
    pub messages: PathBuf,
    /// Pass enable_thinking to the template; without it the template's own default applies.
    #[arg(long, value_parser = ["on", "off"])]
    pub thinking: Option<String>,
    /// Render the conversation as it is, without the assistant header that asks for an answer.
    #[arg(long)]
    pub no_generation_prompt: bool,
    /// Print the token ids of the rendered text (one JSON array) instead of the text.
    #[arg(long)]
    pub ids: bool,
}

pub fn run(args: ChatTemplateArgs) -> Result<()> {
    let template = super::model_text::needed_template(&args.model)?;
    let (messages, tools) = read_messages(&args.messages)?;
    let thinking = args.thinking.as_deref().map(|t| t == "on");
    let text = template
        .render_json(
            &messages,
            tools.as_deref(),
            !args.no_generation_prompt,
            thinking,
        )
        .with_context(|| format!("{}", args.messages.display()))?;
    let mut out = std::io::stdout().lock();
    if args.ids {
        // apply_chat_template(tokenize=True) encodes the rendered text with
        // add_special_tokens=False: the template already wrote every special token.
        let tokenizer = super::model_text::tokenizer(&args.model)?;
        let ids = tokenizer.encode(&text);
        writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    } else {
        // Exactly the rendered text: no newline added.
        out.write_all(text.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// The messages (and tools, if given) of a conversation file.
fn read_messages(path: &Path) -> Result<(Vec<Value>, Option<Vec<Value>>)> {
    let text = super::input::read_text(path)?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: malformed JSON", path.display()))?;
    let shape_error = || {
        anyhow::anyhow!(
            "{}: expected a list of messages or {{\"messages\": [...], \"tools\": [...]}}",
            path.display()
        )
    };
    match v {
        Value::Array(messages) => Ok((messages, None)),
        Value::Object(mut o) => {
            let Some(Value::Array(messages)) = o.remove("messages") else {
                return Err(shape_error());
            };
            if let Some(k) = o.keys().find(|k| *k != "tools") {
                anyhow::bail!("{}: unknown key {k:?}", path.display());
            }
            let tools = match o.remove("tools") {
                None | Some(Value::Null) => None,
                Some(Value::Array(t)) => Some(t),
                Some(_) => anyhow::bail!("{}: \"tools\" must be a list", path.display()),
            };
            Ok((messages, tools))
        }
        _ => Err(shape_error()),
    }
}
