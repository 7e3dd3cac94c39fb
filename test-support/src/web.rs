//! A web server on a loopback port for tests of clients that fetch: the hub's downloads
//! (qwen3-cli/tests/hub.rs, a mirror of the hub's API) and `serve --fetch-image-urls`
//! (qwen3-server/tests/vision.rs, a few image files). Each connection gets a thread, one
//! request and an answer, then `Connection: close`; the test says what each request gets
//! ([`WebHost::start`]'s `answer`), including the wrong answers a client must survive: a length
//! that is not said, or a body cut short of the length it promised.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A request as the server read it: its path (with the query, as sent) and its headers, the
/// names lowercased.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// An answer: the status line's code and reason (`"200 OK"`), headers, the body, and the
/// `Content-Length` said.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body's length unless changed ([`Reply::length`]).
    pub length: Option<usize>,
}

impl Reply {
    /// `status` with `body`, its length said.
    pub fn new(status: &str, body: impl Into<Vec<u8>>) -> Reply {
        let body = body.into();
        Reply {
            status: status.to_string(),
            headers: Vec::new(),
            length: Some(body.len()),
            body,
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Reply {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Says another length than the body's (a cut download promises more than it sends), or
    /// none (the body then ends where the connection closes).
    pub fn length(mut self, length: Option<usize>) -> Reply {
        self.length = length;
        self
    }
}

/// The server; dropping it stops it (the port refuses connections from then on).
pub struct WebHost {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl WebHost {
    /// Serves on a free loopback port, each request answered by `answer`.
    pub fn start(answer: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> WebHost {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let (answer, stopped) = (Arc::new(answer), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let answer = answer.clone();
                std::thread::spawn(move || serve(conn, &*answer));
            }
        });
        WebHost { port, stop }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for WebHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One connection: the request's head read, `answer`'s reply written, the connection closed.
fn serve(mut conn: TcpStream, answer: &dyn Fn(&Request) -> Reply) {
    // A client that connects and then says nothing (or stops reading) must not hold a thread
    // forever: each read and write gives up after a while, and the connection is dropped.
    let limit = Some(std::time::Duration::from_secs(30));
    if conn.set_read_timeout(limit).is_err() || conn.set_write_timeout(limit).is_err() {
        return;
    }
    let Ok(read) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let reply = answer(&Request { path, headers });
    let mut head = format!("HTTP/1.1 {}\r\nConnection: close\r\n", reply.status);
    if let Some(n) = reply.length {
        head += &format!("Content-Length: {n}\r\n");
    }
    for (k, v) in &reply.headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(&reply.body);
    let _ = conn.flush();
    let _ = conn.shutdown(std::net::Shutdown::Both);
}
