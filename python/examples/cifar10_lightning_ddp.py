#!/usr/bin/python3
"""cifar10_lightning_ddp.py - an image classifier trained by PyTorch Lightning's Trainer with DDP, as the
Lightning multi-GPU tutorials run it (the same LightningModule on one device or several; the Trainer
starts the ranks, wraps the model, all-reduces the gradients and shards the data), on CIFAR-10, with the
input pipeline chosen on the command line:

  --loader torch      a LightningDataModule returning DataLoaders over torchvision's CIFAR10
                      (RandomCrop + flip + Normalize; shuffle=True, num_workers, pin_memory on CUDA):
                      under DDP, Lightning puts a DistributedSampler in each and calls its set_epoch
  --loader ringtrain  the same LightningDataModule returning ringtrain.Loader from train_dataloader()
                      and val_dataloader(): this rank's share of each epoch (rank and world size from
                      the Trainer), cropped, flipped and normalised as the batches leave the C loader,
                      on the rank's GPU with accelerator=gpu. Lightning calls set_epoch on the loader's
                      `sampler` before each epoch, as on a DataLoader's; its sanity check reads two
                      validation batches first and the loaders are iterated again every epoch, which
                      the Loader takes as a DataLoader does (each `for` is a whole epoch; one left early
                      is given up). drop_last=False, as DataLoader's default: every image once per epoch
                      across the ranks (DistributedSampler instead repeats a few to even the ranks out)

The diff between the two is CIFARData below; the LightningModule is the same for both.

Launch (Lightning starts the other ranks itself: run the script once, as `python3 script.py`, or once per
node under srun with --num-nodes):
  /usr/bin/python3 cifar10_lightning_ddp.py --prepare data/c10 --synth-train 10000 --synth-test 1000
  /usr/bin/python3 cifar10_lightning_ddp.py --data data/c10/packed --accelerator cpu --devices 2 --strategy ddp
  /usr/bin/python3 cifar10_lightning_ddp.py --data data/c10/packed --accelerator gpu --devices 4 --strategy ddp
  /usr/bin/python3 cifar10_lightning_ddp.py --loader torch --data data/c10/torchvision --accelerator gpu --devices 1
  srun --ntasks-per-node 4 python3 cifar10_lightning_ddp.py --accelerator gpu --devices 4 --num-nodes N ...
Needs `lightning` (or `pytorch_lightning`) 2.x.

Data: --data, --prepare, --synth-train, --synth-test as cifar10_resnet18_ddp.py (a synthetic CIFAR-10 in
both layouts from the same records: DIR/packed, DIR/torchvision).

Rank 0 prints the DDP configuration (world size, batch per device, effective batch) and one line per
epoch: training loss, validation loss and accuracy (summed over the ranks), the epoch's time and images/s
of all ranks, and the images each rank trained on. --coverage hashes every training image on every rank
and adds the count of distinct ones per epoch (a crop of a sample depends on (seed, epoch, sample id)
only, so a sample seen twice in an epoch hashes the same). --json ends with one JSON line of it all and
every rank's parameter digest.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import common

try:
    import lightning.pytorch as L
except ImportError:
    try:
        import pytorch_lightning as L
    except ImportError:
        L = None


class CIFARData(L.LightningDataModule if L else object):
    """The training and validation loaders: the tutorial's DataLoaders, or ringtrain.Loader in their place."""

    def __init__(self, args):
        super().__init__()
        self.args = args

    def _torch_loader(self, train):
        import torchvision.transforms as T

        mean, std = common.MEAN_STD["cifar10"]
        tf = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if train else []
        dataset = common.local_cifar("cifar10")(self.args.data, train=train, download=False,
                                                 transform=T.Compose(tf + [T.ToTensor(), T.Normalize(mean, std)]))
        return torch.utils.data.DataLoader(dataset, batch_size=self.args.batch_size, shuffle=train,
                                           num_workers=self.args.workers, pin_memory=self.on_cuda(),
                                           persistent_workers=self.args.workers > 0)

    def _ringtrain_loader(self, train):
        import ringtrain

        t = self.trainer
        split = dict(seed=self.args.seed) if train else dict(split="test", shuffle=False, augment="none")
        return ringtrain.Loader(self.args.data, self.args.batch_size, drop_last=False, workers=self.args.workers,
                                rank=t.global_rank, world_size=t.world_size,
                                device=t.strategy.root_device if self.on_cuda() else "cpu", normalize=True, **split)

    def on_cuda(self):
        return self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self):
        return self._torch_loader(True) if self.args.loader == "torch" else self._ringtrain_loader(True)

    def val_dataloader(self):
        return self._torch_loader(False) if self.args.loader == "torch" else self._ringtrain_loader(False)


class Classifier(L.LightningModule if L else object):
    """The model, its loss and optimizer, and the per-epoch figures (summed over the ranks)."""

    def __init__(self, args):
        super().__init__()
        self.args = args
        if args.model == "resnet18":
            from cifar10_resnet18_ddp import resnet18_cifar

            self.net = resnet18_cifar(10)
        else:
            self.net = common.SmallNet(10)
        self.epochs = []
        self._val = None

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.args.lr)

    def on_fit_start(self):
        t = self.trainer
        if t.is_global_zero:
            print("DDP configuration: world size %d (%d device(s) x %d node(s), %s), batch %d per device, effective "
                  "batch %d x %d = %d, loader %s, %s %s" % (
                      t.world_size, t.num_devices, t.num_nodes, type(t.strategy).__name__, self.args.batch_size,
                      self.args.batch_size, t.world_size, self.args.batch_size * t.world_size, self.args.loader,
                      "torch.distributed" if dist.is_initialized() else "no process group",
                      dist.get_backend() if dist.is_initialized() else ""), flush=True)

    def on_train_epoch_start(self):
        self._sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, images
        self._hashes = []
        self._t0 = self._t_end = time.perf_counter()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        loss = F.cross_entropy(out, y)
        self.log("train_loss", loss, prog_bar=True, batch_size=y.numel())
        with torch.no_grad():
            self._sums += torch.stack([loss.detach().double() * y.numel(), (out.argmax(1) == y).sum().double(),
                                       torch.tensor(float(y.numel()), dtype=torch.float64, device=y.device)])
        if self.args.coverage:
            self._hashes += common.sample_hashes(x)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._t_end = time.perf_counter()

    def on_validation_epoch_start(self):
        self._vsums = torch.zeros(3, dtype=torch.float64, device=self.device)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self._vsums += torch.stack([F.cross_entropy(out.float(), y, reduction="sum").double(),
                                    (out.argmax(1) == y).sum().double(),
                                    torch.tensor(float(y.numel()), dtype=torch.float64, device=y.device)])

    def on_validation_epoch_end(self):
        loss, correct, seen = self.trainer.strategy.reduce(self._vsums, reduce_op="sum").tolist()
        self.log("val_acc", correct / max(seen, 1), prog_bar=True, sync_dist=True)  # equal on every rank
        if not self.trainer.sanity_checking:
            self._val = {"val_loss": loss / max(seen, 1), "val_acc": correct / max(seen, 1), "val_images": int(seen)}

    def on_train_epoch_end(self):
        elapsed = self._t_end - self._t0
        per_rank = common.all_gather(int(self._sums[2].item()))
        loss, correct, seen = self.trainer.strategy.reduce(self._sums.clone(), reduce_op="sum").tolist()
        e = {"epoch": self.current_epoch + 1, "images": int(seen), "images_per_rank": per_rank,
             "train_loss": loss / max(seen, 1), "train_acc": correct / max(seen, 1), "time_s": elapsed,
             "images_per_s": seen / elapsed if elapsed > 0 else 0.0}
        if self.args.coverage:
            hashes = [h for part in common.all_gather(self._hashes) for h in part]
            e.update(distinct_images=len(set(hashes)), images_digest=common.multiset_digest(hashes))
        e.update(self._val or {})
        self._val = None
        self.epochs.append(e)
        if not math.isfinite(e["train_loss"]):
            raise SystemExit("rank %d: the training loss is %s at epoch %d" % (self.global_rank, e["train_loss"],
                                                                              e["epoch"]))
        if self.trainer.is_global_zero:
            print("epoch %d/%d: train loss %.4f acc %.1f%% | val loss %.4f acc %.1f%% (%d images) | %.1f s, %.0f img/s, "
                  "images per rank %s%s" % (
                      e["epoch"], self.trainer.max_epochs, e["train_loss"], 100 * e["train_acc"],
                      e.get("val_loss", float("nan")), 100 * e.get("val_acc", float("nan")), e.get("val_images", 0),
                      e["time_s"], e["images_per_s"], e["images_per_rank"],
                      ", %d distinct" % e["distinct_images"] if self.args.coverage else ""), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", choices=("ringtrain", "torch"), default="ringtrain")
    p.add_argument("--data", help="ringtrain: a packed CIFAR-10; torch: the torchvision root holding cifar-10-batches-py")
    p.add_argument("--prepare", metavar="DIR", help="write a synthetic CIFAR-10 to DIR in both layouts and exit")
    p.add_argument("--synth-train", type=int, default=10000, help="--prepare: training records (default %(default)s)")
    p.add_argument("--synth-test", type=int, default=1000, help="--prepare: test records (default %(default)s)")
    p.add_argument("--accelerator", default="auto", help="Trainer(accelerator=...): cpu, gpu, auto (default)")
    p.add_argument("--devices", default="1", help="Trainer(devices=...): a count, or auto (default %(default)s)")
    p.add_argument("--strategy", default="auto", help="Trainer(strategy=...): ddp, auto (default), ...")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--precision", default="32-true", help="Trainer(precision=...): 32-true, bf16-mixed, 16-mixed")
    p.add_argument("--model", choices=("small", "resnet18"), default="small")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32, help="per device (default %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--workers", type=int, default=2, help="loader threads (ringtrain) or processes (torch) per rank")
    p.add_argument("--steps", type=int, default=0, help="at most this many training batches per epoch (0: all)")
    p.add_argument("--val-steps", type=int, default=0, help="at most this many validation batches per epoch (0: all)")
    p.add_argument("--threads", type=int, default=0, help="torch compute threads per rank (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--coverage", action="store_true", help="count the distinct images each epoch trained on")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    args = p.parse_args()
    if common.prepared(args, p, "cifar10"):
        return 0
    if L is None:
        raise SystemExit("this example needs PyTorch Lightning 2.x: neither `lightning` nor `pytorch_lightning` imports")
    if args.threads:
        torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, workers=True)
    devices = args.devices if args.devices == "auto" else int(args.devices)
    trainer = L.Trainer(accelerator=args.accelerator, devices=devices, strategy=args.strategy,
                        num_nodes=args.num_nodes, precision=args.precision, max_epochs=args.epochs,
                        limit_train_batches=args.steps or 1.0, limit_val_batches=args.val_steps or 1.0,
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=sys.stdout.isatty())
    model = Classifier(args)
    trainer.fit(model, datamodule=CIFARData(args))
    digests = common.all_gather(common.param_digest(model.net))
    if trainer.is_global_zero and args.json:
        print(json.dumps({
            "script": "cifar10_lightning_ddp", "loader": args.loader, "accelerator": args.accelerator,
            "devices": args.devices, "strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size,
            "precision": str(args.precision), "batch_size": args.batch_size,
            "effective_batch": args.batch_size * trainer.world_size, "epochs": model.epochs,
            "param_digests": digests, "lightning": L.__version__, "torch": torch.__version__,
            "device": str(trainer.strategy.root_device), "cpu": common.cpu_model(),
        }), flush=True)
    common.finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
