#!/usr/bin/python3
"""cifar100_wrn_amp.py - Wide-ResNet (WRN-16-4 by default) on CIFAR-100 with mixed precision and
DistributedDataParallel, with the input pipeline chosen on the command line:

  --loader torch      torchvision.datasets.CIFAR100 with RandomCrop(32, padding=4),
                      RandomHorizontalFlip, ToTensor, Normalize; DistributedSampler; DataLoader
  --loader ringtrain  ringtrain.Loader over a packed CIFAR-100 (`ringtrain pack` of
                      cifar-100-binary.tar.gz: fine labels); normalised on the device

Mixed precision (--amp, default bf16): the forward pass and the loss under torch.autocast;
bf16 on the CPU or a GPU that has it, fp16 on CUDA with a GradScaler (the loss scaled before
backward, the step skipped when the gradients overflow). The weights and the optimizer stay fp32.

The network is Zagoruyko and Komodakis' WRN-d-k: a 3x3 stem of 16 channels, three stages of
(d-4)/6 pre-activation basic blocks of 16k, 32k and 64k channels (strides 1, 2, 2), BN-ReLU,
global average pool, linear; --depth d (6n+4) and --width k, --dropout between the two
convolutions of each block (0.3 in the paper's CIFAR runs, 0 by default here).

Launch, data, --prepare and the output are those of cifar10_resnet18_ddp.py (see its --help):
  /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
      cifar100_wrn_amp.py --loader ringtrain --data PACKED_CIFAR100
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import common


class WideBlock(nn.Module):
    """Pre-activation basic block: BN-ReLU-conv3x3-BN-ReLU-(dropout)-conv3x3, plus the input (or its
    1x1 projection, taken after the first BN-ReLU, where the shape changes)."""

    def __init__(self, cin, cout, stride, dropout):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.project = None
        if stride != 1 or cin != cout:
            self.project = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x):
        o = F.relu(self.bn1(x))
        y = self.conv1(o)
        y = self.conv2(self.drop(F.relu(self.bn2(y))))
        return y + (x if self.project is None else self.project(o))


class WideResNet(nn.Module):
    def __init__(self, depth=16, width=4, num_classes=100, dropout=0.0):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError("WRN depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 40...), not %d" % depth)
        n = (depth - 4) // 6
        widths = (16, 16 * width, 32 * width, 64 * width)
        self.stem = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        blocks, cin = [], widths[0]
        for cout, stride in zip(widths[1:], (1, 2, 2)):
            for i in range(n):
                blocks.append(WideBlock(cin, cout, stride if i == 0 else 1, dropout))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = F.relu(self.bn(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(parser, "cifar100")
    parser.add_argument("--depth", type=int, default=16, help="6n+4 (default %(default)s)")
    parser.add_argument("--width", type=int, default=4, help="widening factor k (default %(default)s)")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.set_defaults(amp="bf16")
    args = parser.parse_args()
    if common.prepared(args, parser, "cifar100"):
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = common.init_distributed(args.device)
    torch.manual_seed(args.seed)

    train_loader, test_loader, samplers, to_input = common.make_loaders(args, device, "cifar100")
    model = WideResNet(args.depth, args.width, 100, args.dropout).to(device)
    if dist.is_initialized():
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, nesterov=True)
    steps_per_epoch = min(len(train_loader), args.steps) if args.steps else len(train_loader)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * steps_per_epoch)
    scaler = common.grad_scaler(device, args.amp)  # fp16: loss scaling; otherwise a pass-through
    prof = common.profiler(args, train_loader, steps_per_epoch)
    if rank == 0:
        print("WRN-%d-%d on CIFAR-100: loader %s, world %d (%s, %s), %d steps/epoch of %d x %d images, amp %s"
              % (args.depth, args.width, args.loader, world, device,
                 dist.get_backend() if dist.is_initialized() else "no process group",
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
    common.report(args, "cifar100_wrn_amp", rank, world, device, epochs, model, prof)
    if args.loader == "ringtrain":
        train_loader.close()
        test_loader.close()
    common.finish_distributed()


if __name__ == "__main__":
    main()
