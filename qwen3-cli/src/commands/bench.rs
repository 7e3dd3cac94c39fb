//! `qwen3 bench`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 bench` is not implemented yet")
}
