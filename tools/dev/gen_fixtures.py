#!/usr/bin/python3
"""
gen_fixtures.py - writes the PyTorch reference results the C compute tests
compare against, under tests/fixtures/compute/ (safetensors files):

  model_<name>.safetensors   one train-mode forward + backward of each model on
                             a fixed batch, weights set by a hash formula
  optim.safetensors          5 steps of torch.optim SGD / Adam / AdamW
  sched.safetensors          100 learning rates of three lr_schedulers

Deterministic: running it again rewrites byte-identical files.

    /usr/bin/python3 tools/dev/gen_fixtures.py [--out DIR] [--only NAME ...]

--only writes just the named fixtures (a model name such as resnet50, or
optim, sched), leaving the others as they are.

Needs Debian's python3-torch (1.13) and python3-torchvision; no safetensors
package (the writer is below). The formulas are in tools/reference_models.py.
"""

import argparse
import copy
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

sys.dont_write_bytecode = True  # no __pycache__ in tools/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/: reference_models
import reference_models as R  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "compute")

DTYPES = {  # safetensors name -> (numpy little-endian dtype, size)
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "U8": ("|u1", 1),
}

# ---------------------------------------------------------------- writer


def write_safetensors(path, tensors, metadata):
    """
    tensors: {name: (dtype, numpy array)}; metadata: {str: str}.
    Layout: u64 LE header length N, N bytes of JSON padded with spaces to a
    multiple of 8, then the tensors' bytes back to back with no gaps. Data are
    ordered by element size (8-byte types first, then 4, then 1) and by name
    within a size, so every tensor starts at an offset that is a multiple of
    its element size (safetensors' own writer orders them the same way); the
    JSON lists "__metadata__" first, then the tensors in that same order.
    """
    order = sorted(tensors, key=lambda n: (-DTYPES[tensors[n][0]][1], n))
    header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    blobs = []
    off = 0
    for name in order:
        dt, arr = tensors[name]
        npdt, size = DTYPES[dt]
        arr = np.asarray(arr)  # not ascontiguousarray: it turns a 0-d array into shape [1]
        if arr.dtype != np.dtype(npdt):
            raise TypeError("%s: array is %s, not %s" % (name, arr.dtype, dt))
        b = arr.tobytes(order="C")
        assert len(b) == arr.size * size and off % size == 0
        header[name] = {"dtype": dt, "shape": [int(s) for s in arr.shape], "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return 8 + len(hj) + off


# ---------------------------------------------------------------- helpers


def sample_indices(count, m_max=64):
    """m = min(count, m_max) unique increasing indices spread over [0, count)."""
    m = min(count, m_max)
    stride = max(1, count // m)
    idx = [(j * count) // m + (R.fmix32(j) % stride) for j in range(m)]
    idx = [min(i, count - 1) for i in idx]
    assert all(a < b for a, b in zip(idx, idx[1:])), "indices not unique"
    return np.array(idx, dtype=np.int64)


MEANS = {1: [0.1307], 3: [0.4914, 0.4822, 0.4465]}
STDS = {1: [0.3081], 3: [0.2470, 0.2435, 0.2616]}

MODEL_CASES = [  # name, n, c, h, w, classes[, sampling]
    ("mnist-net", 4, 1, 28, 28, 10),
    ("resnet18", 4, 3, 32, 32, 10),
    ("resnet9", 4, 3, 32, 32, 10),
    ("wrn-16-2", 4, 3, 32, 32, 10),
    # Non-square, and small enough for a test of a few seconds: layer3 is 4x3 and layer4 2x2, so each
    # batchnorm of layer4 still sees 8 values per channel. Its 320 state_dict tensors would make a 500 KB
    # file at the default sampling; these keep it under 200 KB. Float64 reference: see model_fixture().
    ("resnet50", 2, 3, 64, 48, 10, dict(grad_samples=32, buffer_samples=8, init_samples=0, float64=True)),
]
# How much of each tensor a fixture keeps: sampled gradient elements per parameter, sampled running
# statistics per batchnorm buffer (None: all of them), sampled initial weights per tensor; and whether
# the reference is computed in float64 (float32 otherwise).
DEFAULT_SAMPLING = dict(grad_samples=64, buffer_samples=None, init_samples=8, float64=False)


def f32_errors(model, x, labels, ref_logits, ref_loss, ref_sd, smp):
    """
    How far PyTorch's own float32 run of `model` (float64, after the reference step) lands from the
    float64 reference, in the C test's measures: logits and running statistics elementwise (relative to
    the largest |logit|, to |ref| + 1e-3), the loss relative, each gradient's sampled elements relative to
    the sample's largest |value|, each gradient's norm relative; the largest of each over the model.
    """
    m32 = copy.deepcopy(model).float()
    m32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref_sd.items()})
    m32.zero_grad(set_to_none=True)
    logits = m32(x.float())
    loss = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)(logits, labels)
    loss.backward()
    lg, rl = logits.detach().double(), ref_logits.detach()
    err = {"logits": ((lg - rl).abs().max() / rl.abs().max()).item(),
           "loss": abs(loss.item() - ref_loss) / abs(ref_loss), "grad": 0.0, "norm": 0.0, "running": 0.0}
    for (pname, p), (_, p32) in zip(model.named_parameters(), m32.named_parameters()):
        g, g32 = p.grad.reshape(-1), p32.grad.double().reshape(-1)
        idx = torch.from_numpy(sample_indices(g.numel(), smp["grad_samples"]))
        vmax = g[idx].abs().max().item()
        err["grad"] = max(err["grad"], (g32[idx] - g[idx]).abs().max().item() / (vmax + 1e-12))
        err["norm"] = max(err["norm"], abs(g32.norm().item() - g.norm().item()) / (g.norm().item() + 1e-12))
    for (bname, b), (_, b32) in zip(model.state_dict().items(), m32.state_dict().items()):
        if bname.endswith("running_mean") or bname.endswith("running_var"):
            err["running"] = max(err["running"], ((b32.double() - b).abs() / (b.abs() + 1e-3)).max().item())
    return err
LABEL_SMOOTHING = 0.1


def normalise(img_u8, mean, std):
    """float32, in the C code's order: (x / 255 - mean[c]) / std[c]."""
    c = img_u8.shape[1]
    x = torch.from_numpy(img_u8).float() / 255.0
    x = x - torch.from_numpy(mean).view(1, c, 1, 1)
    x = x / torch.from_numpy(std).view(1, c, 1, 1)
    return x


def model_fixture(name, n, c, h, w, k, sampling=None):
    smp = dict(DEFAULT_SAMPLING, **(sampling or {}))
    model = R.build(name, c, h, w, k)
    roles = R.init_by_formula(model)
    model.train()
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.eval()
    img = R.fixture_images(n, c, h, w)
    labels = np.array([(3 * i + 1) % k for i in range(n)], dtype=np.int64)
    mean = np.array(MEANS[c], dtype=np.float32)
    std = np.array(STDS[c], dtype=np.float32)
    x = normalise(img, mean, std)
    # The normalisation must equal plain IEEE float32 arithmetic (what C does).
    ref = ((img.astype(np.float32) / np.float32(255.0)) - mean.reshape(1, c, 1, 1)) / std.reshape(1, c, 1, 1)
    assert np.array_equal(x.numpy(), ref.astype(np.float32)), "torch normalisation differs from IEEE float32"

    init = {nm: t.detach().clone() for nm, t in model.state_dict().items()}
    # A deep net in training mode can be ill-conditioned in float32: resnet50's batchnorms divide by the
    # small spread of maps whose per-channel mean grows along the residual stream, so PyTorch's own
    # float32 gradients land up to 15 % (of the sample's largest) from float64's. Such a model's reference
    # is the float64 run, rounded once to float32, and the fixture says how far PyTorch's float32 run is
    # from it (metadata "f32_error"): the C test holds ringtrain to that, not to a float32 run's noise.
    if smp["float64"]:
        model.double()
        x = x.double()
    model.zero_grad(set_to_none=True)
    logits = model(x)
    loss = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)(logits, torch.from_numpy(labels))
    loss.backward()

    t = {
        "input": ("U8", img),
        "labels": ("I32", labels.astype(np.int32)),
        "mean": ("F32", mean),
        "std": ("F32", std),
        "logits": ("F32", logits.detach().numpy().astype(np.float32)),
        "loss": ("F32", np.array([loss.item()], dtype=np.float32)),
    }
    nparams = 0
    for pname, p in model.named_parameters():
        g = p.grad.detach().reshape(-1)
        nparams += p.numel()
        idx = sample_indices(g.numel(), smp["grad_samples"])
        t["grad.%s.norm" % pname] = ("F32", np.array([g.double().norm().item()], dtype=np.float32))
        t["grad.%s.idx" % pname] = ("I64", idx)
        t["grad.%s.val" % pname] = ("F32", g.numpy()[idx].astype(np.float32))
    sd = model.state_dict()
    nbuf = 0
    for bname, b in sd.items():
        role = roles[bname]
        if role in ("running_mean", "running_var") and smp["buffer_samples"] is None:
            t["after." + bname] = ("F32", b.detach().numpy().astype(np.float32))
            nbuf += 1
        elif role in ("running_mean", "running_var"):
            idx = sample_indices(b.numel(), smp["buffer_samples"])
            t["after.%s.idx" % bname] = ("I64", idx)
            t["after.%s.val" % bname] = ("F32", b.detach().reshape(-1).numpy()[idx].astype(np.float32))
            nbuf += 1
        elif role == "num_batches_tracked":
            t["after." + bname] = ("I64", b.detach().numpy().astype(np.int64))
            nbuf += 1
    # A few formula weights of every tensor, so the C side can check its formula by itself.
    for tname, v in init.items():
        if roles[tname] == "num_batches_tracked" or not smp["init_samples"]:
            continue
        idx = sample_indices(v.numel(), smp["init_samples"])
        t["init.%s.idx" % tname] = ("I64", idx)
        t["init.%s.val" % tname] = ("F32", v.reshape(-1).numpy()[idx].astype(np.float32))
    meta = {
        "model": name, "n": str(n), "c": str(c), "h": str(h), "w": str(w), "classes": str(k),
        "label_smoothing": "0.1",
        "state_dict": json.dumps([[nm, list(v.shape)] for nm, v in init.items()], separators=(",", ":")),
        "note": "train mode, dropout as identity; weights from the fnv1a32/fmix32 formula in "
                "tools/reference_models.py; grad.* of the mean smoothed cross-entropy over n samples",
        "torch": torch.__version__.split("+")[0],
    }
    if sampling:  # only where it differs, so the older fixtures stay byte-identical
        meta["sampling"] = json.dumps(smp, separators=(",", ":"), sort_keys=True)
    if smp["float64"]:
        err = f32_errors(model, x, torch.from_numpy(labels), logits, loss.item(), init, smp)
        meta["f32_error"] = json.dumps({k: float("%.3g" % v) for k, v in err.items()}, separators=(",", ":"),
                                       sort_keys=True)
        meta["note"] = meta["note"].replace("train mode,", "train mode, float64 rounded to float32 (f32_error: "
                                            "PyTorch's float32 run against it),")
    return t, meta, (len(init), nparams, float(loss.item()))


# ---------------------------------------------------------------- optimizers

OPTIM_N = 1000
OPTIM_STEPS = 5
OPTIM_CONFIGS = [
    ("sgd", "sgd", dict(lr=0.1, momentum=0.9, weight_decay=5e-4)),
    ("sgd_nesterov", "sgd", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)),
    ("sgd_plain", "sgd", dict(lr=0.1, momentum=0.0)),
    ("sgd_damp", "sgd", dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("adam", "adam", dict(lr=1e-3, weight_decay=1e-2)),
    ("adamw", "adamw", dict(lr=1e-3, weight_decay=1e-2)),
]


def hash_vector(name, n):
    return (2.0 * R.hash_u(name, n) - 1.0).astype(np.float32)


def optim_fixture():
    p0 = hash_vector("p0", OPTIM_N)
    gs = [hash_vector("g.%d" % k, OPTIM_N) for k in range(OPTIM_STEPS)]
    t = {"p0": ("F32", p0)}
    for k, g in enumerate(gs):
        t["g.%d" % k] = ("F32", g)
    cfgs = []
    for cname, kind, kw in OPTIM_CONFIGS:
        p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
        if kind == "sgd":
            opt = torch.optim.SGD([p], foreach=False, **kw)
        elif kind == "adam":
            opt = torch.optim.Adam([p], foreach=False, **kw)
        else:
            opt = torch.optim.AdamW([p], foreach=False, **kw)
        full = dict(opt.defaults)
        for g in gs:
            p.grad = torch.from_numpy(g.copy())
            opt.step()
        t[cname + ".p"] = ("F32", p.detach().numpy().copy())
        st = opt.state[p]
        if kind == "sgd":
            if kw.get("momentum", 0) != 0:
                t[cname + ".momentum_buffer"] = ("F32", st["momentum_buffer"].numpy().copy())
            else:
                assert st.get("momentum_buffer") is None
        else:
            t[cname + ".exp_avg"] = ("F32", st["exp_avg"].numpy().copy())
            t[cname + ".exp_avg_sq"] = ("F32", st["exp_avg_sq"].numpy().copy())
            assert float(st["step"]) == OPTIM_STEPS
        keep = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "betas", "eps", "amsgrad", "maximize")
        cfgs.append({"name": cname, "optimizer": kind,
                     **{k: (list(v) if isinstance(v, tuple) else v) for k, v in full.items() if k in keep}})
    meta = {
        "n": str(OPTIM_N), "steps": str(OPTIM_STEPS),
        "configs": json.dumps(cfgs, separators=(",", ":"), sort_keys=True),
        "note": "p0 and g.k are (2u-1) of the hash formula (names 'p0', 'g.0'..); <cfg>.p is the "
                "parameter after steps with g.0..g.4 (torch.optim, foreach=False)",
        "torch": torch.__version__.split("+")[0],
    }
    return t, meta, [c["name"] for c in cfgs]


# ---------------------------------------------------------------- schedules

SCHED_STEPS = 100
SCHED_LR = 0.4


def sched_fixture():
    def run(make):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=SCHED_LR)
        sch = make(opt)
        lrs = []
        for _ in range(SCHED_STEPS):
            lrs.append(opt.param_groups[0]["lr"])
            p.grad = torch.zeros(1)
            opt.step()
            sch.step()
        return np.array(lrs, dtype=np.float64)

    S = torch.optim.lr_scheduler
    scheds = {
        "cosine": run(lambda o: S.CosineAnnealingLR(o, T_max=SCHED_STEPS, eta_min=0)),
        "onecycle": run(lambda o: S.OneCycleLR(o, max_lr=SCHED_LR, total_steps=SCHED_STEPS, pct_start=0.25,
                                               anneal_strategy="linear", cycle_momentum=False,
                                               div_factor=25, final_div_factor=1e4)),
        "step": run(lambda o: S.StepLR(o, step_size=30, gamma=0.1)),
    }
    t = {k: ("F64", v) for k, v in scheds.items()}
    meta = {
        "steps": str(SCHED_STEPS), "base_lr": "0.4",
        "cosine": "CosineAnnealingLR(T_max=100, eta_min=0)",
        "onecycle": "OneCycleLR(max_lr=0.4, total_steps=100, pct_start=0.25, anneal_strategy='linear', "
                    "cycle_momentum=False, div_factor=25, final_div_factor=1e4)",
        "step": "StepLR(step_size=30, gamma=0.1)",
        "note": "value k is optimizer.param_groups[0]['lr'] before the k-th optimizer.step() (0-based)",
        "torch": torch.__version__.split("+")[0],
    }
    return t, meta


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default tests/fixtures/compute)")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="write only these fixtures: model names (%s), optim, sched" %
                         ", ".join(case[0] for case in MODEL_CASES))
    args = ap.parse_args()
    known = [case[0] for case in MODEL_CASES] + ["optim", "sched"]
    for name in args.only or []:
        if name not in known:
            ap.error("--only %s: no such fixture (fixtures: %s)" % (name, ", ".join(known)))
    wanted = set(args.only or known)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)  # only the (overwritten) default initialisation draws from it
    os.makedirs(args.out, exist_ok=True)

    total = 0
    for name, n, c, h, w, k, *sampling in MODEL_CASES:
        if name not in wanted:
            continue
        t, meta, (ntens, nparams, loss) = model_fixture(name, n, c, h, w, k, *sampling)
        path = os.path.join(args.out, "model_%s.safetensors" % name)
        size = write_safetensors(path, t, meta)
        total += size
        print("%-40s %8d bytes  %3d fixture tensors; %s (%d,%d,%d,%d) K=%d: %d state_dict tensors, "
              "%d parameters, loss %.6f" % (os.path.relpath(path, ROOT), size, len(t), name, n, c, h, w, k,
                                            ntens, nparams, loss))
    if "optim" in wanted:
        t, meta, names = optim_fixture()
        path = os.path.join(args.out, "optim.safetensors")
        size = write_safetensors(path, t, meta)
        total += size
        print("%-40s %8d bytes  %3d fixture tensors; n=%d, %d steps: %s" % (
            os.path.relpath(path, ROOT), size, len(t), OPTIM_N, OPTIM_STEPS, ", ".join(names)))
    if "sched" in wanted:
        t, meta = sched_fixture()
        path = os.path.join(args.out, "sched.safetensors")
        size = write_safetensors(path, t, meta)
        total += size
        print("%-40s %8d bytes  %3d fixture tensors; %d steps, base lr %g: %s" % (
            os.path.relpath(path, ROOT), size, len(t), SCHED_STEPS, SCHED_LR, ", ".join(sorted(t))))
    print("total %d bytes" % total)


if __name__ == "__main__":
    main()
