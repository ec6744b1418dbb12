#!/usr/bin/python3
"""torch_ddp.py - the PyTorch side of bench/ddp_vs_pytorch.sh: one rank of
DistributedDataParallel training on the CPU (gloo), fp32.

Launched once per rank by torch.distributed.run (it reads RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT from the environment; run directly, without them, it
is a world of 1):

  /usr/bin/python3 -m torch.distributed.run --nnodes 1 --nproc_per_node N \\
      --rdzv_backend c10d --rdzv_endpoint localhost:PORT --rdzv_id ID \\
      --redirects 9:1 --tee 9:1 bench/torch_ddp.py --model resnet18 ...

(the last two options work around torch 1.13's launcher on Python 3.11, which
fails with "'NoneType' object has no attribute 'get'" at its defaults; see
bench/ddp_vs_pytorch.sh).

Each rank trains ringtrain's model as PyTorch defines it
(tools/reference_models.py, build(name, 3, 32, 32, 10)) wrapped in
DistributedDataParallel(bucket_cap_mb=--bucket-cap-mb), on its own fixed
synthetic batch: a random uint8 (B,3,32,32) batch and random labels made once
(seeded by --seed + rank, so ranks see different data), then per step what
ringtrain does to a uint8 batch, (x.float() / 255 - mean) / std, the forward
pass, CrossEntropyLoss, zero_grad(set_to_none=True), backward (where DDP
all-reduces the gradient buckets, overlapped with the rest of the backward),
SGD(lr 0.1, momentum 0.9, nesterov False, weight_decay 5e-4).step(). The model
starts identical on every rank (DDP broadcasts rank 0's at construction).
By default DDP also broadcasts rank 0's buffers (batch-norm running
statistics) at the start of every forward, synced or not: a small blocking
collective that both kinds of step below pay; --no-broadcast-buffers turns it
off.

Timing: --warmup synced steps first, untimed (DDP builds its buckets on the
first step and rebuilds them in backward order after it), then --steps timed
steps of each of two kinds:
  synced   ordinary DDP steps;
  no-sync  the same steps under model.no_sync(): no gradient all-reduce, so
           the rank's computation alone (the optimizer then steps on local
           gradients, which changes nothing in the cost).
They run in blocks, --rounds of them each way, the kind that goes first
swapping each round (no-sync, synced, synced, no-sync, ...) so that a slow
drift of the machine's speed falls on both; a barrier separates blocks, so a
synced block starts with the ranks together as in steady DDP training. Each
step is timed on each rank (perf_counter around the whole step); afterwards
the per-step times are all-reduced with MAX, so step i's time is that of the
slowest rank, as the world waits for it. Medians of those:
  step_time_s         synced step time
  nosync_step_time_s  no-sync step time
  exposed_comm_frac   max(0, (step_time_s - nosync_step_time_s) / step_time_s):
                      the share of a synced step that the gradient all-reduce
                      adds (communication not hidden behind the backward, the
                      gloo threads' CPU time taken from compute, waits for the
                      slower rank). DDP's own timeline does not show where its
                      backward ends and its last all-reduce finishes, so the
                      difference of the two kinds stands in for it.
  images_per_s        world x batch / step_time_s (global)
Per-rank figures (each rank's own medians) are in "per_rank".

Rank 0 prints a human summary on stderr and, last on stdout, one line holding
one JSON object {"impl": "pytorch-ddp", "model", "world_size",
"batch_per_rank", "threads", "bucket_cap_mb", "step_time_s", "images_per_s",
"nosync_step_time_s", "exposed_comm_frac", ...}; the other ranks print nothing.

Usage:
  torch_ddp.py --check
  torch_ddp.py [--model M] [--batch-size B] [--threads T] [--bucket-cap-mb X]
               [--steps N] [--warmup W] [--rounds R] [--no-broadcast-buffers]
               [--seed S]
"""
import argparse
import json
import os
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))


def reference_models():
    sys.path.insert(0, os.path.join(here, "..", "tools"))
    import reference_models
    return reference_models


def check():
    """Exit 0 when torch, torchvision, gloo and tools/reference_models.py are usable; prints versions."""
    try:
        import torch
        import torch.distributed as dist
        import torchvision
    except Exception as e:  # ImportError, or a broken install
        print("missing: %s (%s)" % (e, e.__class__.__name__))
        return 1
    if not dist.is_available() or not dist.is_gloo_available():
        print("torch %s has no torch.distributed gloo backend" % torch.__version__)
        return 1
    try:
        reference_models()
    except Exception as e:
        print("tools/reference_models.py does not import: %s: %s" % (e.__class__.__name__, e))
        return 1
    print("torch %s torchvision %s (gloo)" % (torch.__version__, torchvision.__version__))
    return 0


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "RANK" not in os.environ:  # started directly: a world of 1
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # The launcher sets OMP_NUM_THREADS=1; the thread count is ours to choose.
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rm = reference_models()
    try:
        model = rm.build(a.model, 3, 32, 32, 10)
    except ValueError as e:
        sys.exit("torch_ddp.py: %s" % e)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb, broadcast_buffers=not a.no_broadcast_buffers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, nesterov=False, weight_decay=5e-4)
    sys.path.insert(0, here)
    from torch_train import synthetic_step
    step = synthetic_step(torch, ddp, opt, a.batch_size, a.seed + rank)  # each rank its own batch

    def timed(n, sync):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            if sync:
                loss = step()
            else:
                with ddp.no_sync():
                    loss = step()
            ts.append(time.perf_counter() - t0)
        return ts, float(loss)

    for _ in range(a.warmup):
        step()
    # Blocks of about steps/rounds steps; the last may be shorter.
    sizes = [a.steps // a.rounds + (1 if i < a.steps % a.rounds else 0) for i in range(a.rounds)]
    t_sync, t_nosync = [], []
    loss = 0.0
    for r, n in enumerate(sizes):
        for sync in ((False, True) if r % 2 == 0 else (True, False)):
            dist.barrier()
            ts, loss = timed(n, sync)
            (t_sync if sync else t_nosync).extend(ts)

    # Each step's time on the slowest rank.
    both = torch.tensor(t_sync + t_nosync, dtype=torch.float64)
    mine = both.clone()
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    slow_sync = both[:a.steps].tolist()
    slow_nosync = both[a.steps:].tolist()
    # Each rank's own medians, for per-rank exposed communication.
    own = torch.tensor([statistics.median(mine[:a.steps].tolist()), statistics.median(mine[a.steps:].tolist()),
                        loss], dtype=torch.float64)
    all_own = [torch.zeros_like(own) for _ in range(world)]
    dist.all_gather(all_own, own)
    dist.destroy_process_group()
    if rank != 0:
        return 0

    def frac(ts, tn):
        return max(0.0, (ts - tn) / ts) if ts > 0 else 0.0

    st = statistics.median(slow_sync)
    sn = statistics.median(slow_nosync)
    per_rank = [{"rank": i, "step_time_s": float(o[0]), "nosync_step_time_s": float(o[1]),
                 "exposed_comm_frac": frac(float(o[0]), float(o[1])), "loss": float(o[2])}
                for i, o in enumerate(all_own)]
    losses = [p["loss"] for p in per_rank]
    if any(x != x for x in losses):  # NaN: the timing still stands, but say so
        print("torch_ddp.py: %s: the loss is NaN on some rank" % a.model, file=sys.stderr)
    result = {"impl": "pytorch-ddp", "model": a.model, "world_size": world, "batch_per_rank": a.batch_size,
              "threads": torch.get_num_threads(), "bucket_cap_mb": a.bucket_cap_mb, "steps": a.steps,
              "warmup": a.warmup, "rounds": a.rounds, "step_time_s": st, "images_per_s": world * a.batch_size / st,
              "nosync_step_time_s": sn, "nosync_images_per_s": world * a.batch_size / sn,
              "exposed_comm_frac": frac(st, sn),
              "step_time_min_s": min(slow_sync), "step_time_max_s": max(slow_sync),
              "params": nparams, "grad_mb": nparams * 4 / 2**20, "loss": losses[0], "per_rank": per_rank,
              "broadcast_buffers": not a.no_broadcast_buffers,
              "torch": torch.__version__, "backend": "gloo",
              "note": "%d x %d images, %d threads/rank, buckets of %g MB, %d+%d steps after %d warm-up, "
                      "no-sync %.1f ms" % (world, a.batch_size, torch.get_num_threads(), a.bucket_cap_mb,
                                           a.steps, a.steps, a.warmup, 1e3 * sn)}
    print("pytorch-ddp %-10s world %d: %8.1f images/s, step %.1f ms (no-sync %.1f ms), exposed comm %.1f %%  (%s)"
          % (a.model, world, result["images_per_s"], 1e3 * st, 1e3 * sn, 100 * result["exposed_comm_frac"],
             result["note"]), file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="check torch, torchvision, gloo; print versions; exit")
    p.add_argument("--model", default="resnet18", help="mnist-net, resnet18, resnet9, wrn-D-K (default resnet18)")
    p.add_argument("--batch-size", type=int, default=64, help="images per step per rank (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (default 25)")
    p.add_argument("--steps", type=int, default=30, help="timed steps of each kind, synced and no-sync (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed synced steps first (default 3)")
    p.add_argument("--rounds", type=int, default=2,
                   help="blocks of each kind, alternating which goes first (default 2; at most --steps)")
    p.add_argument("--no-broadcast-buffers", action="store_true",
                   help="DDP broadcast_buffers=False: no broadcast of rank 0's batch-norm statistics each forward")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.check:
        return check()
    if a.batch_size < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.bucket_cap_mb <= 0 or a.rounds < 1:
        p.error("--batch-size, --threads, --steps, --rounds must be >= 1, --warmup >= 0, --bucket-cap-mb > 0")
    a.rounds = min(a.rounds, a.steps)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
