//! `cargo bench -p qwen3-inference --bench kernels`: the dot-product kernels alone, per
//! instruction set, on one thread, as GB/s of weights streamed. Two sizes: a weight matrix that
//! fits in L2 (so the kernel's arithmetic is the limit) and one of 256 MB (so memory is), held
//! in huge pages like a model file's mapping (`pages.rs`); then the q8 block product that
//! prefill runs, in multiply-adds per second; GGUF's K-quants likewise; then attention with the KV cache in f32 and bf16,
//! the vision tower's attention over one image (`KERNELS_BENCH=frame`), and a Gated DeltaNet
//! layer's delta rule over a prompt (`KERNELS_BENCH=delta`).

use qwen3_inference::format::KQuant;
use qwen3_inference::kernels::attention::{chunk_len, Bf16, KvElem, KV_CHUNK};
use qwen3_inference::kernels::bandwidth::read_sum;
use qwen3_inference::kernels::dot::interleaved::{
    interleaves_q8, packed_for_kernels, q8_for_kernels,
};
use qwen3_inference::kernels::dot::k_interleaved;
use qwen3_inference::kernels::dot::q4::Q4Layout;
use qwen3_inference::kernels::dot::{available, ActsQ8Buf, Dots, Forms, MatQ8};
use qwen3_inference::kernels::{attention, frame_attention, AttentionShape, FrameScratch};
use qwen3_inference::pages::huge_page_buffer;
use qwen3_inference::pages::HugePages;
use qwen3_inference::quant::{quantize_q4, quantize_q6, quantize_q8};
use qwen3_inference::testing::next_values;
use std::hint::black_box;
use std::time::Instant;

/// A copy of `v` in an anonymous mapping advised to use huge pages.
fn in_huge_pages<T: bytemuck::Pod>(v: &[T]) -> memmap2::MmapMut {
    let mut map = huge_page_buffer(std::mem::size_of_val(v)).unwrap();
    map.copy_from_slice(bytemuck::cast_slice(v));
    map
}

/// The q8 kernels of `d`, each with the weights `wq` (`[rows, cols]`, groups of `gs`) in the
/// order it reads, in huge pages: the file's order, and on AVX-512 for groups of 32 or 64 the
/// interleaved order the model is loaded in (`dot/interleaved.rs`). The activations of both are
/// made by `quantize_for_q4_as(.., Q4Layout::Interleaved)`, which holds both forms.
fn q8_kernels(
    d: &Dots,
    wq: &[i8],
    cols: usize,
    gs: usize,
) -> Vec<(&'static str, MatQ8, memmap2::MmapMut)> {
    let mut v = vec![("", d.q8_rows, in_huge_pages(wq))];
    if let Some(kernel) = d.q8_interleaved.filter(|_| interleaves_q8(gs)) {
        v.push((
            " interleaved",
            kernel,
            in_huge_pages(&q8_for_kernels(d, wq, cols, gs)),
        ));
    }
    v
}

/// Median seconds of `reps` runs of `f`.
/// A pool of one thread, for the sections that run the library's parallel code on one core.
fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[reps / 2]
}

fn bench(d: &Dots, rows: usize, cols: usize, gs: usize, reps: usize) {
    let mut seed = 1;
    let w = next_values(rows * cols, &mut seed);
    let x = next_values(cols, &mut seed);
    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
    quantize_q8(&w, gs, &mut wq, &mut ws);
    let mut acts_buf = ActsQ8Buf::default();
    let acts = acts_buf.quantize_for_q4_as(&x, 1, cols, gs, Q4Layout::Interleaved);
    let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    // The weights in huge pages (the activations are small and stay in cache).
    let kernels = q8_kernels(d, &wq, cols, gs);
    let (w, wq, ws, wb) = (
        in_huge_pages(&w),
        in_huge_pages(&wq),
        in_huge_pages(&ws),
        in_huge_pages(&wb),
    );
    let w: &[f32] = bytemuck::cast_slice(&w);
    let wq: &[i8] = bytemuck::cast_slice(&wq);
    let ws: &[f32] = bytemuck::cast_slice(&ws);
    let wb: &[u16] = bytemuck::cast_slice(&wb);
    let per = cols / gs;
    let n = (rows * cols) as f64;
    // The decode kernel as a decode step runs it on one thread: the whole matrix in one call.
    let mut out = vec![0f32; rows];
    let mut q8 = String::new();
    for (name, kernel, wk) in &kernels {
        let secs = time(reps, || {
            kernel(bytemuck::cast_slice(wk), ws, &acts, &mut out, 0);
            black_box(&out);
        });
        let rate = n * (1.0 + 4.0 / gs as f64) / secs / 1e9;
        q8 += &format!("q8xq8{name} {rate:>6.1} GB/s   ");
    }
    let q8f = time(reps, || {
        for r in 0..rows {
            black_box((d.q8_f32)(
                &wq[r * cols..(r + 1) * cols],
                &ws[r * per..(r + 1) * per],
                &x,
                gs,
            ));
        }
    });
    let bf = time(reps, || {
        for r in 0..rows {
            black_box((d.bf16)(&wb[r * cols..(r + 1) * cols], &x));
        }
    });
    let f = time(reps, || {
        for r in 0..rows {
            black_box((d.f32)(&w[r * cols..(r + 1) * cols], &x));
        }
    });
    println!(
        "{:<12} {:>6}x{:<5} g{gs:<3} {q8}q8xf32 {:>6.1} GB/s   bf16 {:>6.1} GB/s   f32 {:>6.1} GB/s",
        d.isa,
        rows,
        cols,
        n * (1.0 + 4.0 / gs as f64) / q8f / 1e9,
        n * 2.0 / bf / 1e9,
        n * 4.0 / f / 1e9
    );
}

/// The q8 block product as prefill uses it: 16 weight rows (one part of a product) against a
/// chunk of `t` tokens, over a whole `[rows, cols]` matrix. Reported in multiply-adds per second,
/// since prefill is bound by arithmetic. Groups of 64 (q8 files) or 32 (the matrices a q4 file
/// keeps in q8, `format::Q4Mix`).
fn bench_prefill(d: &Dots, rows: usize, cols: usize, t: usize, gs: usize, reps: usize) {
    let per = cols / gs;
    let mut seed = 2;
    let w = next_values(rows * cols, &mut seed);
    let x = next_values(t * cols, &mut seed);
    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
    quantize_q8(&w, gs, &mut wq, &mut ws);
    let mut buf = ActsQ8Buf::default();
    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, Q4Layout::Interleaved);
    let mut out = vec![0f32; rows * t];
    for (name, kernel, wk) in q8_kernels(d, &wq, cols, gs) {
        let wk: &[i8] = bytemuck::cast_slice(&wk);
        let secs = time(reps, || {
            for (r0, block) in (0..rows).step_by(16).zip(out.chunks_mut(16 * t)) {
                kernel(
                    &wk[r0 * cols..(r0 + 16) * cols],
                    &ws[r0 * per..(r0 + 16) * per],
                    &acts,
                    block,
                    0,
                );
            }
            black_box(&out);
        });
        println!(
            "{:<24} {:>6}x{:<5} q8 block product, group {gs}, {t} tokens: {:>6.1} GMAC/s",
            format!("{}{name}", d.isa),
            rows,
            cols,
            (rows * cols * t) as f64 / secs / 1e9
        );
    }
}

/// A serving step's product: `t` tokens (one per decoding sequence) against a matrix too large
/// for the caches, in one call as the decode team's parts run it. One thread. With few tokens it
/// waits on memory like decode; with more, on arithmetic: where the two meet is what a step of
/// `t` sequences can cost.
fn bench_few_tokens(d: &Dots, rows: usize, cols: usize, t: usize, gs: usize, reps: usize) {
    let mut seed = 3;
    let w = next_values(rows * cols, &mut seed);
    let x = next_values(t * cols, &mut seed);
    let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
    quantize_q8(&w, gs, &mut wq, &mut ws);
    let ws = in_huge_pages(&ws);
    let ws: &[f32] = bytemuck::cast_slice(&ws);
    let mut buf = ActsQ8Buf::default();
    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, Q4Layout::Interleaved);
    let mut out = vec![0f32; rows * t];
    for (name, kernel, wk) in q8_kernels(d, &wq, cols, gs) {
        let wk: &[i8] = bytemuck::cast_slice(&wk);
        let secs = time(reps, || {
            kernel(wk, ws, &acts, &mut out, 0);
            black_box(&out);
        });
        println!(
            "{:<24} {:>6}x{:<5} q8 group {gs}, {t:>2} tokens: {:>6.1} GMAC/s, weights at {:>5.1} GB/s",
            format!("{}{name}", d.isa),
            rows,
            cols,
            (rows * cols * t) as f64 / secs / 1e9,
            (wk.len() + ws.len() * 4) as f64 / secs / 1e9
        );
    }
}

/// q4 weights (group 32), or q6 ones (`six`: what a q4 file keeps finer), against `t` q8
/// activation rows, one thread: decode's product for q4 files (from the caches and from
/// memory), and prefill's, beside q8's below.
fn bench_q4(d: &Dots, six: bool, rows: usize, cols: usize, t: usize, reps: usize) {
    let gs = 32;
    let mut seed = 4;
    let w = next_values(rows * cols, &mut seed);
    let x = next_values(t * cols, &mut seed);
    let mut ws = vec![0u16; w.len() / gs];
    let (wp, kernel) = match six {
        true => {
            let mut wp = vec![0u8; w.len() / 4 * 3];
            quantize_q6(&w, cols, gs, &mut wp, &mut ws);
            (wp, d.q6_rows)
        }
        false => {
            let mut wp = vec![0u8; w.len() / 2];
            quantize_q4(&w, gs, &mut wp, &mut ws);
            (wp, d.q4_rows)
        }
    };
    // AVX-512 reads the weights interleaved, as `Model::load` makes them.
    let wp = packed_for_kernels(d.q4_layout, six, &wp, cols, gs);
    let (wp, ws) = (in_huge_pages(&wp), in_huge_pages(&ws));
    let (wp, ws): (&[u8], &[u16]) = (bytemuck::cast_slice(&wp), bytemuck::cast_slice(&ws));
    let mut buf = ActsQ8Buf::default();
    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout);
    let mut out = vec![0f32; rows * t];
    let secs = time(reps, || {
        kernel(wp, ws, &acts, &mut out, 0);
        black_box(&out);
    });
    println!(
        "{:<12} {:>6}x{:<5} {}, {t:>2} tokens: {:>6.1} GMAC/s, weights at {:>5.1} GB/s",
        d.isa,
        rows,
        cols,
        if six { "q6" } else { "q4" },
        (rows * cols * t) as f64 / secs / 1e9,
        (wp.len() + ws.len() * 2) as f64 / secs / 1e9
    );
}

/// GGUF K-quant blocks (Q4_K, Q5_K, Q6_K as `kind`) against `t` q8 activation rows, one thread:
/// decode's product (from the caches and from memory) and a prompt's. The blocks are random
/// bytes with small finite f16 scales: the kernels' work does not depend on the values.
fn bench_k(d: &Dots, kind: KQuant, rows: usize, cols: usize, t: usize, reps: usize) {
    let mut seed = 5;
    let bytes = kind.block_bytes();
    let noise = next_values(rows * kind.row_bytes(cols), &mut seed);
    let mut w: Vec<u8> = noise.iter().map(|v| (v * 1e4) as i64 as u8).collect();
    // Each block's f16 scales (`d`, `dmin` first; Q6_K's `d` last) set to 0.01.
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for block in w.chunks_exact_mut(bytes) {
        match kind {
            KQuant::Q6K => block[208..210].copy_from_slice(&scale),
            _ => {
                block[0..2].copy_from_slice(&scale);
                block[2..4].copy_from_slice(&scale);
            }
        }
    }
    let x = next_values(t * cols, &mut seed);
    let w = in_huge_pages(&w);
    let mut buf = ActsQ8Buf::default();
    let acts = buf.quantize_for_weights(
        &x,
        t,
        cols,
        32,
        Forms {
            k: true,
            ..Forms::default()
        },
    );
    let mut out = vec![0f32; rows * t];
    // The file's blocks, and where the family has a kernel for it, the interleaved order.
    let mut kernels = vec![(d.isa.to_string(), d.k_rows, w)];
    let own_order = d
        .k_interleaved
        .filter(|(o, _)| o.takes(kind) && rows.is_multiple_of(o.rows()));
    if let Some((order, k)) = own_order {
        let mut reordered = vec![0u8; kernels[0].2.len()];
        k_interleaved::interleave_k(order, kind, &kernels[0].2, cols, &mut reordered);
        kernels.push((format!("{} il", d.isa), k, in_huge_pages(&reordered)));
    }
    for (name, kernel, w) in &kernels {
        let secs = time(reps, || {
            kernel(kind, w, &acts, &mut out, 0);
            black_box(&out);
        });
        println!(
            "{:<15} {:>6}x{:<5} {}, {t:>3} tokens: {:>6.1} GMAC/s, weights at {:>5.1} GB/s",
            name,
            rows,
            cols,
            kind.name(),
            (rows * cols * t) as f64 / secs / 1e9,
            w.len() as f64 / secs / 1e9
        );
    }
}

fn main() {
    // `KERNELS_BENCH=q4` (or q8, dot, prefill, step, attention): only the sections whose names
    // contain it, for a quick look at one family of kernels.
    let only = std::env::var("KERNELS_BENCH").unwrap_or_default();
    let run = |section: &str| only.is_empty() || section.contains(only.as_str());
    // `KERNELS_ISA=avx512` (a prefix of `Dots::isa`): only that family.
    let isa = std::env::var("KERNELS_ISA").unwrap_or_default();
    let available = || -> Vec<Dots> {
        let all = available();
        all.into_iter()
            .filter(|d| d.isa.starts_with(isa.as_str()))
            .collect()
    };
    if run("q4 q6") {
        println!("q4 and q6 products (group 32), one thread (median)");
        for d in available() {
            for six in [false, true] {
                // 32 KB of q4 (48 KB of q6): in the nearest caches, the kernel's arithmetic alone
                bench_q4(&d, six, 64, 1024, 1, 2001);
                // 256 KB of q4 (384 KB of q6): cache-resident, the kernel's own speed
                bench_q4(&d, six, 512, 1024, 1, 41);
                bench_q4(&d, six, 128, 4096, 1, 41);
                for t in [1, 4] {
                    // 32 (48) MB: memory-bound where the last-level cache is well smaller. A
                    // 32 MiB L3 (Zen 5) keeps part of it from run to run, and the figure then
                    // runs above what the kernel streams from memory (docs/kernels.md).
                    bench_q4(&d, six, 65536, 1024, t, 5);
                }
                bench_q4(&d, six, 1024, 1024, 128, 5); // prefill's block product
            }
        }
    }
    if run("k_quants") {
        println!("GGUF K-quant products, one thread (median)");
        for d in available() {
            for kind in [KQuant::Q4K, KQuant::Q5K, KQuant::Q6K] {
                bench_k(&d, kind, 512, 1024, 1, 41); // cache-resident
                bench_k(&d, kind, 128, 4096, 1, 41); // cache-resident, long rows
                bench_k(&d, kind, 65536, 1024, 1, 5); // 36-52 MB: memory-bound
                bench_k(&d, kind, 1024, 1024, 128, 5); // a prompt's
            }
        }
    }
    if run("q8 dot") {
        println!("dot-product kernels, one thread, weights streamed per second (median)");
        for d in available() {
            // Groups of 64 (q8 files) and 32 (the q8 matrices of a q4 file, `format::Q4Mix`).
            for gs in [64, 32] {
                bench(&d, 256, 1024, gs, 41); // 256 KB of q8: cache-resident
                bench(&d, 65536, 1024, gs, 5); // 64 MB of q8, 256 MB of f32: memory-bound
            }
        }
    }
    if run("q8 prefill") {
        println!("prefill's q8 block product, one thread (median)");
        for d in available() {
            for gs in [64, 32] {
                bench_prefill(&d, 1024, 1024, 128, gs, 5);
            }
        }
    }
    if run("q8 step") {
        println!("a serving step's q8 product (one token per sequence), one thread (median)");
        for d in available() {
            // Groups of 64 (q8 files) and 32 (a GGUF's Q8_0, a q4 file's q8 matrices).
            for gs in [64, 32] {
                for t in [1, 2, 4, 8, 16] {
                    bench_few_tokens(&d, 65536, 1024, t, gs, 5);
                }
            }
        }
    }
    if run("attention") {
        bench_attention();
    }
    if run("frame attention") {
        bench_frame_attention();
    }
    if run("delta") {
        bench_delta_rule();
    }
}

/// One Gated DeltaNet layer's delta rule (`kernels/delta_net_fast.rs`: the chunked form, in
/// small matrix products) with Qwen3.5-0.8B's linear heads (16 key and 16 value heads of 128),
/// over a prompt of 2048 tokens from an empty state, one thread.
fn bench_delta_rule() {
    use qwen3_inference::format::ValueHeads;
    use qwen3_inference::kernels::delta_net::DeltaNetShape;
    use qwen3_inference::kernels::delta_net_fast::gated_delta_rule;
    println!("a Gated DeltaNet layer's delta rule, Qwen3.5-0.8B's heads, one thread (median)");
    let pool = one_thread();
    let s = DeltaNetShape {
        num_k_heads: 16,
        num_v_heads: 16,
        head_k_dim: 128,
        head_v_dim: 128,
        conv_kernel: 4,
        value_heads: ValueHeads::Grouped,
    };
    let n = 2048;
    let vh = s.num_v_heads;
    let mut seed = 9;
    let qkv = next_values(n * s.conv_dim(), &mut seed);
    let (a, b) = (
        next_values(n * vh, &mut seed),
        next_values(n * vh, &mut seed),
    );
    let (a_log, dt_bias) = (next_values(vh, &mut seed), next_values(vh, &mut seed));
    let mut o = vec![0f32; n * s.value_dim()];
    let mut state = vec![0f32; s.recurrent_state_len()];
    let secs = pool.install(|| {
        time(5, || {
            state.fill(0.0);
            gated_delta_rule(&mut o, &qkv, &a, &b, &a_log, &dt_bias, &mut state, 0, s);
            black_box(&o);
        })
    });
    println!(
        "{n} tokens, {vh} heads of {}: {:>7.1} ms, {:>6.0} tokens/s",
        s.head_v_dim,
        secs * 1e3,
        n as f64 / secs
    );
}

/// The vision tower's attention (`kernels/frame_attention.rs`) with Qwen3-VL-2B's heads (16 of
/// 64) over one image's patches, one thread: 784 (a 448 x 448 image) and 3072 (1024 x 768). Its
/// multiply-adds, `2 n^2 hd` a head (the scores and the weighted sums), per second; the softmax
/// between them counts in the time, not in the work.
fn bench_frame_attention() {
    println!("the vision tower's attention, Qwen3-VL-2B's heads, one thread (median)");
    let pool = one_thread();
    let (heads, hd) = (16, 64);
    for n in [784, 3072] {
        let mut seed = 5;
        let [q, k, v] = [0; 3].map(|_| next_values(n * heads * hd, &mut seed));
        let mut o = vec![0f32; n * heads * hd];
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scratch = FrameScratch::default();
        let secs = pool.install(|| {
            time(3, || {
                frame_attention(&q, &k, &v, &mut o, n, heads, hd, scale, &mut scratch);
                black_box(&o);
            })
        });
        println!(
            "{n:>5} patches, {heads} heads of {hd}: {:>7.1} ms, {:>5.1} GMAC/s",
            secs * 1e3,
            (2 * n * n * hd * heads) as f64 / secs / 1e9
        );
    }
}

/// Attention with Qwen3-0.6B's heads (16 query, 8 kv, head_dim 128), one thread, with the cache
/// in f32 and in bf16: one decode token after 2000 cached positions in each of 28 layers (the
/// whole model's, so the caches come from memory as in decode: 459 MB in f32), after 200 (short
/// runs a head, from memory too), and a 256-token prompt from position 0 in one layer. Decode's
/// GB/s are those of the keys and values read, beside the probe's of the same moment.
fn bench_attention() {
    println!("attention, Qwen3-0.6B's shape, one thread (median)");
    // The read bandwidth of this moment, as `qwen3 bench` probes it: the caches' GB/s below
    // are a share of it.
    let pool = one_thread();
    let probe = vec![1f32; 1 << 28];
    let mut sum = 0f32;
    let secs = pool.install(|| time(5, || read_sum(black_box(&probe), &mut sum)));
    black_box(sum);
    drop(probe);
    println!(
        "probe: a 1 GiB read at {:.1} GB/s",
        4e-9 * (1u64 << 28) as f64 / secs
    );
    bench_attention_of::<f32>("f32");
    bench_attention_of::<Bf16>("bf16");
}

fn bench_attention_of<T: KvElem>(name: &str) {
    let pool = one_thread();
    let s = AttentionShape {
        n_heads: 16,
        n_kv_heads: 8,
        head_dim: 128,
        context_len: 2048,
    };
    let mut seed = 3;
    // Each layer's cache: its chunks of KV_CHUNK positions, filled with random keys and values
    // (their layout does not change the work).
    let len = chunk_len(s.n_kv_heads, s.head_dim);
    let cache = |layers: usize, chunks: usize, seed: &mut u64| -> Vec<Vec<HugePages<T>>> {
        (0..layers)
            .map(|_| {
                (0..chunks)
                    .map(|_| {
                        let mut chunk = HugePages::<T>::zeroed(len).unwrap();
                        for (c, x) in chunk.iter_mut().zip(next_values(len, seed)) {
                            *c = T::from_f32(x);
                        }
                        chunk
                    })
                    .collect()
            })
            .collect()
    };
    let width = s.n_heads * s.head_dim;
    let q = next_values(width, &mut seed);
    let mut out = vec![0f32; width];
    // One decode token after `pos` positions in every layer: the bytes of the keys and values
    // it reads, and how fast.
    let mut decode = |layers: &[Vec<HugePages<T>>], pos: usize, what: &str| {
        let secs = pool.install(|| {
            time(7, || {
                for chunks in layers {
                    attention(&mut out, &q, chunks, s, pos, 1);
                }
            })
        });
        let bytes = layers.len() * 2 * s.n_kv_heads * (pos + 1) * s.head_dim * size_of::<T>();
        println!(
            "{name:>5} cache, 1 token after {pos} positions, {what}: {:>7.3} ms, {:>5.1} GB/s",
            secs * 1e3,
            bytes as f64 / secs / 1e9
        );
    };
    // The whole model's 28 layers at 2000 positions: 459 MB in f32, from memory as in decode.
    const LAYERS: usize = 28;
    let layers = cache(LAYERS, s.context_len / KV_CHUNK, &mut seed);
    decode(&layers, 2000, "28 layers");
    // A short context, where each head's keys and values are short runs (200 positions: 100
    // KiB each in f32): eight copies of the model's layers, so that they come from memory too.
    let short = cache(8 * LAYERS, 1, &mut seed);
    decode(&short, 200, "8 x 28 layers");
    drop(short);
    let q = next_values(256 * width, &mut seed);
    let mut out = vec![0f32; 256 * width];
    let secs = pool.install(|| time(7, || attention(&mut out, &q, &layers[0], s, 0, 256)));
    println!(
        "{name:>5} cache, 256-token prompt from position 0, 1 layer: {:>7.3} ms",
        secs * 1e3
    );
}
