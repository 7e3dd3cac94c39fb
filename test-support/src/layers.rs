//! The modules a crate's library code uses, read from its sources: for the tests that hold a
//! crate's modules to the order its docs draw (qwen3-server's `tests/layers.rs`, lib.rs's list;
//! qwen3-inference's `tests/layers.rs`, ARCHITECTURE.md's floors).

use std::path::{Path, PathBuf};

/// The modules a crate's lib.rs declares (`pub mod name;`), in its order.
pub fn declared_modules(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

/// The files of module `name`: `name.rs`, or `name/` and everything under it.
pub fn files(src: &Path, name: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{name}.rs"));
    if file.exists() {
        return vec![file];
    }
    let mut out = vec![];
    let mut dirs = vec![src.join(name)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The code of a file without comments and its test module: the lines a build of the library
/// compiles.
pub fn library_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = vec![];
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, l)) = lines.next() {
        let t = l.trim_start();
        if t == "#[cfg(test)]" && lines.peek().is_some_and(|(_, n)| n.contains("mod tests {")) {
            break; // an inline test module is the file's end
        }
        if !t.starts_with("//") {
            out.push((i + 1, l));
        }
    }
    out
}

/// Every `crate::name` on a line.
pub fn uses(line: &str) -> Vec<&str> {
    line.match_indices("crate::")
        .map(|(i, m)| {
            let rest = &line[i + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}
