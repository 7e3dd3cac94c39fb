//! One module per subcommand; each defines its clap `Args` and a `run` function.

pub mod bench;
pub mod chat;
pub mod chat_template;
pub mod export;
pub mod inference;
pub mod info;
pub mod serve;
pub mod tokenize;
