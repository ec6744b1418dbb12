"""common.py - what the two example training scripts share: their options, the
launcher's process group, AMP, one training epoch and one validation pass (the
same code whichever loader feeds them), the timing of the data wait, the end
report and the test-data step (--prepare). The loaders (the part that differs
between --loader torch and --loader ringtrain), the model and the epoch loop
stay in each script.

Launchers (init_distributed):
  torchrun   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
  srun       SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID (inside an srun step only);
             MASTER_ADDR from the environment, else the first host of
             SLURM_JOB_NODELIST; MASTER_PORT from the environment, else
             15000 + SLURM_JOB_ID % 10000 (jobs sharing a node get different ports)
  python     neither: a world of one, no process group
Backend gloo on the CPU, nccl on CUDA (one GPU per rank: its local rank among
the GPUs it sees).
"""
import hashlib
import json
import math
import os
import pickle
import platform
import re
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader, DistributedSampler

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
MEAN_STD = {"cifar10": (CIFAR10_MEAN, CIFAR10_STD), "cifar100": (CIFAR100_MEAN, CIFAR100_STD)}


def add_common_args(parser, kind):
    """The options both scripts take; `kind` is "cifar10" or "cifar100"."""
    p = parser
    p.add_argument("--loader", choices=("ringtrain", "torch"), default="ringtrain",
                   help="ringtrain: ringtrain.Loader over a packed dataset; torch: torchvision "
                        "CIFAR + DistributedSampler + DataLoader (default %(default)s)")
    p.add_argument("--data", help="ringtrain: a packed dataset directory (manifest.json + shards); "
                                  "torch: the torchvision root holding %s" % torchvision_folder(kind))
    p.add_argument("--prepare", metavar="DIR",
                   help="write a synthetic %s to DIR in both layouts and exit: DIR/packed (ringtrain.synth "
                        "+ ringtrain.pack) and DIR/torchvision (the same records as torchvision's "
                        "python-pickle files)" % kind.upper())
    p.add_argument("--synth-train", type=int, default=50000, help="--prepare: training records (default %(default)s)")
    p.add_argument("--synth-test", type=int, default=10000, help="--prepare: test records (default %(default)s)")
    p.add_argument("--stage-to", metavar="PARENT",
                   help="ringtrain: copy --data to node-local PARENT first with ringtrain.stage (every rank "
                        "calls it; one per node copies, the others wait on its lock)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128, help="per rank (default %(default)s)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--workers", type=int, default=2,
                   help="loader worker threads (ringtrain) or processes (torch) per rank (default %(default)s)")
    p.add_argument("--steps", type=int, default=0,
                   help="at most this many training steps per epoch (0: the whole epoch)")
    p.add_argument("--val-steps", type=int, default=0,
                   help="at most this many validation batches per epoch (0: the whole test split)")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                   help="autocast dtype; fp16 (CUDA only) adds a GradScaler (default %(default)s)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch compute threads per rank (0: torch's default; torchrun sets 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    p.add_argument("--verdict", action="store_true",
                   help="time the training loop with ringtrain.Profiler (either loader; needs the ringtrain "
                        "package) and print its input verdict at the end")


def torchvision_folder(kind):
    return {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[kind]


# --- launcher -----------------------------------------------------------------

def first_host(nodelist):
    """The first host of a Slurm node list: "n[03-05,9],m" -> "n03"."""
    m = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def launcher_env():
    """(rank, world, local_rank) from torchrun's or srun's variables; None when neither launched us.
    Under srun, MASTER_ADDR and MASTER_PORT are set here when the job script did not."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    # SLURM_STEP_NUM_TASKS exists only inside an srun step: a python started by the batch shell
    # itself (SLURM_PROCID 0, SLURM_NTASKS the job's) is a world of one, not rank 0 of the job.
    if "SLURM_STEP_NUM_TASKS" in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.setdefault("MASTER_ADDR", first_host(os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")))
        os.environ.setdefault("MASTER_PORT", str(15000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 10000))
        return (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_STEP_NUM_TASKS"]),
                int(os.environ.get("SLURM_LOCALID", 0)))
    return None


def init_distributed(device_kind):
    """Joins the launcher's process group; returns (rank, world, torch.device)."""
    env = launcher_env()
    rank, world, local = env if env else (0, 1, 0)
    if device_kind == "cuda":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if env:
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", init_method="env://",
                                rank=rank, world_size=world)
    return rank, world, device


def finish_distributed():
    """Leaves the launcher's process group at the end of a run, once every rank is done with its collectives (a
    barrier). With torch 1.x and gloo the process then ends at once (os._exit, its output flushed) instead of
    destroying the group: there, destroying it -- destroy_process_group, or DDP's reducer letting go of it when
    the model is freed -- can deadlock, a gloo worker thread freeing a tensor that owns a Python object (it needs
    the GIL) under the group's lock, which the destructor waits for while it holds the GIL (torch 1.13: one run
    in two under Slurm on 2 cores). Newer torch destroys the group normally."""
    if not dist.is_initialized():
        return
    dist.barrier()
    if dist.get_backend() == "gloo" and int(torch.__version__.split(".")[0]) < 2:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


def all_reduce_sum(values, device):
    """Sums a list of floats over the ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def all_gather(obj):
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def param_digest(model):
    """16 hex digits over the model's parameters, in order: equal on every replica that DDP
    keeps in step. (Not the buffers: each rank's batch-norm running statistics follow its own
    batches after DDP's broadcast from rank 0 at the start of each forward.)"""
    h = hashlib.sha256()
    for name, t in getattr(model, "module", model).named_parameters():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# --- AMP ------------------------------------------------------------------------

def autocast(device, amp):
    if amp == "off":
        return nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def grad_scaler(device, amp):
    """A GradScaler for fp16 (on CUDA), else a disabled one (scale() and step() pass through)."""
    if amp == "fp16" and device.type != "cuda":
        raise SystemExit("--amp fp16 needs --device cuda (use bf16 on the CPU)")
    enabled = amp == "fp16"
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler(device.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


# --- the loop -------------------------------------------------------------------

def train_epoch(model, loader, to_input, criterion, optimizer, scheduler, scaler, args, device):
    """One epoch (at most --steps steps): autocast forward, scaled backward (DDP all-reduces the
    gradients there), optimizer and schedule step. Returns the epoch's figures, summed over the
    ranks: images, time, images/s, loss, accuracy, and this rank's data wait (WaitTimer)."""
    model.train()
    timer = WaitTimer()
    loss_sum, correct, seen = 0.0, 0, 0
    t0 = time.perf_counter()
    for images, labels in timer(loader, args.steps):
        x, y = to_input(images), labels.to(device, non_blocking=True)
        with autocast(device, args.amp):
            out = model(x)
            loss = criterion(out, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        # .item() waits for the device each step, so the step time includes the GPU's work.
        loss_sum += loss.item() * y.numel()
        correct += (out.argmax(1) == y).sum().item()
        seen += y.numel()
    elapsed = time.perf_counter() - t0
    loss_sum, correct, seen = all_reduce_sum([loss_sum, correct, seen], device)
    return dict(timer.summary(), time_s=elapsed, images=int(seen), images_per_s=seen / elapsed,
                train_loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1))


@torch.no_grad()
def evaluate(model, loader, to_input, criterion, args, device):
    """Loss and accuracy over the test split (at most --val-steps batches per rank), summed over
    the ranks. Runs the replica itself, not the DDP wrapper: no collective per batch."""
    net = getattr(model, "module", model)
    net.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for i, (images, labels) in enumerate(loader):
        if args.val_steps and i >= args.val_steps:
            break
        x, y = to_input(images), labels.to(device, non_blocking=True)
        with autocast(device, args.amp):
            out = net(x)
        loss_sum += criterion(out.float(), y).item() * y.numel()
        correct += (out.argmax(1) == y).sum().item()
        seen += y.numel()
    loss_sum, correct, seen = all_reduce_sum([loss_sum, correct, seen], device)
    return {"test_loss": loss_sum / max(seen, 1), "test_acc": correct / max(seen, 1), "test_images": int(seen)}


def log_epoch(e, epochs, rank):
    """Stops every rank on a non-finite loss (the same all-reduced value on each); rank 0 prints
    the epoch's line."""
    if not math.isfinite(e["train_loss"]):
        raise SystemExit("rank %d: the training loss is %s at epoch %d" % (rank, e["train_loss"], e["epoch"]))
    if rank == 0:
        print("epoch %d/%d: train loss %.4f acc %.1f%% | test loss %.4f acc %.1f%% (%d images) | "
              "%.1f s, %.0f img/s, data wait %.1f%% of the step"
              % (e["epoch"], epochs, e["train_loss"], 100 * e["train_acc"], e["test_loss"], 100 * e["test_acc"],
                 e["test_images"], e["time_s"], e["images_per_s"], 100 * e["wait_share"]), flush=True)


# --- timing ---------------------------------------------------------------------

class WaitTimer:
    """Wraps a batch iterable and times each next(): the wait for data. A step is the time from one
    next() to the following one (the wait plus everything the loop does with the batch)."""

    def __init__(self):
        self.wait_s, self.step_s = [], []

    def __call__(self, iterable, limit=0):
        """Yields the batches of `iterable`, at most `limit` of them (0: all). The first wait
        includes iter(iterable): a DataLoader starts its workers there."""
        it, n, t_prev = None, 0, None
        while True:
            t0 = time.perf_counter()
            if t_prev is not None:
                self.step_s.append(t0 - t_prev)
            if limit and n >= limit:
                return
            try:
                if it is None:
                    it = iter(iterable)
                batch = next(it)
            except StopIteration:
                return
            self.wait_s.append(time.perf_counter() - t0)
            t_prev = t0
            n += 1
            yield batch

    def summary(self):
        """Over the steps that ended (a loop left with break ends without its last one): the
        share of the step spent waiting, and the median wait and step."""
        w, s = sum(self.wait_s[:len(self.step_s)]), sum(self.step_s)
        return {"steps": len(self.step_s), "wait_share": w / s if s else 0.0,
                "wait_ms_p50": 1e3 * statistics.median(self.wait_s) if self.wait_s else 0.0,
                "step_ms_p50": 1e3 * statistics.median(self.step_s) if self.step_s else 0.0}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profiler(args, loader, steps_per_epoch):
    """--verdict: ringtrain.Profiler around the training loader (the first batches of each epoch not
    counted), else None."""
    if not args.verdict:
        return None
    import ringtrain

    return ringtrain.Profiler(loader, warmup=5 if steps_per_epoch > 10 else 1, staged=bool(args.stage_to))


def report(args, name, rank, world, device, epochs, model, prof=None):
    """The end of a run: every rank's parameter digest and wait share gathered; rank 0 prints
    ringtrain's verdict (--verdict) and the JSON line (--json)."""
    digests = all_gather(param_digest(model))
    shares = all_gather([e["wait_share"] for e in epochs])
    verdict = prof.result() if prof is not None else None
    if rank != 0:
        return
    if verdict is not None:
        print(verdict, flush=True)
    if not args.json:
        return
    last = epochs[-1]
    print(json.dumps({
        "script": name, "loader": args.loader, "world_size": world, "device": str(device),
        "backend": dist.get_backend() if dist.is_initialized() else None, "amp": args.amp,
        "batch_size": args.batch_size, "workers": args.workers, "threads": torch.get_num_threads(),
        "epochs": epochs,
        "epoch_time_s": [e["time_s"] for e in epochs],
        "images_per_s": last["images_per_s"],
        "data_wait_share": last["wait_share"],
        "data_wait_share_per_rank": [s[-1] for s in shares],
        "final_loss": last["train_loss"], "final_acc": last["test_acc"],
        "steps_total": sum(e["steps"] for e in epochs),
        "param_digests": digests,
        "verdict": None if verdict is None else {"limit": verdict.limit, "share": verdict.share,
                                                 "wait_ms": verdict.wait_ms, "step_ms": verdict.step_ms,
                                                 "text": verdict.verdict},
        "cpu": cpu_model(), "torch": torch.__version__,
    }), flush=True)


# --- the test-data step (--prepare) ----------------------------------------------

def prepared(args, parser, kind):
    """The scripts' --prepare DIR and --data rules: with --prepare, writes the synthetic data in both layouts
    (prepare or prepare_mnist), prints the two --data choices and returns True (the script then ends); else
    stops with a usage error when --data is missing."""
    if args.prepare:
        if kind == "mnist":
            packed, tv = prepare_mnist(args.prepare, args.synth_train, args.synth_test, args.seed)
        else:
            packed, tv = prepare(args.prepare, kind, args.synth_train, args.synth_test, args.seed)
        print("prepared: --loader ringtrain --data %s | --loader torch --data %s" % (packed, tv))
        return True
    if not args.data:
        parser.error("--data is required (or --prepare DIR)")
    return False


def prepare(root, kind, train, test, seed):
    """Writes a synthetic CIFAR-10 or CIFAR-100 in both layouts from the same records:
    root/src (ringtrain.synth: the CIFAR binary distribution's files), root/packed
    (ringtrain.pack of it) and root/torchvision/<torchvision folder> (those records as the
    python-version pickles torchvision.datasets reads). Returns (packed, torchvision root)."""
    import ringtrain

    src = os.path.join(root, "src")
    packed = os.path.join(root, "packed")
    tv = os.path.join(root, "torchvision")
    ringtrain.synth(src, kind=kind, train=train, test=test, seed=seed)
    ringtrain.pack(src, packed, force=True)
    if kind == "cifar10":
        write_cifar10_py(os.path.join(src, "cifar-10-batches-bin"), os.path.join(tv, torchvision_folder(kind)))
    else:
        write_cifar100_py(os.path.join(src, "cifar-100-binary"), os.path.join(tv, torchvision_folder(kind)))
    return packed, tv


def read_names(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def dump(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=4)  # bytes as bytes (protocol 2 writes them as latin-1 text)
    os.replace(tmp, path)


def write_cifar10_py(bin_dir, out):
    """cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin (records: label byte + 3072 pixel
    bytes) -> cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}."""
    os.makedirs(out, exist_ok=True)
    names = read_names(os.path.join(bin_dir, "batches.meta.txt"))
    files = ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(files):
        rec = np.fromfile(os.path.join(bin_dir, name + ".bin"), dtype=np.uint8).reshape(-1, 3073)
        label = "training batch %d of 5" % (i + 1) if i < 5 else "testing batch 1 of 1"
        dump({"batch_label": label, "labels": rec[:, 0].astype(np.int64).tolist(),
              "data": np.ascontiguousarray(rec[:, 1:]),
              "filenames": ["%s_%05d.png" % (name, j) for j in range(len(rec))]}, os.path.join(out, name))
    dump({"num_cases_per_batch": len(rec), "label_names": names, "num_vis": 3072},
         os.path.join(out, "batches.meta"))


def write_cifar100_py(bin_dir, out):
    """cifar-100-binary/{train,test}.bin (records: coarse byte, fine byte, 3072 pixel bytes) ->
    cifar-100-python/{train,test,meta}."""
    os.makedirs(out, exist_ok=True)
    for name in ("train", "test"):
        rec = np.fromfile(os.path.join(bin_dir, name + ".bin"), dtype=np.uint8).reshape(-1, 3074)
        dump({"batch_label": name, "coarse_labels": rec[:, 0].astype(np.int64).tolist(),
              "fine_labels": rec[:, 1].astype(np.int64).tolist(), "data": np.ascontiguousarray(rec[:, 2:]),
              "filenames": ["%s_%05d.png" % (name, j) for j in range(len(rec))]}, os.path.join(out, name))
    dump({"fine_label_names": read_names(os.path.join(bin_dir, "fine_label_names.txt")),
          "coarse_label_names": read_names(os.path.join(bin_dir, "coarse_label_names.txt"))},
         os.path.join(out, "meta"))


def local_cifar(kind):
    """torchvision's CIFAR10 / CIFAR100 for a local copy: the files are checked to exist, not
    against the md5 sums of the download (which a copy written by --prepare does not have)."""
    base = torchvision.datasets.CIFAR10 if kind == "cifar10" else torchvision.datasets.CIFAR100

    class Local(base):
        train_list = [[f, None] for f, _ in base.train_list]
        test_list = [[f, None] for f, _ in base.test_list]
        meta = dict(base.meta, md5=None)

    Local.__name__ = base.__name__
    return Local


def make_loaders(args, device, kind):
    """(train_loader, test_loader, samplers, to_input): `s.set_epoch(e)` for each of the samplers
    starts epoch e, `to_input(images)` makes a batch the model's float input on the device. kind: "cifar10"
    or "cifar100". The two input pipelines side by side: the tutorial's, and ringtrain's in its place."""
    if args.loader == "torch":
        dataset = local_cifar(kind)
        mean, std = MEAN_STD[kind]
        augment = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                             T.Normalize(mean, std)])
        plain = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
        train_set = dataset(args.data, train=True, transform=augment, download=False)
        test_set = dataset(args.data, train=False, transform=plain, download=False)
        sampler = DistributedSampler(train_set, seed=args.seed) if dist.is_initialized() else None
        test_sampler = DistributedSampler(test_set, shuffle=False) if dist.is_initialized() else None
        samplers = [sampler] if sampler is not None else []
        pin = device.type == "cuda"
        train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                                  num_workers=args.workers, pin_memory=pin, drop_last=True,
                                  persistent_workers=args.workers > 0)
        test_loader = DataLoader(test_set, batch_size=args.batch_size, sampler=test_sampler,
                                 num_workers=args.workers, pin_memory=pin)

        def to_input(images):
            return images.to(device, non_blocking=True)
    else:
        import ringtrain

        data = ringtrain.stage(args.data, to=args.stage_to) if args.stage_to else args.data
        train_loader = ringtrain.Loader(data, args.batch_size, seed=args.seed, workers=args.workers, device=device)
        test_loader = ringtrain.Loader(data, args.batch_size, split="test", shuffle=False, drop_last=False,
                                       augment="none", workers=args.workers, device=device)
        # set_epoch(e) starts epoch e, reshuffled as DistributedSampler's; the test loader's too, so that a
        # validation cut short (--val-steps) starts from its first batch again.
        samplers = [train_loader, test_loader]
        mean = torch.tensor(train_loader.mean or MEAN_STD[kind][0], device=device).view(1, -1, 1, 1)
        std = torch.tensor(train_loader.std or MEAN_STD[kind][1], device=device).view(1, -1, 1, 1)

        def to_input(images):  # uint8 (B,3,32,32), already cropped and flipped
            return (images.to(device, non_blocking=True).float().div_(255) - mean) / std
    return train_loader, test_loader, samplers, to_input


# --- MNIST (the DataParallel example) ---------------------------------------------

MNIST_MEAN_STD = ((0.1307,), (0.3081,))  # the PyTorch MNIST example's Normalize constants
MNIST_RAW = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def prepare_mnist(root, train, test, seed):
    """Writes a synthetic MNIST in both layouts from the same records: root/src (ringtrain.synth: the
    four IDX .gz files of the original distribution), root/packed (ringtrain.pack of them) and
    root/torchvision/MNIST/raw (the IDX files unpacked, where torchvision.datasets.MNIST reads them
    without downloading). Returns (packed, torchvision root)."""
    import gzip
    import shutil

    import ringtrain

    src = os.path.join(root, "src")
    packed = os.path.join(root, "packed")
    tv = os.path.join(root, "torchvision")
    ringtrain.synth(src, kind="mnist", train=train, test=test, seed=seed)
    ringtrain.pack(src, packed, force=True)
    raw = os.path.join(tv, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in MNIST_RAW:
        with gzip.open(os.path.join(src, name + ".gz"), "rb") as f, open(os.path.join(raw, name) + ".tmp", "wb") as g:
            shutil.copyfileobj(f, g)
        os.replace(os.path.join(raw, name) + ".tmp", os.path.join(raw, name))
    return packed, tv


def sample_hashes(images):
    """One 64-bit hash per image of a batch (its bytes as float32, on the CPU): what the --coverage options keep
    to count the distinct images an epoch trained on. Equal images hash equal, whichever loader made them (the
    ringtrain Loader's normalised batches are bit for bit ToTensor + Normalize of the same uint8 images)."""
    a = images.detach().to("cpu", torch.float32).contiguous().numpy()
    return [int.from_bytes(hashlib.blake2b(a[i].tobytes(), digest_size=8).digest(), "little") for i in range(len(a))]


def multiset_digest(hashes):
    """16 hex digits over a collection of sample_hashes, independent of their order: equal for two epochs that
    trained on the same images, in any order."""
    return "%016x" % (sum(hashes) % (1 << 64))


# --- a small model (the lesson and Lightning examples) ---------------------------------

class SmallNet(torch.nn.Module):
    """Three conv-BN-ReLU stages (32, 64, 128 channels; a 2x2 max-pool after each), global average pool,
    linear: a model that trains in seconds on a CPU, for the examples whose subject is the loop around it."""

    def __init__(self, num_classes=10, channels=3):
        super().__init__()
        nn = torch.nn
        layers, cin = [], channels
        for cout in (32, 64, 128):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(torch.flatten(x, 1))
