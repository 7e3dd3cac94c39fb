//! A chat as a list of messages, and how much of the KV cache a new turn can keep.
//!
//! Each turn the whole conversation is rendered with the model's template and tokenized; the
//! tokens already in the KV cache are compared with the new ones and only the part after their
//! longest common prefix is fed again ([`reuse_len`]). That is exact by construction: the model
//! always ends up having seen precisely `tokenize(render(conversation))`, the sequence HuggingFace
//! would feed, whatever the template does to past turns. For Qwen3 it matters: the template drops
//! the reasoning of past assistant turns (and the empty think block of thinking-off answers), so
//! after each answer the cache is rewound to where that answer began, and the answer is fed again
//! in its rendered, shorter form, followed by the new user turn.

use super::template::{ChatTemplate, Message};
use anyhow::Result;

/// The messages of one chat: an optional system prompt, then user and assistant turns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    system: Option<String>,
    turns: Vec<Message>,
    enable_thinking: Option<bool>,
}

impl Conversation {
    /// An empty conversation with an optional system prompt; thinking as the template's default.
    pub fn new(system: Option<String>) -> Conversation {
        Conversation {
            system,
            turns: Vec::new(),
            enable_thinking: None,
        }
    }

    /// `/reset`: forget every turn, keep the system prompt and the thinking setting.
    pub fn reset(&mut self) {
        self.turns.clear();
    }

    /// `/system TEXT`: a new conversation with this system prompt (`None` or empty text: none).
    /// The turns are cleared: they were answered under the old system prompt.
    pub fn set_system(&mut self, text: Option<String>) {
        self.system = text.filter(|t| !t.is_empty());
        self.turns.clear();
    }

    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    /// `/think on|off`: `Some(b)` passes `enable_thinking=b` to the template from the next prompt
    /// on; `None` lets the template decide.
    pub fn set_thinking(&mut self, enable_thinking: Option<bool>) {
        self.enable_thinking = enable_thinking;
    }

    pub fn thinking(&self) -> Option<bool> {
        self.enable_thinking
    }

    /// The user and assistant turns so far (without the system prompt).
    pub fn turns(&self) -> &[Message] {
        &self.turns
    }

    pub fn push_user(&mut self, text: impl Into<String>) {
        self.turns.push(Message::user(text));
    }

    /// Records the model's answer as it generated it, reasoning included
    /// (`"<think>\n...\n</think>\n\nanswer"`, without the end-of-turn token): the template decides
    /// what of it stays in the history.
    pub fn push_assistant(&mut self, text: impl Into<String>) {
        self.turns.push(Message::assistant(text));
    }

    /// Removes the last user message and anything after it (an answer that was interrupted, or a
    /// user message that did not fit). Returns whether there was one.
    pub fn undo_last_user(&mut self) -> bool {
        match self.turns.iter().rposition(|m| m.role == "user") {
            Some(i) => {
                self.turns.truncate(i);
                true
            }
            None => false,
        }
    }

    /// Drops the oldest exchange (the first user message and everything before the next one), to
    /// make room when the context is full. Returns whether anything was dropped.
    pub fn drop_oldest_exchange(&mut self) -> bool {
        if self.turns.is_empty() {
            return false;
        }
        let next_user = self
            .turns
            .iter()
            .skip(1)
            .position(|m| m.role == "user")
            .map_or(self.turns.len(), |i| i + 1);
        self.turns.drain(..next_user);
        true
    }

    /// The system prompt (if any) followed by the turns, as the template receives them.
    pub fn messages(&self) -> Vec<Message> {
        let mut out = Vec::with_capacity(self.turns.len() + 1);
        if let Some(s) = &self.system {
            out.push(Message::system(s.clone()));
        }
        out.extend(self.turns.iter().cloned());
        out
    }

    /// The whole conversation rendered with the generation prompt: the text the model must have
    /// seen before it writes the next answer.
    pub fn prompt(&self, template: &ChatTemplate) -> Result<String> {
        template.render(&self.messages(), true, self.enable_thinking)
    }
}

/// The length of the longest common prefix of the tokens in the cache and the new prompt tokens.
pub fn common_prefix_len(cached: &[u32], new: &[u32]) -> usize {
    cached.iter().zip(new).take_while(|(a, b)| a == b).count()
}

/// How many cached tokens to keep before feeding `new[keep..]`: the common prefix, but never all
/// of `new`: the last prompt token must be fed again to get the logits of the next token.
pub fn reuse_len(cached: &[u32], new: &[u32]) -> usize {
    common_prefix_len(cached, new).min(new.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_lengths() {
        assert_eq!(common_prefix_len(&[], &[1, 2]), 0);
        assert_eq!(common_prefix_len(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix_len(&[1, 2, 3], &[1, 2]), 2);
        assert_eq!(common_prefix_len(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix_len(&[9], &[1]), 0);
        // The whole new prompt is cached: keep all but its last token, whose logits we need.
        assert_eq!(reuse_len(&[1, 2, 3], &[1, 2, 3]), 2);
        assert_eq!(reuse_len(&[1, 2, 3, 4], &[1, 2]), 1);
        assert_eq!(reuse_len(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(reuse_len(&[], &[]), 0);
    }

    /// The token ids of a case in fixtures/chat/chat-template-cases.json, as HuggingFace
    /// `tokenizers` encoded transformers' rendering.
    fn hf_ids(name: &str) -> Vec<u32> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/chat/chat-template-cases.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let case = v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap();
        serde_json::from_value(case["ids"].clone()).unwrap()
    }

    /// Rewind points on HuggingFace's own ids: the cache holds the first turn's prompt (plus the
    /// answer the model wrote after it), the new prompt is the three-turn conversation.
    #[test]
    fn rewind_points_on_hf_ids() {
        // Thinking on: the new prompt shares the whole first prompt; the rewind point is where
        // the first answer began (its reasoning is not in the new prompt).
        let first = hf_ids("single_user_thinking_default");
        let three = hf_ids("three_turn_past_think_stripped");
        let think_id = 151_667; // "<think>" in the Qwen3 vocabulary (tokenizer.json added_tokens)
        let mut cached = first.clone();
        cached.extend([think_id, 198, 785]); // whatever the model generated next
        assert_eq!(common_prefix_len(&cached, &three), first.len());
        assert_eq!(reuse_len(&cached, &three), first.len());

        // Thinking off: the first prompt ended in an empty think block, which the template drops
        // from past turns, so the rewind point is where that block began, 4 tokens earlier.
        let first = hf_ids("single_user_enable_thinking_false");
        let three = hf_ids("three_turn_past_think_stripped_thinking_false");
        let block = first.iter().position(|&t| t == think_id).unwrap();
        assert_eq!(first.len() - block, 4); // <think> "\n\n" </think> "\n\n"
        assert_eq!(common_prefix_len(&first, &three), block);

        // With a system prompt nothing of a prompt without one can be kept.
        let sys = hf_ids("system_user_thinking_default");
        assert_eq!(
            common_prefix_len(&hf_ids("single_user_thinking_default"), &sys),
            1
        );
    }

    #[test]
    fn reset_system_undo_drop() {
        let mut c = Conversation::new(Some("Be brief.".into()));
        c.push_user("a");
        c.push_assistant("A");
        c.push_user("b");
        c.push_assistant("B");
        c.push_user("c");
        assert_eq!(c.messages().len(), 6);
        assert_eq!(c.messages()[0], Message::system("Be brief."));
        assert!(c.drop_oldest_exchange());
        assert_eq!(c.turns()[0], Message::user("b"));
        assert_eq!(c.turns().len(), 3);
        assert!(c.undo_last_user());
        assert_eq!(c.turns().len(), 2);
        assert_eq!(c.turns()[1], Message::assistant("B"));
        c.reset();
        assert!(c.turns().is_empty());
        assert_eq!(c.system(), Some("Be brief."));
        c.push_user("x");
        c.set_system(Some("Be verbose.".into()));
        assert!(c.turns().is_empty());
        assert_eq!(c.system(), Some("Be verbose."));
        c.set_system(Some(String::new()));
        assert_eq!(c.system(), None);
        assert!(!c.undo_last_user());
        assert!(!c.drop_oldest_exchange());
    }
}
