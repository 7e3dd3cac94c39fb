//! Images in a chat, for a model with a vision tower (docs/vision.md): the content parts that
//! carry them ([`image_part`]: OpenAI's `image_url` with a `data:` URL, the Responses API's
//! `input_image`), checked and decoded from base64, or an `http(s)` URL to fetch. The chat
//! request (request/chat.rs) has them fetched, encoded by the tower and placed in its prompt.
//!
//! An `http(s)` URL is fetched only by a server started with `--fetch-image-urls` (and built
//! with the `fetch` feature, which `qwen3-cli`'s default build has): otherwise the server
//! reaches nothing outside itself, and the error says to send the image as a data URL.

use crate::error::ApiError;
use base64::Engine as _;
use serde_json::Value;

/// Bytes of one image file, as sent, unless the server is told otherwise (`--max-image-bytes`):
/// 20 MiB, OpenAI's limit.
pub const MAX_IMAGE_BYTES: usize = 20 << 20;

/// Images in one request, unless the server is told otherwise (`--max-images`).
pub const MAX_IMAGES: usize = 16;

/// Seconds the images of one request given as URLs may take to arrive, all of them, connecting
/// included.
pub const FETCH_TIMEOUT_S: u64 = 30;

/// Whether this build can fetch image URLs (the `fetch` feature): `--fetch-image-urls` is
/// refused at startup without it.
pub const FETCHES: bool = cfg!(feature = "fetch");

/// What the server takes of a request's images.
#[derive(Clone, Copy, Debug)]
pub struct ImageRules {
    /// Whether `http(s)` URLs are fetched (`--fetch-image-urls`); otherwise they are refused.
    pub fetch: bool,
    /// The most bytes one image file may have (`--max-image-bytes`).
    pub max_bytes: usize,
}

impl ImageRules {
    /// The server's rules (its flags).
    pub fn of(s: &crate::state::AppState) -> ImageRules {
        ImageRules {
            fetch: s.fetch_image_urls,
            max_bytes: s.max_image_bytes,
        }
    }

    /// The error of an image over [`ImageRules::max_bytes`].
    fn too_large(&self) -> String {
        match self.max_bytes % (1 << 20) {
            0 => format!("the image is over {} MiB", self.max_bytes >> 20),
            _ => format!("the image is over {} bytes", self.max_bytes),
        }
    }
}

/// One image of a request: where it was (`messages[i].content[j]`, for errors) and where its
/// bytes are.
#[derive(Debug)]
pub struct ImagePart {
    pub param: String,
    pub source: ImageSource,
}

/// An image's bytes as the request sent them, or the URL they are to be fetched from.
#[derive(Debug)]
pub enum ImageSource {
    Bytes(Vec<u8>),
    Url(String),
}

impl ImagePart {
    /// Whether the image is still to be fetched ([`fetch_all`]).
    pub fn is_url(&self) -> bool {
        matches!(self.source, ImageSource::Url(_))
    }
}

/// One image's file, its bytes in hand: what the tower's decoder reads.
#[derive(Debug)]
pub struct ImageFile {
    /// Where the request put it (`messages[i].content[j]`), for errors.
    pub param: String,
    pub bytes: Vec<u8>,
}

/// Every part's bytes: those the request carried as they are, and those given as URLs fetched,
/// one after the other, all within [`FETCH_TIMEOUT_S`] and `rules.max_bytes` each; the first
/// that cannot be fetched is a 400 naming its part and why. With a URL among the parts it
/// blocks: call it off the async threads then.
pub fn fetch_all(parts: Vec<ImagePart>, rules: ImageRules) -> Result<Vec<ImageFile>, ApiError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(FETCH_TIMEOUT_S);
    parts
        .into_iter()
        .map(|ImagePart { param, source }| {
            let bytes = match source {
                ImageSource::Bytes(bytes) => bytes,
                ImageSource::Url(url) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    match left.is_zero() {
                        true => Err(format!(
                            "fetching {url}: the request's images took over {FETCH_TIMEOUT_S} s"
                        )),
                        false => fetch_url(&url, left, rules),
                    }
                    .map_err(|m| ApiError::invalid(format!("{param}.image_url"), m))?
                }
            };
            Ok(ImageFile { param, bytes })
        })
        .collect()
}

/// The bytes at an `http(s)` URL: a GET that follows up to 5 redirects, within `timeout` and
/// `rules.max_bytes` (a larger file is refused before or while it is read, whether or not it
/// says its length); an HTTP error status or a transport failure is said with the URL.
#[cfg(feature = "fetch")]
fn fetch_url(
    url: &str,
    timeout: std::time::Duration,
    rules: ImageRules,
) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let agent = ureq::AgentBuilder::new()
        .timeout(timeout)
        .redirects(5)
        .build();
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, r) => {
            format!("fetching {url}: HTTP {code} {}", r.status_text())
        }
        ureq::Error::Transport(t) => format!("fetching {url}: {t}"),
    })?;
    if response.content_type() == "image/svg+xml" {
        return Err(format!(
            "{url} is an SVG image, which is not supported (PNG, JPEG, GIF, WebP)"
        ));
    }
    let max = rules.max_bytes;
    let too_large = || format!("{url}: {}", rules.too_large());
    if response
        .header("content-length")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n > max)
    {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take((max as u64).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("fetching {url}: {e}"))?;
    if bytes.len() > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Without the `fetch` feature there is no HTTP client (and `--fetch-image-urls` is refused at
/// startup, so no part is a URL here).
#[cfg(not(feature = "fetch"))]
fn fetch_url(url: &str, _timeout: std::time::Duration, _: ImageRules) -> Result<Vec<u8>, String> {
    Err(format!(
        "{url}: this build fetches no URLs (built without the `fetch` feature): send the image \
         itself as a data URL (data:image/png;base64,...)"
    ))
}

/// The image a content part `p` at `param` carries: `{"type": "image_url", "image_url": {"url":
/// "data:image/png;base64,...", "detail": ...}}` (the URL may also be the value of
/// `image_url` itself), or `{"type": "input_image", "image_url": "data:..."}`. `detail` is
/// accepted and changes nothing (the processor's pixel bounds decide the size). An `http(s)` URL
/// is kept to be fetched when `rules.fetch` (`--fetch-image-urls`), refused otherwise; a data
/// URL's bytes over `rules.max_bytes` are refused. `Ok(None)`: not an image part.
pub fn image_part(
    p: &Value,
    param: &str,
    rules: ImageRules,
) -> Result<Option<ImagePart>, ApiError> {
    let url = match p.get("type").and_then(Value::as_str) {
        Some("image_url" | "input_image") => match p.get("image_url") {
            Some(Value::String(u)) => u.as_str(),
            Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    format!("{param}.image_url.url"),
                    "image_url.url must be a string",
                )
            })?,
            _ => {
                return Err(ApiError::invalid(
                    format!("{param}.image_url"),
                    "an image part needs image_url: {\"url\": \"data:image/png;base64,...\"}",
                ))
            }
        },
        _ => return Ok(None),
    };
    let refuse = |m: String| ApiError::invalid(format!("{param}.image_url"), m);
    let source =
        match url.starts_with("http://") || url.starts_with("https://") {
            true if rules.fetch => ImageSource::Url(url.to_string()),
            true => return Err(refuse(
                "image URLs are not fetched here (`qwen3 serve --fetch-image-urls` fetches them): \
                 send the image itself as a data URL (data:image/png;base64,...)"
                    .into(),
            )),
            false => ImageSource::Bytes(data_url(url, rules).map_err(refuse)?),
        };
    Ok(Some(ImagePart {
        param: param.to_string(),
        source,
    }))
}

/// The bytes of a `data:[<media type>];base64,<data>` URL, or why not.
fn data_url(url: &str, rules: ImageRules) -> Result<Vec<u8>, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Err("an image must be a data URL (data:image/png;base64,...)".into());
    };
    let Some((header, data)) = rest.split_once(',') else {
        return Err("a data URL needs a comma before its data".into());
    };
    let Some(media) = header.strip_suffix(";base64") else {
        return Err("the data URL is not base64 (data:image/png;base64,...)".into());
    };
    if media == "image/svg+xml" {
        return Err("SVG images are not supported (PNG, JPEG, GIF, WebP)".into());
    }
    if !(media.is_empty() || media.starts_with("image/")) {
        return Err(format!("{media:?} is not an image type"));
    }
    // Within the limit before decoding (base64 is 4 characters for 3 bytes; line breaks and
    // spaces left out), and after.
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if compact.len() / 4 * 3 > rules.max_bytes.saturating_add(3) {
        return Err(rules.too_large());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("the data URL's base64 is not valid ({e})"))?;
    match bytes.len() > rules.max_bytes {
        true => Err(rules.too_large()),
        false => Ok(bytes),
    }
}

/// The error of an image sent to a model without a tower.
pub const NO_TOWER: &str =
    "this model does not take images (its file has no vision tower): send text only";
