//! The library's modules stand on the floors ARCHITECTURE.md draws ("The library, in data-flow
//! order"): a module's code uses only modules on its own floor or below. A `crate::x` that points
//! up a floor, or a module lib.rs lists that no floor holds, fails here, with the line that does
//! it.
//!
//! Read from the sources: every `crate::name` outside comments and tests (a file `tests.rs`, a
//! folder `tests/`, an inline `mod tests`).

use qwen3_test_support::layers::{files, library_lines, uses};
use std::collections::HashMap;
use std::path::Path;

/// ARCHITECTURE.md's floors: the fenced block whose lines read `N  module, module, ...`, each
/// module mapped to its floor's number.
fn floors(architecture: &str) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for line in architecture.lines() {
        let Some((n, names)) = line.split_once("  ") else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        for name in names.split(',') {
            out.insert(name.trim().to_string(), n);
        }
    }
    out
}

/// The modules lib.rs declares (`pub mod name;`).
fn modules(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

#[test]
fn modules_use_only_their_floor_and_below() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let floors = floors(&std::fs::read_to_string(root.join("../ARCHITECTURE.md")).unwrap());
    let modules = modules(&src);
    assert!(modules.len() > 10, "lib.rs lists {modules:?}");
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !floors.contains_key(*m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "ARCHITECTURE.md's floors do not hold {unplaced:?}"
    );
    let mut wrong = vec![];
    for module in &modules {
        let floor = floors[module];
        for file in files(&src, module) {
            let rel = file.strip_prefix(&src).unwrap();
            let a_test = rel.iter().any(|c| c == "tests")
                || rel.file_name().is_some_and(|n| n == "tests.rs");
            if a_test {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, code) in library_lines(&text) {
                for used in uses(code) {
                    match floors.get(used) {
                        Some(&f) if f > floor => wrong.push(format!(
                            "{}:{line}: {module} (floor {floor}) uses {used} (floor {f}): {}",
                            rel.display(),
                            code.trim()
                        )),
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses that point up a floor:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_floors_are_read_from_their_block() {
    let text = "Some prose  with two spaces.\n```text\n2  format, gguf\n1  quant\n```\n";
    let f = floors(text);
    assert_eq!(f.len(), 3, "{f:?}");
    assert_eq!((f["format"], f["gguf"], f["quant"]), (2, 2, 1));
}
