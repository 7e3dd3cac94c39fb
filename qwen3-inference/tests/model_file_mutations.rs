//! The model-file reader (and the GGUF reader and the image decoder, last tests) on corrupted files: a bounded,
//! deterministic fuzz run on stable Rust.
//! (The coverage-guided target is fuzz/fuzz_targets/model_file.rs, for `cargo +nightly fuzz`.)
//!
//! Valid tiny files (dense f32, q4 with its finer tensors, every matrix in q6, Qwen3-MoE with
//! YaRN in bf16, and format version 9's GGUF-held storage: K-quant blocks, tiled value heads) are
//! mutated thousands of times, each time in a few ways a damaged or hostile file could be: bytes
//! of the header set to random values, a length or count field set to 0, 1, all ones or near the
//! file's size, the file cut short or grown. The reader must answer each with a value or an
//! error; a panic or an abort on a huge allocation fails the test. A mutated file that
//! still parses is opened from disk and every tensor viewed, which must not panic either.

use qwen3_inference::format::reader::Header;
use qwen3_inference::format::{DType, ModelFile};
use qwen3_inference::testing::lcg;
use qwen3_inference::testing::model::{moe_config, write_random, write_random_config};
use std::path::PathBuf;

const ITERATIONS: usize = 4000;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pq-mutations-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A random index below `n` from the test's generator.
fn below(seed: &mut u64, n: usize) -> usize {
    (((lcg(seed) + 1.0) * 0.5 * n as f32) as usize).min(n.saturating_sub(1))
}

/// `bytes` with one to four mutations, most of them inside the header (the first `header` bytes).
fn mutate(bytes: &[u8], header: usize, seed: &mut u64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + below(seed, 4) {
        if b.len() < 16 {
            break;
        }
        let header = header.min(b.len());
        match below(seed, 6) {
            // A random byte of the header.
            0 | 1 => {
                let i = below(seed, header);
                b[i] = below(seed, 256) as u8;
            }
            // A 4- or 8-byte field of the header (counts, lengths, offsets, shapes) set to a
            // value a reader must not trust.
            2 | 3 => {
                let len = b.len() as u64;
                let extremes = [
                    0,
                    1,
                    u32::MAX as u64,
                    u64::MAX,
                    len,
                    len + 1,
                    len - 1,
                    1 << 40,
                ];
                let v = extremes[below(seed, extremes.len())];
                let i = below(seed, header.saturating_sub(8)) & !3;
                if below(seed, 2) == 0 {
                    b[i..i + 4].copy_from_slice(&(v as u32).to_le_bytes());
                } else {
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            // Cut short, anywhere.
            4 => {
                let n = below(seed, b.len());
                b.truncate(n);
            }
            // Grown by a few bytes.
            _ => b.extend(std::iter::repeat_n(0xAB, 1 + below(seed, 100))),
        }
    }
    b
}

/// fixtures/gguf/`name`.gguf written as a model file, tensor by tensor as it opens (what
/// `qwen3 export FILE.gguf` writes).
fn as_model_file(name: &str) -> PathBuf {
    use qwen3_inference::format::writer::ModelWriter;
    let gguf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../fixtures/gguf/{name}.gguf"));
    let from = ModelFile::open(&gguf).unwrap();
    let specs = from.header().tensors.iter().map(|t| t.spec()).collect();
    let p = tmp(&format!("{name}.bin"));
    let mut w = ModelWriter::create(&p, from.config(), specs).unwrap();
    assert_eq!(w.version(), 9, "{name}");
    for t in &from.header().tensors {
        w.begin(&t.name, t.dtype).unwrap();
        w.data(from.tensor_bytes(&t.name).unwrap()).unwrap();
        w.end().unwrap();
    }
    w.finish().unwrap();
    p
}

#[test]
fn corrupted_model_files_give_errors_not_panics() {
    let files = [
        ("f32", {
            let p = tmp("f32.bin");
            write_random(&p, DType::F32);
            p
        }),
        ("q4", {
            let p = tmp("q4.bin");
            write_random(&p, DType::Q4);
            p
        }),
        ("q6", {
            let p = tmp("q6.bin");
            write_random(&p, DType::Q6);
            p
        }),
        ("moe-bf16", {
            let p = tmp("moe.bin");
            write_random_config(&p, &moe_config(DType::Bf16));
            p
        }),
        // Version 9: a Q4_K_M GGUF's blocks, and a Qwen3.5 GGUF's tiled value heads.
        ("q4_k_m", as_model_file("tiny-bf16-tied-k256-q4_k_m")),
        ("qwen3_5-tiled", as_model_file("tiny-qwen3_5-bf16-q8_0")),
    ];
    let mut seed = 2026u64;
    let (mut refused, mut parsed, mut opened) = (0, 0, 0);
    for (name, path) in &files {
        let bytes = std::fs::read(path).unwrap();
        let header = Header::parse(&bytes).expect("the unmutated file parses");
        // The header and its padding end where the first tensor's data starts.
        let header_len = header.tensors.iter().map(|t| t.offset).min().unwrap() as usize;
        for _ in 0..ITERATIONS {
            let m = mutate(&bytes, header_len, &mut seed);
            match Header::parse(&m) {
                Err(e) => {
                    refused += 1;
                    assert!(!format!("{e:#}").is_empty(), "{name}: an empty error");
                }
                Ok(_) => {
                    parsed += 1;
                    // Still a valid header: open it as a file and view every tensor.
                    let p = tmp("mutated.bin");
                    std::fs::write(&p, &m).unwrap();
                    if let Ok(f) = ModelFile::open(&p) {
                        opened += 1;
                        for t in &f.header().tensors {
                            let _ = f.tensor(&t.name);
                        }
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(files[0].1.parent().unwrap()).unwrap();
    println!(
        "{refused} refused, {parsed} parsed ({opened} opened) of {} mutated files",
        files.len() * ITERATIONS
    );
    assert!(
        refused > ITERATIONS,
        "the mutations should mostly break the files"
    );
}

/// The GGUF reader on the same mutations of a GGUF file that gguf-py wrote
/// (fixtures/gguf/tiny-header.gguf): an error or a header, never a panic; a mutated file that
/// still parses is opened from disk and every tensor's bytes read.
#[test]
fn corrupted_gguf_files_give_errors_not_panics() {
    use qwen3_inference::gguf::{parse, GgufFile};
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/tiny-header.gguf");
    let bytes = std::fs::read(fixture).unwrap();
    let header_len = parse(&bytes).expect("the fixture parses").data_start as usize;
    let mut seed = 2027u64;
    let (mut refused, mut parsed) = (0, 0);
    // Its own file, outside the folder the other test removes when it ends.
    let path = std::env::temp_dir().join(format!("pq-gguf-mutated-{}.gguf", std::process::id()));
    for _ in 0..ITERATIONS {
        let m = mutate(&bytes, header_len, &mut seed);
        match parse(&m) {
            Err(e) => {
                refused += 1;
                assert!(!format!("{e:#}").is_empty(), "an empty error");
            }
            Ok(_) => {
                parsed += 1;
                std::fs::write(&path, &m).unwrap();
                let f = GgufFile::open(&path).unwrap();
                for t in &f.header().tensors {
                    assert_eq!(f.data(t).len() as u64, t.nbytes);
                }
            }
        }
    }
    std::fs::remove_file(&path).ok();
    println!("GGUF: {refused} refused, {parsed} parsed of {ITERATIONS} mutated files");
    assert!(
        refused > ITERATIONS / 2,
        "the mutations should mostly break the file"
    );
}

/// Whether the (GGUF) file at `path` opens as a model file, every tensor then viewed; if not,
/// its error is checked to say something. Neither may panic.
fn opens_as_a_model(path: &std::path::Path) -> bool {
    match ModelFile::open(path) {
        Err(e) => {
            assert!(!format!("{e:#}").is_empty(), "an empty error");
            false
        }
        Ok(f) => {
            for t in &f.header().tensors {
                let _ = f.tensor(&t.name);
            }
            true
        }
    }
}

/// llama.cpp's Q8_0 GGUF of a Qwen3.5 (fixtures/gguf/tiny-qwen3_5-bf16-q8_0.gguf), mutated as
/// above and opened as a model file: parsed, read as a model (names, pieces, the gated query's
/// rows, `ssm_a`), its Q8_0 blocks taken apart: an error or a model file, never a panic. Half the
/// mutations fall in its tensor directory and the metadata just before it (the rest of the header
/// is mostly the tokenizer's strings).
#[test]
fn corrupted_qwen3_5_ggufs_open_or_give_errors() {
    use qwen3_inference::gguf::parse;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf/tiny-qwen3_5-bf16-q8_0.gguf");
    let bytes = std::fs::read(fixture).unwrap();
    let data_start = parse(&bytes).expect("the fixture parses").data_start as usize;
    let directory = data_start.saturating_sub(12 << 10);
    let mut seed = 2028u64;
    let (mut refused, mut opened) = (0, 0);
    let path = std::env::temp_dir().join(format!("pq-qwen35-mutated-{}.gguf", std::process::id()));
    let iterations = ITERATIONS / 4;
    for i in 0..iterations {
        let m = match i % 2 {
            0 => mutate(&bytes, data_start, &mut seed),
            _ => {
                let mut m = bytes[..directory].to_vec();
                m.extend(mutate(
                    &bytes[directory..],
                    data_start - directory,
                    &mut seed,
                ));
                m
            }
        };
        std::fs::write(&path, &m).unwrap();
        match opens_as_a_model(&path) {
            true => opened += 1,
            false => refused += 1,
        }
    }
    std::fs::remove_file(&path).ok();
    println!("Qwen3.5 GGUF: {refused} refused, {opened} opened of {iterations} mutated files");
    assert!(
        refused > iterations / 2,
        "the mutations should mostly break the file"
    );
}

/// A GGUF file split in three parts (fixtures/gguf/split/) with its second part's header
/// mutated as above, opened from its first part as a model file: an error naming the part or a
/// model file, never a panic (a second part that claims other tensors, offsets or keys).
#[test]
fn a_corrupted_part_of_a_split_gguf_is_refused_or_opens() {
    use qwen3_inference::gguf::parse;
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/split");
    let name = |k: usize| format!("tiny-f32-tied-gqa2-q8_0-{k:05}-of-00003.gguf");
    let dir = std::env::temp_dir().join(format!("pq-split-mutated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for k in [1, 3] {
        std::fs::copy(fixtures.join(name(k)), dir.join(name(k))).unwrap();
    }
    let bytes = std::fs::read(fixtures.join(name(2))).unwrap();
    let data_start = parse(&bytes).expect("the fixture parses").data_start as usize;
    let mut seed = 2029u64;
    let (mut refused, mut opened) = (0, 0);
    let iterations = ITERATIONS / 4;
    for _ in 0..iterations {
        std::fs::write(dir.join(name(2)), mutate(&bytes, data_start, &mut seed)).unwrap();
        match opens_as_a_model(&dir.join(name(1))) {
            true => opened += 1,
            false => refused += 1,
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    println!("split GGUF: {refused} refused, {opened} opened of {iterations} mutated parts");
    assert!(
        refused > iterations / 2,
        "the mutations should mostly break the part"
    );
}

/// The image decoder on mutations of the image processor's fixtures (PNG in every colour type,
/// JPEG, GIF, WebP; fixtures/vision/processor/): an error or an image, never a panic or a huge
/// allocation (the pixel limit is checked before the pixels are decoded); an image that still
/// decodes is preprocessed too.
#[test]
fn corrupted_images_give_errors_not_panics() {
    use qwen3_inference::vision::{decode, ImageProcessor};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vision/processor");
    let processor = ImageProcessor::from_json(&serde_json::json!({
        "patch_size": 4, "merge_size": 2, "size": {"shortest_edge": 256, "longest_edge": 4096},
    }))
    .unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut seed = 2028u64;
    let (mut refused, mut decoded) = (0, 0);
    let per_file = ITERATIONS / names.len();
    for path in &names {
        let bytes = std::fs::read(path).unwrap();
        for _ in 0..per_file {
            // Most mutations in the first 64 bytes: the signature, the size, the first chunks.
            let m = mutate(&bytes, 64, &mut seed);
            match decode(&m, 1 << 20) {
                Err(e) => {
                    refused += 1;
                    assert!(!format!("{e:#}").is_empty(), "an empty error");
                }
                Ok(img) => {
                    decoded += 1;
                    assert_eq!(img.data.len(), img.height * img.width * 3);
                    // Ratios over 200 are refused by name; anything else gives patches.
                    if let Ok(p) = processor.preprocess(&img) {
                        assert_eq!(p.values.len(), p.grid_thw[1] * p.grid_thw[2] * p.row_len);
                    }
                }
            }
        }
    }
    println!(
        "images: {refused} refused, {decoded} decoded of {} mutated files",
        per_file * names.len()
    );
    assert!(
        refused > 0 && decoded > 0,
        "the mutations should break some files and spare others"
    );
}
