//! Readers for the files of a HuggingFace checkpoint directory.
