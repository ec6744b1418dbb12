"""ringtrain.Dataset: the map-style door for code that keeps torch's DataLoader. Its records are the packed
ones (the synthetic file's, the Loader's unaugmented batches), and it works in forked DataLoader workers."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import ringtrain
from rtcheck import SPLITS, TEST_RAW


def manifest(data):
    return json.loads((Path(data) / "manifest.json").read_text())


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_length_shape_classes_and_labels(data, split):
    m = manifest(data)
    ds = ringtrain.Dataset(data, split)
    assert len(ds) == SPLITS[split] == m["splits"][split]["records"]
    assert tuple(ds.shape) == (3, 32, 32)
    assert list(ds.classes) == m["classes"]
    counts = np.zeros(len(m["classes"]), np.int64)
    for i in range(len(ds)):
        img, label = ds[i]
        assert isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.shape == (32, 32, 3), (i, img.shape)
        assert isinstance(label, int) and 0 <= label < 10, (i, label)
        counts[label] += 1
    assert counts.tolist() == m["splits"][split]["class_counts"]
    last, label = ds[len(ds) - 1]
    neg, neg_label = ds[-1]
    assert np.array_equal(last, neg) and label == neg_label
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_records_are_the_synthetic_files(data, raw_test_records):
    images, labels = raw_test_records
    ds = ringtrain.Dataset(data, "test")
    for i in list(range(0, TEST_RAW, 7)) + [TEST_RAW - 1]:
        img, label = ds[i]
        assert np.array_equal(img, images[i].transpose(1, 2, 0)), f"record {i} differs from the file's"
        assert label == labels[i], f"record {i}: label {label}, the file says {labels[i]}"


def test_records_are_writable_and_collate_without_a_warning(data):
    """A read-only array makes torch's default collate warn and in-place transforms fail."""
    import warnings

    ds = ringtrain.Dataset(data, "test")
    img, _ = ds[0]
    assert img.flags.writeable and img.flags.c_contiguous
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, y = next(iter(DataLoader(ds, batch_size=4, shuffle=False, num_workers=0)))
    assert x.shape == (4, 32, 32, 3)


def test_records_are_the_loaders_unaugmented_batches(data):
    ds = ringtrain.Dataset(data, "train")
    in_order = [ds[i] for i in range(len(ds))]
    with ringtrain.Loader(data, 100, split="train", shuffle=False, augment="none", workers=2) as loader:
        n = 0
        for k, (x, y) in enumerate(loader):
            for j in range(x.shape[0]):
                img, label = in_order[k * 100 + j]
                assert np.array_equal(x[j].numpy(), img.transpose(2, 0, 1)), f"batch {k} sample {j}"
                assert int(y[j]) == label, f"batch {k} sample {j}: label {int(y[j])}, Dataset says {label}"
            n += x.shape[0]
    assert n == len(ds)
    # at random: blocks decoded out of order give the same records
    fresh = ringtrain.Dataset(data, "train")
    for i in np.random.default_rng(1).permutation(len(ds))[:300]:
        img, label = fresh[int(i)]
        assert np.array_equal(img, in_order[i][0]) and label == in_order[i][1], f"record {i} read at random"


def test_in_a_dataloader_with_forked_workers(data, raw_test_records):
    images, labels = raw_test_records
    ds = ringtrain.Dataset(data, "test")
    dl = DataLoader(ds, batch_size=100, shuffle=False, num_workers=2, multiprocessing_context="fork")
    xs, ys = [], []
    for x, y in dl:
        assert x.dtype == torch.uint8 and x.shape[1:] == (32, 32, 3)
        xs.append(x)
        ys.append(y)
    x = torch.cat(xs).numpy()
    y = torch.cat(ys).numpy()
    assert np.array_equal(x, images.transpose(0, 2, 3, 1)), "records read by the DataLoader's workers differ"
    assert np.array_equal(y, labels)
