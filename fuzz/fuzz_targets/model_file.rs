//! `cargo +nightly fuzz run model_file`: the model-file header reader on arbitrary bytes. Seed the
//! corpus with a tiny model file (`qwen3 export fixtures/models/tiny-qwen3moe-bf16-tied m.bin`,
//! into fuzz/corpus/model_file/). Whatever parses must answer `active_weights` without panicking.
//! A bounded run of mutated files is part of `cargo test`
//! (qwen3-inference/tests/model_file_mutations.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwen3_inference::format::reader::Header;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::parse(data) {
        let _ = h.active_weights();
    }
});
