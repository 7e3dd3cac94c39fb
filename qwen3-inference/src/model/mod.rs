//! The Qwen3 model: weights borrowed from the model file, RoPE, KV cache, forward pass. (Placeholder.)
