//! `qwen3 inference <model.bin> -m chat`: a conversation in the terminal (see docs/chat.md).
//!
//! Each turn renders the whole conversation with the model's own chat template, tokenizes it,
//! and sends it to a one-slot engine (the server's, `qwen3_inference::engine`), whose prefix
//! cache keeps the part of the KV cache that agrees with it and feeds only the rest, so the model
//! has always seen exactly HuggingFace's `apply_chat_template(..., tokenize=True,
//! add_generation_prompt=True)` ids of the conversation so far. Then it samples the answer one
//! token at a time, streaming it to stdout.
//!
//! Input comes from a line editor (rustyline: arrow-key editing and history) when stdin is a
//! terminal, or one user message per line when it is not (scripts, tests); lines starting with
//! `/` are commands (`/help`). Ctrl-C during an answer stops it (a SIGINT handler sets a flag the
//! decode loop checks); at the prompt, Ctrl-C twice or Ctrl-D leaves.

use super::args::{InferenceArgs, Settings};
use anyhow::{bail, Context, Result};
use qwen3_inference::backend::Backend;
use qwen3_inference::chat::{ChatTemplate, Conversation};
use qwen3_inference::engine::{Engine, PromptImages, Request};
use qwen3_inference::format::ModelFile;
use qwen3_inference::generate::{generate_until, StopReason};
use qwen3_inference::sampler::SamplerConfig;
use qwen3_inference::tokenizer::{StreamDecoder, Tokenizer};
use qwen3_inference::vision::{EncodedImage, ImageEncoder, MAX_SOURCE_PIXELS};
use serde_json::{json, Value};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Set while an answer is being generated: Ctrl-C then stops the answer instead of the program.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during an answer; the decode loop checks it after each step (a token, or a chunk
/// of the prompt).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

const HELP: &str = "\
/help          this list
/reset         start a new conversation, its stats and KV cache from zero (keeps the system prompt and thinking setting)
/system TEXT   set the system prompt and start a new conversation (no TEXT: none)
/think on|off  let the model reason first, or not (/think default: the template decides)
/image FILE    an image (PNG, JPEG, GIF, WebP) for your next message, before its text (a model that sees images)
/stats         context use, tokens fed and reused, sampler settings
/quit          leave (also /exit, /bye, a line `exit` or `quit` at the terminal, Ctrl-D, or Ctrl-C twice at the prompt)";

/// The ids that end an answer: every end-of-sequence id of the model file, plus the template's
/// end-of-turn token (its `eos_token`, `<|im_end|>` for Qwen3) if the tokenizer has it.
pub fn stop_ids(model_eos: &[u32], template: &ChatTemplate, tok: &Tokenizer) -> Vec<u32> {
    let mut ids = model_eos.to_vec();
    if let Some(id) = template
        .special_token("eos_token")
        .and_then(|t| tok.token_id(t))
    {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The companion files a chat needs: the tokenizer and the chat template; and the model file's
/// image encoder, if it has a vision tower (`/image`), which copies the tower out of the file at
/// the first image rather than at start (a chat may see none).
pub struct ChatFiles {
    tok: Tokenizer,
    template: ChatTemplate,
    encoder: Option<ImageEncoder>,
}

impl ChatFiles {
    pub fn open(args: &InferenceArgs, file: Arc<ModelFile>) -> Result<ChatFiles> {
        Ok(ChatFiles {
            tok: super::model_text::tokenizer(&args.model)?,
            template: super::model_text::needed_template(&args.model)?,
            encoder: ImageEncoder::at_first_image(file),
        })
    }
}

/// The chat on `engine` (one slot), whatever backend it runs on. `device` describes it, for
/// `--verbose`.
pub fn run<B: Backend>(
    args: &InferenceArgs,
    settings: Settings,
    engine: Engine<B>,
    files: ChatFiles,
    device: &str,
) -> Result<()> {
    let ChatFiles {
        tok,
        template,
        encoder,
    } = files;
    let c = engine.forward().model().config;
    let ctx = engine.context_len();

    let interactive = std::io::stdin().is_terminal();
    let colour = interactive
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut conv = Conversation::new(args.system.clone());
    conv.set_thinking(args.thinking.map(|t| t == super::args::OnOff::On));

    let mut chat = Chat {
        stop_ids: stop_ids(&c.eos_token_ids, &template, &tok),
        think: (tok.token_id("<think>"), tok.token_id("</think>")),
        tok: &tok,
        template: &template,
        engine,
        sampler: settings.sampler,
        conv,
        max_tokens: args.max_tokens,
        draft: settings.draft,
        hide_thinking: args.hide_thinking,
        verbose_prompt: args.verbose_prompt,
        colour,
        interactive,
        totals: Totals::default(),
        failed: 0,
        encoder,
        pending: Vec::new(),
        images: Vec::new(),
        prompt_images: None,
    };
    if args.verbose {
        eprintln!(
            "stop ids: {:?}, think ids: {:?}, context: {ctx} positions",
            chat.stop_ids, chat.think
        );
        eprintln!("device: {device}");
    }

    // Ctrl-C: during an answer, stop it; anywhere else (piped input waiting on a read), leave
    // as the default action would. In the line editor the terminal is in raw mode, so Ctrl-C
    // arrives there as a key, not as this signal.
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            std::process::exit(130);
        }
    })
    .context("cannot install the Ctrl-C handler")?;

    let mut input = if interactive {
        eprintln!(
            "{}: {} positions of context. /help for commands, Ctrl-D to quit.",
            args.model.display(),
            ctx
        );
        let mut editor = rustyline::DefaultEditor::new().context("cannot start the line editor")?;
        let history = if args.no_history {
            None
        } else {
            super::terminal::history_file()
        };
        if let Some(path) = &history {
            // A first run has no file yet; any other failure only costs the recall of old lines.
            if path.exists() {
                if let Err(e) = editor.load_history(path) {
                    eprintln!("(history not loaded from {}: {e})", path.display());
                }
            }
        }
        Input::Editor(Box::new(editor), history)
    } else {
        Input::Piped(std::io::stdin().lock())
    };

    let mut last_was_interrupt = false;
    loop {
        let line = match input.read()? {
            Read::Line(l) => l,
            Read::Eof => break,
            Read::Interrupted => {
                if last_was_interrupt {
                    break;
                }
                last_was_interrupt = true;
                eprintln!("(Ctrl-C again or Ctrl-D to quit)");
                continue;
            }
        };
        last_was_interrupt = false;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            if !chat.command(cmd) {
                break;
            }
            continue;
        }
        // At a terminal, `exit` and `quit` alone leave, as in a shell or Python's REPL (piped
        // lines are messages, whatever they say).
        if interactive && matches!(line, "exit" | "quit") {
            break;
        }
        chat.turn(line)?;
    }
    if chat.failed > 0 && !interactive {
        bail!(
            "{} got no answer (see the errors above)",
            count(chat.failed, "message")
        );
    }
    Ok(())
}

/// Where user lines come from.
enum Input {
    /// A terminal: rustyline, with the history file it reads and appends to (`None`:
    /// `--no-history`, or no home directory).
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    /// Anything else: one message per line, no prompt printed.
    Piped(std::io::StdinLock<'static>),
}

enum Read {
    Line(String),
    Interrupted,
    Eof,
}

impl Input {
    fn read(&mut self) -> Result<Read> {
        match self {
            Input::Editor(ed, history) => match ed.readline(">>> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        // History is a convenience: a failure to record a line is not an error
                        // (saved at once, so a chat that ends any way keeps it).
                        let _ = ed.add_history_entry(line.as_str());
                        if let Some(path) = history.as_ref() {
                            let saved = path
                                .parent()
                                .map_or(Ok(()), std::fs::create_dir_all)
                                .map_err(|e| e.to_string())
                                .and_then(|()| ed.save_history(path).map_err(|e| e.to_string()));
                            if let Err(e) = saved {
                                eprintln!(
                                    "(history not saved to {}: {e}; --no-history turns it off)",
                                    path.display()
                                );
                                *history = None;
                            }
                        }
                    }
                    Ok(Read::Line(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Read::Eof),
                Err(e) => Err(e).context("reading from the terminal"),
            },
            Input::Piped(stdin) => {
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading stdin")? == 0 {
                    return Ok(Read::Eof);
                }
                Ok(Read::Line(line))
            }
        }
    }
}

/// Counts over the whole chat, for `/stats`.
#[derive(Default)]
struct Totals {
    answers: usize,
    generated: usize,
    /// Prompt tokens run through the model.
    fed: usize,
    /// Prompt tokens found in the KV cache and not run again.
    reused: usize,
    decode_time: Duration,
}

/// Why an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// A stop id (end of turn or end of sequence); not part of the answer.
    End,
    MaxTokens,
    ContextFull,
    Interrupted,
}

struct Chat<'a, 'm, B: Backend> {
    tok: &'a Tokenizer,
    template: &'a ChatTemplate,
    engine: Engine<'m, B>,
    /// The sampler's settings; answer `k` draws with seed `seed + k`.
    sampler: SamplerConfig,
    conv: Conversation,
    stop_ids: Vec<u32>,
    /// The ids of `<think>` and `</think>`, if the tokenizer has such tokens.
    think: (Option<u32>, Option<u32>),
    max_tokens: usize,
    /// Speculative decoding's drafts for every answer (`--draft`).
    draft: qwen3_inference::engine::Draft,
    hide_thinking: bool,
    verbose_prompt: bool,
    colour: bool,
    /// stdin is a terminal (the line editor reads it).
    interactive: bool,
    totals: Totals,
    /// Messages that got no answer because of an error (a prompt too long for the context, a
    /// template error): piped input then ends with a non-zero exit.
    failed: usize,
    /// The model's vision tower (`/image`), if it has one.
    encoder: Option<ImageEncoder>,
    /// Images `/image` encoded for the next message.
    pending: Vec<EncodedImage>,
    /// Each user message's images, in the conversation's order (kept beside `conv`'s turns:
    /// pushed, undone and dropped with them).
    images: Vec<Vec<EncodedImage>>,
    /// The prompt's images at their rows, from `prompt_ids` for `answer`.
    prompt_images: Option<PromptImages>,
}

impl<B: Backend> Chat<'_, '_, B> {
    /// Runs a slash command (`cmd` without the `/`). Returns false to leave the chat.
    fn command(&mut self, cmd: &str) -> bool {
        let (name, rest) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
        let rest = rest.trim();
        match name {
            "help" => eprintln!("{HELP}"),
            // `/bye` is Ollama's.
            "quit" | "exit" | "bye" => return false,
            "reset" => {
                // A new conversation from scratch: its statistics and its KV cache too.
                self.conv.reset();
                self.images.clear();
                self.pending.clear();
                self.totals = Totals::default();
                self.engine.forget(0);
                eprintln!("[new conversation]");
            }
            "system" => {
                self.conv.set_system(Some(rest.to_string()));
                self.images.clear();
                match self.conv.system() {
                    Some(s) => eprintln!("[system prompt set: {s:?}; new conversation]"),
                    None => eprintln!("[no system prompt; new conversation]"),
                }
            }
            "think" => {
                let t = match rest {
                    "on" => Some(true),
                    "off" => Some(false),
                    "default" => None,
                    _ => {
                        eprintln!("usage: /think on|off|default");
                        return true;
                    }
                };
                self.conv.set_thinking(t);
                eprintln!("[thinking {}]", thinking_name(t));
            }
            "stats" => self.print_stats(),
            "image" => self.attach(rest),
            _ => eprintln!("unknown command /{name}; /help lists the commands"),
        }
        true
    }

    /// `/image FILE`: the image encoded now (so that a bad file is said at once), for the next
    /// message.
    fn attach(&mut self, path: &str) {
        let Some(encoder) = &self.encoder else {
            eprintln!("error: this model does not take images (its file has no vision tower)");
            return;
        };
        if path.is_empty() {
            eprintln!("usage: /image FILE");
            return;
        }
        if !B::TAKES_IMAGES {
            eprintln!(
                "error: this backend does not take images yet: run on the CPU (--device cpu)"
            );
            return;
        }
        let ctx = self.engine.context_len();
        let encoded = std::fs::read(path)
            .with_context(|| format!("{path}: cannot read"))
            .and_then(|b| {
                encoder
                    .encode(&b, MAX_SOURCE_PIXELS, ctx)
                    .with_context(|| path.to_string())
            });
        match encoded {
            Ok(image) => {
                let tokens = image.tokens(encoder.input().tower.out_hidden_size);
                eprintln!("[image {path}: {tokens} tokens, for your next message]");
                self.pending.push(image);
            }
            Err(e) => eprintln!("error: {e:#}"),
        }
    }

    /// The conversation rendered with the generation prompt; a user message with images gets its
    /// content as parts, the images before the text (as `--image` and mtmd-cli place them).
    fn render(&self) -> Result<String> {
        if self.images.iter().all(Vec::is_empty) {
            return self.conv.prompt(self.template);
        }
        let mut messages: Vec<Value> = self
            .conv
            .messages()
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<_, _>>()?;
        let users = messages.iter_mut().filter(|m| m["role"] == "user");
        for (m, images) in users.zip(&self.images) {
            if !images.is_empty() {
                let mut parts = vec![json!({"type": "image"}); images.len()];
                parts.push(json!({"type": "text", "text": m["content"].clone()}));
                m["content"] = Value::Array(parts);
            }
        }
        self.template
            .render_json(&messages, None, true, self.conv.thinking())
    }

    /// The last user message removed, with its images.
    fn undo_last_user(&mut self) {
        if self.conv.undo_last_user() {
            self.images.pop();
        }
    }

    fn print_stats(&self) {
        let t = &self.totals;
        eprintln!(
            "KV cache {}/{} positions; conversation: {}{}, thinking {}",
            self.engine.slot_tokens(0).len(),
            self.engine.context_len(),
            count(self.conv.turns().len(), "message"),
            if self.conv.system().is_some() {
                " + system prompt"
            } else {
                ""
            },
            thinking_name(self.conv.thinking())
        );
        eprintln!(
            "{}, tokens generated {} ({:.1} tok/s), prompt tokens fed {}, reused from the KV cache {}",
            count(t.answers, "answer"),
            t.generated,
            t.generated as f64 / t.decode_time.as_secs_f64().max(1e-9),
            t.fed,
            t.reused
        );
        let s = &self.sampler;
        eprintln!(
            "sampler: temperature {}, top_k {}, top_p {}, min_p {}, repetition_penalty {}, presence_penalty {}, seed {}",
            s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.seed
        );
    }

    /// Tokens to keep free for the answer when deciding whether the conversation still fits:
    /// `-n`, but at most half the context so that long answers do not evict everything.
    fn answer_room(&self) -> usize {
        self.max_tokens
            .clamp(1, (self.engine.context_len() / 2).max(1))
    }

    /// The prompt ids of the conversation with `text` as the new user message, dropping the
    /// oldest exchanges while it does not fit. `None` (and the message removed) if it cannot.
    fn prompt_ids(&mut self, text: &str) -> Result<Option<Vec<u32>>> {
        self.conv.push_user(text);
        self.images.push(std::mem::take(&mut self.pending));
        let ctx = self.engine.context_len();
        loop {
            // The conversation's ids; with images, each `<|image_pad|>` repeated for its image.
            let prompt = self.render().and_then(|rendered| {
                let ids = self.tok.encode(&rendered);
                match (&self.encoder, self.images.iter().any(|i| !i.is_empty())) {
                    (Some(encoder), true) => {
                        let all = self.images.iter().flatten().cloned().collect();
                        encoder.prompt(&ids, all).map(|(ids, im)| (ids, Some(im)))
                    }
                    _ => Ok((ids, None)),
                }
            });
            let (ids, images) = match prompt {
                Ok(p) => p,
                Err(e) => {
                    self.undo_last_user();
                    self.failed += 1;
                    eprintln!("error: {e:#}");
                    return Ok(None);
                }
            };
            self.prompt_images = images;
            if ids.len() + self.answer_room() <= ctx {
                return Ok(Some(ids));
            }
            // Only the new message left: no earlier exchange to drop.
            if self.conv.turns().len() > 1 && self.conv.drop_oldest_exchange() {
                self.images.remove(0);
                eprintln!(
                    "[context full ({} + {} for the answer > {ctx}): dropped the oldest exchange, {} kept]",
                    ids.len(),
                    count(self.answer_room(), "token"),
                    count(self.conv.turns().len(), "message")
                );
                continue;
            }
            if ids.len() < ctx {
                // Fits, with less room for the answer than -n asks.
                return Ok(Some(ids));
            }
            self.undo_last_user();
            self.failed += 1;
            eprintln!(
                "error: this message makes a prompt of {} tokens; the context holds {ctx} (raise -c/--context)",
                ids.len()
            );
            return Ok(None);
        }
    }

    /// One exchange: the user's `text`, then the model's answer streamed to stdout.
    fn turn(&mut self, text: &str) -> Result<()> {
        let Some(ids) = self.prompt_ids(text)? else {
            return Ok(());
        };

        // From here Ctrl-C stops the answer (set before anything is printed, so that a script
        // that waits for `prompt ids:` and then interrupts cannot end the program instead).
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        if self.verbose_prompt {
            eprintln!("prompt ids: {}", serde_json::to_string(&ids)?);
        }
        // On a terminal, keys typed during the answer are not echoed into it (terminal.rs).
        let quiet = self.interactive.then(super::terminal::QuietKeys::new);
        let result = self.answer(&ids);
        drop(quiet);
        GENERATING.store(false, Ordering::SeqCst);
        let (generated, stop, keep, decode_time) = result?;

        let reached = self.engine.slot_tokens(0).len();
        let ctx = self.engine.context_len();
        let text = self.tok.decode(&generated, false)?;
        match stop {
            Stop::Interrupted => {
                // A half answer is not something the model said: forget the whole exchange.
                // The next prompt no longer shares these tokens, so the cache rewinds by itself.
                self.undo_last_user();
                eprintln!("[interrupted: this question and its partial answer are dropped]");
            }
            Stop::End | Stop::MaxTokens | Stop::ContextFull => {
                self.conv.push_assistant(text.clone());
                if stop == Stop::MaxTokens {
                    eprintln!("[stopped at -n {}]", count(self.max_tokens, "token"));
                }
                if stop == Stop::ContextFull {
                    eprintln!("[context full ({ctx} positions): the answer was cut; the next turn drops the oldest exchanges (or raise -c)]");
                }
            }
        }
        if self.verbose_prompt && stop != Stop::Interrupted {
            eprintln!("answer: {}", serde_json::to_string(&text)?);
        }
        let n = generated.len();
        let t = &mut self.totals;
        // A dropped (interrupted) answer is not an answer; its tokens were generated all the same.
        if stop != Stop::Interrupted {
            t.answers += 1;
        }
        t.generated += n;
        t.fed += ids.len() - keep;
        t.reused += keep;
        t.decode_time += decode_time;
        let summary = format!(
            "[{}, {:.1} tok/s, context {reached}/{ctx}; prompt: {} run, {keep} reused]",
            count(n, "token"),
            n as f64 / decode_time.as_secs_f64().max(1e-9),
            count(ids.len() - keep, "token"),
        );
        if self.colour {
            eprintln!("{DIM}{summary}{RESET}");
        } else {
            eprintln!("{summary}");
        }
        Ok(())
    }

    /// Runs the conversation `ids` on the engine, whose prefix cache keeps what the KV cache
    /// shares with them and feeds the rest; then samples until a stop id, `-n`, the end of the
    /// context, or Ctrl-C, streaming the answer. Returns the answer's ids (no stop id), why it
    /// ended, how many prompt tokens were reused, and the time it took.
    ///
    /// The repetition penalty sees the whole conversation (HF penalises every id of
    /// `input_ids`, and here the conversation is the input).
    fn answer(&mut self, ids: &[u32]) -> Result<(Vec<u32>, Stop, usize, Duration)> {
        let mut generated: Vec<u32> = Vec::new();
        let mut show = Shown::new(self.tok, self.think, self.hide_thinking, self.colour);
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut sampler = self.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(self.totals.answers as u64);
        let request = Request {
            prompt: ids.to_vec(),
            max_tokens: self.max_tokens,
            sampler,
            stop_ids: self.stop_ids.clone(),
            logprobs: None,
            constraint: None,
            prompt_logprobs: None,
            last_logits: false,
            draft: self.draft.clone(),
            images: self.prompt_images.take(),
        };
        // Ctrl-C is checked after each step of the engine: each token, and each chunk of a long
        // prompt's prefill.
        let interrupted = || INTERRUPTED.load(Ordering::SeqCst);
        let stats = generate_until(&mut self.engine, request, interrupted, |next, _| {
            if interrupted() {
                return Ok(false);
            }
            generated.push(next);
            write!(out, "{}", show.push(next))?;
            out.flush().context("stdout")?;
            Ok(true)
        })?;
        writeln!(out, "{}", show.finish())?;
        out.flush()?;
        let stop = match stats.stop {
            StopReason::Eos(_) => Stop::End,
            StopReason::MaxTokens => Stop::MaxTokens,
            StopReason::ContextFull => Stop::ContextFull,
            StopReason::Stopped => Stop::Interrupted,
        };
        let time = stats.time_to_first_token + stats.decode;
        Ok((generated, stop, stats.cached_tokens, time))
    }
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// "1 token", "2 tokens".
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn thinking_name(t: Option<bool>) -> &'static str {
    match t {
        Some(true) => "on",
        Some(false) => "off",
        None => "as the template's default",
    }
}

/// Turns answer ids into the text shown: reasoning (from `<think>` to `</think>`, recognised by
/// the tokenizer's ids for those tokens) dimmed on a terminal, kept as plain text when piped, or
/// left out with `--hide-thinking`.
struct Shown<'t> {
    decoder: StreamDecoder<'t>,
    think: (Option<u32>, Option<u32>),
    hide: bool,
    colour: bool,
    in_think: bool,
    /// Just after a hidden reasoning block: drop the blank lines that separated it.
    trim_next: bool,
}

impl<'t> Shown<'t> {
    fn new(
        tok: &'t Tokenizer,
        think: (Option<u32>, Option<u32>),
        hide: bool,
        colour: bool,
    ) -> Shown<'t> {
        Shown {
            decoder: StreamDecoder::new(tok),
            think,
            hide,
            colour,
            in_think: false,
            trim_next: false,
        }
    }

    fn push(&mut self, id: u32) -> String {
        let mut s = String::new();
        if Some(id) == self.think.0 {
            s = self.decoder.finish();
            self.in_think = true;
            if !self.hide {
                if self.colour {
                    s.push_str(DIM);
                }
                s.push_str("<think>");
            }
            return s;
        }
        if Some(id) == self.think.1 {
            let rest = self.decoder.finish();
            self.in_think = false;
            if !self.hide {
                s.push_str(&rest);
                s.push_str("</think>");
                if self.colour {
                    s.push_str(RESET);
                }
            }
            self.trim_next = self.hide;
            return s;
        }
        let text = self.decoder.push(id);
        if self.in_think && self.hide {
            return String::new();
        }
        if self.trim_next {
            let t = text.trim_start_matches(['\n', '\r']);
            if t.is_empty() {
                return String::new();
            }
            self.trim_next = false;
            return t.to_string();
        }
        text
    }

    fn finish(&mut self) -> String {
        let mut s = self.decoder.finish();
        if self.in_think && self.hide {
            s.clear();
        }
        if self.in_think && self.colour {
            s.push_str(RESET);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real Qwen3 tokenizer (fixtures/tokenizer), exported to a temporary file.
    fn tokenizer() -> Tokenizer {
        let dir = std::env::temp_dir().join(format!("pq-chat-shown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.tokenizer.bin");
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer");
        qwen3_export::hf::tokenizer_json::export_tokenizer(&src, &path, 151_936).unwrap();
        let tok = Tokenizer::open(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        tok
    }

    fn show(tok: &Tokenizer, ids: &[u32], hide: bool, colour: bool) -> String {
        let think = (tok.token_id("<think>"), tok.token_id("</think>"));
        let mut s = Shown::new(tok, think, hide, colour);
        let mut out: String = ids.iter().map(|&id| s.push(id)).collect();
        out.push_str(&s.finish());
        out
    }

    #[test]
    fn reasoning_is_dimmed_kept_or_hidden() {
        let tok = tokenizer();
        // What Qwen3 writes when it thinks: <think>, reasoning, </think>, blank line, answer.
        let ids = tok.encode("<think>\nAdd them.\n</think>\n\n2 + 2 = 4.");
        let think_start = tok.token_id("<think>").unwrap();
        assert_eq!(ids[0], think_start, "<think> is one token: {ids:?}");
        let all = "<think>\nAdd them.\n</think>\n\n2 + 2 = 4.";
        assert_eq!(tok.decode(&ids, false).unwrap(), all);
        // Piped: the text as the model wrote it.
        assert_eq!(show(&tok, &ids, false, false), all);
        // Terminal: the reasoning block dimmed.
        assert_eq!(
            show(&tok, &ids, false, true),
            format!("{DIM}<think>\nAdd them.\n</think>{RESET}\n\n2 + 2 = 4.")
        );
        // --hide-thinking: the answer only, without the blank line after the block.
        assert_eq!(show(&tok, &ids, true, true), "2 + 2 = 4.");
        // An answer cut inside its reasoning: hidden entirely, or dimming switched off at the end.
        let cut = &ids[..4];
        assert_eq!(show(&tok, cut, true, false), "");
        assert!(show(&tok, cut, false, true).ends_with(RESET));
        // No reasoning (thinking off): nothing changes.
        let plain = tok.encode("Just 4.");
        assert_eq!(show(&tok, &plain, true, true), "Just 4.");
    }
}
