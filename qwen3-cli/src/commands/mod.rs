//! One module per subcommand; each defines its clap `Args` and a `run` function. (`args` holds
//! the flags `inference`'s two modes share; `device` the one path from `--device` and a model
//! file to a backend with the weights on it; `input` and `units` are shared helpers: text from a
//! file or stdin, and how sizes are printed.)

pub mod args;
pub mod batch;
pub mod bench;
pub mod chat;
pub mod chat_template;
pub mod detokenize;
pub mod device;
pub mod embed;
pub mod export;
pub mod generate;
pub mod inference;
pub mod info;
pub mod input;
pub mod model_text;
pub mod models;
pub mod perplexity;
pub mod rerank;
pub mod serve;
pub mod terminal;
pub mod tokenize;
pub mod units;
