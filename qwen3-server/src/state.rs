//! What every handler shares: the model's tokenizer and chat template, the limits the server was
//! started with, and the channel to the model worker. The caller (the CLI) builds it once from
//! the model's files; the router hands it to each handler behind an `Arc`.
//!
//! It sits below every module that reads a request or writes an answer: it holds data, the
//! worker's sending end, the metrics and the listener's limits, and knows nothing of requests or
//! answers (`tests/layers.rs` holds it to lib.rs's order).

use crate::metrics::Metrics;
use crate::worker::Command;
use qwen3_inference::chat::ChatTemplate;
use qwen3_inference::constraint::Vocabulary;
use qwen3_inference::format::{Architecture, GenerationDefaults, ModelFile};
use qwen3_inference::rerank::Reranker;
use qwen3_inference::tokenizer::Tokenizer;
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

/// What the handlers share.
pub struct AppState {
    /// The id `/v1/models` lists and requests may name.
    pub model_name: String,
    /// Leaked once at start: the server holds it for the whole process, and each answer's
    /// streaming decoder borrows it from a task that may outlive any one handler.
    pub tokenizer: &'static Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Whether the template has a thinking switch (Qwen3's `enable_thinking`): then a chat
    /// answer's `<think>` block goes to `reasoning_content`.
    pub thinking_template: bool,
    /// Whether the template writes tool calls as XML (Qwen3.5's; `ChatTemplate::xml_tool_calls`),
    /// found once at start: the forced start of a call and its grammar follow it.
    pub xml_tool_calls: bool,
    /// End-of-sequence ids of a completion (the model's).
    pub eos_ids: Vec<u32>,
    /// Of a chat answer: the model's and the template's end of turn.
    pub chat_stop_ids: Vec<u32>,
    pub defaults: GenerationDefaults,
    /// Positions of each sequence.
    pub context_len: usize,
    /// Sequences that run at once.
    pub slots: usize,
    pub max_queue: usize,
    pub api_key: Option<String>,
    pub created: u64,
    pub commands: Sender<Command>,
    /// Counted by the handlers and the worker; `GET /metrics` shows them.
    pub metrics: Arc<Metrics>,
    /// Whether `/` answers with the chat page (`--no-ui` turns it off).
    pub ui: bool,
    /// Origins whose web pages may call the API (`--cors`; `*`: any). Empty: none but the
    /// server's own page, which needs no CORS.
    pub cors: Vec<String>,
    /// `--rerank`: Qwen3-Reranker's recipe for `/v1/rerank`, or `None`.
    pub reranker: Option<Reranker>,
    /// The model is an embedding model (`/v1/embeddings`; it generates no text).
    pub embeds: bool,
    /// How long a POST's body may take to arrive (`--body-timeout`; 408 after it).
    pub body_timeout: std::time::Duration,
    /// The vocabulary as the grammar engine sees it (structured output), built at first use.
    pub grammars: Grammars,
    /// What Ollama's `/api/tags` and `/api/show` say of the model.
    pub info: ModelInfo,
    /// The model's vision tower and image settings (a model that sees images), or `None`.
    pub images: Option<qwen3_inference::vision::ImageEncoder>,
    /// Most images one chat request may carry (`--max-images`).
    pub max_images: usize,
    /// Most pixels an image may decode to, before it is resized (`--max-image-pixels`): the
    /// bound on a decompression bomb's memory.
    pub max_image_pixels: u64,
    /// Whether an `http(s)` image URL is fetched (`--fetch-image-urls`); otherwise it is refused
    /// and only data URLs are taken.
    pub fetch_image_urls: bool,
    /// Most bytes one image file may have (`--max-image-bytes`).
    pub max_image_bytes: usize,
    /// Set when the server was told to stop ([`crate::serve`]): `/health` answers 503, new
    /// requests get a 503 (a load balancer sends them to another replica), and the requests
    /// already held are answered.
    pub draining: std::sync::atomic::AtomicBool,
    /// `GET /metrics` needs no key even with one set (`--public-metrics`): for scrapers that
    /// send none, such as the Gateway API's endpoint picker.
    pub public_metrics: bool,
    /// Speculative decoding's drafts for the requests that do not opt out (`--draft`).
    pub draft: qwen3_inference::engine::Draft,
}

/// The model file, as Ollama's API describes a model.
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    /// Ollama's family name, a GGUF architecture's: `qwen3`, `qwen2`, `qwen3moe`, `qwen35`, ...
    pub family: String,
    pub parameters: u64,
    /// The weights' type (`q8`, `q4`, `bf16`, `f32`).
    pub quantization: String,
    pub file_size: u64,
    /// The file's modification time, Unix seconds.
    pub modified: u64,
    pub embedding_length: u32,
    pub block_count: u32,
    pub head_count: u32,
    pub head_count_kv: u32,
}

impl ModelInfo {
    /// What `file` (at `path`) says of itself.
    pub fn of(file: &ModelFile, path: &std::path::Path) -> ModelInfo {
        let h = file.header();
        let c = &h.config;
        // ollama's family is the GGUF's architecture name (qwen3, qwen3moe, qwen35, ...).
        let family = Architecture::named(&c.architecture).map_or("qwen3", |a| a.gguf);
        let modified = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        ModelInfo {
            family: family.to_string(),
            parameters: h
                .tensors
                .iter()
                .map(|t| t.shape.iter().product::<u64>())
                .sum(),
            quantization: c.dtype.to_string(),
            file_size: h.file_len,
            modified,
            embedding_length: c.hidden_size,
            block_count: c.num_hidden_layers,
            head_count: c.num_attention_heads,
            head_count_kv: c.num_key_value_heads,
        }
    }
}

/// The grammar engine's vocabulary, built by the first request with a grammar (a server that
/// never gets one never pays for it): the token trie of all `n_logits` ids.
pub struct Grammars {
    n_logits: usize,
    built: OnceLock<Result<Vocabulary, String>>,
}

impl Grammars {
    /// For a model with `n_logits` logits (its `vocab_size`).
    pub fn new(n_logits: usize) -> Grammars {
        Grammars {
            n_logits,
            built: OnceLock::new(),
        }
    }

    /// The vocabulary of `tokenizer`, with `eos` (a special token) as the grammar engine's
    /// end of sequence.
    pub fn get(&self, tokenizer: &'static Tokenizer, eos: u32) -> Result<&Vocabulary, String> {
        self.built
            .get_or_init(|| {
                Vocabulary::new(tokenizer, self.n_logits, eos).map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Where to listen.
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// Connections held at once, and how long a request's head may take (listen.rs).
    pub limits: crate::listen::Limits,
    /// On SIGTERM or Ctrl-C, how long the requests already held may take to finish before
    /// they are ended (`--shutdown-timeout`).
    pub shutdown_timeout: std::time::Duration,
}
