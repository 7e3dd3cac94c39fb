//! pico-qwen's runtime: read a model file, tokenize, run the Qwen3 forward pass, sample.
//!
//! Data flows one way, and the modules follow it:
//! files on disk -> [`format`] (the model file) -> [`model`] (weights, forward pass, run by a
//! [`backend`]) -> logits -> [`sampler`] -> token ids -> [`tokenizer`] -> text ([`text`]: an
//! answer's text as a user sees it, cut at its stop strings, its reasoning and tool calls
//! apart). [`chat`] turns a conversation into the token ids the model sees; [`generate`] drives
//! prefill and decode; [`constraint`] masks the logits so that an answer matches a grammar
//! (structured output).
//! [`pages`] asks for the 2 MiB pages that the weights and the KV cache stream fastest from.
//! [`gguf`] reads llama.cpp's GGUF files (their metadata, tokenizer and tensors), which [`format`]
//! opens as model files.
//! [`vision`] turns an image file into the vision tower's input (patches), as transformers does.

pub mod backend;
pub mod chat;
pub mod constraint;
pub mod embedding;
pub mod engine;
pub mod format;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod logprobs;
pub mod model;
pub mod pages;
pub mod quant;
pub mod rerank;
pub mod sampler;
// Deterministic test values: built for this crate's tests and, through the `testing` feature,
// for other crates' tests and benches only; a release build of `qwen3` does not contain it.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod tokenizer;
pub mod vision;
