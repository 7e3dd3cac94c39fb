//! `qwen3 info`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct InfoArgs {}

pub fn run(_args: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 info` is not implemented yet")
}
