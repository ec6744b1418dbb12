#!/usr/bin/python3
"""gen_resize_fixtures.py - Pillow's results that tests/test_resize.c compares with.

Writes tests/fixtures/resize/ (deterministic: numpy seed 2727, Pillow 9.4):
  src.ppm          160x120 RGB, 1/f colour noise with hard and soft discs and thin lines
  src_gray.pgm     the same converted to L (Pillow's ITU-R 601 luma)
  down64.ppm       box (16, 0, 120, 120) of src -> 64x64, BILINEAR          (downscale 1.9x)
  up32.ppm         box (40.25, 30.5, 32, 32) of src -> 80x80, BILINEAR      (upscale 2.5x, fractional box)
  crop56.ppm       torchvision Resize(56) + CenterCrop(56) of src, done as torchvision does it
                   (resize the whole image to 74x56, then crop), not as one box
  stretch72x40.ppm src -> 72x40, BILINEAR                                   (non-square STRETCH)
  gray64x48.pgm    src_gray -> 64x48, BILINEAR
  down7x5.ppm      src -> 7x5, BILINEAR                                      (large downscale, 23x: 49 taps)
  graybox41x23.pgm box (10.7, 20.3, 100.1, 63.9) of src_gray -> 41x23        (fractional box, gray)
  line75x1.ppm     box (3.5, 60.25, 150, 1) of src -> 75x1                    (one-pixel box height and output)
  col1x90.ppm      box (159.5, 0, 0.5, 120) of src -> 1x90                    (half-pixel box at the right edge)
  up200x9.ppm      box (0, 110.5, 12.25, 9.5) of src -> 200x9                (16x upscale at the image corner)
Each is Pillow's Image.resize(size, BILINEAR, box=(x0, y0, x1, y1)) except crop56 (see above); loader/resize.c
must reproduce every value exactly. The C test holds the same boxes and sizes; change both together.

Usage: /usr/bin/python3 tools/dev/gen_resize_fixtures.py [OUTDIR]
"""
import os
import sys

import numpy as np
from PIL import Image

SEED = 2727
W, H = 160, 120


def one_over_f(w, h, rng):
    """h x w x 3 floats around 128 with a natural image's 1/f spectrum (bench/resize_quality.py uses it too)."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.fftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    img = np.zeros((h, w, 3))
    for c in range(3):
        spec = (rng.standard_normal((h, w)) + 1j * rng.standard_normal((h, w))) / f ** 1.1
        plane = np.real(np.fft.ifft2(spec))
        img[..., c] = (plane - plane.mean()) / (plane.std() + 1e-9)
    return 128 + 40 * img


def source(rng):
    img = one_over_f(W, H, rng)
    yy, xx = np.mgrid[0:H, 0:W]
    for i in range(8):
        cx, cy, r = rng.uniform(0, W), rng.uniform(0, H), rng.uniform(5, 25)
        d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        a = (d < r) if i % 2 else np.clip(r - d, 0, 1)
        img = img * (1 - a[..., None]) + rng.uniform(0, 255, 3) * a[..., None]
    for _ in range(4):
        x0, y0, ang = rng.uniform(0, W), rng.uniform(0, H), rng.uniform(0, np.pi)
        a = np.abs((xx - x0) * np.sin(ang) - (yy - y0) * np.cos(ang)) < 0.8
        img = img * (1 - a[..., None]) + rng.uniform(0, 255, 3) * a[..., None]
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def torchvision_resize_centercrop(im, s):
    """torchvision 0.14 Resize(s) then CenterCrop(s) on a PIL image, written out."""
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s, int(s * long / short)
    nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
    r = im.resize((nw, nh), Image.BILINEAR)
    top = int(round((nh - s) / 2.0))
    left = int(round((nw - s) / 2.0))
    return r.crop((left, top, left + s, top + s))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "resize")
    os.makedirs(out, exist_ok=True)
    src = source(np.random.default_rng(SEED))
    gray = src.convert("L")
    files = {
        "src.ppm": src,
        "src_gray.pgm": gray,
        "down64.ppm": src.resize((64, 64), Image.BILINEAR, box=(16, 0, 136, 120)),
        "up32.ppm": src.resize((80, 80), Image.BILINEAR, box=(40.25, 30.5, 72.25, 62.5)),
        "crop56.ppm": torchvision_resize_centercrop(src, 56),
        "stretch72x40.ppm": src.resize((72, 40), Image.BILINEAR),
        "gray64x48.pgm": gray.resize((64, 48), Image.BILINEAR),
        "down7x5.ppm": src.resize((7, 5), Image.BILINEAR),
        "graybox41x23.pgm": gray.resize((41, 23), Image.BILINEAR, box=(10.7, 20.3, 10.7 + 100.1, 20.3 + 63.9)),
        "line75x1.ppm": src.resize((75, 1), Image.BILINEAR, box=(3.5, 60.25, 153.5, 61.25)),
        "col1x90.ppm": src.resize((1, 90), Image.BILINEAR, box=(159.5, 0, 160, 120)),
        "up200x9.ppm": src.resize((200, 9), Image.BILINEAR, box=(0, 110.5, 12.25, 120)),
    }
    total = 0
    for name, im in files.items():
        path = os.path.join(out, name)
        im.save(path)
        total += os.path.getsize(path)
    print(f"wrote {len(files)} files, {total} bytes, to {os.path.normpath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
