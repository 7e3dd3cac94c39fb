//! `cargo bench -p qwen3-inference --bench tokenizer`: how fast the tokenizer file loads and how
//! fast ~1 MB of mixed prose, code and CJK/multilingual text encodes, on one thread.
//!
//! The text is built from material committed in the repo (docs and READMEs, the Rust and Python
//! sources, the multilingual texts of the HF reference cases), each third cycled to 1/3 MB, and
//! written to `target/tokenizer-bench.txt` so `scripts/bench_tokenizer.py` can time HuggingFace
//! `tokenizers` on the very same bytes (it runs this bench first).

use qwen3_export::hf::tokenizer_json::export_tokenizer;
use qwen3_inference::tokenizer::{StreamDecoder, Tokenizer, TokenizerData};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

const TARGET_BYTES: usize = 1 << 20;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// All files under `dir` with extension `ext`, sorted, concatenated.
fn files(dir: &Path, ext: &str, out: &mut String) {
    let mut entries: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => return,
    };
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|e| e == ext) {
            if let Ok(s) = std::fs::read_to_string(&p) {
                out.push_str(&s);
                out.push('\n');
            }
        }
    }
}

/// `s` repeated until it is at least `n` bytes, then cut at a char boundary at or after `n`.
fn cycle_to(s: &str, n: usize) -> String {
    assert!(!s.is_empty());
    let mut out = String::with_capacity(n + 8);
    while out.len() < n {
        out.push_str(s);
    }
    let mut cut = n;
    while !out.is_char_boundary(cut) {
        cut += 1;
    }
    out.truncate(cut);
    out
}

fn corpus() -> String {
    let root = repo();
    let mut prose = String::new();
    files(&root.join("docs"), "md", &mut prose);
    for f in [
        "README.md",
        "models/README.md",
        "fixtures/tokenizer/README.md",
    ] {
        prose.push_str(&std::fs::read_to_string(root.join(f)).unwrap_or_default());
    }
    let mut code = String::new();
    for d in ["qwen3-inference/src", "qwen3-export/src", "qwen3-cli/src"] {
        files(&root.join(d), "rs", &mut code);
    }
    files(&root.join("scripts"), "py", &mut code);
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("fixtures/tokenizer/tokenizer-cases-dev.json")).unwrap(),
    )
    .unwrap();
    let mut multi = String::new();
    for c in cases["cases"].as_array().unwrap() {
        let cat = c["category"].as_str().unwrap();
        if [
            "cjk",
            "arabic_hebrew",
            "indic_thai",
            "emoji",
            "combining_nfc",
        ]
        .contains(&cat)
        {
            multi.push_str(c["text"].as_str().unwrap());
            multi.push('\n');
        }
    }
    let third = TARGET_BYTES / 3;
    let mut text = cycle_to(&prose, third);
    text.push_str(&cycle_to(&code, third));
    text.push_str(&cycle_to(&multi, TARGET_BYTES - text.len()));
    text
}

/// Median seconds of `reps` runs of `f`.
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[reps / 2]
}

fn main() {
    let target = repo().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let tok_path = target.join("tokenizer-bench.tokenizer.bin");
    export_tokenizer(&repo().join("fixtures/tokenizer"), &tok_path, 151936).unwrap();
    let file_len = std::fs::metadata(&tok_path).unwrap().len();

    let load = median(21, || {
        black_box(Tokenizer::open(&tok_path).unwrap());
    });
    let read = median(21, || {
        black_box(std::fs::read(&tok_path).unwrap());
    });
    let bytes = std::fs::read(&tok_path).unwrap();
    let parse = median(21, || {
        black_box(TokenizerData::from_bytes(&bytes).unwrap());
    });
    println!(
        "load      {:.2} ms  ({:.1} MB tokenizer file: read {:.2} ms, parse and check {:.2} ms; \
         median of 21)",
        load * 1e3,
        file_len as f64 / 1e6,
        read * 1e3,
        parse * 1e3
    );

    let tok = Tokenizer::open(&tok_path).unwrap();
    let text = corpus();
    std::fs::write(target.join("tokenizer-bench.txt"), &text).unwrap();
    let ids = tok.encode(&text);
    // For scripts/bench_tokenizer.py to check that HF produces the same ids.
    std::fs::write(
        target.join("tokenizer-bench.ids.json"),
        serde_json::to_string(&ids).unwrap(),
    )
    .unwrap();
    let mb = text.len() as f64 / 1e6;

    let enc = median(7, || {
        black_box(tok.encode(black_box(&text)));
    });
    println!(
        "encode    {:.1} MB/s  {:.2} M tokens/s  ({} bytes -> {} tokens, {:.1} ms, median of 7)",
        mb / enc,
        ids.len() as f64 / enc / 1e6,
        text.len(),
        ids.len(),
        enc * 1e3
    );

    let dec = median(7, || {
        black_box(tok.decode(black_box(&ids), false).unwrap());
    });
    println!("decode    {:.1} MB/s  ({:.1} ms)", mb / dec, dec * 1e3);
    let stream = median(7, || {
        let mut d = StreamDecoder::new(&tok);
        let mut n = 0;
        for &id in &ids {
            n += d.push(id).len();
        }
        black_box(n + d.finish().len());
    });
    println!(
        "stream    {:.1} MB/s  ({:.1} ms, one push per token)",
        mb / stream,
        stream * 1e3
    );
    println!("text      {}", target.join("tokenizer-bench.txt").display());
}
