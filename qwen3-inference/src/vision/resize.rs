//! The image's size for the vision tower, and the resampling that gets it there.
//!
//! Two steps, both as transformers' Qwen2-VL image processor takes them (Qwen2.5-VL, Qwen3-VL and
//! Qwen3.5 share it):
//!
//! 1. [`smart_resize`] picks the size: each side a multiple of `factor` (patch x merge, 32 for
//!    Qwen3-VL), the area within `[min_pixels, max_pixels]`, the aspect ratio kept as well as that
//!    allows (`smart_resize` in transformers' `image_processing_qwen2_vl.py`).
//! 2. [`resize_bicubic`] resamples to it the way Pillow's `Image.resize(size, BICUBIC)` does (the
//!    processor's PIL backend calls exactly that): a separable convolution, rows first, then
//!    columns, with the cubic kernel of a = -0.5 stretched by the scale when shrinking (so a
//!    shrink averages every source pixel it covers instead of skipping some), its weights in fixed
//!    point with 22 fractional bits, each pass rounded and clamped to a byte. Pillow's
//!    `src/libImaging/Resample.c` is the reference; every step below names its counterpart there.
//!    torchvision's antialiased bicubic on bytes (the processor's other backend) follows the same
//!    algorithm.

use anyhow::{bail, Result};

use super::image::Rgb;

/// The size `(height, width)` the processor resizes a `height x width` image to: both multiples of
/// `factor`, `min_pixels <= height * width <= max_pixels` (when the factor allows), the aspect
/// ratio as close to the original as that leaves.
///
/// ```text
/// h, w = round(height / f) * f, round(width / f) * f          (round half to even, as Python's)
/// if h * w > max_pixels:  b = sqrt(height * width / max_pixels)
///                         h, w = max(f, floor(height / b / f) * f), max(f, floor(width / b / f) * f)
/// if h * w < min_pixels:  b = sqrt(min_pixels / (height * width))
///                         h, w = ceil(height * b / f) * f, ceil(width * b / f) * f
/// ```
/// An aspect ratio over 200 is refused, as transformers refuses it.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    if height == 0 || width == 0 {
        bail!("an image of {height}x{width} pixels has no pixels");
    }
    let (h, w) = (height as f64, width as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        bail!(
            "absolute aspect ratio must be smaller than 200, got {ratio} ({height}x{width} pixels)"
        );
    }
    let f = factor as f64;
    // Python's round() rounds halves to even; f64::round_ties_even is that.
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// Fractional bits of the fixed-point weights (Resample.c's `PRECISION_BITS`: 32 - 8 - 2, leaving
/// 8 bits for the pixel and 2 for the sum's overshoot, as the cubic kernel has negative lobes).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The bicubic kernel with a = -0.5 (Resample.c's `bicubic_filter`; support 2).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// What one output position reads: source positions `first..first + weights.len()`, with
/// these fixed-point weights.
struct Tap {
    first: usize,
    weights: Vec<i32>,
}

/// One axis's resampling, a [`Tap`] per output position (Resample.c's `precompute_coeffs` then
/// `normalize_coeffs_8bpc`).
struct Taps {
    taps: Vec<Tap>,
}

impl Taps {
    fn new(in_size: usize, out_size: usize) -> Taps {
        // The box is the whole image: in0 = 0, in1 = in_size (floats in Pillow: exact here).
        let scale = in_size as f64 / out_size as f64;
        // Shrinking stretches the kernel over `scale` source pixels per output pixel; growing
        // keeps it at its own width.
        let filterscale = scale.max(1.0);
        let support = 2.0 * filterscale;
        let ss = 1.0 / filterscale;
        let taps = (0..out_size)
            .map(|xx| {
                let center = (xx as f64 + 0.5) * scale;
                // `(int)` in C truncates toward zero, as `as i64` does.
                let xmin = ((center - support + 0.5) as i64).max(0) as usize;
                let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
                let mut k: Vec<f64> = (xmin..xmax)
                    .map(|x| bicubic((x as f64 - center + 0.5) * ss))
                    .collect();
                let ww: f64 = k.iter().sum();
                if ww != 0.0 {
                    k.iter_mut().for_each(|w| *w /= ww);
                }
                // Round half away from zero to 22 fractional bits.
                let one = (1u32 << PRECISION_BITS) as f64;
                let fixed = k
                    .iter()
                    .map(|&w| {
                        if w < 0.0 {
                            (-0.5 + w * one) as i32
                        } else {
                            (0.5 + w * one) as i32
                        }
                    })
                    .collect();
                Tap {
                    first: xmin,
                    weights: fixed,
                }
            })
            .collect();
        Taps { taps }
    }

    /// One output value: the weighted sum of `pixel(source index)`, rounded (the sum starts at one
    /// half) and clamped to a byte (Resample.c's `clip8`).
    fn apply(&self, out: usize, pixel: impl Fn(usize) -> u8) -> u8 {
        let tap = &self.taps[out];
        let mut ss: i32 = 1 << (PRECISION_BITS - 1);
        for (i, &w) in tap.weights.iter().enumerate() {
            ss += pixel(tap.first + i) as i32 * w;
        }
        (ss >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

/// Resamples `image` to `height x width` as Pillow's `resize((width, height), Image.BICUBIC)` does
/// on an RGB image, bit for bit: the horizontal pass (when the width changes) over the rows the
/// vertical pass will read, then the vertical pass (when the height changes); an image of the
/// requested size comes back unchanged (Resample.c's `ImagingResampleInner`).
pub fn resize_bicubic(image: &Rgb, height: usize, width: usize) -> Rgb {
    if height == 0 || width == 0 || image.height == 0 || image.width == 0 {
        return Rgb::blank(height, width);
    }
    let vertical = Taps::new(image.height, height);
    // 1. Rows: only the source rows some output row reads, [first, last), are resampled.
    let (rows, offset) = if width != image.width {
        let first = vertical.taps[0].first;
        let last = vertical
            .taps
            .last()
            .map_or(first, |t| t.first + t.weights.len());
        (horizontal_pass(image, first..last, width), first)
    } else {
        (image.clone(), 0)
    };
    // 2. Columns, over what the first pass left (whose row 0 is source row `offset`).
    if height != image.height {
        vertical_pass(&rows, &vertical, offset, height)
    } else {
        rows
    }
}

/// The horizontal pass: source rows `rows` resampled to `width` columns.
fn horizontal_pass(image: &Rgb, rows: std::ops::Range<usize>, width: usize) -> Rgb {
    let taps = Taps::new(image.width, width);
    let mut out = Rgb::blank(rows.len(), width);
    for (oy, y) in rows.enumerate() {
        let row = &image.data[y * image.width * 3..(y + 1) * image.width * 3];
        for x in 0..width {
            for c in 0..3 {
                out.data[(oy * width + x) * 3 + c] = taps.apply(x, |sx| row[sx * 3 + c]);
            }
        }
    }
    out
}

/// The vertical pass over `image`, whose row 0 is source row `offset`.
fn vertical_pass(image: &Rgb, taps: &Taps, offset: usize, height: usize) -> Rgb {
    let w = image.width;
    let mut out = Rgb::blank(height, w);
    for y in 0..height {
        for x in 0..w {
            for c in 0..3 {
                out.data[(y * w + x) * 3 + c] =
                    taps.apply(y, |sy| image.data[((sy - offset) * w + x) * 3 + c]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_interpolates() {
        // 1 at 0, 0 at the other integers, and the weights of any offset sum to 1.
        assert_eq!(bicubic(0.0), 1.0);
        for x in [1.0, 2.0, -1.0, -2.0, 2.5] {
            assert_eq!(bicubic(x), 0.0);
        }
        for t in [0.1, 0.25, 0.5, 0.9] {
            let s: f64 = (-2..=2).map(|i| bicubic(t - i as f64)).sum();
            assert!((s - 1.0).abs() < 1e-12, "{t}: {s}");
        }
    }

    #[test]
    fn a_flat_image_stays_flat_at_any_size() {
        let mut img = Rgb::blank(7, 11);
        img.data
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = [200, 17, 90][i % 3]);
        for (h, w) in [(7, 11), (3, 5), (16, 24), (7, 30), (20, 11)] {
            let out = resize_bicubic(&img, h, w);
            assert_eq!((out.height, out.width), (h, w));
            assert!(out.data.chunks(3).all(|p| p == [200, 17, 90]), "{h}x{w}");
        }
    }

    #[test]
    fn sizes_outside_the_limits_move_inside_them() {
        // Rounded to the factor.
        assert_eq!(smart_resize(30, 45, 8, 256, 4096).unwrap(), (32, 48));
        // Over max_pixels: shrunk, aspect kept.
        assert_eq!(smart_resize(100, 75, 8, 256, 4096).unwrap(), (72, 48));
        // Python rounds 2.5 to 2: a 20-pixel side with factor 8 becomes 16, not 24.
        assert_eq!(smart_resize(20, 40, 8, 0, 1 << 20).unwrap(), (16, 40));
        assert!(smart_resize(1, 201, 8, 0, 1 << 20).is_err());
        assert!(smart_resize(0, 10, 8, 0, 1 << 20).is_err());
    }
}
