//! `/v1/rerank` against transformers: Qwen3-Reranker's recipe on the full-vocabulary fixture
//! (random weights, the real Qwen3 tokenizer), whose rerank.json holds transformers' scores of
//! each (query, document) pair, with the default instruction and another
//! (scripts/rerank_reference.py). Through the server's routes in process (tests/common).

mod common;

use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture_json, tempdir};
use serde_json::{json, Value};

const NAME: &str = "tiny-qwen3-fullvocab";

fn reference() -> Value {
    fixture_json(NAME, "rerank.json")
}

/// Every document's score equals transformers' (1e-4), the results come most relevant first
/// with their documents' indices, `top_n` keeps the best, `return_documents` adds the texts, and
/// `/rerank` is the same route.
#[test]
fn scores_equal_transformers() {
    let dir = tempdir("pq-rerank", "scores");
    let m = export_fixture(NAME, &dir, DType::F32, 0);
    let s = Server::start(&m, &["--rerank"]);
    for case in reference()["cases"].as_array().unwrap() {
        let want = case["results"].as_array().unwrap();
        let docs: Vec<&Value> = want.iter().map(|r| &r["document"]).collect();
        let mut body = json!({"query": case["query"], "documents": docs});
        if !case["instruction"].is_null() {
            body["instruction"] = case["instruction"].clone();
        }
        let r = s.post("/v1/rerank", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let r = r.json();
        let got = r["results"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        let mut last = f64::INFINITY;
        for g in got {
            let i = g["index"].as_u64().unwrap() as usize;
            let score = g["relevance_score"].as_f64().unwrap();
            let w = want[i]["score"].as_f64().unwrap();
            assert!((score - w).abs() < 1e-4, "document {i}: {score} vs {w}");
            assert!(score <= last, "not sorted");
            last = score;
        }
        let tokens: usize = want
            .iter()
            .map(|w| w["ids"].as_array().unwrap().len())
            .sum();
        assert_eq!(
            r["usage"]["prompt_tokens"], tokens,
            "the recipe's token count"
        );
        // top_n, return_documents, and the other path.
        body["top_n"] = 2.into();
        body["return_documents"] = true.into();
        let top = s.post("/rerank", &body).json();
        let top = top["results"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        for (t, g) in top.iter().zip(got) {
            assert_eq!(t["index"], g["index"]);
            let i = t["index"].as_u64().unwrap() as usize;
            assert_eq!(t["document"]["text"], want[i]["document"]);
        }
    }
    for (body, param) in [
        (json!({"documents": ["a"]}), "query"),
        (json!({"query": "q"}), "documents"),
        (json!({"query": "q", "documents": []}), "documents"),
        (
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            "top_n",
        ),
    ] {
        let r = s.post("/v1/rerank", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.error()["param"], param, "{body}");
    }
    // Without --rerank: a 400 that says how to get it.
    let plain = Server::start(&m, &[]);
    let r = plain.post("/v1/rerank", &json!({"query": "q", "documents": ["a"]}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--rerank"), "{}", r.body);
    let _ = std::fs::remove_dir_all(&dir);
}
