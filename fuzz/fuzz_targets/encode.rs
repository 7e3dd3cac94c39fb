//! `cargo +nightly fuzz run encode`: any &str (arbitrary bytes read lossily) encodes with the real
//! Qwen3 tokenizer without panicking, and decodes back to its normalized text when it holds no
//! added token. Needs `models/qwen3-0.6b.tokenizer.bin` (see docs/tokenizer.md), or set
//! PQ_TOKENIZER to a tokenizer file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwen3_inference::tokenizer::Tokenizer;
use std::sync::OnceLock;

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("PQ_TOKENIZER")
            .unwrap_or_else(|_| "../models/qwen3-0.6b.tokenizer.bin".into());
        Tokenizer::open(std::path::Path::new(&path)).expect("tokenizer file for the fuzzer")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tok = tok();
    let ids = tok.encode(&text);
    let back = tok.decode(&ids, false).expect("ids from encode are in range");
    if !tok.added_tokens().iter().any(|t| text.contains(t.content.as_str())) {
        assert_eq!(back, tok.normalize(&text));
    }
});
