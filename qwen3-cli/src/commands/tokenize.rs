//! `qwen3 tokenize <model.bin> [TEXT] [-f FILE] [--show-pieces]`: text -> token ids with the
//! model's tokenizer file (`<model>.tokenizer.bin`, written by `qwen3 export`).

use super::input::read_text;
use anyhow::{bail, Result};
use clap::Args;
use qwen3_inference::tokenizer::Tokenizer;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

#[derive(Args)]
pub struct TokenizeArgs {
    /// Model file; its companion `<model>.tokenizer.bin` is read (the model itself is not).
    pub model: PathBuf,
    /// The text to encode; `-` reads it from stdin.
    #[arg(conflicts_with = "file")]
    pub text: Option<String>,
    /// Encode this file's exact contents (no newline trimmed or added); `-` is stdin.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// One line per token: id and the token's text, quoted and escaped.
    #[arg(long)]
    pub show_pieces: bool,
    /// Only the text's own tokens: leave out what tokenizer.json's post-processor adds around
    /// them (a BOS, for DeepSeek-R1-Distill-Qwen; Qwen adds nothing). As HF's
    /// `encode(text, add_special_tokens=False)`.
    #[arg(long)]
    pub no_special_tokens: bool,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) if t == "-" => read_text(std::path::Path::new("-"))?,
        (Some(t), None) => t.clone(),
        (None, Some(path)) => read_text(path)?,
        _ => bail!("give the text to encode, or -f FILE (- for stdin)"),
    };
    let tok = open_tokenizer(&args.model)?;
    let ids = match args.no_special_tokens {
        true => tok.encode(&text),
        false => tok.encode_with_special_tokens(&text),
    };

    let mut out = String::new();
    if args.show_pieces {
        for &id in &ids {
            let bytes = tok.token_bytes(id).unwrap_or_default();
            let mark = if tok.is_special(id) {
                "  (special)"
            } else {
                ""
            };
            writeln!(out, "{id:>6}  {}{mark}", readable(bytes))?;
        }
    } else {
        out.push_str(&serde_json::to_string(&ids)?);
        out.push('\n');
    }
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

/// The tokenizer of `model` (model_text.rs: its tokenizer file, or a GGUF's own).
pub fn open_tokenizer(model: &std::path::Path) -> Result<Tokenizer> {
    super::model_text::tokenizer(model)
}

/// A token's bytes as a quoted string a terminal can show: escapes for quotes, backslashes and
/// control characters, and `\xNN` for bytes that are not (yet) a whole UTF-8 character -- a
/// token may hold half of an emoji.
fn readable(bytes: &[u8]) -> String {
    let mut s = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c.is_control() => {
                    let _ = write!(s, "\\u{{{:x}}}", c as u32);
                }
                c => s.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(s, "\\x{b:02X}");
        }
    }
    s.push('"');
    s
}
