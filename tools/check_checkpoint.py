#!/usr/bin/python3
"""
check_checkpoint.py - checks a model checkpoint written by ringtrain (a
safetensors file) independently of the C code: parses the file by hand,
validates its layout and metadata, loads it with strict=True into the PyTorch
reference model of tools/reference_models.py and runs an eval-mode forward.

    /usr/bin/python3 tools/check_checkpoint.py CKPT.safetensors [--expect-model NAME] [--logits OUT.bin]

Prints "ok: <model> <tensors> tensors, <parameters> parameters, logits sum <x>"
and exits 0, or prints what is wrong and exits 1.

The metadata must hold "model", "num_classes", "input_shape" ([C,H,W] as
JSON), "mean" and "std" (JSON arrays of C numbers in 0..1). The forward runs
on the fixture input: N=4 uint8 images whose byte j is
fmix32((j + 12345) mod 2^32) & 0xFF, normalised in float32 as
(x / 255 - mean[c]) / std[c]. --logits writes those (4, num_classes) logits
as raw little-endian float32.

Needs Debian's python3-torch and python3-torchvision (no safetensors package).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in tools/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_models as R  # noqa: E402

DTYPES = {  # name -> (torch dtype, bytes per element)
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "U8": (torch.uint8, 1),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
INT_DTYPES = ("I64", "I32")
MAX_HEADER = 100 << 20
N_IMAGES = 4


class CheckError(Exception):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise CheckError("header: key %r appears twice" % k)
        d[k] = v
    return d


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse_safetensors(path):
    """Returns (metadata dict, {name: (dtype, shape, bytes)} in file order)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CheckError("cannot read: %s" % e.strerror)
    if len(blob) < 8:
        raise CheckError("file is %d bytes, shorter than the 8-byte header length" % len(blob))
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise CheckError("header length %d runs past the end of the file (%d bytes after the length)"
                         % (hlen, len(blob) - 8))
    if hlen > MAX_HEADER:
        raise CheckError("header length %d is over %d bytes" % (hlen, MAX_HEADER))
    if hlen < 2:
        raise CheckError("header length %d is too short for a JSON object" % hlen)
    raw = blob[8:8 + hlen]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckError("header is not valid UTF-8 (byte %d)" % e.start)
    if not text.startswith("{"):
        raise CheckError("header does not start with '{'")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise CheckError("header is not valid JSON: %s" % e)
    if not isinstance(header, dict):
        raise CheckError("header is not a JSON object")
    data = blob[8 + hlen:]

    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CheckError("__metadata__ must be an object of string values")

    entries = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise CheckError("tensor %r: entry must have exactly dtype, shape and data_offsets" % name)
        dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in DTYPES:
            raise CheckError("tensor %r: dtype %r is not one of %s" % (name, dt, ", ".join(DTYPES)))
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise CheckError("tensor %r: shape %r is not a list of non-negative integers" % (name, shape))
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
            raise CheckError("tensor %r: data_offsets %r is not [begin, end]" % (name, offs))
        b, end = offs
        if not 0 <= b <= end:
            raise CheckError("tensor %r: data_offsets [%d, %d] are not 0 <= begin <= end" % (name, b, end))
        if end > len(data):
            raise CheckError("tensor %r: data_offsets [%d, %d] run past the data section (%d bytes; file "
                             "truncated?)" % (name, b, end, len(data)))
        want = math.prod(shape) * DTYPES[dt][1]
        if end - b != want:
            raise CheckError("tensor %r: %d bytes at data_offsets [%d, %d], but %s %s needs %d"
                             % (name, end - b, b, end, dt, shape, want))
        entries.append((b, end, name, dt, shape))

    entries.sort()
    pos = 0
    for b, end, name, _, _ in entries:
        if b < pos:
            raise CheckError("tensor %r: data_offsets [%d, %d] overlap the previous tensor (ends at %d)"
                             % (name, b, end, pos))
        if b > pos:
            raise CheckError("tensor %r: data_offsets [%d, %d] leave a gap of %d bytes after offset %d"
                             % (name, b, end, b - pos, pos))
        pos = end
    if pos != len(data):
        raise CheckError("data section is %d bytes but the tensors cover %d (%s)"
                         % (len(data), pos, "trailing bytes" if len(data) > pos else "truncated"))
    tensors = {name: (dt, shape, data[b:end]) for b, end, name, dt, shape in entries}
    return meta, tensors


def _meta_json(meta, key):
    if key not in meta:
        raise CheckError("__metadata__ has no %r" % key)
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise CheckError("__metadata__ %r is not JSON: %r (%s)" % (key, meta[key], e))


def check_metadata(meta):
    for key in ("model", "num_classes", "input_shape", "mean", "std"):
        if key not in meta:
            raise CheckError("__metadata__ has no %r (it has: %s)" % (key, ", ".join(sorted(meta)) or "nothing"))
    model = meta["model"]
    classes = _meta_json(meta, "num_classes")
    if not _is_int(classes) or classes < 2:
        raise CheckError("__metadata__ num_classes %r is not an integer >= 2" % meta["num_classes"])
    shape = _meta_json(meta, "input_shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(_is_int(s) and s >= 1 for s in shape)):
        raise CheckError("__metadata__ input_shape %r is not a JSON array [C, H, W] of positive integers"
                         % meta["input_shape"])
    c = shape[0]
    stats = {}
    for key in ("mean", "std"):
        v = _meta_json(meta, key)
        if not (isinstance(v, list) and len(v) == c
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise CheckError("__metadata__ %s %r is not a JSON array of %d numbers (one per channel)"
                             % (key, meta[key], c))
        if not all(0.0 <= x <= 1.0 for x in v):
            raise CheckError("__metadata__ %s %r has values outside 0..1" % (key, meta[key]))
        if key == "std" and not all(x > 0 for x in v):
            raise CheckError("__metadata__ std %r has a zero" % meta[key])
        stats[key] = np.array(v, dtype=np.float32)
    return model, classes, shape, stats["mean"], stats["std"]


def to_torch(dt, shape, raw):
    tdt, _ = DTYPES[dt]
    if len(raw) == 0:
        return torch.empty(shape, dtype=tdt)
    t = torch.frombuffer(bytearray(raw), dtype=tdt)  # a copy: the checkpoint bytes stay untouched
    if sys.byteorder != "little" and DTYPES[dt][1] > 1:
        t = torch.from_numpy(t.numpy().byteswap())
    return t.reshape(shape)


def fixture_input(n, c, h, w, mean, std):
    img = R.fixture_images(n, c, h, w)
    x = torch.from_numpy(img).float() / 255.0
    x = x - torch.from_numpy(mean).view(1, c, 1, 1)
    return x / torch.from_numpy(std).view(1, c, 1, 1)


def check(path, expect_model=None, logits_out=None):
    meta, tensors = parse_safetensors(path)
    model_name, classes, (c, h, w), mean, std = check_metadata(meta)
    if expect_model is not None and model_name != expect_model:
        raise CheckError("model is %r, expected %r" % (model_name, expect_model))
    try:
        model = R.build(model_name, c, h, w, classes)
    except ValueError as e:
        raise CheckError("cannot build the reference model: %s" % e)
    ref = model.state_dict()

    missing = [k for k in ref if k not in tensors]
    extra = [k for k in tensors if k not in ref]
    if missing or extra:
        parts = []
        if missing:
            parts.append("%d missing (%s)" % (len(missing), ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")))
        if extra:
            parts.append("%d unexpected (%s)" % (len(extra), ", ".join(extra[:8]) + (", ..." if len(extra) > 8 else "")))
        raise CheckError("tensors do not match %s's state_dict: %s" % (model_name, "; ".join(parts)))

    sd = {}
    for name, want in ref.items():
        dt, shape, raw = tensors[name]
        if list(want.shape) != shape:
            raise CheckError("tensor %r has shape %s, %s wants %s" % (name, shape, model_name, list(want.shape)))
        if want.is_floating_point() and dt not in FLOAT_DTYPES:
            raise CheckError("tensor %r is %s, a floating-point dtype (F32/F16/BF16) is needed" % (name, dt))
        if not want.is_floating_point() and dt not in INT_DTYPES:
            raise CheckError("tensor %r is %s, an integer dtype (I64/I32) is needed" % (name, dt))
        t = to_torch(dt, shape, raw)
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckError("tensor %r has %d non-finite values" % (name, bad))
        if name.endswith(".running_var") and bool((t < 0).any()):
            raise CheckError("tensor %r has negative variances" % name)
        if name.endswith(".num_batches_tracked") and bool((t < 0).any()):
            raise CheckError("tensor %r is negative" % name)
        sd[name] = t
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise CheckError("load_state_dict(strict=True) failed: %s" % e)

    model.eval()
    with torch.no_grad():
        logits = model(fixture_input(N_IMAGES, c, h, w, mean, std))
    if tuple(logits.shape) != (N_IMAGES, classes):
        raise CheckError("logits have shape %s, expected (%d, %d)" % (tuple(logits.shape), N_IMAGES, classes))
    if not bool(torch.isfinite(logits).all()):
        raise CheckError("eval-mode logits are not finite")
    if logits_out:
        arr = logits.numpy().astype("<f4")
        try:
            with open(logits_out, "wb") as f:
                f.write(arr.tobytes(order="C"))
        except OSError as e:
            raise CheckError("cannot write %s: %s" % (logits_out, e.strerror))
    nparams = sum(p.numel() for p in model.parameters())
    return "ok: %s %d tensors, %d parameters, logits sum %.9g" % (
        model_name, len(tensors), nparams, float(logits.double().sum()))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Check a ringtrain checkpoint (safetensors) against the "
                                             "PyTorch reference models.")
    ap.add_argument("checkpoint", help="model.safetensors written by ringtrain")
    ap.add_argument("--expect-model", metavar="NAME", help="fail unless the metadata names this model")
    ap.add_argument("--logits", metavar="OUT.bin",
                    help="write the eval-mode logits of the fixture input (N=4) as raw little-endian float32")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        print(check(args.checkpoint, args.expect_model, args.logits))
    except CheckError as e:
        print("check_checkpoint: %s: %s" % (args.checkpoint, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
