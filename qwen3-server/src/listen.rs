//! The connection layer under the router: the accept loop, its limits and timeouts, and the
//! errors HTTP itself answers.
//!
//! `axum::serve` accepts every connection and waits on each as long as the client likes. A
//! server on a network needs three bounds, each a flag of `qwen3 serve`:
//!
//! - **connections** (`--max-connections`): beyond the limit a new connection gets a 503 with
//!   OpenAI's error object and is closed at once, rather than held (each holds a task and a
//!   socket; a few thousand idle ones would exhaust file descriptors);
//! - **the request head** (`--header-timeout`): hyper closes a connection whose next request line
//!   and headers have not all arrived in time, idle keep-alive connections included (a
//!   "slowloris" client sends a header byte every few seconds to hold a connection forever);
//! - **the body** (`--body-timeout`, and [`MAX_BODY`] bytes): the router's first layer
//!   ([`read_body`]) reads the whole body within the time or answers 408 (413 past the size); a
//!   client that promises 100 bytes and sends 2 does not hold a handler.
//!
//! Requests hyper cannot parse (a garbage request line, headers or a URI over its limits) are
//! answered by hyper itself, before any router sees them, with an empty body. [`ErrorBodies`]
//! gives those answers OpenAI's error object too, so that every error this server sends has one.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The most bytes a request's line and headers may take (431 beyond them; hyper's own limit on
/// the URI alone, 414, is 64 KiB). Browsers and clients send a few KiB at most; nginx allows
/// 32 KiB by default.
const MAX_HEAD: usize = 96 << 10;

/// The largest request body accepted (413 beyond it): far more than a context of text, and room
/// for a few photos as base64 data URLs (4 bytes for 3; one image may have 20 MiB unless the
/// server is told otherwise: `images::MAX_IMAGE_BYTES`, `--max-image-bytes`).
pub const MAX_BODY: usize = 64 << 20;

/// The connection layer's bounds (see the module's comment).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Accepts connections on `listener` and serves `app` on each, within `limits`, until `stop`
/// resolves; then stops accepting and waits for the open connections to finish their requests
/// (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl std::future::Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(ErrorBodies::new(stream));
        let service = TowerToHyperService::new(app.clone());
        let conn = http1::Builder::new()
            .max_buf_size(MAX_HEAD)
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors here are the client's (it went away, timed out, sent garbage): nothing to
            // do but close, which dropping does.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection over the limit: a 503 with OpenAI's error object, then close.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let e = ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "the server already holds {limit} connections (--max-connections): retry later"
        ),
        kind: "server_error",
        param: None,
        code: Some("too_many_connections"),
        retry_after: None,
    };
    let reply = response(StatusCode::SERVICE_UNAVAILABLE, &e.body().to_string());
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(&reply).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A complete HTTP/1.1 response with a JSON body, closing the connection.
fn response(status: StatusCode, json: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        json.len()
    )
    .into_bytes()
}

/// The stream of one connection, passed through, except that the empty-bodied error answers
/// hyper writes for requests it cannot parse get OpenAI's error object as their body.
///
/// hyper writes such an answer (400, 414 or 431, `content-length: 0`) as the first and only
/// write of a response, then closes the connection; every answer of the router to an error has a
/// JSON body, so a head with one of these statuses and `content-length: 0` can only be hyper's.
/// The stream reports the head as written and writes the whole answer in its place.
struct ErrorBodies {
    inner: TcpStream,
    /// The replacement answer still to write, and how much of it is written.
    pending: Vec<u8>,
    written: usize,
}

impl ErrorBodies {
    fn new(inner: TcpStream) -> ErrorBodies {
        ErrorBodies {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }

    /// The answer to send for `head`, if it is one of hyper's error answers.
    fn replacement(head: &[u8]) -> Option<Vec<u8>> {
        let (status, what) = match head.get(..13)? {
            b"HTTP/1.1 400 " => (StatusCode::BAD_REQUEST, "the request is not valid HTTP/1.1"),
            b"HTTP/1.1 414 " => (StatusCode::URI_TOO_LONG, "the request's URI is too long"),
            b"HTTP/1.1 431 " => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "the request's headers are too large",
            ),
            _ => return None,
        };
        let text = std::str::from_utf8(head).ok()?.to_ascii_lowercase();
        if !text.ends_with("\r\n\r\n") || !text.contains("\r\ncontent-length: 0\r\n") {
            return None;
        }
        let e = ApiError::invalid(None, what).with_status(status);
        Some(response(status, &e.body().to_string()))
    }

    /// Writes what is left of the replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ErrorBodies {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ErrorBodies {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(answer) = ErrorBodies::replacement(buf) {
            self.pending = answer;
            self.written = 0;
            // Reported as written: the answer goes out in its place (now, or at the flush).
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Middleware: a POST's whole body is read here, within `--body-timeout` (`timeout`; else 408) and up to
/// [`MAX_BODY`] bytes (else 413), so that no handler waits on a client that promised more
/// than it sends; the handlers then get it at once.
pub async fn read_body(State(timeout): State<Duration>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, MAX_BODY);
    let bytes = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|c| c.is::<http_body_util::LengthLimitError>());
            let mut err = if too_large {
                let mut err =
                    ApiError::invalid(None, format!("the body is larger than {} bytes", MAX_BODY))
                        .with_status(StatusCode::PAYLOAD_TOO_LARGE);
                err.code = Some("request_too_large");
                err
            } else {
                ApiError::invalid(None, format!("cannot read the request body: {e}"))
            };
            err.retry_after = None;
            return err.into_response();
        }
        Err(_) => {
            let secs = timeout.as_secs_f64();
            let mut r = ApiError::invalid(
                None,
                format!("the request body did not arrive within {secs} s (--body-timeout)"),
            )
            .with_status(StatusCode::REQUEST_TIMEOUT)
            .into_response();
            // The rest of the body may still come: the connection cannot serve another request.
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

#[cfg(test)]
mod tests {
    use super::ErrorBodies;

    /// Only hyper's empty error answers are replaced; the router's own (with a body) and every
    /// other response pass as they are.
    #[test]
    fn replaces_only_empty_parse_error_answers() {
        let hyper =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let r = String::from_utf8(ErrorBodies::replacement(hyper).unwrap()).unwrap();
        assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
        let body = r.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(r.contains(&format!("content-length: {}\r\n", body.len())));
        for kept in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 80\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n", // not a whole head
        ] {
            assert!(ErrorBodies::replacement(kept).is_none());
        }
    }
}
