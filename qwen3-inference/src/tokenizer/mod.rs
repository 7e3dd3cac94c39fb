//! Byte-level BPE tokenizer, exact to HuggingFace `tokenizers` on Qwen3's tokenizer.json.
//!
//! Encoding is a pipeline of five steps, each in its own module (docs/tokenizer.md tells the
//! story with real outputs):
//!
//! 1. [`added`]: added tokens (`<|im_start|>`, `<think>`, ...) are cut out of the raw text and
//!    become their single ids;
//! 2. [`Tokenizer::normalize`]: the text between them is normalized (Qwen3: Unicode NFC), so
//!    "é" typed as `e` + U+0301 and as U+00E9 encode the same;
//! 3. [`pretokenize`]: the Qwen2 split regex cuts the text into words, single digits, punctuation
//!    runs and whitespace runs; BPE never merges across these pieces;
//! 4. byte-level mapping: each piece is taken as UTF-8 bytes, each byte a starting token
//!    ([`byte_level`] is the alphabet tokenizer.json writes them in; the file stores raw bytes);
//! 5. [`bpe`]: adjacent tokens are merged by rank until no merge applies.
//!
//! Decoding concatenates the tokens' bytes and reads them as UTF-8, invalid bytes becoming
//! U+FFFD; [`StreamDecoder`] does the same one token at a time.

pub mod added;
pub mod bpe;
pub mod byte_level;
pub mod decode;
pub mod file;
pub mod pretokenize;
mod unicode_tables;

pub use decode::StreamDecoder;
pub use file::{AddedToken, Normalizer, TokenizerData};

use added::{Matcher, Segment};
use anyhow::{Context, Result};
use bpe::{IdPairHasher, MergeMap};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::path::Path;
use std::sync::OnceLock;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// A loaded tokenizer file, ready to encode and decode.
pub struct Tokenizer {
    data: TokenizerData,
    merges: MergeMap,
    /// Added tokens with `normalized: false`, matched in the raw text.
    raw_added: Matcher,
    /// Added tokens with `normalized: true`, matched (by their normalized content) in the
    /// normalized text between the raw matches.
    normalized_added: Matcher,
    /// Ids of the added tokens flagged special, sorted (skipped by `decode(.., true)`).
    special_ids: Vec<u32>,
    /// Token bytes -> id, built on the first `token_id` call that needs it (only tools use it).
    by_bytes: OnceLock<HashMap<Box<[u8]>, u32>>,
}

/// Pieces up to this many bytes are cached during one `encode` call; longer ones are rare and
/// rarely repeat.
const CACHE_MAX_PIECE: usize = 64;

impl Tokenizer {
    /// Reads and validates a tokenizer file (`<model>.tokenizer.bin`).
    pub fn open(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read tokenizer file", path.display()))?;
        let data = TokenizerData::from_bytes(&bytes)
            .with_context(|| format!("{}: invalid tokenizer file", path.display()))?;
        Ok(Tokenizer::from_data(data))
    }

    /// Builds the lookup tables over validated data.
    pub fn from_data(data: TokenizerData) -> Tokenizer {
        let merges = bpe::merge_map(&data.merges);
        let (norm, raw): (Vec<AddedToken>, Vec<AddedToken>) =
            data.added.iter().cloned().partition(|t| t.normalized);
        let raw_added = Matcher::new(raw.into_iter().map(|t| (t.content.clone(), t)).collect());
        let normalized_added = Matcher::new(
            norm.into_iter()
                .map(|t| (normalize(data.normalizer, &t.content).into_owned(), t))
                .collect(),
        );
        let mut special_ids: Vec<u32> = data
            .added
            .iter()
            .filter(|t| t.special)
            .map(|t| t.id)
            .collect();
        special_ids.sort_unstable();
        Tokenizer {
            data,
            merges,
            raw_added,
            normalized_added,
            special_ids,
            by_bytes: OnceLock::new(),
        }
    }

    /// Number of tokens; ids are `0..len()`.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.data.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.data.eos_id
    }

    /// The bytes token `id` decodes to, or `None` if there is no such token.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.data.token(id)
    }

    /// Whether `id` is an added token flagged special (`<|im_end|>` is; `<think>` is not).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }

    /// The added tokens, as tokenizer.json lists them.
    pub fn added_tokens(&self) -> &[AddedToken] {
        &self.data.added
    }

    /// The id of the token whose text is exactly `piece`: an added token's content
    /// (`"<think>"`), or a vocabulary token's text as raw text (`" world"`, which tokenizer.json
    /// writes in the byte-level alphabet as `"Ġworld"`).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        if let Some(t) = self.data.added.iter().find(|t| t.content == piece) {
            return Some(t.id);
        }
        let map = self.by_bytes.get_or_init(|| {
            let mut m = HashMap::with_capacity(self.len());
            for id in (0..self.len() as u32).rev() {
                m.insert(self.data.token(id).unwrap_or_default().into(), id);
            }
            m
        });
        map.get(piece.as_bytes()).copied()
    }

    /// Step 2: the normalizer of tokenizer.json applied to a piece of text.
    pub fn normalize<'a>(&self, text: &'a str) -> Cow<'a, str> {
        normalize(self.data.normalizer, text)
    }

    /// Encodes `text` into token ids, exactly as HF `Tokenizer.encode(text).ids` does (Qwen3's
    /// tokenizer.json adds no BOS/EOS; a post-processor that would is refused at export).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut cache = PieceCache::default();
        // 1. added tokens matched in the raw text
        let mut segments = Vec::new();
        self.raw_added.split(text, &mut segments);
        for seg in segments {
            let chunk = match seg {
                Segment::Token(id) => {
                    out.push(id);
                    continue;
                }
                Segment::Text(t) => t,
            };
            // 2. normalization, then added tokens matched in the normalized text
            let normalized = self.normalize(chunk);
            if self.normalized_added.is_empty() {
                self.encode_normalized(&normalized, &mut cache, &mut out);
                continue;
            }
            let mut inner = Vec::new();
            self.normalized_added.split(&normalized, &mut inner);
            for seg in inner {
                match seg {
                    Segment::Token(id) => out.push(id),
                    Segment::Text(t) => self.encode_normalized(t, &mut cache, &mut out),
                }
            }
        }
        out
    }

    /// Steps 3-5 on normalized text free of added tokens.
    fn encode_normalized(&self, text: &str, cache: &mut PieceCache, out: &mut Vec<u32>) {
        for piece in pretokenize::split(text) {
            let bytes = piece.as_bytes();
            if bytes.len() == 1 {
                // A one-byte piece is its byte's token (no merge can apply).
                let id = self.data.byte_ids[bytes[0] as usize];
                if id != file::NO_ID {
                    out.push(id);
                }
                continue;
            }
            if bytes.len() > CACHE_MAX_PIECE {
                bpe::encode_piece(bytes, &self.data.byte_ids, &self.merges, out);
                continue;
            }
            if let Some(&(start, len)) = cache.get(bytes) {
                out.extend_from_within(start as usize..(start + len) as usize);
                continue;
            }
            let start = out.len();
            bpe::encode_piece(bytes, &self.data.byte_ids, &self.merges, out);
            cache.insert(bytes.into(), (start as u32, (out.len() - start) as u32));
        }
    }

    /// The model's vocab_size: ids `len()..model_vocab()` are embedding rows without a token.
    pub fn model_vocab(&self) -> u32 {
        self.data.model_vocab
    }

    /// Decodes ids to text like HF `Tokenizer.decode(ids, skip_special_tokens)`: the tokens'
    /// bytes, concatenated, read as UTF-8 with each invalid sequence replaced by U+FFFD.
    ///
    /// Ids in `len()..model_vocab()` (the padding rows of Qwen3's embedding, 151669..151935)
    /// decode to nothing, as in HF; an id at or past `model_vocab()` is an error, since no model
    /// that goes with this tokenizer can produce it.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            if id >= self.data.model_vocab {
                anyhow::bail!(
                    "token id {id} is out of range: the model's vocabulary has {} ids",
                    self.data.model_vocab
                );
            }
            bytes.extend_from_slice(self.token_bytes(id).unwrap_or_default());
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Piece bytes -> (start, len) of its ids in the output of the current `encode` call.
type PieceCache = HashMap<Box<[u8]>, (u32, u32), BuildHasherDefault<IdPairHasher>>;

fn normalize(normalizer: Normalizer, text: &str) -> Cow<'_, str> {
    match normalizer {
        Normalizer::None => Cow::Borrowed(text),
        // Most text is already NFC; the quick check avoids rebuilding it.
        Normalizer::Nfc => match is_nfc_quick(text.chars()) {
            IsNormalized::Yes => Cow::Borrowed(text),
            _ => Cow::Owned(text.nfc().collect()),
        },
    }
}
