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
//! `--device cuda` measures the same on a GPU (a build with `--features cuda`): the model is
//! loaded through the path every command takes (`device::run_on`), the same forward pass runs
//! over the CUDA backend, and the bandwidth is that of a device-to-device copy
//! (`CudaRuntime::copy_bandwidth`, which `run_on` hands over in its `Place`), before each repeat.

mod args;
mod draft;
mod figures;
mod report;

pub use args::BenchArgs;

use super::device::{self, OnDevice, Place};
use anyhow::{bail, Context, Result};
use figures::{median_spread, On, Run, Samples, TokenReads};
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, KvType, CPU};
use qwen3_inference::format::ModelFile;
use qwen3_inference::kernels::bandwidth::read_sum;
use qwen3_inference::model::{Model, Session};
use qwen3_inference::pages::{huge_page_share, HugePageF32s};
use qwen3_inference::sampler::argmax;
use report::{Pages, Report};
use std::io::IsTerminal;
use std::time::Instant;

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

pub fn run(args: BenchArgs) -> Result<()> {
    if args.prompt == 0 || args.decode == 0 || args.repeats == 0 {
        bail!("--prompt-tokens, -n and -r must be at least 1");
    }
    if args.threads.contains(&0) {
        bail!("--threads: thread counts must be at least 1");
    }
    let device = device::parse(&args.device)?;
    let file = device::open(device, &args.model)?;
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
        Device::Cuda(_) => {
            device::check(device, args.kv_cache, None)?;
            if !args.threads.is_empty() {
                bail!("--threads is for --device cpu");
            }
            if !args.draft_replay.is_empty() {
                bail!("--draft-replay is for --device cpu");
            }
        }
    }
    // A draft model only for `--draft-replay`, which measures it.
    let draft = match (&args.draft_model, args.draft_replay.is_empty()) {
        (Some(d), false) => Some(super::args::open_draft_model(d, &args.model, None, false)?),
        _ => None,
    };
    let work = Measure {
        device,
        args: &args,
        file: &file,
        prompt: &prompt,
        reads: &reads,
    };
    device::run_on(device, &file, draft.as_ref(), work)
}

/// What bench measures, on whichever device `run_on` loaded the model.
struct Measure<'a> {
    device: Device,
    args: &'a BenchArgs,
    file: &'a ModelFile,
    prompt: &'a [u32],
    reads: &'a TokenReads,
}

impl OnDevice for Measure<'_> {
    type Out = ();

    /// On a GPU (bench refuses `--device plain` before loading): one run.
    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        _draft: Option<&'m Model<'m, B::Tensor>>,
        place: &Place,
    ) -> Result<()> {
        let Some(copy_bandwidth) = place.gpu_bandwidth else {
            bail!("bench measures --device cpu or cuda, not {}", place.about);
        };
        let (args, prompt, reads) = (self.args, self.prompt, self.reads);
        let mut session = Session::new(backend, model, args.prompt + args.decode, KvType::F32)?;
        let mut samples = Samples::default();
        // One untimed pass first (unless `--no-warmup`): the driver finishes loading the
        // kernels at their first launch.
        if !args.no_warmup {
            prefill_and_decode(&mut session, prompt, 1)?;
        }
        for _ in 0..args.repeats {
            // 1 GiB, far beyond any GPU's L2 cache.
            let bandwidth = copy_bandwidth(1 << 30)?;
            let (p, d) = prefill_and_decode(&mut session, prompt, args.decode)?;
            samples.push(p, d, bandwidth, reads);
        }
        let runs = [samples.into_run(On::Gpu(self.device.to_string()))];
        self.report(&runs, None, &place.kernels)
    }

    /// On the CPU: each thread count in its own pool, or `--draft-replay`'s runs.
    fn run_on_cpu<'m>(
        self,
        model: &'m Model<'m>,
        draft: Option<&'m Model<'m>>,
        place: &Place,
    ) -> Result<()> {
        let (args, prompt, reads) = (self.args, self.prompt, self.reads);
        let threads = thread_counts(args);
        if !args.draft_replay.is_empty() {
            return draft::run(args, model, draft, prompt, &threads);
        }
        // 2^28 f32s: 1 GiB.
        let mut buf = HugePageF32s::zeroed(1 << 28).context("cannot map the bandwidth buffer")?;
        buf.fill(1.0);
        let runs = (threads.into_iter())
            .map(|t| measure(args, model, prompt, &buf, reads, t))
            .collect::<Result<Vec<Run>>>()?;
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K"); // erase the progress line
        }
        let pages = Pages {
            // Read after the runs, when every weight has been touched.
            weights: self.file.page_share(),
            buffer: huge_page_share(buf.as_ptr() as *const u8),
        };
        self.report(&runs, Some(&pages), &place.kernels)
    }
}

impl Measure<'_> {
    fn report(&self, runs: &[Run], pages: Option<&Pages>, kernels: &str) -> Result<()> {
        Report {
            args: self.args,
            file: self.file,
            reads: self.reads,
            pages,
            runs,
            kernels,
        }
        .print()
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

/// `-r` repeats on `threads` threads, after an untimed one (unless `--no-warmup`): before each,
/// the bandwidth; then a prefill of the prompt and `-n` greedy decode steps, timed.
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
    // One untimed prefill of the prompt and one decode step first, as llama-bench warms up
    // each of its tests: the first forward pass on a new pool and session faults in the KV
    // cache's pages and grows each thread's buffers, which no later pass pays.
    if !args.no_warmup {
        pool.install(|| prefill_and_decode(&mut session, prompt, 1))?;
    }
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
