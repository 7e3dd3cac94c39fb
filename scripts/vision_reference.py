#!/usr/bin/env python3
"""Write the image processor's goldens: small images and what HuggingFace's Qwen2-VL image processor
(the one Qwen3-VL and Qwen3.5 use) makes of them.

    ../venv-torch/bin/python scripts/vision_reference.py [--out fixtures/vision]

Needs Pillow and transformers (5.x); run once, commit the output (about 150 KB). CI never runs it.

What it writes, under OUT:
- processor/*.{png,jpg,gif,webp}: images drawn here from a seeded generator (a smooth gradient with
  noise on it, so that resampling has something to smooth): sizes that need no resize, one that is
  scaled up and one that is scaled down, RGBA with an alpha ramp, grayscale, grayscale with alpha,
  palette with a transparent index, 16 bits a channel (RGB, gray, gray with alpha), a JPEG, the
  first frame of a two-frame GIF, a lossless WebP, a PNG with an EXIF orientation (turned
  as transformers' `load_image` turns it before the processor), lossy WebPs (RGB, RGBA), a
  JPEG with an EXIF orientation of its own, PNGs with a transparent colour (RGB, gray, 16-bit
  RGB and gray), and orientations in XMP (a PNG, a WebP, a JPEG; a PNG whose EXIF overrides it).
- processor-reference.json:
  - `cases`: per image, the processor's settings, the RGB bytes Pillow decoded (before any resize),
    the size after `smart_resize`, `image_grid_thw`, and `pixel_values` (f32, little-endian, base64),
    computed by `Qwen2VLImageProcessorPil` (transformers' PIL backend: Pillow's decoding, RGB
    conversion with transparency composited on white, bicubic resize, rescale, normalise, patches).
  - `smart_resize`: (height, width) -> the resized (height, width) at Qwen3-VL's real settings (patch
    16, merge 2, 65,536 to 16,777,216 pixels) for sizes people send, and the ratios it refuses.

The tiny settings (patch 4, merge 2, temporal patch 2) keep each case's pixel values a few thousand
floats; the arithmetic per pixel is the same at patch 16.
"""
import argparse
import base64
import io
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

# The processor's settings for the goldens: Qwen3-VL's (mean and std 0.5) at a small patch, and one
# case with Qwen2-VL's OpenAI-CLIP mean and std, whose divisions round differently.
TINY = dict(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=256, max_pixels=4096,
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# Qwen3-VL's preprocessor_config.json (the hub's Qwen/Qwen3-VL-2B-Instruct): patch 16, merge 2,
# size {shortest_edge: 65536, longest_edge: 16777216}.
REAL = dict(patch_size=16, merge_size=2, min_pixels=65536, max_pixels=16777216)


def picture(rng, h, w, channels=3):
    """A smooth gradient per channel plus noise: uint8 [h, w, channels]."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.empty((h, w, channels))
    for c in range(channels):
        a, b, p = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0, 2 * math.pi)
        out[..., c] = 128 + 90 * np.sin(a * x / 5 + b * y / 7 + p)
    out += rng.normal(0, 20, out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def images(rng):
    """(file name, bytes, settings) for every case."""
    def encode(img, fmt, **kw):
        buf = io.BytesIO()
        img.save(buf, format=fmt, **kw)
        return buf.getvalue()

    cases = []
    # RGB of a size the factor (patch x merge = 8) divides: no resize.
    cases.append(("rgb-24x40.png", encode(Image.fromarray(picture(rng, 24, 40)), "PNG"), TINY))
    # The same with OpenAI-CLIP's mean and std.
    cases.append(("rgb-24x40-clip.png", encode(Image.fromarray(picture(rng, 24, 40)), "PNG"),
                  dict(TINY, image_mean=CLIP_MEAN, image_std=CLIP_STD)))
    # Scaled up to 32x48 (rounded to the factor), and down to 72x48 (over max_pixels).
    cases.append(("rgb-30x45.png", encode(Image.fromarray(picture(rng, 30, 45)), "PNG"), TINY))
    cases.append(("rgb-100x75.png", encode(Image.fromarray(picture(rng, 100, 75)), "PNG"), TINY))
    # Under min_pixels: scaled up to at least 256 pixels.
    cases.append(("rgb-9x13.png", encode(Image.fromarray(picture(rng, 9, 13)), "PNG"), TINY))
    # RGBA with every alpha from 0 to 255: composited on white.
    rgba = np.concatenate([picture(rng, 24, 40), np.zeros((24, 40, 1), np.uint8)], axis=2)
    rgba[..., 3] = (np.arange(24 * 40).reshape(24, 40) * 255 // (24 * 40 - 1)).astype(np.uint8)
    cases.append(("rgba-24x40.png", encode(Image.fromarray(rgba, "RGBA"), "PNG"), TINY))
    # Grayscale, and grayscale with alpha.
    cases.append(("gray-24x40.png", encode(Image.fromarray(picture(rng, 24, 40, 1)[..., 0], "L"), "PNG"), TINY))
    la = np.concatenate([picture(rng, 16, 16, 1), rng.integers(0, 256, (16, 16, 1), dtype=np.uint8)], axis=2)
    cases.append(("gray-alpha-16x16.png", encode(Image.fromarray(la, "LA"), "PNG"), TINY))
    # A palette of 16 colours, index 3 transparent (tRNS).
    pal = Image.fromarray(picture(rng, 24, 40)).quantize(colors=16, dither=Image.Dither.NONE)
    cases.append(("palette-24x40.png", encode(pal, "PNG", transparency=3), TINY))
    # 16 bits a channel (Pillow keeps the high byte).
    deep = picture(rng, 24, 40).astype(np.uint16) * 257 + rng.integers(0, 256, (24, 40, 3), dtype=np.uint16)
    cases.append(("rgb16-24x40.png", png16(deep, 2), TINY))
    # JPEG (4:2:0, quality 90): decoders may differ by a level here and there.
    cases.append(("rgb-24x40.jpg", encode(Image.fromarray(picture(rng, 24, 40)), "JPEG", quality=90), TINY))
    # GIF: the first of two frames.
    f0 = Image.fromarray(picture(rng, 24, 40)).quantize(colors=32, dither=Image.Dither.NONE)
    f1 = Image.fromarray(picture(rng, 24, 40)).quantize(colors=32, dither=Image.Dither.NONE)
    cases.append(("anim-24x40.gif", encode(f0, "GIF", save_all=True, append_images=[f1], duration=100), TINY))
    # Lossless WebP.
    cases.append(("rgb-24x40.webp", encode(Image.fromarray(picture(rng, 24, 40)), "WEBP", lossless=True), TINY))
    # 16-bit gray (Pillow's I;16, clipped to 255 on the way to RGB: mostly white), with values
    # under 256 too; and 16-bit gray with alpha (high bytes).
    gray16 = (picture(rng, 24, 40, 1).astype(np.uint16) * rng.integers(0, 3, (24, 40, 1))).astype(np.uint16)
    cases.append(("gray16-24x40.png", png16(gray16, 0), TINY))
    ga16 = np.concatenate([picture(rng, 16, 16, 1).astype(np.uint16) * 257,
                           rng.integers(0, 65536, (16, 16, 1), dtype=np.uint16)], axis=2)
    cases.append(("gray-alpha16-16x16.png", png16(ga16, 4), TINY))
    # EXIF orientation 6 (turn 90 degrees clockwise to view): stored 16 high and 24 wide, seen
    # 24 high and 16 wide, as transformers' load_image turns it (ImageOps.exif_transpose).
    exif = Image.Exif()
    exif[0x0112] = 6
    cases.append(("exif6-16x24.png", encode(Image.fromarray(picture(rng, 16, 24)), "PNG", exif=exif.tobytes()), TINY))
    # Lossy WebP (quality 80), RGB and with an alpha ramp: libwebp's decoding in Pillow against
    # the `image` crate's own, as for JPEG.
    cases.append(("rgb-24x40-lossy.webp", encode(Image.fromarray(picture(rng, 24, 40)), "WEBP", quality=80), TINY))
    lossy = np.concatenate([picture(rng, 24, 40), np.zeros((24, 40, 1), np.uint8)], axis=2)
    lossy[..., 3] = (np.arange(24 * 40).reshape(24, 40) * 255 // (24 * 40 - 1)).astype(np.uint8)
    cases.append(("rgba-24x40-lossy.webp", encode(Image.fromarray(lossy, "RGBA"), "WEBP", quality=80), TINY))
    # A JPEG whose own EXIF (APP1) says orientation 8 (turn 90 degrees counter-clockwise to view).
    exif8 = Image.Exif()
    exif8[0x0112] = 8
    cases.append(("exif8-16x24.jpg", encode(Image.fromarray(picture(rng, 16, 24)), "JPEG", quality=90,
                                            exif=exif8.tobytes()), TINY))
    # A transparent colour (tRNS) in a truecolour and a gray PNG, 8 and 16 bits: a block of
    # pixels holds it. Pillow opens truecolour as "RGB" with the colour only in `info`, which
    # transformers' convert_to_rgb returns as it is (opaque); gray as "L", whose convert("RGBA")
    # makes that colour transparent.
    rgb_t = picture(rng, 24, 40)
    rgb_t[4:12, 8:20] = (10, 200, 30)
    cases.append(("rgb-trns-24x40.png", encode(Image.fromarray(rgb_t), "PNG", transparency=(10, 200, 30)), TINY))
    gray_t = picture(rng, 24, 40, 1)[..., 0]
    gray_t[4:12, 8:20] = 77
    cases.append(("gray-trns-24x40.png", encode(Image.fromarray(gray_t, "L"), "PNG", transparency=77), TINY))
    deep_t = picture(rng, 24, 40).astype(np.uint16) * 257
    deep_t[4:12, 8:20] = (2570, 51400, 7710)
    cases.append(("rgb16-trns-24x40.png", png16(deep_t, 2, trns=(2570, 51400, 7710)), TINY))
    gray16_t = picture(rng, 24, 40, 1).astype(np.uint16)
    gray16_t[4:12, 8:20] = 77
    cases.append(("gray16-trns-24x40.png", png16(gray16_t, 0, trns=(77,)), TINY))
    # An orientation in XMP only (Pillow's getexif reads `tiff:Orientation` there when the EXIF
    # has none): a PNG's iTXt (attribute form, 6), a lossless WebP's XMP chunk (element form, 8),
    # a PNG whose EXIF says 1, which wins over its XMP's 6, and a JPEG's XMP (APP1).
    from PIL.PngImagePlugin import PngInfo

    def xmp(form):
        return ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/'
                '22-rdf-syntax-ns#"><rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" '
                + form + '</rdf:Description></rdf:RDF></x:xmpmeta>')

    info = PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp('tiff:Orientation="6">'))
    cases.append(("xmp6-16x24.png", encode(Image.fromarray(picture(rng, 16, 24)), "PNG", pnginfo=info), TINY))
    cases.append(("xmp8-16x24.webp", encode(Image.fromarray(picture(rng, 16, 24)), "WEBP", lossless=True,
                                            xmp=xmp('><tiff:Orientation>8</tiff:Orientation>').encode()), TINY))
    exif1 = Image.Exif()
    exif1[0x0112] = 1
    cases.append(("exif1-xmp6-16x24.png", encode(Image.fromarray(picture(rng, 16, 24)), "PNG", pnginfo=info,
                                                 exif=exif1.tobytes()), TINY))
    # A JPEG with XMP orientation 6 in its APP1 (and no EXIF).
    cases.append(("xmp6-16x24.jpg", encode(Image.fromarray(picture(rng, 16, 24)), "JPEG", quality=90,
                                           xmp=xmp('tiff:Orientation="6">').encode()), TINY))
    return cases


def png16(pixels, color_type, trns=None):
    """A 16-bit PNG of colour type 0 (gray), 2 (RGB) or 4 (gray and alpha), [h, w, channels]
    (Pillow cannot write these from an array): the chunks written by hand; `trns`, a transparent
    colour (one 16-bit value a channel) in a tRNS chunk."""
    import struct
    import zlib

    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    extra = chunk(b"tRNS", struct.pack(f">{len(trns)}H", *trns)) if trns else b""
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
            + extra + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "fixtures" / "vision")
    args = ap.parse_args()
    (args.out / "processor").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)

    cases = []
    for name, data, s in images(rng):
        (args.out / "processor" / name).write_bytes(data)
        img = Image.open(io.BytesIO(data))
        if img.getexif().get(0x0112, 1) != 1:
            # The orientation applied, as transformers' load_image applies it.
            img = ImageOps.exif_transpose(img)
        # What transformers' convert_to_rgb makes of it (alpha composited on white).
        rgb = np.asarray(Qwen2VLImageProcessorPil().convert_to_rgb(img))
        proc = Qwen2VLImageProcessorPil(
            patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"],
            merge_size=s["merge_size"], size={"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
            image_mean=s["image_mean"], image_std=s["image_std"])
        out = proc(images=[img], return_tensors="np")
        pv = out["pixel_values"].astype(np.float32)
        thw = [int(v) for v in out["image_grid_thw"][0]]
        factor = s["patch_size"] * s["merge_size"]
        rh, rw = smart_resize(img.height, img.width, factor, s["min_pixels"], s["max_pixels"])
        assert [rh // s["patch_size"], rw // s["patch_size"]] == thw[1:], (name, rh, rw, thw)
        assert pv.shape == (thw[1] * thw[2], 3 * s["temporal_patch_size"] * s["patch_size"] ** 2)
        cases.append(dict(file=f"processor/{name}", mode=img.mode, size=[img.height, img.width],
                          settings=s, rgb_b64=b64(rgb.astype(np.uint8)), resized=[rh, rw],
                          grid_thw=thw, pixel_values_b64=b64(pv.astype("<f4"))))
        print(f"{name}: {img.mode} {img.height}x{img.width} -> {rh}x{rw}, grid {thw}, {pv.size} values")

    sizes = [(224, 224), (256, 256), (480, 640), (720, 1280), (1080, 1920), (3024, 4032), (4000, 6000),
             (100, 100), (10, 1000), (33, 47), (1, 150), (8192, 8192)]
    resize_cases = []
    for h, w in sizes:
        rh, rw = smart_resize(h, w, REAL["patch_size"] * REAL["merge_size"], REAL["min_pixels"], REAL["max_pixels"])
        resize_cases.append(dict(size=[h, w], resized=[rh, rw]))
    refused = []
    for h, w in [(1, 201), (300, 1)]:
        try:
            smart_resize(h, w, 32, REAL["min_pixels"], REAL["max_pixels"])
        except ValueError as e:
            refused.append(dict(size=[h, w], error=str(e)))
    ref = dict(about="scripts/vision_reference.py: transformers' Qwen2VLImageProcessorPil on these images",
               cases=cases, smart_resize=dict(settings=REAL, cases=resize_cases, refused=refused))
    (args.out / "processor-reference.json").write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
