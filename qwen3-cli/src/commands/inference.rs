//! `qwen3 inference`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct InferenceArgs {}

pub fn run(_args: InferenceArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 inference` is not implemented yet")
}
