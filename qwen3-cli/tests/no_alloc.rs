//! The decode loop allocates nothing per token (docs/performance.md, "Smaller steps"). This test counts every heap
//! allocation of the process (a counting global allocator) while `generate` decodes (the
//! engine's step loop, as the CLI and the server run it), on the
//! full-vocabulary fixture (151936 tokens, so the sampler works on a real vocabulary's size) and
//! on a hybrid (Qwen3.5's fixture, whose Gated DeltaNets update their state in place), each
//! exported as q8 and as f32, with the KV cache in f32 and in bf16, at the sampler settings that
//! take different paths: greedy, the model's defaults (top-k), top-p alone at a high temperature,
//! and no filter at all.
//!
//! The first tokens may grow buffers to their largest size (the sampler's, the quantized
//! activations'), so the count starts after a few tokens and must then stay still. The window
//! stays inside the KV cache's first chunk, which is allocated before the first token (the cache
//! allocates a chunk ahead every 256 positions, by design, and docs/performance.md says so).
//!
//! It runs on a thread of a rayon pool of two, as `qwen3 inference` does (`on_worker_thread` in
//! main.rs): a parallel loop started from outside the pool goes through rayon's global queue,
//! which allocates a block for every 63 jobs it takes in (`crossbeam_deque::Injector`); from a
//! pool thread the jobs go to that thread's own queue, which keeps its buffer.
//!
//! This file holds one test: the counter is process-wide, and another test running beside it
//! would count too.

use qwen3_inference::backend::{CpuBackend, KvType};
use qwen3_inference::engine::{Engine, Request};
use qwen3_inference::format::{DType, ModelFile};
use qwen3_inference::generate::generate;
use qwen3_inference::model::Model;
use qwen3_inference::sampler::SamplerConfig;
use qwen3_test_support::{export_fixture, tempdir};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations (and reallocations), then lets the system allocator do them.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; counting touches only an atomic and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees for `layout` are `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` and `layout` come from this allocator, hence from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Tokens decoded before the count starts, and counted after.
const WARM_UP: usize = 8;
const COUNTED: usize = 40;

#[test]
fn decoding_allocates_nothing_per_token() {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
        .install(decode_and_count);
}

fn decode_and_count() {
    let dir = tempdir("pq-no-alloc", "decode");
    let settings = [
        ("greedy", SamplerConfig::greedy()),
        ("defaults", sampler(0.6, 20, 0.95)),
        ("top-p alone", sampler(1.5, 0, 0.9)),
        ("no filter", sampler(1.0, 0, 1.0)),
    ];
    // The full-vocabulary Qwen3, and a hybrid (Qwen3.5: Gated DeltaNets, whose state the
    // decode step updates in place, beside gated attention) on its small vocabulary.
    let models = [
        ("tiny-qwen3-fullvocab", DType::Q8, 32, [9707, 11, 1879, 0]),
        ("tiny-qwen3-fullvocab", DType::F32, 0, [9707, 11, 1879, 0]),
        ("tiny-qwen3_5-bf16", DType::Q8, 32, [9, 11, 400, 7]),
        ("tiny-qwen3_5-bf16", DType::F32, 0, [9, 11, 400, 7]),
    ];
    for (name, dtype, group, prompt) in models {
        let path = export_fixture(name, &dir, dtype, group);
        let file = ModelFile::open(&path).unwrap();
        let model = Model::load(&file).unwrap();
        for kv in [KvType::F32, KvType::Bf16] {
            for (label, cfg) in &settings {
                let cpu = CpuBackend::new();
                let mut engine = Engine::one_sequence(&cpu, &model, 128, kv).unwrap();
                let request = Request {
                    prompt: prompt.to_vec(),
                    max_tokens: WARM_UP + COUNTED,
                    sampler: cfg.clone(),
                    stop_ids: vec![],
                    logprobs: None,
                    constraint: None,
                    prompt_logprobs: None,
                    last_logits: false,
                    draft: qwen3_inference::engine::Draft::None,
                    images: None,
                };
                let (mut seen, mut at_start) = (0, 0);
                generate(&mut engine, request, |_| {
                    seen += 1;
                    if seen == WARM_UP {
                        at_start = ALLOCATIONS.load(Ordering::Relaxed);
                    }
                    Ok(true)
                })
                .unwrap();
                let during = ALLOCATIONS.load(Ordering::Relaxed) - at_start;
                assert_eq!(seen, WARM_UP + COUNTED);
                assert_eq!(
                    during, 0,
                    "{name}, {dtype} weights, {kv:?} cache, {label}: {during} allocations in {COUNTED} decoded tokens"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn sampler(temperature: f32, top_k: usize, top_p: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 7,
    }
}
