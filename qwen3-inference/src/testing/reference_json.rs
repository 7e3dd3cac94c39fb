//! Reading the JSON references that scripts write into `fixtures/` from transformers' outputs.

use serde_json::Value;

/// `fixtures/<path>`, parsed. Panics with the path when it is missing or malformed (a test's
/// setup, not input).
pub fn read(path: &str) -> Value {
    let p = format!("{}/../fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// A JSON array of numbers as f32.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// The largest difference between `got` and `want`, relative to the largest value of `want`.
pub fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
        / scale
}
