#!/usr/bin/python3
"""torch_train.py - the PyTorch side of bench/train_vs_pytorch.sh.

Trains ringtrain's models as PyTorch defines them (tools/reference_models.py,
build(name, C, H, W, classes)) on the CPU, fp32, in two modes:

  compute  forward + backward + optimizer step on one fixed synthetic batch:
           a random uint8 (B,3,32,32) batch and random labels made once, then
           per step what a real pipeline does to a uint8 batch,
           (x.float() / 255 - mean) / std, the forward pass,
           CrossEntropyLoss, zero_grad(set_to_none=True), backward,
           SGD(lr 0.01, momentum 0.9, nesterov False, weight_decay 5e-4).step().
           --warmup steps (default 3) untimed, then --steps timed. Also counts
           the model's training FLOPs per image (below).
  tta      time to accuracy on a CIFAR-10-format dataset (the binary version:
           DIR/data_batch_*.bin and DIR/test_batch.bin, per record 1 label byte
           + 3072 bytes, the R, G, B 32x32 planes), the recipe of
           `ringtrain train --schedule cosine`: per-channel mean/std over the
           train set; each epoch a new permutation, drop_last; random crop 32
           with 4-pixel zero padding + random horizontal flip done on uint8
           tensors by one advanced-indexing gather per batch (bench/
           torch_loader.py's "tensor" way); SGD lr --lr momentum 0.9
           weight_decay 5e-4; CosineAnnealingLR(T_max = epochs x steps per
           epoch) stepped every step; after each epoch an eval of the test set
           in eval mode; stops once test accuracy >= --target-accuracy.
           time_s is wall time from before reading the data files to the end
           (reading, statistics, training, evals; not the Python start-up or
           `import torch`), as ringtrain's time_s runs from the start of
           `train` to its end.
  flops    prints the training FLOPs per image of each --model (a comma-separated
           list), one JSON line each; no training.

FLOPs: forward multiply-adds of every Conv2d and Linear layer, counted with
forward hooks on one forward pass, x 2 (a multiply-add is 2 FLOPs) x 3
(backward costs about twice the forward: input and weight gradients). Batch
norm, activations, pooling, the loss and the optimizer are not counted.

Each run prints a human summary on stderr and, last on stdout, one line holding
one JSON object ({"mode", "model", "images_per_s", ...} or {"mode": "tta",
"time_s", "epochs", "val_acc", ...}).

Usage:
  torch_train.py check
  torch_train.py compute --model M [--batch-size B] [--threads T] [--steps N]
                         [--warmup W]
  torch_train.py tta --data DIR [--model M] [--epochs E] [--batch-size B]
                     [--lr LR] [--target-accuracy A] [--threads T] [--seed S]
  torch_train.py flops --model M[,M...]
"""
import argparse
import glob
import json
import os
import sys
import time

RECORD = 1 + 3 * 32 * 32
here = os.path.dirname(os.path.abspath(__file__))


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def reference_models():
    sys.path.insert(0, os.path.join(here, "..", "tools"))
    import reference_models
    return reference_models


def train_flops_per_image(model, c, h, w):
    """Training FLOPs per image: 2 x 3 x forward multiply-adds of Conv2d and Linear."""
    import torch
    import torch.nn as nn

    macs = [0]

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
            macs[0] += out.numel() // out.shape[0] * k
        elif isinstance(m, nn.Linear):
            macs[0] += out.numel() // out.shape[0] * m.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, c, h, w))
    model.train(was_training)
    for x in hs:
        x.remove()
    return 6 * macs[0], macs[0]


def make_optimizer(torch, model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=False, weight_decay=5e-4)


def synthetic_step(torch, model, opt, batch_size, seed):
    """The step `ringtrain train --synthetic-data` times: one fixed random uint8
    batch (3x32x32, 10 classes), normalised every step with ringtrain's defaults
    for data without statistics, cross-entropy, backward, optimizer step.
    Returns the step function (it returns the loss)."""
    crit = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)
    xb = torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, generator=g)
    yb = torch.randint(0, 10, (batch_size,), dtype=torch.int64, generator=g)
    mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1)

    def step():
        x = (xb.float() / 255 - mean) / std
        loss = crit(model(x), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def bench_compute(a):
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rm = reference_models()
    model = rm.build(a.model, 3, 32, 32, 10)
    flops, macs = train_flops_per_image(model, 3, 32, 32)
    model.train()
    opt = make_optimizer(torch, model, 0.01)
    step = synthetic_step(torch, model, opt, a.batch_size, a.seed)

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = time.perf_counter() - t0
    loss = float(loss)
    if loss != loss:
        sys.exit("torch_train.py: %s: the loss is NaN" % a.model)
    ips = a.steps * a.batch_size / secs
    return {"mode": "compute", "model": a.model, "batch_size": a.batch_size, "threads": torch.get_num_threads(),
            "steps": a.steps, "warmup": a.warmup, "images": a.steps * a.batch_size, "seconds": secs,
            "images_per_s": ips, "train_flops_per_image": flops, "forward_macs_per_image": macs,
            "gflops_per_s": ips * flops / 1e9, "loss": loss,
            "note": "%d steps after %d warm-up, %d threads, %.2f GFLOP/s"
                    % (a.steps, a.warmup, torch.get_num_threads(), ips * flops / 1e9)}


def read_records(paths):
    import numpy as np

    parts = []
    for path in paths:
        r = np.fromfile(path, dtype=np.uint8)
        if r.size == 0 or r.size % RECORD:
            sys.exit("torch_train.py: %s: %d bytes, not a multiple of %d" % (path, r.size, RECORD))
        parts.append(r.reshape(-1, RECORD))
    rec = np.concatenate(parts)
    return np.ascontiguousarray(rec[:, 1:]), rec[:, 0].astype(np.int64)


def bench_tta(a):
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t_start = time.perf_counter()
    train_files = sorted(glob.glob(os.path.join(a.data, "data_batch_*.bin")))
    test_file = os.path.join(a.data, "test_batch.bin")
    if not train_files or not os.path.isfile(test_file):
        sys.exit("torch_train.py: %s holds no data_batch_*.bin or no test_batch.bin" % a.data)
    xtr, ytr = read_records(train_files)
    xte, yte = read_records([test_file])
    xtr = torch.from_numpy(xtr).view(-1, 3, 32, 32)
    ytr = torch.from_numpy(ytr)
    xte = torch.from_numpy(xte).view(-1, 3, 32, 32)
    yte = torch.from_numpy(yte)
    n, B = xtr.shape[0], a.batch_size
    if n < B:
        sys.exit("torch_train.py: %d training records: fewer than one batch of %d" % (n, B))
    # Per-channel statistics of the train set, pixels scaled to [0, 1].
    f = xtr.permute(1, 0, 2, 3).reshape(3, -1).double() / 255
    mean = f.mean(1).float().view(1, 3, 1, 1)
    std = f.std(1, unbiased=False).float().view(1, 3, 1, 1)
    del f
    # Padded by 4 once, with a mirrored copy: (2N,3,40,40); crops is the
    # (2N,3,9,9,32,32) view whose [i, c, dy, dx] is image i's crop at (dy, dx).
    padded = torch.nn.functional.pad(xtr, (4, 4, 4, 4))
    both = torch.cat([padded, padded.flip(3)])
    del padded
    crops = both.unfold(2, 32, 1).unfold(3, 32, 1)

    rm = reference_models()
    model = rm.build(a.model, 3, 32, 32, int(max(int(ytr.max()), int(yte.max())) + 1))
    crit = torch.nn.CrossEntropyLoss()
    opt = make_optimizer(torch, model, a.lr)
    steps_per_epoch = n // B
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * steps_per_epoch)
    setup_s = time.perf_counter() - t_start

    def evaluate():
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, xte.shape[0], 500):
                x = (xte[s:s + 500].float() / 255 - mean) / std
                correct += int((model(x).argmax(1) == yte[s:s + 500]).sum())
        model.train()
        return correct / xte.shape[0]

    history = []
    acc = best = 0.0
    train_s = eval_s = 0.0
    epochs = 0
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n)
        flip = torch.randint(0, 2, (n,))
        dy = torch.randint(0, 9, (n,))
        dx = torch.randint(0, 9, (n,))
        loss_sum = 0.0
        for s in range(0, steps_per_epoch * B, B):
            idx = perm[s:s + B]
            # Mirroring the padded image and cropping at dx equals cropping at
            # 8 - dx and mirroring the crop: RandomCrop(32, 4) + RandomHorizontalFlip.
            xb = crops[idx + n * flip[s:s + B], :, dy[s:s + B], dx[s:s + B]]
            x = (xb.float() / 255 - mean) / std
            loss = crit(model(x), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += float(loss)
        t1 = time.perf_counter()
        acc = evaluate()
        t2 = time.perf_counter()
        train_s += t1 - t0
        eval_s += t2 - t1
        epochs = epoch + 1
        best = max(best, acc)
        history.append({"epoch": epochs, "train_loss": loss_sum / steps_per_epoch, "val_acc": acc,
                        "train_s": t1 - t0, "eval_s": t2 - t1})
        print("  epoch %d: train loss %.4f, test acc %.4f, %.1f s train + %.1f s eval"
              % (epochs, loss_sum / steps_per_epoch, acc, t1 - t0, t2 - t1), file=sys.stderr)
        if a.target_accuracy is not None and acc >= a.target_accuracy:
            break
    time_s = time.perf_counter() - t_start
    reached = a.target_accuracy is not None and acc >= a.target_accuracy
    return {"mode": "tta", "model": a.model, "batch_size": B, "threads": torch.get_num_threads(), "lr": a.lr,
            "train_records": n, "test_records": int(xte.shape[0]), "steps_per_epoch": steps_per_epoch,
            "planned_epochs": a.epochs, "epochs": epochs, "steps": epochs * steps_per_epoch,
            "target_accuracy": a.target_accuracy, "reached": reached, "val_acc": acc, "best_val_acc": best,
            "time_s": time_s, "setup_s": setup_s, "train_time_s": train_s, "eval_time_s": eval_s,
            "images_per_s": epochs * steps_per_epoch * B / train_s if train_s > 0 else 0,
            "mean": [round(float(v), 6) for v in mean.flatten()], "std": [round(float(v), 6) for v in std.flatten()],
            "history": history,
            "note": "%s after %d epoch(s), test acc %.4f, %.1f s (%.1f s setup, %.1f s train, %.1f s eval)"
                    % ("target reached" if reached else "target NOT reached", epochs, acc, time_s, setup_s,
                       train_s, eval_s)}


def check():
    """Exit 0 when torch, torchvision, numpy and tools/reference_models.py import; prints versions."""
    missing = []
    versions = {}
    for mod in ("torch", "torchvision", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:  # ImportError, or a broken install
            missing.append("%s (%s)" % (mod, e.__class__.__name__))
    if missing:
        print("missing: " + ", ".join(missing))
        return 1
    try:
        reference_models()
    except Exception as e:
        print("tools/reference_models.py does not import: %s: %s" % (e.__class__.__name__, e))
        return 1
    import torch
    print(" ".join("%s %s" % kv for kv in versions.items())
          + (" (oneDNN)" if torch.backends.mkldnn.is_available() else ""))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Modes: compute, tta, flops, check (see the module docstring).")
    p.add_argument("mode", choices=["check", "compute", "tta", "flops"])
    p.add_argument("--model", default="mnist-net", help="mnist-net, resnet18, resnet9, wrn-D-K (default mnist-net)")
    p.add_argument("--data", help="tta: directory holding data_batch_*.bin and test_batch.bin")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=cpu_count(), help="torch threads (default: the CPUs usable)")
    p.add_argument("--steps", type=int, default=20, help="compute: timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="compute: untimed steps first (default 3)")
    p.add_argument("--epochs", type=int, default=10, help="tta: planned epochs, the cosine's length (default 10)")
    p.add_argument("--lr", type=float, default=0.05, help="tta: peak learning rate (default 0.05)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="tta: stop once test accuracy >= A (0..1 or a percentage)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.mode == "check":
        return check()
    if a.batch_size < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.epochs < 1 or a.lr <= 0:
        p.error("--batch-size, --threads, --steps, --epochs must be >= 1, --warmup >= 0, --lr > 0")
    if a.target_accuracy is not None and a.target_accuracy > 1:
        a.target_accuracy /= 100
    if a.mode == "flops":
        rm = reference_models()
        for name in a.model.split(","):
            try:
                model = rm.build(name, 3, 32, 32, 10)
            except ValueError as e:
                sys.exit("torch_train.py: %s" % e)
            flops, macs = train_flops_per_image(model, 3, 32, 32)
            print(json.dumps({"mode": "flops", "model": name, "train_flops_per_image": flops,
                              "forward_macs_per_image": macs}))
        return 0
    if a.mode == "tta" and not a.data:
        p.error("tta needs --data DIR")
    result = bench_compute(a) if a.mode == "compute" else bench_tta(a)
    if a.mode == "compute":
        print("%-10s %-10s %9.1f images/s  (%d images in %.2f s)  %s" % (
            "compute", a.model, result["images_per_s"], result["images"], result["seconds"], result["note"]),
            file=sys.stderr)
    else:
        print("tta        %-10s %s" % (a.model, result["note"]), file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
