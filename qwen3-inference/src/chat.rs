//! Conversation -> token ids through the model's own chat template. (Placeholder.)
