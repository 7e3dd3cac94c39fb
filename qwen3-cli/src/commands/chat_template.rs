//! `qwen3 chat-template`. (Not implemented yet.)

use clap::Args;

#[derive(Args)]
pub struct ChatTemplateArgs {}

pub fn run(_args: ChatTemplateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`qwen3 chat-template` is not implemented yet")
}
