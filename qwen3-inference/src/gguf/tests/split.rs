//! A GGUF file split in parts (gguf-py's writer, as `convert_hf_to_gguf.py --split-max-tensors`
//! and llama.cpp's `gguf-split` cut them) opens from its first part as the whole file does, every
//! tensor the same bytes; a part missing, renamed or out of place, a tensor in two parts or a
//! count no split file has is refused by name.

use super::*;
use crate::format::ModelFile;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf")
}

/// Part `k` (from 1) of the fixture's three.
fn part(k: usize) -> PathBuf {
    fixtures().join(format!(
        "split/tiny-f32-tied-gqa2-q8_0-{k:05}-of-00003.gguf"
    ))
}

/// The three parts, copied into a directory of their own under the names `names` gives them
/// (`None`: left out), for the tests that damage them.
fn copies(test: &str, names: [Option<&str>; 3]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pq-gguf-split-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (k, name) in names.iter().enumerate() {
        if let Some(name) = name {
            std::fs::copy(part(k + 1), dir.join(name)).unwrap();
        }
    }
    dir
}

const NAMES: [&str; 3] = [
    "m-00001-of-00003.gguf",
    "m-00002-of-00003.gguf",
    "m-00003-of-00003.gguf",
];

/// The first part opens as the unsplit file: the same config, the same tensors under the same
/// names, dtypes and shapes, each with the same bytes (the Q8_0 matrices repacked from the
/// parts that hold them), and its metadata is the first part's.
#[test]
fn a_split_file_opens_as_the_whole_file() {
    let whole = ModelFile::open(&fixtures().join("tiny-f32-tied-gqa2-q8_0.gguf")).unwrap();
    let split = ModelFile::open(&part(1)).unwrap();
    assert_eq!(split.config(), whole.config());
    let names = |f: &ModelFile| -> Vec<_> {
        f.header()
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.dtype, t.shape.clone()))
            .collect()
    };
    assert_eq!(names(&split), names(&whole));
    for t in &whole.header().tensors {
        assert_eq!(
            split.tensor_bytes(&t.name).unwrap(),
            whole.tensor_bytes(&t.name).unwrap(),
            "{}",
            t.name
        );
    }
    let g = GgufFile::open(&part(1)).unwrap();
    assert_eq!(g.parts(), 3);
    assert_eq!(g.header().tensors.len(), whole.header().tensors.len());
    assert!(tokenizer::chat_template(g.header()).is_some());
    assert!(
        split.bytes().is_err(),
        "a split file is not one run of memory"
    );
}

/// Each way of getting the parts wrong is refused in one line that says what to do.
#[test]
fn a_wrong_or_missing_part_is_named() {
    let err = |path: &Path| format!("{:#}", ModelFile::open(path).err().unwrap());
    // Not the first part.
    let e = err(&part(2));
    assert!(
        e.contains("part 2 of a GGUF file split in 3: open its first part")
            && e.contains("tiny-f32-tied-gqa2-q8_0-00001-of-00003.gguf"),
        "{e}"
    );
    // A part missing.
    let dir = copies("missing", [Some(NAMES[0]), Some(NAMES[1]), None]);
    let e = err(&dir.join(NAMES[0]));
    assert!(
        e.contains("part 3 of 3 of this split GGUF file") && e.contains("cannot open"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Two parts swapped.
    let dir = copies("swapped", [Some(NAMES[0]), Some(NAMES[2]), Some(NAMES[1])]);
    let e = err(&dir.join(NAMES[0]));
    assert!(
        e.contains("part 2 of 3 of this split GGUF file")
            && e.contains("says it is part 3 of 3, not part 2 of 3"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // The first part renamed: the others cannot be found.
    let dir = copies("renamed", [Some("m.gguf"), Some(NAMES[1]), Some(NAMES[2])]);
    let e = err(&dir.join("m.gguf"));
    assert!(
        e.contains(
            "part 1 of a GGUF file split in 3, named m.gguf, not PREFIX-00001-of-00003.gguf"
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parts built byte by byte: a count past what llama.cpp writes (a u16) is refused before any
/// part is looked for, and a tensor in two parts is refused by name.
#[test]
fn a_damaged_split_header_is_named() {
    let dir = std::env::temp_dir().join(format!("pq-gguf-split-{}-built", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let part = |no: u32, count: u32| {
        Builder::default()
            .kv("split.no", 4, &no.to_le_bytes())
            .kv("split.count", 4, &count.to_le_bytes())
            .tensor("output_norm.weight", &[64], 0, 256, 1)
    };
    let open = |name: &str, b: &Builder| {
        let path = dir.join(name);
        std::fs::write(&path, b.bytes(3)).unwrap();
        format!("{:#}", GgufFile::open(&path).err().unwrap())
    };
    let e = open("m-00001-of-70000.gguf", &part(0, 70000));
    assert!(
        e.contains("split.count 70000: more parts than a split GGUF file has"),
        "{e}"
    );
    std::fs::write(dir.join("m-00002-of-00002.gguf"), part(1, 2).bytes(3)).unwrap();
    let e = open("m-00001-of-00002.gguf", &part(0, 2));
    assert!(
        e.contains("tensor output_norm.weight is in part 2 of 2 of this split GGUF file")
            && e.contains("and in an earlier part too"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A part's name read and written by the one rule: the prefix keeps its own dashes, the part
/// and count five digits with the part within the count.
#[test]
fn a_part_name_is_read_and_written_by_one_rule() {
    let s = SplitName::parse("Qwen3.5-397B-A17B-Q4_K_M-00002-of-00005.gguf").unwrap();
    assert_eq!(
        (s.prefix, s.part, s.count),
        ("Qwen3.5-397B-A17B-Q4_K_M", 2, 5)
    );
    assert_eq!(
        s.part_name(5),
        "Qwen3.5-397B-A17B-Q4_K_M-00005-of-00005.gguf"
    );
    for not in [
        "m-00000-of-00002.gguf",
        "m-00003-of-00002.gguf",
        "m-1-of-2.gguf",
        "m-00001-of-00002.bin",
        "00001-of-00002.gguf",
    ] {
        assert_eq!(SplitName::parse(not), None, "{not}");
    }
}
