//! What several end-to-end tests share: the fullvocab fixture exported once per test binary, and
//! the server tests' client side: the real `qwen3 serve` binary on an ephemeral loopback port,
//! and a small HTTP/1.1 client over `TcpStream` (one request per connection, `Connection:
//! close`), so a test sees exactly the bytes a client gets, can send malformed requests, and
//! can hang up in the middle of an answer.

#![allow(dead_code, unused_imports)] // each test file uses part of it

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A temporary directory of this test binary's own (emptied when the binary starts).
pub fn binary_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let name = format!("pq-{}-{}", env!("CARGO_CRATE_NAME"), std::process::id());
        let d = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// `fixtures/models/tiny-qwen3-fullvocab` (random weights, the real Qwen3 tokenizer and
/// template) exported once per test binary through the CLI, as q8 with groups of 32.
pub fn fullvocab_model() -> &'static str {
    static MODEL: OnceLock<String> = OnceLock::new();
    MODEL.get_or_init(|| {
        let out = binary_dir().join("m.bin");
        let o = Command::new(env!("CARGO_BIN_EXE_qwen3"))
            .arg("export")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../fixtures/models/tiny-qwen3-fullvocab"),
            )
            .arg(&out)
            .args(["--group-size", "32"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out.to_str().unwrap().to_string()
    })
}

/// A running `qwen3 serve`; killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    /// Starts `qwen3 serve <model> --port 0 <args>` and waits for its ready line (the port).
    /// `model` is a model file, or anything else `serve` takes (a repository id).
    pub fn start(model: &Path, args: &[&str]) -> Server {
        Server::start_env(model, args, &[])
    }

    pub fn start_env(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        // In the temporary directory, not beside the model: the model may be a repository id.
        let log = std::env::temp_dir().join(format!(
            "qwen3-serve-{}-{}.log",
            std::process::id(),
            unique()
        ));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
        cmd.arg("serve").arg(model).args(["--port", "0"]).args(args);
        // One kernel thread unless the test asks: tests run side by side.
        if !args.contains(&"--threads") {
            cmd.args(["--threads", "1"]);
        }
        cmd.env_remove("QWEN3_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no ready line: {line:?}; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Server { child, port, log }
    }

    pub fn get(&self, path: &str) -> Resp {
        http(self.port, "GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        http(self.port, "POST", path, &[], body.to_string().as_bytes())
    }

    /// The request log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub use qwen3_test_support::Resp;

/// One request on a fresh connection, read to the end.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(port);
    send(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A body the server refuses early may not be read in full: the write can then fail.
    let _ = s.write_all(body);
}

pub fn parse(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8(body).expect("the body is UTF-8"),
    }
}

/// Undoes `Transfer-Encoding: chunked`: hex size line, data, CRLF, until a zero size.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// Waits until `f` holds, polling, for at most `limit`.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// The text of a completion answer's first choice.
pub use qwen3_test_support::choice_text as text;
