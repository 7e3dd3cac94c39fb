//! From an image file's bytes to RGB bytes, as transformers' processor sees them.
//!
//! The file is decoded by the `image` crate (PNG, JPEG, GIF's first frame, WebP), turned the way
//! its EXIF or XMP orientation says (transformers' `load_image` does so with
//! `ImageOps.exif_transpose`),
//! and made RGB the way transformers' `convert_to_rgb` does with Pillow:
//! - an image with transparency (an alpha channel, or a palette with a transparent entry) is
//!   composited over opaque white with Pillow's integer `alpha_composite`;
//! - gray becomes R = G = B;
//! - 16 bits a channel keep their high byte, as Pillow reads 16-bit RGB, RGBA and gray-with-alpha
//!   PNGs; plain 16-bit gray is clipped to 255, as Pillow's `I;16` converts (a transformers quirk
//!   kept: the model sees what it would see under transformers), its transparent value (tRNS),
//!   if any, made transparent.
//!
//! One choice differs from any single transformers path: transformers' `load_image` (URLs and
//! base64 in a chat template) applies the EXIF orientation and then drops alpha (`convert("RGB")`),
//! while its image processor, handed a picture, composites alpha over white and ignores EXIF.
//! Here both happen: a phone's photo stands upright, and a transparent logo sits on white
//! rather than on whatever colour its transparent pixels hold.

use std::io::Cursor;

use anyhow::{anyhow, bail, Result};
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

/// An RGB image: `height * width` pixels, row by row, three bytes each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb {
    pub height: usize,
    pub width: usize,
    pub data: Vec<u8>,
}

impl Rgb {
    /// A black image of the given size.
    pub fn blank(height: usize, width: usize) -> Rgb {
        Rgb {
            height,
            width,
            data: vec![0; height * width * 3],
        }
    }
}

/// The formats [`decode`] reads, as named in its errors.
pub const FORMATS: &str = "PNG, JPEG, GIF or WebP";

/// Decodes an image file into RGB, refusing more than `max_pixels` pixels before decoding them.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Rgb> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| anyhow!("the image could not be read: {e}"))?;
    // The decoders' own allocations (a GIF frame may claim more than its screen) bounded by the
    // same limit: the pixels as 16-bit RGBA, and a little room.
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(8).saturating_add(1 << 20));
    reader.limits(limits);
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::Gif | ImageFormat::WebP) => {}
        Some(other) => bail!("{other:?} images are not supported: send {FORMATS}"),
        None => bail!("not an image file this runtime reads: send {FORMATS}"),
    }
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| anyhow!("the image could not be decoded: {e}"))?;
    let (w, h) = decoder.dimensions();
    if w == 0 || h == 0 {
        bail!("the image has no pixels ({w}x{h})");
    }
    if w as u64 * h as u64 > max_pixels {
        bail!(
            "the image has {w}x{h} = {} pixels, over the limit of {max_pixels}",
            w as u64 * h as u64
        );
    }
    let orientation = orientation(&mut decoder)
        .map_err(|e| anyhow!("the image's orientation could not be read: {e}"))?;
    let mut img = DynamicImage::from_decoder(decoder)
        .map_err(|e| anyhow!("the image could not be decoded: {e}"))?;
    img.apply_orientation(orientation);
    Ok(to_rgb(&img, is_gray16_png(bytes)))
}

/// How the image is to be turned, as Pillow's `ImageOps.exif_transpose` finds it (`getexif`):
/// the EXIF's orientation tag, or where the EXIF has none (an orientation of 1 in it counts), the
/// first `tiff:Orientation="N"` or `tiff:Orientation>N` in the XMP packet (a PNG's iTXt, a JPEG's
/// APP1, a WebP's XMP chunk, a GIF's extension). A value other than 1-8 turns nothing. An XMP
/// packet that cannot be read (a corrupt compressed chunk) is passed over, as Pillow passes it.
/// Two rare cases differ from Pillow: an EXIF tag with a value outside 1-8 lets the XMP decide
/// (Pillow turns nothing), and a PNG's XMP in a tEXt chunk or after the image data is not read.
fn orientation(decoder: &mut dyn ImageDecoder) -> image::ImageResult<Orientation> {
    let exif = decoder.exif_metadata()?;
    if let Some(o) = exif.as_deref().and_then(Orientation::from_exif_chunk) {
        return Ok(o);
    }
    let xmp = decoder.xmp_metadata().ok().flatten().unwrap_or_default();
    let tag = b"tiff:Orientation";
    let value = (0..xmp.len().saturating_sub(tag.len()))
        .filter(|&i| xmp[i..].starts_with(tag))
        .find_map(|i| match &xmp[i + tag.len()..] {
            [b'=', b'"', d, ..] | [b'>', d, ..] if d.is_ascii_digit() => Some(d - b'0'),
            _ => None,
        });
    Ok(value
        .and_then(Orientation::from_exif)
        .unwrap_or(Orientation::NoTransforms))
}

/// Whether `bytes` are a PNG of 16-bit gray (IHDR's bit depth 16, colour type 0): with a
/// transparent value (tRNS) the `image` crate gives it an alpha channel, while Pillow keeps it
/// `I;16` (see [`to_rgb`]). The IHDR chunk comes first: bytes 8-15 its length and name, 16-23 the
/// width and height, then the bit depth and the colour type.
fn is_gray16_png(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        && bytes.get(12..16) == Some(b"IHDR".as_slice())
        && bytes.get(24..26) == Some([16, 0].as_slice())
}

/// RGB bytes of a decoded image, with any transparency composited over white. `gray16`: the file
/// is a 16-bit gray PNG ([`is_gray16_png`]).
fn to_rgb(img: &DynamicImage, gray16: bool) -> Rgb {
    let (width, height) = (img.width() as usize, img.height() as usize);
    // RGBA bytes as Pillow reads the file. 8 bits a channel: as they are (gray repeated). 16
    // bits: Pillow keeps the high byte of RGB, RGBA and gray with alpha; plain 16-bit gray it
    // opens as `I;16`, whose conversion to RGB clips each value to 255 (so such an image is
    // mostly white to transformers, and here too), and whose conversion to RGBA makes a
    // transparent value (tRNS) transparent: that gray arrives here with an alpha channel of 0 or
    // 65535, and its values are clipped as `I;16`'s, not cut to their high byte as gray with
    // alpha's are.
    let high = |v: u16| (v >> 8) as u8;
    let rgba: Vec<u8> = match img {
        DynamicImage::ImageLuma16(b) => b
            .as_raw()
            .iter()
            .flat_map(|&v| {
                let l = v.min(255) as u8;
                [l, l, l, 255]
            })
            .collect(),
        DynamicImage::ImageLumaA16(b) if gray16 => b
            .as_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let l = p[0].min(255) as u8;
                [l, l, l, high(p[1])]
            })
            .collect(),
        DynamicImage::ImageLumaA16(b) => b
            .as_raw()
            .chunks_exact(2)
            .flat_map(|p| [high(p[0]), high(p[0]), high(p[0]), high(p[1])])
            .collect(),
        DynamicImage::ImageRgb16(b) => b
            .as_raw()
            .chunks_exact(3)
            .flat_map(|p| [high(p[0]), high(p[1]), high(p[2]), 255])
            .collect(),
        DynamicImage::ImageRgba16(b) => b.as_raw().iter().map(|&v| high(v)).collect(),
        // 8 bits a channel (and float, which no accepted format decodes to): the crate's own
        // conversion, exact for 8-bit values.
        other => other.to_rgba8().into_raw(),
    };
    let has_alpha = img.color().has_alpha();
    let mut out = Rgb::blank(height, width);
    for (rgb, p) in out.data.chunks_exact_mut(3).zip(rgba.chunks_exact(4)) {
        let colour = [p[0], p[1], p[2]];
        rgb.copy_from_slice(&if has_alpha {
            over_white(colour, p[3])
        } else {
            colour
        });
    }
    out
}

/// A pixel of colour `src` and alpha `a` composited over opaque white, as Pillow's
/// `Image.alpha_composite(white, image)` computes it (libImaging/AlphaComposite.c): fixed point
/// with 7 fractional bits, divisions by 255 as `((x >> 8) + x) >> 8` with rounding.
pub fn over_white(src: [u8; 3], a: u8) -> [u8; 3] {
    if a == 0 {
        return [255; 3];
    }
    const PRECISION_BITS: u32 = 7;
    let div255 = |x: u32| ((x >> 8) + x) >> 8;
    let a = a as u32;
    // The destination is white and opaque: dst.a = 255, so blend = 255 (255 - a).
    let outa255 = a * 255 + 255 * (255 - a);
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    src.map(|s| {
        let t = s as u32 * coef1 + 255 * coef2;
        (div255(t + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_pixels_keep_their_colour_and_clear_ones_turn_white() {
        for v in 0..=255u8 {
            assert_eq!(over_white([v, 0, 255], 255), [v, 0, 255]);
            assert_eq!(over_white([v, 0, 255], 0), [255; 3]);
        }
        // Half transparent black over white is mid gray.
        assert_eq!(over_white([0, 0, 0], 128), [127; 3]);
    }

    #[test]
    fn what_is_not_an_image_is_refused_by_name() {
        let e = decode(b"not an image at all", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("PNG, JPEG, GIF or WebP"), "{e}");
        let e = decode(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("could not be decoded"), "{e}");
        let bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0\x01\0\0\0\x01\0\0\0\x01\0\x18\0";
        let e = decode(bmp, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("Bmp images are not supported"), "{e}");
    }
}
