//! The shared fields' and the messages' checks.

use super::chat::chat_messages;
use super::*;
use crate::images::{ImageRules, ImageSource};
use serde_json::json;

/// The server's default image rules: no fetching, OpenAI's 20 MiB an image.
const RULES: ImageRules = ImageRules {
    fetch: false,
    max_bytes: crate::images::MAX_IMAGE_BYTES,
};

/// An image over `--max-image-bytes` is a 400 naming its part and the limit, whether its
/// base64 already says so or only its decoded bytes do; one at the limit is taken.
#[test]
fn images_over_the_byte_limit_are_refused() {
    use base64::Engine as _;
    let with = |bytes: usize, max_bytes: usize| {
        let data = base64::engine::general_purpose::STANDARD.encode(vec![7u8; bytes]);
        let url = format!("data:image/png;base64,{data}");
        let messages = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what?"}]}]});
        let rules = ImageRules {
            fetch: false,
            max_bytes,
        };
        chat_messages(&messages, rules)
    };
    let (_, _, images) = with(100, 100).unwrap();
    assert!(matches!(&images[0].source, ImageSource::Bytes(b) if b.len() == 100));
    for (bytes, max) in [(101, 100), (1000, 100)] {
        let e = with(bytes, max).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url"));
        assert!(
            e.message.contains("the image is over 100 bytes"),
            "{}",
            e.message
        );
    }
    let e = with(3 << 20, 2 << 20).unwrap_err();
    assert!(
        e.message.contains("the image is over 2 MiB"),
        "{}",
        e.message
    );
    // No limit to speak of: nothing overflows.
    assert!(with(100, usize::MAX).is_ok());
    // Base64 wrapped in lines of 76, as MIME writes it, at the limit: the line breaks do not
    // count against it.
    let data = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 3000]);
    let lines: Vec<&str> = data
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let url = format!("data:image/png;base64,{}", lines.join("\r\n"));
    let messages = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]});
    let rules = ImageRules {
        fetch: false,
        max_bytes: 3000,
    };
    assert!(chat_messages(&messages, rules).is_ok());
}

fn p(v: Value) -> Result<Params, ApiError> {
    params(&v, &GenerationDefaults::default(), 1)
}

#[test]
fn fields_are_checked_and_named() {
    let e = p(json!({"temperature": "hot"})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
    let e = p(json!({"temperature": 3})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("temperature"));
    assert_eq!(p(json!({"n": 0})).unwrap_err().param.as_deref(), Some("n"));
    let e = p(json!({"max_tokens": -1})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("max_tokens"));
    let e = p(json!({"logit_bias": {"1": 5}})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("logit_bias"));
    // What clients send when they do not ask for these: accepted.
    p(json!({"logit_bias": {}, "suffix": "", "best_of": 1, "echo": false})).unwrap();
    let e = p(json!({"best_of": 2})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("best_of"));
    p(json!({"best_of": 2, "n": 2})).unwrap();
    // Integers written as numbers with no fraction.
    let ok = p(json!({"max_tokens": 4.0, "n": 2.0, "seed": 3.0, "top_k": 5.0})).unwrap();
    assert_eq!((ok.max_tokens, ok.n, ok.sampler.seed), (Some(4), 2, 3));
    assert_eq!(ok.sampler.top_k, 5);
    let e = p(json!({"max_tokens": 4.5})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
    assert_eq!(
        p(json!({"seed": 18446744073709551615u64}))
            .unwrap()
            .sampler
            .seed,
        u64::MAX
    );
    // top_p 0: greedy, as top-k 1.
    let g = p(json!({"top_p": 0})).unwrap();
    assert_eq!((g.sampler.top_k, g.sampler.top_p), (1, 1.0));
    let e = p(json!({"stop": [1]})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stop"));
    let ok = p(
        json!({"temperature": 0, "top_k": -1, "seed": -1, "stop": "x",
                      "stream": true, "stream_options": {"include_usage": true},
                      "frequency_penalty": 0.5, "whatever": 1}),
    )
    .unwrap();
    assert_eq!(ok.sampler.temperature, 0.0);
    assert_eq!(ok.sampler.top_k, 0);
    assert_eq!(ok.sampler.seed, u64::MAX);
    assert_eq!(ok.sampler.frequency_penalty, 0.5);
    assert_eq!(ok.stops, ["x"]);
    assert!(ok.include_usage);
}

#[test]
fn messages_are_checked() {
    let m = |v: Value| chat_messages(&json!({ "messages": v }), RULES);
    let e = m(json!([{"role": "wizard", "content": "hi"}])).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    let e = m(json!([{"role": "user", "content": 5}])).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    assert!(m(json!([])).is_err());
    let (ok, _, _) = m(json!([{"role": "developer", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]))
    .unwrap();
    assert_eq!(ok, [json!({"role": "system", "content": "ab"})]);
}

#[test]
fn logprobs_per_endpoint() {
    let lp = |v: Value, chat| logprobs(&v, chat).map_err(|e| e.param.unwrap_or_default());
    assert_eq!(lp(json!({}), true), Ok(None));
    assert_eq!(lp(json!({"logprobs": false}), true), Ok(None));
    assert_eq!(lp(json!({"logprobs": true}), true), Ok(Some(0)));
    assert_eq!(
        lp(json!({"logprobs": true, "top_logprobs": 20}), true),
        Ok(Some(20))
    );
    assert_eq!(
        lp(json!({"top_logprobs": 2}), true),
        Err("top_logprobs".into())
    );
    assert_eq!(
        lp(json!({"logprobs": true, "top_logprobs": 21}), true),
        Err("top_logprobs".into())
    );
    assert_eq!(lp(json!({"logprobs": 2}), true), Err("logprobs".into()));
    assert_eq!(lp(json!({}), false), Ok(None));
    assert_eq!(lp(json!({"logprobs": null}), false), Ok(None));
    assert_eq!(lp(json!({"logprobs": 0}), false), Ok(Some(0)));
    assert_eq!(lp(json!({"logprobs": 5}), false), Ok(Some(5)));
    assert_eq!(lp(json!({"logprobs": 21}), false), Err("logprobs".into()));
    assert_eq!(lp(json!({"logprobs": true}), false), Err("logprobs".into()));
}
