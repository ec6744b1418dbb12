#!/usr/bin/python3
"""mnist_dataparallel_profile.py - the MNIST convolutional network trained with nn.DataParallel, as the
PyTorch MNIST example and the GPU workshops built on it run it (Adadelta, StepLR, a test pass after
every epoch), with its training loop profiled, and the input pipeline chosen on the command line:

  --loader torch      torchvision.datasets.MNIST with ToTensor + Normalize((0.1307,), (0.3081,));
                      DataLoader(shuffle=True, num_workers=--workers, pin_memory on CUDA)
  --loader ringtrain  ringtrain.Loader over a packed MNIST: float32 (B,1,28,28) batches normalised
                      with the same constants as they leave the C loader (normalize=...), on cuda:0
                      with --device cuda; drop_last=False, as DataLoader's default: every image once
                      per epoch, the last batch shorter

The diff between the two is make_loaders() below; train() and test() are the same for both (the
ringtrain loader needs no set_epoch here either: each `for` over it is the next epoch, reshuffled).

DataParallel is one process driving every GPU it sees: each batch goes to cuda:0, is split across
the GPUs for the forward pass, and the gradients are summed back on cuda:0. With one GPU, or on the
CPU, the model runs unwrapped (as in the workshop). The loader is rank 0 of a world of 1 whatever
started the script: under `srun`, the Loader would otherwise take its share of the data from Slurm's
variables, which name tasks, not the GPUs of one process.

Profiling. The workshop runs the script under `kernprof -l` and reads line_profiler's time per line
of train(); that still works here (train() and test() carry @profile when kernprof runs the script).
--profile asks the question those numbers are read for -- is the input pipeline the limit? --
with ringtrain.Profiler around the training loader (either loader): after each epoch, the median
wait for a batch, the median step, images/s and the verdict in the words of `ringtrain train`
(input-bound when the step waits 15 % of its time or more), with what to try.

Launch (one process; CUDA_VISIBLE_DEVICES chooses the GPUs DataParallel uses):
  /usr/bin/python3 mnist_dataparallel_profile.py --prepare data/mnist --synth-train 6000 --synth-test 1000
  /usr/bin/python3 mnist_dataparallel_profile.py --loader ringtrain --data data/mnist/packed --epochs 2 --profile
  /usr/bin/python3 mnist_dataparallel_profile.py --loader torch --data data/mnist/torchvision --epochs 2 --profile
  srun --ntasks=1 --gres=gpu:2 python3 mnist_dataparallel_profile.py --device cuda ...   (one task, two GPUs)

Data:
  --loader torch      --data ROOT with ROOT/MNIST/raw/*-ubyte, as torchvision downloads it
  --loader ringtrain  --data PACKED, from `ringtrain pack DIR --out PACKED` (DIR holding the four
                      IDX .gz files of the MNIST distribution) or ringtrain.pack(...)
  --prepare DIR       a synthetic MNIST in both layouts from the same records (DIR/packed,
                      DIR/torchvision, DIR/src the IDX .gz files), then exit; --synth-train, --synth-test

Prints the training loss every --log-interval batches and one line per epoch; with --json, one JSON
line at the end: per epoch the steps, images and label counts trained on (with --coverage the distinct
images and their order-independent digest), losses, test accuracy, time, images/s and the profile;
the parameter digest.
"""
import argparse
import builtins
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader

import common

# kernprof -l puts `profile` into builtins; a plain run gets a decorator that changes nothing.
profile = getattr(builtins, "profile", lambda f: f)


class Net(nn.Module):
    """The PyTorch MNIST example's network: 3x3 convolutions of 32 and 64 channels, a 2x2 max-pool,
    dropout, 9216 -> 128 -> 10 linear layers, log-softmax."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.drop1 = nn.Dropout(0.25)
        self.drop2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(self.drop1(x), 1)))
        return F.log_softmax(self.fc2(self.drop2(x)), dim=1)


def make_loaders(args, device):
    """(train_loader, test_loader): the tutorial's DataLoaders, or ringtrain.Loader in their place."""
    mean, std = common.MNIST_MEAN_STD
    if args.loader == "torch":
        import torchvision
        import torchvision.transforms as T

        tf = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
        train_set = torchvision.datasets.MNIST(args.data, train=True, transform=tf, download=False)
        test_set = torchvision.datasets.MNIST(args.data, train=False, transform=tf, download=False)
        pin = device.type == "cuda"
        return (DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=pin),
                DataLoader(test_set, batch_size=args.test_batch_size, num_workers=args.workers, pin_memory=pin))
    import ringtrain

    opts = dict(workers=args.workers, device=device, normalize=(mean, std), rank=0, world_size=1)
    train_loader = ringtrain.Loader(args.data, args.batch_size, drop_last=False, seed=args.seed, **opts)
    test_loader = ringtrain.Loader(args.data, args.test_batch_size, split="test", shuffle=False, drop_last=False,
                                   **opts)
    return train_loader, test_loader


@profile
def train(args, model, device, loader, optimizer, epoch, steps):
    """One epoch (`steps` batches of `loader`, any iterable of them). Returns its figures."""
    model.train()
    loss_sum, seen, done = 0.0, 0, 0
    counts = torch.zeros(10, dtype=torch.int64, device=device)
    hashes = []
    t0 = time.perf_counter()
    for batch_idx, (data, target) in enumerate(loader):
        if batch_idx >= steps:
            break
        data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        n = target.numel()
        loss_sum += loss.item() * n  # .item() waits for the device: the step time includes its work
        seen += n
        done += 1
        counts += torch.bincount(target, minlength=10)
        if args.coverage:
            hashes += common.sample_hashes(data)
        if args.log_interval and batch_idx % args.log_interval == 0:
            print("train epoch %d [batch %d/%d]: loss %.6f" % (epoch, batch_idx, steps, loss.item()), flush=True)
    elapsed = time.perf_counter() - t0
    e = {"epoch": epoch, "steps": done, "images": seen, "train_loss": loss_sum / max(seen, 1),
         "label_counts": counts.tolist(), "time_s": elapsed, "images_per_s": seen / elapsed}
    if args.coverage:
        e.update(distinct_images=len(set(hashes)), images_digest=common.multiset_digest(hashes))
    return e


@profile
@torch.no_grad()
def test(model, device, loader):
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for data, target in loader:
        data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
        output = model(data)
        loss_sum += F.nll_loss(output, target, reduction="sum").item()
        correct += (output.argmax(1) == target).sum().item()
        seen += target.numel()
    return {"test_loss": loss_sum / max(seen, 1), "test_acc": correct / max(seen, 1), "test_images": seen}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", choices=("ringtrain", "torch"), default="ringtrain")
    p.add_argument("--data", help="ringtrain: a packed MNIST; torch: the torchvision root holding MNIST/raw")
    p.add_argument("--prepare", metavar="DIR", help="write a synthetic MNIST to DIR in both layouts and exit")
    p.add_argument("--synth-train", type=int, default=60000, help="--prepare: training records (default %(default)s)")
    p.add_argument("--synth-test", type=int, default=10000, help="--prepare: test records (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="the whole batch, split over the GPUs")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=14)
    p.add_argument("--lr", type=float, default=1.0, help="Adadelta's learning rate (default %(default)s)")
    p.add_argument("--gamma", type=float, default=0.7, help="StepLR's factor per epoch (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="loader threads (ringtrain) or processes (torch)")
    p.add_argument("--steps", type=int, default=0, help="at most this many batches per epoch (0: all)")
    p.add_argument("--log-interval", type=int, default=10, help="batches between loss lines (0: none)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0, help="torch compute threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true",
                   help="time the training loop with ringtrain.Profiler and print its verdict after each epoch")
    p.add_argument("--coverage", action="store_true",
                   help="hash every training image (after normalisation): each epoch's count of distinct images and "
                        "an order-independent digest of them go into its figures (equal for both loaders when each "
                        "trains on every image once)")
    p.add_argument("--json", action="store_true", help="print one JSON line of figures at the end")
    args = p.parse_args()
    if common.prepared(args, p, "mnist"):
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    train_loader, test_loader = make_loaders(args, device)
    model = Net()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus > 1:
        model = nn.DataParallel(model)
    model = model.to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    steps = min(len(train_loader), args.steps) if args.steps else len(train_loader)
    print("MNIST net: loader %s, %s, %s, %d steps/epoch of %d images" % (
        args.loader, device, "DataParallel over %d GPUs" % gpus if gpus > 1 else "no DataParallel (one device)",
        steps, args.batch_size), flush=True)

    epochs = []
    for epoch in range(1, args.epochs + 1):
        prof = None
        if args.profile:
            import ringtrain

            prof = ringtrain.Profiler(train_loader, warmup=5 if steps > 10 else 1)
        e = train(args, model, device, prof or train_loader, optimizer, epoch, steps)
        e.update(test(model, device, test_loader))
        scheduler.step()
        if not math.isfinite(e["train_loss"]):
            raise SystemExit("the training loss is %s at epoch %d" % (e["train_loss"], epoch))
        print("epoch %d/%d: train loss %.4f (%d images, %.1f s, %.0f img/s) | test loss %.4f, accuracy %.1f%% "
              "(%d images)" % (epoch, args.epochs, e["train_loss"], e["images"], e["time_s"], e["images_per_s"],
                               e["test_loss"], 100 * e["test_acc"], e["test_images"]), flush=True)
        if prof is not None:
            try:
                r = prof.result()
            except ValueError as err:  # an epoch too short to measure past the warm-up
                print("profile: %s" % err, flush=True)
            else:
                print(r, flush=True)
                e["profile"] = {"steps": r.steps, "wait_ms": r.wait_ms, "step_ms": r.step_ms, "share": r.share,
                                "limit": r.limit, "images_per_s": r.images_per_s, "verdict": r.verdict}
        epochs.append(e)
    if args.json:
        print(json.dumps({"script": "mnist_dataparallel_profile", "loader": args.loader, "device": str(device),
                          "gpus": gpus, "batch_size": args.batch_size, "workers": args.workers,
                          "threads": torch.get_num_threads(), "epochs": epochs,
                          "param_digest": common.param_digest(model), "cpu": common.cpu_model(),
                          "torch": torch.__version__}), flush=True)
    if args.loader == "ringtrain":
        train_loader.close()
        test_loader.close()


if __name__ == "__main__":
    main()
