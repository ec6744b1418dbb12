#!/usr/bin/python3
"""python_loader.py - ringtrain.Loader against PyTorch's input pipelines, inside Python.

Images per second of augmented CIFAR-10 training batches (random crop 32 with
4-pixel zero padding + random horizontal flip) handed to the consumer as torch
tensors, uint8 (B,3,32,32) images and int64 (B,) labels, no model. Three ways,
on the same synthetic records:

  ringtrain   ringtrain.Loader(packed, batch_size=B, workers=W): the C loader's
              batches, straight from its ring of slots (DLPack views, no copy)
  DataLoader  torch.utils.data.DataLoader(torchvision.datasets.CIFAR10(root,
              transform=Compose([RandomCrop(32, 4), RandomHorizontalFlip(),
              PILToTensor()])), batch_size=B, shuffle=True, drop_last=True,
              pin_memory=True, num_workers=the best of --sweep (measured first,
              printed; default 0,1,2 on 2 CPUs, 0,4,8,16 on 16),
              persistent_workers when num_workers > 0)
  tensor      the fastest pure-PyTorch way we know: the split as one uint8
              tensor, zero-padded once and stored beside its mirror image (2N
              padded images, twice the split's pixels); per epoch one
              permutation and every sample's flip, row offset and column offset
              drawn up front, each batch's members sorted by column offset;
              per batch one index_select of the 3 x 32 padded rows each image
              needs (as 1280-byte int64 windows) and at most 9 strided copies,
              one per column offset (--tensor-method gather: the older single
              advanced-indexing gather over an unfold view, as
              bench/torch_loader.py's "tensor" way); torch threads = the best
              of --thread-sweep (measured first, printed)

With --normalize, each way also makes float32 batches normalised with CIFAR-10's mean and std
(torchvision's ToTensor + Normalize; ringtrain: normalize=(mean, std), channels_last=True, done in C at
hand-over; the tensor way: one float conversion and normalisation per batch in torch).

With --transform, a second table measures the per-batch callable (the goal: ringtrain.Loader(transform=f)
within 5 % of the Loader alone plus f alone): on the batches above (float32 with --normalize, else uint8),
alternated --runs times, each in its own process,
  loader            ringtrain.Loader(...) alone (the first table's ringtrain way)
  callable          f alone, timed over 16 batches taken from that Loader first and kept
  loader+callable   ringtrain.Loader(..., transform=f)
with f a fixed-weight mixup of the batch with itself reversed (0.8 x + 0.2 x.flip(0), one vectorised
expression, a new tensor per batch); per-batch times t = B / (images/s), and the goal compares
t(loader+callable) with t(loader) + t(callable).

With --device cuda (default: added when torch sees a GPU), the same three
deliver CUDA tensors: ringtrain.Loader(device="cuda"), the DataLoader's pinned
batches through .to("cuda", non_blocking=True), the tensor way with the split
held on the GPU.

Each measurement runs in its own process (this script with --one WAY), the
ways alternated --runs times (the first way rotates every run: these machines
swing +-25 % between runs); medians, min - max, ratio and the goals
(ringtrain >= 20x DataLoader, 100x with --normalize; >= 1x the tensor way) PASS/MISS are printed as
markdown tables, and with --json one JSON line last.

Timing of a measurement: the first --warmup batches are not timed (worker
start-up, first page faults); then batches are counted until --seconds have
passed (checked after each batch; on a GPU the device is synchronised before
both clock readings).

The dataset is made when absent and kept (DIR = --data): ringtrain.synth ->
DIR/src, ringtrain.pack -> DIR/packed, and DIR/torchvision/cifar-10-batches-py
(torchvision's python-pickle layout) written from ringtrain.Dataset(DIR/packed)
record by record, so every way sees the same images.

Usage:
  PYTHONPATH=build/python bench/python_loader.py [--data DIR] [--batch-size B]
      [--runs R] [--workers W] [--sweep LIST] [--thread-sweep LIST]
      [--seconds S] [--warmup K] [--device LIST] [--train N]
      [--tensor-method rows|gather] [--normalize] [--transform] [--json]
About 3 minutes on 2 cores with the defaults (once the dataset exists).
Exit status: 0 when every measurement ran, 1 when one failed, 2 on a usage
error or a missing prerequisite.
"""
import argparse
import hashlib
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
NAME = "python_loader"
WAYS = ("ringtrain", "dataloader", "tensor")
LABEL = {"ringtrain": "ringtrain.Loader", "dataloader": "DataLoader(torchvision CIFAR10)",
         "tensor": "PyTorch uint8 tensor idiom"}
GOALS = (("dataloader", 20.0), ("tensor", 1.0))
GOALS_NORMALIZED = (("dataloader", 100.0), ("tensor", 1.0))  # --normalize: the float batches a step takes
# --transform: the per-batch callable's measurement, and its goal (Loader + f within 5 % of the two alone)
TRANSFORM_WAYS = ("loader", "callable", "loader+callable")
TRANSFORM_SLACK = 0.05


def fail(msg, status=2):
    print("%s: %s" % (NAME, msg), file=sys.stderr)
    sys.exit(status)


# --- the machine -----------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat (busy = all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def own_cpu_s():
    """CPU seconds of this process (all its threads) and of its children that have ended."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def machine_lines():
    """Prints the machine line and how busy the CPUs were in the second before the runs."""
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 1048576
    print("machine:  %d CPUs (nproc), %s, %.0f GiB RAM, Linux %s" % (
        len(os.sched_getaffinity(0)), cpu_model(), mem, platform.release()))
    b0, t0 = cpu_jiffies()
    time.sleep(1)
    b1, t1 = cpu_jiffies()
    busy = 100.0 * (b1 - b0) / max(t1 - t0, 1)
    print("busy:     %.0f %% of the CPUs busy in the second before the runs" % busy)
    if busy > 10:
        print("          NOTE: something else is using the CPUs; these numbers will be low and noisy")
    return busy


class LoadMeter:
    """CPU use over the runs: all processes (/proc/stat) against this bench's own (itself and its
    measurement processes)."""

    def __init__(self):
        self.b0, self.t0 = cpu_jiffies()
        self.c0 = own_cpu_s()
        self.w0 = time.monotonic()

    def report(self):
        b1, t1 = cpu_jiffies()
        wall = time.monotonic() - self.w0
        ncpu = os.cpu_count() or 1
        hz = os.sysconf("SC_CLK_TCK")
        total = (b1 - self.b0) / hz / max(wall, 1e-9) / ncpu
        ours = (own_cpu_s() - self.c0) / max(wall, 1e-9) / ncpu
        other = max(total - ours, 0.0)
        print("load:     during the runs %.0f %% of the CPUs were busy, %.0f %% of them by other processes "
              "than this bench's" % (100 * total, 100 * other))
        if other > 0.10:
            print("          NOTE: other work shared the CPUs; rerun on a quiet machine for firm figures")
        return {"busy": total, "other": other}


# --- the dataset -----------------------------------------------------------------

def dump(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=4)  # 2 would store the pixels as a latin-1 text string, 1.5x the bytes
    os.replace(tmp, path)


def write_torchvision(packed, out):
    """The train and test splits of `packed`, read record by record through ringtrain.Dataset, as
    torchvision's cifar-10-batches-py: data_batch_1..5 and test_batch ({"data": uint8 (n,3072) R,G,B
    planes, "labels": [int]}, str keys as torchvision's pickle.load(encoding="latin1") of the original
    files yields them), batches.meta, and md5sums.json (the sums CIFAR10's integrity check is given)."""
    import numpy as np
    import ringtrain

    os.makedirs(out, exist_ok=True)
    sums = {}
    for split, files in (("train", ["data_batch_%d" % i for i in range(1, 6)]), ("test", ["test_batch"])):
        ds = ringtrain.Dataset(packed, split)
        n = len(ds)
        data = np.empty((n, 3 * 32 * 32), dtype=np.uint8)
        labels = []
        for i in range(n):
            img, label = ds[i]
            data[i] = img.transpose(2, 0, 1).reshape(-1)  # HWC -> the R, G, B planes
            labels.append(label)
        parts = np.array_split(np.arange(n), len(files))
        for k, (name, idx) in enumerate(zip(files, parts)):
            lo, hi = (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)
            dump({"batch_label": "%s batch %d of %d" % (split, k + 1, len(files)), "labels": labels[lo:hi],
                  "data": data[lo:hi], "filenames": ["%s_%05d.png" % (name, j) for j in range(lo, hi)]},
                 os.path.join(out, name))
        classes = ds.classes
    dump({"num_cases_per_batch": len(parts[0]), "label_names": classes, "num_vis": 3072},
         os.path.join(out, "batches.meta"))
    for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        with open(os.path.join(out, name), "rb") as f:
            sums[name] = hashlib.md5(f.read()).hexdigest()
    with open(os.path.join(out, "md5sums.json"), "w") as f:
        json.dump(sums, f)


def make_dataset(root, train):
    """DIR/src, DIR/packed and DIR/torchvision, each made when absent; returns (packed, torchvision root)."""
    import ringtrain

    src, packed, tv = (os.path.join(root, d) for d in ("src", "packed", "torchvision"))
    test = max(train // 5, 1)
    if not os.path.isfile(os.path.join(src, "cifar-10-batches-bin", "data_batch_5.bin")):
        print("making %s (ringtrain.synth, cifar10, %d train + %d test records)" % (src, train, test), flush=True)
        ringtrain.synth(src, kind="cifar10", train=train, test=test, seed=0)
    if not os.path.isfile(os.path.join(packed, "manifest.json")):
        print("packing %s (ringtrain.pack, codec raw)" % packed, flush=True)
        ringtrain.pack(src, packed, codec="raw", force=True)
    have = len(ringtrain.Dataset(packed, "train"))
    if have != train:
        fail("%s holds %d train records, --train asks for %d: remove %s or pass --data elsewhere"
             % (packed, have, train, root))
    folder = os.path.join(tv, "cifar-10-batches-py")
    if not os.path.isfile(os.path.join(folder, "md5sums.json")):
        print("writing %s (torchvision's pickle layout, from ringtrain.Dataset(%s))" % (folder, packed), flush=True)
        write_torchvision(packed, folder)
    return packed, tv


def torchvision_cifar10(root):
    """torchvision.datasets.CIFAR10 over the files write_torchvision() made: its own loading,
    __getitem__ (a PIL image per item) and transform; only the md5 sums it checks are ours."""
    import torchvision

    base = torchvision.datasets.CIFAR10
    with open(os.path.join(root, base.base_folder, "md5sums.json")) as f:
        sums = json.load(f)

    class CIFAR10(base):
        train_list = [[name, sums[name]] for name, _ in base.train_list]
        test_list = [[name, sums[name]] for name, _ in base.test_list]
        meta = dict(base.meta, md5=sums[base.meta["filename"]])

    return CIFAR10


# --- one measurement (--one WAY, in its own process) -----------------------------

def measure(epoch_batches, a, sync):
    """Consumes batches from epoch_batches() (a fresh iterator per epoch) until --warmup untimed and
    then --seconds of timed batches have passed. Returns (images, seconds, last batch)."""
    seen = images = 0
    t0 = None
    last = None
    while True:
        for x, y in epoch_batches():
            seen += 1
            if t0 is None:
                if seen >= a.warmup:
                    sync()
                    t0 = time.perf_counter()
                continue
            images += x.shape[0]
            if time.perf_counter() - t0 >= a.seconds:
                sync()
                last = (x, y)
                return images, time.perf_counter() - t0, last
            del x, y


CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def normalised(torch, batches):
    """--normalize for the tensor way: ToTensor + Normalize of each uint8 batch, in torch."""
    m = s = None
    for x, y in batches:
        if m is None:
            m = torch.tensor(CIFAR_MEAN, device=x.device).view(1, 3, 1, 1)
            s = torch.tensor(CIFAR_STD, device=x.device).view(1, 3, 1, 1)
        yield (x.float() / 255.0 - m) / s, y


def check_batch(torch, batch, a, device):
    x, y = batch
    want = (a.batch_size, 3, 32, 32)
    dtype = torch.float32 if a.normalize else torch.uint8
    if x.dtype != dtype or tuple(x.shape) != want or y.dtype != torch.int64 or tuple(y.shape) != (want[0],):
        raise SystemExit("%s: a %s batch is %s %s + %s %s, not %s %s + int64 (%d,)" % (
            NAME, a.one, x.dtype, tuple(x.shape), y.dtype, tuple(y.shape), dtype, want, want[0]))
    if x.device.type != device:
        raise SystemExit("%s: a %s batch is on %s, not %s" % (NAME, a.one, x.device, device))


def one_ringtrain(a, torch, sync):
    import ringtrain

    norm = dict(normalize=(CIFAR_MEAN, CIFAR_STD), channels_last=True) if a.normalize else {}
    loader = ringtrain.Loader(a.packed, a.batch_size, seed=0, workers=a.workers, device=a.device, **norm)
    images, secs, last = measure(lambda: iter(loader), a, sync)
    check_batch(torch, last, a, a.device)
    del last
    stats = loader.stats()
    loader.close()
    return {"images": images, "seconds": secs, "workers": a.workers, "shares": stats.get("shares"),
            "note": "workers %d" % a.workers}


def mix(images, labels):
    """--transform's per-batch callable: a fixed-weight mixup of the batch with itself reversed, one vectorised
    expression (what a script's own per-batch logic looks like), a new tensor per batch."""
    return images.mul(0.8).add_(images.flip(0), alpha=0.2), labels


def one_transform(a, torch, sync):
    """--one loader / callable / loader+callable (see --transform)."""
    import ringtrain

    norm = dict(normalize=(CIFAR_MEAN, CIFAR_STD), channels_last=True) if a.normalize else {}
    f = mix if a.one == "loader+callable" else None
    loader = ringtrain.Loader(a.packed, a.batch_size, seed=0, workers=a.workers, device=a.device, transform=f,
                              **norm)
    if a.one == "callable":
        kept = []
        for x, y in loader:
            kept.append((x, y))
            if len(kept) == 16:
                break
        loader.close()

        def batches():
            for x, y in kept:
                yield mix(x, y)
        images, secs, last = measure(batches, a, sync)
    else:
        images, secs, last = measure(lambda: iter(loader), a, sync)
        loader.close()
    check_batch(torch, last, a, a.device)
    return {"images": images, "seconds": secs, "workers": a.workers, "note": "workers %d" % a.workers}


def one_dataloader(a, torch, sync):
    import torchvision.transforms as T

    torch.manual_seed(0)
    last = [T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)] if a.normalize else [T.PILToTensor()]
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] + last)
    ds = torchvision_cifar10(a.tv)(a.tv, train=True, transform=transform, download=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, drop_last=True,
                                         num_workers=a.dl_workers, pin_memory=True,
                                         persistent_workers=a.dl_workers > 0)
    if a.device == "cuda":
        def epoch():
            for x, y in loader:
                yield x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    else:
        def epoch():
            return iter(loader)
    images, secs, last = measure(epoch, a, sync)
    check_batch(torch, last, a, a.device)
    pinned = last[0].is_pinned() if a.device == "cpu" else True
    return {"images": images, "seconds": secs, "workers": a.dl_workers, "pinned": pinned,
            "torch_threads": torch.get_num_threads(),
            "note": "num_workers %d%s" % (a.dl_workers, "" if pinned else ", pin_memory a no-op (no CUDA)")}


def load_split_tensor(torch, tv):
    """The train split of torchvision's files as one uint8 (N,3,32,32) tensor and int64 labels: the
    pickles read with pickle + numpy, as a pure-PyTorch script would."""
    import numpy as np

    data, labels = [], []
    for i in range(1, 6):
        with open(os.path.join(tv, "cifar-10-batches-py", "data_batch_%d" % i), "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        data.append(entry["data"])
        labels.extend(entry["labels"])
    x = torch.from_numpy(np.ascontiguousarray(np.concatenate(data))).view(-1, 3, 32, 32)
    return x, torch.tensor(labels, dtype=torch.int64)


class TensorIdiom:
    """Crop + flip of a split held as one uint8 tensor (see the module docstring): every batch made
    with torch operations alone, on `device`. batches() is one epoch: a fresh permutation, drop_last."""

    def __init__(self, torch, x, y, batch, method, device):
        import numpy as np

        self.torch, self.B, self.method = torch, batch, method
        self.n = x.shape[0]
        self.y = y.to(device)
        # [i] image i zero-padded by 4, [N + i] its mirror image: cropping the mirror at column
        # offset dx is the mirror of the crop at 8 - dx, and dx is uniform on 0..8, so drawing
        # (flip, dx) picks from exactly RandomCrop(32, 4) + RandomHorizontalFlip's distribution.
        # Built once with numpy (torch 1.13's flip of a uint8 tensor is several times slower).
        both = np.zeros((2 * self.n, 3, 40, 40), dtype=np.uint8)
        both[:self.n, :, 4:36, 4:36] = x.numpy()
        both[self.n:] = both[:self.n, :, :, ::-1]
        self.both = torch.from_numpy(both).to(device)
        self.resident_bytes = self.both.numel()
        if method == "gather":
            self.crops = self.both.unfold(2, 32, 1).unfold(3, 32, 1)  # (2N,3,9,9,32,32) view
        else:
            # Window k = int64 elements 5k .. 5k+159: rows dy..dy+31 of one channel of one padded
            # image are 1280 contiguous bytes starting at byte 40 * dy (a multiple of 8).
            self.win = self.both.view(-1).view(torch.int64).unfold(0, 160, 5)
            self.ch = torch.arange(3, device=device)

    def draws(self):
        torch = self.torch
        dev = self.y.device
        nb = self.n // self.B
        m = nb * self.B
        perm = torch.randperm(self.n, device=dev)[:m]
        flip = torch.randint(0, 2, (m,), device=dev)
        dy = torch.randint(0, 9, (m,), device=dev)
        dx = torch.randint(0, 9, (m,), device=dev)
        return nb, perm, flip, dy, dx

    def batches(self):
        return self.batches_gather() if self.method == "gather" else self.batches_rows()

    def batches_gather(self):
        nb, perm, flip, dy, dx = self.draws()
        src = perm + self.n * flip
        labels = self.y[perm]
        B = self.B
        for b in range(nb):
            s = slice(b * B, (b + 1) * B)
            yield self.crops[src[s], :, dy[s], dx[s]], labels[s]  # one gather -> (B,3,32,32)

    def batches_rows(self):
        torch = self.torch
        nb, perm, flip, dy, dx = self.draws()
        B = self.B
        # Sort each batch's members by column offset (the batch keeps its members; their order
        # within it is as random as before) so each offset is one contiguous run of the batch.
        key = torch.div(torch.arange(nb * B, device=perm.device), B, rounding_mode="floor") * 9 + dx
        order = torch.argsort(key)
        perm, flip, dy = perm[order], flip[order], dy[order]
        counts = torch.bincount(key, minlength=nb * 9).view(nb, 9).tolist()
        windows = (((perm + self.n * flip)[:, None] * 3 + self.ch) * 40 + dy[:, None]).view(-1)  # (m*3,)
        labels = self.y[perm]
        for b in range(nb):
            rows = self.win.index_select(0, windows[b * 3 * B:(b + 1) * 3 * B])
            rows = rows.view(torch.uint8).view(B, 3, 32, 40)
            out = torch.empty((B, 3, 32, 32), dtype=torch.uint8, device=rows.device)
            s = 0
            for d, c in enumerate(counts[b]):
                if c:
                    out[s:s + c] = rows[s:s + c, :, :, d:d + 32]
                    s += c
            yield out, labels[b * B:(b + 1) * B]

    def check(self, seed=1):
        """Both methods against plain slicing of the padded images, for one epoch's first batch."""
        torch = self.torch
        st = torch.random.get_rng_state()
        torch.manual_seed(seed)
        nb, perm, flip, dy, dx = self.draws()
        torch.manual_seed(seed)
        x, y = next(iter(self.batches()))
        torch.random.set_rng_state(st)
        # The expected batch: the same draws, each image cut out of its (mirrored or not) padded copy,
        # with its label. The rows method reorders a batch's members: compared as multisets of pairs.
        want = sorted((self.both[int(perm[j]) + self.n * int(flip[j]), :, int(dy[j]):int(dy[j]) + 32,
                                 int(dx[j]):int(dx[j]) + 32].cpu().numpy().tobytes(), int(self.y[perm[j]]))
                      for j in range(self.B))
        have = sorted((x[j].cpu().numpy().tobytes(), int(y[j])) for j in range(x.shape[0]))
        if want != have:
            raise SystemExit("%s: the tensor way's first batch differs from plain slicing" % NAME)

def one_tensor(a, torch, sync):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, y = load_split_tensor(torch, a.tv)
    t = time.perf_counter()
    idiom = TensorIdiom(torch, x, y, a.batch_size, a.tensor_method, a.device)
    sync()
    setup_s = time.perf_counter() - t
    del x
    idiom.check()
    images, secs, last = measure((lambda: normalised(torch, idiom.batches())) if a.normalize else idiom.batches,
                                 a, sync)
    check_batch(torch, last, a, a.device)
    return {"images": images, "seconds": secs, "method": a.tensor_method, "threads": torch.get_num_threads(),
            "setup_s": setup_s, "resident_mb": idiom.resident_bytes / 1e6,
            "note": "%s, %d torch threads, %.0f MB resident, %.1f s set-up" % (
                a.tensor_method, torch.get_num_threads(), idiom.resident_bytes / 1e6, setup_s)}


def run_one(a):
    import torch

    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("%s: --device cuda but torch sees no GPU" % NAME)
        sync = torch.cuda.synchronize
    else:
        def sync():
            pass
    fn = {"ringtrain": one_ringtrain, "dataloader": one_dataloader, "tensor": one_tensor}.get(a.one, one_transform)
    r = fn(a, torch, sync)
    r.update(way=a.one, device=a.device, batch_size=a.batch_size, images_per_s=r["images"] / r["seconds"])
    print(json.dumps(r), flush=True)
    return 0


# --- the runs --------------------------------------------------------------------

def command(a, way, device, knob=None):
    """The command line of one measurement; knob: the DataLoader's num_workers or the tensor way's
    torch threads."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", way, "--device", device,
           "--batch-size", str(a.batch_size), "--seconds", str(a.seconds), "--warmup", str(a.warmup)]
    if a.normalize:
        cmd.append("--normalize")
    if way == "ringtrain" or way in TRANSFORM_WAYS:
        cmd += ["--packed", a.packed, "--workers", str(a.workers)]
    elif way == "dataloader":
        cmd += ["--tv", a.tv, "--dl-workers", str(knob)]
    else:
        cmd += ["--tv", a.tv, "--tensor-method", a.tensor_method, "--threads", str(knob)]
    return cmd


def run_cmd(cmd, label):
    """Runs one measurement; its JSON result, or None (having said why) when it failed."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        print("  %-34s FAILED (exit status %d): %s" % (label, p.returncode, " ".join(cmd)))
        for l in (p.stderr.strip().splitlines() or p.stdout.strip().splitlines())[-5:]:
            print("    " + l)
        return None
    r = json.loads(lines[-1])
    print("  %-34s %10.0f images/s  (%s)" % (label, r["images_per_s"], r.get("note", "")), flush=True)
    return r


def med_lo_hi(xs):
    return statistics.median(xs), min(xs), max(xs)


KNOB = {"ringtrain": "workers", "dataloader": "num_workers", "tensor": "threads"}


def label(way, knob):
    return "%s, %s=%s" % (LABEL[way], KNOB[way], knob)


def bench_device(a, device):
    """Sweeps, alternated runs and tables for one device; returns (summary dict, failures)."""
    fails = 0
    print()
    print("== %s: batches as %s tensors ==" % (device, device))
    # The PyTorch ways at their best setting here: each value measured once, the fastest kept.
    knob = {"ringtrain": a.workers}
    sweeps = {}
    if device == "cuda":  # the tensor way's work is the GPU's: its host threads are not swept
        knob["tensor"] = max(a.thread_sweep)
    for way, values in (("dataloader", a.sweep), ("tensor", a.thread_sweep if device == "cpu" else [])):
        if not values:
            continue
        print("%s sweep of %s (1 run each, the fastest is used below):" % (LABEL[way], KNOB[way]))
        sweeps[way] = {}
        for v in values:
            r = run_cmd(command(a, way, device, v), label(way, v))
            if r is None:
                fails += 1
            else:
                sweeps[way][v] = r["images_per_s"]
        if sweeps[way]:
            knob[way] = max(sweeps[way], key=sweeps[way].get)
            print("  fastest: %s=%d" % (KNOB[way], knob[way]))
        else:
            print("  no setting ran: the %s row is left out" % LABEL[way])
    ways = [w for w in WAYS if w in knob]
    res = {w: [] for w in WAYS}
    extra = {w: [] for w in WAYS}
    for i in range(a.runs):
        order = ways[i % len(ways):] + ways[:i % len(ways)]
        print("run %d/%d" % (i + 1, a.runs), flush=True)
        for w in order:
            r = run_cmd(command(a, w, device, knob[w]), label(w, knob[w]))
            if r is None:
                fails += 1
                continue
            res[w].append(r["images_per_s"])
            extra[w].append(r)
    print()
    print("Medians of %d runs, batch %d, device %s, %d CPUs (%s); tensor way: %s method." % (
        a.runs, a.batch_size, device, len(os.sched_getaffinity(0)), cpu_model(), a.tensor_method))
    print()
    print("| way | images/s (median) | min - max | runs | ringtrain : way |")
    print("|---|---:|---:|---:|---:|")
    med = {}
    for w in WAYS:
        name = label(w, knob[w]) if w in knob else LABEL[w]
        if not res[w]:
            print("| %s | n/a | | 0 | |" % name)
            continue
        m, lo, hi = med_lo_hi(res[w])
        med[w] = m
        ratio = "" if w == "ringtrain" or "ringtrain" not in med else "%.1fx" % (med["ringtrain"] / m)
        print("| %s | %.0f | %.0f - %.0f | %d | %s |" % (name, m, lo, hi, len(res[w]), ratio))
    print()
    print("| goal | result |")
    print("|---|---|")
    goals = {}
    for peer, need in GOALS_NORMALIZED if a.normalize else GOALS:
        text = "ringtrain.Loader >= %gx %s" % (need, LABEL[peer])
        if "ringtrain" in med and peer in med:
            x = med["ringtrain"] / med[peer]
            goals[peer] = {"need": need, "ratio": x, "pass": x >= need}
            print("| %s | %.2fx %s |" % (text, x, "PASS" if x >= need else "MISS"))
        else:
            print("| %s | n/a |" % text)
    shares = sorted((r for r in extra["ringtrain"] if isinstance(r.get("shares"), dict)),
                    key=lambda r: r["images_per_s"])
    if shares:
        mid = shares[(len(shares) - 1) // 2]["shares"]
        print()
        print("ringtrain.Loader's stages in its median run (its stats()[\"shares\"]):")
        print("  of worker time: " + ", ".join("%s %.0f %%" % (k, 100 * mid[k]) for k in
                                              ("checksum", "decompress", "decode", "augment", "idle") if k in mid))
        print("  of wall time:   io %.0f %%, workers waiting for a free slot %.0f %%, the consumer waiting for a "
              "batch %.0f %%" % (100 * mid.get("io", 0), 100 * mid.get("slot_wait", 0), 100 * mid.get("ring_wait", 0)))
    summary = {w: {"median": med[w], "min": min(res[w]), "max": max(res[w]), "runs": len(res[w]),
                   KNOB[w]: knob[w]} for w in WAYS if w in med}
    summary["sweeps"] = {w: {str(k): v for k, v in sw.items()} for w, sw in sweeps.items()}
    summary["goals"] = goals
    return summary, fails


def bench_transform(a, device):
    """--transform: the per-batch callable's goal, alternated runs; returns (summary dict, failures)."""
    fails = 0
    print()
    print("== %s: a per-batch callable, ringtrain.Loader(transform=f) against the two alone ==" % device)
    res = {w: [] for w in TRANSFORM_WAYS}
    for i in range(a.runs):
        k = i % len(TRANSFORM_WAYS)
        print("run %d/%d" % (i + 1, a.runs), flush=True)
        for w in TRANSFORM_WAYS[k:] + TRANSFORM_WAYS[:k]:
            r = run_cmd(command(a, w, device), w)
            if r is None:
                fails += 1
            else:
                res[w].append(r["images_per_s"])
    if not all(res.values()):
        print("  a measurement failed: no verdict")
        return {}, fails
    med = {w: statistics.median(v) for w, v in res.items()}
    us = {w: 1e6 * a.batch_size / med[w] for w in TRANSFORM_WAYS}
    alone = us["loader"] + us["callable"]
    over = us["loader+callable"] / alone - 1
    print()
    print("Medians of %d runs, batch %d, %s, device %s, %d CPUs (%s); f = 0.8 x + 0.2 x.flip(0)." % (
        a.runs, a.batch_size, "float32 normalised, channels_last" if a.normalize else "uint8", device,
        len(os.sched_getaffinity(0)), cpu_model()))
    print()
    print("| measured | images/s (median) | min - max | us per batch |")
    print("|---|---:|---:|---:|")
    for w in TRANSFORM_WAYS:
        print("| %s | %.0f | %.0f - %.0f | %.1f |" % (w, med[w], min(res[w]), max(res[w]), us[w]))
    print("| loader + callable alone (sum of the times) | %.0f | | %.1f |" % (1e6 * a.batch_size / alone, alone))
    ok = over <= TRANSFORM_SLACK
    print()
    print("| goal | result |")
    print("|---|---|")
    print("| ringtrain.Loader(transform=f) within %.0f %% of the Loader alone + f alone | %+.1f %% %s |" % (
        100 * TRANSFORM_SLACK, 100 * over, "PASS" if ok else "MISS"))
    return {"median": med, "us_per_batch": us, "over": over, "pass": ok,
            "runs": {w: v for w, v in res.items()}}, fails


def default_sweep(ncpu):
    """0, then the largest three of 1, 2, 4, ... up to ncpu, and ncpu: "0,1,2" on 2 CPUs, "0,4,8,16" on 16."""
    vals = sorted({1 << k for k in range(ncpu.bit_length()) if 1 << k <= ncpu} | {ncpu})
    return ",".join(str(v) for v in [0] + vals[-3:])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage=None,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=None)
    p.add_argument("--data", default=os.path.join(TOP, "data", "bench-python"),
                   help="where the dataset lives; made when absent and kept (default %(default)s)")
    p.add_argument("--train", type=int, default=50000, help="training records of the dataset (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--runs", type=int, default=5, help="rounds of the three ways (default %(default)s)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="ringtrain.Loader workers (default: nproc, %(default)s)")
    p.add_argument("--sweep", default=default_sweep(len(os.sched_getaffinity(0))),
                   help="DataLoader num_workers to try (default: 0 and the largest three of 1, 2, 4, ... "
                        "up to nproc and nproc itself: %(default)s)")
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement (default %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="untimed batches first (default %(default)s)")
    p.add_argument("--device", default=None,
                   help="comma-separated: cpu, cuda (default: cpu, and cuda when torch sees a GPU)")
    p.add_argument("--tensor-method", choices=("rows", "gather"), default="rows")
    p.add_argument("--thread-sweep", default="1,%d" % len(os.sched_getaffinity(0)),
                   help="torch threads to try for the tensor way (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON summary line last")
    p.add_argument("--normalize", action="store_true",
                   help="float32 batches normalised with CIFAR-10's mean and std (ToTensor + Normalize) in every way")
    p.add_argument("--transform", action="store_true",
                   help="also measure a per-batch callable: Loader(transform=f) against the Loader and f alone")
    # One measurement in this process (what the runs start).
    p.add_argument("--one", choices=WAYS + TRANSFORM_WAYS, help=argparse.SUPPRESS)
    p.add_argument("--packed", help=argparse.SUPPRESS)
    p.add_argument("--tv", help=argparse.SUPPRESS)
    p.add_argument("--dl-workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if min(a.batch_size, a.runs, a.workers, a.warmup, a.threads) < 1 or a.train < a.batch_size or a.seconds <= 0:
        p.error("--batch-size, --runs, --workers, --warmup and --threads must be >= 1, --train >= --batch-size, "
                "--seconds > 0")
    for opt, least in (("sweep", 0), ("thread_sweep", 1)):
        try:
            vals = [int(w) for w in getattr(a, opt).split(",") if w != ""]
        except ValueError:
            vals = []
        if not vals or min(vals) < least:
            p.error("--%s takes comma-separated numbers >= %d" % (opt.replace("_", "-"), least))
        setattr(a, opt, vals)
    return a


def main(argv):
    a = parse(argv)
    if a.one:
        if a.device is None:
            a.device = "cpu"
        return run_one(a)
    try:
        import numpy
        import torch
        import torchvision
    except ImportError as e:
        fail("PyTorch for %s is missing (%s); install: apt-get install -y python3-torch python3-torchvision"
             % (sys.executable, e))
    try:
        import ringtrain
    except ImportError as e:
        fail("the ringtrain package does not import (%s); build it and run with PYTHONPATH=<build>/python:\n"
             "  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build" % e)
    devices = a.device.split(",") if a.device else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        if d not in ("cpu", "cuda"):
            fail("--device takes cpu and cuda, not '%s'" % d)
        if d == "cuda" and not torch.cuda.is_available():
            fail("--device cuda, but torch %s sees no GPU" % torch.__version__)

    print("== ringtrain.Loader vs PyTorch input pipelines, batches into torch tensors, no model ==")
    busy = machine_lines()
    if "cuda" in devices:
        print("gpu:      %s" % torch.cuda.get_device_name(0))
    print("software: ringtrain %s (%s); Python %s; torch %s, torchvision %s, numpy %s" % (
        ringtrain.__version__, ringtrain.__file__, platform.python_version(), torch.__version__,
        torchvision.__version__, numpy.__version__))
    a.packed, a.tv = make_dataset(os.path.abspath(a.data), a.train)
    print("dataset:  %s (synthetic CIFAR-10, %d train images, 3x32x32; packed raw)" % (a.packed, a.train))
    print("          torchvision reads %s/cifar-10-batches-py (the same records)" % a.tv)
    images = ("float32 (B,3,32,32) normalised with CIFAR-10's mean and std (ringtrain: channels_last)"
              if a.normalize else "uint8 (B,3,32,32)")
    print("settings: batch %d, crop 32 with 4-pixel zero padding + horizontal flip; %s + int64 (B,)"
          % (a.batch_size, images))
    print("          every way; %d untimed batches, then %.1f s timed per measurement, each in its own process;"
          % (a.warmup, a.seconds))
    print("          %d runs alternated (the first way rotates every run); the consumer drops each batch"
          % a.runs)
    print("commands:")
    for d in devices:
        for w in WAYS:
            print("  " + " ".join(command(a, w, d, "N")))
    # Every way reads from memory or the page cache: warm it once up front.
    for base in (a.packed, os.path.join(a.tv, "cifar-10-batches-py")):
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    while f.read(1 << 22):
                        pass

    meter = LoadMeter()
    fails = 0
    out = {"bench": NAME, "cpu": cpu_model(), "nproc": len(os.sched_getaffinity(0)), "batch_size": a.batch_size,
           "runs": a.runs, "workers": a.workers, "seconds": a.seconds, "busy_before": busy / 100,
           "torch": torch.__version__, "ringtrain": ringtrain.__version__, "devices": {}}
    for d in devices:
        s, f = bench_device(a, d)
        out["devices"][d] = s
        fails += f
        if a.transform:
            s["transform"], f = bench_transform(a, d)
            fails += f
    print()
    out["load"] = meter.report()
    if a.json:
        print(json.dumps(out))
    if fails:
        print("%s: %d measurement(s) failed (above)" % (NAME, fails), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
