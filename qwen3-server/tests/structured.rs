//! Structured output end to end through the router: `response_format` (`json_object`,
//! `json_schema`) on both endpoints, streamed and not, and tool calls with `tool_choice`. The
//! fixture's random weights are the ideal adversary (left alone they never write JSON): every
//! answer that stops must parse and validate against its schema, checked by an independent
//! validator (the `jsonschema` crate, not llguidance, which wrote it), and the schemas bound
//! their strings and arrays so that most answers do stop.

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;

fn model(test: &str) -> PathBuf {
    export_fixture(
        "tiny-qwen3-fullvocab",
        &tempdir("pq-structured", test),
        DType::F32,
        0,
    )
}

/// The table of schemas: what JSON Schema users write, each feature at least once.
fn schemas() -> Vec<(&'static str, Value)> {
    let int = |lo: i64, hi: i64| json!({"type": "integer", "minimum": lo, "maximum": hi});
    let obj = |props: Value, required: Value| {
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    vec![
        (
            "nested objects",
            obj(
                json!({"user": obj(json!({"name": {"type": "string", "maxLength": 8},
                                          "id": int(0, 999)}), json!(["name", "id"]))}),
                json!(["user"]),
            ),
        ),
        (
            "array with min and max items",
            obj(
                json!({"xs": {"type": "array", "items": int(-5, 5), "minItems": 2, "maxItems": 4}}),
                json!(["xs"]),
            ),
        ),
        (
            "enums",
            obj(
                json!({"color": {"enum": ["red", "green", "blue"]},
                       "size": {"type": "string", "enum": ["S", "M", "L"]}}),
                json!(["color", "size"]),
            ),
        ),
        (
            "numbers with ranges",
            obj(
                json!({"n": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
                       "t": {"type": "number", "minimum": -1.5, "maximum": 2.5}}),
                json!(["n", "t"]),
            ),
        ),
        (
            "string pattern and lengths",
            obj(
                json!({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                       "word": {"type": "string", "minLength": 2, "maxLength": 6}}),
                json!(["code", "word"]),
            ),
        ),
        (
            "anyOf",
            obj(
                json!({"v": {"anyOf": [int(0, 9), {"type": "string", "maxLength": 4},
                                       {"type": "boolean"}]}}),
                json!(["v"]),
            ),
        ),
        (
            "optional fields",
            obj(
                json!({"a": {"type": "boolean"}, "b": {"type": "string", "maxLength": 5},
                       "c": {"type": "null"}}),
                json!(["a"]),
            ),
        ),
        ("$ref", {
            let mut s = obj(
                json!({"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}),
                json!(["from", "to"]),
            );
            s["$defs"] = json!({"point": obj(json!({"x": int(0, 9), "y": int(0, 9)}),
                                             json!(["x", "y"]))});
            s
        }),
        (
            "a top-level array",
            json!({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}),
        ),
    ]
}

/// `response_format` of type `json_schema`.
fn json_schema(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}})
}

/// A chat with thinking off, sampled at temperature 1, `n` choices from `seed`.
fn chat(format: Value, n: usize, seed: u64) -> Value {
    json!({"messages": [{"role": "user", "content": "Answer in JSON."}],
           "chat_template_kwargs": {"enable_thinking": false},
           "response_format": format, "temperature": 1.0, "max_tokens": 600,
           "n": n, "seed": seed})
}

/// Whether `text` parses as JSON that `schema` accepts.
fn valid(schema: &Value, text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text:?}"))?;
    let validator = jsonschema::validator_for(schema).unwrap();
    match validator.validate(&v) {
        Ok(()) => Ok(()),
        Err(e) => Err(format!("{e}: {text}")),
    }
}

/// Every schema of the table, 8 answers each at temperature 1: every stopped answer valid, and
/// at least 90% of them stopped within 600 tokens.
#[test]
fn every_stopped_answer_matches_its_schema() {
    let m = model("table");
    let s = Server::start(&m, &[]);
    let (mut stopped, mut all) = (0, 0);
    for (name, schema) in schemas() {
        let mut here = 0;
        for seed in [1, 100] {
            let r = s.post("/v1/chat/completions", &chat(json_schema(&schema), 4, seed));
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            for c in r.json()["choices"].as_array().unwrap() {
                all += 1;
                let text = c["message"]["content"].as_str().unwrap();
                match c["finish_reason"].as_str().unwrap() {
                    "stop" => {
                        here += 1;
                        if let Err(e) = valid(&schema, text) {
                            panic!("{name}: {e}");
                        }
                    }
                    "length" => {}
                    other => panic!("{name}: finish_reason {other}"),
                }
            }
        }
        eprintln!("{name}: {here} of 8 stopped");
        stopped += here;
    }
    assert!(
        stopped * 10 >= all * 9,
        "only {stopped} of {all} answers stopped within 600 tokens"
    );
}

/// The same through `/v1/completions` and as a stream: the streamed text is one valid answer.
#[test]
fn completions_and_streams_are_constrained_too() {
    let m = model("stream");
    let s = Server::start(&m, &[]);
    let schema = &schemas()[2].1;
    let body = json!({"prompt": "JSON:", "response_format": json_schema(schema),
                      "temperature": 1.0, "max_tokens": 200, "seed": 7, "n": 3});
    let r = s.post("/v1/completions", &body).json();
    for c in r["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{r}");
        valid(schema, c["text"].as_str().unwrap()).unwrap();
    }
    let mut streamed = chat(json_schema(schema), 1, 7);
    streamed["stream"] = true.into();
    let (mut text, mut finish) = (String::new(), Value::Null);
    for ev in s.post("/v1/chat/completions", &streamed).events() {
        if ev == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&ev).unwrap();
        text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        if !v["choices"][0]["finish_reason"].is_null() {
            finish = v["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(finish, "stop");
    valid(schema, &text).unwrap();
    // The stream is the answer the same request gets whole.
    let whole = s
        .post("/v1/chat/completions", &chat(json_schema(schema), 1, 7))
        .json();
    assert_eq!(whole["choices"][0]["message"]["content"], text.as_str());
}

/// `json_object`: whatever stops is one JSON object; `text` changes nothing.
#[test]
fn json_object_and_text() {
    let m = model("object");
    let s = Server::start(&m, &[]);
    let r = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"type": "json_object"}), 8, 3),
        )
        .json();
    for c in r["choices"].as_array().unwrap() {
        let text = c["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if c["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(text).unwrap();
            assert!(v.is_object(), "{text}");
        }
    }
    let mut free = chat(json!({"type": "text"}), 1, 3);
    free["temperature"] = 0.into();
    free["max_tokens"] = 8.into();
    let a = s.post("/v1/chat/completions", &free).json();
    free.as_object_mut().unwrap().remove("response_format");
    let b = s.post("/v1/chat/completions", &free).json();
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

/// A constrained answer cut by `max_tokens` ends with `length`; greedy answers are the same
/// alone and batched (n = 4 run together), constraint and forced tokens included.
#[test]
fn cut_answers_say_length_and_greedy_is_batch_invariant() {
    let m = model("invariant");
    let s = Server::start(&m, &[]);
    let schema = &schemas()[0].1;
    let mut body = chat(json_schema(schema), 1, 1);
    body["max_tokens"] = 4.into();
    let r = s.post("/v1/chat/completions", &body).json();
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 4, "{r}");
    body["max_tokens"] = 600.into();
    body["temperature"] = 0.into();
    let alone = s.post("/v1/chat/completions", &body).json();
    let alone = &alone["choices"][0]["message"]["content"];
    body["n"] = 4.into();
    let batched = s.post("/v1/chat/completions", &body).json();
    for c in batched["choices"].as_array().unwrap() {
        assert_eq!(&c["message"]["content"], alone);
    }
}

/// Thinking on: the reasoning is free (and goes to `reasoning_content`); the answer after it
/// is constrained.
#[test]
fn the_answer_after_the_reasoning_is_constrained() {
    let m = model("thinking");
    let s = Server::start(&m, &[]);
    let schema = &schemas()[2].1;
    let mut body = chat(json_schema(schema), 8, 5);
    body["chat_template_kwargs"]["enable_thinking"] = true.into();
    body["max_tokens"] = 100.into();
    let r = s.post("/v1/chat/completions", &body).json();
    let (mut stopped, mut reasoned) = (0, 0);
    for c in r["choices"].as_array().unwrap() {
        let m = &c["message"];
        if m["reasoning_content"].is_string() {
            // A random model that opened a reasoning rarely closes it: cut by max_tokens, it
            // may not end inside it.
            reasoned += 1;
        }
        if c["finish_reason"] == "stop" {
            stopped += 1;
            valid(schema, m["content"].as_str().unwrap()).unwrap();
        }
    }
    eprintln!("{stopped} of 8 stopped, {reasoned} reasoned");
    assert!(stopped >= 2, "{r}");
}

/// `tool_choice: "required"` and a named function: every stopped answer is a call of a known
/// tool whose arguments match its parameters.
#[test]
fn forced_tool_calls_parse_as_calls() {
    let m = model("tools");
    let s = Server::start(&m, &[]);
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false});
    // With `$defs` and a `$ref`, as Pydantic writes nested models: it must resolve inside the
    // call, where the schema is not the root of the answer.
    let time = json!({"type": "object", "properties": {"zone": {"$ref": "#/$defs/Zone"}},
                      "required": ["zone"], "additionalProperties": false,
                      "$defs": {"Zone": {"type": "string", "maxLength": 6}}});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
        {"type": "function", "function": {"name": "get_time", "parameters": time}},
    ]);
    let params = |name: &str| {
        if name == "get_weather" {
            &weather
        } else {
            &time
        }
    };
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ] {
        let mut body = chat(Value::Null, 8, 11);
        body["tools"] = tools.clone();
        body["tool_choice"] = choice.clone();
        let r = s.post("/v1/chat/completions", &body).json();
        let mut calls = 0;
        for c in r["choices"].as_array().unwrap() {
            if c["finish_reason"] != "tool_calls" {
                assert_eq!(c["finish_reason"], "length", "{choice}: {c}");
                continue;
            }
            for call in c["message"]["tool_calls"].as_array().unwrap() {
                let name = call["function"]["name"].as_str().unwrap();
                if choice != "required" {
                    assert_eq!(name, "get_time");
                }
                let args = call["function"]["arguments"].as_str().unwrap();
                valid(params(name), args).unwrap();
                calls += 1;
            }
        }
        assert!(calls >= 6, "{choice}: only {calls} calls in 8 answers: {r}");
    }
}

/// The same with Qwen3.5's chat template, whose calls are XML: every stopped answer is a call of
/// a known tool, its arguments (read back from the XML and typed by the schema) valid against
/// its parameters: a string within its bounds, an `enum`, an integer in its range, a `$ref`.
#[test]
fn forced_xml_tool_calls_parse_as_calls() {
    let dir = tempdir("pq-structured", "xml");
    let m = common::xml_template_model(&dir);
    let s = Server::start(&m, &[]);
    // `days` through a `$ref`: written as JSON and read back as an integer, both through it.
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"$ref": "#/$defs/Days"}},
        "required": ["city", "unit"], "additionalProperties": false,
        "$defs": {"Days": {"type": "integer", "minimum": 1, "maximum": 7}}});
    let time = json!({"type": "object", "properties": {"zone": {"$ref": "#/$defs/Zone"}},
                      "required": ["zone"], "additionalProperties": false,
                      "$defs": {"Zone": {"type": "string", "minLength": 1, "maxLength": 6}}});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
        {"type": "function", "function": {"name": "get_time", "parameters": time}},
    ]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let mut body = chat(Value::Null, 8, 11);
        body["tools"] = tools.clone();
        body["tool_choice"] = choice.clone();
        let r = s.post("/v1/chat/completions", &body).json();
        let mut calls = 0;
        for c in r["choices"].as_array().unwrap() {
            if c["finish_reason"] != "tool_calls" {
                assert_eq!(c["finish_reason"], "length", "{choice}: {c}");
                continue;
            }
            for call in c["message"]["tool_calls"].as_array().unwrap() {
                let name = call["function"]["name"].as_str().unwrap();
                if choice != "required" {
                    assert_eq!(name, "get_weather");
                }
                let params = if name == "get_weather" {
                    &weather
                } else {
                    &time
                };
                let args = call["function"]["arguments"].as_str().unwrap();
                valid(params, args).unwrap();
                calls += 1;
            }
        }
        assert!(calls >= 6, "{choice}: only {calls} calls in 8 answers: {r}");
    }
    drop(s);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Grammars that do not compile, or that the engine cannot enforce, are 400s naming the field;
/// so is a response_format the server does not know.
#[test]
fn bad_formats_are_400s() {
    let m = model("bad");
    let s = Server::start(&m, &[]);
    let strict_tool = |parameters: Value| {
        json!([{"type": "function", "function": {"name": "f", "strict": true,
                                                  "parameters": parameters}}])
    };
    for (body, param) in [
        (
            chat(json_schema(&json!({"type": "nonsense"})), 1, 1),
            "response_format",
        ),
        (
            chat(json_schema(&json!({"if": {"type": "string"}})), 1, 1),
            "response_format",
        ),
        (
            chat(json!({"type": "json_schema"}), 1, 1),
            "response_format.json_schema",
        ),
        (chat(json!({"type": "xml"}), 1, 1), "response_format.type"),
        (chat(json!("json"), 1, 1), "response_format"),
        (
            json!({"prompt": "x", "response_format": {"type": "json_object"}, "ignore_eos": true}),
            "ignore_eos",
        ),
        (
            {
                let mut b = chat(Value::Null, 1, 1);
                b["tools"] = strict_tool(json!({"type": "object"}));
                b["tool_choice"] = "required".into();
                b["ignore_eos"] = true.into();
                b
            },
            "ignore_eos",
        ),
        (
            {
                let mut b = chat(Value::Null, 1, 1);
                b["tools"] =
                    strict_tool(json!({"type": "object", "properties": {"x": {"type": 5}}}));
                b
            },
            "tools[0].function.parameters",
        ),
    ] {
        let path = if body.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{body}: {}", r.body);
    }
}
