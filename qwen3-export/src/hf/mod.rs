//! Readers for the files of a HuggingFace checkpoint directory.

pub mod chat_template;
pub mod tokenizer_json;
