//! tokenizer.json (+ tokenizer_config.json) -> the pico-qwen tokenizer file.
//!
//! HuggingFace `tokenizers` describes a tokenizer as a pipeline (normalizer, pre-tokenizer, model,
//! post-processor, decoder). We implement one pipeline exactly -- the byte-level BPE of
//! Qwen2/Qwen3: NFC (or no) normalizer, the Qwen2 split regex followed by ByteLevel, a BPE model
//! without unknown token, dropout or subword prefixes, a ByteLevel decoder -- and refuse any
//! tokenizer.json that differs, naming the part we do not implement, rather than encode
//! approximately. The file layout is defined in `qwen3_inference::tokenizer::file`.

use anyhow::{bail, Context, Result};
use qwen3_inference::format::atomic::write_atomic;
use qwen3_inference::tokenizer::bpe::MergeTable;
use qwen3_inference::tokenizer::byte_level;
use qwen3_inference::tokenizer::file::{
    AddedToken, Normalizer, TokenizerData, NO_ID, QWEN2_SPLIT_PATTERN, QWEN35_SPLIT_PATTERN,
};
use qwen3_inference::tokenizer::SplitPattern;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Reads `hf_dir/tokenizer.json`, checks every id is below `vocab_size`, and writes the tokenizer
/// file to `out` atomically. Returns a one-line summary for the export log.
pub fn export_tokenizer(hf_dir: &Path, out: &Path, vocab_size: u32) -> Result<String> {
    let mut data = convert(hf_dir)?;
    data.model_vocab = vocab_size;
    if data.len() as u64 > vocab_size as u64 {
        bail!(
            "{}: the tokenizer has {} tokens but the model's vocab_size is {vocab_size}",
            hf_dir.join("tokenizer.json").display(),
            data.len()
        );
    }
    write_atomic(out, &data.to_bytes())?;
    let mut note = format!(
        "tokenizer: {} tokens ({} added), {} merges, normalizer {}, bos {}, eos {}",
        data.len(),
        data.added.len(),
        data.merges.len(),
        data.normalizer.name(),
        data.bos_id.map_or("none".into(), |i| i.to_string()),
        data.eos_id.map_or("none".into(), |i| i.to_string()),
    );
    if !data.prefix.is_empty() || !data.suffix.is_empty() {
        note += &format!(
            ", a text's ids framed by {:?} and {:?}",
            data.prefix, data.suffix
        );
    }
    Ok(note)
}

/// Parses `hf_dir/tokenizer.json` and `hf_dir/tokenizer_config.json` (optional) into the data
/// of a tokenizer file.
pub fn convert(hf_dir: &Path) -> Result<TokenizerData> {
    let path = hf_dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: malformed JSON", path.display()))?;
    let config_path = hf_dir.join("tokenizer_config.json");
    let config: Option<Value> = if config_path.exists() {
        let t = std::fs::read_to_string(&config_path)
            .with_context(|| format!("{}: cannot read", config_path.display()))?;
        Some(
            serde_json::from_str(&t)
                .with_context(|| format!("{}: malformed JSON", config_path.display()))?,
        )
    } else {
        None
    };
    let own = config.as_ref().and_then(class_pipeline);
    let mut data = from_json(&json, own).with_context(|| format!("{}", path.display()))?;
    if let Some(config) = &config {
        let (bos, eos) =
            special_ids(config, &data).with_context(|| format!("{}", config_path.display()))?;
        data.bos_id = bos;
        data.eos_id = eos;
    }
    Ok(data)
}

/// The normalizer and split pattern that tokenizer_config.json's `tokenizer_class` builds itself,
/// ignoring tokenizer.json's: `Qwen3_5Tokenizer` (transformers 5's `tokenization_qwen3_5.py`:
/// NFC, then its `PRETOKENIZE_REGEX`, which is `QWEN35_SPLIT_PATTERN`). `None` for the classes
/// that take tokenizer.json's pipeline as it is (Qwen2's).
fn class_pipeline(config: &Value) -> Option<(Normalizer, SplitPattern)> {
    match config.get("tokenizer_class").and_then(Value::as_str) {
        Some("Qwen3_5Tokenizer") => Some((Normalizer::Nfc, SplitPattern::Qwen35)),
        _ => None,
    }
}

/// `x` as a JSON string, or an error naming `what`.
fn str_of<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str()
        .with_context(|| format!("{what} is not a string: {v}"))
}

/// A field that must be absent, null, `false` or empty for us to implement the tokenizer.
fn must_be_off(obj: &Value, key: &str, part: &str) -> Result<()> {
    match obj.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(v) => bail!("{part} has {key} = {v}, which pico-qwen does not implement"),
    }
}

/// The tokenizer of tokenizer.json `json`; `own_pipeline` is the normalizer and split pattern of
/// a tokenizer class that builds its own ([`class_pipeline`]).
fn from_json(
    json: &Value,
    own_pipeline: Option<(Normalizer, SplitPattern)>,
) -> Result<TokenizerData> {
    // The model: byte-level BPE.
    let model = json.get("model").context("no \"model\"")?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "BPE" {
        bail!("model type {kind:?} is not supported: only byte-level BPE is implemented");
    }
    for key in [
        "dropout",
        "unk_token",
        "continuing_subword_prefix",
        "end_of_word_suffix",
        "byte_fallback",
        "ignore_merges",
    ] {
        must_be_off(model, key, "the BPE model")?;
    }

    // The normalizer and pre-tokenizer: tokenizer.json's, unless the tokenizer class builds its
    // own (transformers 5's `Qwen3_5Tokenizer` sets NFC and Qwen3.5's split regex whatever the
    // file says, and keeps only its vocabulary and merges).
    let (normalizer, split_pattern) = match own_pipeline {
        Some(pipeline) => pipeline,
        None => {
            let normalizer = match json.get("normalizer") {
                None | Some(Value::Null) => Normalizer::None,
                Some(n) if n.get("type").and_then(Value::as_str) == Some("NFC") => Normalizer::Nfc,
                Some(n) => {
                    bail!("normalizer {n} is not supported (pico-qwen implements NFC or none)")
                }
            };
            let split = check_pre_tokenizer(json.get("pre_tokenizer").unwrap_or(&Value::Null))?;
            (normalizer, split)
        }
    };
    check_byte_level(
        json.get("decoder").unwrap_or(&Value::Null),
        "decoder",
        false,
    )?;
    // The post-processor: Qwen's ByteLevel only adjusts offsets; a TemplateProcessing (alone or
    // in a Sequence) adds tokens around a text's ids, as DeepSeek-R1-Distill-Qwen's BOS. Read
    // after the vocabulary, whose ids it names.
    let post_processor = json.get("post_processor").unwrap_or(&Value::Null);

    // The vocabulary: byte-level strings -> ids. Undo the byte-level mapping.
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .context("model.vocab is not an object")?;
    let mut tokens: Vec<Option<Vec<u8>>> = Vec::new();
    let mut id_of: HashMap<&str, u32> = HashMap::with_capacity(vocab.len());
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| i < u32::MAX as u64)
            .with_context(|| format!("vocab token {text:?} has a bad id {id}"))?
            as u32;
        let bytes = byte_level::decode_str(text).with_context(|| {
            format!("vocab token {text:?} is not in the byte-level alphabet: not byte-level BPE")
        })?;
        let slot = id as usize;
        if slot >= tokens.len() {
            if slot > 10_000_000 {
                bail!("vocab id {id} is implausibly large");
            }
            tokens.resize(slot + 1, None);
        }
        if tokens[slot].is_some() {
            bail!("vocab id {id} is used twice");
        }
        tokens[slot] = Some(bytes);
        id_of.insert(text.as_str(), id);
    }

    let mut byte_ids = [NO_ID; 256];
    for (b, slot) in byte_ids.iter_mut().enumerate() {
        let c = byte_level::byte_to_char(b as u8).to_string();
        if let Some(&id) = id_of.get(c.as_str()) {
            *slot = id;
        }
    }

    // Merges, in rank order; either ["a", "b"] pairs or "a b" strings (older files).
    let merges_json = model
        .get("merges")
        .and_then(Value::as_array)
        .context("model.merges is not a list")?;
    let mut merges = Vec::with_capacity(merges_json.len());
    for (rank, m) in merges_json.iter().enumerate() {
        let (a, b) = match m {
            Value::Array(p) if p.len() == 2 => {
                (str_of(&p[0], "merge part")?, str_of(&p[1], "merge part")?)
            }
            Value::String(s) => s
                .split_once(' ')
                .with_context(|| format!("merge {rank} {s:?} is not \"left right\""))?,
            other => bail!("merge {rank} is neither a pair nor a string: {other}"),
        };
        let look = |t: &str| {
            id_of
                .get(t)
                .copied()
                .with_context(|| format!("merge {rank} uses {t:?}, which is not in the vocab"))
        };
        let merged = format!("{a}{b}");
        merges.push([look(a)?, look(b)?, look(&merged)?]);
    }

    // Added tokens: matched before BPE; decoded like any token by the ByteLevel decoder, which
    // maps a token through the byte-level alphabet when every character is in it and takes its
    // UTF-8 bytes otherwise (HF `decoders/byte_level.rs`).
    let mut added = Vec::new();
    for t in json
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let content = str_of(
            t.get("content").unwrap_or(&Value::Null),
            "added token content",
        )?;
        let id = t
            .get("id")
            .and_then(Value::as_u64)
            .filter(|&i| i <= 10_000_000)
            .with_context(|| format!("added token {content:?} has a bad id"))?
            as u32;
        let flag = |k: &str, default: bool| t.get(k).and_then(Value::as_bool).unwrap_or(default);
        let special = flag("special", false);
        let token = AddedToken {
            id,
            content: content.to_owned(),
            special,
            single_word: flag("single_word", false),
            lstrip: flag("lstrip", false),
            rstrip: flag("rstrip", false),
            normalized: flag("normalized", !special),
        };
        let bytes = byte_level::decode_str(content).unwrap_or_else(|| content.as_bytes().to_vec());
        let slot = id as usize;
        if slot >= tokens.len() {
            tokens.resize(slot + 1, None);
        }
        // An added token may reuse a vocab id; HF then decodes it as the added content.
        tokens[slot] = Some(bytes);
        added.push(token);
    }

    let tokens: Vec<Vec<u8>> = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| t.with_context(|| format!("no token has id {id}: ids must be contiguous")))
        .collect::<Result<_>>()?;
    let (token_ends, blob) = TokenizerData::token_table(&tokens);
    let merges = MergeTable::from_ranked(tokens.len(), &merges);
    if blob.len() > u32::MAX as usize {
        bail!("the tokens take more than 4 GiB");
    }
    let (prefix, suffix) = post_processor_ids(post_processor, tokens.len())?;
    Ok(TokenizerData {
        normalizer,
        split_pattern,
        bos_id: None,
        eos_id: None,
        model_vocab: u32::try_from(tokens.len())?,
        token_ends,
        blob,
        byte_ids,
        merges,
        added,
        prefix,
        suffix,
    })
}

/// The ids tokenizer.json's `post_processor` puts before and after the ids of one text (HF
/// `tokenizers`' `processors`): none for `ByteLevel` (it only trims offsets); for
/// `TemplateProcessing`, the special tokens of its `single` template before and after `$A`; a
/// `Sequence` applies its processors in order. Any other processor is refused.
fn post_processor_ids(p: &Value, n_tokens: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    let kind = p.get("type").and_then(Value::as_str);
    match kind {
        None if p.is_null() => {}
        Some("ByteLevel") => check_byte_level(p, "post_processor", false)?,
        Some("Sequence") => {
            let list = p.get("processors").and_then(Value::as_array);
            for q in list.context("post_processor Sequence without processors")? {
                let (pre, suf) = post_processor_ids(q, n_tokens)?;
                // A later processor wraps what the earlier ones made.
                prefix = [pre, prefix].concat();
                suffix.extend(suf);
            }
        }
        Some("TemplateProcessing") => {
            let single = p.get("single").and_then(Value::as_array);
            let single = single.context("TemplateProcessing without a single template")?;
            let specials = p.get("special_tokens").unwrap_or(&Value::Null);
            let mut seen_text = false;
            for piece in single {
                if let Some(seq) = piece.get("Sequence") {
                    if seq.get("id").and_then(Value::as_str) != Some("A") || seen_text {
                        bail!("post_processor: the single template must hold $A once: {p}");
                    }
                    seen_text = true;
                    continue;
                }
                let name = piece
                    .get("SpecialToken")
                    .and_then(|t| t.get("id"))
                    .and_then(Value::as_str)
                    .with_context(|| format!("post_processor: unknown template piece {piece}"))?;
                let ids = specials
                    .get(name)
                    .and_then(|t| t.get("ids"))
                    .and_then(Value::as_array)
                    .with_context(|| format!("post_processor: no ids for {name:?}"))?;
                for id in ids {
                    let id = id
                        .as_u64()
                        .filter(|&i| (i as usize) < n_tokens)
                        .with_context(|| format!("post_processor: {name:?} has a bad id {id}"))?;
                    if seen_text { &mut suffix } else { &mut prefix }.push(id as u32);
                }
            }
            if !seen_text {
                bail!("post_processor: the single template has no $A: {p}");
            }
        }
        _ => bail!("post_processor {p} is not supported: pico-qwen implements ByteLevel and TemplateProcessing"),
    }
    Ok((prefix, suffix))
}

/// The pre-tokenizer must be Qwen2's or Qwen3.5's: Sequence[Split(QWEN2_SPLIT_PATTERN or
/// QWEN35_SPLIT_PATTERN, Isolated), ByteLevel without prefix space or its own regex]. Returns
/// which.
fn check_pre_tokenizer(p: &Value) -> Result<SplitPattern> {
    let refuse = || {
        format!(
            "pre_tokenizer {p} is not supported: pico-qwen implements Sequence[Split(the Qwen2 \
             pattern, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]"
        )
    };
    let steps = match p.get("type").and_then(Value::as_str) {
        Some("Sequence") => p
            .get("pretokenizers")
            .and_then(Value::as_array)
            .with_context(refuse)?,
        _ => bail!(refuse()),
    };
    let [split, bl] = steps.as_slice() else {
        bail!(refuse())
    };
    let pattern = split
        .get("pattern")
        .and_then(|x| x.get("Regex"))
        .and_then(Value::as_str);
    if split.get("type").and_then(Value::as_str) != Some("Split")
        || split.get("behavior").and_then(Value::as_str) != Some("Isolated")
        || split.get("invert").and_then(Value::as_bool) != Some(false)
    {
        bail!(refuse());
    }
    let Some(found) = pattern.and_then(SplitPattern::from_regex) else {
        bail!(
            "pre_tokenizer split pattern {} is not one pico-qwen implements (Qwen2's \
             {QWEN2_SPLIT_PATTERN:?} or Qwen3.5's {QWEN35_SPLIT_PATTERN:?})",
            pattern.map_or("(missing)".into(), |s| format!("{s:?}"))
        );
    };
    check_byte_level(bl, "pre_tokenizer ByteLevel step", false)?;
    if bl.get("use_regex").and_then(Value::as_bool) != Some(false) {
        bail!(refuse());
    }
    Ok(found)
}

/// `v` must be a ByteLevel step without `add_prefix_space` (or null, when `null_ok`).
fn check_byte_level(v: &Value, part: &str, null_ok: bool) -> Result<()> {
    if v.is_null() && null_ok {
        return Ok(());
    }
    if v.get("type").and_then(Value::as_str) != Some("ByteLevel") {
        bail!("{part} {v} is not supported: pico-qwen implements ByteLevel only");
    }
    must_be_off(v, "add_prefix_space", part)
}

/// BOS and EOS ids from tokenizer_config.json's `bos_token` / `eos_token` (a string, or an
/// object with `content`, or null).
fn special_ids(config: &Value, data: &TokenizerData) -> Result<(Option<u32>, Option<u32>)> {
    let lookup = |key: &str| -> Result<Option<u32>> {
        let text = match config.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.as_str(),
            Some(v) => match v.get("content").and_then(Value::as_str) {
                Some(s) => s,
                None => bail!("{key} is neither a string nor an object with content: {v}"),
            },
        };
        if let Some(t) = data.added.iter().find(|t| t.content == text) {
            return Ok(Some(t.id));
        }
        let bytes = text.as_bytes();
        (0..data.len() as u32)
            .find(|&id| data.token(id) == Some(bytes))
            .map(Some)
            .with_context(|| format!("{key} {text:?} is not a token of tokenizer.json"))
    };
    Ok((lookup("bos_token")?, lookup("eos_token")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwen3_inference::tokenizer::{StreamDecoder, Tokenizer};
    use std::path::PathBuf;
    use std::sync::OnceLock;

    /// Post-processors: ByteLevel adds nothing; TemplateProcessing (alone or in a Sequence) gives
    /// the special tokens around `$A`; other kinds and malformed templates are refused.
    #[test]
    fn post_processor_framing() {
        let template = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}
        });
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
                                            "trim_offsets": false, "use_regex": false});
        assert_eq!(
            post_processor_ids(&Value::Null, 10).unwrap(),
            (vec![], vec![])
        );
        assert_eq!(
            post_processor_ids(&byte_level, 10).unwrap(),
            (vec![], vec![])
        );
        assert_eq!(
            post_processor_ids(&template, 10).unwrap(),
            (vec![7], vec![8])
        );
        let seq = serde_json::json!({"type": "Sequence", "processors": [byte_level, template]});
        assert_eq!(post_processor_ids(&seq, 10).unwrap(), (vec![7], vec![8]));
        assert!(
            post_processor_ids(&template, 8).is_err(),
            "id 8 outside 8 tokens"
        );
        let bert =
            serde_json::json!({"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]});
        let e = post_processor_ids(&bert, 10).unwrap_err().to_string();
        assert!(e.contains("not supported"), "{e}");
        let mut no_a = template.clone();
        no_a["single"].as_array_mut().unwrap().remove(1);
        assert!(post_processor_ids(&no_a, 10).is_err());
    }

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer")
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pq-tok-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The real Qwen3 tokenizer, exported to a file and loaded back (once per test binary).
    fn qwen3() -> &'static Tokenizer {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        TOK.get_or_init(|| {
            let dir = temp_dir("qwen3");
            let out = dir.join("m.tokenizer.bin");
            export_tokenizer(&fixtures(), &out, 151936).unwrap();
            let t = Tokenizer::open(&out).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            t
        })
    }

    fn load_cases(name: &str) -> Value {
        let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn ids_of(v: &Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> String {
        let mut d = StreamDecoder::new(tok).skip_special(skip);
        let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
        s.push_str(&d.finish());
        s
    }

    /// Every case: encode gives HF's ids; decode and the streaming decoder give HF's text.
    fn check_cases(file: &str) -> usize {
        let tok = qwen3();
        let cases = load_cases(file);
        let mut failures = Vec::new();
        let mut n = 0;
        for c in cases["cases"].as_array().unwrap() {
            n += 1;
            let text = c["text"].as_str().unwrap();
            let want = ids_of(&c["ids"]);
            let got = tok.encode(text);
            if got != want {
                failures.push(format!("{}: encode {text:?}: {got:?} != {want:?}", c["id"]));
            }
            for (key, skip) in [("decoded", false), ("decoded_skip_special", true)] {
                let want_text = c[key].as_str().unwrap();
                let got_text = tok.decode(&want, skip).unwrap();
                if got_text != want_text {
                    failures.push(format!("{}: {key}: {got_text:?} != {want_text:?}", c["id"]));
                }
                if stream(tok, &want, skip) != want_text {
                    failures.push(format!("{}: streamed {key} differs", c["id"]));
                }
            }
        }
        for c in cases["decode_cases"].as_array().unwrap() {
            n += 1;
            let ids = ids_of(&c["ids"]);
            for (key, skip) in [("decoded", false), ("decoded_skip_special", true)] {
                let want_text = c[key].as_str().unwrap();
                let got_text = tok.decode(&ids, skip).unwrap();
                if got_text != want_text {
                    failures.push(format!(
                        "{}: {key}: {got_text:?} != {want_text:?}",
                        c["name"]
                    ));
                }
                if stream(tok, &ids, skip) != want_text {
                    failures.push(format!("{}: streamed {key} differs", c["name"]));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        n
    }

    /// With `tokenizer_class: Qwen3_5Tokenizer` the export takes transformers 5's pipeline for
    /// that class (NFC and Qwen3.5's split regex, whatever tokenizer.json says), and encoding
    /// gives the ids `Qwen3_5Tokenizer` gives over the same vocabulary and merges
    /// (scripts/qwen3_5_tokenizer_cases.py): texts with combining marks, decomposed accents,
    /// scripts with vowel signs, variation selectors.
    #[test]
    fn qwen3_5_tokenizer_class_encodes_as_transformers() {
        let dir = temp_dir("qwen35");
        std::fs::copy(
            fixtures().join("tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"tokenizer_class": "Qwen3_5Tokenizer"}"#,
        )
        .unwrap();
        let out = dir.join("m.tokenizer.bin");
        export_tokenizer(&dir, &out, 151936).unwrap();
        let tok = Tokenizer::open(&out).unwrap();
        let cases = load_cases("qwen3_5-cases.json");
        let (mut n, mut differ) = (0, 0);
        for c in cases["cases"].as_array().unwrap() {
            let (text, want) = (c["text"].as_str().unwrap(), ids_of(&c["ids"]));
            assert_eq!(tok.encode(text), want, "{text:?}");
            // The test can fail: the Qwen3 tokenizer (Qwen2's pattern) cuts marks off.
            differ += usize::from(qwen3().encode(text) != want);
            n += 1;
        }
        assert!(
            n > 300 && differ > 10,
            "{n} cases, {differ} differ from Qwen3's ids"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hf_dev_cases_encode_and_decode_exactly() {
        assert_eq!(check_cases("tokenizer-cases-dev.json"), 163 + 23);
    }

    #[test]
    fn hf_extra_cases_encode_and_decode_exactly() {
        assert_eq!(check_cases("tokenizer-cases-extra.json"), 97 + 7);
    }

    /// Differential check against a large HF-computed random set, outside the test suite:
    /// `scripts/tokenizer_cases.py --random N > FILE`, then
    /// `PQ_TOKENIZER_CASES=FILE cargo test -p qwen3-export -- --ignored differential --nocapture`.
    #[test]
    #[ignore = "needs PQ_TOKENIZER_CASES, a case file from scripts/tokenizer_cases.py --random N"]
    fn differential_random_cases() {
        let path = std::env::var("PQ_TOKENIZER_CASES").expect("set PQ_TOKENIZER_CASES");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let tok = qwen3();
        let (mut total, mut enc_ok, mut dec_ok) = (0, 0, 0);
        for c in json["cases"].as_array().unwrap() {
            total += 1;
            let text = c["text"].as_str().unwrap();
            let want = ids_of(&c["ids"]);
            let got = tok.encode(text);
            if got == want {
                enc_ok += 1;
            } else if total - enc_ok <= 20 {
                println!("encode mismatch {text:?}: {got:?} != {want:?}");
            }
            let d = tok.decode(&want, false).unwrap() == c["decoded"].as_str().unwrap()
                && tok.decode(&want, true).unwrap() == c["decoded_skip_special"].as_str().unwrap()
                && stream(tok, &want, false) == c["decoded"].as_str().unwrap();
            dec_ok += d as usize;
        }
        println!("differential: {total} strings, encode agrees on {enc_ok}, decode on {dec_ok}");
        assert_eq!((enc_ok, dec_ok), (total, total));
    }

    /// The tiny test checkpoints (fixtures/models/, made by scripts/make_fixtures.py) carry their
    /// own small byte-level BPE tokenizer.json; their reference.json holds HF's decode of the
    /// greedy ids (some past the tokenizer, inside the 512-row embedding) and HF's ids of the
    /// prompt text (`tokenizer(text)`: with what the post-processor adds, a BOS for
    /// tiny-qwen2-bos-tokenizer).
    #[test]
    fn tiny_checkpoint_tokenizers_export_and_agree_with_hf() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models");
        let mut checked = 0;
        for entry in std::fs::read_dir(&models).unwrap() {
            let dir = entry.unwrap().path();
            let Ok(reference) = std::fs::read_to_string(dir.join("reference.json")) else {
                continue;
            };
            let reference: Value = serde_json::from_str(&reference).unwrap();
            let config: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                    .unwrap();
            // A vision-language checkpoint (Qwen3.5) keeps it in its text config.
            let text = config.get("text_config").unwrap_or(&config);
            let vocab = text["vocab_size"].as_u64().unwrap() as u32;
            let out = temp_dir("tiny").join("t.tokenizer.bin");
            export_tokenizer(&dir, &out, vocab).unwrap();
            let tok = Tokenizer::open(&out).unwrap();
            for c in reference["cases"].as_array().unwrap() {
                // An embedding model's reference: texts and HF's ids of them (the appended
                // <|endoftext|> included).
                if let Some(text) = c["text"].as_str() {
                    let want = ids_of(&c["ids"]);
                    assert_eq!(tok.encode_with_special_tokens(text), want, "{text:?}");
                    checked += 1;
                    continue;
                }
                let ids = ids_of(&c["greedy_ids"]);
                let want = c["greedy_text"].as_str().unwrap();
                assert_eq!(tok.decode(&ids, false).unwrap(), want, "{}", dir.display());
                assert_eq!(stream(&tok, &ids, false), want, "{}", dir.display());
                if let Some(text) = c["prompt_text"].as_str() {
                    let want = ids_of(&c["prompt_ids"]);
                    assert_eq!(tok.encode_with_special_tokens(text), want, "{text:?}");
                }
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked}");
    }

    #[test]
    fn file_holds_what_tokenizer_json_and_config_say() {
        let tok = qwen3();
        // tokenizer.json: 151643 vocab tokens + 26 added (151643..151668).
        assert_eq!(tok.len(), 151669);
        // tokenizer_config.json: eos_token "<|im_end|>" (151644 + 1), bos_token null.
        assert_eq!(tok.eos_id(), Some(151645));
        assert_eq!(tok.bos_id(), None);
        assert_eq!(tok.token_id("<think>"), Some(151667));
        assert!(tok.is_special(151643) && !tok.is_special(151667));
        // "Ġworld" is id 1879 in tokenizer.json's vocab.
        assert_eq!(tok.token_bytes(1879), Some(&b" world"[..]));
        assert_eq!(tok.token_id(" world"), Some(1879));
        // Ids past the tokenizer but inside the model's 151936-row embedding decode to nothing
        // (HF drops them); past the embedding they are an error.
        assert_eq!(tok.decode(&[151669, 151935], false).unwrap(), "");
        assert!(tok.decode(&[151936], false).is_err());
    }

    /// tokenizer.json with one field replaced, written to a temp dir, must be refused with an
    /// error naming tokenizer.json and the part.
    fn refused(edit: impl Fn(&mut Value), expect: &str) {
        let mut json = load_cases("tokenizer.json");
        edit(&mut json);
        let dir = temp_dir(expect.split_whitespace().next().unwrap());
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        let out = dir.join("m.tokenizer.bin");
        let err = format!("{:#}", export_tokenizer(&dir, &out, 151936).unwrap_err());
        assert!(
            err.contains("tokenizer.json") && err.contains(expect),
            "{err}"
        );
        assert!(!out.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unsupported_pipelines_are_refused() {
        refused(
            |j| j["normalizer"] = serde_json::json!({"type": "NFKC"}),
            "normalizer",
        );
        refused(|j| j["model"]["type"] = "WordPiece".into(), "model type");
        refused(
            |j| j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+".into(),
            "split pattern",
        );
        refused(
            |j| j["decoder"] = serde_json::json!({"type": "Metaspace"}),
            "decoder",
        );
        refused(
            |j| j["model"]["byte_fallback"] = true.into(),
            "byte_fallback",
        );
    }

    #[test]
    fn vocab_larger_than_the_model_is_refused() {
        let out = temp_dir("small").join("m.tokenizer.bin");
        let err = format!(
            "{:#}",
            export_tokenizer(&fixtures(), &out, 1000).unwrap_err()
        );
        assert!(err.contains("vocab_size is 1000"), "{err}");
    }
}
