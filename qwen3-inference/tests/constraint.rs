//! Structured output on the real Qwen3 vocabulary: random logits are the ideal adversary (left
//! alone they never write JSON), so every answer that ends must parse and match its schema, and
//! the whitespace between tokens is bounded so that they do end.

use qwen3_export::hf::tokenizer_json::export_tokenizer;
use qwen3_inference::constraint::{Grammar, Vocabulary};
use qwen3_inference::testing::lcg;
use qwen3_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

const VOCAB: usize = 151_936;
const IM_END: u32 = 151_645;

/// The real Qwen3 tokenizer (exported from fixtures/tokenizer under a name of the test's own) and
/// its vocabulary for the grammar engine.
fn vocabulary(test: &str) -> (Arc<Tokenizer>, Vocabulary) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!(
        "pq-constraint-{}-{test}.tokenizer.bin",
        std::process::id()
    ));
    export_tokenizer(&repo.join("fixtures/tokenizer"), &out, VOCAB as u32).unwrap();
    let tok = Arc::new(Tokenizer::open(&out).unwrap());
    std::fs::remove_file(&out).unwrap();
    let vocab = Vocabulary::new(tok.clone(), VOCAB, IM_END).unwrap();
    (tok, vocab)
}

/// Samples up to `limit` tokens from random logits under `grammar`; the text, and whether it
/// ended with the end-of-sequence id.
fn sample(
    tok: &Tokenizer,
    vocab: &Vocabulary,
    grammar: &Grammar,
    seed: u64,
    limit: usize,
) -> (String, bool) {
    let mut c = vocab.constraint(grammar).unwrap();
    let mut s = seed;
    let mut ids = Vec::new();
    let mut logits = vec![0f32; VOCAB];
    for _ in 0..limit {
        logits.iter_mut().for_each(|l| *l = 4.0 * lcg(&mut s));
        c.mask(&mut logits).unwrap();
        let (best, _) = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &l)| if l > b.1 { (i, l) } else { b },
            );
        let id = best as u32;
        assert!(logits[best].is_finite(), "the mask allowed nothing");
        if id == IM_END {
            return (tok.decode(&ids, false).unwrap(), true);
        }
        c.advance(id).unwrap();
        ids.push(id);
    }
    (tok.decode(&ids, false).unwrap(), false)
}

#[test]
fn random_logits_under_a_schema_write_valid_json() {
    let (tok, vocab) = vocabulary("schema");
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": false
    });
    let grammar = Grammar::JsonSchema(schema);
    let mut ended = 0;
    for seed in 0..8 {
        let (text, done) = sample(&tok, &vocab, &grammar, seed, 400);
        if !done {
            continue;
        }
        ended += 1;
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = v.as_object().unwrap();
        assert!(
            o.keys()
                .all(|k| ["name", "age", "tags", "ok"].contains(&k.as_str())),
            "{text}"
        );
        assert!(o["name"].as_str().unwrap().chars().count() <= 12, "{text}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
        assert!(o["ok"].is_boolean(), "{text}");
        if let Some(t) = o.get("tags") {
            let t = t.as_array().unwrap();
            assert!(
                t.len() <= 3 && t.iter().all(|x| x == "red" || x == "green"),
                "{text}"
            );
        }
    }
    assert!(
        ended >= 7,
        "only {ended} of 8 answers ended within 400 tokens"
    );
}

#[test]
fn json_object_mode_and_regex() {
    let (tok, vocab) = vocabulary("object");
    let (text, done) = sample(&tok, &vocab, &Grammar::JsonObject, 3, 400);
    if done {
        assert!(
            serde_json::from_str::<Value>(&text).unwrap().is_object(),
            "{text}"
        );
    }
    let rx = Grammar::Regex("[0-9]{3}-[a-z]{2}".into());
    let (text, done) = sample(&tok, &vocab, &rx, 5, 50);
    assert!(done, "{text}");
    let b = text.as_bytes();
    assert!(
        b.len() == 6 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-',
        "{text}"
    );
}

#[test]
fn a_schema_that_does_not_compile_is_an_error() {
    let (_, vocab) = vocabulary("bad");
    let bad =
        Grammar::JsonSchema(json!({"type": "object", "properties": {"x": {"type": "nonsense"}}}));
    let err = vocab.constraint(&bad).err().expect("an invalid schema");
    assert!(!format!("{err:#}").is_empty());
}
