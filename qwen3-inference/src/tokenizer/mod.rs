//! Byte-level BPE tokenizer, exact to HuggingFace `tokenizers`. (Placeholder.)
