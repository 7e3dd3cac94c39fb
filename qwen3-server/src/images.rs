//! Images in a chat, for a model with a vision tower (docs/vision.md): the content parts that
//! carry them read into bytes ([`image_part`]: OpenAI's `image_url` with a `data:` URL, the
//! Responses API's `input_image`), checked and decoded from base64. The chat request
//! (request/chat.rs) has them encoded by the tower and placed in its prompt.
//!
//! An `http(s)` URL is not fetched (the server reaches nothing outside itself); the error says
//! to send the image as a data URL.

use crate::error::ApiError;
use base64::Engine as _;
use serde_json::Value;

/// Bytes of one image file, as sent (20 MiB, OpenAI's limit).
pub const MAX_IMAGE_BYTES: usize = 20 << 20;
/// Images in one request, unless the server is told otherwise (`--max-images`).
pub const MAX_IMAGES: usize = 16;

/// One image of a request: where it was (`messages[i].content[j]`, for errors) and its bytes.
#[derive(Debug)]
pub struct ImagePart {
    pub param: String,
    pub bytes: Vec<u8>,
}

/// The image a content part `p` at `param` carries: `{"type": "image_url", "image_url": {"url":
/// "data:image/png;base64,...", "detail": ...}}` (the URL may also be the value of
/// `image_url` itself), or `{"type": "input_image", "image_url": "data:..."}`. `detail` is
/// accepted and changes nothing (the processor's pixel bounds decide the size). `Ok(None)`: not
/// an image part.
pub fn image_part(p: &Value, param: &str) -> Result<Option<ImagePart>, ApiError> {
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
    let bytes = data_url(url).map_err(|m| ApiError::invalid(format!("{param}.image_url"), m))?;
    Ok(Some(ImagePart {
        param: param.to_string(),
        bytes,
    }))
}

/// The bytes of a `data:[<media type>];base64,<data>` URL, or why not.
fn data_url(url: &str) -> Result<Vec<u8>, String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(
            "image URLs are not fetched: send the image itself as a data URL \
                    (data:image/png;base64,...)"
                .into(),
        );
    }
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
    // Within the limit before decoding: base64 is 4 characters for 3 bytes.
    if data.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(format!("the image is over {} MiB", MAX_IMAGE_BYTES >> 20));
    }
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("the data URL's base64 is not valid ({e})"))
}

/// The error of an image sent to a model without a tower.
pub const NO_TOWER: &str =
    "this model does not take images (its file has no vision tower): send text only";
