"""The tutorial ports in python/examples/ run for a few steps on the CPU, on tiny synthetic data, and train on
the right data: their JSON lines are checked for values, not only their exit codes.

- mnist_dataparallel_profile.py (DataParallel on MNIST, profiled): both loaders train on every image exactly
  once per epoch (the short last batch included): the same count, label counts and order-independent digest of
  the normalised images for ringtrain.Loader and torchvision's DataLoader; --profile gives a verdict per epoch;
  the loss falls.
- cifar10_ddp_accum_resume.py (DDP with no_sync accumulation and checkpoints, 2 ranks by --spawn): a run stopped
  after update 5 (in the middle of the second epoch) and resumed from its checkpoint ends with the parameters of
  the uninterrupted run, bit for bit, having made the same updates with the same losses on each rank.
- cifar10_lightning_ddp.py (Lightning's Trainer with DDP on 2 CPU processes, ringtrain.Loader from the
  LightningDataModule): each rank trains on its half of every epoch and together they cover every image once;
  skipped where neither `lightning` nor `pytorch_lightning` is installed.

About 25 s on a 2-core AMD EPYC (Zen 4) without Lightning, most of it the processes starting torch.
"""

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TRAIN, TEST = 330, 65  # CIFAR-shaped: odd counts, so that ranks' shares and last batches differ
MNIST_TRAIN, MNIST_TEST = 500, 60  # 7 full batches of 64 and a short one of 52


def run_example(script, *args, cwd, timeout=180):
    """Runs python/examples/SCRIPT with ARGS (one compute thread per process, no launcher variables from
    outside); fails the test on a non-zero exit. Returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    # The package this test imports, first, and every other entry made absolute: the script runs in `cwd`.
    import ringtrain

    paths = [str(Path(ringtrain.__file__).resolve().parents[1])]
    paths += [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    r = subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=cwd)
    if r.returncode != 0:
        pytest.fail(f"{script} {' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def last_json(r):
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in the output:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    """A synthetic CIFAR-10 in both layouts (DIR/packed, DIR/torchvision), written by the examples' --prepare."""
    root = tmp_path_factory.mktemp("ex-cifar")
    run_example("cifar10_ddp_accum_resume.py", "--prepare", root, "--synth-train", TRAIN, "--synth-test", TEST,
                cwd=root)
    return root


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    root = tmp_path_factory.mktemp("ex-mnist")
    run_example("mnist_dataparallel_profile.py", "--prepare", root, "--synth-train", MNIST_TRAIN,
                "--synth-test", MNIST_TEST, cwd=root)
    return root


def idx_labels(path):
    """The labels of an IDX label file (.gz): 8 header bytes, then one byte per record."""
    with gzip.open(path, "rb") as f:
        return list(f.read()[8:])


def test_mnist_dataparallel_every_image_once_per_epoch_both_loaders(mnist):
    labels = idx_labels(mnist / "src" / "train-labels-idx1-ubyte.gz")
    assert len(labels) == MNIST_TRAIN
    want_counts = [labels.count(c) for c in range(10)]
    runs = {}
    for loader, data in (("ringtrain", "packed"), ("torch", "torchvision")):
        r = run_example("mnist_dataparallel_profile.py", "--loader", loader, "--data", mnist / data, "--epochs", 2,
                        "--workers", 0, "--threads", 1, "--log-interval", 0, "--coverage", "--profile", "--json",
                        cwd=mnist)
        runs[loader] = out = last_json(r)
        assert out["loader"] == loader and out["device"] == "cpu" and out["gpus"] == 0
        assert len(out["epochs"]) == 2
        for e in out["epochs"]:
            what = f"{loader}, epoch {e['epoch']}"
            assert e["steps"] == math.ceil(MNIST_TRAIN / 64), what
            assert e["images"] == MNIST_TRAIN and e["distinct_images"] == MNIST_TRAIN, f"{what}: {e}"
            assert e["label_counts"] == want_counts, what
            assert e["test_images"] == MNIST_TEST, what
            assert math.isfinite(e["train_loss"]) and math.isfinite(e["test_loss"]), what
            prof = e["profile"]
            assert prof["limit"] in ("input", "compute") and prof["verdict"].startswith("verdict: "), f"{what}: {prof}"
            assert 0 < prof["wait_ms"] <= prof["step_ms"], f"{what}: {prof}"
        assert out["epochs"][1]["train_loss"] < out["epochs"][0]["train_loss"], f"{loader}: the loss did not fall"
        verdicts = [line for line in r.stdout.splitlines() if line.startswith("verdict: ")]
        assert len(verdicts) == 2, f"one verdict line per epoch expected:\n{r.stdout}"
    # The same 500 normalised images each epoch, whichever loader: the Loader's normalize= is bit for bit
    # ToTensor + Normalize, and each trains on every image once.
    digests = {loader: [e["images_digest"] for e in out["epochs"]] for loader, out in runs.items()}
    assert len({d for ds in digests.values() for d in ds}) == 1, digests


def test_ddp_accum_resume_gives_the_uninterrupted_run(cifar, tmp_path):
    common = ["--spawn", 2, "--data", cifar / "packed", "--epochs", 2, "--batch-size", 16, "--accum", 3,
              "--workers", 1, "--threads", 1, "--log-every", 2, "--val-steps", 1, "--json"]
    steps = TRAIN // (2 * 16)  # 10 per rank, drop_last: updates of 3, 3, 3 and 1 micro-batches per epoch
    full = last_json(run_example("cifar10_ddp_accum_resume.py", *common, cwd=tmp_path))
    assert full["world_size"] == 2 and full["backend"] == "gloo" and full["effective_batch"] == 96
    assert full["updates"] == 8 and not full["stopped"] and full["resumed"] is None
    assert [e["images"] for e in full["epochs"]] == [2 * 16 * steps] * 2
    assert [e["steps"] for e in full["epochs"]] == [steps] * 2
    assert full["param_digests"][0] == full["param_digests"][1], "the replicas differ"
    assert all(len(ls) == 8 and all(math.isfinite(v) for v in ls) for ls in full["update_losses"])

    ck = tmp_path / "ck"
    stopped = last_json(run_example("cifar10_ddp_accum_resume.py", *common, "--ckpt", ck, "--stop-after", 5,
                                    cwd=tmp_path))
    assert stopped["stopped"] and stopped["updates"] == 5 and (ck / "last.pt").is_file()
    assert stopped["update_losses"] == [ls[:5] for ls in full["update_losses"]]
    assert stopped["param_digests"][0] != full["param_digests"][0]

    resumed = last_json(run_example("cifar10_ddp_accum_resume.py", *common, "--ckpt", ck, "--resume",
                                    cwd=tmp_path))
    # Update 5 ended at micro-batch 3 of epoch 2 (index 1): the Loader's state_dict put each rank there.
    assert resumed["resumed"] == {"epoch": 1, "step": 3, "updates": 5}
    assert resumed["updates"] == 8 and not resumed["stopped"]
    assert resumed["update_losses"] == [ls[5:] for ls in full["update_losses"]]
    assert resumed["param_digests"] == full["param_digests"]


def lightning_missing():
    if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
        return "lightning is not installed (neither `lightning` nor `pytorch_lightning` imports)"
    return None


def test_lightning_ddp_two_cpu_ranks_cover_every_epoch(cifar, tmp_path):
    why = lightning_missing()
    if why:
        pytest.skip(why)
    r = run_example("cifar10_lightning_ddp.py", "--data", cifar / "packed", "--accelerator", "cpu", "--devices", 2,
                    "--strategy", "ddp", "--epochs", 2, "--batch-size", 16, "--workers", 1, "--threads", 1,
                    "--coverage", "--json", cwd=tmp_path, timeout=240)
    out = last_json(r)
    assert out["world_size"] == 2 and out["strategy"] == "DDPStrategy" and len(out["epochs"]) == 2
    half = (TRAIN + 1) // 2, TRAIN // 2  # drop_last=False: every image once, rank 0 the odd one
    for e in out["epochs"]:
        what = f"epoch {e['epoch']}: {e}"
        assert sorted(e["images_per_rank"], reverse=True) == list(half), what
        assert e["images"] == TRAIN and e["distinct_images"] == TRAIN, what
        assert e["val_images"] == TEST, what
        assert math.isfinite(e["train_loss"]) and math.isfinite(e["val_loss"]), what
    assert out["epochs"][1]["train_loss"] < out["epochs"][0]["train_loss"], "the loss did not fall"
    assert out["param_digests"][0] == out["param_digests"][1], "the replicas differ"
