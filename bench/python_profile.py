#!/usr/bin/python3
"""python_profile.py - does ringtrain.profile name the input pipeline where it is the limit, and only there?

Staged cases, each a loader feeding a training step (forward, cross-entropy,
backward, SGD; batch --batch-size, uint8 images normalised in the step),
profiled with ringtrain.profile(loader, steps=S, warmup=K, body=step):

  input     DataLoader(torchvision CIFAR10, num_workers=0) with a heavy transform
            (RandomCrop(32, 4), RandomHorizontalFlip, AutoAugment(CIFAR10 policy),
            PILToTensor) feeding a small CNN (two 3x3 stride-2 convolutions, 16
            and 32 channels): the step waits for its data.  Expected: input-bound.
  compute   DataLoader(torchvision CIFAR10, num_workers=0) with the light CIFAR
            transform (RandomCrop(32, 4), RandomHorizontalFlip, PILToTensor)
            feeding torchvision's ResNet-18 (10 classes): the model is the
            limit.                                      Expected: not input-bound.
  rt-big    ringtrain.Loader (same crop + flip, --workers threads) feeding the
            same ResNet-18.                             Expected: not input-bound.
  rt-small  ringtrain.Loader feeding the small CNN of "input": the same step
            once the input is fast.                     Expected: not input-bound.

The cases are alternated --runs times (the first case rotates every run), in
this one process (torch threads: --threads, default torch's own default). Each run prints the verdict's
limit, the medians ringtrain.profile measured and whether the verdict is
right; then a markdown table (medians over the runs, verdicts right in how
many runs) and each case's verdict in the C trainer's words, from its median
run; with --json, one JSON line last.

The dataset is python_loader.py's (made when absent under --data, kept).

Usage:
  PYTHONPATH=build/python bench/python_profile.py [--data DIR] [--runs R]
      [--steps S] [--warmup K] [--batch-size B] [--workers W] [--threads T]
      [--cases LIST] [--json]
About 1 minute on 2 quiet cores with the defaults.
Exit status: 0 when every verdict was right, 1 when one was wrong or a case
failed, 2 on a usage error or a missing prerequisite.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import python_loader as common  # noqa: E402  (the dataset, the machine lines)

NAME = "python_profile"
CASES = ("input", "compute", "rt-big", "rt-small")
EXPECT = {"input": True, "compute": False, "rt-big": False, "rt-small": False}
WHAT = {
    "input": ("DataLoader, num_workers=0, crop + flip + AutoAugment", "small CNN"),
    "compute": ("DataLoader, num_workers=0, crop + flip", "ResNet-18"),
    "rt-big": ("ringtrain.Loader, crop + flip", "ResNet-18"),
    "rt-small": ("ringtrain.Loader, crop + flip", "small CNN"),
}


def small_cnn(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


def make_step(torch, model):
    """The training step on one (uint8 images, int64 labels) batch; returns nothing, but reads
    the loss (as a training loop printing it would)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
    model.train()

    def step(batch):
        images, labels = batch
        x = (images.float().div_(255) - mean) / std
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


class Case:
    """One staged case: a loader (made anew each run, as a script would) and its model step."""

    def __init__(self, name, a, torch, torchvision, ringtrain):
        self.name, self.a, self.torch, self.tv_mod, self.rt = name, a, torch, torchvision, ringtrain
        torch.manual_seed(0)
        big = name in ("compute", "rt-big")
        self.model = torchvision.models.resnet18(num_classes=10) if big else small_cnn(torch)
        self.step = make_step(torch, self.model)

    def loader(self):
        a, torch = self.a, self.torch
        if self.name.startswith("rt-"):
            return self.rt.Loader(a.packed, a.batch_size, seed=0, workers=a.workers)
        T = self.tv_mod.transforms
        tf = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
        if self.name == "input":
            tf.append(T.AutoAugment(T.AutoAugmentPolicy.CIFAR10))
        tf.append(T.PILToTensor())
        ds = common.torchvision_cifar10(a.tv)(a.tv, train=True, transform=T.Compose(tf), download=False)
        return torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, drop_last=True,
                                           num_workers=0)

    def run(self):
        loader = self.loader()
        try:
            p = self.rt.profile(loader, steps=self.a.steps, warmup=self.a.warmup, body=self.step, quiet=True)
        finally:
            if hasattr(loader, "close"):
                loader.close()
        return p


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(common.TOP, "data", "bench-python"),
                   help="the dataset (python_loader.py's; made when absent, kept) (default %(default)s)")
    p.add_argument("--train", type=int, default=50000, help="training records when it is made (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="rounds of the cases (default %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="measured steps per case and run (default %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured steps first (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="ringtrain.Loader workers (default: nproc, %(default)s)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads for the model steps (default 0: torch's own default)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of %s" % ", ".join(CASES))
    p.add_argument("--json", action="store_true", help="print one JSON summary line last")
    a = p.parse_args(argv)
    if min(a.runs, a.steps, a.batch_size, a.workers) < 1 or min(a.warmup, a.threads) < 0 or a.train < a.batch_size:
        p.error("--runs, --steps, --batch-size and --workers must be >= 1, --warmup and --threads >= 0, "
                "--train >= --batch-size")
    a.cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in a.cases if c not in CASES]
    if bad or not a.cases:
        p.error("--cases takes %s, not %s" % (", ".join(CASES), ",".join(bad) or "nothing"))
    return a


def main(argv):
    a = parse(argv)
    try:
        import torch
        import torchvision
    except ImportError as e:
        common.fail("PyTorch for %s is missing (%s); install: apt-get install -y python3-torch python3-torchvision"
                    % (sys.executable, e))
    try:
        import ringtrain
    except ImportError as e:
        common.fail("the ringtrain package does not import (%s); build it and run with PYTHONPATH=<build>/python" % e)
    common.NAME = NAME
    if a.threads:
        torch.set_num_threads(a.threads)

    print("== ringtrain.profile: is the input the limit? staged cases each way ==")
    common.machine_lines()
    print("software: ringtrain %s; Python %s; torch %s (threads: %d), torchvision %s" % (
        ringtrain.__version__, platform.python_version(), torch.__version__, torch.get_num_threads(),
        torchvision.__version__))
    a.packed, a.tv = common.make_dataset(os.path.abspath(a.data), a.train)
    print("dataset:  %s and %s/cifar-10-batches-py (the same synthetic records)" % (a.packed, a.tv))
    print("settings: batch %d, %d warm-up + %d measured steps per case and run, %d runs alternated;"
          % (a.batch_size, a.warmup, a.steps, a.runs))
    print("          ringtrain.Loader workers %d; ringtrain.profile(loader, steps=%d, warmup=%d, body=step)"
          % (a.workers, a.steps, a.warmup))
    print("          (input-bound: the median wait is >= 15 % of the median step, the C trainer's rule)")

    meter = common.LoadMeter()
    cases = {c: Case(c, a, torch, torchvision, ringtrain) for c in a.cases}
    res = {c: [] for c in a.cases}
    fails = 0
    for i in range(a.runs):
        k = i % len(a.cases)
        print("run %d/%d" % (i + 1, a.runs), flush=True)
        for c in a.cases[k:] + a.cases[:k]:
            t = time.perf_counter()
            try:
                p = cases[c].run()
            except Exception as e:  # a case that cannot run is reported, the others go on
                print("  %-9s FAILED: %s: %s" % (c, type(e).__name__, e))
                fails += 1
                continue
            right = p.input_bound == EXPECT[c]
            res[c].append({"limit": p.limit, "input_bound": p.input_bound, "wait_ms": p.wait_ms,
                           "step_ms": p.step_ms, "share": p.share, "images_per_s": p.images_per_s,
                           "verdict": p.verdict, "right": right, "wall_s": time.perf_counter() - t})
            print("  %-9s %-8s wait %7.1f ms of a %7.1f ms step (%3.0f %%), %6.0f img/s: %s" % (
                c, p.limit, p.wait_ms, p.step_ms, 100 * p.share, p.images_per_s, "right" if right else "WRONG"),
                flush=True)
    print()
    print("Medians of %d runs, batch %d, %d CPUs (%s), torch %s, threads %d." % (
        a.runs, a.batch_size, len(os.sched_getaffinity(0)), common.cpu_model(), torch.__version__,
        torch.get_num_threads()))
    print()
    print("| case | loader | model | wait ms | step ms | wait share | min - max share | verdict | expected | right |")
    print("|---|---|---|---:|---:|---:|---:|---|---|---|")
    out = {"bench": NAME, "cpu": common.cpu_model(), "nproc": len(os.sched_getaffinity(0)),
           "batch_size": a.batch_size, "runs": a.runs, "steps": a.steps, "cases": {}}
    wrong = 0
    for c in a.cases:
        rs = res[c]
        want = "input-bound" if EXPECT[c] else "not input-bound"
        if not rs:
            print("| %s | %s | %s | n/a | | | | | %s | failed |" % (c, WHAT[c][0], WHAT[c][1], want))
            continue
        shares = [r["share"] for r in rs]
        n_right = sum(r["right"] for r in rs)
        wrong += len(rs) - n_right
        limits = sorted(set(r["limit"] for r in rs))
        print("| %s | %s | %s | %.1f | %.1f | %.0f %% | %.0f - %.0f %% | %s | %s | %s |" % (
            c, WHAT[c][0], WHAT[c][1], statistics.median(r["wait_ms"] for r in rs),
            statistics.median(r["step_ms"] for r in rs), 100 * statistics.median(shares), 100 * min(shares),
            100 * max(shares), "/".join(limits), want,
            "yes (%d of %d runs)" % (n_right, len(rs)) if n_right == len(rs) else
            "NO (%d of %d runs right)" % (n_right, len(rs))))
        out["cases"][c] = {"expected_input_bound": EXPECT[c], "limits": [r["limit"] for r in rs],
                           "right": n_right, "runs": len(rs), "wait_ms": statistics.median(r["wait_ms"] for r in rs),
                           "step_ms": statistics.median(r["step_ms"] for r in rs),
                           "share": statistics.median(shares)}
    print()
    for c in a.cases:
        rs = sorted(res[c], key=lambda r: r["share"])
        if rs:
            mid = rs[(len(rs) - 1) // 2]
            print("%s (%s -> %s), the run with the median share:" % (c, WHAT[c][0], WHAT[c][1]))
            print("  " + mid["verdict"].replace("\n", "\n  "))
    print()
    out["load"] = meter.report()
    out["all_right"] = wrong == 0 and fails == 0
    if a.json:
        print(json.dumps(out))
    if fails or wrong:
        print("%s: %d verdict(s) wrong, %d case run(s) failed" % (NAME, wrong, fails), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
