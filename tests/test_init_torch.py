#!/usr/bin/python3
"""Starting weights from PyTorch (`ringtrain train --init`): ringtrain's eval-mode logits equal PyTorch's.

    test_init_torch.py RT_INIT_LOGITS RINGTRAIN        (env RT_SOURCE: the source tree; ctest passes all three)

For torchvision's resnet18 and resnet50 (10 classes, fixed seeds), with every batchnorm's weight, bias, running
statistics and num_batches_tracked randomised so that eval mode is what is tested, the state_dict goes to
ringtrain as
  a. safetensors written by convert.save_safetensors;
  b. a torch.save'd .pth converted by the command line (python/ringtrain/convert.py run by path, a subprocess);
  c. a DDP training script's checkpoint, {"state_dict": {"module." + name: tensor}}, converted the same way;
  d. (resnet18) the half-precision model's state_dict as F16 safetensors, against PyTorch's float32 logits of
     the same half-rounded weights;
and rt_init_logits (tests/init_logits.c: the CPU backend, fp32, rt_model_load_init, one RT_EVAL step) must give
the logits PyTorch gives for the same uint8 batch normalised the same way, within rtol 1e-4 / atol 1e-4.
Worst differences seen (x86-64 with AVX-512, 2 cores): resnet18 1.2e-6 against logits up to 1.3 (F16: 1.8e-6),
resnet50 1.9e-5 against logits up to 15
(each PASS line prints this run's).

Files that do not fit the model: one with a tensor dropped, one transposed and one extra is refused (exit 2)
listing all three with the file's and the model's shapes; a 1000-class file into a 10-class model is refused
naming fc.weight and fc.bias, and loads with --reset-head.

Frozen layers (--freeze): one training step of resnet18 with 'conv1.*,layer2.*' (a frozen middle) and with
'conv1.*,bn1.*,layer1.*' (a fine-tuning prefix) against PyTorch with those modules' parameters
requires_grad_(False) and the modules in .eval(): the trainable gradients (within 1e-3 of each tensor's largest;
2.5e-4 seen), the logits and every batchnorm buffer after the step agree, and the frozen layers have no gradient
and keep their running statistics and num_batches_tracked. The converter's errors (a .pth holding a list, a
missing file) are one "error:" line and exit 1, never a traceback.

Exit 0 all passed, 1 a check failed, 77 skipped (no torch or torchvision).
"""

import importlib.util
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIP: needs torch, torchvision and numpy ({e})")
    sys.exit(77)

SEED = 20240611
N, C, H, W, CLASSES = 4, 3, 32, 32, 10
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
RTOL = ATOL = 1e-4

failures = 0


def check(ok, what, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures += 1
    return ok


def load_convert(source):
    """python/ringtrain/convert.py as a standalone module: the C extension is not needed (nor imported)."""
    path = os.path.join(source, "python", "ringtrain", "convert.py")
    spec = importlib.util.spec_from_file_location("ringtrain_convert_by_path", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path


def make_model(name, classes=CLASSES):
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(num_classes=classes)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(0.5 + torch.rand(c, generator=g))
                mod.bias.copy_(0.2 * torch.randn(c, generator=g))
                mod.running_mean.copy_(0.2 * torch.randn(c, generator=g))
                mod.running_var.copy_(0.5 + 1.5 * torch.rand(c, generator=g))
                mod.num_batches_tracked.fill_(int(torch.randint(1, 10000, (1,), generator=g)))
    return model.eval()


def torch_logits(model, images):
    mean = torch.tensor(MEAN).view(1, C, 1, 1)
    std = torch.tensor(STD).view(1, C, 1, 1)
    with torch.no_grad():
        return model((images.float() / 255 - mean) / std).numpy()


def run_logits(args, model, path, images_path, classes=CLASSES, reset_head=False):
    """(exit code, logits or None, stderr) of rt_init_logits."""
    cmd = [args.init_logits, model, path, images_path, str(N), str(C), str(H), str(W), str(classes),
           ",".join(map(str, MEAN)), ",".join(map(str, STD))] + (["--reset-head"] if reset_head else [])
    p = subprocess.run(cmd, capture_output=True)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 0:
        return p.returncode, None, err
    out = np.frombuffer(p.stdout, dtype=np.float32)
    if out.size != N * classes:
        return p.returncode, None, err + f"\n(stdout held {out.size} floats, expected {N * classes})"
    return 0, out.reshape(N, classes), err


def compare_all(args, model, cases, images_path):
    """cases: [(what, path, reference logits)], loaded one after the other by one rt_init_logits."""
    cmd_path = ",".join(path for _, path, _ in cases)
    cmd = [args.init_logits, model, cmd_path, images_path, str(N), str(C), str(H), str(W), str(CLASSES),
           ",".join(map(str, MEAN)), ",".join(map(str, STD))]
    p = subprocess.run(cmd, capture_output=True)
    err = p.stderr.decode(errors="replace")
    out = np.frombuffer(p.stdout, dtype=np.float32)
    for k, (what, _, ref) in enumerate(cases):
        if p.returncode != 0 or out.size != len(cases) * N * CLASSES:
            check(False, what, f"rt_init_logits exit {p.returncode}, {out.size} floats: {err.strip()}")
            continue
        compare(what, out[k * N * CLASSES:(k + 1) * N * CLASSES].reshape(N, CLASSES), ref)


def compare(what, got, ref):
    diff = np.abs(got.astype(np.float64) - ref)
    bad = diff > ATOL + RTOL * np.abs(ref)
    detail = (f"{N}x{CLASSES} logits, worst |diff| {diff.max():.2e} (logits up to {np.abs(ref).max():.3g}; "
              f"rtol {RTOL:g}, atol {ATOL:g})")
    if bad.any():
        i, j = np.argwhere(bad)[0]
        detail += f"; {int(bad.sum())} outside, first [{i}, {j}]: ringtrain {got[i, j]:.7g}, PyTorch {ref[i, j]:.7g}"
    return check(not bad.any(), what, detail)


def run_cli(conv_path, *argv):
    # One thread: a conversion is I/O and copies, and torch's thread pool only adds CPU time on a small machine.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, conv_path, *argv], capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def cli_convert(what, conv_path, src, dst):
    rc, out, err = run_cli(conv_path, src, dst)
    ok = rc == 0 and out.startswith(f"wrote {dst}:") and out.count("\n") == 1
    check(ok, f"{what}: convert.py by path", out.strip() if ok else f"exit {rc}: {out.strip()} {err.strip()}")
    return ok, out


def parity(args, conv, conv_path, tmp, name, images, images_path):
    """The command line (by path, a subprocess: torch's import is most of its second) converts resnet18's
    files; resnet50's go through convert.convert(), the same code in this process."""
    model = make_model(name)
    ref = torch_logits(model, images).astype(np.float64)
    sd = model.state_dict()
    cases = []

    # a. save_safetensors from a script
    path = os.path.join(tmp, f"{name}-a.safetensors")
    conv.save_safetensors(sd, path)
    cases.append((f"{name} a (save_safetensors)", path, ref))

    def converted(what, pth, path):
        if name != "resnet18":
            return True, conv.convert(pth, path)
        return cli_convert(what, conv_path, pth, path)

    # b. torch.save(state_dict) -> the converter
    pth = os.path.join(tmp, f"{name}.pth")
    torch.save(sd, pth)
    path = os.path.join(tmp, f"{name}-b.safetensors")
    if converted(f"{name} b", pth, path)[0]:
        cases.append((f"{name} b (.pth state_dict, convert.py)", path, ref))

    # c. a DDP script's checkpoint: the state_dict under "state_dict", every name with "module."
    pth = os.path.join(tmp, f"{name}-ddp.pth")
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, pth)
    path = os.path.join(tmp, f"{name}-c.safetensors")
    ok, out = converted(f"{name} c", pth, path)
    if ok:
        note = out[out.rfind(" ("):].strip()
        check("'state_dict'" in note and "'module.'" in note, f"{name} c: the line names the entry and the prefix",
              note)
        cases.append((f"{name} c (DDP checkpoint, convert.py)", path, ref))

    if name == "resnet18":
        # d. half precision: F16 in the file, PyTorch's fp32 logits of the same rounded weights as reference
        half = model.half()
        path = os.path.join(tmp, f"{name}-d.safetensors")
        conv.save_safetensors(half.state_dict(), path)
        ref16 = torch_logits(half.float(), images).astype(np.float64)
        cases.append((f"{name} d (F16 state_dict)", path, ref16))
    compare_all(args, name, cases, images_path)


def shape_text(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


def lines_naming(err, name):
    return [ln.replace(" ", "") for ln in err.splitlines() if f" {name} " in f" {ln} "]


def mismatches(args, conv, tmp, images_path):
    model = make_model("resnet18")
    sd = dict(model.state_dict())
    del sd["layer1.0.bn1.running_var"]
    w = sd["layer2.0.conv1.weight"]
    sd["layer2.0.conv1.weight"] = w.transpose(0, 1).contiguous()
    sd["layer1.0.bn1.extra"] = torch.ones(64)
    path = os.path.join(tmp, "resnet18-bad.safetensors")
    conv.save_safetensors(sd, path)
    rc, _, err = run_logits(args, "resnet18", path, images_path)
    missing = lines_naming(err, "layer1.0.bn1.running_var")
    transposed = lines_naming(err, "layer2.0.conv1.weight")
    extra = lines_naming(err, "layer1.0.bn1.extra")
    ok = (rc == 2 and any("missing" in ln and "[64]" in ln for ln in missing)
          and any(shape_text(w.shape) in ln and shape_text(w.transpose(0, 1).shape) in ln for ln in transposed)
          and any("[64]" in ln for ln in extra))
    check(ok, "resnet18: a file with a tensor dropped, one transposed and one extra is refused naming all three",
          f"exit {rc}" if ok else f"exit {rc}, stderr:\n{err}")

    big = make_model("resnet18", classes=1000)
    path = os.path.join(tmp, "resnet18-1000.safetensors")
    conv.save_safetensors(big.state_dict(), path)
    rc, _, err = run_logits(args, "resnet18", path, images_path)
    fc_w, fc_b = lines_naming(err, "fc.weight"), lines_naming(err, "fc.bias")
    ok = (rc == 2 and any("[1000,512]" in ln and "[10,512]" in ln for ln in fc_w)
          and any("[1000]" in ln and "[10]" in ln for ln in fc_b))
    check(ok, "resnet18: a 1000-class file into a 10-class model is refused naming fc.weight and fc.bias",
          f"exit {rc}" if ok else f"exit {rc}, stderr:\n{err}")
    rc, got, err = run_logits(args, "resnet18", path, images_path, reset_head=True)
    ok = rc == 0 and got is not None and bool(np.isfinite(got).all())
    check(ok, "resnet18: the 1000-class file loads with --reset-head, finite logits",
          err.strip() if ok else f"exit {rc}, stderr:\n{err}")


def frozen_training(args, conv, tmp, images, images_path):
    """One training step with layers frozen the way a PyTorch user freezes them -- requires_grad_(False) on their
    parameters and .eval() on those modules, the rest in training mode -- against ringtrain's --freeze (the
    same globs, rt_init_logits --freeze --grads). The trainable parameters' gradients, the train-mode logits and
    every batchnorm buffer after the step equal PyTorch's; the frozen layers have no gradient, and their running
    statistics and num_batches_tracked are unchanged. Two sets: a frozen middle (gradients flow through layer2's
    frozen convolutions and eval-mode batchnorms to layer1; bn1 trains after a frozen conv1) and the prefix a
    fine-tuning run freezes (backward stops at layer2)."""
    import fnmatch
    import torch.nn.functional as F
    path = os.path.join(tmp, "resnet18-train.safetensors")
    conv.save_safetensors(make_model("resnet18").state_dict(), path)
    before = {k: v.clone() for k, v in make_model("resnet18").state_dict().items()}
    x = (images.float() / 255 - torch.tensor(MEAN).view(1, C, 1, 1)) / torch.tensor(STD).view(1, C, 1, 1)
    labels = torch.arange(N) % CLASSES
    for globs in ("conv1.*,layer2.*", "conv1.*,bn1.*,layer1.*"):
        pats = globs.split(",")
        model = make_model("resnet18")
        model.train()
        frozen = []
        for name, mod in model.named_modules():
            own = list(mod.named_parameters(recurse=False))
            if own and all(any(fnmatch.fnmatchcase(f"{name}.{pn}", g) for g in pats) for pn, _ in own):
                frozen.append(name)
                mod.eval()
                for prm in mod.parameters(recurse=False):
                    prm.requires_grad_(False)
        logits = model(x)
        F.cross_entropy(logits, labels).backward()
        out = os.path.join(tmp, "grads.safetensors")
        cmd = [args.init_logits, "resnet18", path, images_path, str(N), str(C), str(H), str(W), str(CLASSES),
               ",".join(map(str, MEAN)), ",".join(map(str, STD)), "--freeze", globs, "--grads", out]
        p = subprocess.run(cmd, capture_output=True)
        if p.returncode != 0:
            check(False, f"training step with --freeze '{globs}'", p.stderr.decode(errors="replace"))
            continue
        got = {k: v.double() for k, v in conv.load_state_dict(out).items()}
        worst, bad = 0.0, []
        for name, prm in model.named_parameters():
            key = name + ".grad"
            if not prm.requires_grad:
                if key in got:
                    bad.append(f"{key} present for a frozen layer")
                continue
            if key not in got:
                bad.append(f"{key} missing")
                continue
            ref = prm.grad.double()
            err = float((got[key] - ref).abs().max()) / (float(ref.abs().max()) + 1e-12)
            worst = max(worst, err)
            if err > 1e-3:
                bad.append(f"{key} relative error {err:.2e}")
        err_l = float((got["logits"] - logits.detach().double()).abs().max())
        if err_l > ATOL + RTOL * float(logits.detach().abs().max()):
            bad.append(f"logits differ by {err_l:.2e}")
        sd = model.state_dict()
        for name, buf in sd.items():
            if not name.endswith(("running_mean", "running_var", "num_batches_tracked")):
                continue
            layer = name.rsplit(".", 1)[0]
            if layer in frozen and not torch.equal(buf, before[name]):
                bad.append(f"PyTorch changed frozen {name}")  # the reference itself must keep them
            if layer in frozen and not torch.equal(got[name].to(buf.dtype), before[name]):
                bad.append(f"{name} of a frozen layer changed")
            if name.endswith("num_batches_tracked"):
                if int(got[name]) != int(buf):
                    bad.append(f"{name} {int(got[name])}, PyTorch {int(buf)}")
            elif float((got[name] - buf.double()).abs().max()) > 1e-5 * (1 + float(buf.abs().max())):
                bad.append(f"{name} differs from PyTorch's")
        check(not bad, f"resnet18, one training step with --freeze '{globs}' as requires_grad_(False) + .eval()",
              f"{len(frozen)} layers frozen; trainable gradients within {worst:.1e} (relative to each tensor's "
              f"largest), logits and running statistics as PyTorch's, the frozen ones' untouched"
              if not bad else "; ".join(bad[:6]))


def converter_errors(conv, conv_path, tmp):
    """A .pth holding a list through the command line; a missing file through its main() in this process."""
    listed = os.path.join(tmp, "list.pth")
    torch.save([torch.zeros(3)], listed)

    def in_process(*argv):
        import contextlib
        import io
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = conv.main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    for what, src, run in (("a .pth holding a list", listed, lambda *a: run_cli(conv_path, *a)),
                           ("a missing file", os.path.join(tmp, "nothing.pth"), in_process)):
        rc, out, err = run(src, os.path.join(tmp, "never.safetensors"))
        lines = err.strip().splitlines()
        ok = (rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and src in lines[0]
              and "Traceback" not in err and not out)
        check(ok, f"convert.py on {what}: exit 1, one error line", lines[0] if ok else f"exit {rc}: {out}{err}")
    check(not os.path.exists(os.path.join(tmp, "never.safetensors")), "convert.py wrote nothing on an error")


def main():
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 1

    class Args:
        init_logits, ringtrain = sys.argv[1], sys.argv[2]

    source = os.environ.get("RT_SOURCE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    conv, conv_path = load_convert(source)
    torch.set_num_threads(1)  # batches of 4 at 32x32: more threads cost CPU time, not wall time
    check("_ringtrain" not in " ".join(sys.modules), "convert.py loads without the C extension")
    print(f"seed {SEED}; torch {torch.__version__}, torchvision {torchvision.__version__}", flush=True)

    g = torch.Generator().manual_seed(SEED)
    images = torch.randint(0, 256, (N, C, H, W), dtype=torch.uint8, generator=g)
    with tempfile.TemporaryDirectory(prefix="test_init_torch.") as tmp:
        images_path = os.path.join(tmp, "images.u8")
        with open(images_path, "wb") as f:
            f.write(images.numpy().tobytes())
        for name in ("resnet18", "resnet50"):
            parity(Args, conv, conv_path, tmp, name, images, images_path)
        mismatches(Args, conv, tmp, images_path)
        frozen_training(Args, conv, tmp, images, images_path)
        converter_errors(conv, conv_path, tmp)
    print(f"{'FAIL' if failures else 'PASS'}: {failures} checks failed" if failures else "PASS: all checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
