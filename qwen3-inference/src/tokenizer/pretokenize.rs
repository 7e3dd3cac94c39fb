//! Pre-tokenization: cutting normalized text into the pieces BPE runs on, exactly as the
//! Qwen2/Qwen3 split regex of tokenizer.json does, or Qwen3.5's ([`SplitPattern`]).
//!
//! The pattern ([`super::file::QWEN2_SPLIT_PATTERN`]) is a list of alternatives tried in order at
//! each position (leftmost-first, as Oniguruma in HuggingFace `tokenizers` runs it):
//!
//! ```text
//! 1  (?i:'s|'t|'re|'ve|'m|'ll|'d)     English contractions, any case
//! 2  [^\r\n\p{L}\p{N}]?\p{L}+          a word, with one leading non-letter (" world", "(foo")
//! 3  \p{N}                             one digit: numbers are split digit by digit
//! 4   ?[^\s\p{L}\p{N}]+[\r\n]*         punctuation/symbol run, optional leading space, newlines
//! 5  \s*[\r\n]+                        whitespace ending in newlines
//! 6  \s+(?!\S)                         whitespace not followed by a non-space: leaves the last
//!                                      space for the next word (" " + "word" -> "Ġword")
//! 7  \s+                               any other whitespace
//! ```
//!
//! Qwen3.5's pattern (transformers' `Qwen3_5Tokenizer`, [`super::file::QWEN35_SPLIT_PATTERN`])
//! differs in two alternatives: a word is `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+`, letters with
//! their combining marks (so "e" + U+0301 stays one piece where Qwen2 cuts the accent off into a
//! punctuation piece), and a punctuation run is ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`. The
//! functions below take the difference as `marks`: whether `\p{M}` counts with the letters.
//!
//! Every character is matched by one of 2, 3, 4 or 5-7, so matches tile the text. The Rust
//! `regex` crate has no look-ahead for alternative 6, so the splitter is written by hand: one
//! function per alternative, each returning the end of its match. Its agreement with the regex is
//! tested on the HF reference cases and on a randomized differential run (docs/tokenizer.md).

use super::unicode_tables::{LETTER, MARK, NUMBER, WHITESPACE};

/// The split regexes this pre-tokenizer implements: the one a tokenizer file names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitPattern {
    /// Qwen2's, Qwen2.5's and Qwen3's ([`super::file::QWEN2_SPLIT_PATTERN`]).
    #[default]
    Qwen2,
    /// Qwen3.5's ([`super::file::QWEN35_SPLIT_PATTERN`]): combining marks join letters.
    Qwen35,
}

impl SplitPattern {
    /// The regex, as tokenizer.json and the tokenizer file write it.
    pub const fn regex(self) -> &'static str {
        match self {
            SplitPattern::Qwen2 => super::file::QWEN2_SPLIT_PATTERN,
            SplitPattern::Qwen35 => super::file::QWEN35_SPLIT_PATTERN,
        }
    }

    /// The pattern whose regex is `s`, if it is one of ours.
    pub fn from_regex(s: &str) -> Option<Self> {
        [SplitPattern::Qwen2, SplitPattern::Qwen35]
            .into_iter()
            .find(|p| p.regex() == s)
    }

    /// Whether `\p{M}` counts with the letters (Qwen3.5).
    const fn marks(self) -> bool {
        matches!(self, SplitPattern::Qwen35)
    }
}

/// Whether `c` is in one of the generated inclusive ranges.
pub(super) fn in_table(table: &[(u32, u32)], c: char) -> bool {
    let c = c as u32;
    table
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `\p{L}`.
fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_alphabetic()
    } else {
        in_table(LETTER, c)
    }
}

/// `\p{N}`.
fn is_number(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_digit()
    } else {
        in_table(NUMBER, c)
    }
}

/// `\s` (Oniguruma's Unicode whitespace).
fn is_space(c: char) -> bool {
    if c.is_ascii() {
        matches!(c, '\t' | '\n' | '\x0B' | '\x0C' | '\r' | ' ')
    } else {
        in_table(WHITESPACE, c)
    }
}

fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// `\p{M}`.
fn is_mark(c: char) -> bool {
    !c.is_ascii() && in_table(MARK, c)
}

/// `\p{L}`, or with `marks` `[\p{L}\p{M}]`: what a word's body is made of.
fn is_word_char(c: char, marks: bool) -> bool {
    is_letter(c) || (marks && is_mark(c))
}

/// `[^\s\p{L}\p{N}]` (with `marks`, `[^\s\p{L}\p{M}\p{N}]`): punctuation, symbols, controls,
/// emoji, and without `marks` the marks.
fn is_other(c: char, marks: bool) -> bool {
    !is_space(c) && !is_word_char(c, marks) && !is_number(c)
}

/// The character starting at byte `i` of `s` (`i` must be a char boundary).
fn char_at(s: &str, i: usize) -> Option<char> {
    s.get(i..)?.chars().next()
}

/// End of the run of characters satisfying `pred` that starts at byte `i`.
fn run_end(s: &str, i: usize, pred: impl Fn(char) -> bool) -> usize {
    match s[i..].char_indices().find(|&(_, c)| !pred(c)) {
        Some((k, _)) => i + k,
        None => s.len(),
    }
}

/// Alternative 1, `(?i:'s|'t|'re|'ve|'m|'ll|'d)`. Oniguruma's case-insensitive match uses Unicode
/// case folding, under which U+017F LATIN SMALL LETTER LONG S folds to `s`.
fn contraction(s: &str, i: usize) -> Option<usize> {
    let rest = s[i..].strip_prefix('\'')?;
    let mut cs = rest.chars();
    let c1 = cs.next()?.to_ascii_lowercase();
    let c2 = cs.next().map(|c| c.to_ascii_lowercase());
    let one = |c: char| i + 1 + c.len_utf8();
    match (c1, c2) {
        ('s' | 'ſ', _) | ('t', _) | ('m', _) | ('d', _) => Some(one(rest.chars().next()?)),
        ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => Some(i + 3),
        _ => None,
    }
}

/// Alternative 2, `[^\r\n\p{L}\p{N}]?\p{L}+` (with `marks`, `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+`). When
/// `c0` is a mark it may be the optional first character or the body's: either way the match
/// ends where the run of word characters from `c0` does.
fn word(s: &str, i: usize, c0: char, marks: bool) -> Option<usize> {
    let body = |c: char| is_word_char(c, marks);
    if body(c0) {
        return Some(run_end(s, i, body));
    }
    if is_newline(c0) || is_number(c0) {
        return None;
    }
    let j = i + c0.len_utf8();
    body(char_at(s, j)?).then(|| run_end(s, j, body))
}

/// Alternative 4, ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with `marks`, `\p{M}` excluded too).
fn punctuation(s: &str, i: usize, c0: char, marks: bool) -> Option<usize> {
    let other = |c: char| is_other(c, marks);
    let j = if c0 == ' ' { i + 1 } else { i };
    if !other(char_at(s, j)?) {
        return None;
    }
    let end = run_end(s, j, other);
    Some(run_end(s, end, is_newline))
}

/// Alternatives 5, 6 and 7 on the whitespace run starting at `i` (`c0` is whitespace).
fn whitespace(s: &str, i: usize) -> usize {
    let run = run_end(s, i, is_space);
    // 5: `\s*[\r\n]+` -- the greedy `\s*` backs off to the last newline of the run.
    if let Some(k) = s[i..run].rfind(is_newline) {
        return i + k + 1;
    }
    // 6: `\s+(?!\S)` -- at the end of the text the whole run matches; before a non-space the run
    // backs off one character, which needs at least two characters.
    if run == s.len() {
        return run;
    }
    let last = s[i..run].char_indices().last().map_or(0, |(k, _)| k);
    if last > 0 {
        return i + last;
    }
    // 7: `\s+` -- a single whitespace character before a non-space.
    run
}

/// The end of the regex match that starts at byte `i` (`i < s.len()`, a char boundary).
fn match_end(s: &str, i: usize, marks: bool) -> usize {
    let c0 = char_at(s, i).expect("i is inside s");
    if let Some(end) = contraction(s, i) {
        return end;
    }
    if let Some(end) = word(s, i, c0, marks) {
        return end;
    }
    if is_number(c0) {
        return i + c0.len_utf8();
    }
    if let Some(end) = punctuation(s, i, c0, marks) {
        return end;
    }
    // Every non-whitespace character matched above (a letter, or with `marks` a mark, by 2, a
    // number by 3, anything else by 4), so c0 is whitespace here.
    whitespace(s, i)
}

/// Splits `text` into the pieces `pattern`'s regex matches, in order; their concatenation is
/// `text`.
pub fn split(text: &str, pattern: SplitPattern) -> Split<'_> {
    Split {
        text,
        pos: 0,
        marks: pattern.marks(),
    }
}

/// Iterator returned by [`split`].
pub struct Split<'a> {
    text: &'a str,
    pos: usize,
    marks: bool,
}

impl<'a> Iterator for Split<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        self.pos = match_end(self.text, start, self.marks);
        Some(&self.text[start..self.pos])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A case's `pretokens`: the pieces HF's pre-tokenizer cut its text into.
    fn pretokens(c: &Value) -> Vec<&str> {
        c["pretokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect()
    }

    /// Every text of the reference fixtures, split by us and by HF `tokenizers`'
    /// `pre_tokenizer.pre_tokenize_str` (recorded by scripts/tokenizer_cases.py).
    #[test]
    fn pieces_match_hf_pre_tokenizer() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/tokenizer/tokenizer-cases-extra.json"
        );
        let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut n = 0;
        for c in json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .chain(json["dev_pretokens"].as_array().unwrap())
        {
            let text = c["text"].as_str().unwrap();
            let want = pretokens(c);
            let got: Vec<&str> = split(text, SplitPattern::Qwen2).collect();
            assert_eq!(got, want, "{text:?}");
            n += 1;
        }
        assert!(n > 250, "{n}");
    }

    /// Qwen3.5's pattern against HF `tokenizers`' Split step with transformers' Qwen3.5 regex
    /// (scripts/qwen3_5_tokenizer_cases.py), on texts full of combining marks; and the cases
    /// tell the two patterns apart.
    #[test]
    fn qwen35_pieces_match_hf() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/tokenizer/qwen3_5-cases.json"
        );
        let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (mut n, mut differ) = (0, 0);
        for c in json["cases"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let want = pretokens(c);
            let got: Vec<&str> = split(text, SplitPattern::Qwen35).collect();
            assert_eq!(got, want, "{text:?}");
            differ += usize::from(split(text, SplitPattern::Qwen2).collect::<Vec<_>>() != want);
            n += 1;
        }
        assert!(
            n > 300 && differ > 100,
            "{n} cases, {differ} differ under Qwen2's pattern"
        );
    }

    #[test]
    fn pieces_tile_the_text() {
        for s in [
            "",
            " ",
            "\u{3000}\u{3000}a",
            "e\u{301}\r\n",
            "x\u{1F642} x\t\ty\n",
        ] {
            for pattern in [SplitPattern::Qwen2, SplitPattern::Qwen35] {
                let pieces: Vec<&str> = split(s, pattern).collect();
                assert_eq!(pieces.concat(), s);
                assert!(pieces.iter().all(|p| !p.is_empty()));
            }
        }
    }
}
