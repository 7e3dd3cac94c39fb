//! `qwen3 perplexity <model.bin> -f TEXT [--base BASE.bin]`: how well a model predicts a text,
//! and, given a base model (the same checkpoint at higher precision), how far its next-token
//! distributions are from the base's: the measure of what quantization costs.
//!
//! The text is tokenized and cut into chunks of `--ctx` tokens; each chunk runs from an empty
//! cache, and the logits of every position come from one forward pass
//! (`Session::forward_all_logits`). As llama.cpp's `llama-perplexity` does, only the second half of
//! each chunk is scored, so every scored position has at least `ctx / 2` tokens of context. At
//! a scored position `i`, with `p` the base's next-token distribution and `q` the model's
//! (softmax of the logits, in f64):
//!
//! ```text
//! NLL(i)      = -ln q(token i+1)                       perplexity = exp(mean NLL)
//! KL(p || q)  = sum_v p(v) * (ln p(v) - ln q(v))        >= 0, 0 only when q = p
//! top-1 agree = argmax p == argmax q
//! ```
//!
//! `llama-perplexity --kl-divergence` reports the same three over the same positions
//! (docs/quantization.md compares them). For a mixture of experts it also counts how many of the
//! experts chosen, at every position and sparse layer, the base did not choose: quantization's
//! re-routing, a discontinuous change the KL only shows in sum.

use super::args::{DeviceArgs, KvCacheArg};
use super::device::{self, OnDevice, Place};
use super::input::read_text;
use super::tokenize::open_tokenizer;
use anyhow::{bail, Result};
use clap::Args;
use qwen3_inference::backend::{Backend, KvType};
use qwen3_inference::format::ModelFile;
use qwen3_inference::model::{Model, Session};
use qwen3_inference::sampler::argmax;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
pub struct PerplexityArgs {
    /// Model file written by `qwen3 export`.
    pub model: PathBuf,
    /// The text to score (its exact contents).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// A model file of the same checkpoint to compare with (f32 is the reference): adds the KL
    /// divergence of the model's next-token distributions from the base's, and how often their
    /// most likely tokens agree. On --device cpu or plain: the CUDA backend holds one model's
    /// weights.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Tokens per chunk; the last half of each is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks (default: all the text holds).
    #[arg(long)]
    pub chunks: Option<usize>,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Say on stderr where it runs (the device, threads and kernels).
    #[arg(long)]
    pub verbose: bool,
}

/// What one scored position adds up.
#[derive(Default)]
struct Totals {
    positions: usize,
    nll: f64,
    base_nll: f64,
    /// Each position's KL divergence, for the mean, its standard error and percentiles.
    kl: Vec<f64>,
    top1_same: usize,
    /// A mixture of experts with --base: expert choices (token, sparse layer, one of the k) made,
    /// and those the base did not make, over every position of every chunk.
    expert_choices: usize,
    rerouted: usize,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let device = device::parse(&args.on.device)?;
    device::check(
        device,
        KvCacheArg::F32,
        args.base.is_some().then_some("--base"),
    )?;
    let file = device::open(device, &args.model)?;
    let base_file = args
        .base
        .as_ref()
        .map(|p| device::open(device, p))
        .transpose()?;
    let c = file.config();
    if let Some(b) = &base_file {
        let bc = b.config();
        if (bc.vocab_size, bc.hidden_size, bc.num_hidden_layers)
            != (c.vocab_size, c.hidden_size, c.num_hidden_layers)
        {
            bail!("--base is not the same model: its vocabulary, width or depth differ");
        }
    }
    if args.ctx > c.max_context() as usize {
        bail!(
            "--ctx {} exceeds the model's {} positions",
            args.ctx,
            c.max_context()
        );
    }
    let tokens = open_tokenizer(&args.model)?.encode_with_special_tokens(&read_text(&args.file)?);
    let available = tokens.len() / args.ctx;
    let n_chunks = args.chunks.map_or(available, |n| n.min(available));
    if n_chunks == 0 {
        bail!(
            "{}: {} tokens, fewer than one chunk of --ctx {}",
            args.file.display(),
            tokens.len(),
            args.ctx
        );
    }
    let score = Score {
        tokens: &tokens,
        n_chunks,
        ctx: args.ctx,
        verbose: args.verbose,
    };
    let mut t = device::run_on(device, &file, base_file.as_ref(), score)?;
    print_report(&args, &file, tokens.len(), n_chunks, &mut t);
    Ok(())
}

/// The scored positions of the text's first `n_chunks` chunks of `ctx` tokens, by the model and
/// (the second model `run_on` loads, if any) the base, on whichever device was asked.
struct Score<'t> {
    tokens: &'t [u32],
    n_chunks: usize,
    ctx: usize,
    /// `--verbose`: say where it runs.
    verbose: bool,
}

impl OnDevice for Score<'_> {
    type Out = Totals;

    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        base: Option<&'m Model<'m, B::Tensor>>,
        place: &Place,
    ) -> Result<Totals> {
        if self.verbose {
            eprintln!("device: {}", place.about);
        }
        score(backend, model, base, self)
    }
}

fn score<B: Backend>(
    backend: &B,
    model: &Model<B::Tensor>,
    base: Option<&Model<B::Tensor>>,
    Score {
        tokens,
        n_chunks,
        ctx,
        ..
    }: Score,
) -> Result<Totals> {
    let c = &model.config;
    let mut session = Session::new(backend, model, ctx, KvType::F32)?;
    let mut base_session = match base {
        Some(b) => Some(Session::new(backend, b, ctx, KvType::F32)?),
        None => None,
    };
    let vocab = c.vocab_size as usize;
    let first = ctx / 2;
    // A mixture of experts: record both runs' expert choices to count re-routing.
    let top_k = c.moe.as_ref().map_or(0, |m| m.num_experts_per_tok as usize);
    let routed = top_k > 0 && base_session.is_some();
    if routed {
        session.record_routes(true);
        if let Some(s) = &mut base_session {
            s.record_routes(true);
        }
    }
    let mut t = Totals::default();
    let progress = std::io::stderr().is_terminal();
    for (k, chunk) in tokens.chunks_exact(ctx).take(n_chunks).enumerate() {
        if progress {
            eprint!("\r\x1b[2Kchunk {}/{n_chunks}", k + 1);
        }
        session.truncate(0)?;
        let logits = session.forward_all_logits(chunk)?;
        let base_logits = match &mut base_session {
            Some(s) => {
                s.truncate(0)?;
                Some(s.forward_all_logits(chunk)?)
            }
            None => None,
        };
        if routed {
            let ours = session.record_routes(true);
            let theirs = base_session
                .as_mut()
                .map_or(vec![], |s| s.record_routes(true));
            // Per (position, layer): the k experts of each, ascending; count ours not theirs.
            for (a, b) in ours.chunks_exact(top_k).zip(theirs.chunks_exact(top_k)) {
                t.expert_choices += top_k;
                t.rerouted += a.iter().filter(|e| !b.contains(e)).count();
            }
        }
        // Position i predicts token i + 1.
        for i in first..ctx - 1 {
            let next = chunk[i + 1] as usize;
            let row = &logits[i * vocab..(i + 1) * vocab];
            let q = log_softmax(row);
            t.positions += 1;
            t.nll -= q[next];
            if let Some(bl) = &base_logits {
                let base_row = &bl[i * vocab..(i + 1) * vocab];
                let p = log_softmax(base_row);
                t.base_nll -= p[next];
                t.kl.push(kl_divergence(&p, &q));
                t.top1_same += (argmax(base_row) == argmax(row)) as usize;
            }
        }
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    Ok(t)
}

fn print_report(
    args: &PerplexityArgs,
    file: &ModelFile,
    tokens: usize,
    chunks: usize,
    t: &mut Totals,
) {
    let n = t.positions as f64;
    println!(
        "model        {} ({}, {:.1} MiB)",
        args.model.display(),
        file.config().dtype,
        file.mapped_len() as f64 / (1 << 20) as f64
    );
    println!(
        "text         {}: {tokens} tokens, {chunks} chunks of {}, the last {} positions of each scored: {} positions",
        args.file.display(),
        args.ctx,
        args.ctx - 1 - args.ctx / 2,
        t.positions
    );
    println!("perplexity   {:.4}", (t.nll / n).exp());
    let Some(base) = &args.base else { return };
    println!(
        "base         {} (perplexity {:.4})",
        base.display(),
        (t.base_nll / n).exp()
    );
    let mean = t.kl.iter().sum::<f64>() / n;
    let var = t.kl.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    t.kl.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| t.kl[((p * (n - 1.0)).round() as usize).min(t.kl.len() - 1)];
    println!(
        "KL(base || model)  mean {:.4e} ± {:.2e}   median {:.4e}   99% {:.4e}   max {:.4e}",
        mean,
        (var / n).sqrt(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let same = t.top1_same as f64 / n;
    println!(
        "top-1 agreement    {:.3} % ± {:.3} % ({} of {} positions)",
        100.0 * same,
        100.0 * (same * (1.0 - same) / n).sqrt(),
        t.top1_same,
        t.positions
    );
    if t.expert_choices > 0 {
        println!(
            "experts re-routed  {:.3} % ({} of {} choices of every position and sparse layer differ from the base's)",
            100.0 * t.rerouted as f64 / t.expert_choices as f64,
            t.rerouted,
            t.expert_choices
        );
    }
}

/// `ln softmax(l)` in f64: `l[v] - max - ln(sum exp(l - max))`.
fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    l.iter().map(|&v| v as f64 - lse).collect()
}

/// `KL(p || q) = sum_v p(v) (ln p(v) - ln q(v))`, from log-probabilities.
fn kl_divergence(log_p: &[f64], log_q: &[f64]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .map(|(&lp, &lq)| lp.exp() * (lp - lq))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against values computed by hand: p = softmax([0, ln 3]) = (1/4, 3/4),
    /// q = softmax([0, 0]) = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2).
    #[test]
    fn kl_of_two_known_distributions() {
        let p = log_softmax(&[0.0, 3f32.ln()]);
        let q = log_softmax(&[5.0, 5.0]);
        assert!((p[0].exp() - 0.25).abs() < 1e-7 && (q[1].exp() - 0.5).abs() < 1e-12);
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-7);
        assert_eq!(kl_divergence(&q, &q), 0.0);
    }
}
