//! Many sequences at once: continuous batching over one [`Forward`] pass.
//!
//! The engine owns `slots` sequences, each with its own KV cache, and a queue of requests
//! waiting for a slot. Every [`Engine::step`]:
//!
//! 1. admits waiting requests into free slots, first come first served, each into the free slot
//!    whose cached tokens share the longest prefix with its prompt (the prefix cache: a chat
//!    client that resends the whole conversation finds it already computed);
//! 2. forms the step's rows: the next token of every decoding sequence, then chunks of prompts
//!    still being read, up to the step's budget of rows;
//! 3. runs them all through the model in one [`Forward::step`], so each weight matrix is read
//!    once for every sequence;
//! 4. samples the next token of each sequence whose row ended in logits, each with its own
//!    sampler and seed, and reports it as an [`Event`]; a sequence that stops leaves its slot
//!    (and its cache, for the prefix cache) to the next request.
//!
//! A request with a [`Constraint`] (structured output) has its logits masked before sampling
//! (the masks are computed on a second thread while step 3 runs: they depend only on the tokens
//! already written), and the tokens its grammar forces are appended as if sampled and fed to
//! the next step together, like a prompt chunk.
//!
//! A request that asks for its prompt's log-probabilities (OpenAI's `echo` with `logprobs`, what
//! evaluation harnesses score with) has its prompt scored first, alone: every position's logits
//! are needed, not only the last, so it runs whole (no prefix cache), a prefill chunk (at most
//! [`SCORE_ROWS`] positions) a step through [`Forward::step_all_logits`], beside the other
//! requests' rows.
//!
//! A request joins at the next step and leaves as soon as it ends; nobody waits for a batch to
//! drain. Because the forward pass computes each row the same way whatever its neighbours, and
//! a prompt gives the same keys and values however it is chunked (model/forward/mod.rs), a request's
//! tokens do not depend on what else runs: with temperature 0 they equal `qwen3 inference -t 0`.
//!
//! A request can also come with drafts (speculative decoding, draft.rs): guesses of its next
//! tokens, made in step 2 (from its own tokens, or by a small draft model, draft_model.rs), run
//! as extra rows of its segment in step 3 and kept in step 4 while the tokens drawn agree with
//! them; its answer is the same as without.
//!
//! The engine is synchronous and single-threaded (the kernels use the threads); the server puts it
//! on one worker thread and talks to it through channels. Beside this file: schedule.rs (steps 1
//! and 2: admission with the prefix cache, the step's rows), job.rs (a request in a slot, and
//! step 4 for one row of its logits), scoring.rs (step 1b), draft.rs, draft_model.rs (with step
//! 2's drafts from a draft model), snapshots.rs (a hybrid model's states, kept for the prefix
//! cache and for rejected drafts), images.rs, outcome.rs (how a request ended).

use crate::backend::{Backend, KvType};
use crate::chat::common_prefix_len;
use crate::constraint::Constraint;
use crate::logprobs::{TokenLogprobs, MAX_TOP};
use crate::model::{Cache, Forward, Model, RowInputs, Segment, StateSnapshot, MAX_BATCH};
use crate::sampler::SamplerConfig;
use anyhow::{bail, Result};
use std::collections::VecDeque;

mod outcome;
pub use outcome::{GenerationStats, StopReason};

mod draft;

mod draft_model;
pub use draft_model::DraftModel;

mod scoring;
pub use scoring::SCORE_ROWS;

mod images;
use images::StepInputs;
pub use images::{PromptImage, PromptImages};

mod job;

mod schedule;

mod snapshots;
pub use draft::{Draft, NGRAM_MAX, NGRAM_MIN, SPECULATE_ROWS};
use job::{next_token, Job, Row};

#[cfg(test)]
mod tests;

/// A request's number, given by [`Engine::submit`].
pub type RequestId = u64;

/// What to generate.
#[derive(Debug, Clone)]
pub struct Request {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Ids that end the answer (the model's end-of-sequence ids, the template's end of turn).
    /// They are not reported as tokens.
    pub stop_ids: Vec<u32>,
    /// Report each token's log-probability and this many alternatives (at most
    /// `logprobs::MAX_TOP`) with it; `None`: no log-probabilities (nothing computed).
    pub logprobs: Option<usize>,
    /// The grammar the answer must match (structured output), or `None`.
    pub constraint: Option<Constraint>,
    /// Report the log-probability of each prompt token after the first (under the logits of
    /// the position before it) with this many alternatives, as [`Event::PromptLogprobs`];
    /// `None`: nothing computed. The prompt then runs whole (see the module's comment).
    pub prompt_logprobs: Option<usize>,
    /// Report the raw logits of the last prompt position as [`Event::Logits`] (a reranker reads
    /// two of them); with `max_tokens: 0` that is all the request does.
    pub last_logits: bool,
    /// Speculative decoding: how the answer's next tokens are guessed, several checked a step
    /// (draft.rs). The tokens are the same as without; not for a request with a `constraint`
    /// or `prompt_logprobs`, which decode one token a step, and not from a draft model for a
    /// request with images (the draft model does not see them).
    pub draft: Draft,
    /// The prompt's images (a model with a vision tower): their vectors at their
    /// `<|image_pad|>` rows, and the prompt's M-RoPE positions; `None` for text.
    pub images: Option<PromptImages>,
}

impl Request {
    /// A request with nothing to generate, for its last row alone: an embedding model's vector,
    /// or with `last_logits` a language model's logits at the last prompt position (a reranker).
    pub fn prefill_only(prompt: Vec<u32>, last_logits: bool) -> Request {
        Request {
            prompt,
            max_tokens: 0,
            sampler: SamplerConfig::greedy(),
            stop_ids: vec![],
            logprobs: None,
            constraint: None,
            prompt_logprobs: None,
            last_logits,
            draft: Draft::None,
            images: None,
        }
    }
}

/// What happened to a request in a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request took a slot; `cached` of its prompt's tokens were already in the slot's cache.
    Started { id: RequestId, cached: usize },
    /// The prompt's log-probabilities, when the request asked for them: one entry for each
    /// prompt token after the first (the first has nothing before it). Sent once, before the
    /// first `Token`.
    PromptLogprobs {
        id: RequestId,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The logits at the last prompt position, when the request asked for them
    /// (`Request::last_logits`), before its first token.
    Logits { id: RequestId, logits: Vec<f32> },
    /// An embedding model's vector of the prompt (see [`Engine::embeds`]), before `Finished`.
    Embedding { id: RequestId, vector: Vec<f32> },
    /// The next token of the answer, with its log-probabilities if the request asked for them.
    Token {
        id: RequestId,
        token: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    },
    /// The answer ended: why, and its counts and times (`stats.generated_tokens` counts the
    /// sampled tokens, an end-of-sequence id included).
    Finished {
        id: RequestId,
        stats: GenerationStats,
    },
    /// The step that ran this request failed; the request is over and its slot is free.
    Failed { id: RequestId, error: String },
}

/// Why [`Engine::submit`] refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// The queue already holds `EngineConfig::max_queue` requests.
    QueueFull,
    /// The request can never run (an empty prompt, or one longer than a slot's context).
    Invalid(String),
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::QueueFull => write!(f, "the queue of waiting requests is full"),
            Rejected::Invalid(why) => f.write_str(why),
        }
    }
}

/// The engine's sizes.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Sequences that run at once (`--parallel`).
    pub slots: usize,
    /// Requests that may wait for a slot, beyond those the free slots take at the next step;
    /// more are refused (`--queue`).
    pub max_queue: usize,
    /// Prompt tokens a step takes while other sequences are decoding. A long prompt then goes in
    /// chunks of this many between their tokens, so their streams keep flowing; alone, a prompt
    /// goes in chunks of the pass's full batch.
    pub prefill_chunk: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slots: 4,
            max_queue: 64,
            prefill_chunk: 32,
        }
    }
}

/// One sequence's place: the tokens its KV cache holds (the cache is `Engine::caches[i]` for
/// slot `i`), and the request using it.
struct Slot {
    /// The tokens whose keys and values are in `cache`, positions `0 .. cached.len()`. Kept
    /// after a request ends: the prefix cache.
    cached: Vec<u32>,
    job: Option<Job>,
    /// The step at which the slot was last given a request (the least recently used free slot
    /// is taken when no cached prefix helps).
    last_used: u64,
    /// A hybrid model's: the position whose Gated DeltaNet states `Engine::snapshots[i]` holds,
    /// the last multiple of the delta rule's chunk in the prompt (the prefix cache resumes
    /// there: the states at the end of the cached tokens are past it).
    snapshot: Option<usize>,
    /// The images among `cached` (and the tokens its request has yet to run), for the prefix
    /// cache (images.rs). Their vectors stay with the slot until it is given another request:
    /// an image's tokens times the model's width in f32, less than its cached keys and values.
    images: Vec<images::CachedImage>,
}

impl Slot {
    /// The slot's cache forgotten (its prefix cache and snapshot).
    fn forget(&mut self) {
        self.cached.clear();
        self.snapshot = None;
        self.images.clear();
    }
}

/// Continuous batching: see the module's comment.
pub struct Engine<'m, B: Backend> {
    fwd: Forward<'m, B>,
    cfg: EngineConfig,
    slots: Vec<Slot>,
    /// `caches[i]`: the keys and values of slot `i`'s tokens.
    caches: Vec<Cache<B>>,
    /// A hybrid model's: slot `i`'s states at `slots[i].snapshot` (empty for other models).
    snapshots: Vec<StateSnapshot<B>>,
    /// A hybrid model's: slot `i`'s states before a step that verifies its drafts, to go back to
    /// when one is rejected (made at a slot's first draft).
    before_drafts: Vec<Option<StateSnapshot<B>>>,
    /// Step 4's list of the hybrid slots whose drafts were rejected: (slot, position before).
    rollbacks: Vec<(usize, usize)>,
    waiting: VecDeque<(RequestId, Request)>,
    next_id: RequestId,
    steps: u64,
    /// The step's rows and their segments (`seq` is the slot), reused by every step: a step
    /// allocates nothing.
    rows: Vec<u32>,
    plan: Vec<Segment>,
    /// A constrained row's logits, masked (the pass's own logits are read-only).
    masked: Vec<f32>,
    /// Step 2's scratch: the slots with a request, oldest request first, and the rows each
    /// takes this step.
    order: Vec<usize>,
    take: Vec<usize>,
    /// Logits of every position of a prompt being scored, `[SCORE_ROWS, vocab]`, allocated by
    /// the first request that asks, and the host copy where the backend's buffers are not.
    scores: Option<B::Buf>,
    scores_host: Vec<f32>,
    /// The draft model, for requests with `Draft::Model` ([`Engine::with_draft_model`]), and
    /// step 2's list of the slots that ask it for guesses, with how many.
    draft_model: Option<DraftModel<'m, B>>,
    asks: Vec<(usize, usize)>,
    /// The step's rows' positions and image vectors, when a sequence in it holds images.
    inputs: StepInputs,
}

/// The rows of logits a step of an engine of `slots` sequences may return, for
/// [`Forward::new`]'s `max_logits`: one a sequence, and up to [`SPECULATE_ROWS`] for drafts
/// (fewer would only limit how many drafts a step verifies).
pub fn logit_rows(slots: usize) -> usize {
    (slots + SPECULATE_ROWS).min(MAX_BATCH)
}

impl<'m, B: Backend> Engine<'m, B> {
    /// An engine of `cfg.slots` sequences over `fwd`, which must return logits for as many rows
    /// a step ([`Forward::new`]'s `max_logits`).
    pub fn new(fwd: Forward<'m, B>, cfg: EngineConfig) -> Result<Self> {
        if cfg.slots == 0 || cfg.slots > fwd.max_logits() {
            bail!(
                "{} slots: must be 1 ..= {} (the rows of logits a step returns)",
                cfg.slots,
                fwd.max_logits()
            );
        }
        if cfg.prefill_chunk == 0 {
            bail!("the prefill chunk must be at least one token");
        }
        let caches = (0..cfg.slots)
            .map(|_| fwd.new_cache())
            .collect::<Result<_>>()?;
        let slots = (0..cfg.slots)
            .map(|_| Slot {
                cached: Vec::with_capacity(fwd.context_len()),
                job: None,
                last_used: 0,
                snapshot: None,
                images: Vec::new(),
            })
            .collect();
        let snapshots = (0..cfg.slots)
            .filter_map(|_| fwd.new_snapshot().transpose())
            .collect::<Result<_>>()?;
        Ok(Engine {
            fwd,
            cfg,
            before_drafts: (0..cfg.slots).map(|_| None).collect(),
            rollbacks: Vec::new(),
            slots,
            caches,
            snapshots,
            waiting: VecDeque::new(),
            next_id: 1,
            steps: 0,
            rows: Vec::with_capacity(MAX_BATCH),
            plan: Vec::with_capacity(cfg.slots),
            masked: Vec::new(),
            order: Vec::with_capacity(cfg.slots),
            take: Vec::with_capacity(cfg.slots),
            scores: None,
            scores_host: Vec::new(),
            draft_model: None,
            asks: Vec::with_capacity(cfg.slots),
            inputs: StepInputs::default(),
        })
    }

    /// The engine with `model` as its draft model (speculative decoding, draft_model.rs), for
    /// the requests that ask for `Draft::Model`: on the same backend, with as many KV caches as
    /// slots and the same context (or the draft model's own, if shorter). The caller checks
    /// that both models have the same tokens (`Tokenizer::same_tokens`): the draft model reads
    /// the target's token ids.
    pub fn with_draft_model(mut self, model: &'m Model<'m, B::Tensor>) -> Result<Self> {
        let ctx = self.context_len().min(model.config.max_context() as usize);
        let slots = self.cfg.slots;
        let (backend, kv) = (self.fwd.backend(), self.fwd.kv_type());
        let fwd = Forward::new(backend, model, ctx, MAX_BATCH, slots, kv)?;
        self.draft_model = Some(DraftModel::new(fwd, slots, self.fwd.vocab())?);
        Ok(self)
    }

    /// The draft model, if the engine has one.
    pub fn draft_model(&self) -> Option<&DraftModel<'m, B>> {
        self.draft_model.as_ref()
    }

    /// An engine of one sequence, as the CLI's generate and chat run: the prompt in chunks of
    /// [`MAX_BATCH`], then one token a step, or with drafts up to [`SPECULATE_ROWS`] (a step
    /// returns as many rows of logits).
    pub fn one_sequence(
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        context_len: usize,
        kv: KvType,
    ) -> Result<Self> {
        let fwd = Forward::new(backend, model, context_len, MAX_BATCH, SPECULATE_ROWS, kv)?;
        let cfg = EngineConfig {
            slots: 1,
            max_queue: 1,
            prefill_chunk: MAX_BATCH,
        };
        Engine::new(fwd, cfg)
    }

    /// Whether the model's sequences carry a state besides keys and values (Qwen3.5's Gated
    /// DeltaNet layers), which the prefix cache and rejected drafts take back by snapshots.
    fn has_linear_state(&self) -> bool {
        self.fwd.model().config.linear_attention.is_some()
    }

    /// Positions each sequence holds, prompt and answer together.
    pub fn context_len(&self) -> usize {
        self.fwd.context_len()
    }

    pub fn config(&self) -> EngineConfig {
        self.cfg
    }

    /// The tokens whose keys and values slot `i` holds (after a request: its prompt and all
    /// but the last answer token, which was sampled and never run).
    pub fn slot_tokens(&self, i: usize) -> &[u32] {
        &self.slots[i].cached
    }

    /// The forward pass the engine runs (its model, backend and sizes).
    pub fn forward(&self) -> &Forward<'m, B> {
        &self.fwd
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.waiting.len()
    }

    /// Requests in slots.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.job.is_some()).count()
    }

    /// Nothing to do until the next request.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running() == 0
    }

    /// Queues `req`; it starts at a step when a slot is free. Refused if the queue is full or the
    /// request can never run.
    pub fn submit(&mut self, req: Request) -> Result<RequestId, Rejected> {
        if req.prompt.is_empty() {
            return Err(Rejected::Invalid("the prompt is empty".into()));
        }
        let ctx = self.context_len();
        if req.prompt.len() > ctx {
            return Err(Rejected::Invalid(format!(
                "the prompt has {} tokens but the context holds {ctx}",
                req.prompt.len()
            )));
        }
        let vocab = self.fwd.vocab() as u32;
        if let Some(bad) = req.prompt.iter().find(|&&t| t >= vocab) {
            return Err(Rejected::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if self.embeds() && req.max_tokens > 0 {
            return Err(Rejected::Invalid(
                "this is an embedding model: it gives a prompt's vector and generates no text"
                    .into(),
            ));
        }
        if let Err(e) = req.sampler.validate() {
            return Err(Rejected::Invalid(e.to_string()));
        }
        if let Some(images) = &req.images {
            if self.fwd.model().config.vision.is_none() {
                return Err(Rejected::Invalid(
                    "this model does not take images (its file has no vision tower)".into(),
                ));
            }
            if !B::TAKES_IMAGES {
                return Err(Rejected::Invalid(
                    "this backend does not take images yet: run on the CPU (--device cpu)".into(),
                ));
            }
            if req.prompt_logprobs.is_some() {
                return Err(Rejected::Invalid(
                    "the prompt's log-probabilities are not computed for a prompt with images"
                        .into(),
                ));
            }
            let hidden = self.fwd.model().config.hidden_size as usize;
            images
                .check(req.prompt.len(), hidden)
                .map_err(Rejected::Invalid)?;
        }
        if matches!(req.draft, Draft::Model { .. }) && self.draft_model.is_none() {
            return Err(Rejected::Invalid(
                "drafts from a draft model, but none is loaded (--draft-model)".into(),
            ));
        }
        if [req.logprobs, req.prompt_logprobs]
            .iter()
            .any(|k| k.is_some_and(|k| k > MAX_TOP))
        {
            return Err(Rejected::Invalid(format!(
                "at most {MAX_TOP} alternatives per token can be reported"
            )));
        }
        // Free slots take waiting requests at the next step: those do not count as queued.
        let free = self.slots.iter().filter(|s| s.job.is_none()).count();
        if self.waiting.len() >= self.cfg.max_queue + free {
            return Err(Rejected::QueueFull);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, req));
        Ok(id)
    }

    /// Whether the model is an embedding model: each request's prompt runs and its vector comes
    /// back as [`Event::Embedding`] (the final norm's output at the last prompt token, unit
    /// length if the model says so); nothing is generated (`max_tokens` must be 0).
    pub fn embeds(&self) -> bool {
        self.fwd.model().config.embedding.is_some()
    }

    /// Sequences that ran in the last step (its batch size; 0 when it had nothing to do).
    pub fn step_sequences(&self) -> usize {
        self.plan.len()
    }

    /// Bytes of keys and values the slots hold now, the finished sequences' prefix caches
    /// included (positions held x bytes a position takes, as `Model::kv_cache_bytes` counts).
    pub fn kv_bytes(&self) -> u64 {
        let positions: usize = self.slots.iter().map(|s| s.cached.len()).sum();
        self.fwd
            .model()
            .kv_cache_bytes(positions, self.fwd.kv_type())
    }

    /// The share of the KV cache's capacity (every slot's `context_len` positions) that running
    /// requests hold, 0 to 1. The finished requests' prefix caches are left out: a new request
    /// may overwrite them. A load balancer reads it as how full this replica is (vLLM's
    /// `kv_cache_usage_perc`, also a fraction despite its name).
    pub fn kv_usage(&self) -> f64 {
        let held: usize = self
            .slots
            .iter()
            .filter(|s| s.job.is_some())
            .map(|s| s.cached.len())
            .sum();
        let capacity = self.slots.len() * self.context_len();
        if capacity == 0 {
            0.0
        } else {
            held as f64 / capacity as f64
        }
    }

    /// Forgets what slot `i`'s KV cache holds (its prefix cache), unless a request runs there:
    /// the next request in it runs its whole prompt. (A chat's `/reset`.)
    pub fn forget(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.job.is_none() {
                slot.forget();
            }
        }
    }

    /// Ends request `id` wherever it is (queued or running); its slot is free at the next step.
    /// Unknown ids (already finished) are ignored.
    pub fn cancel(&mut self, id: RequestId) {
        self.waiting.retain(|(w, _)| *w != id);
        for slot in &mut self.slots {
            if slot.job.as_ref().is_some_and(|j| j.id == id) {
                slot.job = None;
            }
        }
    }

    /// Ends running request `id` now, as if it had stopped by itself ([`StopReason::Stopped`]),
    /// and returns its counts and times; `None` if it is not running. What it generated stays
    /// in the slot's cache.
    pub fn stop(&mut self, id: RequestId) -> Option<GenerationStats> {
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.job.as_ref().is_some_and(|j| j.id == id))?;
        let job = slot.job.take()?;
        Some(job.stats(StopReason::Stopped))
    }

    /// Runs one step (see the module's comment), appending what happened to `events`. Does
    /// nothing when idle. A failure of the forward pass ends the requests of that step with
    /// [`Event::Failed`] and is not an error of the engine, which can go on.
    pub fn step(&mut self, events: &mut Vec<Event>) {
        self.steps += 1;
        self.admit(events);
        self.score_prompts(events);
        self.plan_rows();
        if self.plan.is_empty() {
            return;
        }
        if let Err(e) = self.save_before_drafts() {
            return self.fail_step(&e.to_string(), events);
        }
        // A sequence with images: every row's positions, and the images' rows' vectors.
        let hidden = self.fwd.model().config.hidden_size as usize;
        let images = self.inputs.build(&self.slots, &self.plan, hidden);
        let runs = self.inputs.runs();
        let inputs = match images {
            true => self.inputs.row_inputs(&runs),
            false => RowInputs::default(),
        };
        let result = if self.needs_masks() {
            // The masks of this step's constrained rows, on a second thread while the pass
            // runs: a mask depends only on the tokens written so far, not on these logits.
            let (fwd, rows, plan) = (&mut self.fwd, &self.rows, &self.plan);
            let caches = &mut self.caches;
            let slots = &mut self.slots;
            std::thread::scope(|s| {
                s.spawn(|| prepare_masks(slots, plan));
                fwd.step_with(rows, plan, caches, inputs)
            })
        } else {
            self.fwd
                .step_with(&self.rows, &self.plan, &mut self.caches, inputs)
        };
        match result {
            Ok(k) => {
                self.take_snapshots();
                self.sample(k, events);
                self.roll_back_rejected_drafts(events);
            }
            Err(e) => self.fail_step(&e.to_string(), events),
        }
    }

    /// Step 4, after a successful pass: the fed tokens are cached; each row of logits gives its
    /// sequence's next token. A segment with drafts has a row for each: its rows are read in
    /// order while the token drawn from one is the draft the next row ran (draft.rs), and the
    /// rows after the first disagreement are forgotten.
    fn sample(&mut self, k: usize, events: &mut Vec<Event>) {
        let vocab = self.fwd.out_width();
        let embedding = self.fwd.model().config.embedding;
        let ctx = self.fwd.context_len();
        let logits = match self.fwd.logits(k) {
            Ok(l) => l,
            Err(e) => {
                let e = e.to_string();
                return self.fail_step(&e, events);
            }
        };
        let mut row = 0;
        for seg in &self.plan {
            let rows = row..row + seg.logits;
            row += seg.logits;
            let slot = &mut self.slots[seg.seq];
            let Some(job) = slot.job.as_mut() else {
                continue;
            };
            // The segment's tokens from the answer so far are cached now; its drafted ones only
            // once accepted.
            let start = slot.cached.len();
            let fed = seg.len.min(job.tokens.len() - start);
            slot.cached
                .extend_from_slice(&job.tokens[start..start + fed]);

            if seg.logits == 0 {
                continue;
            }
            let first = &logits[rows.start * vocab..(rows.start + 1) * vocab];
            job.prefill.get_or_insert_with(|| job.start.elapsed());
            if let Some(e) = embedding {
                // Last-token pooling: this row is the last prompt token's.
                let vector = crate::embedding::pooled(first, e.normalize);
                events.push(Event::Embedding { id: job.id, vector });
            } else if job.last_logits && job.tokens.len() == job.prompt_len {
                let logits = first.to_vec();
                events.push(Event::Logits { id: job.id, logits });
            }
            let mut outcome = Row::Next(0);
            let mut accepted = 0;
            for (i, r) in rows.enumerate() {
                let l = &logits[r * vocab..(r + 1) * vocab];
                outcome = next_token(job, l, &mut self.masked, slot.cached.len(), ctx, events);
                let Row::Next(token) = outcome else { break };
                // The token drawn is the one the next row ran: that row's keys and values, and
                // its logits, are the answer's.
                match &job.drafter {
                    Some(d) if i < d.proposed.len() && d.proposed[i] == token => {
                        slot.cached.push(token);
                        accepted += 1;
                    }
                    _ => break,
                }
            }
            if let Some(d) = job.drafter.as_mut().filter(|d| !d.proposed.is_empty()) {
                // A hybrid model's state went through every draft: back to `start` if one
                // was rejected (`roll_back_rejected_drafts`).
                if accepted < d.proposed.len() && !self.snapshots.is_empty() {
                    self.rollbacks.push((seg.seq, start));
                }
                d.verified(accepted);
            }
            match outcome {
                Row::Next(_) => {}
                Row::Stop(stop) => {
                    let job = slot.job.take().expect("a job");
                    events.push(Event::Finished {
                        id: job.id,
                        stats: job.stats(stop),
                    });
                }
                Row::Failed(error) => {
                    let id = slot.job.take().expect("a job").id;
                    events.push(Event::Failed { id, error });
                }
            }
        }
    }

    /// Whether a row of this step with logits belongs to a constrained request.
    fn needs_masks(&self) -> bool {
        self.plan.iter().any(|seg| {
            seg.logits > 0
                && self.slots[seg.seq]
                    .job
                    .as_ref()
                    .and_then(|j| j.constraint.as_ref())
                    .is_some_and(Constraint::is_active)
        })
    }

    /// A failed step: its requests end, and their slots forget what they cached (the step may
    /// have written part of it).
    fn fail_step(&mut self, error: &str, events: &mut Vec<Event>) {
        for seg in &self.plan {
            let slot = &mut self.slots[seg.seq];
            slot.forget();
            if let Some(job) = slot.job.take() {
                events.push(Event::Failed {
                    id: job.id,
                    error: error.to_string(),
                });
            }
        }
    }
}

/// The next-token masks of the constrained requests whose rows end in logits this step.
fn prepare_masks(slots: &mut [Slot], plan: &[Segment]) {
    for seg in plan.iter().filter(|seg| seg.logits > 0) {
        if let Some(c) = slots[seg.seq]
            .job
            .as_mut()
            .and_then(|j| j.constraint.as_mut())
        {
            c.prepare();
        }
    }
}
