//! Streaming decoding: token ids arrive one at a time during generation, but a character may be
//! split across tokens (an emoji is 4 bytes, often 2 or 3 tokens). [`StreamDecoder`] holds the
//! bytes of an incomplete character until it completes, so the terminal never shows half of one.
//!
//! Its output, concatenated with [`StreamDecoder::finish`], equals [`super::Tokenizer::decode`]
//! of the same ids: invalid bytes become U+FFFD exactly where `String::from_utf8_lossy` (which
//! HF's ByteLevel decoder calls) puts them, one per maximal invalid subsequence.

use super::Tokenizer;

/// Decodes a growing sequence of token ids into text, one id at a time.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    /// Bytes received but not yet returned: at most an incomplete UTF-8 sequence (< 4 bytes)
    /// between calls.
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that prints every token, special ones included (like `decode(ids, false)`).
    pub fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            skip_special: false,
            pending: Vec::new(),
        }
    }

    /// Drops special tokens from the output (like `decode(ids, true)`).
    pub fn skip_special(mut self, skip: bool) -> Self {
        self.skip_special = skip;
        self
    }

    /// Adds token `id` and returns the text that is now complete and was not returned before.
    ///
    /// An id with no token adds nothing, like HF's decode: the model's embedding table is padded
    /// past the tokenizer's vocabulary (151936 vs 151669 rows for Qwen3), and a model that samples
    /// one of those rows has produced no text. (`Tokenizer::decode` also reports ids past the
    /// model's vocabulary as an error; a stream has no error channel, so they add nothing too.)
    pub fn push(&mut self, id: u32) -> String {
        if self.skip_special && self.tokenizer.is_special(id) {
            return String::new();
        }
        if let Some(bytes) = self.tokenizer.token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` bytes are valid UTF-8 by the error's contract.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes: the same single U+FFFD from_utf8_lossy would emit.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }

    /// Ends the stream: whatever incomplete character is left becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
