//! Added tokens (`<|im_start|>`, `<think>`, ...): found in the text before anything else and
//! emitted as their single id; BPE only sees the text between them.
//!
//! Semantics of HuggingFace `tokenizers` (`tokenizer/added_vocabulary.rs`, `find_matches`):
//! - matching is leftmost-longest (an Aho-Corasick automaton with `MatchKind::LeftmostLongest`):
//!   scanning left to right, the first position where some token matches wins, and among the
//!   tokens matching there the longest; the scan resumes after the match;
//! - `single_word`: the match is dropped (and the scan still resumes after it) if a word
//!   character (`\w`) touches it on either side;
//! - `lstrip` / `rstrip`: the whitespace (`\s`) before / after the token joins the token;
//! - tokens with `normalized: false` are matched in the raw text first; the text between them
//!   is normalized, and tokens with `normalized: true` (whose content was normalized the same way)
//!   are matched in that normalized text.

use super::file::AddedToken;

/// A part of the input: text for the normal pipeline, or an added token's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment<'a> {
    Text(&'a str),
    Token(u32),
}

/// One matching set: the tokens matched on the same kind of text (raw or normalized).
pub struct Matcher {
    /// (pattern bytes, token), sorted by first byte then by length, longest first.
    patterns: Vec<(Vec<u8>, AddedToken)>,
    /// `first[b]` = range in `patterns` of the patterns starting with byte b.
    first: Vec<(u32, u32)>,
}

impl Matcher {
    /// A matcher for `tokens`, each matched as `pattern(token)` (its content, or its normalized
    /// content). Empty patterns never match, as in HF.
    pub fn new(tokens: Vec<(String, AddedToken)>) -> Matcher {
        let mut patterns: Vec<(Vec<u8>, AddedToken)> = tokens
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, t)| (p.into_bytes(), t))
            .collect();
        // Stable: among identical patterns the first listed wins, like the automaton.
        patterns.sort_by(|a, b| a.0[0].cmp(&b.0[0]).then(b.0.len().cmp(&a.0.len())));
        let mut first = vec![(0u32, 0u32); 256];
        let mut i = 0;
        while i < patterns.len() {
            let b = patterns[i].0[0];
            let mut j = i;
            while j < patterns.len() && patterns[j].0[0] == b {
                j += 1;
            }
            first[b as usize] = (i as u32, j as u32);
            i = j;
        }
        Matcher { patterns, first }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The leftmost-longest match at or after byte `from`: (start, end, token).
    fn find(&self, text: &str, from: usize) -> Option<(usize, usize, &AddedToken)> {
        let bytes = text.as_bytes();
        for start in from..bytes.len() {
            let (lo, hi) = self.first[bytes[start] as usize];
            // Longest first within the bucket, so the first hit is the longest.
            for (pat, tok) in &self.patterns[lo as usize..hi as usize] {
                if bytes[start..].starts_with(pat) {
                    return Some((start, start + pat.len(), tok));
                }
            }
        }
        None
    }

    /// Splits `text` into text segments and added tokens, with HF's `find_matches` rules.
    pub fn split<'a>(&self, text: &'a str, out: &mut Vec<Segment<'a>>) {
        let mut start_offset = 0; // end of the last emitted segment
        let mut scan = 0; // where the automaton resumes
        while let Some((m_start, m_end, tok)) = self.find(text, scan) {
            scan = m_end;
            let (mut start, mut stop) = (m_start, m_end);
            if tok.single_word {
                let start_space = start == 0 || !ends_with_word(&text[..start]);
                let stop_space = stop == text.len() || !starts_with_word(&text[stop..]);
                if !start_space || !stop_space {
                    continue;
                }
            }
            if tok.lstrip {
                // Whitespace already taken by the previous token is not taken again.
                start = space_start_at_end(&text[..start]).max(start_offset);
            }
            if tok.rstrip {
                stop += space_len_at_start(&text[stop..]);
            }
            if start_offset < start {
                out.push(Segment::Text(&text[start_offset..start]));
            }
            out.push(Segment::Token(tok.id));
            start_offset = stop;
        }
        if start_offset < text.len() {
            out.push(Segment::Text(&text[start_offset..]));
        }
    }
}

/// `\w` of the Rust `regex` crate that HF uses here (alphanumeric, marks, connector punctuation);
/// approximated by `char::is_alphanumeric` plus `_` (the word flags are unused by Qwen3).
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ends_with_word(s: &str) -> bool {
    s.chars().next_back().is_some_and(is_word_char)
}

fn starts_with_word(s: &str) -> bool {
    s.chars().next().is_some_and(is_word_char)
}

/// Start of the whitespace run that ends `s` (`s.len()` if none).
fn space_start_at_end(s: &str) -> usize {
    s.trim_end_matches(char::is_whitespace).len()
}

/// Length of the whitespace run that starts `s`.
fn space_len_at_start(s: &str) -> usize {
    s.len() - s.trim_start_matches(char::is_whitespace).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u32, content: &str) -> (String, AddedToken) {
        let t = AddedToken {
            id,
            content: content.into(),
            special: true,
            single_word: false,
            lstrip: false,
            rstrip: false,
            normalized: false,
        };
        (content.into(), t)
    }

    fn split<'a>(m: &Matcher, s: &'a str) -> Vec<Segment<'a>> {
        let mut out = Vec::new();
        m.split(s, &mut out);
        out
    }

    #[test]
    fn leftmost_then_longest() {
        let m = Matcher::new(vec![tok(1, "<a>"), tok(2, "<a><b>"), tok(3, "b>")]);
        use Segment::*;
        assert_eq!(split(&m, "x<a><b>y"), [Text("x"), Token(2), Text("y")]);
        assert_eq!(split(&m, "<a>b>"), [Token(1), Token(3)]);
        assert_eq!(split(&m, "<<a>"), [Text("<"), Token(1)]);
        assert_eq!(split(&m, ""), []);
    }

    #[test]
    fn strip_flags_take_whitespace() {
        let (c, mut t) = tok(7, "<m>");
        t.lstrip = true;
        t.rstrip = true;
        let m = Matcher::new(vec![(c, t)]);
        use Segment::*;
        assert_eq!(split(&m, "a  <m>  b"), [Text("a"), Token(7), Text("b")]);
    }
}
