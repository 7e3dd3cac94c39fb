//! Shared fixture loading for the exactness tests against transformers' outputs:
//! qwen3-cli/tests/parity.rs (the CPU path) and qwen3-cuda/tests/hf_parity.rs (the GPU path's
//! forward pass over the kernels' CPU references) read the same HuggingFace checkpoints in
//! `fixtures/models/` and the same `reference.json` files, made by scripts/make_fixtures.py
//! (transformers, float32, eager attention). What each test checks, and with what tolerance, stays
//! in that test; this crate only finds, reads and exports the fixtures.
//!
//! Beside them, [`web`]: a web server on a loopback port for the tests of what fetches (the hub's
//! downloads, image URLs); and [`layers`]: the modules a crate's sources use, for the tests that
//! hold a crate to its drawn order.
//!
//! Dev-only (`publish = false`): a dev-dependency of those tests and of nothing else.

use qwen3_export::{export, ExportOptions};
use qwen3_inference::format::DType;
use serde::Deserialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub mod layers;
pub mod web;

/// The tiny checkpoints whose `reference.json` holds every logit (the full-vocabulary one holds
/// the top 5 only). Qwen3: f32 with a tied classifier and GQA ratio 2, bf16 untied with as many
/// kv heads as heads, f16 in three shards with GQA ratio 4, f32 with YaRN (factor 4 over 64
/// original positions; prompts of up to 100 tokens). Qwen2 (q/k/v biases, no q/k norms): f32 tied
/// with GQA ratio 2 (hub config layout), bf16 untied in two shards with GQA ratio 4
/// (transformers 5 layout), f32 with YaRN as Qwen2.5's model cards enable it (`rope_scaling`
/// with the older key `type`; factor 4 over 64 original positions, prompts of up to 100 tokens).
/// Qwen3-MoE: bf16 tied with the hub's per-expert tensors (8 experts, top 2, renormalised), f32 in
/// two shards with transformers 5's fused experts, a dense layer between two sparse ones, top 3
/// not renormalised, and YaRN in `rope_parameters`. The CPU and GPU parity tests loop over these.
/// The fixtures of hybrid models (Qwen3.5's Gated DeltaNet layers), which the GPU backend does
/// not run: qwen3-cuda's tests skip them (and check the refusal on a model of their own), and
/// the GPU check kit leaves them out.
pub const HYBRID_CHECKPOINTS: [&str; 3] = [
    "tiny-qwen3_5-bf16",
    "tiny-qwen3_5moe-f32-sharded",
    "tiny-qwen3next-bf16",
];

pub const FULL_LOGIT_CHECKPOINTS: [&str; 12] = [
    "tiny-f32-tied-gqa2",
    "tiny-bf16-untied-mha",
    "tiny-f16-sharded-gqa4",
    "tiny-qwen2-f32-tied-gqa2",
    "tiny-qwen2-bf16-untied-gqa4-sharded",
    "tiny-qwen3-yarn",
    "tiny-qwen3moe-bf16-tied",
    "tiny-qwen3moe-f32-sharded-dense-yarn",
    "tiny-qwen2-yarn",
    "tiny-qwen3_5-bf16",
    "tiny-qwen3_5moe-f32-sharded",
    "tiny-qwen3next-bf16",
];

/// A fixture's `reference.json` (the fields the tests read; the file has more, e.g. the versions
/// of transformers and torch that made it).
#[derive(Deserialize)]
pub struct Reference {
    pub cases: Vec<Case>,
}

/// One prompt of a reference: transformers prefills the prompt in one forward, then decodes
/// greedily through its KV cache, never stopping at EOS (`run_case` in scripts/make_fixtures.py).
#[derive(Deserialize)]
pub struct Case {
    /// The prompt's token ids, `P` of them.
    pub prompt_ids: Vec<u32>,
    /// `[P][vocab]`: the logits after each prompt token. Absent (empty) in the full-vocabulary
    /// fixture, which records only `top5`.
    #[serde(default)]
    pub prompt_logits: Vec<Vec<f32>>,
    /// The greedy continuation, `G` ids.
    pub greedy_ids: Vec<u32>,
    /// `[G][vocab]`: the logits each greedy id was the argmax of; row 0 repeats the last prompt
    /// row. Absent (empty) in the full-vocabulary fixture.
    #[serde(default)]
    pub greedy_logits: Vec<Vec<f32>>,
    /// `[P]`: top-1 minus top-2 logit of each prompt row.
    pub prompt_top2_gap: Vec<f32>,
    /// `[G]`: top-1 minus top-2 logit of each greedy row.
    pub greedy_top2_gap: Vec<f32>,
    /// `[P + G][5]`: the five largest logits `(id, logit)` of the prompt rows, then of the greedy
    /// rows (row `P` repeats row `P - 1`).
    pub top5: Vec<Vec<(u32, f32)>>,
    /// The largest distance of the reference's f32 logits from a float64 evaluation of the same
    /// weights: the reference's own rounding.
    #[serde(default)]
    pub f32_vs_f64_max_abs: f32,
}

impl Case {
    /// The tokens whose logits the reference holds, in order: the prompt, then every greedy id but
    /// the last (`P + G - 1` tokens). Row `r` of [`Case::logit_rows`] follows token `r`.
    pub fn sequence(&self) -> Vec<u32> {
        let n = self.greedy_ids.len();
        let mut seq = self.prompt_ids.clone();
        seq.extend_from_slice(&self.greedy_ids[..n - 1]);
        seq
    }

    /// HF's logit rows in [`Case::sequence`] order: the prompt rows, then the greedy rows but the
    /// first (which repeats the last prompt row).
    pub fn logit_rows(&self) -> Vec<&Vec<f32>> {
        self.prompt_logits
            .iter()
            .chain(self.greedy_logits.iter().skip(1))
            .collect()
    }
}

/// The directory of fixture checkpoint `name`: in `$QWEN3_FIXTURES_DIR` when that is set, else in
/// the repository's `fixtures/models/`. The override is for test executables run away from the
/// source tree they were built in (scripts/gpu_check/prepare.sh carries them, with the fixtures they read,
/// to a GPU machine), where the path compiled in from `CARGO_MANIFEST_DIR` does not exist.
pub fn fixture(name: &str) -> PathBuf {
    let dir = match std::env::var_os("QWEN3_FIXTURES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models"),
    };
    dir.join(name)
}

/// Reads fixture `name`'s `reference.json`.
pub fn load_reference(name: &str) -> Reference {
    let path = fixture(name).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Reads `file` of fixture `name` as JSON (a reference transformers wrote: `reference.json`,
/// `logprobs.json`, `rerank.json`, ...).
pub fn fixture_json(name: &str, file: &str) -> serde_json::Value {
    let path = fixture(name).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fixture exported for one test, in a directory of its own that is removed when the test
/// ends (dropped), pass or fail.
pub struct Exported {
    pub dir: PathBuf,
    /// The model file.
    pub path: PathBuf,
}

impl Exported {
    /// Fixture `name` exported as `dtype` (f32, bf16, or q8 in groups of 32) into
    /// `tempdir(prefix, test)`.
    pub fn new(name: &str, prefix: &str, test: &str, dtype: DType) -> Exported {
        let dir = tempdir(prefix, test);
        let group = if dtype == DType::Q8 { 32 } else { 0 };
        let path = export_fixture(name, &dir, dtype, group);
        Exported { dir, path }
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh, empty directory `{prefix}-{pid}-{name}` under the system temp dir, for one test's
/// exports (the process id keeps concurrent test runs apart; the caller removes it).
pub fn tempdir(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A process's output as text (bytes that are not UTF-8 replaced), for messages and checks.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` with `stdin` (text, or any bytes) fed to it, then end of input; its stdout and
/// stderr captured.
pub fn run_with_stdin(cmd: &mut Command, stdin: impl AsRef<[u8]>) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_ref())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The text of a completion answer's first choice (`choices[0].text`).
pub fn choice_text(v: &serde_json::Value) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Exports fixture `name` with `qwen3_export::export` as `dtype` (`group_size`: q8's group, 0
/// otherwise) to `dir/{name}-{dtype}.bin`, and returns that path.
pub fn export_fixture(name: &str, dir: &Path, dtype: DType, group_size: u32) -> PathBuf {
    let out = dir.join(format!("{name}-{dtype}.bin"));
    let opts = ExportOptions {
        dtype,
        group_size,
        progress: false,
        ..Default::default()
    };
    export(&fixture(name), &out, &opts).unwrap_or_else(|e| panic!("{name}: export: {e:#}"));
    out
}

/// Little-endian f32 values written as base64 (the vision fixtures' arrays).
pub fn floats_b64(b64: &str) -> Vec<f32> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// An image file as a `data:` URL (`data:image/png;base64,...`), as OpenAI clients send one.
pub fn data_url(path: &Path) -> String {
    use base64::Engine as _;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("png");
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("data:image/{ext};base64,{b64}")
}

/// The largest `|a[i] - b[i]|`.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// An HTTP response as the server tests read it: the CLI's through the real binary over a
/// socket, the server's through its router in process.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// An OpenAI error object's `error`, checking its shape.
    pub fn error(&self) -> serde_json::Value {
        let v = self.json();
        let e = v["error"].clone();
        for f in ["message", "type", "param", "code"] {
            assert!(e.get(f).is_some(), "error object without {f}: {v}");
        }
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        e
    }
}
