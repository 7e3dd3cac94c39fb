//! `qwen3 inference <model.bin> -m generate|chat`: one model on one device, running one of the
//! two modes: `-m generate` (generate.rs) or `-m chat`, the terminal chat (chat.rs).
//!
//! Both modes run on any backend (`--device cpu|plain|cuda|cuda:N`): the model is loaded for the
//! device, and then the same generic code drives one engine (`qwen3_inference::engine`).
//!
//! stdout gets only the generated text, so it can be piped; everything else (the stop reason, the
//! timing summary, `--verbose` details) goes to stderr.

use super::args::{context_len, InferenceArgs, KvCacheArg, Mode};
use super::chat::ChatFiles;
use super::generate::{generate_text, PromptJob};
use anyhow::{anyhow, bail, Result};
use qwen3_cuda::device::check_available;
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, CpuBackend, PlainBackend};
use qwen3_inference::engine::Engine;
use qwen3_inference::format::ModelFile;
use qwen3_inference::kernels;
use qwen3_inference::model::Model;

/// `qwen3 inference`: checks the flags, reads what the mode needs from the model's files, then
/// loads the weights for the device and runs the mode there.
pub fn run(mut args: InferenceArgs) -> Result<()> {
    // A repository id instead of a file: its export, made once (crate::hub).
    args.model =
        crate::hub::models::resolve(&args.model, args.models_dir.as_deref(), args.offline)?;
    let device: Device = args.device.parse().map_err(|e: String| anyhow!(e))?;
    // Before anything is loaded: a build without CUDA, a missing driver or device, is one line.
    check_available(device).map_err(|e| anyhow!(e))?;
    args.check_mode_flags()?;
    let file = ModelFile::open(&args.model)?;
    let context_len = context_len(&args, file.config())?;
    let draft = args
        .draft
        .open_model(&args.model, args.models_dir.as_deref(), args.offline)?;
    // Everything that only needs the files (tokenizer, template, the prompt's ids) is read
    // before the weights go to a device, so that bad input fails fast.
    let job = match args.mode() {
        Mode::Generate => Job::Generate(Box::new(PromptJob::new(&args, &file, context_len)?)),
        Mode::Chat => Job::Chat(Box::new(ChatFiles::open(&args, &file)?)),
    };
    match device {
        Device::Cpu => {
            let model = Model::load(&file)?;
            let draft = draft.as_ref().map(Model::load).transpose()?;
            let cpu = CpuBackend::new();
            let engine = Engine::one_sequence(&cpu, &model, context_len, args.kv_cache.into())?;
            let engine = with_draft_model(engine, draft.as_ref())?;
            let (threads, decode) = (kernels::threads(), kernels::decode_threads());
            let threads = if decode == threads {
                format!("{threads}")
            } else {
                format!("{threads} (decode: {decode}, one per core)")
            };
            let about = format!(
                "cpu, threads: {threads}, dot products: {}",
                kernels::dot::dots().isa
            );
            run_job(&args, engine, job, &about)
        }
        Device::Plain => {
            let model = Model::load(&file)?;
            let draft = draft.as_ref().map(Model::load).transpose()?;
            let plain = PlainBackend::new();
            let engine = Engine::one_sequence(&plain, &model, context_len, args.kv_cache.into())?;
            let engine = with_draft_model(engine, draft.as_ref())?;
            run_job(&args, engine, job, "plain: the textbook loops, one thread")
        }
        Device::Cuda(_) if draft.is_some() => bail!("{CUDA_DRAFT}"),
        Device::Cuda(_) if args.kv_cache != KvCacheArg::F32 => {
            bail!("--kv-cache bf16 is for --device cpu: the CUDA backend keeps its KV cache in f32")
        }
        Device::Cuda(ordinal) => cuda::run(&args, &file, ordinal, context_len, job),
    }
}

/// `--draft-model` on a GPU: not yet.
pub const CUDA_DRAFT: &str = "--draft-model runs on --device cpu or plain: the CUDA backend \
     holds one model's weights";

/// `engine` with `draft` as its draft model, if there is one (`--draft-model`).
pub fn with_draft_model<'m, B: Backend>(
    engine: Engine<'m, B>,
    draft: Option<&'m Model<'m, B::Tensor>>,
) -> Result<Engine<'m, B>> {
    match draft {
        Some(model) => engine.with_draft_model(model),
        None => Ok(engine),
    }
}

/// What `-m` asks for, with the files it needs already read.
/// (Boxed: both hold a `Tokenizer`, a large struct.)
pub enum Job {
    Generate(Box<PromptJob>),
    Chat(Box<ChatFiles>),
}

/// Runs `job` on `engine`: the same code for every backend. `device` describes where, for
/// `--verbose`.
fn run_job<B: Backend>(
    args: &InferenceArgs,
    engine: Engine<B>,
    job: Job,
    device: &str,
) -> Result<()> {
    match job {
        Job::Generate(p) => generate_text(args, engine, *p, device),
        Job::Chat(files) => super::chat::run(args, engine, *files, device),
    }
}

/// `--device cuda:N`: the weights uploaded once to the GPU, then the same [`run_job`] as on the
/// CPU: one engine over the forward pass (`qwen3_inference::model::Forward`), here over the CUDA
/// kernels. (Not run
/// here: no GPU on our machines; see docs/cuda.md for what is proven without one.)
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use qwen3_cuda::cuda::CudaBackend;
    use qwen3_inference::backend::KvType;

    pub fn run(
        args: &InferenceArgs,
        file: &ModelFile,
        ordinal: usize,
        context_len: usize,
        job: Job,
    ) -> Result<()> {
        let gpu = CudaBackend::load(ordinal, file)?;
        let model = Model::load_with(file, |name| gpu.weights.tensor(name))?;
        let engine = Engine::one_sequence(&gpu, &model, context_len, KvType::F32)?;
        let about = format!("cuda:{ordinal}, {}", gpu.runtime.description);
        run_job(args, engine, job, &about)
    }
}

/// Without the `cuda` feature `check_available` has already refused any CUDA device.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub fn run(
        _args: &InferenceArgs,
        _file: &ModelFile,
        _ordinal: usize,
        _context_len: usize,
        _job: Job,
    ) -> Result<()> {
        bail!("{}", qwen3_cuda::device::cuda_support().unwrap_err())
    }
}
