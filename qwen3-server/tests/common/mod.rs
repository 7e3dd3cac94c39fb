//! The server in process, for the HTTP tests where a socket is not the point: the model file
//! loaded as `qwen3 serve` loads it, its worker on a thread of its own, and each request sent
//! through the router with `tower::ServiceExt::oneshot` (as `qwen3 batch` sends them). A
//! response is read to its end, so a test sees the status, the headers and the exact body a
//! client gets, streams included.
//!
//! The router runs on a current-thread runtime driven by the test's own thread, so the request
//! log the server writes on stderr is captured with the test's output. What needs the real
//! binary on a port (concurrency, clients that vanish, startup flags, signals) is in
//! qwen3-cli/tests.

#![allow(dead_code, unused_imports)] // each test file uses part of it

use axum::body::Body;
use axum::Router;
use qwen3_inference::backend::{KvType, CPU};
use qwen3_inference::chat::ChatTemplate;
use qwen3_inference::engine::{Engine, EngineConfig};
use qwen3_inference::format::{companion_paths, ModelFile};
use qwen3_inference::model::{Forward, Model, MAX_BATCH};
use qwen3_inference::tokenizer::Tokenizer;
use qwen3_server::metrics::Metrics;
use qwen3_server::state::{AppState, Grammars, ModelInfo};
use qwen3_server::worker::{self, Command};
use serde_json::Value;
use std::cell::RefCell;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use tower::ServiceExt;

/// `qwen3 serve`'s default context cap (a model's maximum beyond it is cut to it).
const DEFAULT_CONTEXT_CAP: usize = 4096;

/// A server over one model file; its worker stops when it is dropped.
pub struct Server {
    app: Router,
    rt: tokio::runtime::Runtime,
    commands: Sender<Command>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// `METHOD path status 12ms`, a line per response as the client saw it, in the shape of the
    /// server's own log (which goes to stderr, with the test's output).
    log: RefCell<String>,
}

impl Server {
    /// The server `qwen3 serve <model> <args>` would run. `args`: the few flags these tests give
    /// (`--context`, `--parallel`, `--model-name`, `--api-key`, `--cors`, `--rerank`,
    /// `--public-metrics`, `--draft ngram`, `--fetch-image-urls`), as the CLI reads them.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        Server::start_env(model, args, &[])
    }

    /// [`Server::start`] with environment variables as `qwen3 serve` reads them
    /// (`QWEN3_API_KEY`).
    pub fn start_env(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let (mut context, mut slots, mut model_name, mut cors) = (None, 4, None, vec![]);
        let mut api_key = env
            .iter()
            .find(|(k, _)| *k == "QWEN3_API_KEY")
            .map(|(_, v)| v.to_string());
        let (mut rerank, mut public_metrics, mut fetch_image_urls) = (false, false, false);
        let mut draft = qwen3_inference::engine::Draft::None;
        let mut max_images = qwen3_server::images::MAX_IMAGES;
        let mut max_image_pixels = qwen3_inference::vision::MAX_SOURCE_PIXELS;
        let mut max_image_bytes = qwen3_server::images::MAX_IMAGE_BYTES;
        let mut flags = args.iter();
        while let Some(flag) = flags.next() {
            if *flag == "--rerank" {
                rerank = true;
                continue;
            }
            if *flag == "--public-metrics" {
                public_metrics = true;
                continue;
            }
            if *flag == "--fetch-image-urls" {
                fetch_image_urls = true;
                continue;
            }
            let value = flags.next().expect("every flag here takes a value");
            match *flag {
                "--context" => context = Some(value.parse().unwrap()),
                "--parallel" => slots = value.parse().unwrap(),
                "--model-name" => model_name = Some(value.to_string()),
                "--api-key" => api_key = Some(value.to_string()),
                "--cors" => cors.push(value.to_string()),
                "--max-images" => max_images = value.parse().unwrap(),
                "--max-image-pixels" => max_image_pixels = value.parse().unwrap(),
                "--max-image-bytes" => max_image_bytes = value.parse().unwrap(),
                "--draft" => {
                    assert_eq!(
                        value, &"ngram",
                        "the in-process server drafts by prompt lookup"
                    );
                    draft = qwen3_inference::engine::Draft::Ngram { max: 8 };
                }
                other => panic!("{other}: not a flag the in-process server knows"),
            }
        }
        let file = ModelFile::open(model).unwrap();
        let c = file.config().clone();
        let context_len =
            context.unwrap_or_else(|| (c.max_context() as usize).min(DEFAULT_CONTEXT_CAP));
        let paths = companion_paths(model);
        let tokenizer = Tokenizer::open(&paths.tokenizer).unwrap();
        let template = paths
            .template
            .exists()
            .then(|| ChatTemplate::open(&paths.template).unwrap());
        // A chat answer also ends at the template's end of turn (as the CLI's chat does).
        let mut chat_stop_ids = c.eos_token_ids.clone();
        if let Some(id) = template
            .as_ref()
            .and_then(|t| t.special_token("eos_token"))
            .and_then(|t| tokenizer.token_id(t))
        {
            if !chat_stop_ids.contains(&id) {
                chat_stop_ids.push(id);
            }
        }
        let reranker = rerank.then(|| qwen3_inference::rerank::Reranker::new(&tokenizer).unwrap());
        let (commands, rx) = std::sync::mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let state = AppState {
            model_name: model_name
                .unwrap_or_else(|| model.file_stem().unwrap().to_string_lossy().into_owned()),
            tokenizer: Box::leak(Box::new(tokenizer)),
            thinking_template: template
                .as_ref()
                .is_some_and(|t| t.default_thinking().is_some()),
            xml_tool_calls: template.as_ref().is_some_and(|t| t.xml_tool_calls()),
            template,
            eos_ids: c.eos_token_ids.clone(),
            chat_stop_ids,
            defaults: c.generation.clone(),
            context_len,
            slots,
            max_queue: 64,
            api_key,
            created: qwen3_server::job::unix_now(),
            commands: commands.clone(),
            metrics: metrics.clone(),
            ui: true,
            grammars: Grammars::new(c.vocab_size as usize),
            cors,
            body_timeout: std::time::Duration::from_secs(60),
            reranker,
            embeds: c.embedding.is_some(),
            info: ModelInfo::of(&file, model),
            images: qwen3_inference::vision::ImageEncoder::from_file(&file).unwrap(),
            draining: Default::default(),
            public_metrics,
            max_images,
            max_image_pixels,
            fetch_image_urls,
            max_image_bytes,
            draft,
        };
        let cfg = EngineConfig {
            slots,
            ..EngineConfig::default()
        };
        let run = move |commands| {
            let model = Model::load(&file)?;
            let rows = qwen3_inference::engine::logit_rows(slots);
            let fwd = Forward::new(CPU, &model, context_len, MAX_BATCH, rows, KvType::F32)?;
            worker::run(Engine::new(fwd, cfg)?, commands, metrics);
            Ok(())
        };
        let (worker, _ended) = qwen3_server::start_worker(run, rx).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Server {
            app: qwen3_server::router(Arc::new(state)),
            rt,
            commands,
            worker: Some(worker),
            log: RefCell::new(String::new()),
        }
    }

    pub fn get(&self, path: &str) -> Resp {
        self.http("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.http("POST", path, &[], body.to_string().as_bytes())
    }

    /// One request, its response read to the end.
    pub fn http(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let mut req = axum::http::Request::builder().method(method).uri(path);
        // JSON unless the test says otherwise.
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Body::from(body.to_vec())).unwrap();
        let start = std::time::Instant::now();
        let r = self.rt.block_on(async {
            let r = match self.app.clone().oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            let status = r.status().as_u16();
            let headers = r
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            Resp {
                status,
                headers,
                body: String::from_utf8(bytes.to_vec()).expect("the body is UTF-8"),
            }
        });
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let line = format!("{method} {path} {} {ms:.0}ms\n", r.status);
        self.log.borrow_mut().push_str(&line);
        r
    }

    /// The responses so far, a line each: `METHOD path status 12ms`.
    pub fn log(&self) -> String {
        self.log.borrow().clone()
    }
}

/// `tiny-qwen3-fullvocab` (the real Qwen3 tokenizer, random weights) with Qwen3.5's chat
/// template (fixtures/chat), whose tool calls are XML, exported as f32 into `dir`.
pub fn xml_template_model(dir: &Path) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let ck = dir.join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    for f in std::fs::read_dir(root.join("models/tiny-qwen3-fullvocab")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, ck.join(f.file_name().unwrap())).unwrap();
    }
    let read =
        |p: &Path| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    let q35 = read(&root.join("chat/qwen3.5-tokenizer_config.json"));
    let cfg_path = ck.join("tokenizer_config.json");
    let mut cfg = read(&cfg_path);
    cfg["chat_template"] = q35["chat_template"].clone();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let m = dir.join("m.bin");
    let opts = qwen3_export::ExportOptions {
        dtype: qwen3_inference::format::DType::F32,
        group_size: 0,
        ..Default::default()
    };
    qwen3_export::export(&ck, &m, &opts).unwrap();
    m
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

pub use qwen3_test_support::Resp;

/// The text of a completion answer's first choice.
pub use qwen3_test_support::choice_text as text;
