//! HuggingFace Qwen3 checkpoint directory -> pico-qwen model file, tokenizer file, template file.

pub mod hf;
