//! `qwen3 bench`'s flags.

use crate::commands::args::KvCacheArg;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchArgs {
    /// Model file written by `qwen3 export`.
    pub model: PathBuf,
    /// Prompt tokens processed in one prefill. (No `-p`: that is the top-p of `inference`.)
    #[arg(long = "prompt-tokens", default_value_t = 128)]
    pub prompt: usize,
    /// Tokens decoded one at a time after the prefill.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub decode: usize,
    /// Thread counts to measure, comma-separated (default: 1 and all cores). (No `-t`: that is
    /// the temperature in `inference`.)
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Repeats per thread count; medians are reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repeats: usize,
    /// Skip the untimed prefill and decode step that each thread count runs first (as
    /// llama-bench's `--no-warmup`): the first repeat then includes the first touches of the KV
    /// cache and of the threads' buffers. (`--draft-replay` times its own runs and takes no
    /// warm-up.)
    #[arg(long)]
    pub no_warmup: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// What the KV cache stores keys and values as (as `qwen3 inference --kv-cache`).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache: KvCacheArg,
    /// Where to run: cpu, or cuda (device 0) / cuda:N with a build with `--features cuda`
    /// (--threads then does not apply).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Instead of the table above: speculative decoding's ceiling, decode with each of these
    /// draft lengths (comma-separated) against plain decode, the draft being the plain greedy
    /// answer replayed, every draft accepted (draft.rs).
    #[arg(long, value_delimiter = ',', value_name = "LENGTHS")]
    pub draft_replay: Vec<usize>,
    /// With --draft-replay: also decode with this draft model's guesses at each length (a model
    /// with the same tokens, as `qwen3 generate --draft-model`), reporting how many it got right.
    #[arg(long, value_name = "MODEL", requires = "draft_replay")]
    pub draft_model: Option<PathBuf>,
}
