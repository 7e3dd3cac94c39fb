//! The library's modules stand on the floors ARCHITECTURE.md draws ("The library, in data-flow
//! order"): a module's code uses only modules on its own floor or below. A `crate::x` that points
//! up a floor, or a module lib.rs lists that no floor holds, fails here, with the line that does
//! it.
//!
//! Read from the sources: every `crate::name` outside comments and tests (a file `tests.rs`, a
//! folder `tests/`, an inline `mod tests`).

use qwen3_test_support::layers::{declared_modules, files, library_lines, uses};
use std::collections::HashMap;
use std::path::Path;

/// ARCHITECTURE.md's floors: the fenced block whose every line reads `N  module, module, ...`,
/// each module mapped to its floor's number. A module on two floors fails here.
fn floors(architecture: &str) -> HashMap<String, u32> {
    let floor_line = |line: &str| {
        let (n, names) = line.split_once("  ")?;
        Some((n.parse::<u32>().ok()?, names.to_string()))
    };
    let mut blocks = architecture.split("```").skip(1).step_by(2);
    let block = blocks
        .find_map(|b| {
            let lines: Vec<&str> = b.lines().skip(1).filter(|l| !l.is_empty()).collect();
            let floors: Option<Vec<(u32, String)>> = lines.iter().map(|l| floor_line(l)).collect();
            floors.filter(|f| !f.is_empty())
        })
        .expect("no block of floors in ARCHITECTURE.md");
    let mut out = HashMap::new();
    for (n, names) in block {
        for name in names.split(',') {
            let old = out.insert(name.trim().to_string(), n);
            assert!(old.is_none(), "{} is on two floors", name.trim());
        }
    }
    out
}

#[test]
fn modules_use_only_their_floor_and_below() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let floors = floors(&std::fs::read_to_string(root.join("../ARCHITECTURE.md")).unwrap());
    let modules = declared_modules(&src);
    assert!(modules.len() > 10, "lib.rs lists {modules:?}");
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !floors.contains_key(*m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "ARCHITECTURE.md's floors do not hold {unplaced:?}"
    );
    let unknown: Vec<&String> = floors.keys().filter(|m| !modules.contains(m)).collect();
    assert!(
        unknown.is_empty(),
        "ARCHITECTURE.md's floors name {unknown:?}, which lib.rs does not declare"
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
                // `crate::{a, b}` names its modules inside the braces, which `uses` does not read.
                if code.contains("crate::{") {
                    wrong.push(format!(
                        "{}:{line}: a grouped `crate::{{...}}` import, which this check cannot read: \
                         one `use crate::module::...` a module",
                        rel.display()
                    ));
                }
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
    let text = "Some prose\n3  of two spaces.\n```rust\nlet x = 1;\n```\n\
                ```text\n2  format, gguf\n1  quant\n```\n9  later, prose\n";
    let f = floors(text);
    assert_eq!(f.len(), 3, "{f:?}");
    assert_eq!((f["format"], f["gguf"], f["quant"]), (2, 2, 1));
}

/// backend/plain.rs says it is the textbook: "no SIMD, no threads, no `unsafe`". Its code (and
/// the textbook steps it takes from backend/hybrid_steps.rs) names no intrinsic, no thread pool,
/// no `unsafe` and none of the fast kernels.
#[test]
fn the_plain_backend_is_textbook_loops() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/plain.rs");
    let text = std::fs::read_to_string(&src).unwrap();
    let fast = [
        "unsafe",
        "std::arch",
        "core::arch",
        "rayon",
        "thread",
        "kernels::dot",
        "kernels::matmul",
        "delta_net_fast",
        "hybrid_steps::FAST",
    ];
    for (n, line) in library_lines(&text) {
        for word in fast {
            assert!(!line.contains(word), "plain.rs:{n} names {word}: {line}");
        }
    }
    assert!(
        text.contains("hybrid_steps::TEXTBOOK"),
        "plain.rs runs the textbook steps"
    );
    // And those steps are the textbook's (`kernels/delta_net.rs`), none of the fast ones.
    let steps = std::fs::read_to_string(src.with_file_name("hybrid_steps.rs")).unwrap();
    let textbook = steps
        .split("pub const TEXTBOOK")
        .nth(1)
        .and_then(|rest| rest.split("};").next())
        .expect("hybrid_steps.rs defines TEXTBOOK");
    assert!(textbook.contains("delta_net::"), "{textbook}");
    for word in fast {
        assert!(
            !textbook.contains(word),
            "TEXTBOOK names {word}: {textbook}"
        );
    }
}
