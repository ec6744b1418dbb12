"""ringtrain.Loader's batches are the C loader's: the digest `ringtrain loadbench --digest` prints for the same
options, the records themselves when nothing is augmented, and the CIFAR crop + flip of them when it is."""

import numpy as np
import pytest
import torch

import ringtrain
from rtcheck import SPLITS, TEST_RAW, assert_same_batches, clone_epoch

# (Loader options, the loadbench options that mean the same, the epochs to run, loadbench's --workers)
CASES = {
    "train-exact-crop+flip": (dict(split="train", batch_size=64, seed=3, shuffle=True, augment="crop+flip",
                                   drop_last=True, workers=2), 2, 2),
    "test-in-order-pad": (dict(split="test", batch_size=50, seed=0, shuffle=False, augment="none",
                               drop_last=False, workers=1), 1, 1),
    "train-rank1-of-2-pad": (dict(split="train", batch_size=32, seed=7, shuffle=True, augment="crop+flip",
                                  drop_last=False, workers=2, rank=1, world_size=2), 1, 2),
    # the batches do not depend on the worker count: 1 worker here, 2 in loadbench
    "val-other-workers": (dict(split="val", batch_size=16, seed=11, shuffle=True, augment="crop+flip",
                               drop_last=True, workers=1), 1, 2),
}


def loadbench_options(o, epochs, workers):
    return dict(split=o["split"], batch_size=o["batch_size"], seed=o["seed"],
                shuffle="exact" if o["shuffle"] else "none", aug="crop,flip" if o["augment"] == "crop+flip" else "none",
                last="drop" if o["drop_last"] else "pad", world=o.get("world_size", 1), rank=o.get("rank", 0),
                epochs=epochs, workers=workers)


def expected_batches(o):
    """(batches per epoch, samples in the last batch) by the C sampler's rule."""
    share = SPLITS[o["split"]] // o.get("world_size", 1)  # every split here divides evenly between 2 ranks
    b = o["batch_size"]
    if o["drop_last"]:
        return share // b, b
    steps = -(-share // b)
    return steps, share - (steps - 1) * b


@pytest.mark.parametrize("case", list(CASES))
def test_digest_equals_loadbench(data, loadbench_digest, case):
    opts, epochs, lb_workers = CASES[case]
    steps, last = expected_batches(opts)
    seen = []
    with ringtrain.Loader(data, digest=True, **opts) as loader:
        assert len(loader) == steps
        for epoch in range(epochs):
            sizes = []
            for images, labels in loader:
                assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32), images.shape
                assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
                assert 0 <= int(labels.min()) and int(labels.max()) < 10
                sizes.append(images.shape[0])
            assert sizes == [opts["batch_size"]] * (steps - 1) + [last], f"epoch {epoch}: batch sizes {sizes}"
            got = loader.digest()
            want = loadbench_digest(data, **loadbench_options(opts, epoch + 1, lb_workers))
            assert got == want, f"after epoch {epoch}: Loader.digest() {got}, loadbench --digest {want}"
            seen.append(got)
    assert len(set(seen)) == len(seen), f"the digest did not change from one epoch to the next: {seen}"


def test_digest_differs_with_seed(data):
    digests = []
    for seed in (1, 2):
        with ringtrain.Loader(data, 64, seed=seed, workers=2, digest=True) as loader:
            for _ in loader:
                pass
            digests.append(loader.digest())
    assert digests[0] != digests[1], f"seeds 1 and 2 give the same digest {digests[0]}"


def test_unaugmented_in_order_batches_are_the_records(data, raw_test_records):
    want_x, want_y = raw_test_records
    with ringtrain.Loader(data, 50, split="test", shuffle=False, augment="none", drop_last=False,
                          workers=2) as loader:
        batches = clone_epoch(loader)
    x = torch.cat([b[0] for b in batches]).numpy()
    y = torch.cat([b[1] for b in batches]).numpy()
    assert x.shape == want_x.shape, f"{x.shape} samples in the epoch, the file holds {want_x.shape}"
    bad = np.nonzero((x != want_x).reshape(TEST_RAW, -1).any(axis=1))[0]
    assert bad.size == 0, f"{bad.size} images differ from the synthetic file's records, first at record {bad[0]}"
    assert np.array_equal(y, want_y), f"labels differ at records {np.nonzero(y != want_y)[0][:10].tolist()}"


def crops_and_flips(images, records, pad=4):
    """For each augmented image: (dy, dx, flipped) of a crop of the zero-padded record that it equals, or None."""
    from numpy.lib.stride_tricks import sliding_window_view

    n, c, h, w = records.shape
    padded = np.zeros((n, c, h + 2 * pad, w + 2 * pad), np.uint8)
    padded[:, :, pad:pad + h, pad:pad + w] = records
    win = sliding_window_view(padded, (h, w), axis=(2, 3))  # (n, c, 2pad+1, 2pad+1, h, w)
    found = []
    for i in range(n):
        for flipped, img in ((False, images[i]), (True, images[i][:, :, ::-1])):
            hit = (win[i] == img[:, None, None]).all(axis=(0, 3, 4))
            if hit.any():
                dy, dx = map(int, np.argwhere(hit)[0])
                found.append((dy, dx, flipped))
                break
        else:
            found.append(None)
    return found


def test_crop_flip_is_a_padded_crop_of_the_record(data, raw_test_records):
    records, labels = raw_test_records
    with ringtrain.Loader(data, 64, split="test", shuffle=False, augment="crop+flip", drop_last=False, seed=9,
                          workers=2) as loader:
        batches = clone_epoch(loader)
    x = torch.cat([b[0] for b in batches]).numpy()
    assert np.array_equal(torch.cat([b[1] for b in batches]).numpy(), labels)
    found = crops_and_flips(x, records)
    missing = [i for i, f in enumerate(found) if f is None]
    assert not missing, f"{len(missing)} augmented images are no crop (pad 4) or flipped crop of their record, " \
                        f"first: record {missing[0]}"
    flips = sum(f[2] for f in found)
    offsets = {f[:2] for f in found}
    # 501 samples: a fair coin and 81 offsets give far more than these
    assert 150 < flips < 350, f"{flips} of {TEST_RAW} images flipped"
    assert len(offsets) > 40, f"only {len(offsets)} distinct crop offsets"


def test_augmentation_depends_on_the_sample_not_the_batch(data):
    """The crop and flip of a sample follow (seed, epoch, sample): the same in batches of 64 and of 50."""
    epochs = {}
    for b in (64, 50):
        with ringtrain.Loader(data, b, split="test", shuffle=False, augment="crop+flip", drop_last=False, seed=9,
                              workers=2) as loader:
            epochs[b] = torch.cat([x for x, _ in clone_epoch(loader)])
    assert torch.equal(epochs[64], epochs[50])


@pytest.mark.parametrize("env,rank,world", [
    ({}, 0, 1),
    ({"RANK": "1", "WORLD_SIZE": "2"}, 1, 2),
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}, 1, 2),  # inside an srun step
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, 0, 1),  # the batch shell's python: a world of one
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 2),
    # RANK/WORLD_SIZE (torchrun) come before Slurm's, Slurm's before Open MPI's
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, 1, 2),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     0, 2),
])
def test_rank_and_world_from_the_launcher(data, monkeypatch, env, rank, world):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    opts = dict(batch_size=32, seed=7, drop_last=False, workers=2)
    with ringtrain.Loader(data, **opts) as loader:
        got = clone_epoch(loader)
    with ringtrain.Loader(data, rank=rank, world_size=world, **opts) as loader:
        want = clone_epoch(loader)
    assert_same_batches(got, want, f"{env or 'no launcher variables'}: rank {rank} of {world}")
    other = 1 - rank if world == 2 else None
    if other is not None:
        with ringtrain.Loader(data, rank=other, world_size=world, **opts) as loader:
            x, _ = next(iter(loader))
            assert not torch.equal(x, want[0][0]), "ranks 0 and 1 start with the same batch"


def test_bad_arguments_raise_before_anything_runs(data):
    with pytest.raises(ValueError):
        ringtrain.Loader(data, 0)
    with pytest.raises(ValueError):
        ringtrain.Loader(data, 32, split="training")
    with pytest.raises(ValueError):
        ringtrain.Loader(data, 32, augment="crop,rotate")  # no such operation
    with pytest.raises(ValueError):
        ringtrain.Loader(data, 32, rank=2, world_size=2)


def test_too_small_split_for_the_batch_is_an_error_not_an_empty_epoch(data):
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.Loader(data, 256, split="val", world_size=1, rank=0)  # 200 records, drop_last
    assert e.value.errno > 0 and str(e.value), e.value


def test_stats_count_what_was_handed_out(data):
    with ringtrain.Loader(data, 64, workers=2) as loader:
        for _ in loader:
            pass
        s = loader.stats()
    assert (s["batches"], s["images"]) == (28, 28 * 64), {k: s.get(k) for k in ("batches", "images")}
    assert s["decoded_images"] == SPLITS["train"]
    shares = s["shares"]
    for stage in ("io", "checksum", "decompress", "decode", "augment"):
        assert 0.0 <= shares[stage] <= 1.0, (stage, shares[stage])
    worker = sum(shares[k] for k in ("checksum", "decompress", "decode", "augment"))
    assert 0.0 < worker <= 1.0 + 1e-6, shares  # shares of worker time


def test_version_is_the_commands(cli):
    out = cli("--version").stdout.split()
    assert out[0] == "ringtrain" and ringtrain.__version__ == out[1], (ringtrain.__version__, out[:2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_batches_are_the_cpu_batches(data):
    opts = dict(batch_size=64, seed=3, drop_last=False, workers=2, digest=True)
    with ringtrain.Loader(data, **opts) as loader:
        want = [clone_epoch(loader) for _ in range(2)]
        want_digest = loader.digest()
    with ringtrain.Loader(data, device="cuda", **opts) as loader:
        got = []
        for _ in range(2):
            epoch = []
            for x, y in loader:
                assert x.device.type == "cuda" and y.device.type == "cuda"
                epoch.append((x, y))  # kept on the GPU, not cloned
            got.append(epoch)
        assert loader.digest() == want_digest
    for e in range(2):
        assert_same_batches([(x.cpu(), y.cpu()) for x, y in got[e]], want[e], f"device='cuda' epoch {e}")
