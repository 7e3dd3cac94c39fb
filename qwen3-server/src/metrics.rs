//! `GET /metrics`: counters, gauges and histograms in Prometheus' text format (version 0.0.4, what
//! Prometheus scrapes and vLLM and llama-server expose), written by hand: the format is a few
//! lines of text per metric.
//!
//! The handlers count requests, tokens and latencies; the worker sets the engine's gauges after
//! every step. Everything is an atomic, so neither side waits for the other.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// A histogram with fixed bucket bounds (seconds, or a count): per-bucket counts, the sum and
/// the count, as Prometheus' cumulative `_bucket{le=...}` lines.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// The sum of the observed values, in millionths (an integer, to add atomically).
    sum_micro: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micro: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_micro.fetch_add((v * 1e6).round() as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micro.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Latency buckets, seconds: from a fast decode step to a long queue wait.
const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Sequences in one step of the engine.
const SEQUENCES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// What the server counts.
pub struct Metrics {
    /// Requests answered, by route and status: `(route, status) -> count`.
    requests: Mutex<Vec<((String, u16), u64)>>,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    /// Sequences that ran in each step.
    pub step_sequences: Histogram,
    /// Set by the worker after each step.
    pub queued: AtomicU64,
    pub running: AtomicU64,
    pub kv_cache_bytes: AtomicU64,
    /// [`qwen3_inference::engine::Engine::kv_usage`], 0 to 1, as an `f64`'s bits.
    pub kv_cache_usage: AtomicU64,
    /// Requests that found part of their prompt in a slot's cache, and the tokens they found.
    pub prefix_cache_hits: AtomicU64,
    pub prefix_cache_tokens: AtomicU64,
    /// Speculative decoding (`--draft`): tokens drafted, and those the model accepted, of the
    /// finished requests.
    pub draft_tokens: AtomicU64,
    pub draft_accepted_tokens: AtomicU64,
    /// Images encoded (requests with images, each image once).
    pub images: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(Vec::new()),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            time_to_first_token: Histogram::new(SECONDS),
            inter_token_latency: Histogram::new(SECONDS),
            step_sequences: Histogram::new(SEQUENCES),
            queued: AtomicU64::new(0),
            running: AtomicU64::new(0),
            kv_cache_bytes: AtomicU64::new(0),
            kv_cache_usage: AtomicU64::new(0),
            prefix_cache_hits: AtomicU64::new(0),
            prefix_cache_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            draft_accepted_tokens: AtomicU64::new(0),
            images: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// One request answered on `route` with `status`.
    pub fn request(&self, route: &str, status: u16) {
        // Unknown paths are one label, not one per path a scanner tries.
        let route = match route {
            "/health"
            | "/metrics"
            | "/v1/models"
            | "/v1/completions"
            | "/v1/chat/completions"
            | "/v1/embeddings"
            | "/v1/rerank"
            | "/rerank"
            | "/api/chat"
            | "/api/generate"
            | "/api/embed" => route,
            r if r.starts_with("/v1/models/") => "/v1/models/{id}",
            _ => "other",
        };
        let mut r = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        match r.iter_mut().find(|(k, _)| k.0 == route && k.1 == status) {
            Some((_, n)) => *n += 1,
            None => r.push(((route.to_string(), status), 1)),
        }
    }

    /// `n` images encoded.
    pub fn images(&self, n: usize) {
        self.images.fetch_add(n as u64, Relaxed);
    }

    pub fn tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Relaxed);
        self.generation_tokens.fetch_add(generated as u64, Relaxed);
    }

    pub fn first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }

    pub fn next_token(&self, after: Duration) {
        self.inter_token_latency.observe(after.as_secs_f64());
    }

    /// The text Prometheus scrapes.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: &dyn std::fmt::Display| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let _ = writeln!(
            out,
            "# HELP qwen3_requests_total Requests answered, by route and HTTP status.\n# TYPE qwen3_requests_total counter"
        );
        let mut reqs = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        reqs.sort();
        for ((route, status), n) in reqs {
            let _ = writeln!(
                out,
                "qwen3_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        counter(
            &mut out,
            "qwen3_prompt_tokens_total",
            "Prompt tokens of the requests answered.",
            self.prompt_tokens.load(Relaxed),
        );
        counter(
            &mut out,
            "qwen3_generation_tokens_total",
            "Tokens generated for the requests answered.",
            self.generation_tokens.load(Relaxed),
        );
        self.time_to_first_token.render(
            &mut out,
            "qwen3_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "qwen3_inter_token_latency_seconds",
            "Between two tokens of one answer.",
        );
        self.step_sequences.render(
            &mut out,
            "qwen3_step_sequences",
            "Sequences in each step of the engine (the batch size).",
        );
        gauge(
            &mut out,
            "qwen3_queued_requests",
            "Requests waiting for a free sequence.",
            &self.queued.load(Relaxed),
        );
        gauge(
            &mut out,
            "qwen3_running_sequences",
            "Sequences generating now.",
            &self.running.load(Relaxed),
        );
        gauge(
            &mut out,
            "qwen3_kv_cache_bytes",
            "Bytes of keys and values the slots hold (their prefix caches included).",
            &self.kv_cache_bytes.load(Relaxed),
        );
        gauge(
            &mut out,
            "qwen3_kv_cache_usage_ratio",
            "Share of the KV cache's positions (slots x context) that running requests hold, 0 to 1.",
            &f64::from_bits(self.kv_cache_usage.load(Relaxed)),
        );
        counter(
            &mut out,
            "qwen3_prefix_cache_hits_total",
            "Requests that found part of their prompt in a slot's cache.",
            self.prefix_cache_hits.load(Relaxed),
        );
        counter(
            &mut out,
            "qwen3_prefix_cache_tokens_total",
            "Prompt tokens taken from the slots' caches instead of being run.",
            self.prefix_cache_tokens.load(Relaxed),
        );
        counter(
            &mut out,
            "qwen3_images_total",
            "Images encoded by the vision tower (each image of each request once).",
            self.images.load(Relaxed),
        );
        counter(
            &mut out,
            "qwen3_draft_tokens_total",
            "Tokens drafted for speculative decoding (--draft, --draft-model), of the finished requests.",
            self.draft_tokens.load(Relaxed),
        );
        counter(
            &mut out,
            "qwen3_draft_accepted_tokens_total",
            "Drafted tokens the model agreed with (each an answer token that took no step of its own).",
            self.draft_accepted_tokens.load(Relaxed),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_lines_are_cumulative() {
        let m = Metrics::default();
        for v in [0.003, 0.02, 0.02, 7.0, 100.0] {
            m.time_to_first_token.observe(v);
        }
        let text = m.render();
        for line in [
            "qwen3_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "qwen3_time_to_first_token_seconds_bucket{le=\"0.025\"} 3",
            "qwen3_time_to_first_token_seconds_bucket{le=\"10\"} 4",
            "qwen3_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5",
            "qwen3_time_to_first_token_seconds_sum 107.043",
            "qwen3_time_to_first_token_seconds_count 5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        m.request("/wp-admin", 404);
        let text = m.render();
        assert!(text.contains("qwen3_requests_total{route=\"/v1/completions\",status=\"200\"} 2"));
        assert!(text.contains("qwen3_requests_total{route=\"other\",status=\"404\"} 1"));
    }
}
