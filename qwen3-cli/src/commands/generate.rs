//! `qwen3 generate` (`qwen3 inference -m generate`): one completion of a prompt, streamed to
//! stdout as text, token ids, log-probabilities or one JSON object.
//!
//! A prompt given as ids (`--prompt-ids`) gets ids back, one space-separated stream, which needs
//! no tokenizer. `--chat` wraps the prompt in the model's chat template as one user turn.

use super::args::{InferenceArgs, OnOff, Settings};
use anyhow::{bail, Context, Result};
use qwen3_inference::backend::Backend;
use qwen3_inference::chat::Conversation;
use qwen3_inference::constraint::{Constraint, Start, Vocabulary};
use qwen3_inference::engine::{Engine, PromptImages, Request};
use qwen3_inference::format::ModelFile;
use qwen3_inference::generate::{generate_until, GenerationStats, StopReason};
use qwen3_inference::logprobs::TokenLogprobs;
use qwen3_inference::text::ChoiceText;
use qwen3_inference::tokenizer::Tokenizer;
use qwen3_inference::vision::{ImageEncoder, MAX_SOURCE_PIXELS};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// `-m generate`: the prompt's ids, and what to do with the output.
pub struct PromptJob {
    /// Text in, text out (with the model's tokenizer file); ids in (no tokenizer), ids out.
    tokenizer: Option<Arc<Tokenizer>>,
    /// The prompt as text (`-i` or `-f`), for `--echo`.
    text: Option<String>,
    prompt: Vec<u32>,
    eos_ids: Vec<u32>,
    /// `--json-schema`, `--json-object`, `--grammar` or `--regex`, compiled.
    constraint: Option<Constraint>,
    /// `--image`s, encoded, at their rows of `prompt`.
    images: Option<PromptImages>,
    /// Seconds the images took to decode and encode (0 without images).
    image_encode_s: f64,
}

impl PromptJob {
    pub fn new(args: &InferenceArgs, file: &ModelFile, context_len: usize) -> Result<PromptJob> {
        let c = file.config();
        let text = args.prompt_text()?;
        let tokenizer = match &text {
            Some(_) => Some(Arc::new(super::model_text::tokenizer(&args.model)?)),
            None => None,
        };
        let mut eos_ids = c.eos_token_ids.clone();
        // The chat prompt's text, for where a constrained answer starts (after the reasoning).
        let mut chat_prompt = None;
        let chat = args.chat || !args.images.is_empty();
        let mut images = None;
        let mut image_encode_s = 0.0;
        // A model that cannot see is refused before anything is read.
        let encoder = match args.images.is_empty() {
            true => None,
            false => Some(image_encoder(file)?),
        };
        let prompt: Vec<u32> = match (&text, &args.prompt_ids, &tokenizer) {
            (_, Some(_), _) if chat => {
                bail!("--chat and --image need a text prompt (-i), not --prompt-ids")
            }
            (_, Some(_), _) if !args.stops.is_empty() => {
                bail!("--stop needs a text prompt (-i or -f): with --prompt-ids the output is ids")
            }
            (_, Some(ids), _) => parse_ids(ids)?,
            (Some(text), None, Some(tok)) if chat => {
                // One user turn, rendered as HF apply_chat_template(add_generation_prompt=True).
                let template = super::model_text::needed_template(&args.model)?;
                let mut conv = Conversation::new(args.system.clone());
                conv.set_thinking(args.thinking.map(|t| t == OnOff::On));
                conv.push_user(text.as_str());
                eos_ids = super::chat::stop_ids(&c.eos_token_ids, &template, tok);
                let rendered = match args.images.is_empty() {
                    true => conv.prompt(&template)?,
                    false => {
                        // The images first, then the text: `content` as a list of parts.
                        let mut messages: Vec<serde_json::Value> = conv
                            .messages()
                            .iter()
                            .map(serde_json::to_value)
                            .collect::<std::result::Result<_, _>>()?;
                        let mut parts = vec![json!({"type": "image"}); args.images.len()];
                        parts.push(json!({"type": "text", "text": text}));
                        let last = messages.last_mut().expect("the user turn");
                        last["content"] = serde_json::Value::Array(parts);
                        template.render_json(&messages, None, true, conv.thinking())?
                    }
                };
                let mut ids = tok.encode(&rendered);
                if let Some(encoder) = &encoder {
                    let started = std::time::Instant::now();
                    let (prompt, placed) = encode_images(&args.images, encoder, &ids, context_len)?;
                    image_encode_s = started.elapsed().as_secs_f64();
                    ids = prompt;
                    images = Some(placed);
                }
                chat_prompt = Some((rendered, template.default_thinking().is_some()));
                ids
            }
            (Some(text), None, Some(tok)) => tok.encode_with_special_tokens(text),
            _ => bail!("no prompt: give -i TEXT, -f FILE (- for stdin) or --prompt-ids '[..]'"),
        };
        let max_ctx = c.max_context() as usize;
        if prompt.len() > context_len {
            bail!(
                "the prompt has {} tokens but the context holds {context_len} (raise -c/--context, at most {max_ctx})",
                prompt.len()
            );
        }
        let constraint = match (args.grammar()?, &tokenizer) {
            (Some(grammar), Some(tok)) => {
                let eos = *eos_ids
                    .first()
                    .context("the model has no end-of-sequence id")?;
                let vocab = Vocabulary::new(tok.clone(), c.vocab_size as usize, eos)?;
                let start = match &chat_prompt {
                    Some((text, thinking)) => vocab.answer_start(text, *thinking),
                    None => Start::NOW,
                };
                Some(vocab.constraint(&grammar, start).context("the grammar")?)
            }
            _ => None,
        };
        Ok(PromptJob {
            tokenizer,
            text,
            prompt,
            eos_ids,
            constraint,
            images,
            image_encode_s,
        })
    }
}

/// The model's image encoder, or why it has none.
fn image_encoder(file: &ModelFile) -> Result<ImageEncoder> {
    match ImageEncoder::from_file(file)? {
        Some(encoder) => Ok(encoder),
        None => bail!(
            "{}: this model does not take images (its file has no vision tower; export a \
             vision-language checkpoint with its preprocessor_config.json)",
            file.path().display()
        ),
    }
}

/// The `--image` files through the model's tower, and the template's tokens `ids` with each
/// image's pads (docs/vision.md). Says on stderr what each image became and how long it took
/// (as llama.cpp's mtmd-cli says "image slice encoded in ...").
fn encode_images(
    paths: &[std::path::PathBuf],
    encoder: &ImageEncoder,
    ids: &[u32],
    context_len: usize,
) -> Result<(Vec<u32>, PromptImages)> {
    let encoded = paths
        .iter()
        .map(|p| {
            let bytes =
                std::fs::read(p).with_context(|| format!("{}: cannot read", p.display()))?;
            let started = std::time::Instant::now();
            let image = encoder
                .encode(&bytes, MAX_SOURCE_PIXELS, context_len)
                .with_context(|| format!("{}", p.display()))?;
            let [_, h, w] = image.grid;
            eprintln!(
                "image {}: {h}x{w} patches, {} tokens, encoded in {:.3} s",
                p.display(),
                image.tokens(encoder.input().tower.out_hidden_size),
                started.elapsed().as_secs_f64()
            );
            Ok(image)
        })
        .collect::<Result<Vec<_>>>()?;
    encoder.prompt(ids, encoded)
}

/// `-m generate` on any backend: prefill, then sample and stream tokens to stdout.
pub fn generate_text<B: Backend>(
    args: &InferenceArgs,
    settings: Settings,
    mut engine: Engine<B>,
    job: PromptJob,
    device: &str,
) -> Result<()> {
    let PromptJob {
        tokenizer,
        text,
        prompt,
        eos_ids,
        constraint,
        images,
        image_encode_s,
    } = job;
    if args.verbose {
        print_setup(args, &settings, &engine, &eos_ids, device);
    }
    let mut printer = Printer::new(args, tokenizer.as_deref());
    printer.image_encode_s = image_encode_s;
    if args.echo {
        printer.echo(text.as_deref(), &prompt)?;
    }
    let request = Request {
        prompt,
        max_tokens: args.max_tokens,
        sampler: settings.sampler,
        stop_ids: eos_ids,
        logprobs: args.logprobs,
        constraint,
        prompt_logprobs: None,
        last_logits: false,
        draft: settings.draft,
        images,
    };
    let stats = generate_until(
        &mut engine,
        request,
        || false,
        |id, lp| printer.token(id, lp),
    )?;
    let stop_string = printer.stop_string;
    printer.finish(&stats)?;
    let context_len = engine.forward().context_len();
    print_summary(args, &stats, context_len, stop_string);
    Ok(())
}

/// `--verbose`: the model, the context and its KV cache, the stop ids, the sampler, the device.
fn print_setup<B: Backend>(
    args: &InferenceArgs,
    settings: &Settings,
    engine: &Engine<B>,
    eos_ids: &[u32],
    device: &str,
) {
    let fwd = engine.forward();
    let (c, context_len, kv) = (fwd.model().config, fwd.context_len(), fwd.kv_type());
    let group = match c.group_size {
        0 => String::new(),
        g => format!(" group {g}"),
    };
    eprintln!(
        "model: {} ({}{group}), {} layers, hidden {}, heads {}/{} kv, head_dim {}, vocab {}",
        args.model.display(),
        c.dtype,
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.vocab_size
    );
    eprintln!(
        "context: {context_len} positions (model max {}); KV cache up to {:.1} MiB ({})",
        c.max_context(),
        fwd.model().kv_cache_bytes(context_len, kv) as f64 / (1u64 << 20) as f64,
        kv.name()
    );
    if c.linear_attention.is_some() {
        eprintln!(
            "Gated DeltaNet state: {:.1} MiB (f32), whatever the context",
            c.linear_state_bytes() as f64 / (1u64 << 20) as f64
        );
    }
    eprintln!("eos ids: {eos_ids:?}");
    if let Some(dm) = engine.draft_model() {
        let d = dm.forward().model().config;
        eprintln!(
            "draft model: {} ({}), {} layers, hidden {}; at most {} tokens a draft",
            args.draft
                .draft_model
                .as_deref()
                .unwrap_or(Path::new(""))
                .display(),
            d.dtype,
            d.num_hidden_layers,
            d.hidden_size,
            settings.draft.max()
        );
    }
    let s = &settings.sampler;
    eprintln!(
        "sampler: temperature {}, top_k {}, top_p {}, min_p {}, repetition_penalty {}, presence_penalty {}, seed {}",
        s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.seed
    );
    eprintln!("device: {device}");
}

/// What stdout gets, token by token: the text (decoded as tokens come, an incomplete character
/// held back, cut at a stop string, as the server's answers are: `qwen3_inference::text`), or the
/// ids when the prompt was ids, or one JSON line per token with `--logprobs`; with `--json`
/// everything is kept for the one object printed at the end.
struct Printer<'a> {
    args: &'a InferenceArgs,
    tokenizer: Option<&'a Tokenizer>,
    out: std::io::StdoutLock<'static>,
    text_out: Option<ChoiceText<'a>>,
    /// No output yet (ids are separated by spaces).
    first: bool,
    /// Whether a stop string ended the answer.
    stop_string: bool,
    /// For `--json`: the text, ids and per-token log-probabilities so far.
    all_text: String,
    all_ids: Vec<u32>,
    all_lps: Vec<serde_json::Value>,
    /// For `--json`: the images' decode and encode time, before the prompt ran.
    image_encode_s: f64,
}

impl<'a> Printer<'a> {
    fn new(args: &'a InferenceArgs, tokenizer: Option<&'a Tokenizer>) -> Printer<'a> {
        Printer {
            args,
            tokenizer,
            out: std::io::stdout().lock(),
            text_out: tokenizer
                .map(|t| ChoiceText::new(t, args.stops.clone(), None).keep_special()),
            first: true,
            stop_string: false,
            all_text: String::new(),
            all_ids: Vec::new(),
            all_lps: Vec::new(),
            image_encode_s: 0.0,
        }
    }

    /// `--echo`: the prompt as given, text or ids.
    fn echo(&mut self, text: Option<&str>, prompt: &[u32]) -> Result<()> {
        match text {
            Some(text) => write!(self.out, "{text}")?,
            None => write!(self.out, "{}", ids_text(prompt))?,
        }
        self.first = false;
        Ok(())
    }

    /// One sampled token; `Ok(false)` when a stop string ended the answer.
    fn token(&mut self, id: u32, lp: Option<&TokenLogprobs>) -> Result<bool> {
        self.all_ids.push(id);
        if let Some(lp) = lp {
            // One JSON object per token: its text is the token's own bytes (lossy UTF-8).
            let one =
                |id: u32, p: f32| json!({"token": id, "text": self.token_text(id), "logprob": p});
            let mut v = one(id, lp.logprob);
            v["top"] = lp.top.iter().map(|&(t, p)| one(t, p)).collect();
            if self.args.json {
                self.all_lps.push(v);
            } else {
                writeln!(self.out, "{v}")?;
            }
        }
        let piece = match self.text_out.as_mut() {
            Some(t) => {
                let (delta, stopped) = t.push(id);
                self.stop_string = stopped;
                delta.content
            }
            None if self.first => format!("{id}"),
            None => format!(" {id}"),
        };
        self.first = false;
        if self.args.json {
            self.all_text.push_str(&piece);
        } else if self.args.logprobs.is_none() {
            write!(self.out, "{piece}")?;
        }
        self.out.flush().context("stdout")?;
        Ok(!self.stop_string)
    }

    fn token_text(&self, id: u32) -> String {
        match self.tokenizer {
            Some(t) => String::from_utf8_lossy(t.token_bytes(id).unwrap_or_default()).into_owned(),
            None => id.to_string(),
        }
    }

    /// The end of the answer: the text held back, or the `--json` object.
    fn finish(mut self, stats: &GenerationStats) -> Result<()> {
        let rest = match self.text_out.as_mut() {
            Some(t) if !self.stop_string => t.finish().content,
            _ => String::new(),
        };
        if self.args.json {
            self.all_text.push_str(&rest);
            let (finish, stop) = match stats.stop {
                StopReason::Eos(_) => ("stop", "eos"),
                StopReason::Stopped if self.stop_string => ("stop", "stop_string"),
                StopReason::Stopped => ("stop", "stopped"),
                StopReason::MaxTokens => ("length", "max_tokens"),
                StopReason::ContextFull => ("length", "context_full"),
            };
            let mut v = json!({
                "text": self.tokenizer.map(|_| &self.all_text),
                "tokens": self.all_ids,
                "finish_reason": finish,
                "stop": stop,
                "prompt_tokens": stats.prompt_tokens,
                "generated_tokens": stats.generated_tokens,
                "draft": {
                    "drafted_tokens": stats.drafted_tokens,
                    "accepted_tokens": stats.accepted_tokens,
                },
                "timings": {
                    "image_encode_s": self.image_encode_s,
                    "time_to_first_token_s": stats.time_to_first_token.as_secs_f64(),
                    "decode_s": stats.decode.as_secs_f64(),
                    "prefill_tok_s": stats.prefill_tok_s(),
                    "decode_tok_s": stats.decode_tok_s(),
                },
            });
            if self.args.logprobs.is_some() {
                v["logprobs"] = self.all_lps.into();
            }
            writeln!(self.out, "{v}")?;
        } else if self.args.logprobs.is_none() {
            write!(self.out, "{rest}")?;
            writeln!(self.out)?;
        }
        self.out.flush()?;
        Ok(())
    }
}

/// stderr after the answer: why it stopped and how fast it went (`--verbose`: the sampler's
/// share too).
fn print_summary(
    args: &InferenceArgs,
    stats: &GenerationStats,
    context_len: usize,
    stop_string: bool,
) {
    let why = match stats.stop {
        StopReason::Eos(id) => format!("end-of-sequence token {id}"),
        StopReason::MaxTokens => format!("reached -n {}", args.max_tokens),
        StopReason::ContextFull => format!("context full ({context_len} positions; raise -c)"),
        StopReason::Stopped if stop_string => "stop string".to_string(),
        StopReason::Stopped => "stopped".to_string(),
    };
    eprintln!("[stopped: {why}]");
    eprintln!(
        "prompt tokens {}, generated tokens {}, prefill {:.1} tok/s, decode {:.1} tok/s, time to first token {:.3} s",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.prefill_tok_s(),
        stats.decode_tok_s(),
        stats.time_to_first_token.as_secs_f64()
    );
    if stats.drafted_tokens > 0 {
        eprintln!(
            "drafts: {} tokens drafted, {} accepted ({:.0}%)",
            stats.drafted_tokens,
            stats.accepted_tokens,
            100.0 * stats.accepted_tokens as f64 / stats.drafted_tokens as f64
        );
    }
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
