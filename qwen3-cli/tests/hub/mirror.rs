//! The hub's API on a loopback port, for `hub.rs`: a mirror of the tiny fixture repositories
//! with the hub's URL layout and the headers huggingface_hub and hf-hub read, which can refuse
//! (404, 401 gated) and cut a download short.

use qwen3_test_support::web::{Reply, Request, WebHost};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One request the mirror saw: its path and its `Range` header.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
}

/// A repository the mirror serves: its files (name -> bytes).
pub struct MirrorRepo {
    pub files: HashMap<String, Vec<u8>>,
    /// Answered with 401 `GatedRepo` unless the request carries `Bearer good-token`.
    pub gated: bool,
}

/// What the mirror does, shared with its thread.
struct State {
    repos: HashMap<String, MirrorRepo>,
    seen: Vec<Seen>,
    /// A file whose first full download is cut after half its bytes.
    cut: Option<String>,
}

/// The hub's API on a loopback port: `GET /api/models/ID/revision/REV` (the file list and
/// commit) and `GET /ID/resolve/REV/FILE` (the bytes, `Range` requests answered with 206 and
/// `Content-Range`, with the headers huggingface_hub and hf-hub read: `X-Repo-Commit`, `ETag`).
/// Dropping it stops it.
pub struct Mirror {
    host: WebHost,
    state: Arc<Mutex<State>>,
}

impl Mirror {
    pub fn start(repos: HashMap<String, MirrorRepo>, cut: Option<&str>) -> Mirror {
        let state = Arc::new(Mutex::new(State {
            repos,
            seen: Vec::new(),
            cut: cut.map(str::to_string),
        }));
        let st = state.clone();
        let host = WebHost::start(move |r| answer(r, &st));
        Mirror { host, state }
    }

    pub fn url(&self) -> String {
        self.host.url()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

/// A file's etag: its sha256, as the hub gives for LFS files (any unique string works for the
/// cache, which names blobs by it).
pub fn etag(bytes: &[u8]) -> String {
    // FNV-1a 64 twice over, hex: unique enough for a test's handful of files.
    let mut h: [u64; 2] = [0xcbf2_9ce4_8422_2325, 0x8422_2325_cbf2_9ce4];
    for (k, &b) in bytes.iter().enumerate() {
        let i = k % 2;
        h[i] = (h[i] ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:016x}{:016x}", h[0], h[1])
}

/// The hub's answer to request `r`.
fn answer(r: &Request, state: &Mutex<State>) -> Reply {
    let path = r.path.clone();
    let range = r.header("range").map(str::to_string);
    let authorized = r.header("authorization") == Some("Bearer good-token");
    let mut st = state.lock().unwrap();
    st.seen.push(Seen {
        path: path.clone(),
        range: range.clone(),
    });
    let refused = |status: &str, code: &str, body: &str| {
        Reply::new(status, body).header("X-Error-Code", code)
    };
    // /api/models/ORG/NAME/revision/REV
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let id = rest.split("/revision/").next().unwrap_or("").to_string();
        return match st.repos.get(&id) {
            None => refused("404 Not Found", "RepoNotFound", "{}"),
            Some(r) if r.gated && !authorized => refused("401 Unauthorized", "GatedRepo", "{}"),
            Some(r) => {
                let mut names: Vec<&String> = r.files.keys().collect();
                names.sort();
                let siblings: Vec<_> = names
                    .iter()
                    .map(|n| serde_json::json!({"rfilename": n}))
                    .collect();
                let body = serde_json::json!({"id": id, "sha": COMMIT, "siblings": siblings});
                Reply::new("200 OK", body.to_string())
            }
        };
    }
    // /ORG/NAME/resolve/REV/FILE
    let Some((id, file)) =
        path.trim_start_matches('/')
            .split_once("/resolve/")
            .map(|(id, rest)| {
                (
                    id.to_string(),
                    rest.split_once('/')
                        .map(|(_, f)| f.to_string())
                        .unwrap_or_default(),
                )
            })
    else {
        return Reply::new("404 Not Found", "");
    };
    let Some(repo) = st.repos.get(&id) else {
        return refused("404 Not Found", "RepoNotFound", "");
    };
    if repo.gated && !authorized {
        return refused("401 Unauthorized", "GatedRepo", "");
    }
    let Some(bytes) = repo.files.get(&file).cloned() else {
        return refused("404 Not Found", "EntryNotFound", "");
    };
    let total = bytes.len();
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or((r, ""));
            let a: usize = a.parse().unwrap_or(0);
            let b: usize = b.parse().map(|b: usize| b + 1).unwrap_or(total);
            (a.min(total), b.min(total))
        }
        None => (0, total),
    };
    let cut_now =
        st.cut.as_deref() == Some(file.as_str()) && start == 0 && end == total && total > 1;
    if cut_now {
        st.cut = None;
    }
    drop(st);
    let status = match range {
        Some(_) => "206 Partial Content",
        None => "200 OK",
    };
    let mut reply = Reply::new(status, &bytes[start..end])
        .header("X-Repo-Commit", COMMIT)
        .header("ETag", format!("\"{}\"", etag(&bytes)));
    if range.is_some() {
        reply = reply.header(
            "Content-Range",
            format!("bytes {start}-{}/{total}", end.max(1) - 1),
        );
    }
    if cut_now {
        // Promise every byte, send half, hang up.
        reply.body.truncate(total / 2);
    }
    reply
}
