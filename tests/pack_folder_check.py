#!/usr/bin/python3
"""
pack_folder_check.py - the checks test_pack_folder.sh makes with Python:
manifest counts against tests/mkfolder.c's expected.json, packed pixels
against Pillow + torchvision, pad borders, variable-size summaries.

    pack_folder_check.py counts EXPECTED DATASET
    pack_folder_check.py pixels EXPECTED DATASET DIR R...   (DIR/s48_R.png from inspect)
    pack_folder_check.py pad EXPECTED PNG
    pack_folder_check.py variable EXPECTED DATASET MAX_SIDE
    pack_folder_check.py sizes DATASET INSPECT_OUTPUT...
    pack_folder_check.py exact IMAGE PNG      (a record from inspect equals Pillow's convert("RGB") of IMAGE)
    pack_folder_check.py exact-rotated IMAGE PNG   (... of ImageOps.exif_transpose(IMAGE): pack --exif-rotate)

Exit 0 when every check holds, 1 (with the reasons) otherwise.
"""
import json
import math
import os
import re
import sys

import numpy as np

# A record packed with --size S (loader/resize.c: Pillow's BILINEAR of the
# centre box, in Pillow's fixed-point arithmetic, the box placed as the
# window of the whole-image resize it is) against torchvision's Resize(S) +
# CenterCrop(S) of the same file (Pillow resizes the whole image, then
# crops): identical, value for value. Measured: every checked record of
# tests/mkfolder.c's folder identical (inf dB), so any difference fails.
# (The mean caps each record at 99 dB.)
MIN_PSNR = math.inf
MEAN_PSNR = 99.0

errors = []


def need(cond, what):
    if not cond:
        errors.append(what)


def ok_files(expected):
    """The good files in record order: classes sorted, names byte-sorted, as ImageFolder and pack list them."""
    files = [f for f in expected["files"] if f["status"] == "ok"]
    return sorted(files, key=lambda f: (f["class"].encode(), f["path"].encode()))


def manifest(ds):
    with open(os.path.join(ds, "manifest.json")) as f:
        return json.load(f)


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def counts(expected, ds):
    m = manifest(ds)
    good = ok_files(expected)
    bad = {(f["path"], f["status"]) for f in expected["files"] if f["status"] not in ("ok", "ignored")}
    ignored = [f for f in expected["files"] if f["status"] == "ignored"]
    total = sum(s["records"] for s in m["splits"].values())
    need(total == len(good), f"{total} records, expected {len(good)} good files")
    got = {(s["file"], s["reason"]) for s in m["files"]["skipped"]}
    need(got == bad, f"skipped {sorted(got)}, expected {sorted(bad)}")
    # JPEGs libjpeg decodes through a warning are kept (among the good ones) and listed with the warning.
    warned = {(f["path"], f["warning"]) for f in expected["files"] if f.get("warning")}
    got_w = {(w["file"], w["warning"]) for w in m["files"].get("warnings", [])}
    need(warned and got_w == warned, f"warnings {sorted(got_w)}, expected {sorted(warned)}")
    need(m["files"]["ignored"] == len(ignored), f"ignored {m['files']['ignored']}, expected {len(ignored)}")
    need(m["files"]["listed"] == len(good) + len(bad), f"listed {m['files']['listed']}")
    per_class = [sum(1 for f in good if f["class"] == c) for c in m["classes"]]
    need(m["splits"]["train"]["class_counts"] == per_class,
         f"class counts {m['splits']['train']['class_counts']}, expected {per_class}")
    need(m["classes"] == expected["classes"], f"classes {m['classes']}")


def pixels(expected, ds, d, records):
    from PIL import Image
    import torchvision.transforms as T

    root = os.path.join(os.path.dirname(os.path.abspath(ds)), expected["root"])
    s = manifest(ds)["shape"][1]
    good = ok_files(expected)
    tf = T.Compose([T.Resize(s), T.CenterCrop(s)])
    values = []
    for r in records:
        f = good[r]
        want = np.asarray(tf(Image.open(os.path.join(root, f["path"])).convert("RGB")))
        got = np.asarray(Image.open(os.path.join(d, f"s48_{r}.png")).convert("RGB"))
        need(got.shape == want.shape, f"record {r} ({f['path']}): shape {got.shape}, torchvision {want.shape}")
        if got.shape == want.shape:
            p = psnr(got, want)
            values.append(p)
            print(f"record {r} ({f['path']}, {f['kind']}): {p:.1f} dB against Pillow + torchvision")
            need(p >= MIN_PSNR, f"record {r} ({f['path']}): {p:.1f} dB < {MIN_PSNR}")
    if values:
        mean = sum(min(v, 99) for v in values) / len(values)
        need(mean >= MEAN_PSNR, f"mean {mean:.1f} dB < {MEAN_PSNR}")


def pad(expected, png):
    from PIL import Image

    f = ok_files(expected)[0]
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    h, w = img.shape[:2]
    # The picture scaled to fit inside, centred: its shorter fit leaves black bands on the other axis.
    scale = min(w / f["width"], h / f["height"])
    iw, ih = round(f["width"] * scale), round(f["height"] * scale)
    x0, y0 = (w - iw) // 2, (h - ih) // 2
    band = np.concatenate([img[:, : max(x0 - 1, 0)].ravel(), img[:, x0 + iw + 1:].ravel(),
                           img[: max(y0 - 1, 0)].ravel(), img[y0 + ih + 1:].ravel()])
    need(band.size > 0, f"pad: no border for {f['width']}x{f['height']} in {w}x{h}")
    need(band.size == 0 or band.max() == 0, f"pad: border not black (max {band.max() if band.size else 0})")
    need(img[y0 + 1: y0 + ih - 1, x0 + 1: x0 + iw - 1].mean() > 10, "pad: the picture is missing")


def variable(expected, ds, max_side):
    m = manifest(ds)
    need(m["shape"][1:] == [0, 0], f"shape {m['shape']}")
    vs = m.get("variable_size", {})
    need(vs.get("max_side") == int(max_side), f"variable_size {vs}")
    for k in ("min", "median", "max"):
        need(k in vs and 1 <= min(vs[k]) and max(vs[k]) <= int(max_side), f"variable_size.{k} = {vs.get(k)}")
    total = sum(s["records"] for s in m["splits"].values())
    need(total == len(ok_files(expected)), f"{total} records")
    need(m["pack"]["image"]["mode"] == "variable", f"pack.image {m['pack'].get('image')}")


def sizes(ds, outputs):
    side = manifest(ds)["variable_size"]["max_side"]
    for o in outputs:
        text = open(o).read()
        mt = re.search(r"wrote .* \((\d+)x(\d+),", text)
        need(mt is not None, f"{o}: no size in {text!r}")
        if mt:
            w, h = int(mt.group(1)), int(mt.group(2))
            need(1 <= w <= side and 1 <= h <= side and max(w, h) <= side, f"{o}: record {w}x{h}, max side {side}")


def exact(image, png, rotated=False):
    from PIL import Image, ImageOps

    with Image.open(image) as im:
        want = np.asarray((ImageOps.exif_transpose(im) if rotated else im).convert("RGB"))
    got = np.asarray(Image.open(png).convert("RGB"))
    same = got.shape == want.shape and np.array_equal(got, want)
    diff = int(np.max(np.abs(got.astype(int) - want.astype(int)))) if got.shape == want.shape else None
    print(f"{png}: {got.shape} against Pillow's {want.shape} of {image}: max |d| {diff}")
    need(same, f"{png} differs from Pillow's convert('RGB') of {image} (shape {got.shape} vs {want.shape}, "
               f"max |d| {diff})")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "sizes":
        sizes(args[0], args[1:])
    elif cmd in ("exact", "exact-rotated"):
        exact(args[0], args[1], cmd == "exact-rotated")
    else:
        with open(args[0]) as f:
            expected = json.load(f)
        if cmd == "counts":
            counts(expected, args[1])
        elif cmd == "pixels":
            pixels(expected, args[1], args[2], [int(r) for r in args[3:]])
        elif cmd == "pad":
            pad(expected, args[1])
        elif cmd == "variable":
            variable(expected, args[1], args[2])
    for e in errors:
        print("FAIL:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
