//! Speculative decoding's draft model: a small model of the same vocabulary (Qwen3-0.6B beside
//! Qwen3-8B) guesses each sequence's next tokens greedily, and the target model checks them as
//! rows of one step (draft.rs).
//!
//! A draft of `k` tokens costs the draft model `k` passes of one row a sequence, each reading
//! all of its weights: worth it when the draft model is several times smaller than the target
//! and agrees with it often. If `a` is the share of drafts accepted and `c` the draft's cost per
//! token over the target's, a step of `k` drafts makes about `(1 - a^(k+1)) / (1 - a)` tokens for
//! `1 + k c` target passes' time (Leviathan et al. 2023, section 3.4).
//!
//! The draft model keeps its own KV cache for each slot, and the tokens it holds. Before each
//! draft it catches up with the sequence: the tokens it holds that still agree with the
//! sequence stay (the prefix cache's rule, chat/conversation.rs), the rest are forgotten, which
//! is the rollback past a rejected draft, and the sequence's newer tokens run as one chunk.
//! Then each pass feeds every drafting sequence's last guess, one row each, all in one step.
//!
//! A hybrid draft model (Qwen3.5-0.8B beside Qwen3.5-9B) also holds each slot's Gated DeltaNet
//! states, which every guess moves along and no truncation takes back. So before guessing, each
//! slot's states are copied at the position the catch-up reached (`snapshots`, `snapshot_at`);
//! the next draft whose sequence left the draft's tokens after that position copies them back
//! and reruns from there (from the start if the sequence left them earlier, a new conversation
//! in the slot).
//!
//! Greedy guesses are the right ones for sampling too: the engine keeps a drafted token only when
//! the request's own sampler draws it from the target's logits (draft.rs), so the draft model's
//! distribution never enters the answer.

use super::{common_prefix_len, Engine, Forward, Segment, SPECULATE_ROWS};
use crate::backend::Backend;
use crate::model::{Cache, StateSnapshot};
use crate::sampler::argmax;
use anyhow::{bail, Result};

/// A draft model and the KV caches of its copies of the engine's sequences.
pub struct DraftModel<'m, B: Backend> {
    pub(super) fwd: Forward<'m, B>,
    /// `caches[i]`: slot `i`'s keys and values in the draft model, of the tokens `cached[i]`.
    caches: Vec<Cache<B>>,
    cached: Vec<Vec<u32>>,
    /// The ids a guess is chosen from: the ones both models have (Qwen2.5-0.5B's embedding has
    /// 151936 rows and Qwen2.5-7B's 152064, over the same 151665 tokens).
    vocab: usize,
    /// Slot `i`'s guesses of the last [`DraftModel::propose`], and how many it may have.
    guesses: Vec<Vec<u32>>,
    want: Vec<usize>,
    /// A step's rows and segments, reused: a draft allocates nothing.
    rows: Vec<u32>,
    plan: Vec<Segment>,
    /// A hybrid draft model's: slot `i`'s Gated DeltaNet states when its last guessing began,
    /// at position `snapshot_at[i]` (`None`: no states saved). Empty for other models.
    snapshots: Vec<StateSnapshot<B>>,
    snapshot_at: Vec<Option<usize>>,
}

impl<'m, B: Backend> DraftModel<'m, B> {
    /// The draft model over `fwd`, for `slots` sequences whose tokens are ids below
    /// `target_vocab`.
    pub fn new(fwd: Forward<'m, B>, slots: usize, target_vocab: usize) -> Result<Self> {
        if fwd.model().config.embedding.is_some() {
            bail!("the draft model is an embedding model: it cannot guess tokens");
        }
        if fwd.max_logits() < slots {
            bail!(
                "the draft model's pass returns {} rows of logits, fewer than the {slots} slots",
                fwd.max_logits()
            );
        }
        let caches = (0..slots).map(|_| fwd.new_cache()).collect::<Result<_>>()?;
        let mut snapshots = Vec::new();
        for _ in 0..slots {
            match fwd.new_snapshot()? {
                Some(s) => snapshots.push(s),
                None => break,
            }
        }
        let vocab = fwd.vocab().min(target_vocab);
        let max = SPECULATE_ROWS;
        Ok(DraftModel {
            caches,
            cached: (0..slots)
                .map(|_| Vec::with_capacity(fwd.context_len()))
                .collect(),
            vocab,
            guesses: (0..slots).map(|_| Vec::with_capacity(max)).collect(),
            want: vec![0; slots],
            rows: Vec::with_capacity(fwd.max_batch()),
            plan: Vec::with_capacity(slots),
            snapshots,
            snapshot_at: vec![None; slots],
            fwd,
        })
    }

    /// The draft model's forward pass (its model and sizes).
    pub fn forward(&self) -> &Forward<'m, B> {
        &self.fwd
    }

    /// The tokens whose keys and values slot `i`'s draft cache holds.
    pub fn slot_tokens(&self, i: usize) -> &[u32] {
        &self.cached[i]
    }

    /// Slot `i`'s guesses from the last [`DraftModel::propose`].
    pub fn guesses(&self, i: usize) -> &[u32] {
        &self.guesses[i]
    }

    /// For each `(slot, want)` of `asks`, guesses greedily up to `want` tokens to follow
    /// `tokens(slot)` (the sequence, its last token sampled and not yet run by the target), into
    /// [`DraftModel::guesses`] (fewer where the draft model's context or vocabulary ends). On an
    /// error the draft caches are forgotten (a pass may have written part of them) and the
    /// guesses may be partial; the next draft starts over.
    pub fn propose<'a>(
        &mut self,
        asks: &[(usize, usize)],
        tokens: impl Fn(usize) -> &'a [u32],
    ) -> Result<()> {
        let result = self.run(asks, tokens);
        if result.is_err() {
            self.cached.iter_mut().for_each(Vec::clear);
            self.snapshot_at.fill(None);
        }
        result
    }

    fn run<'a>(
        &mut self,
        asks: &[(usize, usize)],
        tokens: impl Fn(usize) -> &'a [u32],
    ) -> Result<()> {
        let (ctx, vocab) = (self.fwd.context_len(), self.fwd.vocab());
        // 1. Catch up: forget what no longer agrees with the sequence (the rolled-back guesses
        //    of the last draft), keeping at least the last token to run again for its logits;
        //    then run what is missing, in chunks of the pass's rows. The last chunk's logits
        //    give the first guess. How many guesses each sequence gets: guess j + 1 comes from
        //    a pass over guess j at position `tokens.len() + j - 1`, so k guesses need
        //    `tokens.len() + k - 1` positions; a token the draft model does not have (among
        //    those it has not run) ends the draft before it starts.
        for &(i, want) in asks {
            let t = tokens(i);
            self.guesses[i].clear();
            self.want[i] = 0;
            let Some(last) = t.len().checked_sub(1) else {
                continue;
            };
            let mut keep = common_prefix_len(&self.cached[i], t).min(last);
            if t[keep..].iter().any(|&t| t as usize >= vocab) {
                continue;
            }
            if !self.snapshots.is_empty() && keep < self.cached[i].len() {
                // A hybrid model's states went past `keep`: back to the snapshot if it is not
                // beyond it, else to the start (a pass at position 0 zeroes them).
                keep = match self.snapshot_at[i] {
                    Some(at) if at <= keep => {
                        self.fwd
                            .restore_state(&self.snapshots[i], &mut self.caches[i])?;
                        at
                    }
                    _ => {
                        self.snapshot_at[i] = None;
                        0
                    }
                };
            }
            self.cached[i].truncate(keep);
            self.want[i] = want.min((ctx + 1).saturating_sub(t.len()));
        }
        loop {
            self.rows.clear();
            self.plan.clear();
            let mut budget = self.fwd.max_batch();
            for &(i, _) in asks {
                let (t, done) = (tokens(i), self.cached[i].len());
                if self.want[i] == 0 || done == t.len() || budget == 0 {
                    continue;
                }
                let todo = t.len() - done;
                let n = todo.min(budget);
                budget -= n;
                self.rows.extend_from_slice(&t[done..done + n]);
                self.plan.push(Segment {
                    seq: i,
                    pos: done,
                    len: n,
                    logits: usize::from(n == todo),
                });
            }
            if self.plan.is_empty() {
                break;
            }
            self.pass()?;
        }
        // 2. Guess: each pass feeds every sequence's last guess, one row each, and gives the
        //    next. A hybrid model's states are kept first, to come back to.
        if !self.snapshots.is_empty() {
            for &(i, _) in asks {
                if self.want[i] > 0 && !self.guesses[i].is_empty() {
                    self.fwd
                        .save_state(&self.caches[i], &mut self.snapshots[i])?;
                    self.snapshot_at[i] = Some(self.cached[i].len());
                }
            }
        }
        loop {
            self.rows.clear();
            self.plan.clear();
            for &(i, _) in asks {
                let g = &self.guesses[i];
                if g.len() < self.want[i] {
                    self.rows.push(*g.last().expect("the catch-up's guess"));
                    self.plan.push(Segment {
                        seq: i,
                        pos: self.cached[i].len(),
                        len: 1,
                        logits: 1,
                    });
                }
            }
            if self.plan.is_empty() {
                return Ok(());
            }
            self.pass()?;
        }
    }

    /// Runs the planned step: its rows join their slots' cached tokens, and each row of logits
    /// gives its sequence's next guess, the most likely token.
    fn pass(&mut self) -> Result<()> {
        let k = self
            .fwd
            .step_only(&self.rows, &self.plan, &mut self.caches)?;
        let width = self.fwd.out_width();
        let logits = self.fwd.logits(k)?;
        let (mut row, mut fed) = (0, 0);
        for seg in &self.plan {
            self.cached[seg.seq].extend_from_slice(&self.rows[fed..fed + seg.len]);
            fed += seg.len;
            if seg.logits == 1 {
                let l = &logits[row * width..row * width + self.vocab];
                row += 1;
                self.guesses[seg.seq].push(argmax(l) as u32);
            }
        }
        Ok(())
    }
}

/// Step 2's part that needs the draft model (mod.rs).
impl<'m, B: Backend> Engine<'m, B> {
    /// Step 2's drafts from the draft model, for the slots in `asks`: all of them at once, a
    /// pass a guess (draft_model.rs). Drafts only speed things up: if the draft model fails,
    /// this step has none.
    pub(super) fn guess_with_draft_model(&mut self) {
        let Some(dm) = self.draft_model.as_mut() else {
            return;
        };
        let slots = &self.slots;
        let tokens = |i: usize| slots[i].job.as_ref().map_or(&[][..], |j| &j.tokens[..]);
        let ok = dm.propose(&self.asks, tokens).is_ok();
        for &(i, _) in &self.asks {
            let d = self.slots[i].job.as_mut().and_then(|j| j.drafter.as_mut());
            if let (true, Some(d)) = (ok, d) {
                d.proposed.extend_from_slice(dm.guesses(i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{model_file, model_file_of, prompts, request, run_tokens, sampled};
    use super::super::{Draft, Engine, EngineConfig, Request};
    use super::*;
    use crate::backend::{CpuBackend, KvType, CPU};
    use crate::format::DType;
    use crate::format::LayerType;
    use crate::model::{Model, MAX_BATCH};
    use crate::sampler::SamplerConfig;
    use crate::testing::model::{config, moe_config, qwen3_5_config};

    fn engine<'m>(
        model: &'m Model<'m>,
        draft: Option<&'m Model<'m>>,
        slots: usize,
        chunk: usize,
    ) -> Engine<'m, CpuBackend<'m>> {
        let logits = super::super::logit_rows(slots);
        let fwd = Forward::new(CPU, model, 64, MAX_BATCH, logits, KvType::F32).unwrap();
        let cfg = EngineConfig {
            slots,
            max_queue: 64,
            prefill_chunk: chunk,
        };
        let e = Engine::new(fwd, cfg).unwrap();
        match draft {
            Some(d) => e.with_draft_model(d).unwrap(),
            None => e,
        }
    }

    /// A draft model changes nothing but the number of steps: with the target itself as its
    /// draft model (every greedy guess accepted), a smaller dense model and a Qwen3-MoE (few
    /// accepted, so that rejected guesses are rolled back in both caches), every request's
    /// tokens and log-probabilities equal plain decoding's, greedy and seeded sampling, alone
    /// and four at a time (prompts chunked by 5), for f32 and q8 weights.
    #[test]
    fn a_draft_model_changes_nothing_but_the_steps() {
        for dt in [DType::F32, DType::Q8] {
            let (dir, file) = model_file(&format!("dm-target-{dt}"), dt);
            let model = Model::load(&file).unwrap();
            let mut small = config(dt);
            small.num_hidden_layers = 1;
            let (small_dir, small_file) = model_file_of(&format!("dm-small-{dt}"), &small);
            let small = Model::load(&small_file).unwrap();
            let (moe_dir, moe_file) = model_file_of(&format!("dm-moe-{dt}"), &moe_config(dt));
            let moe = Model::load(&moe_file).unwrap();
            let drafts = [("itself", &model), ("smaller", &small), ("moe", &moe)];
            drafted_equals_plain(&format!("{dt}"), &model, &drafts);
            for d in [dir, small_dir, moe_dir] {
                std::fs::remove_dir_all(d).unwrap();
            }
        }
    }

    /// The same for a Qwen3.5 target and hybrid draft models (their Gated DeltaNet states taken
    /// back to the snapshot before the rejected guesses): itself, and a smaller one (a Gated
    /// DeltaNet and an attention layer).
    #[test]
    fn a_hybrid_draft_model_changes_nothing_but_the_steps() {
        for dt in [DType::F32, DType::Q8] {
            let (dir, file) = model_file_of(&format!("dm-hybrid-{dt}"), &qwen3_5_config(dt));
            let model = Model::load(&file).unwrap();
            let mut small = qwen3_5_config(dt);
            small.num_hidden_layers = 2;
            if let Some(la) = small.linear_attention.as_mut() {
                la.layer_types = vec![LayerType::LinearAttention, LayerType::FullAttention];
            }
            let (small_dir, small_file) = model_file_of(&format!("dm-hybrid-small-{dt}"), &small);
            let small = Model::load(&small_file).unwrap();
            let drafts = [("itself", &model), ("smaller", &small)];
            drafted_equals_plain(&format!("qwen3.5 {dt}"), &model, &drafts);
            for d in [dir, small_dir] {
                std::fs::remove_dir_all(d).unwrap();
            }
        }
    }

    /// Requests drafted by each of `drafts` give `model`'s plain tokens (the tests above).
    fn drafted_equals_plain(dt: &str, model: &Model, drafts: &[(&str, &Model)]) {
        let mut reqs = vec![];
        for (i, p) in prompts().iter().take(4).enumerate() {
            let mut greedy = request(p, SamplerConfig::greedy());
            greedy.logprobs = Some(3);
            for r in [greedy, request(p, sampled(i as u64))] {
                reqs.push(Request {
                    max_tokens: 16,
                    ..r
                });
            }
        }
        let plain: Vec<_> = reqs
            .iter()
            .map(|r| {
                let mut e = engine(model, None, 1, 128);
                let id = e.submit(r.clone()).unwrap();
                run_tokens(&mut e).0.remove(&id).unwrap().0
            })
            .collect();
        for &(name, draft) in drafts {
            let drafted: Vec<Request> = reqs
                .iter()
                .map(|r| Request {
                    draft: Draft::Model { max: 4 },
                    ..r.clone()
                })
                .collect();
            let (mut n_drafted, mut n_accepted) = (0, 0);
            for (i, r) in drafted.iter().enumerate() {
                let mut e = engine(model, Some(draft), 1, 128);
                let id = e.submit(r.clone()).unwrap();
                let (tokens, stats) = run_tokens(&mut e).0.remove(&id).unwrap();
                assert_eq!(tokens, plain[i], "{dt} {name}: request {i} alone");
                if r.sampler.temperature == 0.0 && name == "itself" {
                    assert_eq!(stats.accepted_tokens, stats.drafted_tokens, "request {i}");
                }
                n_drafted += stats.drafted_tokens;
                n_accepted += stats.accepted_tokens;
            }
            // Random models seldom agree: the MoE may never (its guesses are all rolled back).
            assert!(
                n_drafted > 0 && (n_accepted > 0 || name == "moe"),
                "{dt} {name}: {n_accepted} of {n_drafted}"
            );
            if name != "itself" {
                assert!(n_accepted < n_drafted, "{dt} {name}: no guess was rejected");
            }
            let mut e = engine(model, Some(draft), 4, 5);
            let ids: Vec<_> = drafted
                .iter()
                .map(|r| e.submit(r.clone()).unwrap())
                .collect();
            let mut together = run_tokens(&mut e).0;
            for (i, id) in ids.iter().enumerate() {
                let tokens = together.remove(id).unwrap().0;
                assert_eq!(tokens, plain[i], "{dt} {name}: request {i} of 4");
            }
        }
    }

    /// The rollback: guesses that the target rejected leave the draft model's cache as if they
    /// had never run. After a draft from `a`, a draft from `b` (`a`, the first guess, then a
    /// token the draft model did not guess) gives the same guesses, and bit for bit the same
    /// logits, as a fresh draft model's first draft from `b`; so does a new sequence that shares
    /// only its first tokens.
    #[test]
    fn rejected_guesses_leave_the_draft_cache_as_plain_decoding() {
        for c in [config(DType::F32), qwen3_5_config(DType::F32)] {
            rollback_as_plain(&c);
        }
    }

    /// [`rejected_guesses_leave_the_draft_cache_as_plain_decoding`] for a draft model of config
    /// `c` (a Qwen3.5's states too: back to the snapshot, or to the start).
    fn rollback_as_plain(c: &crate::format::ModelConfig) {
        let (dir, file) = model_file_of(&format!("dm-rollback-{}", c.architecture), c);
        let model = Model::load(&file).unwrap();
        let new = || {
            let fwd = Forward::new(CPU, &model, 64, MAX_BATCH, 2, KvType::F32).unwrap();
            DraftModel::new(fwd, 2, 40).unwrap()
        };
        let a: Vec<u32> = prompts()[2].clone();
        let mut dm = new();
        dm.propose(&[(1, 5)], |_| &a).unwrap();
        let first = dm.guesses(1).to_vec();
        assert_eq!(first.len(), 5);
        // The cache holds the sequence and every guess but the last, which never ran.
        assert_eq!(dm.slot_tokens(1), [&a[..], &first[..4]].concat());
        let b = [&a[..], &[first[0], (first[1] + 1) % 40]].concat();
        dm.propose(&[(1, 5)], |_| &b).unwrap();
        let after = (dm.guesses(1).to_vec(), dm.fwd.logits(1).unwrap().to_vec());
        let mut fresh = new();
        fresh.propose(&[(0, 5)], |_| &b).unwrap();
        let plain = (
            fresh.guesses(0).to_vec(),
            fresh.fwd.logits(1).unwrap().to_vec(),
        );
        assert_eq!(after.0, plain.0);
        assert!(after
            .1
            .iter()
            .zip(&plain.1)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        assert_eq!(dm.slot_tokens(1), fresh.slot_tokens(0));
        // Another sequence in the slot (a new request), sharing the first 3 tokens: those stay.
        let c = [&a[..3], &prompts()[4][..]].concat();
        dm.propose(&[(1, 3)], |_| &c).unwrap();
        let mut fresh = new();
        fresh.propose(&[(0, 3)], |_| &c).unwrap();
        assert_eq!(dm.guesses(1), fresh.guesses(0));
        let (x, y) = (dm.fwd.logits(1).unwrap(), fresh.fwd.logits(1).unwrap());
        assert!(x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits()));
        // A token the draft model does not have: no guesses, and nothing run.
        dm.propose(&[(1, 5)], |_| &[1, 2, 40][..]).unwrap();
        assert!(dm.guesses(1).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Without a draft model, a request that asks for its guesses is refused by name.
    #[test]
    fn drafts_from_no_model_are_refused() {
        let (dir, file) = model_file("dm-none", DType::F32);
        let model = Model::load(&file).unwrap();
        let mut e = engine(&model, None, 1, 8);
        let r = Request {
            draft: Draft::Model { max: 4 },
            ..request(&[1, 2, 3], SamplerConfig::greedy())
        };
        let err = e.submit(r).unwrap_err().to_string();
        assert!(err.contains("--draft-model"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
