//! Structured output through the binary: `qwen3 generate` with `--json-schema` (inline or a
//! file), `--json-object`, `--grammar` (Lark) and `--regex`, sampled at temperature 1 from the
//! random-weight fixture (which left alone never writes JSON); and `qwen3 batch` lines with
//! `response_format`, as the server takes them. Answers are checked with an independent
//! validator (the `jsonschema` crate).

mod common;

use common::{binary_dir, fullvocab_model};
use serde_json::{json, Value};
use std::process::{Command, Output};

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

/// `qwen3 generate` on the fixture at temperature 1 with `seed`, at most `n` tokens; its
/// `--json` object.
fn generate(seed: u64, n: usize, extra: &[&str]) -> Value {
    let (seed, n) = (seed.to_string(), n.to_string());
    let mut args = vec![
        "generate",
        fullvocab_model(),
        "-i",
        "Answer:",
        "-t",
        "1",
        "-s",
        &seed,
        "-n",
        &n,
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = qwen3(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
        "score": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["name", "tags"], "additionalProperties": false})
}

fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    if let Err(e) = validator.validate(&v) {
        panic!("{e}: {text}");
    }
}

#[test]
fn generate_follows_a_schema_inline_or_from_a_file() {
    let schema = schema();
    let file = binary_dir().join("schema.json");
    std::fs::write(&file, schema.to_string()).unwrap();
    let inline = schema.to_string();
    for seed in 1..=4 {
        for arg in [inline.as_str(), file.to_str().unwrap()] {
            let r = generate(seed, 600, &["--json-schema", arg]);
            assert_eq!(r["stop"], "eos", "{r}");
            assert_valid(&schema, r["text"].as_str().unwrap());
        }
    }
    // With --chat and thinking off, the same.
    let r = generate(
        5,
        600,
        &["--chat", "--thinking", "off", "--json-schema", &inline],
    );
    assert_valid(&schema, r["text"].as_str().unwrap());
}

#[test]
fn generate_follows_a_lark_grammar_a_regex_and_json_mode() {
    let lark = binary_dir().join("answer.lark");
    std::fs::write(
        &lark,
        "start: (\"yes\" | \"no\") \", \" NUM\nNUM: /[0-9]{1,3}/\n",
    )
    .unwrap();
    for seed in 1..=4 {
        let r = generate(seed, 600, &["--grammar", lark.to_str().unwrap()]);
        let text = r["text"].as_str().unwrap().to_string();
        let (word, num) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        assert!(
            (1..=3).contains(&num.len()) && num.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
        let r = generate(seed, 600, &["--regex", "[A-Z]{2}-[0-9]{4}"]);
        let text = r["text"].as_str().unwrap();
        let b = text.as_bytes();
        assert!(
            b.len() == 7
                && b[..2].iter().all(u8::is_ascii_uppercase)
                && b[2] == b'-'
                && b[3..].iter().all(u8::is_ascii_digit),
            "{text:?}"
        );
        let r = generate(seed, 40, &["--json-object"]);
        let text = r["text"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if r["stop"] == "eos" {
            assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
        }
    }
}

#[test]
fn bad_grammars_and_combinations_are_one_line_errors() {
    let m = fullvocab_model();
    for (args, says) in [
        (
            vec![
                "generate",
                m,
                "-i",
                "x",
                "--json-schema",
                "{\"type\": \"nonsense\"}",
            ],
            "nonsense",
        ),
        (
            vec!["generate", m, "-i", "x", "--json-schema", "{\"type\":"],
            "neither a file nor a JSON Schema",
        ),
        (
            vec!["generate", m, "-i", "x", "--grammar", "/no/such.lark"],
            "--grammar /no/such.lark",
        ),
        (
            vec!["generate", m, "-i", "x", "--regex", "a", "--json-object"],
            "give one of",
        ),
        (
            vec!["generate", m, "--prompt-ids", "[1, 2]", "--json-object"],
            "need a text prompt",
        ),
        (
            vec!["generate", m, "-i", "x", "--grammar", "/dev/null"],
            "grammar",
        ),
    ] {
        let o = qwen3(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `qwen3 batch`: a line with `response_format` is answered as the server answers it; a schema
/// that does not compile is that line's 400.
#[test]
fn batch_lines_take_response_format() {
    let schema = schema();
    let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let mut lines: Vec<String> = (0..4)
        .map(|i| {
            json!({"custom_id": format!("s{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": {"messages": [{"role": "user", "content": "JSON please"}],
                            "chat_template_kwargs": {"enable_thinking": false},
                            "response_format": format, "temperature": 1.0, "seed": i,
                            "max_tokens": 600}})
            .to_string()
        })
        .collect();
    lines.push(
        json!({"custom_id": "bad", "method": "POST", "url": "/v1/completions",
               "body": {"prompt": "x", "response_format":
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}}})
        .to_string(),
    );
    let input = binary_dir().join("structured-in.jsonl");
    let output = binary_dir().join("structured-out.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let o = qwen3(&[
        "batch",
        fullvocab_model(),
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--parallel",
        "4",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = std::fs::read_to_string(&output).unwrap();
    let mut seen = 0;
    for line in out.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let resp = &r["response"];
        if r["custom_id"] == "bad" {
            assert_eq!(resp["status_code"], 400, "{r}");
            assert_eq!(resp["body"]["error"]["param"], "response_format", "{r}");
            continue;
        }
        seen += 1;
        let choice = &resp["body"]["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{r}");
        assert_valid(&schema, choice["message"]["content"].as_str().unwrap());
    }
    assert_eq!(seen, 4);
}
