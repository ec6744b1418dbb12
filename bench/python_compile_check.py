"""python_compile_check.py WORKDIR [--device cuda|cpu] [--epochs N] - a torch.compile'd model fed by
ringtrain.Loader must compile once, not once per batch.

A small CNN, wrapped in torch.compile (inductor), trains for N epochs (default 2) of a synthetic CIFAR-10
(1000 training records, batch 64: 15 full batches and, with drop_last=False, a short one of 40) in each of
these cases, each from a fresh compile (torch._dynamo.reset()):

  case                                               graphs allowed
  uint8 batches, drop_last=True                      1
  normalize=True, drop_last=False                    2: one more for the short last batch, which dynamo
                                                     recompiles once with a dynamic batch size (automatic
                                                     dynamic shapes); the next epochs' short batches reuse it
  normalize=True, drop_last=False, mark_dynamic      1: torch._dynamo.mark_dynamic(images, 0) on every batch
                                                     compiles for any batch size from the start
  normalize=True, channels_last, bfloat16,           2 (as above), the model channels_last under autocast
  drop_last=False

The graphs are counted by torch._dynamo.utils.counters["stats"]["unique_graphs"] (one per graph dynamo
compiles, recompiles included). A per-batch recompile -- a guard on something that changes with every batch
the Loader hands over (an address, a storage offset, a stride) -- shows as one graph per batch, up to dynamo's
cache_size_limit (8 by default), after which dynamo silently runs the model uncompiled: both exceed the
allowance. Exit 0 when every case is within it, 1 otherwise (or when the count cannot be read), 0 with a
message on torch < 2 (no torch.compile). Prints each case's graphs, compile time (the first step) and the
steady step time. On the GPU machine: bench/python_gpu.sh KIT SECONDS compile. About a minute on a GPU (four
compiles of forward and backward); on a CPU, inductor needs a C++ compiler and takes longer.
"""
import argparse
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="a scratch folder: the synthetic dataset is written there")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train", type=int, default=1000, help="training records (default %(default)s)")
    args = p.parse_args()

    import torch

    if int(torch.__version__.split(".")[0]) < 2 or not hasattr(torch, "compile"):
        print("compile check: skipped: torch %s has no torch.compile (torch 2 or newer needed)" % torch.__version__)
        return 0
    import torch._dynamo
    import torch.nn as nn
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    import ringtrain

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data = os.path.join(args.work, "packed")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        ringtrain.synth(os.path.join(args.work, "src"), kind="cifar10", train=args.train, test=100, seed=3)
        ringtrain.pack(os.path.join(args.work, "src"), data, force=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(32)
            self.c2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(64)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            if x.dtype == torch.uint8:  # the uint8 case: the conversion inside the compiled graph
                x = x.float() / 255.0
            x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
            x = F.relu(self.b2(self.c2(x)))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    cases = [
        ("uint8 batches, drop_last=True", dict(drop_last=True), False, False, 1),
        ("normalize=True, drop_last=False", dict(normalize=True, drop_last=False), False, False, 2),
        ("normalize=True, drop_last=False, mark_dynamic", dict(normalize=True, drop_last=False), True, False, 1),
        ("normalize=True, channels_last, bfloat16, drop_last=False",
         dict(normalize=True, channels_last=True, dtype=torch.bfloat16, drop_last=False), False, True, 2),
    ]
    print("compile check: torch %s, %s, %d epochs of %d records in batches of %d" % (
        torch.__version__, torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", args.epochs,
        args.train, args.batch_size), flush=True)
    bad = 0
    for name, opts, dynamic, bf16, allowed in cases:
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        net = Net().to(device)
        if opts.get("channels_last"):
            net = net.to(memory_format=torch.channels_last)
        model = torch.compile(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        loader = ringtrain.Loader(data, args.batch_size, workers=2, device=device, seed=1, **opts)
        sizes, times, graphs_after = set(), [], []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                t0 = time.perf_counter()
                if dynamic:
                    torch._dynamo.mark_dynamic(images, 0)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = F.cross_entropy(model(images), labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss.item()  # waits for the device: the step's time is its work
                times.append(time.perf_counter() - t0)
                sizes.add(int(images.shape[0]))
                graphs_after.append(counters["stats"]["unique_graphs"])
        loader.close()
        graphs = graphs_after[-1] if graphs_after else 0
        tail = sorted(times[len(times) // 2:])  # the second half's median: the compiles are over by then
        steady = tail[len(tail) // 2] if tail else 0.0
        # after which steps a graph was compiled (1-based): where a per-batch recompile would show
        new = [i + 1 for i, g in enumerate(graphs_after) if g > (graphs_after[i - 1] if i else 0)]
        ok = 1 <= graphs <= allowed
        if graphs == 0:
            why = "no graph counted: torch._dynamo.utils.counters['stats']['unique_graphs'] is not read this way here"
        elif graphs > allowed:
            why = "RECOMPILES: %d graphs where %d are allowed" % (graphs, allowed)
        else:
            why = "ok"
        print("  %-58s %d steps, batch sizes %s: %d graph(s) (compiled at steps %s; allowed %d), first step "
              "%.1f s, steady step %.1f ms: %s" % (name, len(times), sorted(sizes), graphs, new, allowed,
                                                  times[0] if times else 0.0, 1e3 * steady, why), flush=True)
        bad += not ok
    print("compile check: %s" % ("FAILED" if bad else "every case compiled within its allowance"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
