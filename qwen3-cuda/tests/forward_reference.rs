//! The model's forward pass (`qwen3_inference::model::Forward`, through a `Session`) on the CPU references of the kernels:
//! the same orchestration the GPU runs (buffer sizes, KV cache offsets, causal positions, GQA),
//! checked against the plain backend (`qwen3_inference::backend::PlainBackend`: the same math in
//! textbook loops, itself checked against HuggingFace by qwen3-cli/tests/device.rs), on tiny
//! random models.

mod common;

use common::*;
use qwen3_cuda::reference::ReferenceBackend;
use qwen3_inference::backend::{KvType, PlainBackend};
use qwen3_inference::format::{DType, ModelFile};
use qwen3_inference::model::{Model, Session};

/// A session on the references with prompts run in chunks of `chunk` tokens.
fn session<'m>(
    backend: &'m ReferenceBackend<'m>,
    model: &'m Model<'m>,
    ctx: usize,
    chunk: usize,
) -> anyhow::Result<Session<'m, ReferenceBackend<'m>>> {
    let mut s = Session::new(backend, model, ctx, KvType::F32)?;
    s.set_max_batch(chunk)?;
    Ok(s)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The plain backend's logits after each token of `tokens`, decoded one at a time.
fn plain_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let plain = PlainBackend::new();
    let mut s = Session::new(&plain, model, tokens.len(), KvType::F32).unwrap();
    tokens
        .iter()
        .map(|&t| s.forward(&[t]).unwrap().to_vec())
        .collect()
}

const PROMPT: [u32; 7] = [3, 17, 99, 0, 42, 42, 7];

/// Every position's logits from token-by-token decode match the plain backend's. The tolerance:
/// two f32 computations that sum in different orders (sums of <= 128 products, 2 layers); 1e-4
/// is about 100 ulp of logits of magnitude ~5, far below the ~1 differences a wrong step
/// produces.
#[test]
fn decode_matches_the_plain_backend_for_every_dtype_tied_and_untied() {
    for (dtype, tied) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::Bf16, false),
        (DType::Q8, true),
        (DType::Q4, false),
    ] {
        let c = tiny_config(dtype, tied);
        let path = temp_path(&format!("decode-{dtype}-{tied}.bin"));
        write_model(&path, &c);
        let file = ModelFile::open(&path).unwrap();
        let backend = ReferenceBackend::new();
        let model = Model::load(&file).unwrap();
        let mut s = session(&backend, &model, 16, 4).unwrap();
        let want = plain_logits(&model, &PROMPT);
        let spread = want[0].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(spread > 1.0, "logits too flat to test anything: {spread}");
        for (pos, &tok) in PROMPT.iter().enumerate() {
            let got = s.forward(&[tok]).unwrap();
            let err = max_abs_diff(got, &want[pos]);
            assert!(
                err < 1e-4,
                "{dtype} tied={tied} pos {pos}: max abs diff {err}"
            );
        }
        std::fs::remove_file(&path).ok();
    }
}

/// The same for a Qwen3-MoE with YaRN (routing, grouped experts, scaled RoPE tables).
#[test]
fn moe_decode_matches_the_plain_backend() {
    for dtype in [DType::F32, DType::Q8, DType::Q4] {
        let c = tiny_moe_config(dtype);
        let path = temp_path(&format!("moe-decode-{dtype}.bin"));
        write_model(&path, &c);
        let file = ModelFile::open(&path).unwrap();
        let backend = ReferenceBackend::new();
        let model = Model::load(&file).unwrap();
        let mut s = session(&backend, &model, 32, 4).unwrap();
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 100).collect();
        let want = plain_logits(&model, &prompt);
        // prefill in chunks of 4 (several rows per expert), compared at the last position
        let got = s.forward(&prompt).unwrap();
        let err = max_abs_diff(got, &want[prompt.len() - 1]);
        assert!(err < 1e-4, "{dtype}: max abs diff {err}");
        std::fs::remove_file(&path).ok();
    }
}

/// Prefill in one pass, in chunks, and token by token give bit-identical logits: each kernel's
/// per-token arithmetic does not depend on how many tokens share a launch.
#[test]
fn prefill_chunks_and_decode_agree_bit_for_bit() {
    let c = tiny_config(DType::Q8, false);
    let path = temp_path("chunks.bin");
    write_model(&path, &c);
    let file = ModelFile::open(&path).unwrap();
    let backend = ReferenceBackend::new();
    let model = Model::load(&file).unwrap();
    let mut results = Vec::new();
    for chunk in [1, 3, 7, 16] {
        let mut s = session(&backend, &model, 16, chunk).unwrap();
        results.push(s.forward(&PROMPT).unwrap().to_vec());
        assert_eq!(s.pos(), PROMPT.len());
    }
    let mut s = session(&backend, &model, 16, 4).unwrap();
    let mut last = Vec::new();
    for &t in &PROMPT {
        last = s.forward(&[t]).unwrap().to_vec();
    }
    results.push(last);
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    std::fs::remove_file(&path).ok();
}

/// After truncating, the next tokens overwrite the cache: the same logits as a fresh session.
#[test]
fn truncate_rewinds_the_cache() {
    let c = tiny_config(DType::F32, false);
    let path = temp_path("truncate.bin");
    write_model(&path, &c);
    let file = ModelFile::open(&path).unwrap();
    let backend = ReferenceBackend::new();
    let model = Model::load(&file).unwrap();
    let mut a = session(&backend, &model, 16, 4).unwrap();
    a.forward(&[5, 6, 7, 8, 9]).unwrap();
    a.truncate(2).unwrap();
    let after = a.forward(&[42, 43]).unwrap().to_vec();
    let mut b = session(&backend, &model, 16, 4).unwrap();
    assert_eq!(b.forward(&[5, 6, 42, 43]).unwrap(), after);
    assert!(a.truncate(5).is_err());
    std::fs::remove_file(&path).ok();
}

/// Bad input is an error, not a panic: past the context, an id outside the vocabulary, nothing.
#[test]
fn bad_input_is_an_error() {
    let c = tiny_config(DType::F32, true);
    let path = temp_path("bad.bin");
    write_model(&path, &c);
    let file = ModelFile::open(&path).unwrap();
    let backend = ReferenceBackend::new();
    let model = Model::load(&file).unwrap();
    let mut s = session(&backend, &model, 4, 4).unwrap();
    assert!(s
        .forward(&[1, 2, 3, 4, 5])
        .unwrap_err()
        .to_string()
        .contains("do not fit"));
    assert!(s
        .forward(&[100])
        .unwrap_err()
        .to_string()
        .contains("outside the vocabulary"));
    assert!(s.forward(&[]).is_err());
    assert!(session(&backend, &model, 65, 4).is_err());
    std::fs::remove_file(&path).ok();
}
