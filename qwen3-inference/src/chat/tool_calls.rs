//! Tool calls in an answer: Qwen's chat templates (Qwen3, Qwen2.5) tell the model to answer a
//! call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; this cuts those blocks
//! out of the answer's text as it streams and turns each into a call (OpenAI's
//! `message.tool_calls`), as vLLM's `hermes` parser does for these models.
//!
//! Qwen3.5's template asks for XML in the block instead:
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Zürich
//! </parameter>
//! <parameter=days>
//! 3
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Each value is text; the call's arguments are typed by the tool's JSON schema, as vLLM's
//! `qwen3_coder` parser types them: a parameter the schema makes an integer, a number or a
//! boolean is parsed as one, an object or an array as JSON, and everything else (strings, a
//! parameter the schema does not list, a value that does not parse) stays a string; `null` is
//! null. They are written as JSON in the order the model wrote them.
//!
//! A block that is neither form, or that never closes, stays in the text as the model wrote it:
//! nothing the model said is lost. A JSON call's `arguments` is kept as the exact JSON text the
//! model wrote (OpenAI sends it as a string), so a client that sends the call back in the history
//! renders the same tokens the model produced.
//!
//! `tool_choice` ([`ToolChoice`]) says whether the answer calls a tool; a forced call's
//! beginning is written into the prompt ([`ToolChoice::forced_start`]).
//!
//! Text is held back, never taken back: a possible beginning of `<tool_call>`, a block until
//! its `</tool_call>`, and whitespace after a call (sent only if more text follows).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// `tool_choice`: whether and how the answer calls a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// Some call: the answer starts with `<tool_call>`.
    Required,
    /// This function: the answer starts with the call's beginning, its name filled in.
    Named(String),
}

impl ToolChoice {
    /// The beginning of the answer the prompt already holds: with "required" and a named
    /// function the answer starts as a call does (Qwen's format, the only way the template has
    /// to ask; in XML when the template writes calls so), and the model writes the rest. Empty
    /// otherwise.
    pub fn forced_start(&self, xml: bool) -> String {
        match self {
            ToolChoice::Required => "<tool_call>\n".to_string(),
            ToolChoice::Named(name) if xml => format!("<tool_call>\n<function={name}>\n"),
            ToolChoice::Named(name) => format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                Value::from(name.as_str())
            ),
            ToolChoice::Auto | ToolChoice::None => String::new(),
        }
    }
}

/// What a chat's tool calls are read with: the beginning of the answer that the prompt already
/// holds (a forced call; empty otherwise), and the tools as the request gave them (their
/// `parameters` type an XML call's arguments).
#[derive(Debug, Clone, Default)]
pub struct ToolCalls {
    pub prefix: String,
    /// Shared by every choice's splitter (`n` choices read their calls with the same tools).
    pub tools: std::sync::Arc<[Value]>,
}

/// See the module's comment.
#[derive(Debug, Default)]
pub struct ToolCallSplit {
    /// The tools, for an XML call's argument types.
    tools: std::sync::Arc<[Value]>,
    /// Inside a block: the whitespace before its tag (dropped if it is a call, kept if not),
    /// and its text so far (after `<tool_call>`).
    block: Option<(String, String)>,
    /// Outside: text not sent yet (a possible tag's beginning, or whitespace).
    held: String,
    /// Calls found so far (whitespace after one is held until text follows).
    calls: usize,
}

impl ToolCallSplit {
    /// A splitter whose answer starts with `calls.prefix` already (a forced call: the prompt
    /// ends with the beginning of a block, see `tool_choice`).
    pub fn new(calls: &ToolCalls) -> ToolCallSplit {
        let mut s = ToolCallSplit {
            tools: std::sync::Arc::clone(&calls.tools),
            ..Default::default()
        };
        let (text, calls) = s.push(&calls.prefix);
        debug_assert!(text.is_empty() && calls.is_empty());
        s
    }

    /// Adds answer text; returns the text to send and the calls completed by it.
    pub fn push(&mut self, text: &str) -> (String, Vec<ToolCall>) {
        let (mut out, mut calls) = (String::new(), Vec::new());
        let mut rest = text.to_string();
        loop {
            match &mut self.block {
                Some((gap, block)) => {
                    block.push_str(&rest);
                    let Some(at) = block.find(CLOSE) else {
                        return (out, calls);
                    };
                    let after = block[at + CLOSE.len()..].to_string();
                    let inner = block[..at].to_string();
                    let gap = std::mem::take(gap);
                    self.block = None;
                    match parse(&inner).or_else(|| parse_xml(&inner, &self.tools)) {
                        Some(call) => {
                            calls.push(call);
                            self.calls += 1;
                        }
                        // Not a call: the block stays text, as written.
                        None => out.push_str(&format!("{gap}{OPEN}{inner}{CLOSE}")),
                    }
                    rest = after;
                }
                None => {
                    self.held.push_str(&rest);
                    rest.clear();
                    if let Some(at) = self.held.find(OPEN) {
                        // Text before a call, but not the whitespace that separates the two.
                        let text = self.held[..at].trim_end();
                        out.push_str(text);
                        let gap = self.held[text.len()..at].to_string();
                        rest = self.held[at + OPEN.len()..].to_string();
                        self.held.clear();
                        self.block = Some((gap, String::new()));
                        continue;
                    }
                    // Send what cannot begin the tag, keeping trailing whitespace too (it goes
                    // if a call follows, or at the end after a call).
                    let keep = partial_tag(&self.held);
                    let body = &self.held[..self.held.len() - keep];
                    let send = body.trim_end().len();
                    out.push_str(&self.held[..send]);
                    self.held.drain(..send);
                    return (out, calls);
                }
            }
        }
    }

    /// The answer ended: an unclosed block is text; whitespace held after a call is dropped.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        if self.calls > 0 && out.trim().is_empty() {
            out.clear();
        }
        if let Some((gap, block)) = self.block.take() {
            out.push_str(&gap);
            out.push_str(OPEN);
            out.push_str(&block);
        }
        out
    }
}

/// The length of the longest end of `text` that is a proper beginning of `<tool_call>`.
fn partial_tag(text: &str) -> usize {
    text.char_indices()
        .map(|(i, _)| &text[i..])
        .find(|end| end.len() < OPEN.len() && OPEN.starts_with(end))
        .map_or(0, str::len)
}

/// `{"name": "f", "arguments": {...}}` -> the call, with the arguments' text as written.
fn parse(inner: &str) -> Option<ToolCall> {
    #[derive(Deserialize)]
    struct Call<'a> {
        name: String,
        #[serde(borrow)]
        arguments: Option<&'a RawValue>,
    }
    let c: Call = serde_json::from_str(inner.trim()).ok()?;
    Some(ToolCall {
        name: c.name,
        arguments: c
            .arguments
            .map_or("{}".to_string(), |a| a.get().to_string()),
    })
}

/// `<function=f>\n<parameter=p>\nvalue\n</parameter>\n...</function>` -> the call, its
/// arguments typed by the tool's schema in `tools` (the module's comment).
fn parse_xml(inner: &str, tools: &[Value]) -> Option<ToolCall> {
    let rest = inner.trim().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let mut body = rest.strip_suffix("</function>")?;
    if name.is_empty() || name.contains(['<', '\n']) {
        return None;
    }
    let parameters = tools
        .iter()
        .map(|t| &t["function"])
        .find(|f| f["name"] == name)
        .map(|f| &f["parameters"]);
    let mut args = Vec::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            break;
        }
        let rest = body.strip_prefix("<parameter=")?;
        let (param, rest) = rest.split_once('>')?;
        let (value, rest) = rest.split_once("</parameter>")?;
        // The template writes "\n" before and after the value.
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let kind = parameters.and_then(|p| property(p, param)["type"].as_str());
        args.push((param.to_string(), typed(value, kind)));
        body = rest;
    }
    // `{"k": v, ...}`, in the model's order (the values compact JSON).
    let fields: Vec<String> = args
        .iter()
        .map(|(k, v)| format!("{}: {v}", Value::from(k.as_str())))
        .collect();
    Some(ToolCall {
        name: name.to_string(),
        arguments: format!("{{{}}}", fields.join(", ")),
    })
}

/// Property `name` of a tool's `parameters` schema, through its `$ref` when it is one of the
/// schema's `$defs` or `definitions` (as Pydantic writes nested models); `Null` if there is none.
/// The grammar that writes a call (the server's `structured.rs`) and this parser read a
/// property alike.
pub fn property<'v>(parameters: &'v Value, name: &str) -> &'v Value {
    let prop = &parameters["properties"][name];
    let Some(r) = prop["$ref"].as_str() else {
        return prop;
    };
    for key in ["$defs", "definitions"] {
        if let Some(target) = r
            .strip_prefix(&format!("#/{key}/"))
            .and_then(|n| parameters[key].get(n))
        {
            return target;
        }
    }
    prop
}

/// An XML parameter's text as the JSON value its schema `kind` says (the module's comment).
fn typed(value: &str, kind: Option<&str>) -> Value {
    let text = || Value::from(value);
    if value.trim().eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let v = value.trim();
    match kind {
        Some("integer") => v.parse::<i64>().map_or_else(|_| text(), Value::from),
        Some("number") => match v.parse::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => v
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or_else(text, Value::Number),
        },
        Some("boolean") => match v.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => text(),
        },
        Some("object") | Some("array") => serde_json::from_str::<Value>(v)
            .ok()
            .filter(|j| j.is_object() || j.is_array())
            .unwrap_or_else(text),
        _ => text(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` bytes (on character boundaries) and collects the output.
    fn run(text: &str, n: usize) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallSplit::default();
        let (mut out, mut calls) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            let (t, c) = s.push(&piece.iter().collect::<String>());
            out.push_str(&t);
            calls.extend(c);
        }
        out.push_str(&s.finish());
        (out, calls)
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn calls_are_cut_out_whatever_the_pieces() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
        for n in [1, 2, 3, 7, 1000] {
            let (out, calls) = run(text, n);
            assert_eq!(out, "Let me check.", "pieces of {n}");
            assert_eq!(
                calls,
                [
                    call("get_weather", r#"{"city": "Zürich", "unit": "celsius"}"#),
                    call("now", "{}")
                ],
                "pieces of {n}"
            );
        }
    }

    #[test]
    fn text_without_calls_passes_unchanged() {
        for text in [
            "Hello <tool",
            "a < b and <tool_cal is not a tag\n\n",
            "x\n  \n",
            "",
        ] {
            for n in [1, 4, 100] {
                assert_eq!(
                    run(text, n),
                    (text.to_string(), vec![]),
                    "{text:?} in pieces of {n}"
                );
            }
        }
    }

    #[test]
    fn malformed_or_unclosed_blocks_stay_text() {
        let bad = "<tool_call>\n{\"name\": 3}\n</tool_call>";
        assert_eq!(run(bad, 2), (bad.to_string(), vec![]));
        let open = "Sure <tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(run(open, 3), (open.to_string(), vec![]));
        // A call, then text: the text stays, with what separates it from the call.
        let (out, calls) = run("<tool_call>{\"name\": \"f\"}</tool_call>\n\nDone.", 2);
        assert_eq!(out, "\n\nDone.");
        assert_eq!(calls, [call("f", "{}")]);
    }

    /// Qwen3.5's XML calls, whatever the pieces: arguments typed by the tool's schema (the
    /// template's own rendering of a call, fixtures/chat/qwen3.5-cases.json, read back).
    #[test]
    fn xml_calls_are_typed_by_the_schema() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "ratio": {"type": "number"}, "metric": {"type": "boolean"},
                "units": {"type": "object"}, "fields": {"type": "array"}}}}}]);
        let calls = ToolCalls {
            prefix: String::new(),
            tools: tools.as_array().unwrap().clone().into(),
        };
        let text = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=units>\n{\"temp\": \"C\"}\n</parameter>\n<parameter=fields>\n[\"wind\", \"rain\"]\n</parameter>\n<parameter=note>\n42\nlines\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
        for n in [1, 3, 1000] {
            let mut s = ToolCallSplit::new(&calls);
            let (mut out, mut got) = (String::new(), Vec::new());
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(n) {
                let (t, c) = s.push(&piece.iter().collect::<String>());
                out.push_str(&t);
                got.extend(c);
            }
            out.push_str(&s.finish());
            assert_eq!(out, "Let me check.", "pieces of {n}");
            assert_eq!(
                got,
                [
                    call(
                        "get_weather",
                        r#"{"city": "Zürich", "days": 3, "ratio": 0.5, "metric": true, "units": {"temp":"C"}, "fields": ["wind","rain"], "note": "42\nlines"}"#
                    ),
                    call("now", "{}")
                ],
                "pieces of {n}"
            );
        }
        // Values that do not parse as their type stay strings; a block of neither form is text.
        assert_eq!(typed("three", Some("integer")), Value::from("three"));
        assert_eq!(typed("null", Some("string")), Value::Null);
        let bad = "<tool_call>\n<function=f>\n<param=x>\n1\n</param>\n</function>\n</tool_call>";
        assert_eq!(run(bad, 4), (bad.to_string(), vec![]));
    }

    #[test]
    fn a_forced_prefix_is_inside_the_block() {
        let mut s = ToolCallSplit::new(&ToolCalls {
            prefix: "<tool_call>\n{\"name\": \"f\", \"arguments\": ".into(),
            tools: Default::default(),
        });
        let (t, c) = s.push("{\"x\": 1}}\n</tool_call>");
        assert_eq!((t.as_str(), c), ("", vec![call("f", r#"{"x": 1}"#)]));
        assert_eq!(s.finish(), "");
    }
}
