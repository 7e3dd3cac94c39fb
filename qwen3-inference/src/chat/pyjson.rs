//! Python's `json.dumps`, byte for byte, for the `tojson` filter of chat templates.
//!
//! transformers replaces Jinja's `tojson` (which escapes `< > & '` for HTML) with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
//! (transformers/utils/chat_template_utils.py). Chat templates put its output straight into the
//! prompt (Qwen3 renders every tool schema with it), so the text must match Python's exactly:
//! `", "` and `": "` separators, keys in insertion order, Python's float repr, and only `"`, `\`
//! and control characters escaped.

use serde_json::Value;

/// The options of Python's `json.dumps` that transformers' `tojson` passes through.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    /// Escape every non-ASCII character as `\uXXXX` (transformers' default: false).
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: one item per line, each level indented by `s`
    /// (Python's `indent=n` is `s = n spaces`).
    pub indent: Option<String>,
    /// `(item separator, key separator)`; Python's default is `(", ", ": ")` on one line and
    /// `(",", ": ")` with an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `json.dumps(value, **options)`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> String {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut out = String::new();
    let w = Writer {
        opts,
        item_sep,
        key_sep,
    };
    w.value(&mut out, value, 0);
    out
}

struct Writer<'a> {
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Writer<'_> {
    fn value(&self, out: &mut String, v: &Value, depth: usize) {
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => out.push_str(&i.to_string()),
                (None, Some(u), _) => out.push_str(&u.to_string()),
                (_, _, Some(f)) => out.push_str(&float_repr(f)),
                _ => out.push_str(&n.to_string()),
            },
            Value::String(s) => self.string(out, s),
            Value::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.value(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push(']');
            }
            Value::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.opts.sort_keys {
                    // Python sorts str keys by code point; Rust's `str` order is the same.
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.string(out, k);
                    out.push_str(self.key_sep);
                    self.value(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push('}');
            }
        }
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.opts.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    /// Python's `py_encode_basestring` (ensure_ascii=False) or `py_encode_basestring_ascii`.
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    // Outside the BMP: a UTF-16 surrogate pair, as Python writes it.
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `float.__repr__`: the shortest digits that round-trip, in positional notation when the
/// decimal exponent is in [-4, 16), otherwise `d.ddde+XX` with at least two exponent digits.
/// `json.dumps` writes NaN and the infinities as `NaN`, `Infinity`, `-Infinity`.
fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    if (-4..16).contains(&exp) {
        // Positional; Rust's `{:?}` prints these with a `.0` when integral, like Python.
        let s = format!("{f:?}");
        debug_assert!(!s.contains('e'));
        s
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Expected strings are Python 3.11 `json.dumps(x, ensure_ascii=False)` (and the options named in
    // each case) outputs.
    #[test]
    fn matches_python_json_dumps() {
        let d = DumpOptions::default();
        let v = json!({"b": 1, "a": [1.5, "x<y>&'z'", null, true], "c": {}, "d": []});
        assert_eq!(
            dumps(&v, &d),
            r#"{"b": 1, "a": [1.5, "x<y>&'z'", null, true], "c": {}, "d": []}"#
        );
        assert_eq!(
            dumps(&json!("Zürich \"q\" \\ \n\t\u{1f}\u{7f} 😀"), &d),
            "\"Zürich \\\"q\\\" \\\\ \\n\\t\\u001f\u{7f} 😀\""
        );
        let ascii = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(dumps(&json!("Zü😀"), &ascii), "\"Z\\u00fc\\ud83d\\ude00\"");
        let indented = DumpOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(&json!({"b": [1, {}], "a": 2}), &indented),
            "{\n  \"a\": 2,\n  \"b\": [\n    1,\n    {}\n  ]\n}"
        );
        let compact = DumpOptions {
            separators: Some((",".into(), ":".into())),
            ..DumpOptions::default()
        };
        assert_eq!(dumps(&json!({"a": [1, 2]}), &compact), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn floats_like_python_repr() {
        // Python: repr(x) for each x.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.234e-7, "1.234e-07"),
            (1e300, "1e+300"),
            (123456789.125, "123456789.125"),
            (0.0, "0.0"),
        ];
        for (f, py) in cases {
            assert_eq!(float_repr(f), py, "{f}");
        }
    }
}
