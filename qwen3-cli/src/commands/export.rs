//! `qwen3 export`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct ExportArgs {}

pub fn run(_args: ExportArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 export` is not implemented yet")
}
