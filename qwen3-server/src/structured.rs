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
//! A grammar that does not compile is a 400 naming the field; the format of a call is Qwen's
//! (tool_calls.rs reads it back).

use crate::error::ApiError;
use crate::request::ToolChoice;
use crate::state::AppState;
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
    // Qwen3.5's template asks for XML calls (tool_calls.rs), which the grammars below do not
    // write yet: free calls are read back as the model writes them; what needs a grammar of them
    // is refused by name.
    if calls && s.template.as_ref().is_some_and(|t| t.xml_tool_calls()) {
        let strict = tools
            .iter()
            .any(|t| t["function"]["strict"].as_bool().unwrap_or(false));
        let why = match (choice, format) {
            (ToolChoice::Required | ToolChoice::Named(_), _) => Some("tool_choice"),
            (_, Some(_)) => Some("response_format"),
            _ if strict => Some("tools"),
            _ => None,
        };
        if let Some(param) = why {
            return Err(ApiError::invalid(
                param.to_string(),
                format!(
                    "{param}: this model's chat template writes tool calls as XML \
                     (<function=...>), and enforcing them (a forced tool_choice, a strict tool, \
                     or tools with a response_format) is not implemented for it yet"
                ),
            ));
        }
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
    // One call, Qwen's `{"name": "f", "arguments": {...}}`: a rule per tool, its arguments'
    // schema at the root of its own `%json` (where its `$ref`s resolve). The fixed text is a
    // Lark string, which is a JSON string literal.
    let lit = |text: String| Value::String(text).to_string();
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, (name, schema)) in args.iter().enumerate() {
        let head = lit(format!(
            "{{\"name\": {}, \"arguments\": ",
            Value::from(name.as_str())
        ));
        rules.push_str(&format!(
            "call_{i}: {head} args_{i} \"}}\"\nargs_{i}: {}\n",
            json_in_lark(schema)
        ));
        alternatives.push(format!("call_{i}"));
    }
    rules.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    // Blocks after the first: more calls, each in its own block.
    let blocks = r#"("\n<tool_call>\n" call "\n</tool_call>")*"#;
    let answer_start = vocab.answer_start(text, s.thinking_template);
    let (lark, start, param) = match (choice, format) {
        (ToolChoice::Named(_), _) => {
            // The prompt ends with `{"name": "f", "arguments": `: the arguments, then the
            // block's end.
            let lark = "start: args_0 \"}\\n</tool_call>\"\n".to_string() + &rules;
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
