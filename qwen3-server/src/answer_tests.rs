//! The answer's JSON from the worker's updates (answer.rs's `Choices` and `Meta`), on a real
//! Qwen3 answer's tokens: a thinking answer that calls a tool, whole and streamed. (The fixture
//! models have random weights and never write a valid call, so the HTTP tests cannot show one.)

use super::*;
use crate::metrics::Metrics;
use qwen3_inference::format::GenerationDefaults;

/// The real Qwen3 tokenizer, written from the fixtures once for every test of this binary (tests
/// run side by side) and leaked, as the server leaks it.
fn tokenizer() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<&'static Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pq-answer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.tokenizer.bin");
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer");
        qwen3_export::hf::tokenizer_json::export_tokenizer(&fixtures, &path, 151936).unwrap();
        let tok = Box::leak(Box::new(Tokenizer::open(&path).unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
        tok
    })
}

/// The state the handlers would have.
fn state() -> Arc<AppState> {
    let tokenizer = tokenizer();
    let (commands, _rx) = std::sync::mpsc::channel();
    Arc::new(AppState {
        model_name: "m".into(),
        tokenizer,
        template: None,
        thinking_template: true,
        xml_tool_calls: false,
        eos_ids: vec![151645],
        chat_stop_ids: vec![151645],
        defaults: GenerationDefaults::default(),
        context_len: 4096,
        slots: 1,
        max_queue: 1,
        api_key: None,
        created: 0,
        commands,
        metrics: Arc::new(Metrics::default()),
        ui: false,
        grammars: crate::state::Grammars::new(151_936),
        body_timeout: std::time::Duration::from_secs(60),
        reranker: None,
        embeds: false,
        cors: vec![],
        info: Default::default(),
        images: None,
        draining: Default::default(),
        public_metrics: false,
        max_images: crate::images::MAX_IMAGES,
        max_image_pixels: qwen3_inference::vision::MAX_SOURCE_PIXELS,
        fetch_image_urls: false,
        max_image_bytes: crate::images::MAX_IMAGE_BYTES,
        draft: Default::default(),
    })
}

fn params() -> Params {
    crate::request::params(&json!({}), &GenerationDefaults::default(), 1).unwrap()
}

/// Runs `answer`'s tokens through `Choices` as the worker's updates, ending with an
/// end-of-sequence; returns the whole answer's JSON and the streamed chunks' choices.
fn answer(s: &Arc<AppState>, text: &str) -> (Value, Vec<Value>) {
    let job = Job {
        kind: Kind::Chat,
        prompts: vec![vec![1]],
        echo: false,
        reasoning: Some(false),
        stop_ids: vec![],
        logprobs: None,
        tool_calls: Some(qwen3_inference::chat::tool_calls::ToolCalls::default()),
        constraint: None,
        start: Instant::now(),
        images: None,
    };
    let meta = Meta {
        id: "chatcmpl-1".into(),
        created: 0,
        model: "m".into(),
        kind: Kind::Chat,
    };
    let mut ch = Choices::new(s, &job, &params(), vec![7]);
    let mut chunks = vec![];
    let ids = s.tokenizer.encode(text);
    let updates = ids
        .iter()
        .map(|&token| Update::Token {
            choice: 0,
            token,
            logprobs: None,
        })
        .chain([Update::Finished {
            choice: 0,
            reason: StopReason::Eos(151645),
            generated: ids.len() + 1,
        }]);
    for u in updates {
        ch.apply(u, s).unwrap();
        for (i, d, finish) in std::mem::take(&mut ch.out) {
            chunks.push(ch.streamed(&meta, i, &d, finish, s.tokenizer));
        }
    }
    let whole = meta.whole(&ch, &ch.usage(1), s.tokenizer);
    (whole, chunks)
}

#[test]
fn a_tool_call_answer_whole_and_streamed() {
    let s = state();
    let text = "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
    let (whole, chunks) = answer(&s, text);
    let c = &whole["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    let m = &c["message"];
    assert_eq!(m["content"], Value::Null);
    assert_eq!(m["reasoning_content"], "Need the weather.");
    let call = &m["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], r#"{"city": "Zürich"}"#);
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1);
    // Streamed: the call comes whole in one delta, with index 0; the last chunk says why.
    let with_calls: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["delta"].get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1, "{chunks:#?}");
    let d = &with_calls[0]["delta"]["tool_calls"][0];
    assert_eq!(d["index"], 0);
    assert_eq!(d["function"]["name"], "get_weather");
    assert_eq!(d["function"]["arguments"], r#"{"city": "Zürich"}"#);
    assert_eq!(chunks.last().unwrap()["finish_reason"], "tool_calls");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, "");
}

#[test]
fn an_answer_without_calls_keeps_its_content_and_stop() {
    let s = state();
    let (whole, _) = answer(&s, "Hello <b>there</b>.");
    let c = &whole["choices"][0];
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["message"]["content"], "Hello <b>there</b>.");
    assert!(c["message"].get("tool_calls").is_none());
}
