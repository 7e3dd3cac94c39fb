//! Structured output as the API asks for it: `response_format` (`text`, `json_object`,
//! `json_schema`) and the tool calls of a chat with `tools`, turned into the one grammar the
//! engine enforces on the answer ([`Constraint`]), and where in the answer it starts.
//!
//! | the request | the grammar | it starts |
//! |---|---|---|
//! | `response_format` only | the schema (any object for `json_object`) | at the answer (see below) |
//! | `tools`, `tool_choice: "auto"` | `<tool_call>` blocks | lazily: when the model writes `<tool_call>` |
//! | `tools` and `response_format`, auto | the schema, or `<tool_call>` blocks | at the answer |
//! | `tool_choice: "required"` | `<tool_call>` blocks | at once (the prompt opened the block) |
//! | `tool_choice` naming a function | that function's arguments | at once (the prompt holds its name) |
//!
//! "At the answer": after the reasoning of a thinking model (`</think>`), which stays free;
//! with thinking off, from the first token. A call's arguments follow the tool's `parameters`
//! when the tool is `strict` or the call is forced, and are any JSON object otherwise (a loose
//! schema a client never meant to be enforced must not make a request fail).
//!
//! A grammar that does not compile is a 400 naming the field; the format of a call is the one
//! the chat template asks for, Qwen's JSON or Qwen3.5's XML (the library's `chat/tool_calls.rs`
//! reads both back).

use crate::error::ApiError;
use crate::state::AppState;
use qwen3_inference::chat::tool_calls::{self, ToolChoice};
use qwen3_inference::constraint::{json_in_lark, Constraint, Grammar, Start, Vocabulary};
use serde_json::{json, Value};

/// `response_format`: `None` for free text.
pub(crate) fn response_format(v: &Value) -> Result<Option<Grammar>, ApiError> {
    let bad = |param: &str, why: &str| Err(ApiError::invalid(param.to_string(), why.to_string()));
    let f = match v.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(f @ Value::Object(_)) => f,
        Some(_) => return bad("response_format", "response_format must be an object"),
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        // llama-server's extension: a schema beside `json_object`.
        Some("json_object") => match f.get("schema") {
            None | Some(Value::Null) => Ok(Some(Grammar::JsonObject)),
            Some(schema) => Ok(Some(Grammar::JsonSchema(schema.clone()))),
        },
        Some("json_schema") => {
            let Some(js) = f.get("json_schema").filter(|j| j.is_object()) else {
                return bad(
                    "response_format.json_schema",
                    "response_format of type json_schema needs json_schema: {\"name\": ..., \"schema\": {...}}",
                );
            };
            match js.get("schema") {
                // No schema: any JSON object.
                None | Some(Value::Null) => Ok(Some(Grammar::JsonObject)),
                Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                    Ok(Some(Grammar::JsonSchema(schema.clone())))
                }
                Some(_) => bad(
                    "response_format.json_schema.schema",
                    "the schema must be a JSON object",
                ),
            }
        }
        Some(t) => bad(
            "response_format.type",
            &format!(
                "unknown response_format type {t:?}: expected text, json_object or json_schema"
            ),
        ),
        None => bad(
            "response_format.type",
            "response_format needs a type: text, json_object or json_schema",
        ),
    }
}

/// The vocabulary of the model `s` serves, for its grammars; a 500 if it cannot be built.
fn vocabulary(s: &AppState) -> Result<&Vocabulary, ApiError> {
    let eos = s.chat_stop_ids.first().or(s.eos_ids.first()).copied();
    let eos = eos.ok_or_else(|| {
        ApiError::invalid(
            "response_format".to_string(),
            "this model has no end-of-sequence id: structured output cannot end an answer",
        )
    })?;
    s.grammars
        .get(s.tokenizer, eos)
        .map_err(|e| ApiError::internal(format!("the grammar engine: {e}")))
}

/// Compiles `grammar`, a 400 naming `param` if it does not.
fn compile(
    vocab: &Vocabulary,
    grammar: &Grammar,
    start: Start,
    param: &str,
) -> Result<Constraint, ApiError> {
    vocab
        .constraint(grammar, start)
        .map_err(|e| ApiError::invalid(param.to_string(), format!("{param}: {e:#}")))
}

/// The constraint of a `/v1/completions` request: its `response_format` from the first token.
pub(crate) fn completion(
    s: &AppState,
    format: Option<&Grammar>,
) -> Result<Option<Constraint>, ApiError> {
    let Some(g) = format else { return Ok(None) };
    let vocab = vocabulary(s)?;
    compile(vocab, g, Start::NOW, "response_format").map(Some)
}

/// The constraint of a chat answer (see the module's table); `text` is the rendered prompt.
pub(crate) fn chat(
    s: &AppState,
    format: Option<&Grammar>,
    tools: &[Value],
    choice: &ToolChoice,
    text: &str,
) -> Result<Option<Constraint>, ApiError> {
    let calls = !tools.is_empty() && *choice != ToolChoice::None;
    if format.is_none() && !calls {
        return Ok(None);
    }
    let vocab = vocabulary(s)?;
    let forced = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
    // The tools a call may name, with their arguments' schemas, each compiled alone so that a
    // bad schema is named (only the named one, when `tool_choice` names one).
    let mut args = Vec::new();
    if calls {
        for (i, t) in tools.iter().enumerate() {
            let f = &t["function"];
            let name = f["name"].as_str().unwrap_or_default();
            if matches!(choice, ToolChoice::Named(n) if n != name) {
                continue;
            }
            let strict = f["strict"].as_bool().unwrap_or(false);
            let schema = match (&f["parameters"], strict || forced) {
                (Value::Null, _) | (_, false) => json!({"type": "object"}),
                (p, true) => p.clone(),
            };
            let param = format!("tools[{i}].function.parameters");
            let g = Grammar::JsonSchema(schema.clone());
            compile(vocab, &g, Start::NOW, &param)?;
            args.push((name.to_string(), schema));
        }
    }
    // One call, a rule per tool (`call_i`, its arguments `args_i`), in the template's form.
    let xml = s.xml_tool_calls;
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, (name, schema)) in args.iter().enumerate() {
        rules.push_str(&match xml {
            true => xml_call(i, name, schema),
            false => json_call(i, name, schema),
        });
        alternatives.push(format!("call_{i}"));
    }
    rules.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    // Blocks after the first: more calls, each in its own block.
    let blocks = r#"("\n<tool_call>\n" call "\n</tool_call>")*"#;
    let answer_start = vocab.answer_start(text, s.thinking_template);
    let (lark, start, param) = match (choice, format) {
        (ToolChoice::Named(_), _) => {
            // The prompt ends with `{"name": "f", "arguments": ` (XML: `<function=f>\n`): the
            // arguments, then the call's and the block's ends.
            let end = match xml {
                true => "</function>\\n</tool_call>",
                false => "}\\n</tool_call>",
            };
            let lark = format!("start: args_0 \"{end}\"\n{rules}");
            (lark, Start::NOW, "tools")
        }
        (ToolChoice::Required, _) => {
            // The prompt ends with `<tool_call>\n`.
            let lark = format!("start: call \"\\n</tool_call>\" {blocks}\n{rules}");
            (lark, Start::NOW, "tools")
        }
        (_, Some(f)) if calls => {
            let answer = match f {
                Grammar::JsonSchema(schema) => json_in_lark(schema),
                _ => json_in_lark(&json!({"type": "object"})),
            };
            let lark = format!(
                "start: answer | \"<tool_call>\\n\" call \"\\n</tool_call>\" {blocks}\nanswer: {answer}\n{rules}"
            );
            (lark, answer_start, "response_format")
        }
        (_, Some(f)) => {
            return compile(vocab, f, answer_start, "response_format").map(Some);
        }
        (_, None) => {
            // Free text (after the reasoning) until the model opens a block: a lazy grammar.
            let Some(open) = vocab.token_id("<tool_call>") else {
                return Ok(None);
            };
            let lark = format!("start: \"\\n\" call \"\\n</tool_call>\" {blocks}\n{rules}");
            let start = Start {
                trigger: Some(open),
                ..answer_start
            };
            (lark, start, "tools")
        }
    };
    compile(vocab, &Grammar::Lark(lark), start, param).map(Some)
}

/// A Lark string: a JSON string literal.
fn lit(text: &str) -> String {
    Value::from(text).to_string()
}

/// Tool `i`'s call in Qwen's JSON, `{"name": "f", "arguments": {...}}`: its arguments' schema at
/// the root of its own `%json` (where its `$ref`s resolve).
fn json_call(i: usize, name: &str, schema: &Value) -> String {
    let head = lit(&format!(
        "{{\"name\": {}, \"arguments\": ",
        Value::from(name)
    ));
    format!(
        "call_{i}: {head} args_{i} \"}}\"\nargs_{i}: {}\n",
        json_in_lark(schema)
    )
}

/// Tool `i`'s call in Qwen3.5's XML (`chat/tool_calls.rs`): `<function=f>\n`, then a
/// `<parameter=p>\nvalue\n</parameter>\n` per argument, then `</function>`. The arguments are
/// the schema's `properties` in their order, each required one present; a schema without
/// properties takes any parameters. A value is JSON where `chat/tool_calls.rs` reads JSON back (a
/// property of type integer, number, boolean, object or array), following the property's
/// schema; otherwise text, as the template writes a string: one of a string `enum`, or any text
/// up to the parameter's end within the property's `minLength` and `maxLength` (a `pattern` is
/// not enforced on XML text).
fn xml_call(i: usize, name: &str, schema: &Value) -> String {
    let head = lit(&format!("<function={name}>\n"));
    let mut rules = format!("call_{i}: {head} args_{i} \"</function>\"\n");
    let end = lit("\n</parameter>\n");
    // Text up to the parameter's end: lazily, the first `\n</parameter>\n` ends it, and it
    // holds no `</parameter>` of its own (the parser ends a value at the first).
    let no_end = r"~/(?s:.*<\/parameter>.*)/";
    rules.push_str(&format!(
        "text_{i}[lazy]: (/(?s:.*)/ & {no_end}) {end}\nany_{i}: \"<parameter=\" /[^>\\n]+/ \">\\n\" text_{i}\n"
    ));
    let props = schema["properties"].as_object().filter(|p| !p.is_empty());
    let Some(props) = props else {
        rules.push_str(&format!("args_{i}: any_{i}*\n"));
        return rules;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut seq = Vec::new();
    for (j, key) in props.keys().enumerate() {
        let prop = tool_calls::property(schema, key);
        let value = match prop["type"].as_str() {
            Some("integer" | "number" | "boolean" | "object" | "array") => {
                format!("{} {end}", json_in_lark(&with_defs(prop, schema)))
            }
            _ => match (
                prop["enum"].as_array(),
                &prop["minLength"],
                &prop["maxLength"],
            ) {
                (Some(e), _, _) if !e.is_empty() && e.iter().all(Value::is_string) => {
                    let choices: Vec<String> = e
                        .iter()
                        .map(|v| lit(v.as_str().unwrap_or_default()))
                        .collect();
                    format!("({}) {end}", choices.join(" | "))
                }
                (_, Value::Null, Value::Null) => format!("text_{i}"),
                (_, min, max) => {
                    let (min, max) = (min.as_u64().unwrap_or(0), max.as_u64());
                    let max = max.map_or(String::new(), |m| m.to_string());
                    rules.push_str(&format!(
                        "text_{i}_{j}[lazy]: (/(?s:.{{{min},{max}}})/ & {no_end}) {end}\n"
                    ));
                    format!("text_{i}_{j}")
                }
            },
        };
        let open = lit(&format!("<parameter={key}>\n"));
        rules.push_str(&format!("param_{i}_{j}: {open} {value}\n"));
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        seq.push(format!("param_{i}_{j}{optional}"));
    }
    rules.push_str(&format!("args_{i}: {}\n", seq.join(" ")));
    rules
}

/// A property's schema with its tool's `$defs` and `definitions` beside it, so that its `$ref`s
/// resolve when it is the root of a `%json` of its own.
fn with_defs(prop: &Value, schema: &Value) -> Value {
    let mut p = prop.clone();
    if let Value::Object(m) = &mut p {
        for key in ["$defs", "definitions"] {
            if let (Some(defs), false) = (schema.get(key), m.contains_key(key)) {
                m.insert(key.to_string(), defs.clone());
            }
        }
    }
    p
}
