#!/usr/bin/python3
"""imgfile_vs_pillow.py - our decoder (loader/imgfile.c through rt_imgdump)
against Pillow's Image.open(f).convert("RGB") and convert("L"), the way
torchvision's default loader reads a file, on every decodable file of the
folder rt_mkfolder writes (every JPEG/PNG/WebP/PPM/BMP/TIFF variant), plus
the EXIF rotation against ImageOps.exif_transpose, and every BMP and TIFF
cut short at a dozen places: usable exactly when Pillow opens and converts
it, and then the same pixels; and hand-made BMPs (every bit-field layout,
odd palettes, RLE corner cases, headers Pillow refuses) and the TIFFs
Pillow's own writer makes in each mode and compression, read from a file
object as ImageFolder's loader reads them: usable exactly when Pillow says
so, and then Pillow's pixels.

Usage: imgfile_vs_pillow.py RT_MKFOLDER RT_IMGDUMP. Exit 0 pass, 1 fail,
77 when PIL or numpy is missing.

Bounds: exact (max abs diff 0) for every file, BMP and TIFF (JPEG-in-TIFF
too: libtiff hands it to the same libjpeg), JPEG (CMYK and YCCK
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
import random
import struct
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


# ---- hand-made BMPs: the variants Pillow 9.4 reads (or refuses) that rt_mkfolder's folder does not hold ----------

def bmp(w, h, bits, comp=0, hsize=40, colors=0, pal=b"", px=b"", topdown=False, masks=None, off=None):
    """A BMP file: header of hsize bytes (12: OS/2), masks after a 40-byte header or inside a longer one."""
    extra = struct.pack("<3I", *masks[:3]) if comp == 3 and hsize == 40 else b""
    if hsize == 12:
        hdr = struct.pack("<IHHHH", 12, w, h, 1, bits)
    else:
        hdr = struct.pack("<IiiHHIIiiII", hsize, w, -h if topdown else h, 1, bits, comp, len(px), 2835, 2835,
                          colors, 0)
        if hsize > 40:
            m = struct.pack("<4I", *(masks or (0, 0, 0, 0))) if comp == 3 else bytes(16)
            hdr += (m + bytes(hsize))[: hsize - 40]
    o = 14 + len(hdr) + len(extra) + len(pal) if off is None else off
    return b"BM" + struct.pack("<IHHI", o + len(px), 0, 0, o) + hdr + extra + pal + px


def rows(rnd, w, h, bpp):
    """h random rows of w pixels of bpp bits, each padded to 4 bytes as BMP stores them."""
    stride = ((w * bpp + 31) >> 3) & ~3
    return bytes(rnd.randrange(256) for _ in range(stride * h))


def bmp_cases():
    """name -> bytes: odd palettes, every bit-field layout, OS/2 headers, offsets, RLE corner cases, refusals."""
    rnd = random.Random(7)
    w, h = 13, 7

    def px(bits):
        return rows(rnd, w, h, bits)

    gray16 = b"".join(bytes([i, i, i, 0]) for i in range(16))
    pal5 = b"".join(bytes([i * 40, 255 - i * 40, i * 9, 0]) for i in range(5))
    pal = b"".join(bytes([i * 15, 255 - i * 15, (i * 77) & 255, 0]) for i in range(16))
    bgrx, xbgr = (0xFF0000, 0xFF00, 0xFF, 0), (0xFF000000, 0xFF0000, 0xFF00, 0)
    abgr = (0xFF000000, 0xFF0000, 0xFF00, 0xFF)
    rle4_odd = [0, 5, 0x12, 0x34, 0x50, 0, 3, 0x77, 0, 0] * h + [0, 1]  # absolute 5: Pillow reads 4 of them
    overrun = [20, 4, 0, 0, 0, 15] + list(range(15)) + [0] + [13, 3, 0, 0] * h + [0, 1]
    return {
        "bits8-2colors-gray": bmp(w, h, 8, colors=2, pal=bytes([0, 0, 0, 0, 255, 255, 255, 0]), px=px(8)),
        "bits4-gray16": bmp(w, h, 4, colors=16, pal=gray16, px=px(4)),
        "bits8-pal-idx-past": bmp(w, h, 8, colors=5, pal=pal5, px=px(8)),
        "bits1-color": bmp(w, h, 1, pal=bytes([10, 20, 30, 0, 200, 100, 50, 0]), px=px(1)),
        "bits32-rgb": bmp(w, h, 32, px=px(32)),
        "bits32-xbgr": bmp(w, h, 32, comp=3, hsize=108, masks=xbgr, px=px(32)),
        "bits32-abgr": bmp(w, h, 32, comp=3, hsize=124, masks=abgr, px=px(32)),
        "bits32-bgr-40": bmp(w, h, 32, comp=3, hsize=40, masks=bgrx, px=px(32)),
        "bits24-bitfields": bmp(w, h, 24, comp=3, hsize=40, masks=bgrx, px=px(24), topdown=True),
        "bits16-555-bf": bmp(w, h, 16, comp=3, hsize=108, masks=(0x7C00, 0x3E0, 0x1F, 0), px=px(16)),
        "bits16-bad-bf": bmp(w, h, 16, comp=3, hsize=108, masks=(0xF00, 0xF0, 0xF, 0), px=px(16)),
        "os2-24": bmp(w, h, 24, hsize=12, px=px(24)),
        "os2-4": bmp(w, h, 4, hsize=12, pal=bytes(rnd.randrange(256) for _ in range(48)), px=px(4)),
        "hdr52": bmp(w, h, 24, hsize=52, px=px(24)),
        "bits2": bmp(w, h, 2, pal=bytes(16), px=px(2)),
        "colors300": bmp(w, h, 8, colors=300, pal=bytes(1200), px=px(8)),
        "off0": bmp(w, h, 24, px=px(24), off=0),
        "off-hdr": bmp(w, h, 8, colors=4, pal=bytes(16), px=bytes(16) + px(8)[:-16], off=54),
        "rle4-odd-abs": bmp(w, h, 4, comp=2, pal=pal, px=bytes(rle4_odd)),
        "rle8-eob-early": bmp(w, h, 8, comp=1, pal=pal, px=bytes([13, 4, 0, 0] * 3 + [0, 1])),
        "rle8-overrun": bmp(w, h, 8, comp=1, pal=pal, px=bytes(overrun)),
        "rle8-topdown": bmp(w, h, 8, comp=1, topdown=True, pal=pal,
                            px=bytes(sum(([13, i, 0, 0] for i in range(h)), []) + [0, 1])),
        "rle8-eol-mid": bmp(w, h, 8, comp=1, pal=pal, px=bytes([3, 9, 0, 0] * (h + 2) + [0, 1])),
        "rle8-delta-end": bmp(w, h, 8, comp=1, pal=pal, px=bytes([13, 1, 0, 0, 0, 2, 9, 9, 0, 20, 0, 1])),
        "rle24": bmp(w, h, 24, comp=1, px=bytes([0, 1])),
        "comp4": bmp(w, h, 24, comp=4, px=px(24)),
    }


def tiff_cases(tmp):
    """Files Pillow's own TIFF writer makes (through libtiff): every mode it saves, with each compression."""
    rnd = np.random.default_rng(5)
    out = {}
    base = rnd.integers(0, 256, (23, 37, 3), dtype=np.uint8)
    imgs = {"RGB": Image.fromarray(base), "L": Image.fromarray(base[..., 0]),
            "1": Image.fromarray(base[..., 1]).convert("1"), "P": Image.fromarray(base).quantize(50),
            "RGBA": Image.fromarray(np.dstack([base, base[..., :1]])), "CMYK": Image.fromarray(base).convert("CMYK"),
            "LA": Image.fromarray(np.dstack([base[..., 2], base[..., 0]])),
            "I;16": Image.fromarray((base[..., 0].astype(np.uint16) * 3).astype(np.uint16))}
    for mode, im in imgs.items():
        for comp in (None, "tiff_lzw", "tiff_adobe_deflate", "packbits", "jpeg", "group4"):
            if (comp == "jpeg" and mode not in ("RGB", "L")) or (comp == "group4" and mode != "1"):
                continue
            path = os.path.join(tmp, f"pil_{mode.replace(';', '')}_{comp}.tif")
            im.save(path, compression=comp)
            out[f"{mode}/{comp}"] = path
    return out


def hand_made(imgdump, tmp):
    """Each case decodes exactly when Pillow opens and converts it from a file object (as ImageFolder's loader
    does), and then to Pillow's pixels. Returns the number of disagreements."""
    paths = {}
    for name, data in bmp_cases().items():
        paths[f"bmp {name}"] = os.path.join(tmp, f"hand_{name}.bmp")
        with open(paths[f"bmp {name}"], "wb") as f:
            f.write(data)
    paths.update({f"tiff {k}": v for k, v in tiff_cases(tmp).items()})
    failures = 0
    out = os.path.join(tmp, "hand.pnm")
    for name, path in paths.items():
        r = subprocess.run([imgdump, path, out], capture_output=True, text=True)
        try:
            with open(path, "rb") as f, Image.open(f) as im:
                ref = np.asarray(im.convert("RGB"))
            theirs = "decodes"
        except Exception as e:  # noqa: BLE001 - any exception makes the file unusable for ImageFolder
            ref, theirs = None, type(e).__name__
        ours = read_pnm(out) if r.returncode == 0 else None
        ok = (ours is None) == (ref is None) and (ours is None or np.array_equal(ours, ref))
        why = "decodes" if ours is not None else r.stderr.strip().rsplit("(", 1)[-1].rstrip(")")
        print(f"  {'ok  ' if ok else 'FAIL'} {name:28} ours: {why:12} Pillow: {theirs}")
        failures += not ok
    return failures


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
        # BMP and TIFF cut short: usable exactly when Pillow opens and converts the cut file, and then the same
        # pixels (an RLE BMP cut after its last end-of-line has every pixel; anything else is truncated).
        cut = os.path.join(tmp, "cut")
        for e in (e for e in files if e["format"] in ("BMP", "TIFF")):
            with open(os.path.join(folder, e["path"]), "rb") as f:
                data = f.read()
            cuts = sorted({len(data) * k // 12 for k in range(1, 12)} | {len(data) - 2, len(data) - 1})
            agree = 0
            for n in cuts:
                with open(cut, "wb") as f:
                    f.write(data[:n])
                out = os.path.join(tmp, "cut.pnm")
                ours_ok = subprocess.run([imgdump, cut, out], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL).returncode == 0
                try:
                    with Image.open(cut) as im:
                        ref = np.asarray(im.convert("RGB"))
                    pil_ok = True
                except Exception:  # noqa: BLE001 - any exception makes the file unusable for ImageFolder
                    pil_ok = False
                ok = ours_ok == pil_ok and (not ours_ok or np.array_equal(read_pnm(out), ref))
                if not ok:
                    print(f"  FAIL cut {e['path']} at {n} of {len(data)}: ours {'decodes' if ours_ok else 'refuses'}, "
                          f"Pillow {'decodes' if pil_ok else 'refuses'}")
                failures += not ok
                agree += ok
            print(f"  cuts {e['path']:24} {agree} of {len(cuts)} agree with Pillow")
        # A TIFF is turned by its Orientation tag as Pillow loads it, asked or not; exif_transpose of the loaded,
        # converted image (ImageFolder's) then finds nothing to do. (On the image not yet loaded, Pillow 9.4
        # turns it twice: the tag is still there when exif_transpose looks, and load() turns it once more.)
        for e in (e for e in files if e["format"] == "TIFF"):
            src = os.path.join(folder, e["path"])
            out = os.path.join(tmp, "rot.pnm")
            subprocess.run([imgdump, "--exif-rotate", src, out], check=True)
            with Image.open(src) as im:
                ref = np.asarray(ImageOps.exif_transpose(im.convert("RGB")))
            ours = read_pnm(out)
            ok = ours.shape == ref.shape and np.array_equal(ours, ref)
            if not ok or "orient" in e["kind"]:
                print(f"  {'ok  ' if ok else 'FAIL'} TIFF exif_transpose {e['path']}: {ours.shape} vs {ref.shape}")
            failures += not ok
        failures += hand_made(imgdump, tmp)
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
