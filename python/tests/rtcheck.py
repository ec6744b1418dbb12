"""Values and small functions the ringtrain package's tests share (conftest.py holds the fixtures)."""

import errno
import hashlib

# The dataset conftest.py makes: synthetic CIFAR-10, packed with a 10 % validation split.
TRAIN_RAW, TEST_RAW, SEED = 2000, 501, 26
SPLITS = {"train": 1800, "val": 200, "test": 501}
C, H, W = 3, 32, 32
RECORD = C * H * W
SHARD = {"train": "train-00000.rts", "val": "val-00000.rts", "test": "test-00000.rts"}

# The variable-size dataset conftest.py makes from rt_mkfolder's image folder (pack --max-side).
PHOTOS_PER_CLASS, MAX_SIDE = 20, 256


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def error_info(e):
    """What a test checks of a ringtrain.Error, as plain values (they cross a pipe)."""
    return {"type": type(e).__name__, "errno": e.errno, "str": str(e), "strerror": e.strerror,
            "oserror": isinstance(e, OSError), "ebusy": e.errno == errno.EBUSY}


def sample_keys(images, labels):
    """One hashable key per sample of a batch: (blake2b of its CHW bytes, label)."""
    import numpy as np

    a = np.ascontiguousarray(images.numpy() if hasattr(images, "numpy") else images)
    lab = labels.tolist()
    return [(hashlib.blake2b(a[i].tobytes(), digest_size=16).hexdigest(), int(lab[i])) for i in range(len(lab))]


def clone_epoch(it):
    """Every batch of an iteration, copied: [(images, labels)]."""
    return [(x.clone(), y.clone()) for x, y in it]


def take(loader, n):
    """The next n batches of one iteration of `loader`, cloned (they hold no slot), the iteration then left."""
    out = []
    for x, y in loader:
        out.append((x.clone(), y.clone()))
        if len(out) == n:
            break
    return out


def assert_same_batches(got, want, what):
    import torch

    assert len(got) == len(want), f"{what}: {len(got)} batches, expected {len(want)}"
    for k, ((x, y), (xr, yr)) in enumerate(zip(got, want)):
        assert x.shape == xr.shape and torch.equal(y, yr), f"{what}: batch {k}: labels {y[:8].tolist()}... " \
            f"shape {tuple(x.shape)}, expected {yr[:8].tolist()}... shape {tuple(xr.shape)}"
        assert torch.equal(x, xr), f"{what}: batch {k}: images differ in " \
            f"{int((x != xr).any(dim=(1, 2, 3)).sum())} of {x.shape[0]} samples"
