#!/usr/bin/python3
"""resize_quality.py - how loader/resize.c's resampling compares with Pillow and with the libraries it replaced.

Builds bench/resize_bench.c with loader/resize.c (our Pillow BILINEAR, each of its
kernels), stb_image_resize v1 from libstb-dev (what pack used before; left out, and
named, where pkg-config finds no stb) and libswscale from FFmpeg (the load-time
crop's), runs it on the cases below, and compares every result with Pillow's
Image.resize of the same box (BILINEAR is torchvision's default for PIL images;
BICUBIC, LANCZOS and BOX are shown beside it). Prints PSNR (dB) per method and
case (99 = identical), the number of values that differ from Pillow BILINEAR,
then the speed (median microseconds per output image, one thread, Pillow's
beside) and the CPU model.

Images: the one real photograph found on this machine (a 900x277 seaside picture
shipped with the Google Cloud SDK's Jetty demo) when present, and synthetic
"natural-looking" images (1/f colour noise, soft discs, hard edges, thin lines;
numpy seed 27) at 2000x1500 and 500x375.

Usage: /usr/bin/python3 bench/resize_quality.py [--reps N] [--keep DIR]
Does not touch the build tree; everything goes to a temporary folder.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "dev"))
sys.dont_write_bytecode = True  # no __pycache__ in tools/
from gen_resize_fixtures import one_over_f  # noqa: E402
PHOTO = ("/usr/lib/google-cloud-sdk/platform/google_appengine/google/appengine/tools/java/"
         "jetty12/jetty-home/modules/demo.d/root/images/jetty-pic.png")
SEED = 27


def synthetic(w, h, rng):
    """A structured image with a natural image's 1/f spectrum plus shapes and edges."""
    img = one_over_f(w, h, rng)
    yy, xx = np.mgrid[0:h, 0:w]
    s = min(w, h)
    for _ in range(25):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.02, 0.15) * s
        col = rng.uniform(0, 255, 3)
        d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        a = np.clip((r - d) / (0.01 * s + 1), 0, 1)[..., None]
        if rng.uniform() < 0.5:
            a = (d < r)[..., None].astype(float)  # hard edge
        img = img * (1 - a) + col * a
    for _ in range(15):
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        ang = rng.uniform(0, np.pi)
        dist = np.abs((xx - x0) * np.sin(ang) - (yy - y0) * np.cos(ang))
        width = rng.uniform(0.5, 3.0) * s / 500
        a = (dist < width)[..., None].astype(float)
        img = img * (1 - a) + rng.uniform(0, 255, 3) * a
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def crop_fit(sw, sh, s):
    """torchvision Resize(s) + CenterCrop(s): the resized size and the crop's offset."""
    if sw <= sh:
        rw, rh = s, int(s * sh / sw)
    else:
        rw, rh = int(s * sw / sh), s
    return rw, rh, int(round((rw - s) / 2.0)), int(round((rh - s) / 2.0))


def crop_fit_box(sw, sh, s):
    """The same as one box of the original (see rt_fit_geometry)."""
    rw, rh, left, top = crop_fit(sw, sh, s)
    kx, ky = sw / rw, sh / rh
    return (left * kx, top * ky, s * kx, s * ky)


def reference(im, cname, box, dw, dh, f):
    """Pillow's resize of the box; for the CROP cases torchvision's two steps (resize, then crop), which pack
    reproduces (Pillow's own box= path rounds the box to float32 and differs in ~0.07 % of values)."""
    if "crop" in cname:
        rw, rh, left, top = crop_fit(im.size[0], im.size[1], dw)
        return im.resize((rw, rh), f).crop((left, top, left + dw, top + dh))
    return im.resize((dw, dh), f, box=(box[0], box[1], box[0] + box[2], box[1] + box[3]))


def cases(images):
    big, mid = images["syn2000"], images["syn500"]
    out = [
        # name, image, box (x, y, w, h), out (w, h)
        ("down1.2_box270to224", "syn500", (113.0, 52.0, 270.0, 270.0), (224, 224)),
        ("down_500x375to224", "syn500", (0, 0, 500, 375), (224, 224)),
        ("down_crop500x375to224", "syn500", crop_fit_box(500, 375, 224), (224, 224)),
        ("down_500x375to128", "syn500", (0, 0, 500, 375), (128, 128)),
        ("down_box375to64", "syn500", (62.5, 0, 375, 375), (64, 64)),
        ("down_frac2000box", "syn2000", (123.4, 87.25, 843.7, 701.3), (224, 224)),
        ("down_2000x1500to224", "syn2000", (0, 0, 2000, 1500), (224, 224)),
        ("up_box120to224", "syn500", (200.3, 100.6, 120.5, 131.2), (224, 224)),
        ("up_box64to224", "syn500", (37.0, 211.0, 64.0, 64.0), (224, 224)),
    ]
    if "photo" in images:
        out += [
            ("photo_900x277to224", "photo", (0, 0, 900, 277), (224, 224)),
            ("photo_crop277to64", "photo", crop_fit_box(900, 277, 64), (64, 64)),
            ("photo_up_box100to224", "photo", (512.7, 150.2, 100.4, 110.9), (224, 224)),
        ]
    del big, mid
    return out


def psnr(a, b):
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    mse = np.mean(d * d)
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def build(tmp):
    libs, defs, missing = [], [], []
    for pc, flag in (("stb", "-DNO_STB"),):
        if subprocess.run(["pkg-config", "--exists"] + pc.split()).returncode == 0:
            libs.append(pc)
        else:
            defs.append(flag)
            missing.append(pc)
    for m in missing:
        print(f"note: pkg-config finds no {m}; its methods are left out")
    libs.append("libswscale libavutil")  # loader/resize.c needs them
    flags = subprocess.run(["pkg-config", "--cflags", "--libs"] + " ".join(libs).split(),
                           capture_output=True, text=True, check=True).stdout.split()
    exe = os.path.join(tmp, "resize_bench")
    if "-DNO_STB" not in defs:
        defs.append("-DSTB_FROM_HEADER")  # see resize_bench.c: libstb.so can abort
    cmd = (["cc", "-O3", "-std=gnu17", "-D_GNU_SOURCE", "-I", ROOT, "-o", exe, os.path.join(HERE, "resize_bench.c"),
            os.path.join(ROOT, "loader", "resize.c"), os.path.join(ROOT, "common", "common.c")] + defs + flags +
           ["-lm"])
    print("build:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return exe


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--keep", help="keep the images in this folder")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="resize_quality.")
    os.makedirs(tmp, exist_ok=True)
    try:
        exe = build(tmp)
        rng = np.random.default_rng(SEED)
        images = {"syn2000": synthetic(2000, 1500, rng), "syn500": synthetic(500, 375, rng)}
        if os.path.exists(PHOTO):
            images["photo"] = Image.open(PHOTO).convert("RGB")
        else:
            print("note: the photograph is not on this machine; synthetic images only")
        for name, im in images.items():
            im.save(os.path.join(tmp, name + ".ppm"))
        filters = [("BILINEAR", Image.BILINEAR), ("BICUBIC", Image.BICUBIC), ("LANCZOS", Image.LANCZOS),
                   ("BOX", Image.BOX)]
        table = {}   # (method, case) -> {pil filter: psnr}
        speed = {}   # (method, case) -> usec
        pil_us = {}  # case -> usec for Pillow BILINEAR
        ndiff = {}   # (method, case) -> values that differ from Pillow BILINEAR
        order = []
        case_list = cases(images)
        for cname, iname, box, (dw, dh) in case_list:
            im = images[iname]
            pbox = (box[0], box[1], box[0] + box[2], box[1] + box[3])
            refs = {fn: reference(im, cname, box, dw, dh, f) for fn, f in filters}
            ts = []
            for _ in range(args.reps):
                t0 = time.thread_time()
                im.resize((dw, dh), Image.BILINEAR, box=pbox)
                ts.append((time.thread_time() - t0) * 1e6)
            pil_us[cname] = sorted(ts)[len(ts) // 2]
            out = subprocess.run([exe, os.path.join(tmp, iname + ".ppm"), tmp, cname] +
                                 [repr(float(v)) for v in box] + [str(dw), str(dh), str(args.reps)],
                                 capture_output=True, text=True, check=True).stdout
            for line in out.split("\n"):
                if not line.strip():
                    continue
                meth, us, _ = line.split()
                if meth not in order:
                    order.append(meth)
                res = Image.open(os.path.join(tmp, f"{cname}__{meth}.ppm"))
                table[(meth, cname)] = {fn: psnr(res, r) for fn, r in refs.items()}
                ndiff[(meth, cname)] = int(np.count_nonzero(np.asarray(res) != np.asarray(refs["BILINEAR"])))
                speed[(meth, cname)] = float(us)
        cnames = [c[0] for c in case_list]
        print(f"\nCPU: {cpu_model()}; one thread; Pillow {Image.__version__}")
        print("cases:")
        for cname, iname, box, (dw, dh) in case_list:
            sw, sh = images[iname].size
            print(f"  {cname:24s} {iname} {sw}x{sh} box=({box[0]:.2f},{box[1]:.2f},{box[2]:.2f},{box[3]:.2f})"
                  f" -> {dw}x{dh}  (x{box[2] / dw:.2f} horizontally)")
        for fn, _ in filters:
            print(f"\nPSNR (dB) against Pillow {fn}:")
            print(f"{'method':28s}" + "".join(f"{c[:13]:>14s}" for c in cnames) + f"{'mean':>8s}")
            for m in order:
                v = [table[(m, c)][fn] for c in cnames]
                print(f"{m:28s}" + "".join(f"{x:14.2f}" for x in v) + f"{np.mean(v):8.2f}")
        print("\nvalues that differ from Pillow BILINEAR:")
        print(f"{'method':28s}" + "".join(f"{c[:13]:>14s}" for c in cnames))
        for m in order:
            print(f"{m:28s}" + "".join(f"{ndiff[(m, c)]:14d}" for c in cnames))
        print("\nspeed: median microseconds (thread CPU time) per output image, one thread")
        print(f"{'method':28s}" + "".join(f"{c[:13]:>14s}" for c in cnames))
        for m in order:
            print(f"{m:28s}" + "".join(f"{speed[(m, c)]:14.1f}" for c in cnames))
        print(f"{'Pillow BILINEAR':28s}" + "".join(f"{pil_us[c]:14.1f}" for c in cnames))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
