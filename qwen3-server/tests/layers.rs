//! The crate's modules use only those after them in lib.rs's list: the order its doc comment
//! draws (routes -> requests -> engine handle -> answers -> shared state -> worker -> listener).
//! A `use crate::x` that points back up, a circle between two modules, or a module missing from
//! the list fails here, with the line that does it.
//!
//! Read from the sources: every `crate::name` outside comments and test modules.

use qwen3_test_support::layers::{declared_modules, files, library_lines, uses};
use std::path::{Path, PathBuf};

#[test]
fn modules_use_only_those_after_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let order = declared_modules(&src);
    assert!(order.len() > 10, "lib.rs lists {order:?}");
    let rank = |name: &str| order.iter().position(|m| m == name);
    // Every source file belongs to a listed module (or is lib.rs, or a test file).
    let mut listed: Vec<PathBuf> = order.iter().flat_map(|m| files(&src, m)).collect();
    listed.push(src.join("lib.rs"));
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let test_file = name.ends_with("_tests.rs");
        let not_rust = p.is_file() && p.extension().is_none_or(|x| x != "rs");
        let module_dir = p.is_dir() && listed.iter().any(|f| f.starts_with(&p));
        assert!(
            test_file || not_rust || module_dir || listed.contains(&p),
            "{name} is not a module lib.rs lists"
        );
    }
    let mut wrong = vec![];
    for (i, module) in order.iter().enumerate() {
        for file in files(&src, module) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, code) in library_lines(&text) {
                for used in uses(code) {
                    match rank(used) {
                        // Its own files, and modules after it.
                        Some(j) if j >= i => {}
                        Some(_) => wrong.push(format!(
                            "{}:{line}: {module} uses {used}, which comes before it: {}",
                            file.strip_prefix(&src).unwrap().display(),
                            code.trim()
                        )),
                        // lib.rs's own items (router, serve): only what is beside the list may
                        // use them.
                        None if module == "batch" => {}
                        None => wrong.push(format!(
                            "{}:{line}: {module} uses lib.rs's {used}: {}",
                            file.strip_prefix(&src).unwrap().display(),
                            code.trim()
                        )),
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses against the order:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_a_use_and_skips_comments_and_tests() {
    let text = "use crate::job::Job; // crate::routes\n\
                /// [`crate::serve`]\n\
                fn f() { crate::error::x() }\n\
                #[cfg(test)]\n\
                mod tests;\n\
                use crate::answer;\n\
                #[cfg(test)]\n\
                mod tests { use crate::routes; }\n";
    let seen: Vec<(usize, Vec<&str>)> = library_lines(text)
        .into_iter()
        .map(|(n, l)| (n, uses(l)))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, vec!["job", "routes"]),
            (3, vec!["error"]),
            (4, vec![]),
            (5, vec![]),
            (6, vec!["answer"])
        ],
        "a trailing comment's crate:: still counts: the check errs on the side of failing"
    );
}

/// lib.rs says "this crate is the only place tokio lives": no other crate of the workspace
/// depends on tokio (or on axum or hyper, which run on it), nor names it in its code.
#[test]
fn tokio_lives_only_in_the_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = workspace
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("the workspace lists its members");
    let crates: Vec<&str> = members.split('"').skip(1).step_by(2).collect();
    assert!(
        crates.contains(&"qwen3-server") && crates.len() > 3,
        "{crates:?}"
    );
    for name in crates.iter().filter(|&&c| c != "qwen3-server") {
        let manifest = std::fs::read_to_string(root.join(name).join("Cargo.toml")).unwrap();
        for line in manifest
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
        {
            let dependency = line.split(['=', ' ', '.']).next().unwrap_or("");
            for runtime in ["tokio", "axum", "hyper", "hyper-util", "tower-http"] {
                assert_ne!(
                    dependency, runtime,
                    "{name}/Cargo.toml depends on {runtime}"
                );
            }
        }
        let src = root.join(name).join("src");
        let mut rust = vec![src];
        while let Some(p) = rust.pop() {
            if p.is_dir() {
                rust.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (n, line) in library_lines(&text) {
                    assert!(!line.contains("tokio::"), "{}:{n}: {line}", p.display());
                }
            }
        }
    }
}

/// The CLI's commands that do not serve (generate, chat, rerank, embed, ...) run on the library
/// alone: only `serve` and `batch` (which runs the server's engine loop over a file of requests)
/// use this crate (ARCHITECTURE.md, "A CLI subcommand").
#[test]
fn only_serving_commands_use_the_server() {
    let commands = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qwen3-cli/src");
    let mut rust = vec![commands];
    let mut users = vec![];
    while let Some(p) = rust.pop() {
        if p.is_dir() {
            rust.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            if library_lines(&text)
                .iter()
                .any(|(_, line)| line.contains("qwen3_server"))
            {
                users.push(p.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    users.sort();
    assert_eq!(users, ["batch.rs", "serve.rs"]);
}
