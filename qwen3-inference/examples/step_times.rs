//! The time of every decode step from position 0, to find the slow ones (a step that waits for
//! memory, for instance), which a throughput median hides.
//!
//! `cargo run --release -p qwen3-inference --example step_times -- MODEL.bin [STEPS] [THREADS]`
//!
//! Feeds one token at a time (each step's greedy choice) and prints the median step, the slowest
//! steps with their positions, and the steps at the positions where a cache of power-of-two
//! capacity would have to grow.

use anyhow::{Context, Result};
use qwen3_inference::backend::{KvType, CPU};
use qwen3_inference::format::ModelFile;
use qwen3_inference::model::{Model, Session};
use qwen3_inference::sampler::argmax;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .context("usage: step_times MODEL.bin [STEPS] [THREADS]")?;
    let steps: usize = args.get(2).map_or(Ok(2100), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let file = ModelFile::open(std::path::Path::new(path))?;
    let model = Model::load(&file)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let times = pool.install(|| -> Result<Vec<f64>> {
        let mut session = Session::new(CPU, &model, steps, KvType::F32)?;
        let mut token = 0u32;
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let start = Instant::now();
            token = argmax(session.forward(&[token])?) as u32;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(times)
    })?;
    let mut sorted: Vec<(f64, usize)> = times.iter().copied().zip(0..).collect();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "{steps} steps on {threads} thread(s): median {:.1} ms, total {:.1} s",
        sorted[steps / 2].0,
        times.iter().sum::<f64>() / 1e3
    );
    let slowest: Vec<String> = sorted
        .iter()
        .take(6)
        .map(|(t, p)| format!("{p}: {t:.1} ms"))
        .collect();
    println!("slowest (position: time): {}", slowest.join(", "));
    let at: Vec<String> = [127, 128, 255, 256, 511, 512, 1023, 1024, 2047, 2048]
        .into_iter()
        .filter(|&p| p < steps)
        .map(|p| format!("{p}: {:.1}", times[p]))
        .collect();
    println!("at powers of two (position: ms): {}", at.join(", "));
    Ok(())
}
