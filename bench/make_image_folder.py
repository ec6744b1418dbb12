#!/usr/bin/python3
"""make_image_folder.py - writes a deterministic image folder of generated JPEGs
with ImageNet's spread of sizes, for bench/folder_vs_torchvision.sh and
bench/pack_folder.sh. It does not download anything and does not try to look
like any particular photograph: it matches the properties a JPEG decoder and
a RandomResizedCrop loader are sensitive to.

  ROOT/<class>/<n>.JPEG   class folders c000, c001, ...; files 00000.JPEG, ...

What matches ImageNet's training set (1.28 M images, Flickr-sized):
  sizes     about two thirds have 500 px on the longer side (500x375, 500x333,
            375x500, 500x500 ...); the rest spread from 80 to 2000 px per side,
            most 300..600, a tail of large ones (1000..2000) and a few small
            ones (80..200); aspect mostly 4:3 and 3:2, landscape ~3 in 4, some
            portrait, some square
  coding    baseline JPEG, 4:2:0 chroma, quality 75..95 (a few at 96+ the way
            camera files are), about 1 in 20 progressive; written by Pillow
            (libjpeg-turbo)
  content   structured, not white noise and not flat: a smooth colour field,
            shapes with hard and soft edges, mid-scale texture and fine grain,
            the amount of detail varying per image, so file sizes land in
            ImageNet's range (~110 KB mean; ~4-5 bits per pixel at 500x375)

Everything depends only on --seed (and the image's class and index), so the
same options give byte-identical files on any machine with the same Pillow.
The folder is written as ROOT.partial and renamed when complete; a summary of
sizes is printed and kept in ROOT.summary.txt (beside ROOT, not inside: the
packer would count it as a non-image).

Usage:
  make_image_folder.py ROOT [--classes 10] [--per-class 150] [--seed 0]
                            [--jobs N] [--force]
"""
import argparse
import io
import multiprocessing
import os
import shutil
import statistics
import sys
import time

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

# (long side, short side) of the most common ImageNet sizes: the Flickr
# "500 on the longer side" renditions of 4:3, 3:2, square and 16:9 photos.
COMMON = [((500, 375), 0.52), ((500, 333), 0.22), ((500, 500), 0.08), ((500, 281), 0.04),
          ((500, 400), 0.05), ((500, 356), 0.05), ((500, 469), 0.04)]
ASPECTS = [(4 / 3, 0.5), (3 / 2, 0.25), (1.0, 0.08), (16 / 9, 0.05), (5 / 4, 0.06), (2.0, 0.06)]


def pick(rng, table):
    r = rng.random()
    acc = 0.0
    for v, p in table:
        acc += p
        if r < acc:
            return v
    return table[-1][0]


def image_plan(seed, cls, idx):
    """(width, height, quality, progressive, detail) of one image, from (seed, class, index) only."""
    rng = np.random.default_rng([seed, cls, idx, 0x1F01])
    kind = rng.random()
    if kind < 0.64:  # the 500-px renditions
        long, short = pick(rng, COMMON)
    else:
        if kind < 0.90:  # the body: most 300..600
            long = int(np.clip(rng.lognormal(np.log(480), 0.28), 200, 1000))
        elif kind < 0.96:  # the tail of large originals
            long = int(rng.uniform(1000, 2000))
        else:  # thumbnails
            long = int(rng.uniform(80, 200))
        short = int(round(long / pick(rng, ASPECTS)))
    short = max(80, min(short, long))
    long = max(80, long)
    portrait = rng.random() < 0.22
    w, h = (short, long) if portrait else (long, short)
    q = int(rng.integers(75, 96)) if rng.random() < 0.9 else int(rng.integers(96, 99))
    progressive = rng.random() < 0.05
    detail = float(rng.uniform(0.45, 1.6))  # scales texture and grain: spreads the file sizes
    return w, h, q, progressive, detail


TILE = 2048  # >= the largest side, so that a crop of the tile never wraps
_bank = {}


def texture_bank(seed):
    """Per process, once per seed: one (TILE, TILE) RGB tile, 128 + texture, that every
    image crops its texture from at its own offset, so that no image pays for
    generating full-size noise: mid-scale structure (every ~6 px, luminance: foliage,
    fabric, fur) plus fine grain (per pixel and channel: sensor noise)."""
    if seed not in _bank:
        rng = np.random.default_rng([seed, 0x1F04])
        small = rng.normal(0, 1, (TILE // 6, TILE // 6)).astype(np.float32)
        mid = np.asarray(Image.fromarray(small, "F").resize((TILE, TILE), Image.BICUBIC), np.float32)
        t = rng.normal(0, GRAIN, (TILE, TILE, 3)).astype(np.float32)
        t += mid[:, :, None] * np.float32(TEXTURE)
        t += 128
        _bank[seed] = Image.fromarray(np.clip(t, 0, 255).astype(np.uint8), "RGB")
    return _bank[seed]


TEXTURE, GRAIN = 30.0, 28.0  # std of each, in 8-bit levels, at detail 1: sets the file sizes


def render(seed, cls, idx, w, h, detail):
    """One RGB PIL image (w, h). The class sets the palette, so classes differ slightly.
    Built from Pillow's C operations only (resize, draw, composite, blend, add): numpy
    arithmetic over every pixel would make the folder several times slower to write."""
    rng = np.random.default_rng([seed, cls, idx, 0x1F02])
    base = np.random.default_rng([seed, cls, 0x1F03]).uniform(60, 195, 3)
    # Smooth colour field: a few control points per side, bicubically interpolated.
    gy, gx = int(rng.integers(2, 5)), int(rng.integers(2, 5))
    ctrl = np.clip(base + rng.normal(0, 40, (gy, gx, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(ctrl, "RGB").resize((w, h), Image.BICUBIC)
    # Shapes: ellipses, rectangles and polygons with hard or soft (out of focus) edges, alpha-blended.
    layer = Image.new("RGB", (w, h))
    mask = Image.new("L", (w, h), 0)
    dl, dm = ImageDraw.Draw(layer), ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(4, 16))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.04, 0.35) * w, rng.uniform(0.04, 0.35) * h
        box = [cx - rx, cy - ry, cx + rx, cy + ry]
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        alpha = int(rng.integers(120, 256))
        k = rng.integers(0, 3)
        if k == 0:
            dl.ellipse(box, fill=colour)
            dm.ellipse(box, fill=alpha)
        elif k == 1:
            dl.rectangle(box, fill=colour)
            dm.rectangle(box, fill=alpha)
        else:
            pts = [(float(cx + rx * np.cos(a)), float(cy + ry * np.sin(a)))
                   for a in np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 8))))]
            dl.polygon(pts, fill=colour)
            dm.polygon(pts, fill=alpha)
    if rng.random() < 0.4:
        mask = mask.filter(ImageFilter.BoxBlur(float(rng.uniform(1.0, 4.0)) * max(w, h) / 500))
    img = Image.composite(layer, img, mask)
    # Texture at the image's detail level: 128 + detail * (tile - 128), then added around 128.
    # Large photos carry less detail per pixel than 500-px renditions (downscaling
    # concentrates it): their texture is a smaller window of the tile, enlarged.
    k = max(1.0, max(w, h) / 700)
    tw, th = int(w / k), int(h / k)
    x0, y0 = int(rng.integers(0, TILE - tw + 1)), int(rng.integers(0, TILE - th + 1))
    tex = texture_bank(seed).crop((x0, y0, x0 + tw, y0 + th))
    if k > 1:
        tex = tex.resize((w, h), Image.BILINEAR)
    if rng.random() < 0.5:
        tex = tex.transpose(Image.FLIP_LEFT_RIGHT)
    tex = Image.blend(Image.new("RGB", (w, h), (128, 128, 128)), tex, detail)
    return ImageChops.add(img, tex, 1.0, -128)


def make_one(task):
    root, seed, cls, idx = task
    w, h, q, prog, detail = image_plan(seed, cls, idx)
    buf = io.BytesIO()
    render(seed, cls, idx, w, h, detail).save(buf, "JPEG", quality=q, subsampling="4:2:0",
                                        progressive=prog, optimize=False)
    data = buf.getvalue()
    path = os.path.join(root, "c%03d" % cls, "%05d.JPEG" % idx)
    with open(path, "wb") as f:
        f.write(data)
    return w, h, q, prog, len(data)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summary(rows, seconds, jobs, root):
    ws = [r[0] for r in rows]
    hs = [r[1] for r in rows]
    longs = [max(r[0], r[1]) for r in rows]
    sides = ws + hs
    kb = [r[4] / 1024 for r in rows]
    n = len(rows)
    px = sum(w * h for w, h in zip(ws, hs))
    sizes = {}
    for w, h in zip(ws, hs):
        sizes[(w, h)] = sizes.get((w, h), 0) + 1
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    at = [r[4] / 1024 for r in rows if (r[0], r[1]) == (500, 375)]
    lines = [
        "folder:   %s: %d JPEGs in %d s on %d processes" % (root, n, round(seconds), jobs),
        "sizes:    mean %.0fx%.0f, median %dx%d; sides %d..%d px; longer side p10/p50/p90 %d/%d/%d px"
        % (statistics.mean(ws), statistics.mean(hs), statistics.median(ws), statistics.median(hs),
           min(sides), max(sides), pct(longs, 10), pct(longs, 50), pct(longs, 90)),
        "          %.0f %% landscape, %.0f %% portrait, %.0f %% square; %.0f %% 300..600 px on the longer side, "
        "%d over 1000 px, %d under 200 px"
        % (100 * sum(w > h for w, h in zip(ws, hs)) / n, 100 * sum(w < h for w, h in zip(ws, hs)) / n,
           100 * sum(w == h for w, h in zip(ws, hs)) / n, 100 * sum(300 <= x <= 600 for x in longs) / n,
           sum(x > 1000 for x in longs), sum(x < 200 for x in longs)),
        "          most common: " + ", ".join("%dx%d (%d)" % (k[0], k[1], v) for k, v in top),
        "files:    %.1f MB in all; %.0f KB mean, %.0f KB median, %.0f..%.0f KB; %s; %.2f bits/pixel, %.2f Mpixel mean"
        % (sum(r[4] for r in rows) / 1e6, statistics.mean(kb), statistics.median(kb), min(kb), max(kb),
           "%.0f KB mean at 500x375 (%d files)" % (statistics.mean(at), len(at)) if at else "none at 500x375",
           8 * sum(r[4] for r in rows) / px, px / n / 1e6),
        "coding:   JPEG 4:2:0, quality %d..%d (median %d), %d progressive, the rest baseline (Pillow %s)"
        % (min(r[2] for r in rows), max(r[2] for r in rows), statistics.median(r[2] for r in rows),
           sum(r[3] for r in rows), Image.__version__),
    ]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--force", action="store_true", help="replace ROOT if it exists")
    a = p.parse_args()
    if a.classes < 1 or a.per_class < 1 or a.jobs < 1 or a.seed < 0:
        p.error("--classes, --per-class and --jobs must be >= 1, --seed >= 0")
    root = a.root.rstrip("/")
    if os.path.exists(root):
        if not a.force:
            sys.exit("make_image_folder.py: %s exists (--force replaces it)" % root)
        shutil.rmtree(root)
    part = root + ".partial"
    shutil.rmtree(part, ignore_errors=True)
    for c in range(a.classes):
        os.makedirs(os.path.join(part, "c%03d" % c))
    tasks = [(part, a.seed, c, i) for c in range(a.classes) for i in range(a.per_class)]
    t0 = time.perf_counter()
    with multiprocessing.Pool(a.jobs) as pool:
        rows = pool.map(make_one, tasks, chunksize=8)
    secs = time.perf_counter() - t0
    os.rename(part, root)
    text = summary(rows, secs, a.jobs, root)
    with open(root + ".summary.txt", "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
