#!/usr/bin/python3
"""imgfile_vs_pillow.py - our decoder (loader/imgfile.c through rt_imgdump)
against Pillow's Image.open(f).convert("RGB") and convert("L"), the way
torchvision's default loader reads a file, on every decodable file of the
folder rt_mkfolder writes (every JPEG/PNG/WebP/PPM variant), plus the EXIF
rotation against ImageOps.exif_transpose.

Usage: imgfile_vs_pillow.py RT_MKFOLDER RT_IMGDUMP. Exit 0 pass, 1 fail,
77 when PIL or numpy is missing.

Bounds: exact (max abs diff 0) for every file, JPEG (CMYK and YCCK
included: Pillow's inverted-CMYK reading and its CMYK->RGB rounding are
reproduced) and lossy WebP too, since Pillow as Debian ships it decodes with
the same libjpeg-turbo and libwebp (default IDCT, fancy upsampling). A
lossy file that drifts from that (another Pillow build) passes only above
45 dB PSNR, except a JPEG that libjpeg decodes through a warning (extraneous
bytes before a marker), which must match exactly.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    from PIL import Image, ImageOps
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def read_pnm(path):
    with open(path, "rb") as f:
        data = f.read()
    # rt_imgdump writes "P6\nW H\n255\n": three newlines, then the samples (which may start with whitespace bytes).
    magic, size, _, body = data.split(b"\n", 3)
    w, h = (int(v) for v in size.split())
    c = 3 if magic == b"P6" else 1
    px = np.frombuffer(body[: w * h * c], dtype=np.uint8)
    return px.reshape(h, w, c) if c == 3 else px.reshape(h, w)


def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def main():
    mkfolder, imgdump = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "photos")
        subprocess.run([mkfolder, folder], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "photos.expected.json")) as f:
            expected = json.load(f)
        files = [e for e in expected["files"] if e["status"] == "ok"]
        for mode, flag in (("RGB", []), ("L", ["--gray"])):
            args = [imgdump] + flag
            for i, e in enumerate(files):
                args += [os.path.join(folder, e["path"]), os.path.join(tmp, f"{mode}{i}.pnm")]
            subprocess.run(args, check=True)
            print(f"convert({mode!r}):  {'kind':18} {'file':24} {'max|d|':>7} {'PSNR dB':>8}")
            for i, e in enumerate(files):
                ours = read_pnm(os.path.join(tmp, f"{mode}{i}.pnm"))
                with Image.open(os.path.join(folder, e["path"])) as im, warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "Palette images with Transparency ...": dropped, as we do
                    ref = np.asarray(im.convert(mode))
                if ours.shape != ref.shape:
                    print(f"FAIL {e['path']}: shape {ours.shape}, Pillow {ref.shape}")
                    failures += 1
                    continue
                diff = int(np.max(np.abs(ours.astype(np.int16) - ref.astype(np.int16))))
                p = psnr(ours, ref)
                kind = e["kind"]
                lossy = e["format"] in ("JPEG", "WebP") and not e["lossless"]
                # A file decoded through a libjpeg warning must be Pillow's exactly: same library, same damage.
                ok = diff == 0 or (lossy and p >= 45.0 and not e.get("warning"))
                print(f"  {'ok  ' if ok else 'FAIL'} {mode:3} {kind:18} {e['path']:24} {diff:7d} {p:8.2f}")
                failures += not ok
        # EXIF orientation: --exif-rotate against ImageOps.exif_transpose.
        for e in (e for e in files if e["orientation"] != 1):
            src = os.path.join(folder, e["path"])
            out = os.path.join(tmp, "rot.pnm")
            subprocess.run([imgdump, "--exif-rotate", src, out], check=True)
            ours = read_pnm(out)
            with Image.open(src) as im:
                ref = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
            ok = ours.shape == ref.shape and np.array_equal(ours, ref)
            print(f"  {'ok  ' if ok else 'FAIL'} exif_transpose {e['path']} orientation {e['orientation']}: "
                  f"{ours.shape} vs {ref.shape}")
            failures += not ok
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
