//! Text a command reads from a file or, given `-`, from standard input (as most Unix tools do).

use anyhow::{Context, Result};
use std::io::Read;
use std::path::Path;

/// The exact contents of `path` (no newline trimmed or added), or of stdin when it is `-`;
/// an error names the file (or "stdin") and says whether it could not be read or is not UTF-8.
pub fn read_text(path: &Path) -> Result<String> {
    let (bytes, name) = if path.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut b)
            .context("stdin: cannot read")?;
        (b, "stdin".to_string())
    } else {
        let b = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
        (b, path.display().to_string())
    };
    String::from_utf8(bytes)
        .map_err(|e| e.utf8_error())
        .with_context(|| format!("{name}: not valid UTF-8 text"))
}
