//! A GGUF file's tokenizer as the tokenizer file's data ([`TokenizerData`]): the vocabulary,
//! merges and special tokens llama.cpp's `convert_hf_to_gguf.py` copied from tokenizer.json,
//! read back into what `qwen3 export` builds from tokenizer.json itself, so a GGUF's text is
//! split and merged exactly as HuggingFace's tokenizer does.
//!
//! What the converter writes (its `get_vocab_base`, gguf-py's `TokenType`), and what it becomes:
//!
//! ```text
//! tokenizer.ggml.model           "gpt2": byte-level BPE, the only kind read here
//! tokenizer.ggml.pre             "qwen2" or "qwen35": the split regex (and NFC, below)
//! tokenizer.ggml.tokens[id]      NORMAL (1): the vocab's byte-level string, bytes undone
//!   with token_type[id]          CONTROL (3): an added token HF marks special ("<|im_end|>"),
//!                                or one that looks it ("<|fim_prefix|>": QWEN_NOT_SPECIAL)
//!                                USER_DEFINED (4): an added token HF does not ("<think>")
//!                                UNUSED (5): "[PAD{id}]", an embedding row with no token
//! tokenizer.ggml.merges[rank]    "left right", byte-level strings, in rank order
//! tokenizer.ggml.eos_token_id    the eos id (tokenizer_config.json's eos_token)
//! tokenizer.ggml.add_bos_token   whether a text starts with bos_token_id (false for Qwen)
//! ```
//!
//! Two things tokenizer.json says that a GGUF does not, taken from what every Qwen tokenizer
//! says: the normalizer (NFC: Qwen2's tokenizer.json and transformers' `Qwen3_5Tokenizer`) and
//! the added tokens' matching flags (none: no `lstrip`, `rstrip`, `single_word`, and
//! `normalized: false`, as Qwen's tokenizer.json writes every added token).

use super::{GgufHeader, Value};
use crate::chat::template_file::TemplateFile;
use crate::tokenizer::bpe::{MergeTable, NO_ID};
use crate::tokenizer::byte_level;
use crate::tokenizer::file::{AddedToken, Normalizer, TokenizerData};
use crate::tokenizer::SplitPattern;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;

/// Qwen's added tokens that HF marks not special although they look it: llama.cpp's converter
/// makes every `<|...|>` token CONTROL (`does_token_look_special`), so the type cannot tell.
/// Qwen2.5's and Qwen3's tokenizer.json: the fill-in-the-middle and repository tokens.
const QWEN_NOT_SPECIAL: [&str; 6] = [
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// gguf-py's `TokenType` values this reader meets in a byte-level BPE vocabulary.
const NORMAL: u64 = 1;
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;
const UNUSED: u64 = 5;

/// The tokenizer of GGUF header `h`, for a model of `model_vocab` embedding rows.
pub fn tokenizer_data(h: &GgufHeader, model_vocab: u32) -> Result<TokenizerData> {
    // 1. The kind of tokenizer and its pre-tokenizer.
    let model = str_key(h, "tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!("tokenizer.ggml.model {model:?}: the tokenizer read is gpt2 (byte-level BPE)");
    }
    let pre = str_key(h, "tokenizer.ggml.pre")?;
    let split_pattern = match pre {
        "qwen2" => SplitPattern::Qwen2,
        "qwen35" => SplitPattern::Qwen35,
        p => bail!("tokenizer.ggml.pre {p:?}: the pre-tokenizers read are qwen2 and qwen35"),
    };

    // 2. The tokens: each id's bytes, and the added tokens among them.
    let texts = array_key(h, "tokenizer.ggml.tokens")?;
    let types = match h.get("tokenizer.ggml.token_type") {
        None => None,
        Some(Value::Array(a)) if a.len() == texts.len() => Some(a),
        Some(_) => bail!("tokenizer.ggml.token_type is not an array of one type a token"),
    };
    let mut tokens: Vec<Vec<u8>> = Vec::with_capacity(texts.len());
    let mut added = Vec::new();
    // The vocabulary's byte-level strings, for the merges and the single-byte tokens.
    let mut id_of: HashMap<&str, u32> = HashMap::with_capacity(texts.len());
    for (id, text) in texts.iter().enumerate() {
        let text = text
            .as_str()
            .with_context(|| format!("tokenizer.ggml.tokens[{id}] is not a string"))?;
        let kind = match types {
            Some(t) => t[id]
                .as_u64()
                .with_context(|| format!("tokenizer.ggml.token_type[{id}] is not an integer"))?,
            None => NORMAL,
        };
        let id32 = u32::try_from(id).context("too many tokens")?;
        match kind {
            NORMAL => {
                let bytes = byte_level::decode_str(text).with_context(|| {
                    format!("token {id} {text:?} is not in the byte-level alphabet")
                })?;
                tokens.push(bytes);
                id_of.insert(text, id32);
            }
            CONTROL | USER_DEFINED => {
                // Decoded as the ByteLevel decoder decodes an added token: through the
                // alphabet when every character is in it, as UTF-8 otherwise (as the exporter).
                tokens
                    .push(byte_level::decode_str(text).unwrap_or_else(|| text.as_bytes().to_vec()));
                added.push(AddedToken {
                    id: id32,
                    content: text.to_owned(),
                    special: kind == CONTROL && !QWEN_NOT_SPECIAL.contains(&text),
                    single_word: false,
                    lstrip: false,
                    rstrip: false,
                    normalized: false,
                });
            }
            // Padding rows: the tokenizer ends at the first one, and nothing but padding may
            // follow it (a token id must be below the token count).
            UNUSED => break,
            k => bail!(
                "token {id} {text:?} has type {k}: a byte-level vocabulary has normal, control, \
                 user-defined and unused tokens"
            ),
        }
    }
    let n = tokens.len();
    if let Some(t) = types {
        if let Some(id) = (n..t.len()).find(|&i| t[i].as_u64() != Some(UNUSED)) {
            bail!("token {id} follows an unused (padding) token: ids must be contiguous");
        }
    }
    if texts.len() > model_vocab as usize {
        bail!(
            "{} tokens, but the embedding has {model_vocab} rows",
            texts.len()
        );
    }

    // 3. The single-byte tokens and the merges, by their byte-level strings.
    let mut byte_ids = [NO_ID; 256];
    for (b, slot) in byte_ids.iter_mut().enumerate() {
        let c = byte_level::byte_to_char(b as u8).to_string();
        if let Some(&id) = id_of.get(c.as_str()) {
            *slot = id;
        }
    }
    let merge_texts = array_key(h, "tokenizer.ggml.merges")?;
    let mut merges = Vec::with_capacity(merge_texts.len());
    let mut merged = String::new();
    for (rank, m) in merge_texts.iter().enumerate() {
        let m = m
            .as_str()
            .with_context(|| format!("tokenizer.ggml.merges[{rank}] is not a string"))?;
        let (a, b) = m
            .split_once(' ')
            .with_context(|| format!("merge {rank} {m:?} is not \"left right\""))?;
        let look = |t: &str| {
            id_of
                .get(t)
                .copied()
                .with_context(|| format!("merge {rank} {m:?}: {t:?} is not a token"))
        };
        merged.clear();
        merged.push_str(a);
        merged.push_str(b);
        merges.push([look(a)?, look(b)?, look(&merged)?]);
    }

    // 4. Special ids: eos, and bos with what frames a text.
    let id_key = |k: &str| -> Result<Option<u32>> {
        match h.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64().filter(|&i| i < n as u64) {
                Some(i) => Ok(Some(i as u32)),
                None => bail!("{k}: {v:?} is not a token id below {n}"),
            },
        }
    };
    let flag = |k: &str| matches!(h.get(k), Some(Value::Bool(true)));
    let eos_id = id_key("tokenizer.ggml.eos_token_id")?;
    // tokenizer_config.json's bos_token is null for Qwen, though the converter writes the
    // config's bos_token_id: a bos is the tokenizer's only where a text starts with it.
    let bos_id = match flag("tokenizer.ggml.add_bos_token") {
        true => Some(id_key("tokenizer.ggml.bos_token_id")?.context(
            "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing",
        )?),
        false => None,
    };
    let suffix = match flag("tokenizer.ggml.add_eos_token") {
        true => vec![eos_id.context(
            "tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing",
        )?],
        false => Vec::new(),
    };

    let (token_ends, blob) = TokenizerData::token_table(&tokens);
    if blob.len() > u32::MAX as usize {
        bail!("the tokens take more than 4 GiB");
    }
    Ok(TokenizerData {
        normalizer: Normalizer::Nfc,
        split_pattern,
        bos_id,
        eos_id,
        model_vocab,
        token_ends,
        blob,
        byte_ids,
        merges: MergeTable::from_ranked(n, &merges),
        added,
        prefix: bos_id.into_iter().collect(),
        suffix,
    })
}

/// The chat template a GGUF file carries (`tokenizer.chat_template`: tokenizer_config.json's
/// `chat_template`, copied by the converter), if any.
pub fn chat_template(h: &GgufHeader) -> Option<&str> {
    h.get("tokenizer.chat_template").and_then(Value::as_str)
}

/// The GGUF's chat template as the template file `qwen3 export` writes beside a model file
/// (its [`chat_template`] and [`special_tokens`]), if it has one.
pub fn template_file(h: &GgufHeader) -> Option<TemplateFile> {
    let special = special_tokens(h)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    Some(TemplateFile::new(
        "GGUF tokenizer.chat_template".into(),
        chat_template(h)?.to_owned(),
        Default::default(),
        special,
    ))
}

/// The special tokens a chat template may name, as tokenizer_config.json sets them, from the
/// ids the GGUF carries: `eos_token` and `pad_token` (`<|im_end|>` and `<|endoftext|>` for an
/// instruct Qwen), and `bos_token` only where a text starts with it (tokenizer_config.json's
/// `bos_token` is null for Qwen).
pub fn special_tokens(h: &GgufHeader) -> Vec<(&'static str, String)> {
    let Some(Value::Array(tokens)) = h.get("tokenizer.ggml.tokens") else {
        return Vec::new();
    };
    let text = |k: &str| {
        let id = h.get(k)?.as_u64()?;
        tokens.get(usize::try_from(id).ok()?)?.as_str()
    };
    let add_bos = matches!(
        h.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    [
        ("bos_token", "tokenizer.ggml.bos_token_id", add_bos),
        ("eos_token", "tokenizer.ggml.eos_token_id", true),
        ("pad_token", "tokenizer.ggml.padding_token_id", true),
    ]
    .into_iter()
    .filter(|&(_, _, wanted)| wanted)
    .filter_map(|(name, key, _)| Some((name, text(key)?.to_owned())))
    .collect()
}

/// Metadata key `k`, which must be a string.
fn str_key<'h>(h: &'h GgufHeader, k: &str) -> Result<&'h str> {
    match h.get(k) {
        Some(Value::Str(s)) => Ok(s),
        Some(v) => bail!("{k}: {v:?} is not a string"),
        None => bail!("{k} is missing: the file has no tokenizer"),
    }
}

/// Metadata key `k`, which must be an array.
fn array_key<'h>(h: &'h GgufHeader, k: &str) -> Result<&'h [Value]> {
    match h.get(k) {
        Some(Value::Array(a)) => Ok(a),
        Some(v) => bail!("{k}: {v:?} is not an array"),
        None => bail!("{k} is missing: the file has no tokenizer"),
    }
}
