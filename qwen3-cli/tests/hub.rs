//! Models by name, without the internet: `qwen3 export ORG/NAME` and `qwen3 generate ORG/NAME`
//! against a local mirror of the hub on a loopback port (`HF_ENDPOINT`), serving the tiny fixture
//! checkpoints with the hub's URL layout and headers. First download into the HuggingFace cache,
//! a cache hit with the mirror stopped, resume after a cut connection and after a killed run,
//! 404, 401 (gated) with and without a token, offline mode, an architecture we do not run; and a
//! cache directory written by Python's `huggingface_hub` itself (`fixtures/hub-cache`).

mod common;

use qwen3_test_support::tempdir;
use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "hub/mirror.rs"]
mod mirror;
use mirror::{etag, Mirror, MirrorRepo, Seen, COMMIT};

fn fixture_files(name: &str) -> HashMap<String, Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    let mut files = HashMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_str().unwrap().to_string();
        files.insert(n, std::fs::read(&p).unwrap());
    }
    files
}

fn repo(name: &str, gated: bool) -> MirrorRepo {
    MirrorRepo {
        files: fixture_files(name),
        gated,
    }
}

/// `qwen3 ARGS` with the cache at `cache` and the hub at `endpoint`; no token, not offline.
fn qwen3(cache: &Path, endpoint: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
    cmd.args(args)
        .env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", cache.join("no-home"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) {
    assert!(o.status.success(), "{}", err(o));
}

/// A refused request fails with one line naming the problem and writes no model file.
fn refused(o: &Output, out: &Path, want: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", err(o));
    let e = err(o);
    assert!(e.contains(want), "expected {want:?} in {e}");
    assert!(!out.exists(), "{} was written", out.display());
}

/// The bytes an export of the fixture's own directory gives: what a download must reproduce.
fn local_export(name: &str, dir: &Path) -> Vec<u8> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    let out = dir.join("local.bin");
    let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args([
            "export",
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            "--dtype",
            "f32",
        ])
        .output()
        .unwrap();
    ok(&o);
    std::fs::read(out).unwrap()
}

const SHARDED: &str = "tiny-f16-sharded-gqa4";

/// A mirror serving the sharded fixture as `test-org/tiny`, cutting `cut`'s first download.
fn sharded_mirror(cut: Option<&str>) -> Mirror {
    Mirror::start(
        HashMap::from([("test-org/tiny".to_string(), repo(SHARDED, false))]),
        cut,
    )
}

/// `qwen3 export test-org/tiny OUT --dtype f32 EXTRA...` against `endpoint`, cache at `cache`.
fn export_tiny(cache: &Path, endpoint: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "export",
        "test-org/tiny",
        out.to_str().unwrap(),
        "--dtype",
        "f32",
    ];
    args.extend_from_slice(extra);
    qwen3(cache, endpoint, &args, &[])
}

#[test]
fn first_download_then_the_cache_without_network() {
    let dir = tempdir("hub", "first");
    let cache = dir.join("cache");
    let mirror = sharded_mirror(None);
    let out = dir.join("a.bin");
    let o = export_tiny(&cache, &mirror.url(), &out, &[]);
    ok(&o);
    assert_eq!(std::fs::read(&out).unwrap(), local_export(SHARDED, &dir));
    // Only what export reads was fetched: not reference.json.
    let seen = mirror.seen();
    assert!(
        seen.iter().all(|s| !s.path.contains("reference.json")),
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .any(|s| s.path.ends_with("model-00003-of-00003.safetensors")));
    // huggingface_hub's layout: refs/main holds the commit, snapshots/COMMIT/ links into blobs/.
    let repo_dir = cache.join("models--test-org--tiny");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main"))
            .unwrap()
            .trim(),
        COMMIT
    );
    let link = repo_dir.join("snapshots").join(COMMIT).join("config.json");
    let target = std::fs::read_link(&link).unwrap();
    assert!(target.starts_with("../../blobs"), "{}", target.display());

    // The mirror gone (its port refuses connections): the cache alone, no request made.
    let endpoint = mirror.url();
    drop(mirror);
    for extra in [&[][..], &["--offline"][..]] {
        let out2 = dir.join("b.bin");
        let o = export_tiny(&cache, &endpoint, &out2, extra);
        ok(&o);
        assert!(err(&o).contains("in the HuggingFace cache"), "{}", err(&o));
        assert_eq!(std::fs::read(&out2).unwrap(), std::fs::read(&out).unwrap());
        std::fs::remove_file(&out2).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A connection cut halfway through a shard: the download resumes from where it stopped (a
/// `Range` request from the bytes it had), and the result is whole.
#[test]
fn a_cut_download_resumes() {
    let dir = tempdir("hub", "cut");
    let cache = dir.join("cache");
    let shard = "model-00002-of-00003.safetensors";
    let mirror = sharded_mirror(Some(shard));
    let out = dir.join("a.bin");
    let o = export_tiny(&cache, &mirror.url(), &out, &[]);
    ok(&o);
    assert_eq!(std::fs::read(&out).unwrap(), local_export(SHARDED, &dir));
    let resumed: Vec<Seen> = mirror
        .seen()
        .into_iter()
        .filter(|s| {
            s.path.ends_with(shard)
                && s.range
                    .as_deref()
                    .is_some_and(|r| r != "bytes=0-0" && r != "bytes=0-")
        })
        .collect();
    assert!(
        !resumed.is_empty(),
        "no resumed range request: {:?}",
        mirror.seen()
    );

    // A run killed mid-file leaves its `.part` blob: the next run asks for the rest only.
    let dir2 = dir.join("second");
    let cache2 = dir2.join("cache");
    let bytes = &fixture_files(SHARDED)[shard];
    let blobs = cache2.join("models--test-org--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{}.part", etag(bytes))), &bytes[..1000]).unwrap();
    let mirror = sharded_mirror(None);
    let out = dir2.join("a.bin");
    let o = export_tiny(&cache2, &mirror.url(), &out, &[]);
    ok(&o);
    assert_eq!(std::fs::read(&out).unwrap(), local_export(SHARDED, &dir));
    let shard_gets: Vec<Seen> = mirror
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with(shard))
        .collect();
    assert!(
        shard_gets
            .iter()
            .any(|s| s.range.as_deref() == Some("bytes=1000-")),
        "{shard_gets:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_gated_offline_and_unsupported_are_one_line_each() {
    let dir = tempdir("hub", "errors");
    let cache = dir.join("cache");
    let mut llama = repo("tiny-f32-tied-gqa2", false);
    let cfg = String::from_utf8(llama.files["config.json"].clone()).unwrap();
    llama.files.insert(
        "config.json".into(),
        cfg.replace("Qwen3ForCausalLM", "LlamaForCausalLM")
            .replace("qwen3", "llama")
            .into_bytes(),
    );
    let mirror = Mirror::start(
        HashMap::from([
            (
                "test-org/gated".to_string(),
                repo("tiny-f32-tied-gqa2", true),
            ),
            ("test-org/llama".to_string(), llama),
        ]),
        None,
    );
    let out = dir.join("a.bin");
    let o_str = out.to_str().unwrap();
    let run = |name: &str, env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec!["export", name, o_str, "--dtype", "f32"];
        args.extend_from_slice(extra);
        qwen3(&cache, &mirror.url(), &args, env)
    };
    refused(
        &run("test-org/nope", &[], &[]),
        &out,
        "test-org/nope: no such model at",
    );
    refused(
        &run("test-org/gated", &[], &[]),
        &out,
        "test-org/gated is gated: accept its licence",
    );
    refused(
        &run("test-org/gated", &[("HF_TOKEN", "bad-token")], &[]),
        &out,
        "is gated",
    );
    let o = run("test-org/llama", &[], &[]);
    refused(&o, &out, "architecture LlamaForCausalLM is not supported (supported: Qwen3ForCausalLM, Qwen2ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration)");
    // Refused before the weights were fetched.
    assert!(
        mirror
            .seen()
            .iter()
            .all(|s| !s.path.ends_with(".safetensors")),
        "{:?}",
        mirror.seen()
    );
    // Offline, and not in the cache: no request at all.
    let before = mirror.seen().len();
    refused(
        &run("test-org/other", &[], &["--offline"]),
        &out,
        "not in the HuggingFace cache",
    );
    refused(
        &run("test-org/other", &[("HF_HUB_OFFLINE", "1")], &[]),
        &out,
        "forbids downloading",
    );
    assert_eq!(mirror.seen().len(), before);
    // No server at all.
    let o = qwen3(
        &cache,
        "http://127.0.0.1:9",
        &["export", "test-org/x", o_str],
        &[],
    );
    refused(&o, &out, "cannot reach http://127.0.0.1:9");
    // A host that accepts the connection and never answers: given up on, naming it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = silent.local_addr().unwrap().to_string();
    let hold = std::thread::spawn(move || {
        let (conn, _) = silent.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_secs(8));
        drop(conn);
    });
    let t = std::time::Instant::now();
    let o = qwen3(
        &cache,
        &format!("http://{host}"),
        &["export", "test-org/x", o_str],
        &[("QWEN3_HUB_TIMEOUT", "2")],
    );
    refused(&o, &out, &format!("{host} did not answer for 2 s"));
    assert!(t.elapsed().as_secs() < 7, "{:?}", t.elapsed());
    hold.join().unwrap();
    // The token opens the gated repository.
    ok(&run("test-org/gated", &[("HF_TOKEN", "good-token")], &[]));
    assert!(out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qwen3 generate NAME`: exported once into --models-dir, then that file, with no download.
#[test]
fn a_name_runs_from_its_export_made_once() {
    let dir = tempdir("hub", "byname");
    let cache = dir.join("cache");
    let models = dir.join("models");
    let mirror = sharded_mirror(None);
    let args = [
        "generate",
        "test-org/tiny",
        "--models-dir",
        models.to_str().unwrap(),
        "--prompt-ids",
        "[1, 2, 3]",
        "-n",
        "4",
        "-t",
        "0",
    ];
    let first = qwen3(&cache, &mirror.url(), &args, &[]);
    ok(&first);
    assert!(
        err(&first).contains("exporting it once to"),
        "{}",
        err(&first)
    );
    let file = models.join("test-org--tiny.bin");
    assert!(file.exists() && models.join("test-org--tiny.tokenizer.bin").exists());
    let requests = mirror.seen().len();
    let second = qwen3(&cache, &mirror.url(), &args, &[]);
    ok(&second);
    assert!(!err(&second).contains("exporting"), "{}", err(&second));
    assert_eq!(first.stdout, second.stdout, "the same greedy tokens");
    assert_eq!(mirror.seen().len(), requests, "no request the second time");

    // The other commands take the name too (the models directory from QWEN3_MODELS_DIR).
    let env = [("QWEN3_MODELS_DIR", models.to_str().unwrap())];
    for args in [
        &["info", "test-org/tiny"][..],
        &["tokenize", "test-org/tiny", "Hello"],
        &["detokenize", "test-org/tiny", "[42]"],
    ] {
        let o = qwen3(&cache, &mirror.url(), args, &env);
        ok(&o);
    }
    assert_eq!(mirror.seen().len(), requests, "no request for these");
    // `qwen3 list` shows it by name; `qwen3 rm` removes it and its companions.
    let list = qwen3(&cache, &mirror.url(), &["list"], &env);
    ok(&list);
    let shown = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        shown.lines().any(|l| l.starts_with("test-org/tiny ")),
        "{shown}"
    );
    let models_flag = ["--models-dir", models.to_str().unwrap()];
    let rm = qwen3(
        &cache,
        &mirror.url(),
        &[&["rm", "test-org/tiny"][..], &models_flag].concat(),
        &[],
    );
    ok(&rm);
    assert!(!file.exists() && !models.join("test-org--tiny.tokenizer.bin").exists());
    let again = qwen3(
        &cache,
        &mirror.url(),
        &[&["rm", "test-org/tiny"][..], &models_flag].concat(),
        &[],
    );
    assert!(
        err(&again).contains("test-org/tiny: no such model"),
        "{}",
        err(&again)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cache written by Python's huggingface_hub (`snapshot_download` from a local mirror, by
/// scripts/make_hub_cache.py): found offline by branch and by commit.
#[test]
fn a_cache_written_by_huggingface_hub_is_read() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hub-cache");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("meta.json")).unwrap()).unwrap();
    let id = meta["repo_id"].as_str().unwrap();
    let commit = meta["commit"].as_str().unwrap();
    let dir = tempdir("hub", "python");
    let cache: PathBuf = fixture.join("hub");
    for name in [id.to_string(), format!("{id}@{commit}")] {
        let out = dir.join("m.bin");
        let o = qwen3(
            &cache,
            "http://127.0.0.1:9",
            &[
                "export",
                &name,
                out.to_str().unwrap(),
                "--dtype",
                "f32",
                "--offline",
            ],
            &[],
        );
        ok(&o);
        let src = meta["fixture"].as_str().unwrap();
        assert_eq!(
            std::fs::read(&out).unwrap(),
            local_export(src, &dir),
            "{name}"
        );
        std::fs::remove_file(&out).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qwen3 serve NAME`: served from its export, under the repository id in `/v1/models`.
#[test]
fn serve_names_the_model_by_its_id() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hub-cache/hub");
    let dir = tempdir("hub", "serve");
    let models = dir.join("models");
    let server = common::Server::start_env(
        Path::new("test-org/tiny-qwen2"),
        &["--offline", "--models-dir", models.to_str().unwrap()],
        &[("HF_HUB_CACHE", fixture.to_str().unwrap())],
    );
    let v = server.get("/v1/models").json();
    assert_eq!(v["data"][0]["id"], "test-org/tiny-qwen2", "{v}");
    drop(server);
    assert!(models.join("test-org--tiny-qwen2.bin").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hub repository's GGUF file by its quantization (`ORG/NAME-GGUF:Q8_0`, as llama.cpp's `-hf`
/// takes it): only that file is downloaded into the cache, and it runs as the file itself does;
/// the next run finds it offline; a `-GGUF` repository named alone gives its Q4_K_M; `export`
/// takes the name too; a quantization the repository lacks is one line listing what it has.
#[test]
fn a_gguf_repository_by_its_quantization() {
    let dir = tempdir("hub", "gguf");
    let cache = dir.join("cache");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    let q8_0 = fixtures.join("tiny-f32-tied-gqa2-q8_0.gguf");
    let files = HashMap::from([
        ("tiny-Q8_0.gguf".to_string(), std::fs::read(&q8_0).unwrap()),
        (
            "tiny-Q4_K_M.gguf".to_string(),
            std::fs::read(fixtures.join("tiny-bf16-tied-k256-q4_k_m.gguf")).unwrap(),
        ),
        ("README.md".to_string(), b"# tiny\n".to_vec()),
    ]);
    let repos = HashMap::from([(
        "test-org/tiny-GGUF".to_string(),
        MirrorRepo {
            files,
            gated: false,
        },
    )]);
    let mirror = Mirror::start(repos, None);
    let run = |model: &str| {
        vec![
            "inference".to_string(),
            model.to_string(),
            "-i".into(),
            "The capital of France is".into(),
            "-n".into(),
            "8".into(),
            "-t".into(),
            "0".into(),
        ]
    };
    let args = run("test-org/tiny-GGUF:Q8_0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = qwen3(&cache, &mirror.url(), &args, &[]);
    ok(&first);
    let fetched: Vec<String> = (mirror.seen().iter())
        .map(|s| s.path.clone())
        .filter(|p| p.contains("/resolve/"))
        .collect();
    assert!(
        !fetched.is_empty() && fetched.iter().all(|p| p.ends_with("/tiny-Q8_0.gguf")),
        "{fetched:?}"
    );
    let direct = run(q8_0.to_str().unwrap());
    let direct = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(&direct)
        .output()
        .unwrap();
    ok(&direct);
    assert_eq!(first.stdout, direct.stdout, "the file's own greedy text");
    let requests = mirror.seen().len();
    let second = qwen3(&cache, &mirror.url(), &args, &[("HF_HUB_OFFLINE", "1")]);
    ok(&second);
    assert_eq!(second.stdout, first.stdout);
    assert!(
        err(&second).contains("in the HuggingFace cache"),
        "{}",
        err(&second)
    );
    assert_eq!(mirror.seen().len(), requests, "no request offline");

    let info = qwen3(&cache, &mirror.url(), &["info", "test-org/tiny-GGUF"], &[]);
    ok(&info);
    let shown = String::from_utf8_lossy(&info.stdout).to_string();
    assert!(shown.contains("yes, Q4_K + Q6_K"), "{shown}");
    // `qwen3 list` shows both cached files by the names that run them.
    let env = [
        ("QWEN3_MODELS_DIR", dir.join("models")),
        ("OLLAMA_MODELS", dir.join("ollama")),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    let list = qwen3(&cache, &mirror.url(), &["list"], &env);
    ok(&list);
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    for name in ["test-org/tiny-GGUF:Q8_0 ", "test-org/tiny-GGUF:Q4_K_M "] {
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with(name) && l.ends_with("HuggingFace cache")),
            "{listed}"
        );
    }

    let out = dir.join("tiny.bin");
    let export = qwen3(
        &cache,
        &mirror.url(),
        &["export", "test-org/tiny-GGUF:Q8_0", out.to_str().unwrap()],
        &[("HF_HUB_OFFLINE", "1")],
    );
    ok(&export);
    assert!(out.exists() && dir.join("tiny.tokenizer.bin").exists());

    let lacking = qwen3(
        &cache,
        &mirror.url(),
        &["info", "test-org/tiny-GGUF:Q6_K"],
        &[],
    );
    assert!(!lacking.status.success());
    let e = err(&lacking);
    assert!(
        e.contains("test-org/tiny-GGUF:Q6_K: no Q6_K GGUF file in the repository; it has tiny-Q4_K_M.gguf, tiny-Q8_0.gguf"),
        "{e}"
    );
    assert_eq!(
        e.trim_end().lines().last().map(|l| l.contains("no Q6_K")),
        Some(true),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A quantization the repository holds split in parts (`-00001-of-00003.gguf` ...): every part
/// is downloaded, none of the repository's other files, and the model runs from its first part
/// as the whole file does; the next run finds all of it offline, and `qwen3 list` shows it once,
/// by the name that runs it.
#[test]
fn a_split_gguf_comes_in_all_its_parts() {
    let dir = tempdir("hub", "gguf-split");
    let cache = dir.join("cache");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    let part = |k: usize| format!("tiny-Q8_0-{k:05}-of-00003.gguf");
    let mut files: HashMap<String, Vec<u8>> = (1..=3)
        .map(|k| {
            let source = fixtures.join(format!(
                "split/tiny-f32-tied-gqa2-q8_0-{k:05}-of-00003.gguf"
            ));
            (part(k), std::fs::read(source).unwrap())
        })
        .collect();
    files.insert(
        "tiny-Q4_K_M.gguf".to_string(),
        std::fs::read(fixtures.join("tiny-bf16-tied-k256-q4_k_m.gguf")).unwrap(),
    );
    let repos = HashMap::from([(
        "test-org/tiny-GGUF".to_string(),
        MirrorRepo {
            files,
            gated: false,
        },
    )]);
    let mirror = Mirror::start(repos, None);
    let args = |model: &str| {
        [
            model,
            "-i",
            "The capital of France is",
            "-n",
            "8",
            "-t",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
    };
    let run = |model: &str, env: &[(&str, &str)]| {
        let mut a = vec!["inference".to_string()];
        a.extend(args(model));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        qwen3(&cache, &mirror.url(), &a, env)
    };
    let first = run("test-org/tiny-GGUF:Q8_0", &[]);
    ok(&first);
    let mut fetched: Vec<String> = (mirror.seen().iter())
        .filter(|s| s.path.contains("/resolve/"))
        .map(|s| s.path.rsplit('/').next().unwrap().to_string())
        .collect();
    fetched.sort();
    fetched.dedup();
    assert_eq!(fetched, [part(1), part(2), part(3)]);
    let whole = fixtures.join("tiny-f32-tied-gqa2-q8_0.gguf");
    let mut direct = vec!["inference".to_string()];
    direct.extend(args(whole.to_str().unwrap()));
    let direct = Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(&direct)
        .output()
        .unwrap();
    ok(&direct);
    assert_eq!(first.stdout, direct.stdout, "the whole file's greedy text");
    let requests = mirror.seen().len();
    let second = run("test-org/tiny-GGUF:Q8_0", &[("HF_HUB_OFFLINE", "1")]);
    ok(&second);
    assert_eq!(second.stdout, first.stdout);
    assert_eq!(mirror.seen().len(), requests, "no request offline");
    let env = [
        ("QWEN3_MODELS_DIR", dir.join("models")),
        ("OLLAMA_MODELS", dir.join("ollama")),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    let list = qwen3(&cache, &mirror.url(), &["list"], &env);
    ok(&list);
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    let lines: Vec<&str> = listed.lines().filter(|l| l.contains("tiny-GGUF")).collect();
    assert_eq!(lines.len(), 1, "{listed}");
    assert!(lines[0].starts_with("test-org/tiny-GGUF:Q8_0 "), "{listed}");
    // A part gone from the cache: offline, one line names it; online only that part comes
    // again.
    let snapshots = cache.join("models--test-org--tiny-GGUF/snapshots");
    let snapshot = std::fs::read_dir(&snapshots)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(snapshot.join(part(2))).unwrap();
    let offline = run("test-org/tiny-GGUF:Q8_0", &[("HF_HUB_OFFLINE", "1")]);
    assert!(!offline.status.success(), "{}", err(&offline));
    let e = err(&offline);
    assert!(
        e.contains("split in parts, of which the cache lacks")
            && e.contains(&part(2))
            && e.contains("offline")
            && e.lines().count() == 1,
        "{e}"
    );
    let before = mirror.seen().len();
    let again = run("test-org/tiny-GGUF:Q8_0", &[]);
    ok(&again);
    assert_eq!(again.stdout, first.stdout);
    let refetched: Vec<String> = (mirror.seen()[before..].iter())
        .filter(|s| s.path.contains("/resolve/"))
        .map(|s| s.path.rsplit('/').next().unwrap().to_string())
        .collect();
    assert!(
        !refetched.is_empty() && refetched.iter().all(|p| *p == part(2)),
        "{refetched:?}"
    );
    // A part whose blob is gone (its link left dangling): offline, named as missing too.
    let link = snapshot.join(part(3));
    let blob = link
        .parent()
        .unwrap()
        .join(std::fs::read_link(&link).unwrap());
    std::fs::remove_file(blob).unwrap();
    let offline = run("test-org/tiny-GGUF:Q8_0", &[("HF_HUB_OFFLINE", "1")]);
    let e = err(&offline);
    assert!(
        !offline.status.success()
            && e.contains(&format!("the cache lacks {}", part(3)))
            && e.contains("blobs that are gone")
            && e.lines().count() == 1,
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
