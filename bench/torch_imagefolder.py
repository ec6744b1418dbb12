#!/usr/bin/python3
"""torch_imagefolder.py - the torchvision side of bench/folder_vs_torchvision.sh
(run mode) and of bench/gpu_vs_pytorch.sh --only folder (train mode).

How fast torchvision's standard ImageNet training input pipeline turns a folder
of variable-size JPEGs into batches on this machine (CPU only, no model):

  torchvision.datasets.ImageFolder(root, transform=Compose([
      RandomResizedCrop(S), RandomHorizontalFlip(), PILToTensor()]))
  DataLoader(batch_size=B, shuffle=True, num_workers=W,
             persistent_workers=W > 0, drop_last=True)

Each item is opened and fully decoded by Pillow (ImageFolder's default loader:
Image.open + convert("RGB"), no draft mode), cropped and resized with Pillow's
antialiased bilinear filter (RandomResizedCrop's default), flipped, and turned
into a uint8 (3,S,S) tensor; the default collate stacks B of them. Batches are
uint8 (B,3,S,S), the same as ringtrain's batch slot: PILToTensor instead of the
recipe's ToTensor + Normalize, so that neither side pays for a float
conversion the other skips (normalizing is the device's job in both).

Timing: after the warm-up batches, the clock runs over the next K batches
(default 20), crossing epoch ends as training would (persistent workers; the
sampler reshuffles). Warm-up (default auto): 2 x num_workers + 2 batches,
because the workers prefetch 2 batches each (prefetch_factor) while starting
up; a warm-up shorter than that backlog would count batches made before the
clock started (W=4 and 3 warm-up batches read 10x too fast over 2 batches).
The page cache is assumed warm (the driver reads the folder first).

--workers all tries num_workers = 0, 1, 2, 3, 4 in turn and reports the best
(the issue asks for the best num_workers); --workers N runs one.

Output: per run, a human line on stderr and one JSON object on stdout:
  {"mode": "imagefolder", "image_size", "workers", "batch_size", "images",
   "seconds", "images_per_s", ...}
With --workers all, a last line {"mode": "imagefolder_best", "workers": the
best, "images_per_s": its rate, "tried": {"0": img/s, ...}} follows.

The train mode (bench/gpu_vs_pytorch.sh --only folder) is the same folder fed
to a training step, PyTorch's usual ImageNet recipe end to end:

  ImageFolder(root, Compose([RandomResizedCrop(S), RandomHorizontalFlip(),
                             ToTensor(), Normalize(ImageNet mean, std)]))
  DataLoader(batch_size=B, shuffle=True, num_workers=W, pin_memory=True on a GPU,
             persistent_workers=W > 0, drop_last=True)
  model (bench/torch_train.py's reference models: resnet50 is torchvision's) with
  as many classes as the folder has, channels_last with --amp bf16/fp16,
  torch.autocast around forward + loss, CrossEntropyLoss, SGD lr 0.1 momentum
  0.9 weight decay 5e-4; batches copied with non_blocking=True; each step's
  loss read one step late (as ringtrain reads its losses: the host never
  waits for the step it has just queued).

Timing: the first epoch is untimed (workers starting, cudnn.benchmark's
search); then whole epochs are timed until at least --seconds have passed and
--min-epochs are done, or the clock is stopped mid-epoch at --max-seconds.
images/s = timed images / timed wall; the data wait is the time spent in the
loader's next() (and the copy's launch) per step, as a share of the timed wall.
Output: one JSON object on stdout, {"mode": "imagefolder_train", "images_per_s",
"data_wait_frac", "timed_epochs", "seconds", "settings", ...}.

Usage:
  torch_imagefolder.py check
  torch_imagefolder.py run --data ROOT --image-size S [--batch-size 64]
                           [--workers all|N] [--batches 20] [--warmup W] [--seed 0]
  torch_imagefolder.py train --data ROOT --model NAME --image-size S
                           [--batch-size 256] [--workers N] [--device cuda|cpu]
                           [--amp off|bf16|fp16] [--seconds 20] [--min-epochs 2]
                           [--max-seconds 60] [--threads T] [--seed 0]
"""
import argparse
import json
import os
import sys
import time

TRY_WORKERS = (0, 1, 2, 3, 4)


def bench_one(a, workers):
    import warnings

    import torch
    import torchvision
    import torchvision.transforms as T

    # --workers all tries more workers than CPUs on purpose: the DataLoader's warning says so.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.manual_seed(a.seed)
    transform = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(a.data, transform=transform)
    if len(ds) < a.batch_size:
        sys.exit("torch_imagefolder.py: %s holds %d images, fewer than one batch of %d"
                 % (a.data, len(ds), a.batch_size))
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0, drop_last=True)
    warmup = a.warmup if a.warmup >= 0 else 2 * workers + 2
    seen = timed = 0
    t0 = time.perf_counter() if warmup == 0 else None
    t_start = time.perf_counter()
    x = None
    while timed < a.batches:
        for x, _ in loader:
            seen += 1
            if seen <= warmup:
                if seen == warmup:
                    t0 = time.perf_counter()
                continue
            timed += 1
            if timed == a.batches:
                break
    t1 = time.perf_counter()
    assert x.dtype == torch.uint8 and tuple(x.shape) == (a.batch_size, 3, a.image_size, a.image_size)
    images = timed * a.batch_size
    del loader  # stops persistent workers before the next setting starts its own
    return {"mode": "imagefolder", "image_size": a.image_size, "workers": workers,
            "batch_size": a.batch_size, "images": images, "seconds": t1 - t0,
            "images_per_s": images / (t1 - t0), "warmup_batches": warmup,
            "startup_s": t0 - t_start, "dataset_images": len(ds), "classes": len(ds.classes),
            "torch_threads": torch.get_num_threads(), "cpus": len(os.sched_getaffinity(0))}


def bench_train(a):
    """The train mode: end-to-end images/s of a training step fed by ImageFolder + DataLoader."""
    import warnings

    import torch
    import torchvision
    import torchvision.transforms as T

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_train

    warnings.filterwarnings("ignore", message="This DataLoader will create")
    why = torch_train.precision_problem(torch, a.device, a.amp)
    if why:
        sys.exit("torch_imagefolder.py: %s" % why)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    transform = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.data, transform=transform)
    if len(ds) < a.batch_size:
        sys.exit("torch_imagefolder.py: %s holds %d images, fewer than one batch of %d"
                 % (a.data, len(ds), a.batch_size))
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                         pin_memory=cuda, persistent_workers=a.workers > 0, drop_last=True)
    prec = torch_train.Precision(torch, a.device, a.amp)
    classes = len(ds.classes)
    model = prec.model(torch_train.reference_models().build(a.model, 3, a.image_size, a.image_size, classes))
    opt = torch_train.make_optimizer(torch, model, 0.1)
    crit = torch.nn.CrossEntropyLoss()
    model.train()
    state = {"wait": 0.0, "steps": 0, "loss": None}

    def epoch(clock_start=None):
        """One pass (or until --max-seconds after clock_start); True when stopped by it."""
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                return False
            x = prec.batch(x.to(prec.device, non_blocking=True))
            y = y.to(prec.device, non_blocking=True)
            state["wait"] += time.perf_counter() - t0
            with prec.autocast():
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True)
            prec.backward_step(loss, opt)
            prev, state["loss"] = state["loss"], loss.detach()
            if prev is not None:
                prev.item()  # the step before's loss: waits for it, while this step stays queued
            state["steps"] += 1
            if clock_start is not None and time.perf_counter() - clock_start >= a.max_seconds:
                return True

    t_start = time.perf_counter()
    epoch()  # untimed: workers start, cudnn.benchmark searches
    prec.sync()
    warm = time.perf_counter() - t_start
    state.update(wait=0.0, steps=0)
    epochs = 0
    t0 = time.perf_counter()
    while True:
        cut = epoch(t0)
        if cut:
            break
        epochs += 1
        if time.perf_counter() - t0 >= a.seconds and epochs >= a.min_epochs:
            break
    prec.sync()
    secs = time.perf_counter() - t0
    per_epoch = (len(ds) // a.batch_size) * a.batch_size
    images = state["steps"] * a.batch_size  # drop_last: every batch is whole
    loss = torch_train.finite_loss(state["loss"], a.model)
    r = {"mode": "imagefolder_train", "model": a.model, "image_size": a.image_size, "batch_size": a.batch_size,
         "workers": a.workers, "amp": a.amp, "device": a.device, "classes": classes, "dataset_images": len(ds),
         "warmup_epoch_s": warm, "timed_epochs": images / float(per_epoch),
         "cut_at_max_seconds": bool(cut), "steps": state["steps"], "images": images, "seconds": secs,
         "images_per_s": images / secs, "data_wait_frac": state["wait"] / secs,
         "data_wait_ms_per_step": 1e3 * state["wait"] / max(1, state["steps"]),
         "step_ms": 1e3 * secs / max(1, state["steps"]), "loss": loss, "pin_memory": cuda,
         "persistent_workers": a.workers > 0, "settings": torch_train.torch_settings(torch, prec),
         "cpus": len(os.sched_getaffinity(0))}
    del loader
    print("imagefolder train %s S=%d B=%d num_workers=%d %s: %7.1f images/s end to end, data wait %.1f %% "
          "(%.2f epochs, %d images in %.1f s after a %.1f s warm-up epoch)"
          % (a.model, a.image_size, a.batch_size, a.workers, prec.describe(), r["images_per_s"],
             100 * r["data_wait_frac"], r["timed_epochs"], images, secs, warm), file=sys.stderr)
    print(json.dumps(r), flush=True)
    return 0


def report(r):
    print("imagefolder S=%d num_workers=%d: %7.0f images/s  (%d images in %.2f s after %d warm-up batches)"
          % (r["image_size"], r["workers"], r["images_per_s"], r["images"], r["seconds"], r["warmup_batches"]),
          file=sys.stderr)
    print(json.dumps(r), flush=True)


def check():
    """Exit 0 when torch, torchvision and PIL import; prints their versions and Pillow's JPEG library."""
    try:
        import PIL
        import torch
        import torchvision
        from PIL import features
    except Exception as e:  # ImportError, or a broken install
        print("missing: %s (%s)" % (getattr(e, "name", None) or e, e.__class__.__name__))
        return 1
    turbo = features.check_feature("libjpeg_turbo")
    print("torch %s torchvision %s Pillow %s (%s)" % (torch.__version__, torchvision.__version__, PIL.__version__,
                                                      "libjpeg-turbo, jpeglib %s" % features.version("jpg") if turbo else
                                                      "libjpeg %s" % features.version("jpg")))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["check", "run", "train"])
    p.add_argument("--data", help="image folder ROOT/<class>/<file>")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="all", help="all (tries %s, reports the best) or N"
                   % ",".join(map(str, TRY_WORKERS)))
    p.add_argument("--batches", type=int, default=20, help="timed batches")
    p.add_argument("--warmup", type=int, default=-1,
                   help="untimed batches at the start (default: 2 x num_workers + 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="resnet50", help="train: reference model (default resnet50)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="train (default cuda)")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="bf16", help="train (default bf16)")
    p.add_argument("--seconds", type=float, default=20.0, help="train: timed seconds at least (default 20)")
    p.add_argument("--min-epochs", type=int, default=2, help="train: timed epochs at least (default 2)")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="train: stop the clock mid-epoch after this long (default 60)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="train: the main process's torch threads (default: the CPUs usable)")
    a = p.parse_args()
    if a.mode == "check":
        return check()
    if not a.data:
        p.error("--data is required")
    if a.mode == "train":
        try:
            a.workers = int(a.workers)
        except ValueError:
            a.workers = -1
        if a.workers < 0 or a.batch_size < 1 or a.image_size < 1 or a.seconds <= 0 or a.max_seconds <= 0:
            p.error("train: --workers >= 0, --batch-size, --image-size >= 1, --seconds, --max-seconds > 0")
        return bench_train(a)
    if a.image_size < 1 or a.batch_size < 1 or a.batches < 1 or a.warmup < -1:
        p.error("--image-size, --batch-size and --batches must be >= 1, --warmup >= 0")
    if a.workers == "all":
        tries = TRY_WORKERS
    else:
        try:
            tries = (int(a.workers),)
        except ValueError:
            tries = (-1,)
        if tries[0] < 0:
            p.error("--workers takes all or a number >= 0, not %r" % a.workers)
    results = []
    for w in tries:
        r = bench_one(a, w)
        report(r)
        results.append(r)
    if len(results) > 1:
        best = max(results, key=lambda r: r["images_per_s"])
        out = dict(best, mode="imagefolder_best",
                   tried={str(r["workers"]): round(r["images_per_s"], 1) for r in results})
        print("imagefolder S=%d: best num_workers=%d, %.0f images/s (tried %s)" % (
            a.image_size, best["workers"], best["images_per_s"],
            ", ".join("%d: %.0f" % (r["workers"], r["images_per_s"]) for r in results)), file=sys.stderr)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
