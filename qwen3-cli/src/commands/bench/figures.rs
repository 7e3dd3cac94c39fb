//! What `qwen3 bench` measures and reports: each repeat's figures ([`Samples`]), their medians
//! with their spread ([`Run`]), and the bytes a decoded token reads ([`TokenReads`]), which turn
//! a decode speed into a share of the bandwidth.

use super::args::BenchArgs;
use qwen3_inference::backend::KvType;
use qwen3_inference::format::ModelFile;

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

/// One thread count's (or the GPU's) figures: medians over the repeats.
pub(super) struct Run {
    /// The thread count, or the GPU ("cuda:0").
    pub(super) on: On,
    pub(super) prefill: (f64, f64),
    pub(super) decode: (f64, f64),
    /// Median of the bandwidths measured before each repeat.
    pub(super) bandwidth: f64,
    /// Median over repeats of decode tok/s * bytes per token / that repeat's bandwidth.
    pub(super) fraction: f64,
}

/// Where a run ran: on the CPU with this many threads, or on a GPU.
#[derive(Clone)]
pub(super) enum On {
    Threads(usize),
    /// The device, as `--device` names it (`cuda:0`).
    Gpu(String),
}

/// The bytes a decoded token reads: every matrix and norm once (the classifier is the embedding
/// table when tied, already counted; of a mixture of experts only the experts a token chooses,
/// `Header::active_weights`), and the KV cache of the positions before it.
pub(super) struct TokenReads {
    pub(super) weights: u64,
    /// Keys and values (f32 or bf16) of every layer and kv head for positions 0 ..= p, averaged
    /// over the decoded tokens, at positions prompt .. prompt + n.
    pub(super) kv: f64,
    pub(super) kv_type: KvType,
}

impl TokenReads {
    pub(super) fn new(file: &ModelFile, args: &BenchArgs) -> TokenReads {
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

    pub(super) fn total(&self) -> f64 {
        self.weights as f64 + self.kv
    }
}

/// Each repeat's figures, for a [`Run`]'s medians.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) prefill: Vec<f64>,
    pub(super) decode: Vec<f64>,
    pub(super) bandwidth: Vec<f64>,
    pub(super) fraction: Vec<f64>,
}

impl Samples {
    /// One repeat: its prefill and decode tok/s, and the bandwidth measured just before it.
    pub(super) fn push(&mut self, prefill: f64, decode: f64, bandwidth: f64, reads: &TokenReads) {
        self.prefill.push(prefill);
        self.decode.push(decode);
        self.fraction.push(decode * reads.total() / bandwidth);
        self.bandwidth.push(bandwidth);
    }

    pub(super) fn into_run(mut self, on: On) -> Run {
        Run {
            on,
            prefill: median_spread(&mut self.prefill),
            decode: median_spread(&mut self.decode),
            bandwidth: median_spread(&mut self.bandwidth).0,
            fraction: median_spread(&mut self.fraction).0,
        }
    }
}
