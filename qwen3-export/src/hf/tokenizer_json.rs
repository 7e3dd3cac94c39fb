//! tokenizer.json -> the pico-qwen tokenizer file. (Placeholder until the tokenizer work lands.)

use anyhow::Result;
use std::path::Path;

/// Reads `hf_dir/tokenizer.json`, checks every id is below `vocab_size`, and writes the tokenizer
/// file to `out` atomically. Returns a one-line summary for the export log.
pub fn export_tokenizer(hf_dir: &Path, out: &Path, vocab_size: u32) -> Result<String> {
    let _ = (hf_dir, out, vocab_size);
    anyhow::bail!("tokenizer export is not implemented yet")
}
