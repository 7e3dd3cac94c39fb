//! Readers for the files of a HuggingFace checkpoint directory.

pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod family;
pub mod qwen3_5;
pub mod sentence_transformers;
pub mod tokenizer_json;
pub mod vision;
