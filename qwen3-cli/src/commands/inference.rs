//! `qwen3 inference <model.bin> -m generate|chat`: one model on one device, running one of the
//! two modes: `-m generate` (generate.rs) or `-m chat`, the terminal chat (chat.rs).
//!
//! Both modes run on any backend (`--device cpu|plain|cuda|cuda:N`): the model is loaded for the
//! device, and then the same generic code drives one engine (`qwen3_inference::engine`).
//!
//! stdout gets only the generated text, so it can be piped; everything else (the stop reason, the
//! timing summary, `--verbose` details) goes to stderr.

use super::args::{InferenceArgs, Mode, Settings};
use super::chat::ChatFiles;
use super::device::{self, with_draft_model, OnDevice, Place};
use super::generate::{generate_text, PromptJob};
use anyhow::Result;
use qwen3_inference::backend::Backend;
use qwen3_inference::engine::Engine;
use qwen3_inference::model::Model;

/// `qwen3 inference`: checks the flags, reads what the mode needs from the model's files, then
/// loads the weights for the device and runs the mode there.
pub fn run(mut args: InferenceArgs) -> Result<()> {
    // A repository id instead of a file: its export, made once (crate::hub).
    args.model =
        crate::hub::models::resolve(&args.model, args.models_dir.as_deref(), args.offline)?;
    let device = device::parse(&args.on.device)?;
    let second = args.draft.draft_model.is_some().then_some("--draft-model");
    device::check(device, args.kv_cache, second)?;
    let drafts = args.check_mode_flags()?;
    // Shared: a chat's image encoder keeps it, to copy the vision tower at the first image.
    let file = std::sync::Arc::new(device::open(device, &args.model)?);
    // The flags as settings for this model (context, KV cache, sampler, drafts), once.
    let settings = args.settings(file.config(), drafts)?;
    let draft = args
        .draft
        .open_model(&args.model, args.models_dir.as_deref(), args.offline)?;
    // Everything that only needs the files (tokenizer, template, the prompt's ids) is read
    // before the weights go to a device, so that bad input fails fast.
    let job = match args.mode() {
        Mode::Generate => Job::Generate(Box::new(PromptJob::new(
            &args,
            &file,
            settings.context_len,
        )?)),
        Mode::Chat => Job::Chat(Box::new(ChatFiles::open(&args, file.clone())?)),
    };
    let work = Inference {
        args: &args,
        settings,
        job,
    };
    device::run_on(device, &file, draft.as_ref(), work)
}

/// What `-m` asks for, with the files it needs already read.
/// (Boxed: both hold a `Tokenizer`, a large struct.)
pub enum Job {
    Generate(Box<PromptJob>),
    Chat(Box<ChatFiles>),
}

/// The mode, run on one sequence's engine: the same code for every backend.
struct Inference<'a> {
    args: &'a InferenceArgs,
    settings: Settings,
    job: Job,
}

impl OnDevice for Inference<'_> {
    type Out = ();

    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        draft: Option<&'m Model<'m, B::Tensor>>,
        place: &Place,
    ) -> Result<()> {
        let Settings {
            context_len, kv, ..
        } = self.settings;
        let engine = Engine::one_sequence(backend, model, context_len, kv)?;
        let engine = with_draft_model(engine, draft)?;
        let (args, settings) = (self.args, self.settings);
        match self.job {
            Job::Generate(p) => generate_text(args, settings, engine, *p, &place.about),
            Job::Chat(files) => super::chat::run(args, settings, engine, *files, &place.about),
        }
    }
}
