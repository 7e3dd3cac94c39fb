//! `qwen3 bench`'s report: a table (with what a reader needs to trust its last column) or one
//! JSON object, with the same figures.

use super::args::BenchArgs;
use super::figures::{On, Run, TokenReads};
use crate::commands::units;
use anyhow::Result;
use qwen3_inference::format::reader::TensorInfo;
use qwen3_inference::format::{DType, ModelFile};
use qwen3_inference::pages::PageShare;

/// How much of the weights and of the bandwidth buffer lies in 2 MiB pages ("Huge pages" in
/// docs/performance.md).
pub(super) struct Pages {
    pub(super) weights: Option<PageShare>,
    pub(super) buffer: Option<PageShare>,
}

/// How many of the file's matrices are stored as `dtype`.
fn matrices_of(file: &ModelFile, dtype: DType) -> usize {
    let matrix = |t: &&TensorInfo| t.shape.len() == 2 && t.dtype == dtype;
    file.header().tensors.iter().filter(matrix).count()
}

/// What `qwen3 bench` measured, and of what: printed as a table or as JSON.
pub(super) struct Report<'a> {
    pub(super) args: &'a BenchArgs,
    pub(super) file: &'a ModelFile,
    pub(super) reads: &'a TokenReads,
    /// The CPU's huge-page shares (none on a GPU).
    pub(super) pages: Option<&'a Pages>,
    pub(super) runs: &'a [Run],
    /// The kernels' instruction set, or the GPU's.
    pub(super) kernels: &'a str,
}

impl Report<'_> {
    /// The report, as a table or as JSON (`--json`).
    pub(super) fn print(&self) -> Result<()> {
        match self.args.json {
            true => self.print_json(),
            false => {
                self.print_table();
                Ok(())
            }
        }
    }

    /// `--json`: one object with the same figures as the table.
    fn print_json(&self) -> Result<()> {
        let Report {
            args,
            file,
            reads,
            pages,
            runs,
            kernels,
        } = *self;
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
    fn print_table(&self) {
        let Report {
            args,
            file,
            reads,
            pages,
            runs,
            kernels,
        } = *self;
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
        units::bytes(reads.weights),
        units::bytes(reads.kv as u64),
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
            units::bytes(reads.total() as u64)
        );
        }
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
