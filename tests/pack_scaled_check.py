#!/usr/bin/python3
"""
pack_scaled_check.py RINGTRAIN - pack --size decodes large JPEGs at a reduced
IDCT scale (1/2, 1/4, 1/8) where the output allows, and the records stay
within a quality bound against torchvision's Resize(S) + CenterCrop(S) of
the full-size image (Pillow 9.4). A scaled IDCT is another low-pass filter
than the resize's, so such a record cannot be value for value the
full-size pipeline's (as pack_folder_check.py requires of the others): 45
dB each and 50 dB on average is the bound the scale rule is set against.

Writes a small folder of large JPEGs with Pillow (photo-like content with
fine grain, landscape, portrait, gray, 4:4:4, one EXIF-rotated), packs it
with --size 64 (and --exif-rotate), and checks:
  - pack says how many JPEGs it decoded at which scale, and the scaled ones
    are the ones the rule picks (the source box at least 3x the output at
    that scale, so a 1600x1200 photo decodes at 1/4 for 64 px);
  - every record against torchvision's pipeline on the full-size decode:
    PSNR >= 45 dB each, >= 50 dB mean;
  - with RT_PACK_SCALE_GAP=1 (the test hook: the smallest scale that still
    covers the output, what Pillow's draft() picks) the same records fall
    below that bound, so the check can tell the rule from a looser one.
Exit 0 pass, 1 fail, 77 skip (no torchvision).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

from pack_folder_check import errors, need, psnr  # this script's folder is first on sys.path

try:
    import torchvision.transforms as T
except ImportError:
    print("skip: torchvision is not installed (python3-torchvision)")
    sys.exit(77)

S = 64
MIN_PSNR = 45.0
MEAN_PSNR = 50.0

def photo(w, h, seed, gray=False):
    """A smooth colour field with shapes, texture and grain: content a scaled IDCT changes measurably."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(0.002, 0.02, 3)
        img[..., c] = 128 + 60 * np.sin(a * x + p * 7) * np.cos(b * y + p * 3)
    for _ in range(12):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(20, min(w, h) / 3)
        m = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[m] += rng.uniform(-60, 60, 3)
    img += 25 * np.sin(x * 0.35 + y * 0.21)[..., None]           # mid-scale texture
    img += rng.normal(0, 8, (h, w, 1 if gray else 3))              # fine grain
    img = np.clip(img, 0, 255).astype(np.uint8)
    return Image.fromarray(img[..., 0] if gray else img, "L" if gray else "RGB")


def exif_orientation(o):
    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def files(d):
    os.makedirs(os.path.join(d, "a"))
    os.makedirs(os.path.join(d, "b"))
    spec = [  # name, size, options, expected scale at S=64 (shorter side / k >= 3 x 64)
        ("a/land.jpg", (1600, 1200), dict(quality=90), 4),
        ("a/port.jpg", (1000, 1500), dict(quality=85), 4),
        ("a/mid.jpg", (800, 600), dict(quality=92), 2),
        ("a/small.jpg", (500, 375), dict(quality=90), 1),
        ("b/gray.jpg", (1400, 1100), dict(quality=90), 4),
        ("b/full444.jpg", (1300, 900), dict(quality=95, subsampling=0), 4),
        ("b/rot6.jpg", (1600, 2200), dict(quality=88), 8),
    ]
    for i, (name, size, opts, _) in enumerate(spec):
        im = photo(*size, seed=i, gray=name.endswith("gray.jpg"))
        if name.endswith("rot6.jpg"):
            opts = dict(opts, exif=exif_orientation(6))
        im.save(os.path.join(d, name), **opts)
    return spec


def reference(path):
    from PIL import ImageOps
    im = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    return np.asarray(T.Compose([T.Resize(S), T.CenterCrop(S)])(im))


def pack_and_compare(rt, d, spec, env, tag):
    out = os.path.join(d, "packed_" + tag)
    p = subprocess.run([rt, "pack", os.path.join(d, "src"), "--out", out, "--size", str(S), "--exif-rotate"],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        errors.append(f"{tag}: pack failed ({p.returncode}): {p.stderr.strip()}")
        return None, []
    scores = []
    for r, (name, _, _, _) in enumerate(sorted(spec, key=lambda s: s[0].encode())):
        png = os.path.join(d, f"{tag}_{r}.png")
        q = subprocess.run([rt, "inspect", out, "--record", str(r), "--out", png], capture_output=True, text=True)
        if q.returncode != 0:
            errors.append(f"{tag}: inspect record {r}: {q.stderr.strip()}")
            continue
        got = np.asarray(Image.open(png).convert("RGB"))
        scores.append((name, psnr(got, reference(os.path.join(d, "src", name)))))
    return p.stdout + p.stderr, scores


def main():
    rt = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="rt-pack-scaled.") as d:
        spec = files(os.path.join(d, "src"))
        env = dict(os.environ)
        env.pop("RT_PACK_SCALE_GAP", None)
        said, scores = pack_and_compare(rt, d, spec, env, "rule")
        if said is not None:
            want = {}
            for _, _, _, k in spec:
                if k > 1:
                    want[k] = want.get(k, 0) + 1
            line = [ln for ln in said.splitlines() if "reduced scale" in ln]
            need(line, f"pack did not say which JPEGs it decoded at a reduced scale:\n{said}")
            if line:
                words = ", ".join(f"1/{k}: {n}" for k, n in sorted(want.items()))
                need(words in line[0], f"pack says '{line[0].strip()}', expected the scales {words}")
            with open(os.path.join(d, "packed_rule", "manifest.json")) as f:
                scaled = json.load(f).get("files", {}).get("scaled_decode", {})
            need(scaled == {f"1/{k}": n for k, n in want.items()},
                 f"manifest files.scaled_decode is {scaled}, expected {want}")
        for name, p in scores:
            print(f"  rule    {name:18} {p:6.1f} dB")
            need(p >= MIN_PSNR, f"{name}: {p:.1f} dB < {MIN_PSNR} against torchvision's Resize + CenterCrop")
        if scores:
            mean = sum(min(p, 99.0) for _, p in scores) / len(scores)  # an exact record counts as 99 dB
            print(f"  rule    mean {mean:.1f} dB")
            need(mean >= MEAN_PSNR, f"mean {mean:.1f} dB < {MEAN_PSNR}")
        # A looser rule (scale down as far as the output allows) must fail the same bound: the check can tell.
        env["RT_PACK_SCALE_GAP"] = "1"
        _, loose = pack_and_compare(rt, d, spec, env, "gap1")
        for name, p in loose:
            print(f"  gap 1   {name:18} {p:6.1f} dB")
        need(loose and min(p for _, p in loose) < MIN_PSNR,
             "with RT_PACK_SCALE_GAP=1 every record still meets the bound: the check cannot tell the rules apart")
    if errors:
        print("FAIL:\n  " + "\n  ".join(errors))
        return 1
    print("pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
