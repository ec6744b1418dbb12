#!/usr/bin/python3
"""cifar10_ddp_accum_resume.py - the DistributedDataParallel training loop that multi-GPU lessons build
after DataParallel, on CIFAR-10: gradient accumulation with no_sync() (the all-reduce only on the last
micro-batch of each update), gradient clipping, mixed precision with a GradScaler, checkpoints written by
rank 0 and loaded by every rank (resuming in the middle of an epoch), and the loss, throughput, data wait
and device memory reduced over the ranks for monitoring. The input pipeline is chosen on the command line:

  --loader torch      torchvision CIFAR10 with RandomCrop + flip + Normalize, DistributedSampler,
                      DataLoader(num_workers, pin_memory on CUDA, persistent_workers, drop_last=True)
  --loader ringtrain  ringtrain.Loader: this rank's share of each epoch, cropped and flipped in C,
                      normalised on the device; its state_dict() (the position of the next batch) goes
                      into the checkpoint, and the resumed run trains on exactly the batches the
                      uninterrupted one would have

(The two pipelines are common.make_loaders, as in cifar10_resnet18_ddp.py.) A DataLoader has no
position: resumed in the middle of an epoch, --loader torch reads and drops that epoch's first batches
again (same sampler order, other random crops).

The update. Each update is --accum micro-batches of --batch-size per rank, so the effective batch is
batch x accum x world. The first accum-1 backward passes run inside model.no_sync() and only add to
the local gradients; the last one's backward all-reduces the sum. An epoch whose step count is not a
multiple of --accum ends with a shorter update (its loss divided by its own count), so an update never
spans two epochs and a checkpoint always falls between updates. Then: unscale (fp16), clip the global
gradient norm to --clip, step, zero the gradients.

Checkpoints (--ckpt DIR): DIR/last.pt, written atomically by rank 0 every --ckpt-every updates and at the
end of each epoch: the model (the replica, without DDP's `module.` prefix), optimizer, scaler, the
position (epoch, step, updates) and every rank's Loader.state_dict(). --resume loads it on every rank
(map_location: its own device) and continues. --stop-after N writes a checkpoint after update N and
exits 0, as a preempted job would; so do SIGTERM and SIGUSR1 (Slurm's warning signals) with --ckpt: every
rank stops after the same update (one small all-reduce per update says whether any rank got one).

Monitoring (every --log-every updates, rank 0 prints): the mean loss over the ranks, images/s of all
ranks, each rank's share of the step spent waiting for data, the gradient norm, the loss scale (fp16),
and with CUDA each rank's allocated and reserved device memory.

Launch (one process per rank; gloo on the CPU, nccl on CUDA, one GPU per rank):
  /usr/bin/python3 cifar10_ddp_accum_resume.py --prepare data/c10 --synth-train 5000 --synth-test 500
  /usr/bin/python3 cifar10_ddp_accum_resume.py --spawn 2 --data data/c10/packed --accum 4 --ckpt ck   (mp.spawn)
  /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 9:1 --tee 9:1 \\
      cifar10_ddp_accum_resume.py --data data/c10/packed --accum 4 --ckpt ck --resume
  srun python3 cifar10_ddp_accum_resume.py ...   (rank and world from Slurm; see slurm_ddp.sbatch)
--spawn N starts the N ranks itself with torch.multiprocessing.spawn, on 127.0.0.1 and a free port (the
lesson's mp.spawn(main_worker, nprocs=world_size)). The Loader needs nothing for any of them: it takes
rank and world size from the initialised process group.

Data: --data, --prepare, --synth-train, --synth-test as cifar10_resnet18_ddp.py (a synthetic CIFAR-10 in
both layouts from the same records: DIR/packed, DIR/torchvision).

With --json, rank 0 ends with one JSON line: the epochs' figures, the updates, every rank's list of
update losses (its own micro-batches' mean, not reduced) and parameter digest, where the run resumed
and whether it stopped early.
"""
import argparse
import os
import signal
import socket
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def make_model(name):
    if name == "resnet18":
        from cifar10_resnet18_ddp import resnet18_cifar

        return resnet18_cifar(10)
    return common.SmallNet(10)


# --- checkpoints ------------------------------------------------------------------

def save_checkpoint(path, net, optimizer, scaler, pos, loader_states, rank):
    """Rank 0 writes the checkpoint atomically (temporary file, fsync, rename); every rank then waits for it."""
    if rank == 0:
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                 "epoch": pos["epoch"], "step": pos["step"], "updates": pos["updates"], "loaders": loader_states,
                 "world_size": len(loader_states)}
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(path, net, optimizer, scaler, device, world):
    state = torch.load(path, map_location=device)
    if state["world_size"] != world:
        raise SystemExit("%s was written by %d ranks, this run has %d: the data order differs (start afresh)"
                         % (path, state["world_size"], world))
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    return state


# --- the loop ---------------------------------------------------------------------

def skip_batches(iterable, n):
    """The batches of one pass over `iterable` after its first n (read and dropped): a DataLoader resumed mid-epoch."""
    it = iter(iterable)
    for _ in range(n):
        next(it)
    yield from it


def monitor(args, rank, world, device, epoch, i, steps, pos, losses, timer, t0, images, grad_norm, scaler):
    """Rank 0 prints the figures of the last --log-every updates, reduced over the ranks."""
    loss_sum, n, imgs = common.all_reduce_sum([sum(losses), len(losses), images], device)
    waits = common.all_gather(timer.summary()["wait_share"])
    mem = common.all_gather((torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))
                            if device.type == "cuda" else None)
    if rank != 0:
        return
    line = ("epoch %d step %d/%d update %d: loss %.4f (mean of %d ranks), %.0f img/s, data wait %s, grad norm %.3f"
            % (epoch + 1, i + 1, steps, pos["updates"], loss_sum / max(n, 1), world,
               imgs / (time.perf_counter() - t0), "/".join("%.0f%%" % (100 * w) for w in waits), grad_norm))
    if scaler.is_enabled():
        line += ", loss scale %g" % scaler.get_scale()
    if mem[0] is not None:
        line += ", memory " + " ".join("r%d %.2f/%.2f GB" % (r, a / 2**30, b / 2**30) for r, (a, b) in enumerate(mem))
    print(line, flush=True)


def train_epoch(model, loader, to_input, optimizer, scaler, args, device, rank, world, epoch, first, steps, pos,
                ckpt):
    """Micro-batches first..steps-1 of `epoch`, in updates of --accum (see the module's help). Returns the epoch's
    figures and whether the run stops here (--stop-after, or a signal: the checkpoint is then written)."""
    model.train()
    timer = common.WaitTimer()
    criterion = nn.CrossEntropyLoss()
    distributed = isinstance(model, DDP)
    batches = loader if first == 0 or args.loader == "ringtrain" else skip_batches(loader, first)
    loss_sum, correct, seen, images, window = 0.0, 0, 0, 0, []
    update_loss, grad_norm, stop = 0.0, 0.0, False
    t0 = t_log = time.perf_counter()
    for i, (x, y) in enumerate(timer(batches, steps - first), start=first):
        x, y = to_input(x), y.to(device, non_blocking=True)
        start = i - i % args.accum
        k = min(args.accum, steps - start)  # micro-batches in this update (fewer in an epoch's last)
        last = i + 1 == start + k
        with model.no_sync() if distributed and not last else nullcontext():
            with common.autocast(device, args.amp):
                out = model(x)
                loss = criterion(out, y)
            scaler.scale(loss / k).backward()  # all-reduce here only when `last`
        loss_sum += loss.item() * y.numel()
        correct += (out.argmax(1) == y).sum().item()
        seen += y.numel()
        images += y.numel()
        update_loss += loss.item() / k
        if not last:
            continue
        scaler.unscale_(optimizer)
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), args.clip)) if args.clip else 0.0
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        pos["updates"] += 1
        pos["losses"].append(update_loss)
        window.append(update_loss)
        update_loss = 0.0
        if args.log_every and pos["updates"] % args.log_every == 0:
            monitor(args, rank, world, device, epoch, i, steps, pos, window, timer, t_log, images, grad_norm, scaler)
            window, images, t_log = [], 0, time.perf_counter()
        stop = bool(args.stop_after and pos["updates"] >= args.stop_after)
        if ckpt and not stop:  # did any rank get SIGTERM / SIGUSR1? All stop after this same update.
            stop = common.all_reduce_sum([float(bool(SIGNALLED))], device)[0] > 0
        if stop or (ckpt and i + 1 < steps and args.ckpt_every and pos["updates"] % args.ckpt_every == 0):
            at = dict(pos, epoch=epoch, step=i + 1) if i + 1 < steps else dict(pos, epoch=epoch + 1, step=0)
            if ckpt:
                save_checkpoint(ckpt, getattr(model, "module", model), optimizer, scaler, at, loader_states(loader,
                                args, at), rank)
            if stop:
                break
    elapsed = time.perf_counter() - t0
    loss_sum, correct, seen = common.all_reduce_sum([loss_sum, correct, seen], device)
    return dict(timer.summary(), time_s=elapsed, images=int(seen), images_per_s=seen / elapsed,
                train_loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1)), stop


def loader_states(loader, args, at):
    """Every rank's Loader.state_dict() (rank order) where the checkpoint is mid-epoch, else None: a checkpoint
    between epochs starts the next one afresh. (--loader torch has no state: [None] * world.)"""
    state = loader.state_dict() if args.loader == "ringtrain" and at["step"] else None
    return common.all_gather(state)


SIGNALLED = []


def on_signal(signum, frame):
    SIGNALLED.append(signum)


def run(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = common.init_distributed(args.device)
    torch.manual_seed(args.seed)

    train_loader, test_loader, samplers, to_input = common.make_loaders(args, device, "cifar10")
    net = make_model(args.model).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scaler = common.grad_scaler(device, args.amp)
    ckpt = os.path.join(args.ckpt, "last.pt") if args.ckpt else None
    pos = {"epoch": 0, "step": 0, "updates": 0, "losses": []}
    resumed = None
    if ckpt and args.resume and os.path.exists(ckpt):
        state = load_checkpoint(ckpt, net, optimizer, scaler, device, world)
        pos.update(epoch=state["epoch"], step=state["step"], updates=state["updates"])
        if state["loaders"][rank] is not None:
            train_loader.load_state_dict(state["loaders"][rank])  # the next `for` finishes that epoch
        resumed = {k: state[k] for k in ("epoch", "step", "updates")}
    if ckpt:
        if rank == 0:
            os.makedirs(args.ckpt, exist_ok=True)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGUSR1, on_signal)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None) if dist.is_initialized() else net
    steps = min(len(train_loader), args.steps) if args.steps else len(train_loader)
    if rank == 0:
        print("CIFAR-10 %s: loader %s, world %d (%s, %s), %d steps/epoch, update of %d micro-batches: effective batch "
              "%d x %d x %d = %d, amp %s%s" % (
                  args.model, args.loader, world, device,
                  dist.get_backend() if dist.is_initialized() else "no process group", steps, args.accum,
                  args.batch_size, args.accum, world, args.batch_size * args.accum * world, args.amp,
                  "; resumed at epoch %(epoch)d step %(step)d (update %(updates)d)" % resumed if resumed else ""),
              flush=True)

    epochs, stopped = [], False
    for epoch in range(pos["epoch"], args.epochs):
        for s in samplers:
            s.set_epoch(epoch)  # after load_state_dict: keeps the resumed position
        first = pos["step"] if epoch == pos["epoch"] else 0
        e, stopped = train_epoch(model, train_loader, to_input, optimizer, scaler, args, device, rank, world, epoch,
                                 first, steps, pos, ckpt)
        if stopped:
            break
        e.update(common.evaluate(model, test_loader, to_input, nn.CrossEntropyLoss(), args, device), epoch=epoch + 1)
        epochs.append(e)
        common.log_epoch(e, args.epochs, rank)
        if ckpt:
            save_checkpoint(ckpt, net, optimizer, scaler, dict(pos, epoch=epoch + 1, step=0),
                            common.all_gather(None), rank)
    if stopped and rank == 0:
        print("stopped after update %d: checkpoint %s; run again with --resume to continue" % (pos["updates"], ckpt),
              flush=True)
    report(args, rank, world, device, model, epochs, pos, resumed, stopped)
    if args.loader == "ringtrain":
        train_loader.close()
        test_loader.close()
    common.finish_distributed()


def report(args, rank, world, device, model, epochs, pos, resumed, stopped):
    import json

    digests = common.all_gather(common.param_digest(model))
    losses = common.all_gather(pos["losses"])
    if rank != 0 or not args.json:
        return
    print(json.dumps({
        "script": "cifar10_ddp_accum_resume", "loader": args.loader, "model": args.model, "world_size": world,
        "device": str(device), "backend": dist.get_backend() if dist.is_initialized() else None, "amp": args.amp,
        "batch_size": args.batch_size, "accum": args.accum, "effective_batch": args.batch_size * args.accum * world,
        "epochs": epochs, "updates": pos["updates"], "update_losses": losses, "param_digests": digests,
        "resumed": resumed, "stopped": stopped, "cpu": common.cpu_model(), "torch": torch.__version__,
    }), flush=True)


def spawned(local_rank, world, port, args):
    """A rank started by --spawn: the variables torchrun would set, then the same run."""
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run(args)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(parser, "cifar10")
    parser.add_argument("--model", choices=("small", "resnet18"), default="small")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per update (default %(default)s)")
    parser.add_argument("--clip", type=float, default=1.0, help="max global gradient norm (0: no clipping)")
    parser.add_argument("--ckpt", metavar="DIR", help="write DIR/last.pt every --ckpt-every updates and each epoch")
    parser.add_argument("--ckpt-every", type=int, default=0, help="updates between mid-epoch checkpoints (0: none)")
    parser.add_argument("--resume", action="store_true", help="continue from DIR/last.pt of --ckpt when it exists")
    parser.add_argument("--stop-after", type=int, default=0, metavar="N",
                        help="stop after update N with a checkpoint, as a preempted job (0: run to the end)")
    parser.add_argument("--log-every", type=int, default=20, help="updates between monitoring lines (0: none)")
    parser.add_argument("--spawn", type=int, default=0, metavar="N",
                        help="start N ranks on this machine with torch.multiprocessing.spawn")
    parser.set_defaults(lr=1e-3, weight_decay=0.0, epochs=10)
    args = parser.parse_args()
    if common.prepared(args, parser, "cifar10"):
        return
    if args.accum < 1:
        parser.error("--accum must be at least 1")
    if (args.resume or args.stop_after) and not args.ckpt:
        parser.error("--resume and --stop-after need --ckpt DIR")
    if args.spawn:
        with socket.socket() as s:  # a free port for the rendezvous (free now; taken by rank 0 a moment later)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(spawned, args=(args.spawn, port, args), nprocs=args.spawn, join=True)
        return
    run(args)


if __name__ == "__main__":
    sys.exit(main())
