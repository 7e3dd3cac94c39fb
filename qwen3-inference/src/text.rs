//! One choice's tokens as the text a user sees (the server's clients, `qwen3 generate`):
//! decoded as they come, cut at a stop string, and (for a thinking model's chat) split into
//! `reasoning_content` and `content`.
//!
//! Streaming and non-streaming answers both go through [`ChoiceText`], so the concatenated
//! deltas of a stream equal the whole answer by construction. Text is held back, never taken
//! back: the bytes of an incomplete character (the tokenizer's [`StreamDecoder`]), the end of
//! the text while it could still be the start of a stop string, and a tag (`<think>`,
//! `</think>`) while it is not complete.

use crate::chat::tool_calls::{ToolCall, ToolCallSplit, ToolCalls};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Text to send: the answer's part and the reasoning's part, and the tool calls completed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }

    fn append(&mut self, other: Delta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
        self.tool_calls.extend(other.tool_calls);
    }
}

/// See the module's comment.
pub struct ChoiceText<'t> {
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    split: Option<ReasoningSplit>,
    /// Cuts `<tool_call>` blocks out of the content (a request with tools).
    tools: Option<ToolCallSplit>,
}

impl<'t> ChoiceText<'t> {
    /// `stops`: strings that end the answer (not included in it). `reasoning`: `None` sends
    /// everything as content; `Some(inside)` splits off `<think>...</think>`, `inside` saying
    /// that the prompt already opened the block (a template that ends its prompt with `<think>`).
    pub fn new(tokenizer: &'t Tokenizer, stops: Vec<String>, reasoning: Option<bool>) -> Self {
        ChoiceText {
            decoder: StreamDecoder::new(tokenizer).skip_special(true),
            stops: StopMatcher {
                stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
                held: String::new(),
            },
            split: reasoning.map(ReasoningSplit::new),
            tools: None,
        }
    }

    /// Turns `<tool_call>` blocks of the content into tool calls (`chat/tool_calls.rs`); `calls.prefix`:
    /// the beginning of the answer that the prompt already holds (a forced call), if any.
    pub fn with_tool_calls(mut self, calls: &ToolCalls) -> Self {
        self.tools = Some(ToolCallSplit::new(calls));
        self
    }

    /// Shows special tokens' text too (the CLI's generate mode prints what the model wrote;
    /// the API leaves them out, as OpenAI-compatible servers do).
    pub fn keep_special(mut self) -> Self {
        self.decoder = self.decoder.skip_special(false);
        self
    }

    /// Adds a token. Returns the text now ready, and whether a stop string ended the answer (then
    /// no more tokens are to be pushed, and [`ChoiceText::finish`] returns nothing).
    pub fn push(&mut self, token: u32) -> (Delta, bool) {
        let text = self.decoder.push(token);
        let (ready, stopped) = self.stops.push(&text);
        let mut delta = self.route(&ready);
        if stopped {
            delta.append(self.finish_split());
        }
        (delta, stopped)
    }

    /// The end of the answer (no stop string met): everything held back.
    pub fn finish(&mut self) -> Delta {
        let text = self.decoder.finish();
        let (ready, _) = self.stops.push(&text);
        let mut delta = self.route(&ready);
        let rest = std::mem::take(&mut self.stops.held);
        delta.append(self.route(&rest));
        delta.append(self.finish_split());
        delta
    }

    fn route(&mut self, text: &str) -> Delta {
        let d = match &mut self.split {
            None => Delta {
                content: text.to_string(),
                ..Delta::default()
            },
            Some(split) => split.push(text),
        };
        self.cut_tool_calls(d)
    }

    fn finish_split(&mut self) -> Delta {
        let d = self.split.as_mut().map(|s| s.finish()).unwrap_or_default();
        let mut d = self.cut_tool_calls(d);
        if let Some(t) = &mut self.tools {
            d.content.push_str(&t.finish());
        }
        d
    }

    fn cut_tool_calls(&mut self, mut d: Delta) -> Delta {
        if let Some(t) = &mut self.tools {
            let (content, calls) = t.push(&d.content);
            d.content = content;
            d.tool_calls.extend(calls);
        }
        d
    }
}

/// Cuts the text at the first stop string, holding back an end that could begin one.
struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.held, s))
            .max()
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }
}

/// The length of the longest end of `text` that is a proper beginning of `pattern`.
fn partial_suffix(text: &str, pattern: &str) -> usize {
    text.char_indices()
        .map(|(i, _)| &text[i..])
        .find(|end| end.len() < pattern.len() && pattern.starts_with(end))
        .map_or(0, str::len)
}

/// Where the split is in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start: the answer may open with `<think>`.
    Start,
    /// Inside `<think>`; `begun` once a character other than a newline was sent.
    Thinking {
        begun: bool,
    },
    /// After `</think>`: newlines before the answer are dropped.
    AfterThink,
    Content,
}

/// Splits `<think>reasoning</think>\n\nanswer` into its parts as Qwen3's chat template reads
/// them back: `reasoning_content` is the text between the tags without its leading and trailing
/// newlines, and `content` the text after `</think>` without its leading newlines (the template's
/// `.strip('\n')`), as vLLM's and DeepSeek's APIs return them.
struct ReasoningSplit {
    state: State,
    held: String,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ReasoningSplit {
    fn new(inside: bool) -> Self {
        let state = if inside {
            State::Thinking { begun: false }
        } else {
            State::Start
        };
        ReasoningSplit {
            state,
            held: String::new(),
        }
    }

    fn push(&mut self, text: &str) -> Delta {
        self.held.push_str(text);
        let mut out = Delta::default();
        loop {
            match self.state {
                State::Start => {
                    if let Some(rest) = self.held.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking { begun: false };
                    } else if OPEN.starts_with(self.held.as_str()) {
                        return out; // "<thi": wait for more
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking { begun } => {
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning
                            .push_str(trim_reasoning(&self.held[..at], begun));
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::AfterThink;
                        continue;
                    }
                    // Send what cannot be part of `</think>` or of the newlines before it.
                    let keep = partial_suffix(&self.held, CLOSE);
                    let candidate = &self.held[..self.held.len() - keep];
                    let sent_end = candidate.trim_end_matches('\n').len();
                    let body = &candidate[..sent_end];
                    let body = if begun {
                        body
                    } else {
                        body.trim_start_matches('\n')
                    };
                    let sent = !body.is_empty();
                    if sent {
                        out.reasoning.push_str(body);
                        self.state = State::Thinking { begun: true };
                    }
                    // Keep the trailing newlines and the possible tag.
                    self.held.drain(..sent_end);
                    if !begun && !sent {
                        // Only newlines so far: they lead the reasoning and are dropped.
                        let lead = self.held.len() - self.held.trim_start_matches('\n').len();
                        self.held.drain(..lead);
                    }
                    return out;
                }
                State::AfterThink => {
                    let rest = self.held.trim_start_matches('\n');
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.state = State::Content;
                }
                State::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The answer ended: what was held goes where the state says.
    fn finish(&mut self) -> Delta {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start | State::Content => Delta {
                content: held,
                ..Delta::default()
            },
            State::Thinking { begun } => Delta {
                reasoning: trim_reasoning(&held, begun).to_string(),
                ..Delta::default()
            },
            State::AfterThink => Delta::default(),
        }
    }
}

/// The end of the reasoning without its trailing newlines, and without its leading ones if
/// nothing of it was sent yet (`begun` false): the template's `.strip('\n')`.
fn trim_reasoning(text: &str, begun: bool) -> &str {
    let text = text.trim_end_matches('\n');
    if begun {
        text
    } else {
        text.trim_start_matches('\n')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` to a splitter one at a time and to another all at once: the same parts.
    fn split(pieces: &[&str], inside: bool) -> (String, String) {
        let mut s = ReasoningSplit::new(inside);
        let mut all = Delta::default();
        for p in pieces {
            all.append(s.push(p));
        }
        all.append(s.finish());
        let mut whole = ReasoningSplit::new(inside);
        let mut one = whole.push(&pieces.concat());
        one.append(whole.finish());
        assert_eq!(all, one, "{pieces:?}");
        (all.reasoning, all.content)
    }

    #[test]
    fn thinking_is_split_off() {
        let text = [
            "<th",
            "ink>\n",
            "Let me",
            " think.\n",
            "\n</",
            "think>\n\n",
            "Paris.",
        ];
        assert_eq!(
            split(&text, false),
            ("Let me think.".into(), "Paris.".into())
        );
        // Every split point of the same text gives the same parts.
        let s = text.concat();
        for i in 1..s.len() {
            if s.is_char_boundary(i) {
                assert_eq!(
                    split(&[&s[..i], &s[i..]], false),
                    ("Let me think.".into(), "Paris.".into())
                );
            }
        }
        // Newlines inside the reasoning stay.
        assert_eq!(
            split(&["<think>\na\n\nb\n</think>\n\nc\nd"], false),
            ("a\n\nb".into(), "c\nd".into())
        );
        // Thinking off (the template's empty block was in the prompt): all content.
        assert_eq!(
            split(&["Paris", " is <b>"], false),
            (String::new(), "Paris is <b>".into())
        );
        // The prompt opened the block (DeepSeek-R1's template).
        assert_eq!(
            split(&["hmm\n</think>\n\nok"], true),
            ("hmm".into(), "ok".into())
        );
        // Cut short while thinking.
        assert_eq!(
            split(&["<think>\nstill going\n"], false),
            ("still going".into(), String::new())
        );
        assert_eq!(split(&["<thi"], false), (String::new(), "<thi".into()));
    }

    #[test]
    fn stop_strings_cut_and_hold() {
        let mut m = StopMatcher {
            stops: vec!["END".into(), "\n\n".into()],
            held: String::new(),
        };
        assert_eq!(m.push("abc E"), ("abc ".to_string(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("x"), ("ENx".to_string(), false));
        assert_eq!(m.push("y\n"), ("y".to_string(), false));
        assert_eq!(m.push("\nz"), (String::new(), true));
        // The earliest of two stops wins; multi-byte text is cut on character boundaries.
        let mut m = StopMatcher {
            stops: vec!["é!".into(), "b".into()],
            held: String::new(),
        };
        assert_eq!(m.push("aé"), ("a".to_string(), false));
        assert_eq!(m.push("!b"), (String::new(), true));
        assert_eq!(partial_suffix("xé", "é!"), 'é'.len_utf8());
    }
}
