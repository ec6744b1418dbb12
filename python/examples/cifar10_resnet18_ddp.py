#!/usr/bin/python3
"""cifar10_resnet18_ddp.py - ResNet-18 on CIFAR-10 with DistributedDataParallel, as the PyTorch
tutorials train it, with the input pipeline chosen on the command line:

  --loader torch      torchvision.datasets.CIFAR10 with RandomCrop(32, padding=4),
                      RandomHorizontalFlip, ToTensor, Normalize; DistributedSampler (set_epoch
                      every epoch); DataLoader(num_workers=--workers, pin_memory on CUDA)
  --loader ringtrain  ringtrain.Loader over a packed dataset: uint8 (B,3,32,32) batches, cropped
                      and flipped by the C loader, every rank its own share of each epoch;
                      normalised on the device with the dataset's mean and std (manifest.json)

Everything else (model, SGD + cosine schedule, AMP, the loop, validation on the test split each
epoch with the accuracy summed over the ranks) is the same code for both.

The model is the CIFAR variant of ResNet-18: torchvision's resnet18 with a 3x3 stride-1 stem
and no max-pool (32x32 inputs keep their resolution into the first stage).

Launch (one process per rank; gloo on the CPU, nccl on CUDA, one GPU per rank):
  /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
      cifar10_resnet18_ddp.py --loader ringtrain --data PACKED
  srun python3 cifar10_resnet18_ddp.py ...          (see slurm_ddp.sbatch)
  python3 cifar10_resnet18_ddp.py ...               (a world of one)
Debian's torch 1.13 on Python 3.11 needs `--redirects 9:1 --tee 9:1` after torch.distributed.run
(its launcher fails at the defaults).

Data:
  --loader torch      --data ROOT, ROOT/cifar-10-batches-py as torchvision downloads it
  --loader ringtrain  --data PACKED, from `ringtrain pack cifar-10-binary.tar.gz --out PACKED`
                      or ringtrain.pack(...); --stage-to PARENT copies it to node-local disk first
  --prepare DIR       a synthetic CIFAR-10 in both layouts from the same records (DIR/packed,
                      DIR/torchvision), then exit; sizes --synth-train, --synth-test

Rank 0 prints one line per epoch and, with --json, one JSON line at the end: per-epoch time,
images/s (all ranks), the share of the step spent waiting for data (time blocked in the
loader's next() over the step time), losses and accuracies, world size, every rank's parameter
digest (equal when the replicas agree).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def resnet18_cifar(num_classes=10):
    model = torchvision.models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(parser, "cifar10")
    args = parser.parse_args()
    if common.prepared(args, parser, "cifar10"):
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = common.init_distributed(args.device)
    torch.manual_seed(args.seed)

    train_loader, test_loader, samplers, to_input = common.make_loaders(args, device, "cifar10")
    model = resnet18_cifar(10).to(device)
    if dist.is_initialized():
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, nesterov=True)
    steps_per_epoch = min(len(train_loader), args.steps) if args.steps else len(train_loader)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * steps_per_epoch)
    scaler = common.grad_scaler(device, args.amp)
    prof = common.profiler(args, train_loader, steps_per_epoch)
    if rank == 0:
        print("ResNet-18 on CIFAR-10: loader %s, world %d (%s, %s), %d steps/epoch of %d x %d images, amp %s"
              % (args.loader, world, device, dist.get_backend() if dist.is_initialized() else "no process group",
                 steps_per_epoch, world, args.batch_size, args.amp), flush=True)

    epochs = []
    for epoch in range(args.epochs):
        for s in samplers:
            s.set_epoch(epoch)
        e = common.train_epoch(model, prof or train_loader, to_input, criterion, optimizer, scheduler, scaler,
                               args, device)
        e.update(common.evaluate(model, test_loader, to_input, criterion, args, device), epoch=epoch + 1)
        epochs.append(e)
        common.log_epoch(e, args.epochs, rank)
    common.report(args, "cifar10_resnet18_ddp", rank, world, device, epochs, model, prof)
    if args.loader == "ringtrain":
        train_loader.close()
        test_loader.close()
    common.finish_distributed()


if __name__ == "__main__":
    main()
