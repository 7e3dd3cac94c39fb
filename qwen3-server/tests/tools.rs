//! Tool calls: `tools` and `tool_choice` on `/v1/chat/completions`, the history of a call round
//! trip rendered as HuggingFace renders it, and an answer's `<tool_call>` blocks turned into
//! `tool_calls`. The fixture's random weights never write a valid call, so the parsing is checked
//! on a real answer's tokens through the server's own text pipeline, and the routes end to end on
//! what the model does write (through the router, in process: tests/common).

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_inference::text::{ChoiceText, Delta};
use qwen3_inference::tokenizer::Tokenizer;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn model(test: &str) -> PathBuf {
    export_fixture(
        "tiny-qwen3-fullvocab",
        &tempdir("pq-tools", test),
        DType::F32,
        0,
    )
}

/// The HF case `tool_call_round_trip` (fixtures/chat/chat-template-cases.json): messages, tools,
/// and `apply_chat_template`'s ids.
fn round_trip_case() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/chat/chat-template-cases.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tool_call_round_trip")
        .unwrap()
        .clone()
}

/// A thinking answer that calls two tools, as Qwen3 writes one, through [`ChoiceText`] a token
/// at a time (the real tokenizer's tokens) and at once: the reasoning, no content, the two calls
/// with their arguments exactly as written.
#[test]
fn a_real_answer_s_tool_calls_are_cut_out_token_by_token() {
    let m = model("text");
    let tok = Tokenizer::open(&m.with_extension("tokenizer.bin")).unwrap();
    let answer = "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let ids = tok.encode(answer);
    assert!(ids.contains(&151657), "<tool_call> is one token");
    let mut t = ChoiceText::new(&tok, vec![], Some(false)).with_tool_calls(&Default::default());
    let mut all = Delta::default();
    for &id in &ids {
        let (d, stopped) = t.push(id);
        assert!(!stopped);
        all.content.push_str(&d.content);
        all.reasoning.push_str(&d.reasoning);
        all.tool_calls.extend(d.tool_calls);
    }
    let d = t.finish();
    all.content.push_str(&d.content);
    all.tool_calls.extend(d.tool_calls);
    assert_eq!(all.reasoning, "The user wants the weather.");
    assert_eq!(all.content, "");
    let calls: Vec<(String, String)> = all
        .tool_calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (
                "get_weather".to_string(),
                r#"{"city": "Zürich", "unit": "celsius"}"#.to_string()
            ),
            ("get_time".to_string(), "{}".to_string())
        ]
    );
}

/// The history of a round trip (the assistant's call, then the tool's answer) and the tools are
/// rendered as HF's `apply_chat_template` renders them: the prompt has HF's token count, whether
/// the call's arguments come as an object or, as OpenAI clients send them, as a JSON string.
#[test]
fn a_round_trip_history_renders_as_hf() {
    let m = model("render");
    let s = Server::start(&m, &[]);
    let case = round_trip_case();
    let hf_len = case["ids"].as_array().unwrap().len() as u64;
    let mut body = json!({"messages": case["messages"], "tools": case["tools"], "max_tokens": 2,
                          "temperature": 0});
    let r = s.post("/v1/chat/completions", &body).json();
    assert_eq!(r["usage"]["prompt_tokens"], hf_len, "{r}");
    // OpenAI's form: arguments as a string (the text the model wrote).
    let args = &mut body["messages"][1]["tool_calls"][0]["function"]["arguments"];
    *args = Value::String(r#"{"city": "Zürich", "unit": "celsius"}"#.into());
    body["messages"][1]["tool_calls"][0]["id"] = "call_1".into();
    body["messages"][2]["tool_call_id"] = "call_1".into();
    let r = s.post("/v1/chat/completions", &body).json();
    assert_eq!(r["usage"]["prompt_tokens"], hf_len, "{r}");
    // tool_choice "none": the tools are not shown (a shorter prompt), no call is parsed.
    body["tool_choice"] = "none".into();
    let r = s.post("/v1/chat/completions", &body).json();
    assert!(
        r["usage"]["prompt_tokens"].as_u64().unwrap() < hf_len - 100,
        "{r}"
    );
}

/// A forced call (`tool_choice` naming a function) starts the answer as the call; the random
/// model does not finish valid JSON, so the block stays in `content` as written, streamed or
/// not, and no call is reported.
/// A model with Qwen3.5's chat template (its XML tool calls): the tools are shown as the template
/// shows them, an answer's XML calls are read back (the tests of the library's
/// `chat/tool_calls.rs`), and every way of asking for calls runs (tests/structured.rs checks the calls a grammar enforces).
#[test]
fn xml_tool_call_templates_take_every_tool_choice() {
    let dir = tempdir("pq-tools", "xml");
    let m = common::xml_template_model(&dir);
    let s = Server::start(&m, &[]);
    let tools = round_trip_case()["tools"].clone();
    let ask = |extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Weather in Zürich?"}], "tools": tools,
            "max_tokens": 4, "temperature": 0,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        s.post("/v1/chat/completions", &body)
    };
    let mut strict = tools.clone();
    strict[0]["function"]["strict"] = true.into();
    for extra in [
        json!({}),
        json!({"tool_choice": "required"}),
        json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        json!({"tools": strict}),
        json!({"response_format": {"type": "json_object"}}),
    ] {
        let r = ask(extra.clone());
        assert_eq!(r.status, 200, "{extra}: {}", r.body);
    }
    drop(s);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_forced_call_the_model_botches_stays_text() {
    let m = model("forced");
    let s = Server::start(&m, &[]);
    let case = round_trip_case();
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Zürich?"}], "tools": case["tools"],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 6, "temperature": 0,
    });
    let r = s.post("/v1/chat/completions", &body).json();
    let msg = &r["choices"][0]["message"];
    let content = msg["content"].as_str().unwrap();
    assert!(
        content.starts_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
        "{content:?}"
    );
    assert!(msg.get("tool_calls").is_none());
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let mut text = String::new();
    for ev in s.post("/v1/chat/completions", &streamed).events() {
        if ev == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&ev).unwrap();
        assert!(v["choices"][0]["delta"].get("tool_calls").is_none());
        text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(text, content);
}

#[test]
fn bad_tools_are_400s() {
    let m = model("bad");
    let s = Server::start(&m, &[]);
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let tools = round_trip_case()["tools"].clone();
    for (body, param) in [
        (json!({"messages": msgs, "tools": {"a": 1}}), "tools"),
        (
            json!({"messages": msgs, "tools": [{"type": "function"}]}),
            "tools[0]",
        ),
        (
            json!({"messages": msgs, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": msgs, "tools": tools, "tool_choice": "always"}),
            "tool_choice",
        ),
        (
            json!({"messages": msgs, "tools": tools,
                   "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {}}]}]}),
            "messages[0].tool_calls[0].function.name",
        ),
    ] {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{body}");
    }
}
