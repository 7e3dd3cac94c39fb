//! Tool calls in an answer: Qwen's chat templates (Qwen3, Qwen2.5) tell the model to answer a
//! call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; this cuts those blocks
//! out of the answer's text as it streams and turns each into a call (OpenAI's
//! `message.tool_calls`), as vLLM's `hermes` parser does for these models.
//!
//! A block whose JSON is not `{"name": string, "arguments": ...}`, or that never closes, stays in
//! the text as the model wrote it: nothing the model said is lost. `arguments` is kept as the
//! exact JSON text the model wrote (OpenAI sends it as a string), so a client that sends the
//! call back in the history renders the same tokens the model produced.
//!
//! Text is held back, never taken back: a possible beginning of `<tool_call>`, a block until
//! its `</tool_call>`, and whitespace after a call (sent only if more text follows).

use serde::Deserialize;
use serde_json::value::RawValue;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// See the module's comment.
#[derive(Debug, Default)]
pub struct ToolCallSplit {
    /// Inside a block: the whitespace before its tag (dropped if it is a call, kept if not),
    /// and its text so far (after `<tool_call>`).
    block: Option<(String, String)>,
    /// Outside: text not sent yet (a possible tag's beginning, or whitespace).
    held: String,
    /// Calls found so far (whitespace after one is held until text follows).
    calls: usize,
}

impl ToolCallSplit {
    /// A splitter whose answer starts with `prefix` already (a forced call: the prompt ends with
    /// the beginning of a block, see `tool_choice`).
    pub fn with_prefix(prefix: &str) -> ToolCallSplit {
        let mut s = ToolCallSplit::default();
        let (text, calls) = s.push(prefix);
        debug_assert!(text.is_empty() && calls.is_empty());
        s
    }

    /// Adds answer text; returns the text to send and the calls completed by it.
    pub fn push(&mut self, text: &str) -> (String, Vec<ToolCall>) {
        let (mut out, mut calls) = (String::new(), Vec::new());
        let mut rest = text.to_string();
        loop {
            match &mut self.block {
                Some((gap, block)) => {
                    block.push_str(&rest);
                    let Some(at) = block.find(CLOSE) else {
                        return (out, calls);
                    };
                    let after = block[at + CLOSE.len()..].to_string();
                    let inner = block[..at].to_string();
                    let gap = std::mem::take(gap);
                    self.block = None;
                    match parse(&inner) {
                        Some(call) => {
                            calls.push(call);
                            self.calls += 1;
                        }
                        // Not a call: the block stays text, as written.
                        None => out.push_str(&format!("{gap}{OPEN}{inner}{CLOSE}")),
                    }
                    rest = after;
                }
                None => {
                    self.held.push_str(&rest);
                    rest.clear();
                    if let Some(at) = self.held.find(OPEN) {
                        // Text before a call, but not the whitespace that separates the two.
                        let text = self.held[..at].trim_end();
                        out.push_str(text);
                        let gap = self.held[text.len()..at].to_string();
                        rest = self.held[at + OPEN.len()..].to_string();
                        self.held.clear();
                        self.block = Some((gap, String::new()));
                        continue;
                    }
                    // Send what cannot begin the tag, keeping trailing whitespace too (it goes
                    // if a call follows, or at the end after a call).
                    let keep = partial_tag(&self.held);
                    let body = &self.held[..self.held.len() - keep];
                    let send = body.trim_end().len();
                    out.push_str(&self.held[..send]);
                    self.held.drain(..send);
                    return (out, calls);
                }
            }
        }
    }

    /// The answer ended: an unclosed block is text; whitespace held after a call is dropped.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        if self.calls > 0 && out.trim().is_empty() {
            out.clear();
        }
        if let Some((gap, block)) = self.block.take() {
            out.push_str(&gap);
            out.push_str(OPEN);
            out.push_str(&block);
        }
        out
    }
}

/// The length of the longest end of `text` that is a proper beginning of `<tool_call>`.
fn partial_tag(text: &str) -> usize {
    text.char_indices()
        .map(|(i, _)| &text[i..])
        .find(|end| end.len() < OPEN.len() && OPEN.starts_with(end))
        .map_or(0, str::len)
}

/// `{"name": "f", "arguments": {...}}` -> the call, with the arguments' text as written.
fn parse(inner: &str) -> Option<ToolCall> {
    #[derive(Deserialize)]
    struct Call<'a> {
        name: String,
        #[serde(borrow)]
        arguments: Option<&'a RawValue>,
    }
    let c: Call = serde_json::from_str(inner.trim()).ok()?;
    Some(ToolCall {
        name: c.name,
        arguments: c
            .arguments
            .map_or("{}".to_string(), |a| a.get().to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` bytes (on character boundaries) and collects the output.
    fn run(text: &str, n: usize) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallSplit::default();
        let (mut out, mut calls) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            let (t, c) = s.push(&piece.iter().collect::<String>());
            out.push_str(&t);
            calls.extend(c);
        }
        out.push_str(&s.finish());
        (out, calls)
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn calls_are_cut_out_whatever_the_pieces() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
        for n in [1, 2, 3, 7, 1000] {
            let (out, calls) = run(text, n);
            assert_eq!(out, "Let me check.", "pieces of {n}");
            assert_eq!(
                calls,
                [
                    call("get_weather", r#"{"city": "Zürich", "unit": "celsius"}"#),
                    call("now", "{}")
                ],
                "pieces of {n}"
            );
        }
    }

    #[test]
    fn text_without_calls_passes_unchanged() {
        for text in [
            "Hello <tool",
            "a < b and <tool_cal is not a tag\n\n",
            "x\n  \n",
            "",
        ] {
            for n in [1, 4, 100] {
                assert_eq!(
                    run(text, n),
                    (text.to_string(), vec![]),
                    "{text:?} in pieces of {n}"
                );
            }
        }
    }

    #[test]
    fn malformed_or_unclosed_blocks_stay_text() {
        let bad = "<tool_call>\n{\"name\": 3}\n</tool_call>";
        assert_eq!(run(bad, 2), (bad.to_string(), vec![]));
        let open = "Sure <tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(run(open, 3), (open.to_string(), vec![]));
        // A call, then text: the text stays, with what separates it from the call.
        let (out, calls) = run("<tool_call>{\"name\": \"f\"}</tool_call>\n\nDone.", 2);
        assert_eq!(out, "\n\nDone.");
        assert_eq!(calls, [call("f", "{}")]);
    }

    #[test]
    fn a_forced_prefix_is_inside_the_block() {
        let mut s = ToolCallSplit::with_prefix("<tool_call>\n{\"name\": \"f\", \"arguments\": ");
        let (t, c) = s.push("{\"x\": 1}}\n</tool_call>");
        assert_eq!((t.as_str(), c), ("", vec![call("f", r#"{"x": 1}"#)]));
        assert_eq!(s.finish(), "");
    }
}
