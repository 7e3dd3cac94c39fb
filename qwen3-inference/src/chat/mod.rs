//! Conversation -> prompt text, through the model's own chat template (see `docs/chat.md`).
//!
//! - [`template_file`]: the `<model>.template.json` file the exporter writes: the raw Jinja
//!   source from the checkpoint and the special tokens it may reference.
//! - [`template`]: [`ChatTemplate`] renders messages with that source at run time (minijinja set
//!   up like transformers' jinja2), so the text equals HuggingFace `apply_chat_template`.
//! - [`pyjson`]: Python's `json.dumps`, for the templates' `tojson` filter.
//! - [`conversation`]: [`Conversation`] (system prompt, turns, `/reset`, `/system`) and the KV
//!   cache reuse rule ([`common_prefix_len`], [`reuse_len`]).
//! - [`tool_calls`]: the tool calls in an answer, in the form the template asked for (Qwen's JSON
//!   or Qwen3.5's XML), read back as OpenAI's `tool_calls`; `tool_choice`'s forced beginning.

pub mod conversation;
pub mod pyjson;
pub mod template;
pub mod template_file;
pub mod tool_calls;

pub use conversation::{common_prefix_len, reuse_len, Conversation};
pub use template::{ChatTemplate, Message};
pub use template_file::TemplateFile;
