"""python_gpu_check.py WORKDIR - ringtrain.Loader(device="cuda") against device="cpu" on a small synthetic
dataset: the same batches (values, order, the short last batch) over two epochs, the same digest, and a
resume mid-epoch on the GPU that gives the rest of the epoch. Exit 1 on any difference. Run by
bench/python_gpu.sh on a GPU machine; python/tests/test_loader.py's test_cuda_batches_are_the_cpu_batches is the same
check where pytest is at hand."""
import sys

import torch

import ringtrain


def main(work):
    ringtrain.synth(work + "/src", train=3000, test=500, seed=5)
    ringtrain.pack(work + "/src", work + "/packed")
    bad = 0
    for opts in (dict(batch_size=64, seed=3, drop_last=False, workers=4, digest=True),
                 dict(batch_size=100, seed=9, workers=2, digest=True)):
        with ringtrain.Loader(work + "/packed", **opts) as cpu:
            want = [[(x.clone(), y.clone()) for x, y in cpu] for _ in range(2)]
            want_digest = cpu.digest()
        with ringtrain.Loader(work + "/packed", device="cuda", **opts) as gpu:
            got = [[(x, y) for x, y in gpu] for _ in range(2)]
            digest = gpu.digest()
        same = all(len(g) == len(w) and all(a.is_cuda and torch.equal(a.cpu(), c) and torch.equal(b.cpu(), d)
                                            for (a, b), (c, d) in zip(g, w)) for g, w in zip(got, want))
        print(f"check {opts}: cuda batches {'equal' if same else 'DIFFER'} to cpu over 2 epochs "
              f"({sum(map(len, got))} batches); digest {digest} vs {want_digest}", flush=True)
        bad += (not same) + (digest != want_digest)
        with ringtrain.Loader(work + "/packed", device="cuda", **opts) as gpu:
            it = iter(gpu)
            for _ in range(5):
                next(it)
            del it
            st = gpu.state_dict()
        with ringtrain.Loader(work + "/packed", device="cuda", **opts) as gpu:
            gpu.load_state_dict(st)
            rest = [(x.cpu(), y.cpu()) for x, y in gpu]
        ok = len(rest) == len(want[0]) - 5 and all(torch.equal(a, c) and torch.equal(b, d)
                                                    for (a, b), (c, d) in zip(rest, want[0][5:]))
        print(f"check {opts}: cuda resume at step 5 {'gives' if ok else 'does NOT give'} the rest of the epoch",
              flush=True)
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
