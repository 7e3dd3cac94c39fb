//! `qwen3 inference <model.bin> -m generate`: one completion, streamed to stdout.
//!
//! Both modes run on any backend (`--device cpu|cuda|cuda:N`): the model is loaded for the
//! device, and then the same generic code drives `qwen3_inference::model::Session`.
//!
//! stdout gets only the generated text, so it can be piped; everything else (the stop reason, the
//! timing summary, `--verbose` details) goes to stderr. A prompt given as ids (`--prompt-ids`)
//! gets ids back, one space-separated stream, which needs no tokenizer. `--chat` wraps the prompt
//! in the model's chat template as one user turn. `-m chat` is the terminal chat (chat.rs).

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use qwen3_cuda::device::check_available;
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, CpuBackend, KvType, PlainBackend};
use qwen3_inference::chat::{ChatTemplate, Conversation};
use qwen3_inference::engine::{Engine, Request};
use qwen3_inference::format::{companion_paths, ModelConfig, ModelFile};
use qwen3_inference::generate::{generate_until, StopReason};
use qwen3_inference::kernels;
use qwen3_inference::model::Model;
use qwen3_inference::sampler::SamplerConfig;
use qwen3_inference::tokenizer::Tokenizer;
use qwen3_server::text::ChoiceText;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args)]
pub struct InferenceArgs {
    /// Model file written by `qwen3 export`.
    pub model: PathBuf,
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
    /// Seed of the sampler; any u64. Default: from the clock (printed with --verbose).
    #[arg(short = 's', long)]
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
    /// Print model details, KV cache size and sampler settings to stderr.
    #[arg(long)]
    pub verbose: bool,
    /// Where to run: cpu, plain (the same math in textbook loops: slow, to read and to check),
    /// cuda (device 0) or cuda:N. CUDA needs a build with `--features cuda` and an NVIDIA
    /// driver; see docs/cuda.md.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU threads (default: one per core, or the RAYON_NUM_THREADS environment variable).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Generate mode: wrap the prompt in the model's chat template as one user turn.
    #[arg(long)]
    pub chat: bool,
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
    fn prompt_text(&self) -> Result<Option<String>> {
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

pub fn run(args: InferenceArgs) -> Result<()> {
    let device: Device = args.device.parse().map_err(|e: String| anyhow!(e))?;
    // Before anything is loaded: a build without CUDA, a missing driver or device, is one line.
    check_available(device).map_err(|e| anyhow!(e))?;
    if args.mode() == Mode::Chat {
        if !args.stops.is_empty() || args.json || args.logprobs.is_some() {
            bail!("--stop, --json and --logprobs are for -m generate");
        }
        if args.input.is_some() || args.file.is_some() || args.prompt_ids.is_some() || args.chat {
            bail!("-m chat reads the user's messages from stdin; -i, -f, --prompt-ids and --chat are for -m generate");
        }
    } else {
        if args.hide_thinking || args.verbose_prompt || args.no_history {
            bail!("--hide-thinking, --verbose-prompt and --no-history are for -m chat");
        }
        if (args.json || args.logprobs.is_some()) && args.echo {
            bail!("--json and --logprobs print the answer only; drop --echo");
        }
        if args
            .logprobs
            .is_some_and(|k| k > qwen3_inference::logprobs::MAX_TOP)
        {
            bail!(
                "--logprobs: at most {} alternatives",
                qwen3_inference::logprobs::MAX_TOP
            );
        }
        if !args.chat && (args.system.is_some() || args.thinking.is_some()) {
            bail!("-y/--system and --thinking need --chat (or -m chat)");
        }
    }
    let file = ModelFile::open(&args.model)?;
    let context_len = context_len(&args, file.config())?;
    // Everything that only needs the files (tokenizer, template, the prompt's ids) is read
    // before the weights go to a device, so that bad input fails fast.
    let job = match args.mode() {
        Mode::Generate => Job::Generate(Box::new(PromptJob::new(&args, &file, context_len)?)),
        Mode::Chat => Job::Chat(Box::new(super::chat::ChatFiles::open(&args)?)),
    };
    match device {
        Device::Cpu => {
            let model = Model::load(&file)?;
            let cpu = CpuBackend::new();
            let engine = Engine::one_sequence(&cpu, &model, context_len, args.kv_cache.into())?;
            let (threads, decode) = (kernels::threads(), kernels::decode_threads());
            let threads = if decode == threads {
                format!("{threads}")
            } else {
                format!("{threads} (decode: {decode}, one per core)")
            };
            let about = format!(
                "cpu, threads: {threads}, dot products: {}",
                kernels::dot::dots().isa
            );
            run_job(&args, engine, job, &about)
        }
        Device::Plain => {
            let model = Model::load(&file)?;
            let plain = PlainBackend::new();
            let engine = Engine::one_sequence(&plain, &model, context_len, args.kv_cache.into())?;
            run_job(&args, engine, job, "plain: the textbook loops, one thread")
        }
        Device::Cuda(_) if args.kv_cache != KvCacheArg::F32 => {
            bail!("--kv-cache bf16 is for --device cpu: the CUDA backend keeps its KV cache in f32")
        }
        Device::Cuda(ordinal) => cuda::run(&args, &file, ordinal, context_len, job),
    }
}

/// What `-m` asks for, with the files it needs already read.
/// (Boxed: both hold a `Tokenizer`, a large struct.)
pub enum Job {
    Generate(Box<PromptJob>),
    Chat(Box<super::chat::ChatFiles>),
}

/// Runs `job` on `engine`: the same code for every backend. `device` describes where, for
/// `--verbose`.
fn run_job<B: Backend>(
    args: &InferenceArgs,
    engine: Engine<B>,
    job: Job,
    device: &str,
) -> Result<()> {
    match job {
        Job::Generate(p) => generate_text(args, engine, *p, device),
        Job::Chat(files) => super::chat::run(args, engine, *files, device),
    }
}

/// `-m generate`: the prompt's ids, and what to do with the output.
pub struct PromptJob {
    /// Text in, text out (with the model's tokenizer file); ids in (no tokenizer), ids out.
    tokenizer: Option<Tokenizer>,
    /// The prompt as text (`-i` or `-f`), for `--echo`.
    text: Option<String>,
    prompt: Vec<u32>,
    eos_ids: Vec<u32>,
}

impl PromptJob {
    fn new(args: &InferenceArgs, file: &ModelFile, context_len: usize) -> Result<PromptJob> {
        let c = file.config();
        let text = args.prompt_text()?;
        let tokenizer = match &text {
            Some(_) => Some(Tokenizer::open(&companion_paths(&args.model).tokenizer)?),
            None => None,
        };
        let mut eos_ids = c.eos_token_ids.clone();
        let prompt: Vec<u32> = match (&text, &args.prompt_ids, &tokenizer) {
            (_, Some(_), _) if args.chat => {
                bail!("--chat needs a text prompt (-i), not --prompt-ids")
            }
            (_, Some(_), _) if !args.stops.is_empty() => {
                bail!("--stop needs a text prompt (-i or -f): with --prompt-ids the output is ids")
            }
            (_, Some(ids), _) => parse_ids(ids)?,
            (Some(text), None, Some(tok)) if args.chat => {
                // One user turn, rendered as HF apply_chat_template(add_generation_prompt=True).
                let template = ChatTemplate::open(&companion_paths(&args.model).template)?;
                let mut conv = Conversation::new(args.system.clone());
                conv.set_thinking(args.thinking.map(|t| t == OnOff::On));
                conv.push_user(text.as_str());
                eos_ids = super::chat::stop_ids(&c.eos_token_ids, &template, tok);
                tok.encode(&conv.prompt(&template)?)
            }
            (Some(text), None, Some(tok)) => tok.encode(text),
            _ => bail!("no prompt: give -i TEXT, -f FILE (- for stdin) or --prompt-ids '[..]'"),
        };
        let max_ctx = c.max_position_embeddings as usize;
        if prompt.len() > context_len {
            bail!(
                "the prompt has {} tokens but the context holds {context_len} (raise -c/--context, at most {max_ctx})",
                prompt.len()
            );
        }
        Ok(PromptJob {
            tokenizer,
            text,
            prompt,
            eos_ids,
        })
    }
}

/// `-m generate` on any backend: prefill, then sample and stream tokens to stdout.
fn generate_text<B: Backend>(
    args: &InferenceArgs,
    mut engine: Engine<B>,
    job: PromptJob,
    device: &str,
) -> Result<()> {
    let PromptJob {
        tokenizer,
        text,
        prompt,
        eos_ids,
    } = job;
    let fwd = engine.forward();
    let c = fwd.model().config;
    let context_len = fwd.context_len();
    let kv = fwd.kv_type();
    let sampler = sampler_from_args(args, c)?;
    if args.verbose {
        eprintln!(
            "model: {} ({}{}), {} layers, hidden {}, heads {}/{} kv, head_dim {}, vocab {}",
            args.model.display(),
            c.dtype,
            if c.group_size > 0 {
                format!(" group {}", c.group_size)
            } else {
                String::new()
            },
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.vocab_size
        );
        eprintln!(
            "context: {context_len} positions (model max {}); KV cache up to {:.1} MiB ({})",
            c.max_position_embeddings,
            fwd.model().kv_cache_bytes(context_len, kv) as f64 / (1u64 << 20) as f64,
            kv.name()
        );
        eprintln!("eos ids: {eos_ids:?}");
        let s = &sampler;
        eprintln!(
            "sampler: temperature {}, top_k {}, top_p {}, min_p {}, repetition_penalty {}, presence_penalty {}, seed {}",
            s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.seed
        );
        eprintln!("device: {device}");
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Text out: decoded as tokens come (an incomplete character held back) and cut at a stop
    // string, as the server's answers are (qwen3_server::text).
    let mut text_out = tokenizer
        .as_ref()
        .map(|t| ChoiceText::new(t, args.stops.clone(), None).keep_special());
    if args.echo {
        match &text {
            Some(text) => write!(out, "{text}")?,
            None => write!(out, "{}", ids_text(&prompt))?,
        }
    }
    let mut first = !args.echo;
    // With --json everything is kept for the one object printed at the end.
    let (mut all_text, mut all_ids, mut all_lps) = (String::new(), Vec::new(), Vec::new());
    let token_text = |id: u32| match &tokenizer {
        Some(t) => String::from_utf8_lossy(t.token_bytes(id).unwrap_or_default()).into_owned(),
        None => id.to_string(),
    };
    let mut stop_string = false;
    let request = Request {
        prompt,
        max_tokens: args.max_tokens,
        sampler,
        stop_ids: eos_ids,
        logprobs: args.logprobs,
    };
    let stats = generate_until(
        &mut engine,
        request,
        || false,
        |id, lp| {
            all_ids.push(id);
            if let Some(lp) = lp {
                // One JSON object per token: its text is the token's own bytes (lossy UTF-8).
                let one =
                    |id: u32, p: f32| json!({"token": id, "text": token_text(id), "logprob": p});
                let mut v = one(id, lp.logprob);
                v["top"] = lp.top.iter().map(|&(t, p)| one(t, p)).collect();
                if args.json {
                    all_lps.push(v);
                } else {
                    writeln!(out, "{v}")?;
                }
            }
            let piece = match text_out.as_mut() {
                Some(t) => {
                    let (delta, stopped) = t.push(id);
                    stop_string = stopped;
                    delta.content
                }
                None if first => format!("{id}"),
                None => format!(" {id}"),
            };
            first = false;
            if args.json {
                all_text.push_str(&piece);
            } else if args.logprobs.is_none() {
                write!(out, "{piece}")?;
            }
            out.flush().context("stdout")?;
            Ok(!stop_string)
        },
    )?;
    let rest = match text_out.as_mut() {
        Some(t) if !stop_string => t.finish().content,
        _ => String::new(),
    };
    let why = match stats.stop {
        StopReason::Eos(id) => format!("end-of-sequence token {id}"),
        StopReason::MaxTokens => format!("reached -n {}", args.max_tokens),
        StopReason::ContextFull => format!("context full ({context_len} positions; raise -c)"),
        StopReason::Stopped if stop_string => "stop string".to_string(),
        StopReason::Stopped => "stopped".to_string(),
    };
    if args.json {
        all_text.push_str(&rest);
        let (finish, stop) = match stats.stop {
            StopReason::Eos(_) => ("stop", "eos"),
            StopReason::Stopped if stop_string => ("stop", "stop_string"),
            StopReason::Stopped => ("stop", "stopped"),
            StopReason::MaxTokens => ("length", "max_tokens"),
            StopReason::ContextFull => ("length", "context_full"),
        };
        let mut v = json!({
            "text": tokenizer.as_ref().map(|_| all_text),
            "tokens": all_ids,
            "finish_reason": finish,
            "stop": stop,
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "timings": {
                "time_to_first_token_s": stats.time_to_first_token.as_secs_f64(),
                "decode_s": stats.decode.as_secs_f64(),
                "prefill_tok_s": stats.prefill_tok_s(),
                "decode_tok_s": stats.decode_tok_s(),
            },
        });
        if args.logprobs.is_some() {
            v["logprobs"] = all_lps.into();
        }
        writeln!(out, "{v}")?;
    } else if args.logprobs.is_none() {
        write!(out, "{rest}")?;
        writeln!(out)?;
    }
    out.flush()?;

    eprintln!("[stopped: {why}]");
    eprintln!(
        "prompt tokens {}, generated tokens {}, prefill {:.1} tok/s, decode {:.1} tok/s, time to first token {:.3} s",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.prefill_tok_s(),
        stats.decode_tok_s(),
        stats.time_to_first_token.as_secs_f64()
    );
    if args.verbose && stats.generated_tokens > 0 {
        let per_token = stats.sampling.as_secs_f64() / stats.generated_tokens as f64;
        let decode_step =
            stats.decode.as_secs_f64() / stats.generated_tokens.saturating_sub(1).max(1) as f64;
        eprintln!(
            "sampling {:.1} us/token ({:.2}% of a decode step), {:.1} candidates kept on average",
            per_token * 1e6,
            100.0 * per_token / decode_step,
            stats.kept_candidates as f64 / stats.generated_tokens as f64
        );
    }
    Ok(())
}

/// `-c`, or the model's maximum capped at [`DEFAULT_CONTEXT_CAP`]; never more than the maximum.
pub fn context_len(args: &InferenceArgs, c: &ModelConfig) -> Result<usize> {
    let max_ctx = c.max_position_embeddings as usize;
    let context_len = args.context.unwrap_or(max_ctx.min(DEFAULT_CONTEXT_CAP));
    if context_len > max_ctx {
        bail!("--context {context_len} is larger than the model supports ({max_ctx} positions)");
    }
    Ok(context_len)
}

/// The model's generation defaults, overridden by the sampling flags (the same in both modes).
pub fn sampler_from_args(args: &InferenceArgs, c: &ModelConfig) -> Result<SamplerConfig> {
    let seed = args.seed.unwrap_or_else(clock_seed);
    let mut cfg = SamplerConfig::from_defaults(&c.generation, seed);
    if let Some(v) = args.temperature {
        cfg.temperature = v;
    }
    if let Some(v) = args.top_p {
        cfg.top_p = v;
    }
    if let Some(v) = args.top_k {
        cfg.top_k = v as usize;
    }
    if let Some(v) = args.min_p {
        cfg.min_p = v;
    }
    if let Some(v) = args.repeat_penalty {
        cfg.repetition_penalty = v;
    }
    if let Some(v) = args.presence_penalty {
        cfg.presence_penalty = v;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Parses `[1, 2, 3]`.
fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Vec<u32> = serde_json::from_str(s)
        .with_context(|| format!("--prompt-ids {s:?}: not a JSON array of token ids"))?;
    Ok(ids)
}

/// The prompt ids as `--echo` prints them (the same form as the generated ids).
fn ids_text(ids: &[u32]) -> String {
    let v: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    v.join(" ")
}

/// A seed from the clock, for runs without `--seed`.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `--device cuda:N`: the weights uploaded once to the GPU, then the same [`run_job`] as on the
/// CPU: one engine over the forward pass (`qwen3_inference::model::Forward`), here over the CUDA
/// kernels. (Not run
/// here: no GPU on our machines; see docs/cuda.md for what is proven without one.)
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use qwen3_cuda::cuda::CudaBackend;

    pub fn run(
        args: &InferenceArgs,
        file: &ModelFile,
        ordinal: usize,
        context_len: usize,
        job: Job,
    ) -> Result<()> {
        let gpu = CudaBackend::load(ordinal, file)?;
        let model = Model::load_with(file, |name| gpu.weights.tensor(name))?;
        let engine = Engine::one_sequence(&gpu, &model, context_len, KvType::F32)?;
        let about = format!("cuda:{ordinal}, {}", gpu.runtime.description);
        run_job(args, engine, job, &about)
    }
}

/// Without the `cuda` feature `check_available` has already refused any CUDA device.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub fn run(
        _args: &InferenceArgs,
        _file: &ModelFile,
        _ordinal: usize,
        _context_len: usize,
        _job: Job,
    ) -> Result<()> {
        bail!("{}", qwen3_cuda::device::cuda_support().unwrap_err())
    }
}
