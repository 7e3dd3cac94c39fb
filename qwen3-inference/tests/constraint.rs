//! Structured output on the real Qwen3 vocabulary: random logits are the ideal adversary (left
//! alone they never write JSON), so every answer that ends must parse and match its schema, and
//! the whitespace between tokens is bounded so that they do end.

use qwen3_export::hf::tokenizer_json::export_tokenizer;
use qwen3_inference::constraint::{Constraint, Grammar, Reasoning, Start, Vocabulary};
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
    let mut c = vocab.constraint(grammar, Start::NOW).unwrap();
    let mut s = seed;
    let mut ids = Vec::new();
    let mut logits = vec![0f32; VOCAB];
    for _ in 0..limit {
        logits.iter_mut().for_each(|l| *l = 4.0 * lcg(&mut s));
        c.mask(&mut logits, &[IM_END]).unwrap();
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
    let err = vocab
        .constraint(&bad, Start::NOW)
        .expect_err("an invalid schema");
    assert!(!format!("{err:#}").is_empty());
}

#[test]
fn forced_tokens_are_the_grammar_s_only_way_on() {
    let (tok, vocab) = vocabulary("forced");
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}},
                        "required": ["name"], "additionalProperties": false});
    let mut c = vocab
        .constraint(&Grammar::JsonSchema(schema), Start::NOW)
        .unwrap();
    // The key is forced; llguidance stops where the next token could merge with what the model
    // writes (` "` may be part of a longer token).
    let ff = c.forced(100);
    assert_eq!(tok.decode(&ff, false).unwrap(), "{\"name\":");
    // At most `max`, and the grammar is past exactly those.
    let mut c = vocab
        .constraint(&Grammar::Regex("abc".into()), Start::NOW)
        .unwrap();
    let one = c.forced(1);
    assert_eq!(one.len(), 1);
    let rest = c.forced(100);
    assert_eq!(tok.decode(&[one, rest].concat(), false).unwrap(), "abc");
    assert!(c.is_done());
}

#[test]
fn reasoning_and_a_lazy_start_stay_free_until_their_token() {
    let (tok, vocab) = vocabulary("start");
    let id = |t: &str| vocab.token_id(t).unwrap();
    let (open, close, call) = (id("<think>"), id("</think>"), id("<tool_call>"));
    let grammar = Grammar::Regex("[0-9]+".into());
    let may_reason = Start {
        reasoning: Reasoning::MayOpen { open, close },
        trigger: None,
    };
    // The finite logits after masking (the stop id counts).
    let allowed = |c: &mut Constraint| {
        let mut l = vec![0f32; VOCAB];
        c.mask(&mut l, &[IM_END]).unwrap();
        l.iter().filter(|x| x.is_finite()).count()
    };
    // May reason: the first token is a digit or `<think>`.
    let mut c = vocab.constraint(&grammar, may_reason).unwrap();
    let mut l = vec![0f32; VOCAB];
    c.mask(&mut l, &[IM_END]).unwrap();
    assert!(l[open as usize].is_finite());
    assert!(!l[tok.encode("hello")[0] as usize].is_finite());
    assert!(!l[IM_END as usize].is_finite(), "an empty answer");
    c.advance(open).unwrap();
    // Inside the reasoning: anything but the end (a reasoning is not an answer), until
    // `</think>`; a `<tool_call>` in it opens nothing.
    assert_eq!(allowed(&mut c), VOCAB - 1);
    assert!(!c.allows(IM_END, &[IM_END]));
    for t in tok.encode("some free thought <tool_call>") {
        c.advance(t).unwrap();
    }
    c.advance(close).unwrap();
    let n = allowed(&mut c);
    assert!(n > 1 && n < 1000, "{n} tokens allowed after </think>");
    // Without `<think>` first, the grammar applies from the first token.
    let mut c = vocab.constraint(&grammar, may_reason).unwrap();
    c.advance(tok.encode("7")[0]).unwrap();
    assert!(c.advance(open).is_err(), "<think> after the answer began");
    // A lazy start: free (and free to end) until the trigger, after the reasoning.
    let lazy = Start {
        trigger: Some(call),
        ..may_reason
    };
    let mut c = vocab.constraint(&grammar, lazy).unwrap();
    assert_eq!(allowed(&mut c), VOCAB);
    c.advance(open).unwrap();
    c.advance(call).unwrap();
    assert_eq!(allowed(&mut c), VOCAB - 1, "still reasoning");
    c.advance(close).unwrap();
    assert_eq!(allowed(&mut c), VOCAB);
    c.advance(call).unwrap();
    assert!(allowed(&mut c) < 1000);
}

/// Every stop id of the request ends the answer exactly when the grammar may end; the grammar
/// engine's own end id only if it is one of them.
#[test]
fn the_stop_ids_end_a_complete_answer_only() {
    let (tok, vocab) = vocabulary("stops");
    const END_OF_TEXT: u32 = 151_643;
    let stops = [END_OF_TEXT, IM_END];
    let mut c = vocab
        .constraint(&Grammar::Regex("ab?".into()), Start::NOW)
        .unwrap();
    let finite = |c: &mut Constraint, stop_ids: &[u32]| {
        let mut l = vec![1f32; VOCAB];
        c.mask(&mut l, stop_ids).unwrap();
        (
            l[END_OF_TEXT as usize].is_finite(),
            l[IM_END as usize].is_finite(),
        )
    };
    assert_eq!(finite(&mut c, &stops), (false, false));
    c.advance(tok.encode("a")[0]).unwrap();
    // "a" may end or go on with "b".
    assert_eq!(finite(&mut c, &stops), (true, true));
    assert!(c.allows(END_OF_TEXT, &stops) && c.allows(IM_END, &stops));
    // A completion whose only stop id is <|endoftext|>: <|im_end|> (the engine's end id here)
    // is not an end for it.
    assert_eq!(finite(&mut c, &[END_OF_TEXT]), (true, false));
    assert!(!c.allows(IM_END, &[END_OF_TEXT]));
    // With no stop id at all, a complete answer cannot end: an error, not an endless answer.
    c.advance(tok.encode("b")[0]).unwrap();
    let mut l = vec![1f32; VOCAB];
    assert!(c.mask(&mut l, &[]).is_err());
}
