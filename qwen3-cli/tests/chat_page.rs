//! The chat page at `/` in a real browser: headless Chromium driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`; the protocol is JSON over HTTP, spoken here with the server
//! tests' plain client). It loads the page, sends a message, sees the streamed answer appear,
//! presses Stop in the middle of a long answer, and sees the server free the slot. `#[ignore]`d
//! with that reason, so a plain `cargo test` reports it as ignored, not passed. CI installs
//! Chromium and runs it with `--include-ignored` (saying so where it cannot install it); run that
//! way without a browser, it fails naming what is missing.

mod common;

use common::{wait_until, Server};
use qwen3_inference::format::DType;
use qwen3_test_support::{export_fixture, tempdir};
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A chromedriver process and one browser session in it; both end when dropped.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    fn start(profile: &Path) -> Browser {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            }),
            "chromedriver did not start"
        );
        // The flags a closed machine needs: no background connections, no sandbox as root.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1100,760",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
        };
        let v = b.call("POST", "/session", caps);
        b.session = v["sessionId"].as_str().expect("a session").to_string();
        b
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let path = if path.starts_with("/session/") || path == "/session" {
            path.to_string()
        } else {
            format!("/session/{}{path}", self.session)
        };
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, text) = driver_http(self.port, method, &path, &body);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(status == 200, "{method} {path}: {status} {text}");
        v["value"].clone()
    }

    fn element(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            json!({"using": "css selector", "value": css}),
        );
        v.as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.call("POST", &format!("/element/{e}/click"), json!({}));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            json!({"text": text}),
        );
    }

    fn script(&self, js: &str) -> Value {
        self.call("POST", "/execute/sync", json!({"script": js, "args": []}))
    }
}

impl Browser {
    /// Opens the page of the server on `port`.
    fn open(&self, port: u16) {
        self.call(
            "POST",
            "/url",
            json!({"url": format!("http://127.0.0.1:{port}/")}),
        );
    }

    /// Waits (up to a minute) until the script `text` (which returns an element's text) says
    /// "tok/s": the answer's summary line, shown when it ends. Panics with the page's text and
    /// `server`'s log otherwise.
    fn wait_answered(&self, text: &str, server: &Server) {
        assert!(
            wait_until(Duration::from_secs(60), || self
                .script(text)
                .as_str()
                .unwrap()
                .contains("tok/s")),
            "no answer: {}\nserver log: {}",
            self.script("return document.body.innerText"),
            server.log()
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = driver_http(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                "",
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One request to chromedriver, which keeps connections open (so the body is read by its
/// Content-Length, not to the end of the stream): status and body.
fn driver_http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut len = 0;
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
}

fn metric(server: &Server, name: &str) -> f64 {
    let body = server.get("/metrics").body;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
#[ignore = "needs Debian's chromium and chromium-driver: CI installs them and runs it"]
fn the_page_streams_an_answer_and_stop_frees_the_slot() {
    assert!(
        Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
        "the chat page's browser test needs Debian's chromium and chromium-driver \
         ({CHROMIUM}, {CHROMEDRIVER}); install them to run it"
    );
    let dir = tempdir("pq-page", "browser");
    let m = export_fixture("tiny-qwen3-fullvocab", &dir, DType::F32, 0);
    let server = Server::start(&m, &["--parallel", "1", "--model-name", "tiny"]);
    let profile: PathBuf = dir.join("profile");
    let b = Browser::start(&profile);
    b.open(server.port);
    assert_eq!(b.script("return document.title"), "pico-qwen");

    // A message: the answer streams in, and its summary line appears when it ends.
    b.type_into("#max_tokens", "12");
    b.type_into("#input", "Hi there!");
    b.click("#send");
    let answer = "return (document.querySelector('.assistant .answer') || {}).textContent || ''";
    let meta = "return (document.querySelector('.assistant .meta') || {}).textContent || ''";
    b.wait_answered(meta, &server);
    assert!(!b.script(answer).as_str().unwrap().is_empty());
    assert!(b.script(meta).as_str().unwrap().contains("12 tokens"));

    // A long answer (until the context is full), stopped in the middle.
    b.script("document.getElementById('max_tokens').value = ''; return 0");
    b.type_into("#input", "Tell me a long story.");
    b.click("#send");
    let second = "const a = document.querySelectorAll('.assistant .answer'); return a.length > 1 ? a[1].textContent : ''";
    assert!(
        wait_until(Duration::from_secs(60), || !b
            .script(second)
            .as_str()
            .unwrap()
            .is_empty()),
        "the second answer did not start"
    );
    assert_eq!(metric(&server, "qwen3_running_sequences"), 1.0);
    b.click("#stop");
    let second_meta = "const a = document.querySelectorAll('.assistant .meta'); return a.length > 1 ? a[1].textContent : ''";
    assert!(
        wait_until(Duration::from_secs(30), || b
            .script(second_meta)
            .as_str()
            .unwrap()
            .contains("stopped")),
        "no stop: {}",
        b.script(second_meta)
    );
    // The server saw the client go and ended the sequence: the slot is free.
    assert!(
        wait_until(Duration::from_secs(30), || metric(
            &server,
            "qwen3_running_sequences"
        ) == 0.0),
        "the slot was not freed: {}\nserver log: {}",
        server.get("/metrics").body,
        server.log()
    );
    // The page is ready for the next message.
    assert_eq!(
        b.script("return document.getElementById('send').disabled"),
        false
    );
    // A reload keeps the conversation (localStorage), listed in the sidebar.
    b.call("POST", "/refresh", json!({}));
    let users = "return Array.from(document.querySelectorAll('.msg.user')).map(e => e.textContent).join('|')";
    assert!(
        wait_until(Duration::from_secs(20), || b
            .script(users)
            .as_str()
            .unwrap()
            .starts_with("Hi there!")),
        "the conversation is gone after a reload: {}",
        b.script("return document.body.innerText")
    );
    assert!(
        b.script("return document.querySelectorAll('#convs li').length")
            .as_u64()
            .unwrap()
            >= 1
    );

    // At phone width (400 px): the settings fold away behind a button; the message box, Send
    // and Stop stay on screen, and a message still gets its answer.
    b.call("POST", "/window/rect", json!({"width": 400, "height": 800}));
    let on_screen = |css: &str| {
        b.script(&format!(
            "const r = document.querySelector('{css}').getBoundingClientRect(); \
             return r.width > 0 && r.left >= 0 && r.right <= innerWidth && r.bottom <= innerHeight"
        ))
    };
    let aside = "return getComputedStyle(document.querySelector('aside')).display";
    assert_eq!(
        b.script("return innerWidth <= 700"),
        true,
        "the window did not shrink"
    );
    assert_eq!(b.script(aside), "none");
    for css in ["#input", "#send", "#stop", "#menu"] {
        assert_eq!(on_screen(css), true, "{css} is off screen at 400 px");
    }
    b.click("#menu");
    assert_eq!(b.script(aside), "block");
    b.click("#menu");
    assert_eq!(b.script(aside), "none");
    // (A short answer: max tokens was cleared above, and the settings are folded away now.)
    b.script("document.getElementById('max_tokens').value = '8'; return 0");
    b.type_into("#input", "And on a phone?");
    b.click("#send");
    let last_meta = "const a = document.querySelectorAll('.assistant .meta'); return a.length ? a[a.length - 1].textContent : ''";
    b.wait_answered(last_meta, &server);
    assert!(!server.log().contains("404"), "{}", server.log());

    // For the docs: QWEN3_PAGE_SCREENSHOT=path saves what the page looks like now.
    if let Ok(path) = std::env::var("QWEN3_PAGE_SCREENSHOT") {
        let png = b.call("GET", "/screenshot", Value::Null);
        let bytes = base64_decode(png.as_str().unwrap());
        std::fs::write(path, bytes).unwrap();
    }
    drop(b);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// With a model that sees images the page shows its Image button; a file chosen there goes with
/// the next message as an `image_url` part (the server counts it, and its tokens are in the
/// prompt), shows in the user's bubble, and stays in the conversation after a reload. With a
/// text model the button stays hidden.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver: CI installs them and runs it"]
fn the_page_attaches_an_image_to_a_message() {
    assert!(
        Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
        "the chat page's browser test needs Debian's chromium and chromium-driver \
         ({CHROMIUM}, {CHROMEDRIVER}); install them to run it"
    );
    let name = "tiny-qwen3_5-vl-f32";
    let dir = tempdir("pq-page", "image");
    let m = export_fixture(name, &dir, DType::F32, 0);
    let server = Server::start(&m, &["--parallel", "1", "--context", "512"]);
    let b = Browser::start(&dir.join("profile"));
    b.open(server.port);
    let hidden = "return document.getElementById('attach').hidden";
    assert!(
        wait_until(Duration::from_secs(20), || b.script(hidden) == false),
        "no Image button for a model that sees images"
    );
    let image = qwen3_test_support::fixture(name)
        .join("images/rgb-64x96.png")
        .canonicalize()
        .unwrap();
    b.type_into("#file", image.to_str().unwrap());
    let thumbs = "return document.querySelectorAll('#attached img').length";
    assert!(
        wait_until(Duration::from_secs(10), || b.script(thumbs) == 1),
        "the chosen image is not shown"
    );
    b.type_into("#max_tokens", "4");
    b.type_into("#input", "What is in the picture?");
    b.click("#send");
    let meta = "return (document.querySelector('.assistant .meta') || {}).textContent || ''";
    b.wait_answered(meta, &server);
    assert_eq!(metric(&server, "qwen3_images_total"), 1.0);
    assert_eq!(b.script(thumbs), 0, "the attachment was not cleared");
    let in_bubble = "return document.querySelectorAll('.msg.user img').length";
    assert_eq!(b.script(in_bubble), 1);
    // A reload keeps the message with its image.
    b.call("POST", "/refresh", json!({}));
    assert!(
        wait_until(Duration::from_secs(20), || b.script(in_bubble) == 1),
        "the image is gone after a reload: {}",
        b.script("return document.body.innerText")
    );
    drop(b);
    drop(server);

    // A text model: no button.
    let text = export_fixture("tiny-qwen3-fullvocab", &dir, DType::F32, 0);
    let server = Server::start(&text, &["--parallel", "1"]);
    let b = Browser::start(&dir.join("profile-text"));
    b.open(server.port);
    assert!(wait_until(Duration::from_secs(20), || b
        .script("return document.getElementById('model').textContent")
        != ""));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.script(hidden), true, "an Image button for a text model");
    drop(b);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--no-ui`: `/` is a 404 with OpenAI's error object; the page is served otherwise, without the
/// API key (it asks for it itself).
#[test]
fn no_ui_turns_the_page_off_and_the_page_needs_no_key() {
    let dir = tempdir("pq-page", "no-ui");
    let m = export_fixture("tiny-f32-tied-gqa2", &dir, DType::F32, 0);
    let s = Server::start(&m, &["--no-ui"]);
    let r = s.get("/");
    assert_eq!(r.status, 404);
    assert!(r.error()["message"].as_str().is_some());
    drop(s);
    let s = Server::start(&m, &["--api-key", "k"]);
    let r = s.get("/");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(r.body.contains("<title>pico-qwen</title>"));
    // Its icon, so a browser's request for one is not a 404 on every load.
    let icon = s.get("/favicon.svg");
    assert_eq!(icon.status, 200);
    assert_eq!(icon.header("content-type"), Some("image/svg+xml"));
    // No external resources: the page works offline.
    assert!(!r.body.contains("http://") && !r.body.contains("https://"));
    assert_eq!(s.get("/v1/models").status, 401);
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}

/// Standard base64 (the screenshot WebDriver returns).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => 0,
    };
    let b: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(b.len() * 3 / 4);
    for chunk in b.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|&c| val(c) as u32).collect();
        let n = v
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &x)| acc | x << (18 - 6 * i));
        for k in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * k)) as u8);
        }
    }
    out
}
