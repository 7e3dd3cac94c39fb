//! `qwen3 tokenize`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct TokenizeArgs {}

pub fn run(_args: TokenizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 tokenize` is not implemented yet")
}
