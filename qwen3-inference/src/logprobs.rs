//! Log-probabilities of a generated token and of its most likely alternatives, as OpenAI's
//! `logprobs` report them.
//!
//! They are the log-softmax of the model's logits, `logprob(i) = logit(i) - log(sum_j
//! exp(logit(j)))`, before anything the sampler does (temperature, penalties, top-k/top-p/min-p):
//! what the model thinks of each token, the same whatever the sampling settings (vLLM reports
//! these by default too). With an f32 model they equal HuggingFace's
//! `torch.log_softmax(logits, -1)` (tested against it in qwen3-cli/tests/parity.rs).

/// The chosen token's log-probability and the `top` most likely tokens with theirs (most likely
/// first; ties by lower id, as a stable sort of the logits gives).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Most alternatives a request may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP: usize = 20;

/// `logits` -> [`TokenLogprobs`] of `token` and the `top` (at most [`MAX_TOP`]) best tokens.
///
/// The normaliser `log(sum_j exp(logit_j))` is computed as `max + log(sum_j exp(logit_j - max))`
/// (no overflow), summed in f64 over the whole vocabulary.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_sum = sum.ln();
    // (l - max) - log(sum), in that order (as torch's log_softmax): with logits far from 0,
    // `l - (max + log_sum)` would lose log_sum in the rounding of the large sum.
    let lp = |l: f32| ((l - max) as f64 - log_sum) as f32;
    TokenLogprobs {
        token,
        logprob: lp(logits[token as usize]),
        top: best(logits, top.min(MAX_TOP))
            .into_iter()
            .map(|(id, l)| (id, lp(l)))
            .collect(),
    }
}

/// The `k` largest logits with their ids, largest first (lower id first among equals): one pass
/// that keeps a sorted list of at most `k`, which a logit enters only if it beats the last.
fn best(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut kept: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return kept;
    }
    for (i, &l) in logits.iter().enumerate() {
        if kept.len() == k && l <= kept[k - 1].1 {
            continue;
        }
        // After every kept value >= l: equal logits keep the order of their ids.
        let at = kept.partition_point(|&(_, v)| v >= l);
        kept.insert(at, (i as u32, l));
        kept.truncate(k);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the definition, written the plain way: exp, sum, divide, log; and a full sort.
    #[test]
    fn equals_the_plain_log_softmax_and_a_full_sort() {
        let mut seed = 7u64;
        let logits: Vec<f32> = (0..5000)
            .map(|_| crate::testing::lcg(&mut seed) * 15.0)
            .collect();
        let total: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let plain = |i: usize| ((logits[i] as f64).exp() / total).ln();
        let got = token_logprobs(&logits, 1234, 5);
        assert!((got.logprob as f64 - plain(1234)).abs() < 1e-5);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let want: Vec<u32> = order[..5].iter().map(|&i| i as u32).collect();
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, want);
        for &(id, lp) in &got.top {
            assert!((lp as f64 - plain(id as usize)).abs() < 1e-5);
        }
        // Probabilities sum to 1.
        let p: f64 = (0..logits.len())
            .map(|i| (token_logprobs(&logits, i as u32, 0).logprob as f64).exp())
            .take(5000)
            .sum();
        assert!((p - 1.0).abs() < 1e-4, "{p}");
    }

    #[test]
    fn ties_keep_id_order_and_top_is_capped() {
        let logits = [1.0, 3.0, 3.0, 2.0, 3.0];
        let got = token_logprobs(&logits, 0, 3);
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&logits, 0, 100).top.len(), 5);
        // Huge logits do not overflow.
        let big = [1e30f32, 1e30, 0.0];
        let lp = token_logprobs(&big, 0, 1).logprob;
        assert!((lp - (0.5f32).ln()).abs() < 1e-6, "{lp}");
    }
}
