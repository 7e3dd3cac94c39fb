//! `qwen3 detokenize <model.bin> [IDS] [-f FILE] [--skip-special]`: token ids -> text with the
//! model's tokenizer file, as HF `tokenizer.decode(ids, skip_special_tokens=...)`. The inverse of
//! `qwen3 tokenize`, whose output it reads.

use super::input::read_text;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DetokenizeArgs {
    /// Model file; its companion `<model>.tokenizer.bin` is read (the model itself is not).
    pub model: PathBuf,
    /// The ids: a JSON array as `qwen3 tokenize` prints it ('[9707,1879]'), or numbers separated
    /// by spaces or commas; `-` reads them from stdin.
    #[arg(conflicts_with = "file")]
    pub ids: Option<String>,
    /// Read the ids from this file; `-` is stdin.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Leave out special tokens such as `<|im_end|>` (HF's skip_special_tokens).
    #[arg(long)]
    pub skip_special: bool,
}

pub fn run(args: DetokenizeArgs) -> Result<()> {
    let (text, from) = match (&args.ids, &args.file) {
        (Some(t), None) if t == "-" => (read_text(Path::new("-"))?, "stdin".to_string()),
        (Some(t), None) => (t.clone(), "the ids".to_string()),
        (None, Some(path)) => (read_text(path)?, path.display().to_string()),
        _ => bail!("give the ids to decode ('[9707,1879]'), or -f FILE (- for stdin)"),
    };
    let ids = parse_ids(&text).with_context(|| from.clone())?;
    let tok = super::tokenize::open_tokenizer(&args.model)?;
    let text = tok.decode(&ids, args.skip_special)?;
    // The text exactly, no newline added: `qwen3 tokenize m "x" | qwen3 detokenize m -` gives "x".
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// `[1, 2, 3]`, `1 2 3` or `1,2,3` (any mix of brackets, commas and whitespace between numbers).
fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| !w.is_empty())
        .map(|w| {
            w.parse::<u32>()
                .map_err(|_| anyhow::anyhow!("{w:?} is not a token id (a number from 0)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn ids_in_every_form_tokenize_prints_or_people_type() {
        for s in [
            "[9707,1879]",
            "[9707, 1879]\n",
            "9707 1879",
            "9707,1879",
            " 9707\n1879 ",
        ] {
            assert_eq!(parse_ids(s).unwrap(), [9707, 1879], "{s:?}");
        }
        assert_eq!(parse_ids("[]").unwrap(), Vec::<u32>::new());
        let e = parse_ids("[12, x]").unwrap_err().to_string();
        assert!(e.contains("\"x\" is not a token id"), "{e}");
        assert!(parse_ids("-1").is_err());
    }
}
