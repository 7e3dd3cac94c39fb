//! Images through the HTTP API, as clients send them: OpenAI's `image_url` content parts with
//! `data:` URLs on `/v1/chat/completions`, Ollama's `images` on `/api/chat` and
//! `/api/generate`, against transformers' greedy tokens on the tiny Qwen3.5 that sees images
//! (fixtures/models/tiny-qwen3_5-vl-f32) and the tiny Qwen3-VL (tiny-qwen3-vl-f32, DeepStack);
//! `/api/show` lists `vision`, `/metrics` counts images, and bad images get a 400 that names
//! them.

mod common;

use base64::Engine as _;
use common::Server;
use qwen3_inference::format::DType;
use qwen3_inference::tokenizer::Tokenizer;
use qwen3_test_support::web::{Reply, WebHost};
use qwen3_test_support::{export_fixture, fixture, fixture_json, tempdir};
use serde_json::{json, Value};
use std::path::PathBuf;

const NAME: &str = "tiny-qwen3_5-vl-f32";
const QWEN3_VL: &str = "tiny-qwen3-vl-f32";

fn model(fixture_name: &str, test: &str) -> PathBuf {
    export_fixture(fixture_name, &tempdir("pq-vision", test), DType::F32, 0)
}

fn reference(fixture_name: &str) -> Value {
    fixture_json(fixture_name, "images-reference.json")
}

/// The fixture's image `name` as base64 (both fixtures hold the same images).
fn b64(name: &str) -> String {
    let bytes = std::fs::read(fixture(NAME).join("images").join(name)).unwrap();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A reference chat case's messages with each `{"type": "image"}` part an `image_url` data URL
/// of the case's images, in order.
fn openai_messages(case: &Value) -> Value {
    let mut images = case["images"].as_array().unwrap().iter();
    let mut messages = case["messages"].clone();
    for m in messages.as_array_mut().unwrap() {
        if let Some(parts) = m["content"].as_array_mut() {
            for p in parts {
                if p["type"] == "image" {
                    let url = format!(
                        "data:image/png;base64,{}",
                        b64(images.next().unwrap().as_str().unwrap())
                    );
                    *p = json!({"type": "image_url", "image_url": {"url": url, "detail": "auto"}});
                }
            }
        }
    }
    messages
}

/// Each answer token's bytes, from OpenAI's `logprobs.content` (the reasoning's first: the
/// template opens `<think>`, so this random model's answer stays in it).
fn answer_bytes(v: &Value) -> Vec<Vec<u8>> {
    let lp = &v["choices"][0]["logprobs"];
    let mut out = Vec::new();
    for key in ["reasoning_content", "content"] {
        for t in lp[key].as_array().into_iter().flatten() {
            out.push(serde_json::from_value(t["bytes"].clone()).unwrap());
        }
    }
    out
}

#[test]
fn chat_completions_with_images_answer_as_transformers() {
    for name in [NAME, QWEN3_VL] {
        chat_completions_answer_as_transformers(name);
    }
}

fn chat_completions_answer_as_transformers(name: &str) {
    let m = model(name, &format!("openai-{name}"));
    let tok = Tokenizer::open(&m.with_extension("tokenizer.bin")).unwrap();
    let s = Server::start(&m, &["--context", "256", "--model-name", "m"]);
    for case in reference(name)["cases"].as_array().unwrap() {
        if case["messages"].is_null() {
            continue;
        }
        let greedy: Vec<u32> = serde_json::from_value(case["greedy"].clone()).unwrap();
        let r = s.post(
            "/v1/chat/completions",
            &json!({"messages": openai_messages(case), "temperature": 0, "max_tokens": greedy.len(),
                    "logprobs": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        eprintln!("{name} {}: {v}", case["name"]);
        let want: Vec<Vec<u8>> = greedy
            .iter()
            .map(|&t| tok.token_bytes(t).unwrap().to_vec())
            .collect();
        let got = answer_bytes(&v);
        assert!(!got.is_empty());
        assert_eq!(got[..], want[..got.len()], "{name} {}", case["name"]);
        let prompt = case["input_ids"].as_array().unwrap().len() as u64;
        assert_eq!(
            v["usage"]["prompt_tokens"], prompt,
            "image tokens are prompt tokens"
        );
    }
}

/// Ollama's `images` on `/api/chat` and `/api/generate`: the same tokens as OpenAI's route for
/// the same conversation; `/api/show` lists `vision`; `/metrics` counts the images.
#[test]
fn ollama_images_answer_as_openai_does() {
    let m = model(NAME, "ollama");
    let s = Server::start(&m, &["--context", "256", "--model-name", "m"]);
    let reference = reference(NAME);
    let case = &reference["cases"][3];
    let text = case["messages"][0]["content"][1]["text"].as_str().unwrap();
    let image = b64(case["images"][0].as_str().unwrap());
    let openai = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": openai_messages(case), "temperature": 0, "max_tokens": 8}),
        )
        .json();
    let want = openai["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    let options = json!({"temperature": 0, "num_predict": 8});
    let chat = s.post(
        "/api/chat",
        &json!({"model": "m", "stream": false, "options": options,
                "messages": [{"role": "user", "content": text, "images": [image]}]}),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    let chat = chat.json();
    let said = |m: &Value| {
        format!(
            "{}{}",
            m["thinking"].as_str().unwrap_or(""),
            m["content"].as_str().unwrap_or("")
        )
    };
    assert_eq!(said(&chat["message"]), want, "{chat}");
    assert_eq!(chat["prompt_eval_count"], 31);
    let generate = s.post(
        "/api/generate",
        &json!({"model": "m", "stream": false, "options": options, "prompt": text,
                "images": [image]}),
    );
    assert_eq!(generate.status, 200, "{}", generate.body);
    let g = generate.json();
    assert_eq!(
        format!(
            "{}{}",
            g["thinking"].as_str().unwrap_or(""),
            g["response"].as_str().unwrap_or("")
        ),
        want,
        "{g}"
    );
    let show = s.post("/api/show", &json!({"model": "m"})).json();
    assert!(
        show["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("vision")),
        "{show}"
    );
    let metrics = s.get("/metrics").body;
    let images = metrics
        .lines()
        .find(|l| l.starts_with("qwen3_images_total "))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert_eq!(images, "qwen3_images_total 3");
}

/// Bad images, and images where they cannot go: a 400 with OpenAI's error object naming the
/// part, never a panic; the server answers the next request.
#[test]
fn bad_images_are_refused_by_name() {
    let m = model(NAME, "refused");
    let s = Server::start(&m, &["--context", "256", "--model-name", "m"]);
    let png = std::fs::read(fixture(NAME).join("images/rgb-64x96.png")).unwrap();
    let enc = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let with = |url: String| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": url}}]}], "max_tokens": 2})
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            with(format!(
                "data:image/png;base64,{}",
                enc(&png[..png.len() / 2])
            )),
            "messages[0].content[1]",
        ),
        (
            with(format!(
                "data:image/png;base64,{}",
                enc(b"not an image at all")
            )),
            "messages[0].content[1]",
        ),
        (
            with(format!("data:image/svg+xml;base64,{}", enc(b"<svg/>"))),
            "SVG",
        ),
        (with("data:image/png,raw-bytes".into()), "not base64"),
        (with("data:image/png;base64,@@@@".into()), "base64"),
        // Not fetched without --fetch-image-urls (images_are_fetched_when_told: with it).
        (
            with("https://example.com/cat.png".into()),
            "--fetch-image-urls",
        ),
        (with("cat.png".into()), "data URL"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", enc(&png))}}]}],
                   "max_tokens": 2}),
            "user messages only",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}]}),
            "a content part is text",
        ),
    ];
    for (body, want) in cases {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{want}: {}", r.body);
        let e = r.error();
        let said = format!("{} {}", e["message"], e["param"]);
        assert!(said.contains(want), "{want}: {said}");
    }
    let r = s.post(
        "/api/chat",
        &json!({"model": "m", "stream": false,
        "messages": [{"role": "user", "content": "hi", "images": ["%%%"]}]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("base64"), "{}", r.body);
    let ok = s.post(
        "/v1/chat/completions",
        &with(format!("data:image/png;base64,{}", enc(&png))),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);

    // The server's own limits: images a request, pixels an image.
    let two = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", enc(&png))}},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", enc(&png))}},
        {"type": "text", "text": "Which?"}]}], "max_tokens": 2});
    let limited = Server::start(
        &m,
        &[
            "--context",
            "256",
            "--max-images",
            "1",
            "--max-image-pixels",
            "6000",
        ],
    );
    let r = limited.post("/v1/chat/completions", &two);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.error()["message"]
            .as_str()
            .unwrap()
            .contains("--max-images"),
        "{}",
        r.body
    );
    // The fixture's image, refused by a server's limit: the 400's error and its body.
    let refused = |server: &Server| {
        let r = server.post(
            "/v1/chat/completions",
            &with(format!("data:image/png;base64,{}", enc(&png))),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        (r.error(), r.body)
    };
    // The fixture's image is 64 x 96 = 6144 pixels.
    let (e, body) = refused(&limited);
    assert_eq!(e["param"], "messages[0].content[1]", "{body}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("over the limit of 6000"), "{body}");

    // And bytes an image (`--max-image-bytes`): one byte over is a 400 naming the limit.
    let small = (png.len() - 1).to_string();
    let limited = Server::start(&m, &["--context", "256", "--max-image-bytes", &small]);
    let (e, body) = refused(&limited);
    assert_eq!(e["param"], "messages[0].content[1].image_url", "{body}");
    let over = format!("the image is over {small} bytes");
    assert!(e["message"].as_str().unwrap().contains(&over), "{body}");

    // A text-only model refuses an image by name.
    let text_model = export_fixture(
        "tiny-qwen3_5-bf16",
        &tempdir("pq-vision", "text"),
        DType::F32,
        0,
    );
    let t = Server::start(&text_model, &["--context", "256", "--model-name", "m"]);
    let r = t.post(
        "/v1/chat/completions",
        &with(format!("data:image/png;base64,{}", enc(&png))),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.error();
    assert_eq!(e["param"], "messages[0].content[1]");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("does not take images"),
        "{e}"
    );
    let show = t.post("/api/show", &json!({"model": "m"})).json();
    assert!(!show["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("vision")));
}

/// A web server on a loopback port for the fetch test: `/cat.png` the fixture's image,
/// `/moved.png` a redirect to it, `/big.png` a header announcing 30 MiB, `/huge.png` 21 MiB
/// without a length, `/drawing.svg` an SVG, anything else a 404. Serves until dropped.
fn image_host(png: Vec<u8>) -> WebHost {
    let huge = vec![0u8; 21 << 20];
    WebHost::start(move |r| match r.path.as_str() {
        "/cat.png" => Reply::new("200 OK", png.clone()).header("content-type", "image/png"),
        "/moved.png" => Reply::new("302 Found", "").header("location", "/cat.png"),
        "/big.png" => Reply::new("200 OK", "")
            .header("content-type", "image/png")
            .length(Some(30 << 20)),
        // No length said: the cap applies while the body is read.
        "/huge.png" => Reply::new("200 OK", huge.clone())
            .header("content-type", "image/png")
            .length(None),
        "/drawing.svg" => Reply::new("200 OK", "<svg/>").header("content-type", "image/svg+xml"),
        _ => Reply::new("404 Not Found", ""),
    })
}

/// `--fetch-image-urls`: an `http` image URL is fetched (redirects followed) and answered as
/// the same image sent as a data URL; a URL that answers 404, is over 20 MiB (said or not) or is
/// an SVG gets a 400 naming the part and the URL's problem.
#[test]
#[cfg_attr(
    not(feature = "fetch"),
    ignore = "qwen3-server built without the `fetch` feature (cargo test --workspace has it)"
)]
fn images_are_fetched_when_told() {
    let m = model(NAME, "fetch");
    let s = Server::start(&m, &["--context", "256", "--fetch-image-urls"]);
    let png = std::fs::read(fixture(NAME).join("images/rgb-64x96.png")).unwrap();
    let host = image_host(png);
    let ask = |url: String| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is it?"}]}], "max_tokens": 4, "temperature": 0})
    };
    let answer = |body: &Value| {
        let r = s.post("/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["message"].clone()
    };
    let inline = answer(&ask(format!(
        "data:image/png;base64,{}",
        b64("rgb-64x96.png")
    )));
    for path in ["cat.png", "moved.png"] {
        let fetched = answer(&ask(format!("{}/{path}", host.url())));
        assert_eq!(fetched, inline, "{path}");
    }
    for (path, want) in [
        ("gone.png", "HTTP 404"),
        ("big.png", "over 20 MiB"),
        ("huge.png", "over 20 MiB"),
        ("drawing.svg", "SVG"),
    ] {
        let r = s.post(
            "/v1/chat/completions",
            &ask(format!("{}/{path}", host.url())),
        );
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        let e = r.error();
        let said = format!("{} {}", e["message"], e["param"]);
        assert!(said.contains(want), "{path}: {said}");
        assert!(said.contains("messages[0].content[0]"), "{path}: {said}");
    }
}
