//! `GET /metrics` through the server's router (in process, tests/common): after known traffic, the counters, histograms and
//! gauges say what happened (requests by route and status, tokens, latencies, batch sizes, the
//! prefix cache), in Prometheus' text format; the API key guards it as it guards the API.

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::json;
use std::collections::HashMap;

/// The samples of a Prometheus text page: `name{labels}` -> value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn metrics_count_the_traffic() {
    let dir = tempdir("pq-metrics", "count");
    let m = export_fixture("tiny-qwen3-fullvocab", &dir, DType::F32, 0);
    let s = Server::start(&m, &["--parallel", "2"]);
    let mut prompt = 0.0;
    let mut generated = 0.0;
    let mut tokens_per_answer = vec![];
    let mut add = |v: &serde_json::Value| {
        prompt += v["usage"]["prompt_tokens"].as_f64().unwrap();
        let g = v["usage"]["completion_tokens"].as_f64().unwrap();
        generated += g;
        tokens_per_answer.push(g);
    };
    for p in ["The capital of France is", "Once upon a time"] {
        add(&s
            .post(
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": 5, "temperature": 0}),
            )
            .json());
    }
    // The same conversation twice: the second finds its prompt in a slot's cache.
    let chat =
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0});
    add(&s.post("/v1/chat/completions", &chat).json());
    let again = s.post("/v1/chat/completions", &chat).json();
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    add(&again);
    // A streamed one, counted when it ends.
    let streamed = json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": true,
                              "stream_options": {"include_usage": true}});
    let events = s.post("/v1/completions", &streamed).events();
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    add(&usage);
    // A bad request.
    assert_eq!(
        s.post("/v1/completions", &json!({"prompt": "x", "temperature": 9}))
            .status,
        400
    );

    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let m = samples(&r.body);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in\n{}", r.body));
    assert_eq!(
        get(r#"qwen3_requests_total{route="/v1/completions",status="200"}"#),
        3.0
    );
    assert_eq!(
        get(r#"qwen3_requests_total{route="/v1/chat/completions",status="200"}"#),
        2.0
    );
    assert_eq!(
        get(r#"qwen3_requests_total{route="/v1/completions",status="400"}"#),
        1.0
    );
    assert_eq!(get("qwen3_prompt_tokens_total"), prompt);
    assert_eq!(get("qwen3_generation_tokens_total"), generated);
    // One first token per answer, and a gap between every two tokens of an answer.
    assert_eq!(
        get("qwen3_time_to_first_token_seconds_count"),
        tokens_per_answer.len() as f64
    );
    let gaps: f64 = tokens_per_answer.iter().map(|t| t - 1.0).sum();
    assert_eq!(get("qwen3_inter_token_latency_seconds_count"), gaps);
    assert_eq!(
        get(r#"qwen3_inter_token_latency_seconds_bucket{le="+Inf"}"#),
        gaps
    );
    assert!(get("qwen3_step_sequences_count") >= generated / 2.0);
    assert_eq!(get("qwen3_prefix_cache_hits_total"), 1.0);
    assert!(get("qwen3_prefix_cache_tokens_total") > 0.0);
    assert_eq!(get("qwen3_queued_requests"), 0.0);
    assert_eq!(get("qwen3_running_sequences"), 0.0);
    // Nothing runs: no position is in use, though the slots keep their prefix caches.
    assert_eq!(get("qwen3_kv_cache_usage_ratio"), 0.0);
    // The two slots keep their last sequences (the prefix cache): f32 keys and values of the
    // fixture, 2 layers x 2 kv heads x 16 dims x 2 x 4 bytes = 512 bytes a position.
    let kv = get("qwen3_kv_cache_bytes");
    assert!(kv > 0.0 && kv % 512.0 == 0.0, "{kv}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_api_key_guards_metrics() {
    let dir = tempdir("pq-metrics", "key");
    let m = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let s = Server::start(&m, &["--api-key", "sekrit"]);
    assert_eq!(s.get("/metrics").status, 401);
    let r = s.http(
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sekrit")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert!(r.body.contains("# TYPE qwen3_requests_total counter"));

    // With --public-metrics a scraper that sends no key reads them; the API still wants it.
    let s = Server::start(&m, &["--api-key", "sekrit", "--public-metrics"]);
    assert_eq!(s.get("/metrics").status, 200);
    assert_eq!(s.get("/v1/models").status, 401);
    std::fs::remove_dir_all(dir).unwrap();
}
