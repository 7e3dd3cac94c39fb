//! `/v1/embeddings` against sentence-transformers, through the server's routes (in process:
//! tests/common), on an f32 export of `fixtures/models/tiny-qwen3-embedding`: a tiny random
//! Qwen3-Embedding in the hub's layout (a bare `Qwen3Model`, a tokenizer that appends
//! `<|endoftext|>`, sentence-transformers' pooling files), whose reference.json holds
//! `SentenceTransformer(...).encode` of its texts (scripts/make_embedding_fixture.py). Ollama's
//! `/api/embed` gives the same vectors.

mod common;

use base64::Engine as _;
use common::Server;
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, fixture_json, tempdir};
use serde_json::{json, Value};

const NAME: &str = "tiny-qwen3-embedding";

fn reference() -> Value {
    fixture_json(NAME, "reference.json")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Cosine >= 0.99999 and every value within 1e-4 of sentence-transformers'.
fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let dot: f64 = got.iter().zip(want).map(|(a, b)| a * b).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cos = dot / (norm(got) * norm(want));
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        cos >= 0.99999 && max <= 1e-4,
        "{what}: cosine {cos}, max diff {max}"
    );
}

fn vectors(r: &Value) -> Vec<Vec<f64>> {
    let data = r["data"].as_array().unwrap();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
    }
    data.iter().map(|d| floats(&d["embedding"])).collect()
}

/// Texts alone and in one request, token ids, the empty string and a query with its instruction
/// give sentence-transformers' vectors; an input's vector is the same alone or among others;
/// usage counts the tokens.
#[test]
fn embeddings_equal_sentence_transformers() {
    let refr = reference();
    let dir = tempdir("pq-embed", "st");
    let m = export_fixture(NAME, &dir, DType::F32, 0);
    let s = Server::start(&m, &[]);
    let cases = refr["cases"].as_array().unwrap();
    let mut alone = vec![];
    for c in cases {
        let r = s.post("/v1/embeddings", &json!({"input": c["text"]}));
        assert_eq!(r.status, 200, "{}", r.body);
        let r = r.json();
        let v = vectors(&r).remove(0);
        assert_close(&v, &floats(&c["embedding"]), c["text"].as_str().unwrap());
        assert_eq!(
            r["usage"]["prompt_tokens"],
            c["ids"].as_array().unwrap().len()
        );
        // The ids the tokenizer gave (the appended <|endoftext|> included), used as given.
        let by_ids = vectors(&s.post("/v1/embeddings", &json!({"input": c["ids"]})).json());
        assert_eq!(by_ids[0], v, "{}", c["text"]);
        alone.push(v);
    }
    let texts: Vec<&Value> = cases.iter().map(|c| &c["text"]).collect();
    let r = s.post("/v1/embeddings", &json!({"input": texts, "model": "x"}));
    assert_eq!(r.status, 404, "a model the server does not run");
    let r = s.post("/v1/embeddings", &json!({"input": texts})).json();
    let together = vectors(&r);
    for (i, c) in cases.iter().enumerate() {
        assert_close(&together[i], &floats(&c["in_batch"]), "in a batch");
        assert_eq!(
            together[i], alone[i],
            "input {i}: alone and together differ"
        );
    }
    let total: usize = cases
        .iter()
        .map(|c| c["ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(r["usage"]["prompt_tokens"], total);
    // Ollama's /api/embed: the same vectors; /api/show says what the model can do.
    let name = m.file_stem().unwrap().to_str().unwrap();
    let o = s.post("/api/embed", &json!({"model": name, "input": texts}));
    assert_eq!(o.status, 200, "{}", o.body);
    let o = o.json();
    let got: Vec<Vec<f64>> = o["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(got, together);
    assert_eq!(o["prompt_eval_count"], total);
    let show = s.post("/api/show", &json!({"model": name})).json();
    assert_eq!(show["capabilities"], json!(["embedding"]));
    let ids: Vec<&Value> = cases.iter().map(|c| &c["ids"]).collect();
    assert_eq!(
        vectors(&s.post("/v1/embeddings", &json!({"input": ids})).json()),
        together
    );
    // The empty string is its tokenizer's: just <|endoftext|>.
    let e = &refr["empty"];
    let v = vectors(&s.post("/v1/embeddings", &json!({"input": ""})).json()).remove(0);
    assert_close(&v, &floats(&e["embedding"]), "the empty string");
    // A query with the instruction the client prepends (sentence-transformers' prompt_name).
    let q = &refr["query"];
    let text = format!(
        "{}{}",
        q["prompt"].as_str().unwrap(),
        q["text"].as_str().unwrap()
    );
    let v = vectors(&s.post("/v1/embeddings", &json!({"input": text})).json()).remove(0);
    assert_close(&v, &floats(&q["embedding"]), "the query");
}

/// `dimensions` keeps the first N values at length 1; `encoding_format: "base64"` is the
/// little-endian f32 bytes of the same vector; bad input is a 400 naming the field.
#[test]
fn dimensions_base64_and_bad_input() {
    let refr = reference();
    let dir = tempdir("pq-embed", "formats");
    let m = export_fixture(NAME, &dir, DType::F32, 0);
    let s = Server::start(&m, &["--context", "64"]);
    let c = &refr["cases"][0];
    let want = floats(&c["embedding"]);
    let r = s.post(
        "/v1/embeddings",
        &json!({"input": c["text"], "dimensions": 16}),
    );
    let v = vectors(&r.json()).remove(0);
    let norm = want[..16].iter().map(|x| x * x).sum::<f64>().sqrt();
    let cut: Vec<f64> = want[..16].iter().map(|x| x / norm).collect();
    assert_close(&v, &cut, "dimensions 16");
    let float = vectors(
        &s.post("/v1/embeddings", &json!({"input": c["text"]}))
            .json(),
    )
    .remove(0);
    let r = s
        .post(
            "/v1/embeddings",
            &json!({"input": c["text"], "encoding_format": "base64"}),
        )
        .json();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    // The JSON numbers are the shortest decimals of the same f32 values.
    let float: Vec<f32> = float.iter().map(|&x| x as f32).collect();
    assert_eq!(decoded, float);
    let long: Vec<u32> = (0..100).map(|i| i % 400).collect();
    for (body, param, what) in [
        (json!({}), "input", "required"),
        (json!({"input": []}), "input", "empty"),
        (
            json!({"input": [[1, 2], []]}),
            "input",
            "input 1 has no tokens",
        ),
        (json!({"input": long}), "input", "context holds 64"),
        (json!({"input": [-1]}), "input", "integers from 0"),
        (
            json!({"input": "a", "dimensions": 0}),
            "dimensions",
            "1 ..= 64",
        ),
        (
            json!({"input": "a", "dimensions": 65}),
            "dimensions",
            "1 ..= 64",
        ),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            "base64",
        ),
    ] {
        let r = s.post("/v1/embeddings", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"], param, "{body}");
        assert!(e["message"].as_str().unwrap().contains(what), "{body}: {e}");
    }
    // Generation from an embedding model, and embeddings from a generation model.
    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("embedding model"), "{}", r.body);
    let g = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let gs = Server::start(&g, &[]);
    let r = gs.post("/v1/embeddings", &json!({"input": "Hi"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("text generation model"), "{}", r.body);
    let _ = std::fs::remove_dir_all(&dir);
}
