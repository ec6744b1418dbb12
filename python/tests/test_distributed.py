"""Two ranks under torch.distributed (gloo, two processes): each Loader takes its rank and world size from
the process group, every sample of an epoch comes out exactly once across the ranks, and both ranks get the
same number of batches (drop_last=False, a split that does not divide evenly)."""

import collections
import os

import torch

import ringtrain
from rtcheck import SPLITS, sample_keys

WORLD = 2
# split -> (batch_size, epochs): the test split's 501 records leave one rank a record short
PLAN = {"train": (96, 2), "test": (64, 1)}


def rank_main(rank, init_file, data):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    # What the launcher variables say must lose against the initialised process group.
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")):
        os.environ[k] = v
    out = {"dist_rank": dist.get_rank()}
    for split, (batch, epochs) in PLAN.items():
        with ringtrain.Loader(data, batch, split=split, shuffle=True, drop_last=False, augment="none", seed=5,
                              workers=1, digest=True) as loader:
            runs = []
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                keys, sizes = [], []
                for images, labels in loader:
                    sizes.append(images.shape[0])
                    keys += sample_keys(images, labels)
                runs.append({"keys": keys, "sizes": sizes})
            n = torch.tensor([len(runs[0]["sizes"])])
            lo, hi = n.clone(), n.clone()
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            out[split] = {"len": len(loader), "runs": runs, "min_batches": int(lo), "max_batches": int(hi),
                          "digest": loader.digest() if epochs == 1 else None}
    dist.barrier()
    dist.destroy_process_group()
    return out


def dataset_keys(data, split):
    ds = ringtrain.Dataset(data, split)
    keys = []
    for i in range(len(ds)):
        img, label = ds[i]
        keys += sample_keys(img.transpose(2, 0, 1)[None], torch.tensor([label]))
    return collections.Counter(keys)


def test_two_gloo_ranks_cover_the_epoch_once(data, tmp_path, forked_group, loadbench_digest):
    calls = [(rank_main, (r, str(tmp_path / "rendezvous"), data)) for r in range(WORLD)]
    res = forked_group(calls, timeout=120)
    assert [r["dist_rank"] for r in res] == list(range(WORLD))
    for split, (batch, epochs) in PLAN.items():
        want = dataset_keys(data, split)
        assert sum(want.values()) == SPLITS[split]
        steps = -(-SPLITS[split] // (WORLD * batch))
        for r in res:
            assert r[split]["len"] == steps, f"{split}: len(loader) {r[split]['len']}, expected {steps}"
            assert r[split]["min_batches"] == r[split]["max_batches"] == steps
        for epoch in range(epochs):
            per_rank = [r[split]["runs"][epoch] for r in res]
            for rank, run in enumerate(per_rank):
                assert len(run["sizes"]) == steps, f"{split} epoch {epoch} rank {rank}: {len(run['sizes'])} batches"
                assert all(s == batch for s in run["sizes"][:-1]), f"{split} rank {rank}: sizes {run['sizes']}"
            got = collections.Counter(k for run in per_rank for k in run["keys"])
            twice = sum(1 for k, n in got.items() if n > 1)
            missing = sum(1 for k in want if k not in got)
            extra = sum(1 for k in got if k not in want)
            assert got == want, (f"{split} epoch {epoch}: {sum(got.values())} samples over {WORLD} ranks for "
                                 f"{SPLITS[split]} records: {twice} seen more than once, {missing} missing, "
                                 f"{extra} not in the split")
        if epochs > 1:
            for rank, r in enumerate(res):
                orders = [run["keys"] for run in r[split]["runs"]]
                assert orders[0] != orders[1], f"{split} rank {rank}: epochs 0 and 1 in the same order"
        else:
            for rank, r in enumerate(res):
                want_digest = loadbench_digest(data, split=split, batch_size=batch, seed=5, shuffle="exact",
                                               aug="none", last="pad", world=WORLD, rank=rank, epochs=1, workers=1)
                assert r[split]["digest"] == want_digest, f"{split} rank {rank}: digest {r[split]['digest']}, " \
                                                          f"loadbench --world 2 --rank {rank}: {want_digest}"
