//! `cargo +nightly fuzz run tokenizer_file`: the tokenizer file reader on arbitrary bytes. Seed
//! the corpus with a small real file (the exported tokenizer of a tiny test checkpoint, ~9 KB,
//! in fuzz/corpus/tokenizer_file/). Whatever loads must encode and decode without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwen3_inference::tokenizer::{Tokenizer, TokenizerData};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = TokenizerData::from_bytes(data) {
        let tok = Tokenizer::from_data(d);
        let ids = tok.encode("Hello, 世界! <|im_start|>user 'll  \n\n 😀");
        let _ = tok.decode(&ids, false);
        let _ = tok.decode(&[0, 1, 255, u32::MAX], true);
    }
});
