"""The same batches from train, loadbench and Python by construction: each takes its augmentation and crop from
the loader's one rule (rt_loader_opts_for), so with nothing but the data, batch size and seed given -- every
default left as it is -- `ringtrain train --batch-digest`, `ringtrain loadbench --digest` and the Loader's
digest() agree over an epoch, on MNIST-shaped data (1 channel: no augmentation by default), CIFAR-shaped data
(crop + flip) and images of their own sizes (RandomResizedCrop + flip). Each pair is also checked to differ from
the other augmentation (an explicit --aug), so that a rule applied nowhere cannot pass."""

import json

import pytest

import ringtrain

BATCH, SEED, S = 16, 4, 32


def train_digest(cli, data, *extra):
    """The batch digest `train --batch-digest --json` reports for one epoch of the training split."""
    r = cli("train", "--data", data, "--model", "mnist-net", "--batch-size", BATCH, "--seed", SEED, "--epochs", 1,
            "--threads", 1, "--workers", 1, "--no-progress", "--batch-digest", "--json", *extra)
    line = [l for l in r.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["batch_digest"]


def python_digest(data, **opts):
    with ringtrain.Loader(data, BATCH, seed=SEED, workers=2, digest=True, **opts) as loader:
        n = sum(1 for _ in loader)
        assert n == len(loader)
        return loader.digest()


@pytest.mark.parametrize("kind", ["mnist", "cifar", "variable"])
def test_train_loadbench_and_python_take_the_same_batches(request, cli, loadbench_digest, kind):
    data = {"mnist": lambda: request.getfixturevalue("mnist"), "cifar": lambda: request.getfixturevalue("data"),
            "variable": lambda: request.getfixturevalue("photos")}[kind]()
    size = dict(image_size=S) if kind == "variable" else {}
    size_cli = ("--image-size", S) if kind == "variable" else ()
    lb = loadbench_digest(data, batch_size=BATCH, seed=SEED, epochs=1, workers=1, **size)
    py = python_digest(data, **size)
    tr = train_digest(cli, data, *size_cli)
    assert lb == py == tr, f"{kind}: loadbench {lb}, Python {py}, train {tr}"
    # The default is a rule, not whatever: the other choice gives other batches (1 channel: none by default).
    other = "crop,flip" if kind == "mnist" else "none"
    lb_other = loadbench_digest(data, batch_size=BATCH, seed=SEED, epochs=1, workers=1, aug=other, **size)
    py_other = python_digest(data, augment="crop+flip" if kind == "mnist" else "none", **size)
    tr_other = train_digest(cli, data, "--aug", other, *size_cli)
    assert lb_other == py_other == tr_other != lb, \
        f"{kind}, --aug {other}: loadbench {lb_other}, Python {py_other}, train {tr_other} (default {lb})"


@pytest.mark.parametrize("kind,spec,plain", [
    ("cifar", "crop,flip,jitter=0.4,erase=0.5,cutout=8", "crop,flip"),
    ("mnist", "crop=2,brightness=0.5,contrast=0.5,erase", "crop=2"),
    ("variable", "crop,flip,crop-scale=0.4:0.7,saturation=0.5", "crop,flip")])
def test_named_operations_are_the_same_everywhere(request, cli, loadbench_digest, kind, spec, plain):
    """The named operations (--aug / augment=) are one spelling and one implementation for the three."""
    data = request.getfixturevalue({"cifar": "data", "mnist": "mnist", "variable": "photos"}[kind])
    size = dict(image_size=S) if kind == "variable" else {}
    size_cli = ("--image-size", S) if kind == "variable" else ()
    lb = loadbench_digest(data, batch_size=BATCH, seed=SEED, epochs=1, workers=1, aug=spec, **size)
    py = python_digest(data, augment=spec, **size)
    tr = train_digest(cli, data, "--aug", spec, *size_cli)
    without = python_digest(data, augment=plain, **size)
    assert lb == py == tr != without, f"{kind}, {spec}: loadbench {lb}, Python {py}, train {tr} (without: {without})"


def test_accumulation_takes_the_same_batches(cli, loadbench_digest, mnist):
    """--grad-accum is part of the global order (updates of batch x ranks x accumulation samples, the epoch's last
    N mod that left out): train and loadbench --grad-accum take the same batches. 480 records in updates of 16 x 4:
    7 whole updates, 28 batches where 30 make the epoch without accumulation."""
    lb = loadbench_digest(mnist, batch_size=BATCH, seed=SEED, epochs=1, workers=1, grad_accum=4)
    tr = train_digest(cli, mnist, "--grad-accum", 4)
    plain = loadbench_digest(mnist, batch_size=BATCH, seed=SEED, epochs=1, workers=1)
    assert lb == tr != plain, f"--grad-accum 4: loadbench {lb}, train {tr} (without: {plain})"
