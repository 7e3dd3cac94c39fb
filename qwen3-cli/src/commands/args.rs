//! The arguments of `qwen3 inference` (and of `qwen3 chat` / `qwen3 generate`, the same with
//! the mode set), and what they imply: the context length and the sampler's settings. Shared by
//! both modes (`generate.rs`, `chat.rs`) and by `bench` and `serve` for the flags they share.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use qwen3_inference::backend::KvType;
use qwen3_inference::constraint::Grammar;
use qwen3_inference::engine::Draft;
use qwen3_inference::format::{ModelConfig, ModelFile};
use qwen3_inference::sampler::SamplerConfig;
use std::path::{Path, PathBuf};

/// Context length used when `-c` is not given: the model's maximum, capped, because the KV cache
/// may grow to the whole context (Qwen3-0.6B at 4096 positions: 896 MiB of f32 keys and values;
/// at its 40960 maximum it would be 8.75 GiB). The CPU cache grows 256 positions at a time
/// (`qwen3_inference::backend::cpu::CpuKvCache`), so resident memory follows the positions
/// actually used.
pub const DEFAULT_CONTEXT_CAP: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Complete the prompt once.
    Generate,
    /// A conversation in the terminal (or one user message per line of piped stdin).
    Chat,
}

/// `--kv-cache`: what the KV cache stores keys and values as.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheArg {
    /// f32: attention exactly as HF's float32 reference.
    F32,
    /// bf16: half the memory, and half the bytes attention reads a token; keys and values
    /// rounded to bf16 (8 significant bits).
    Bf16,
}

impl From<KvCacheArg> for KvType {
    fn from(k: KvCacheArg) -> KvType {
        match k {
            KvCacheArg::F32 => KvType::F32,
            KvCacheArg::Bf16 => KvType::Bf16,
        }
    }
}

/// `--draft`: where speculative decoding's drafts come from.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DraftKind {
    /// No drafts: one token a step.
    None,
    /// Prompt lookup: the tokens that followed the last few tokens earlier in the prompt or the
    /// answer (pays when the answer copies its input: edits, summaries, answers from documents).
    Ngram,
}

/// Where a command that runs a model runs: the same two flags, with the same help, for
/// inference, serve, batch, embed, rerank and perplexity (`bench` takes a list of thread counts,
/// its own), read into a device once by `device::parse`.
#[derive(Args, Clone)]
pub struct DeviceArgs {
    /// Where to run: cpu, plain (the same math in textbook loops: slow, to read and to check),
    /// cuda (device 0) or cuda:N. CUDA needs a build with `--features cuda` and an NVIDIA
    /// driver; see docs/cuda.md.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU threads (default: one per core, or the RAYON_NUM_THREADS environment variable).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Speculative decoding (qwen3-inference's engine/draft.rs), for generate, chat, serve and batch.
#[derive(Args, Clone)]
pub struct DraftArgs {
    /// Speculative decoding: guess the next tokens and check them all in one step. The answer
    /// is the same token for token (greedy or seeded); it comes sooner when guesses agree.
    #[arg(long, value_enum, default_value = "none")]
    pub draft: DraftKind,
    /// Speculative decoding with a draft model: a small model with the same tokens (a file
    /// written by `qwen3 export`, or a repository id), such as Qwen3-0.6B beside Qwen3-8B,
    /// guesses the next tokens.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted a step (default 8; the length adapts below it).
    #[arg(long, value_name = "N")]
    pub draft_max: Option<usize>,
}

impl DraftArgs {
    /// The drafts the flags ask for.
    pub fn draft(&self) -> Result<Draft> {
        let max = self.draft_max.unwrap_or(8);
        if max == 0 {
            bail!("--draft-max 0: a draft is at least one token (for none, leave out --draft)");
        }
        match (self.draft, &self.draft_model) {
            (DraftKind::Ngram, Some(_)) => {
                bail!("--draft ngram and --draft-model are two sources of drafts: give one")
            }
            (DraftKind::None, None) if self.draft_max.is_some() => {
                bail!("--draft-max is the length of the drafts: give --draft ngram or --draft-model too")
            }
            (DraftKind::None, None) => Ok(Draft::None),
            (DraftKind::Ngram, None) => Ok(Draft::Ngram { max }),
            (DraftKind::None, Some(_)) => Ok(Draft::Model { max }),
        }
    }

    /// `--draft-model`'s file, checked against `target` ([`open_draft_model`]); `None` without
    /// the flag.
    pub fn open_model(
        &self,
        target: &Path,
        models_dir: Option<&Path>,
        offline: bool,
    ) -> Result<Option<ModelFile>> {
        self.draft_model
            .as_deref()
            .map(|path| open_draft_model(path, target, models_dir, offline))
            .transpose()
    }
}

/// A draft model's file (exported first, if given as a repository id), checked against the
/// model it drafts for, `target`: the draft model reads the target's token ids, so both
/// tokenizers must have the same tokens under the same ids.
pub fn open_draft_model(
    path: &Path,
    target: &Path,
    models_dir: Option<&Path>,
    offline: bool,
) -> Result<ModelFile> {
    let path = crate::hub::models::resolve(path, models_dir, offline)?;
    let name = path.display();
    let file = ModelFile::open(&path).with_context(|| format!("--draft-model {name}"))?;
    if file.config().embedding.is_some() {
        bail!("--draft-model {name}: an embedding model, which guesses no tokens");
    }
    let open = super::model_text::tokenizer;
    let theirs = open(&path).with_context(|| format!("--draft-model {name}"))?;
    let ours = open(target)?;
    ours.same_tokens(&theirs).with_context(|| {
        format!(
            "--draft-model {name} has another vocabulary than {}: a draft model must have the \
             same tokenizer",
            target.display()
        )
    })?;
    Ok(file)
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args)]
pub struct InferenceArgs {
    /// Model file written by `qwen3 export`, or a HuggingFace repository id (Qwen/Qwen3-0.6B,
    /// @REVISION optional), exported once into --models-dir and reused.
    pub model: PathBuf,
    /// Where models given by repository id are exported (default: $QWEN3_MODELS_DIR, else
    /// $XDG_DATA_HOME/qwen3/models, i.e. ~/.local/share/qwen3/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// With a repository id: use the HuggingFace cache only, never the network (as
    /// HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// generate: complete the prompt once; chat: a conversation (`qwen3 generate` and
    /// `qwen3 chat` are the same). Default: generate.
    #[arg(short = 'm', long, value_enum)]
    pub mode: Option<Mode>,
    /// The prompt text; `-` reads it from stdin.
    #[arg(short = 'i', long = "input", visible_alias = "prompt", conflicts_with_all = ["prompt_ids", "file"])]
    pub input: Option<String>,
    /// Read the prompt from this file (its exact contents); `-` is stdin.
    #[arg(short = 'f', long, conflicts_with = "prompt_ids")]
    pub file: Option<PathBuf>,
    /// The prompt as token ids, a JSON array such as '[785, 6722, 315]' (for debugging; the
    /// output is then token ids too, and no tokenizer file is needed).
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Most tokens to generate; -1: until the context is full (as llama.cpp's -n -1). 0 runs
    /// the prompt and generates nothing (times prefill).
    #[arg(short = 'n', long = "max-tokens", default_value = "256", allow_negative_numbers = true,
          value_parser = parse_max_tokens)]
    pub max_tokens: usize,
    /// Temperature; 0 is greedy (default: the model's generation_config.json).
    #[arg(
        short = 't',
        long,
        visible_alias = "temp",
        allow_negative_numbers = true
    )]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass, in (0, 1].
    #[arg(short = 'p', long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens; 0 keeps all.
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Drop tokens less likely than this fraction of the most likely one, in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalise tokens already in the context (HF repetition_penalty; 1 is off).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Subtract this from the logits of tokens already generated (0 is off).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Seed of the sampler; any u64, or -1 for a random one (llama.cpp's convention). Default:
    /// from the clock (printed with --verbose).
    #[arg(short = 's', long, allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Context length (prompt + generated tokens); sizes the KV cache.
    /// Default: the model's maximum, capped at 4096.
    #[arg(short = 'c', long)]
    pub context: Option<usize>,
    /// What the KV cache stores keys and values as: f32 (exact) or bf16 (half the memory and
    /// of what attention reads at long contexts; CPU only).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache: KvCacheArg,
    /// Generate mode: end the answer at this text (not printed); may be given several times.
    #[arg(long = "stop", value_name = "STRING")]
    pub stops: Vec<String>,
    /// Generate mode: print one JSON object at the end instead of streaming the text: text,
    /// token ids, why it stopped, token counts and timings (for scripts).
    #[arg(long)]
    pub json: bool,
    /// Generate mode: each token's log-probability and its K most likely alternatives (0-20),
    /// as one JSON line per token on stdout instead of the text (with --json: in its object).
    /// Log-softmax of the model's logits, before temperature and the other sampling settings.
    #[arg(long, value_name = "K")]
    pub logprobs: Option<usize>,
    /// Print the prompt before the completion.
    #[arg(long)]
    pub echo: bool,
    /// Generate mode: the answer is JSON that matches this JSON Schema (a file, or the schema
    /// itself). See docs/structured.md.
    #[arg(long, value_name = "FILE|JSON")]
    pub json_schema: Option<String>,
    /// Generate mode: the answer is a JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// Generate mode: the answer matches this grammar, in llguidance's Lark syntax (a file).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Generate mode: the answer matches this regular expression (all of it).
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Print model details, KV cache size and sampler settings to stderr.
    #[arg(long)]
    pub verbose: bool,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Generate mode: wrap the prompt in the model's chat template as one user turn.
    #[arg(long)]
    pub chat: bool,
    /// Generate mode: an image file (PNG, JPEG, GIF, WebP) for a model that sees images
    /// (Qwen3.5 exported with its vision tower), placed before the prompt's text in the user
    /// turn, as llama.cpp's mtmd-cli places it; repeatable. Implies --chat.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<PathBuf>,
    /// System prompt (chat mode, or generate mode with --chat).
    #[arg(short = 'y', long)]
    pub system: Option<String>,
    /// Let the model reason before answering (the template's enable_thinking).
    /// Default: whatever the template does when it is not given (Qwen3: on).
    #[arg(long, value_enum)]
    pub thinking: Option<OnOff>,
    /// Chat mode: do not show the model's reasoning (<think> ... </think>).
    #[arg(long)]
    pub hide_thinking: bool,
    /// Chat mode: do not read or write the input history file (on a terminal the chat keeps
    /// it in $XDG_DATA_HOME/qwen3/chat_history, by default ~/.local/share/qwen3/chat_history).
    #[arg(long)]
    pub no_history: bool,
    /// Chat mode: print to stderr, each turn, `prompt ids: [..]`: the whole conversation's ids
    /// as the model has now seen them, and after the answer `answer: "..."`.
    #[arg(long)]
    pub verbose_prompt: bool,
}

/// `-n`: a count, or -1 for "until the context is full" (the engine stops there).
fn parse_max_tokens(s: &str) -> std::result::Result<usize, String> {
    match s.trim() {
        "-1" => Ok(usize::MAX),
        t => t.parse::<usize>().map_err(|_| {
            format!(
                "{s:?} is not a number of tokens (a count, or -1 for until the context is full)"
            )
        }),
    }
}

/// `qwen3 chat` and `qwen3 generate`: `inference` with its mode set (`-m` may repeat it, not
/// contradict it).
pub fn with_mode(mut args: InferenceArgs, mode: Mode, command: &str) -> Result<InferenceArgs> {
    if args.mode.is_some_and(|m| m != mode) {
        bail!(
            "qwen3 {command} is `qwen3 inference -m {command}`: drop -m, or use `qwen3 inference`"
        );
    }
    args.mode = Some(mode);
    Ok(args)
}

impl InferenceArgs {
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Generate)
    }

    /// The prompt text of `-i` or `-f` (either may be `-`, standard input), if one was given.
    pub fn prompt_text(&self) -> Result<Option<String>> {
        match (&self.input, &self.file) {
            (Some(t), _) if t == "-" => {
                super::input::read_text(std::path::Path::new("-")).map(Some)
            }
            (Some(t), _) => Ok(Some(t.clone())),
            (None, Some(path)) => super::input::read_text(path).map(Some),
            (None, None) => Ok(None),
        }
    }
}

impl InferenceArgs {
    /// How many of the structured-output options were given.
    fn grammars(&self) -> usize {
        [
            self.json_schema.is_some(),
            self.json_object,
            self.grammar.is_some(),
            self.regex.is_some(),
        ]
        .iter()
        .filter(|&&g| g)
        .count()
    }

    /// The grammar the answer must match, if one of the structured-output options was given: a
    /// schema that is neither a readable file nor JSON, or an unreadable grammar file, is an
    /// error that says so.
    pub fn grammar(&self) -> Result<Option<Grammar>> {
        if let Some(s) = &self.json_schema {
            let text = if Path::new(s).is_file() {
                std::fs::read_to_string(s).with_context(|| format!("--json-schema {s}"))?
            } else {
                s.clone()
            };
            let schema = serde_json::from_str(&text).with_context(|| {
                format!("--json-schema: {s:?} is neither a file nor a JSON Schema")
            })?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(Grammar::JsonObject));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar {}", path.display()))?;
            return Ok(Some(Grammar::Lark(text)));
        }
        Ok(self.regex.clone().map(Grammar::Regex))
    }

    /// Refuses flags that belong to the other mode, and combinations that mean nothing, before
    /// any file is opened; the drafts the flags ask for, for [`Self::settings`].
    pub fn check_mode_flags(&self) -> Result<Draft> {
        let draft = self.draft.draft()?;
        if self.mode() == Mode::Chat {
            if !self.stops.is_empty() || self.json || self.logprobs.is_some() {
                bail!("--stop, --json and --logprobs are for -m generate");
            }
            if self.grammars() > 0 {
                bail!("--json-schema, --json-object, --grammar and --regex are for -m generate");
            }
            if self.input.is_some()
                || self.file.is_some()
                || self.prompt_ids.is_some()
                || self.chat
                || !self.images.is_empty()
            {
                bail!("-m chat reads the user's messages from stdin; -i, -f, --prompt-ids, --chat and --image are for -m generate");
            }
        } else {
            if self.hide_thinking || self.verbose_prompt || self.no_history {
                bail!("--hide-thinking, --verbose-prompt and --no-history are for -m chat");
            }
            if (self.json || self.logprobs.is_some()) && self.echo {
                bail!("--json and --logprobs print the answer only; drop --echo");
            }
            if self
                .logprobs
                .is_some_and(|k| k > qwen3_inference::logprobs::MAX_TOP)
            {
                bail!(
                    "--logprobs: at most {} alternatives",
                    qwen3_inference::logprobs::MAX_TOP
                );
            }
            if self.grammars() > 1 {
                bail!("give one of --json-schema, --json-object, --grammar and --regex");
            }
            if self.grammars() > 0 && self.prompt_ids.is_some() {
                bail!("--json-schema, --json-object, --grammar and --regex need a text prompt (-i or -f): with --prompt-ids the output is ids");
            }
            // --image implies --chat.
            let chat = self.chat || !self.images.is_empty();
            if !chat && (self.system.is_some() || self.thinking.is_some()) {
                bail!("-y/--system and --thinking need --chat (or -m chat)");
            }
        }
        Ok(draft)
    }
}

/// The context length of a command that takes `-c` (inference, serve, embed) or runs with the
/// default (rerank): the flag, else the model's maximum capped at [`DEFAULT_CONTEXT_CAP`]; at
/// least one position and never more than the model's maximum.
pub fn context_len(flag: Option<usize>, c: &ModelConfig) -> Result<usize> {
    let max_ctx = c.max_context() as usize;
    let context_len = flag.unwrap_or(max_ctx.min(DEFAULT_CONTEXT_CAP));
    if context_len == 0 {
        bail!("--context 0: the context holds at least one position");
    }
    if context_len > max_ctx {
        bail!("--context {context_len} is larger than the model supports ({max_ctx} positions)");
    }
    Ok(context_len)
}

/// What `qwen3 inference`'s flags mean for this model, worked out once at the top of the
/// command (before the weights load, so that a bad setting fails fast) and read from here by
/// both modes.
pub struct Settings {
    /// Positions of prompt and answer together (`-c`).
    pub context_len: usize,
    /// What the KV cache holds keys and values as (`--kv-cache`).
    pub kv: KvType,
    /// The model's generation defaults with the sampling flags over them.
    pub sampler: SamplerConfig,
    /// Where speculative decoding's guesses come from (`--draft`, `--draft-model`).
    pub draft: Draft,
}

impl InferenceArgs {
    /// The flags, checked and turned into [`Settings`] for the model `c`, with the drafts
    /// [`Self::check_mode_flags`] found.
    pub fn settings(&self, c: &ModelConfig, draft: Draft) -> Result<Settings> {
        Ok(Settings {
            context_len: context_len(self.context, c)?,
            kv: self.kv_cache.into(),
            sampler: self.sampler(c)?,
            draft,
        })
    }

    /// The model's generation defaults, overridden by the sampling flags (the same in both
    /// modes).
    fn sampler(&self, c: &ModelConfig) -> Result<SamplerConfig> {
        let seed = self.seed.unwrap_or_else(clock_seed);
        let mut cfg = SamplerConfig::from_defaults(&c.generation, seed);
        if let Some(v) = self.temperature {
            cfg.temperature = v;
        }
        if let Some(v) = self.top_p {
            cfg.top_p = v;
        }
        if let Some(v) = self.top_k {
            cfg.top_k = v as usize;
        }
        if let Some(v) = self.min_p {
            cfg.min_p = v;
        }
        if let Some(v) = self.repeat_penalty {
            cfg.repetition_penalty = v;
        }
        if let Some(v) = self.presence_penalty {
            cfg.presence_penalty = v;
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `-s`: a u64, or -1 for a seed from the clock.
fn parse_seed(s: &str) -> std::result::Result<u64, String> {
    match s.trim() {
        "-1" => Ok(clock_seed()),
        t => t
            .parse::<u64>()
            .map_err(|_| format!("{s:?} is not a seed (a number 0 ..= 2^64-1, or -1 for random)")),
    }
}

/// A seed from the clock, for runs without `--seed`.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
