//! tokenizer_config.json's `chat_template` -> the pico-qwen template file. (Placeholder.)

use anyhow::Result;
use std::path::Path;

/// Reads `hf_dir/tokenizer_config.json` and writes the template file to `out` atomically.
/// Returns a one-line summary for the export log.
pub fn export_chat_template(hf_dir: &Path, out: &Path) -> Result<String> {
    let _ = (hf_dir, out);
    anyhow::bail!("chat template export is not implemented yet")
}
