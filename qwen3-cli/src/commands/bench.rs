//! `qwen3 bench <model.bin>`: prefill and decode speed, next to this machine's memory bandwidth.
//!
//! Decoding one token reads every weight once, and the keys and values of every earlier position
//! (f32, all layers), so `bandwidth / bytes per token` is a ceiling on decode tokens/s; the
//! fraction of it reached says how close the kernels are to the hardware. The bandwidth is
//! measured here, at each thread count, by reading a buffer much larger than the caches with a
//! loop that does nothing else (`kernels::bandwidth`), right before each repeat's decode: on a shared machine
//! the bandwidth drifts between runs, and each repeat's fraction is taken against the bandwidth
//! of its own moment (the median of those fractions is reported).
//!
//! That buffer is asked for 2 MiB pages, as the model file's mapping is (pages.rs): the
//! ceiling is what the machine streams at its best. Whether the weights got huge pages depends on
//! the kernel and the page cache, so the share of them that did is printed too.
//!
//! `--device cuda` measures the same on a GPU (a build with `--features cuda`): the weights are
//! uploaded once, the same forward pass runs over the CUDA backend, and the bandwidth is that of
//! a device-to-device copy (`CudaRuntime::copy_bandwidth`), before each repeat.

use super::args::KvCacheArg;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use qwen3_cuda::device::check_available;
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, KvType, CPU};
use qwen3_inference::format::reader::TensorInfo;
use qwen3_inference::format::{DType, ModelFile};
use qwen3_inference::kernels::bandwidth::read_sum;
use qwen3_inference::kernels::dot::dots;
use qwen3_inference::model::{Model, Session};
use qwen3_inference::pages::{huge_page_share, HugePageF32s, PageShare};
use qwen3_inference::sampler::argmax;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Model file written by `qwen3 export`.
    pub model: PathBuf,
    /// Prompt tokens processed in one prefill. (No `-p`: that is the top-p of `inference`.)
    #[arg(long = "prompt-tokens", default_value_t = 128)]
    pub prompt: usize,
    /// Tokens decoded one at a time after the prefill.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub decode: usize,
    /// Thread counts to measure, comma-separated (default: 1 and all cores). (No `-t`: that is
    /// the temperature in `inference`.)
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Repeats per thread count; medians are reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// What the KV cache stores keys and values as (as `qwen3 inference --kv-cache`).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache: KvCacheArg,
    /// Where to run: cpu, or cuda (device 0) / cuda:N with a build with `--features cuda`
    /// (--threads then does not apply).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Instead of the table above: speculative decoding's ceiling, decode with each of these
    /// draft lengths (comma-separated) against plain decode, the draft being the plain greedy
    /// answer replayed, every draft accepted (bench_draft.rs).
    #[arg(long, value_delimiter = ',', value_name = "LENGTHS")]
    pub draft_replay: Vec<usize>,
    /// With --draft-replay: also decode with this draft model's guesses at each length (a model
    /// with the same tokens, as `qwen3 generate --draft-model`), reporting how many it got right.
    #[arg(long, value_name = "MODEL", requires = "draft_replay")]
    pub draft_model: Option<PathBuf>,
}

/// Median and (max - min) of a sample.
pub(super) fn median_spread(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (m, v[v.len() - 1] - v[0])
}

/// Memory read bandwidth in bytes/s with `pool`'s threads: each thread reads its share of a
/// buffer (1 GiB, in huge pages where the system has them) with `kernels::bandwidth::read_sum`;
/// median of 3.
fn measure_bandwidth(pool: &rayon::ThreadPool, buf: &[f32]) -> f64 {
    let threads = pool.current_num_threads();
    let chunk = buf.len().div_ceil(threads);
    let mut samples: Vec<f64> = (0..3)
        .map(|_| {
            let start = Instant::now();
            let s: f32 = pool.install(|| {
                use rayon::prelude::*;
                buf.par_chunks(chunk)
                    .map(|c| {
                        let mut s = 0.0;
                        read_sum(c, &mut s);
                        s
                    })
                    .sum()
            });
            std::hint::black_box(s);
            (buf.len() * 4) as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    median_spread(&mut samples).0
}

struct Run {
    /// The thread count, or the GPU ("cuda:0").
    on: On,
    prefill: (f64, f64),
    decode: (f64, f64),
    /// Median of the bandwidths measured before each repeat.
    bandwidth: f64,
    /// Median over repeats of decode tok/s * bytes per token / that repeat's bandwidth.
    fraction: f64,
}

/// Where a run ran: on the CPU with this many threads, or on a GPU.
#[derive(Clone)]
enum On {
    Threads(usize),
    /// Only a `--features cuda` build makes one.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Gpu(String),
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.prompt == 0 || args.decode == 0 || args.repeats == 0 {
        bail!("--prompt-tokens, -n and -r must be at least 1");
    }
    if args.threads.contains(&0) {
        bail!("--threads: thread counts must be at least 1");
    }
    let device: Device = args.device.parse().map_err(|e: String| anyhow!(e))?;
    check_available(device).map_err(|e| anyhow!(e))?;
    let file = ModelFile::open(&args.model)?;
    let c = file.config();
    let ctx = args.prompt + args.decode;
    if ctx > c.max_context() as usize {
        bail!(
            "--prompt-tokens + -n = {ctx} exceeds the model's {} positions",
            c.max_context()
        );
    }
    let reads = TokenReads::new(&file, &args);
    // Deterministic token ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..args.prompt as u64)
        .map(|i| ((i * 7919 + 13) % c.vocab_size as u64) as u32)
        .collect();
    match device {
        Device::Cpu => {}
        Device::Plain => bail!("bench measures --device cpu or cuda (plain is the textbook loops, for reading, not for speed)"),
        Device::Cuda(ordinal) => {
            if !args.threads.is_empty() {
                bail!("--threads is for --device cpu");
            }
            if reads.kv_type != KvType::F32 {
                bail!("--kv-cache bf16 is for --device cpu: the CUDA backend keeps its KV cache in f32");
            }
            let (run, kernels) = cuda::measure(&args, &file, &prompt, &reads, ordinal)?;
            return report(&args, &file, &reads, None, &[run], &kernels);
        }
    }
    let model = Model::load(&file)?;
    if !args.draft_replay.is_empty() {
        let draft_file = match &args.draft_model {
            Some(d) => Some(super::args::open_draft_model(d, &args.model, None, false)?),
            None => None,
        };
        let draft = draft_file.as_ref().map(Model::load).transpose()?;
        let threads = thread_counts(&args);
        return super::bench_draft::run(&args, &model, draft.as_ref(), &prompt, &threads);
    }
    // 2^28 f32s: 1 GiB.
    let mut buf = HugePageF32s::zeroed(1 << 28).context("cannot map the bandwidth buffer")?;
    buf.fill(1.0);
    let runs = (thread_counts(&args).into_iter())
        .map(|t| measure(&args, &model, &prompt, &buf, &reads, t))
        .collect::<Result<Vec<Run>>>()?;
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K"); // erase the progress line
    }
    let pages = Pages {
        // Read after the runs, when every weight has been touched.
        weights: file.page_share(),
        buffer: huge_page_share(buf.as_ptr() as *const u8),
    };
    report(&args, &file, &reads, Some(&pages), &runs, dots().isa)
}

/// The report, as a table or as JSON. `pages`: the CPU's huge-page shares (none on a GPU).
fn report(
    args: &BenchArgs,
    file: &ModelFile,
    reads: &TokenReads,
    pages: Option<&Pages>,
    runs: &[Run],
    kernels: &str,
) -> Result<()> {
    if args.json {
        print_json(args, file, reads, pages, runs, kernels)
    } else {
        print_table(args, file, reads, pages, runs, kernels);
        Ok(())
    }
}

/// The bytes a decoded token reads: every matrix and norm once (the classifier is the embedding
/// table when tied, already counted; of a mixture of experts only the experts a token chooses,
/// `Header::active_weights`), and the KV cache of the positions before it.
struct TokenReads {
    weights: u64,
    /// Keys and values (f32 or bf16) of every layer and kv head for positions 0 ..= p, averaged
    /// over the decoded tokens, at positions prompt .. prompt + n.
    kv: f64,
    kv_type: KvType,
}

impl TokenReads {
    fn new(file: &ModelFile, args: &BenchArgs) -> TokenReads {
        let c = file.config();
        let kv_type: KvType = args.kv_cache.into();
        let per_position = 2
            * c.num_hidden_layers as u64
            * c.num_key_value_heads as u64
            * c.head_dim as u64
            * kv_type.bytes() as u64;
        TokenReads {
            weights: file.header().active_weights().bytes,
            kv: per_position as f64 * (args.prompt as f64 + (args.decode as f64 + 1.0) / 2.0),
            kv_type,
        }
    }

    fn total(&self) -> f64 {
        self.weights as f64 + self.kv
    }
}

/// `--threads`, or 1 and every core.
fn thread_counts(args: &BenchArgs) -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match (args.threads.is_empty(), cores) {
        (false, _) => args.threads.clone(),
        (true, 1) => vec![1],
        (true, cores) => vec![1, cores],
    }
}

/// `-r` repeats on `threads` threads: before each, the bandwidth; then a prefill of the prompt
/// and `-n` greedy decode steps, timed.
fn measure(
    args: &BenchArgs,
    model: &Model,
    prompt: &[u32],
    buf: &[f32],
    reads: &TokenReads,
    threads: usize,
) -> Result<Run> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the thread pool")?;
    let mut samples = Samples::default();
    let ctx = args.prompt + args.decode;
    let mut session = pool.install(|| Session::new(CPU, model, ctx, reads.kv_type))?;
    // A line that says where the runs are, on a terminal (erased before the report).
    let progress = std::io::stderr().is_terminal();
    for i in 0..args.repeats {
        if progress {
            let s = if threads == 1 { "" } else { "s" };
            eprint!(
                "\r\x1b[2K{threads} thread{s}: repeat {} of {}",
                i + 1,
                args.repeats
            );
        }
        let bandwidth = measure_bandwidth(&pool, buf);
        pool.install(|| -> Result<()> {
            let (p, d) = prefill_and_decode(&mut session, prompt, args.decode)?;
            samples.push(p, d, bandwidth, reads);
            Ok(())
        })?;
    }
    Ok(samples.into_run(On::Threads(threads)))
}

/// Each repeat's figures, for a [`Run`]'s medians.
#[derive(Default)]
struct Samples {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    bandwidth: Vec<f64>,
    fraction: Vec<f64>,
}

impl Samples {
    /// One repeat: its prefill and decode tok/s, and the bandwidth measured just before it.
    fn push(&mut self, prefill: f64, decode: f64, bandwidth: f64, reads: &TokenReads) {
        self.prefill.push(prefill);
        self.decode.push(decode);
        self.fraction.push(decode * reads.total() / bandwidth);
        self.bandwidth.push(bandwidth);
    }

    fn into_run(mut self, on: On) -> Run {
        Run {
            on,
            prefill: median_spread(&mut self.prefill),
            decode: median_spread(&mut self.decode),
            bandwidth: median_spread(&mut self.bandwidth).0,
            fraction: median_spread(&mut self.fraction).0,
        }
    }
}

/// One repeat: a prefill of `prompt` in one forward, then `decode` greedy steps; their tokens/s.
/// (The logits come back to the host at each step, so the clock stops when the device is done.)
fn prefill_and_decode<B: Backend>(
    session: &mut Session<B>,
    prompt: &[u32],
    decode: usize,
) -> Result<(f64, f64)> {
    session.truncate(0)?;
    let start = Instant::now();
    let logits = session.forward(prompt)?;
    let mut next = argmax(logits) as u32;
    let prefill = prompt.len() as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 0..decode {
        let logits = session.forward(&[next])?;
        next = argmax(logits) as u32;
    }
    Ok((prefill, decode as f64 / start.elapsed().as_secs_f64()))
}

/// `--device cuda:N`: the weights uploaded once, then `-r` repeats, each after a measurement of
/// the device's copy bandwidth.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use qwen3_cuda::cuda::CudaBackend;

    /// The run, and the kernels' description ("CUDA on NVIDIA H200 (compute 9.0)").
    pub fn measure(
        args: &BenchArgs,
        file: &ModelFile,
        prompt: &[u32],
        reads: &TokenReads,
        ordinal: usize,
    ) -> Result<(Run, String)> {
        let gpu = CudaBackend::load(ordinal, file)?;
        let model = Model::load_with(file, |name| gpu.weights.tensor(name))?;
        let mut session = Session::new(&gpu, &model, args.prompt + args.decode, KvType::F32)?;
        let mut samples = Samples::default();
        // One untimed pass first: the driver finishes loading the kernels at their first launch.
        prefill_and_decode(&mut session, prompt, 1)?;
        for _ in 0..args.repeats {
            // 1 GiB, far beyond any GPU's L2 cache.
            let bandwidth = gpu.runtime.copy_bandwidth(1 << 30)?;
            let (p, d) = prefill_and_decode(&mut session, prompt, args.decode)?;
            samples.push(p, d, bandwidth, reads);
        }
        let run = samples.into_run(On::Gpu(format!("cuda:{ordinal}")));
        Ok((run, format!("CUDA on {}", gpu.runtime.description)))
    }
}

/// Without the `cuda` feature `check_available` has already refused any CUDA device.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub fn measure(
        _args: &BenchArgs,
        _file: &ModelFile,
        _prompt: &[u32],
        _reads: &TokenReads,
        _ordinal: usize,
    ) -> Result<(Run, String)> {
        bail!("{}", qwen3_cuda::device::cuda_support().unwrap_err())
    }
}

/// How much of the weights and of the bandwidth buffer lies in 2 MiB pages ("Huge pages" in
/// docs/performance.md).
struct Pages {
    weights: Option<PageShare>,
    buffer: Option<PageShare>,
}

/// `--json`: one object with the same figures as the table.
/// How many of the file's matrices are stored as `dtype`.
fn matrices_of(file: &ModelFile, dtype: DType) -> usize {
    let matrix = |t: &&TensorInfo| t.shape.len() == 2 && t.dtype == dtype;
    file.header().tensors.iter().filter(matrix).count()
}

fn print_json(
    args: &BenchArgs,
    file: &ModelFile,
    reads: &TokenReads,
    pages: Option<&Pages>,
    runs: &[Run],
    kernels: &str,
) -> Result<()> {
    let c = file.config();
    let bytes_per_token = reads.total();
    let runs: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            let (threads, device) = match &r.on {
                On::Threads(t) => (Some(*t), "cpu".to_string()),
                On::Gpu(d) => (None, d.clone()),
            };
            serde_json::json!({
                "device": device,
                "threads": threads,
                "prefill_tok_s": r.prefill.0,
                "prefill_spread": r.prefill.1,
                "decode_tok_s": r.decode.0,
                "decode_spread": r.decode.1,
                "bandwidth_gb_s": r.bandwidth / 1e9,
                "ceiling_tok_s": r.bandwidth / bytes_per_token,
                "fraction_of_ceiling": r.fraction,
            })
        })
        .collect();
    // Per dtype, how many matrices are stored so (a q4 file keeps some in q6 or q8: `Q4Mix`).
    let matrices: serde_json::Map<String, serde_json::Value> = DType::ALL
        .into_iter()
        .filter(|&d| matrices_of(file, d) > 0)
        .map(|d| (d.name().to_string(), matrices_of(file, d).into()))
        .collect();
    let out = serde_json::json!({
        "model": args.model.display().to_string(),
        "dtype": c.dtype.name(),
        "group_size": c.group_size,
        "matrices": matrices,
        "bytes_per_token": bytes_per_token,
        "weight_bytes": reads.weights,
        "kv_bytes_per_token": reads.kv,
        "kv_cache": reads.kv_type.name(),
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "repeats": args.repeats,
        "isa": kernels,
        "weights_in_huge_pages": pages.and_then(|p| p.weights).map(|p| p.fraction()),
        "bandwidth_buffer_in_huge_pages": pages.and_then(|p| p.buffer).map(|p| p.fraction()),
        "runs": runs,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The report as a table, with what a reader needs to trust its last column.
fn print_table(
    args: &BenchArgs,
    file: &ModelFile,
    reads: &TokenReads,
    pages: Option<&Pages>,
    runs: &[Run],
    kernels: &str,
) {
    // "197 q8 matrices", or for a q4 file with some kept finer (`Q4Mix`) "168 q4 + 29 q8".
    let matrices: Vec<String> = DType::ALL
        .into_iter()
        .map(|d| (d, matrices_of(file, d)))
        .filter(|&(_, n)| n > 0)
        .map(|(d, n)| format!("{n} {d}"))
        .rev()
        .collect();
    let matrices = matrices.join(" + ");
    println!(
        "{}: {} matrices; a decoded token reads {} of weights and {} of KV cache ({}) on average; kernels {}; {} repeats, medians (spread)",
        args.model.display(),
        matrices,
        super::units::bytes(reads.weights),
        super::units::bytes(reads.kv as u64),
        reads.kv_type.name(),
        kernels,
        args.repeats
    );
    if let Some(pages) = pages {
        print_pages(args, pages);
    }
    let first = match runs.first().map(|r| &r.on) {
        Some(On::Gpu(_)) => "device",
        _ => "threads",
    };
    println!(
        "{:>7}  {:>20}  {:>20}  {:>12}  {:>12}  {:>9}",
        first, "prefill tok/s", "decode tok/s", "bandwidth", "ceiling", "of ceil."
    );
    for r in runs {
        let ceiling = r.bandwidth / reads.total();
        // Decode cannot stream from memory faster than memory streams: above 100%, the bytes
        // did not all come from memory (see below), and the fraction means nothing.
        let fraction = if r.fraction <= 1.0 {
            format!("{:.0}%", 100.0 * r.fraction)
        } else {
            "-".to_string()
        };
        let on = match &r.on {
            On::Threads(t) => t.to_string(),
            On::Gpu(d) => d.clone(),
        };
        println!(
            "{:>7}  {:>11.1} ({:>6.1})  {:>11.1} ({:>6.1})  {:>7.1} GB/s  {:>6.1} tok/s  {:>9}",
            on,
            r.prefill.0,
            r.prefill.1,
            r.decode.0,
            r.decode.1,
            r.bandwidth / 1e9,
            ceiling,
            fraction
        );
    }
    if let Some(r) = runs.iter().find(|r| r.fraction > 1.0) {
        let on = match &r.on {
            On::Threads(1) => "with 1 thread".to_string(),
            On::Threads(t) => format!("with {t} threads"),
            On::Gpu(d) => format!("on {d}"),
        };
        println!(
            "(-: decode ran at {:.1} times the memory ceiling {on}: a token's {} fit in this machine's caches, so they are not read from memory; the ceiling applies to models larger than the caches)",
            r.fraction,
            super::units::bytes(reads.total() as u64)
        );
    }
}

/// The CPU's huge-page shares, and how to get more of them.
fn print_pages(args: &BenchArgs, pages: &Pages) {
    let share = |p: Option<PageShare>| {
        p.map_or("unknown".into(), |p| {
            format!("{:.0}%", 100.0 * p.fraction())
        })
    };
    println!(
        "in 2 MiB pages: {} of the resident weights, {} of the bandwidth buffer",
        share(pages.weights),
        share(pages.buffer)
    );
    if pages.weights.is_some_and(|p| p.fraction() < 0.5) {
        // The page cache keeps the folio sizes the file arrived with (pages.rs); read back
        // after an eviction, it comes in 2 MiB folios where the kernel and filesystem allow.
        println!(
            "(to have the page cache read the file back in large pages: dd of={} oflag=nocache conv=notrunc,fdatasync count=0)",
            args.model.display()
        );
    }
}
