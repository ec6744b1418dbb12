#!/usr/bin/python3
"""torch_loader.py - the PyTorch side of bench/loader_vs_pytorch.sh.

Measures how fast plain PyTorch can produce augmented CIFAR-10 training batches
on this machine (CPU only, no model), in three ways:

  dataloader  torchvision's recipe: the train set held in memory as torchvision's
              CIFAR10 holds it (uint8 HWC numpy array, a PIL image per item),
              RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor(),
              Normalize(mean, std), a DataLoader with shuffle=True,
              drop_last=True, pin_memory=False, persistent_workers when
              num_workers > 0. Batches are float32 (B,3,32,32), normalized.
  tensor      the fastest plain-PyTorch way we know: the train set as one uint8
              tensor, zero-padded by 4 once up front and stored with a
              horizontally flipped copy, (2N,3,40,40); per epoch a random
              permutation, per batch one advanced-indexing gather over an
              unfold view picks image, flip and crop offset for all B images
              at once. Batches are uint8 (B,3,32,32), as ringtrain's are.
  preshift    the tensor way taken further by spending memory: 18 copies of
              the padded set (9 column offsets x flip) cropped to 32 columns,
              so each (image, channel) crop is 1024 contiguous bytes that are
              gathered as 128 int64. ~18x the dataset in RAM (3.5 GB for
              CIFAR-10); a reference point, not a way to train on big sets.

Each run prints a human summary on stderr and, last on stdout, one line holding
one JSON object: {"mode", "images", "seconds", "images_per_s", ...}.

Usage:
  torch_loader.py check
  torch_loader.py dataloader --data DIR --batch-size B --workers N
                             [--epochs E] [--warmup W] [--max-batches K]
  torch_loader.py tensor|preshift --data DIR --batch-size B [--epochs E]
                             [--warmup W] [--threads T]

DIR holds data_batch_1.bin .. data_batch_5.bin (CIFAR-10 binary: per record one
label byte, then 3072 bytes: the R, G and B 32x32 planes).

Timing: the clock starts after the first W batches of the first epoch (default
10: worker start-up, first page faults) and stops at the end of epoch E; images
counts the batches in between. --max-batches K stops after K timed batches
instead (used for num_workers=0, where a full epoch takes long).
"""
import argparse
import json
import os
import sys
import time

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
RECORD = 1 + 3 * 32 * 32


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def read_cifar10_train(root):
    """Returns (data uint8 (N,3072) R,G,B planes, labels list of int)."""
    import numpy as np

    parts = []
    for i in range(1, 6):
        path = os.path.join(root, "data_batch_%d.bin" % i)
        a = np.fromfile(path, dtype=np.uint8)
        if a.size == 0 or a.size % RECORD:
            sys.exit("torch_loader.py: %s: %d bytes, not a multiple of %d" % (path, a.size, RECORD))
        parts.append(a.reshape(-1, RECORD))
    rec = np.concatenate(parts)
    return rec[:, 1:], rec[:, 0].astype(np.int64).tolist()


class CIFAR10InMemory:
    """What torchvision.datasets.CIFAR10 does after loading: one uint8 (N,32,32,3)
    array (its reshape + transpose((0,2,3,1)) view of the CHW records), a PIL
    image per item, the transform applied to it."""

    def __init__(self, root, transform):
        data, self.targets = read_cifar10_train(root)
        self.data = data.reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        from PIL import Image

        img = Image.fromarray(self.data[index])
        return self.transform(img), self.targets[index]


def report(result):
    print("%-10s %9.0f images/s  (%d images in %.2f s)%s" % (
        result["mode"], result["images_per_s"], result["images"], result["seconds"],
        "  " + result["note"] if result.get("note") else ""), file=sys.stderr)
    print(json.dumps(result), flush=True)


def bench_dataloader(a):
    import torch
    import torchvision.transforms as T

    torch.manual_seed(0)
    jitter = [T.ColorJitter(0.4, 0.4, 0.4)] if a.jitter else []
    erase = [T.RandomErasing(0.25)] if a.jitter else []
    transform = T.Compose([
        T.RandomCrop(32, padding=4),
        T.RandomHorizontalFlip(),
        *jitter,
        T.ToTensor(),
        T.Normalize(CIFAR10_MEAN, CIFAR10_STD),
        *erase,
    ])
    ds = CIFAR10InMemory(a.data, transform)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch_size, shuffle=True, drop_last=True, num_workers=a.workers,
        pin_memory=False, persistent_workers=a.workers > 0)
    seen = timed = 0
    t0 = time.perf_counter() if a.warmup == 0 else None
    done = False
    for _ in range(a.epochs):
        for x, y in loader:
            seen += 1
            if seen <= a.warmup:
                if seen == a.warmup:
                    t0 = time.perf_counter()
            else:
                timed += x.shape[0]
                if a.max_batches and timed >= a.max_batches * a.batch_size:
                    done = True
                    break
        if done:
            break
    t1 = time.perf_counter()
    if t0 is None or timed == 0:
        sys.exit("torch_loader.py: nothing timed: fewer than warmup+1 batches")
    assert x.dtype == torch.float32 and tuple(x.shape) == (a.batch_size, 3, 32, 32)
    span = ("%d batches after %d warm-up" % (timed // a.batch_size, a.warmup) if done else
            "%d epoch(s) minus %d warm-up batches" % (a.epochs, a.warmup))
    return {"mode": "dataloader", "workers": a.workers, "batch_size": a.batch_size,
            "images": timed, "seconds": t1 - t0, "images_per_s": timed / (t1 - t0),
            "torch_threads": torch.get_num_threads(), "note": span}


def tensor_setup(a):
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    data, labels = read_cifar10_train(a.data)
    x = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, 32, 32)  # (N,3,32,32) uint8
    y = torch.tensor(labels, dtype=torch.int64)
    return torch, x, y


def timed_epochs(a, torch, n, make_batch, labels):
    """Runs a.epochs epochs of n // B batches; per epoch one permutation and the
    random crop offsets and flips of every sample, drawn up front."""
    B = a.batch_size
    torch.manual_seed(0)
    seen = timed = 0
    t0 = time.perf_counter() if a.warmup == 0 else None
    for _ in range(a.epochs):
        perm = torch.randperm(n)
        flip = torch.randint(0, 2, (n,))
        dy = torch.randint(0, 9, (n,))
        dx = torch.randint(0, 9, (n,))
        for s in range(0, n - B + 1, B):
            e = s + B
            xb = make_batch(perm[s:e], flip[s:e], dy[s:e], dx[s:e])
            yb = labels[perm[s:e]]
            seen += 1
            if seen <= a.warmup:
                if seen == a.warmup:
                    t0 = time.perf_counter()
            else:
                timed += B
    t1 = time.perf_counter()
    if t0 is None or timed == 0:
        sys.exit("torch_loader.py: nothing timed: fewer than warmup+1 batches")
    assert xb.dtype == torch.uint8 and tuple(xb.shape) == (B, 3, 32, 32) and xb.is_contiguous()
    assert tuple(yb.shape) == (B,)
    return timed, t1 - t0


def bench_tensor(a):
    torch, x, y = tensor_setup(a)
    n = x.shape[0]
    t = time.perf_counter()
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))  # (N,3,40,40), zeros around
    both = torch.cat([padded, padded.flip(3)])  # (2N,3,40,40): [n] plain, [N+n] mirrored
    del padded
    # (2N,3,9,9,32,32) view: [i, c, dy, dx] is image i's 32x32 crop at (dy, dx).
    crops = both.unfold(2, 32, 1).unfold(3, 32, 1)
    setup_s = time.perf_counter() - t

    # Mirroring the padded image and cropping at dx equals cropping at 8 - dx
    # and mirroring the crop; dx is uniform on 0..8, so the distribution of
    # batches is that of RandomCrop(32, 4) + RandomHorizontalFlip.
    def make_batch(idx, flip, dy, dx):
        return crops[idx + n * flip, :, dy, dx]  # one gather -> (B,3,32,32) uint8

    images, secs = timed_epochs(a, torch, n, make_batch, y)
    return {"mode": "tensor", "threads": torch.get_num_threads(), "batch_size": a.batch_size,
            "images": images, "seconds": secs, "images_per_s": images / secs,
            "setup_s": setup_s, "resident_mb": both.numel() / 1e6,
            "note": "%d epoch(s) minus %d warm-up batches, %d threads, %.0f MB resident"
                    % (a.epochs, a.warmup, torch.get_num_threads(), both.numel() / 1e6)}


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def bench_preshift(a):
    torch, x, y = tensor_setup(a)
    n = x.shape[0]
    need = 2 * 9 * n * 3 * 40 * 32
    avail = mem_available()
    if avail is not None and avail < 1.5 * need:
        return {"mode": "preshift", "skipped": "needs %.1f GB, %.1f GB available"
                % (need / 1e9, avail / 1e9)}
    t = time.perf_counter()
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))  # (N,3,40,40)
    # [f, dx, i] = image i padded, columns dx..dx+31, mirrored when f = 1.
    shifted = torch.empty(2, 9, n, 3, 40, 32, dtype=torch.uint8)
    for dx in range(9):
        shifted[0, dx] = padded[:, :, :, dx:dx + 32]
        shifted[1, dx] = padded[:, :, :, dx:dx + 32].flip(3)
    del padded
    # Rows dy..dy+31 of one channel are 1024 contiguous bytes starting at byte
    # 32*dy = int64 element 4*dy: (2,9,N,3,9 dy,128 int64) view.
    rows = shifted.view(torch.int64).view(2, 9, n, 3, 160).unfold(4, 128, 4)
    setup_s = time.perf_counter() - t

    def make_batch(idx, flip, dy, dx):
        return rows[flip, dx, idx, :, dy].view(torch.uint8).view(-1, 3, 32, 32)

    images, secs = timed_epochs(a, torch, n, make_batch, y)
    return {"mode": "preshift", "threads": torch.get_num_threads(), "batch_size": a.batch_size,
            "images": images, "seconds": secs, "images_per_s": images / secs,
            "setup_s": setup_s, "resident_mb": need / 1e6,
            "note": "%d epoch(s) minus %d warm-up batches, %d threads, %.0f MB resident, %.1f s setup"
                    % (a.epochs, a.warmup, torch.get_num_threads(), need / 1e6, setup_s)}


def check():
    """Exit 0 when torch, torchvision, numpy and PIL import; prints their versions."""
    missing = []
    versions = {}
    for mod in ("torch", "torchvision", "numpy", "PIL"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:  # ImportError, or a broken install
            missing.append("%s (%s)" % (mod, e.__class__.__name__))
    if missing:
        print("missing: " + ", ".join(missing))
        return 1
    print(" ".join("%s %s" % kv for kv in versions.items()))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["check", "dataloader", "tensor", "preshift"])
    p.add_argument("--data", help="directory holding data_batch_1..5.bin")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup", type=int, default=10, help="untimed batches at the start")
    p.add_argument("--max-batches", type=int, default=0, help="stop after this many timed batches")
    p.add_argument("--jitter", action="store_true",
                   help="dataloader: ColorJitter(0.4, 0.4, 0.4) before ToTensor, RandomErasing(0.25) after Normalize")
    p.add_argument("--threads", type=int, default=cpu_count(), help="torch threads (tensor ways)")
    a = p.parse_args()
    if a.mode == "check":
        return check()
    if not a.data:
        p.error("--data is required")
    if a.batch_size < 1 or a.epochs < 1 or a.warmup < 0 or a.threads < 1:
        p.error("--batch-size, --epochs and --threads must be >= 1, --warmup >= 0")
    result = {"dataloader": bench_dataloader, "tensor": bench_tensor,
              "preshift": bench_preshift}[a.mode](a)
    if "skipped" in result:
        print("%-10s skipped: %s" % (result["mode"], result["skipped"]), file=sys.stderr)
        print(json.dumps(result), flush=True)
        return 0
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
