//! One path from `--device`, a model file and a second model (a draft model, or perplexity's
//! base) to a backend with the weights loaded on it: the device is read and checked once
//! ([`parse`], [`check`]), and one match ([`run_on`]: `inference`, `serve`, `batch`, `embed`,
//! `rerank`, `perplexity`, `bench`) loads the weights where the backend reads them and hands the
//! command's own work the backend, the model, the second model and the [`Place`] it runs in (what
//! `--verbose` prints; a GPU's copy bandwidth, which `bench` sets beside its decode). [`engine`]
//! builds the engine of several sequences that `serve`, `batch`, `embed` and `rerank` run.
//!
//! ```text
//! --device cpu    -> Model::load(file)            over CpuBackend   (the kernels)
//! --device plain  -> Model::load(file)            over PlainBackend (the textbook loops)
//! --device cuda:N -> CudaBackend::load(N, file)   over CudaBackend  (weights on the GPU)
//!                                  \-> OnDevice::run(backend, model, draft, place)
//!                                      (on the CPU: OnDevice::run_on_cpu, by default the same)
//! ```
//!
//! A command's work is generic over the backend ([`OnDevice`]), so that it is written once: the
//! same engine, the same loop, whatever runs the kernels.

use super::args::KvCacheArg;
use anyhow::{anyhow, bail, Result};
use qwen3_cuda::device::check_available;
use qwen3_cuda::Device;
use qwen3_inference::backend::{Backend, CpuBackend, KvType, PlainBackend, CPU};
use qwen3_inference::engine::{Engine, EngineConfig};
use qwen3_inference::format::{ModelFile, Reader};
use qwen3_inference::kernels;
use qwen3_inference::model::{Forward, Model, MAX_BATCH};
use std::path::Path;

/// `--device`: `cpu`, `plain`, `cuda` or `cuda:N`, checked before anything is loaded (a build
/// without CUDA, a missing driver or device, is one line).
pub fn parse(device: &str) -> Result<Device> {
    let device: Device = device.parse().map_err(|e: String| anyhow!(e))?;
    check_available(device).map_err(|e| anyhow!(e))?;
    Ok(device)
}

/// `path` opened for `device`: for the CPU's kernels, the matrices a GGUF file's tensors become
/// at open are laid out in those kernels' order (`CpuBackend::reader`: one copy instead of two);
/// for the other devices, in the model file's.
pub fn open(device: Device, path: &Path) -> Result<ModelFile> {
    let reader = match device {
        Device::Cpu => CpuBackend::reader(),
        Device::Plain | Device::Cuda(_) => Reader::Any,
    };
    ModelFile::open_for(path, reader)
}

/// What the device cannot do with these flags: the CUDA backend holds one model's weights (no
/// second model: `second` names the flag that gave one, `--draft-model` or perplexity's
/// `--base`) and keeps its KV cache in f32. Each command with such a flag checks here, right
/// after [`parse`], before it opens a model.
pub fn check(device: Device, kv_cache: KvCacheArg, second: Option<&str>) -> Result<()> {
    if let Device::Cuda(_) = device {
        if let Some(flag) = second {
            bail!(
                "{flag} runs on --device cpu or plain: the CUDA backend holds one model's weights"
            );
        }
        if kv_cache != KvCacheArg::F32 {
            bail!(
                "--kv-cache bf16 is for --device cpu: the CUDA backend keeps its KV cache in f32"
            );
        }
    }
    Ok(())
}

/// A command's work with a model on a backend: written once, run on whichever device was asked.
pub trait OnDevice {
    type Out;
    /// Runs on `backend` with `model` (and `draft`, a second model on the same device if the
    /// command has one: `--draft-model`'s weights, or perplexity's `--base`); `place` says
    /// where.
    fn run<'m, B: Backend>(
        self,
        backend: &'m B,
        model: &'m Model<'m, B::Tensor>,
        draft: Option<&'m Model<'m, B::Tensor>>,
        place: &Place,
    ) -> Result<Self::Out>;

    /// The same work on the CPU backend, which [`run_on`] calls for `--device cpu`: [`run`]
    /// by default. A command overrides it where the work needs the CPU backend by name
    /// (`bench` runs each thread count in its own thread pool, which takes only what can be
    /// sent to other threads).
    ///
    /// [`run`]: OnDevice::run
    fn run_on_cpu<'m>(
        self,
        model: &'m Model<'m>,
        draft: Option<&'m Model<'m>>,
        place: &Place,
    ) -> Result<Self::Out>
    where
        Self: Sized,
    {
        self.run(CPU, model, draft, place)
    }
}

/// Where [`run_on`] runs a command's work.
pub struct Place<'d> {
    /// One line for `--verbose` and the logs: the device, its threads, its kernels.
    pub about: String,
    /// The kernels by name, as `bench` reports them: the CPU's dot products (`avx2`, ...), or
    /// the GPU's ("CUDA on NVIDIA H200 (compute 9.0)").
    pub kernels: String,
    /// On a GPU, its device-to-device copy bandwidth for a copy of `n` bytes, in bytes/s
    /// (`CudaRuntime::copy_bandwidth`: what `bench` sets beside a GPU's decode). `None` on the
    /// host, whose read bandwidth `bench` measures itself, in the thread pool of each run.
    pub gpu_bandwidth: Option<&'d dyn Fn(usize) -> Result<f64>>,
}

/// Loads `file` (and `draft`) for `device` and runs `work` there. [`check`] has refused what the
/// device cannot run.
pub fn run_on<W: OnDevice>(
    device: Device,
    file: &ModelFile,
    draft: Option<&ModelFile>,
    work: W,
) -> Result<W::Out> {
    match device {
        Device::Cpu => {
            let model = Model::load(file)?;
            let draft = draft.map(Model::load).transpose()?;
            let (threads, decode) = (kernels::threads(), kernels::decode_threads());
            let threads = if decode == threads {
                format!("{threads}")
            } else {
                format!("{threads} (decode: {decode}, one per core)")
            };
            let isa = kernels::dot::dots().isa;
            let place = Place {
                about: format!("cpu, threads: {threads}, dot products: {isa}"),
                kernels: isa.to_string(),
                gpu_bandwidth: None,
            };
            work.run_on_cpu(&model, draft.as_ref(), &place)
        }
        Device::Plain => {
            let model = Model::load(file)?;
            let draft = draft.map(Model::load).transpose()?;
            let place = Place {
                about: "plain: the textbook loops, one thread".into(),
                kernels: "plain".into(),
                gpu_bandwidth: None,
            };
            work.run(&PLAIN, &model, draft.as_ref(), &place)
        }
        // Each command has refused its second model's flag by name ([`check`]).
        Device::Cuda(_) if draft.is_some() => {
            bail!("a second model runs on --device cpu or plain: the CUDA backend holds one model's weights")
        }
        Device::Cuda(ordinal) => cuda::run_on(ordinal, file, work),
    }
}

/// Whether `device`'s backend runs prompts with images ([`Backend::TAKES_IMAGES`]), known
/// before anything is loaded.
pub fn takes_images(device: Device) -> bool {
    match device {
        Device::Cpu => CpuBackend::TAKES_IMAGES,
        Device::Plain => PlainBackend::TAKES_IMAGES,
        Device::Cuda(_) => cuda::TAKES_IMAGES,
    }
}

/// The plain backend holds nothing; one value serves every command (as
/// `qwen3_inference::backend::CPU` does for the CPU backend).
const PLAIN: PlainBackend<'static> = PlainBackend::new();

/// An engine of `cfg.slots` sequences over `backend` and `model`, with `draft` as its draft
/// model if there is one, whose steps return at most `rows` rows of logits
/// (`engine::logit_rows` for a server's drafts; a request without drafts needs one a slot):
/// what `serve`, `batch`, `embed` and `rerank` run.
pub fn engine<'m, B: Backend>(
    backend: &'m B,
    model: &'m Model<'m, B::Tensor>,
    draft: Option<&'m Model<'m, B::Tensor>>,
    context_len: usize,
    cfg: EngineConfig,
    rows: usize,
    kv: KvType,
) -> Result<Engine<'m, B>> {
    let fwd = Forward::new(backend, model, context_len, MAX_BATCH, rows, kv)?;
    with_draft_model(Engine::new(fwd, cfg)?, draft)
}

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

/// `--device cuda:N`: the weights uploaded once to the GPU, then the same work as on the CPU.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use qwen3_cuda::cuda::CudaBackend;

    pub const TAKES_IMAGES: bool = CudaBackend::TAKES_IMAGES;

    pub fn run_on<W: OnDevice>(ordinal: usize, file: &ModelFile, work: W) -> Result<W::Out> {
        let gpu = CudaBackend::load(ordinal, file)?;
        let model = Model::load_with(file, |name| gpu.weights.tensor(name))?;
        let bandwidth = |n: usize| gpu.runtime.copy_bandwidth(n);
        let place = Place {
            about: format!("cuda:{ordinal}, {}", gpu.runtime.description),
            kernels: format!("CUDA on {}", gpu.runtime.description),
            gpu_bandwidth: Some(&bandwidth),
        };
        work.run(&gpu, &model, None, &place)
    }
}

/// Without the `cuda` feature, [`parse`] has already refused any CUDA device.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub const TAKES_IMAGES: bool = false;

    pub fn run_on<W: OnDevice>(_ordinal: usize, _file: &ModelFile, _work: W) -> Result<W::Out> {
        bail!("{}", qwen3_cuda::device::cuda_support().unwrap_err())
    }
}
