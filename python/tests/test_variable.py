"""Datasets of images of their own sizes (pack --codec jpeg --max-side N), made from rt_mkfolder's folder of
every file kind: Loader crops them to image_size x image_size with the C loader's RandomResizedCrop or centre
crop -- the same batches as `ringtrain loadbench --image-size`, whatever the worker count --; Dataset gives
each record whole at the size `ringtrain inspect --record` writes it; dataset_info reports what pack did."""

import errno
import os
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import ringtrain
from rtcheck import MAX_SIDE, assert_same_batches, clone_epoch

S = 32

# (Loader options, the loadbench options that mean the same, epochs, loadbench's --workers)
CASES = {
    # RandomResizedCrop + flip; 1 worker here, 2 in loadbench
    "train-rrc+flip": (dict(split="train", batch_size=8, seed=3, shuffle=True, augment="crop+flip", workers=1),
                       dict(split="train", aug="crop,flip", shuffle="exact"), 2, 2),
    # the evaluation crop, records in order, the short last batch kept
    "val-center": (dict(split="val", batch_size=4, seed=0, shuffle=False, augment="none", drop_last=False,
                        workers=2), dict(split="val", aug="none", shuffle="none", last="pad"), 1, 1),
}


def manifest(path):
    return json.loads((Path(path) / "manifest.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_batches_are_loadbench_image_size(photos, loadbench_digest, case):
    opts, lb, epochs, lb_workers = CASES[case]
    records = manifest(photos)["splits"][opts["split"]]["records"]
    b = opts["batch_size"]
    steps = records // b if opts.get("drop_last", True) else -(-records // b)
    with ringtrain.Loader(photos, image_size=S, digest=True, **opts) as loader:
        assert loader.shape == (3, S, S) and len(loader) == steps
        n = 0
        for _ in range(epochs):
            for images, labels in loader:
                assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, S, S), images.shape
                assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
                n += images.shape[0]
        got = loader.digest()
    want_n = epochs * (steps * b if opts.get("drop_last", True) else records)
    assert n == want_n, f"{n} samples in {epochs} epoch(s), expected {want_n}"
    want = loadbench_digest(photos, image_size=S, batch_size=b, seed=opts["seed"], epochs=epochs,
                            workers=lb_workers, **lb)
    assert got == want, f"Loader.digest() {got}, loadbench --image-size {S} --digest {want}"


def test_crops_do_not_depend_on_workers(photos):
    got = {}
    for workers in (1, 2):
        with ringtrain.Loader(photos, 8, image_size=S, seed=5, workers=workers) as loader:
            got[workers] = [clone_epoch(loader) for _ in range(2)]
    for e in range(2):
        assert_same_batches(got[2][e], got[1][e], f"epoch {e}: workers=2 against workers=1")


def test_training_crop_is_random_and_the_centre_crop_is_fixed(photos):
    def epoch(**opts):
        with ringtrain.Loader(photos, 4, split="val", shuffle=False, drop_last=False, image_size=S, workers=2,
                              **opts) as loader:
            return [torch.cat([x for x, _ in clone_epoch(loader)]) for _ in range(2)]

    center = epoch(augment="none")
    assert torch.equal(center[0], center[1]), "the centre crop changed from one epoch to the next"
    assert not torch.equal(center[0], epoch(augment="none", center_ratio=0.5)[0]), "center_ratio was ignored"
    # splits other than train take the centre crop, mirrored where the augmentation flips
    flipped = epoch(augment="crop+flip")[0]
    same = [torch.equal(a, b) for a, b in zip(flipped, center[0])]
    mirror = [torch.equal(a, b.flip(-1)) for a, b in zip(flipped, center[0])]
    assert all(s or m for s, m in zip(same, mirror)), "the val split was not centre-cropped"
    assert any(m and not s for s, m in zip(same, mirror)), "no val image was flipped"
    # the training split's RandomResizedCrop: another crop every epoch, and crop_scale is used
    with ringtrain.Loader(photos, 8, image_size=S, shuffle=False, workers=2) as loader:
        default = clone_epoch(loader)
        again = clone_epoch(loader)
    assert torch.equal(default[0][1], again[0][1]) and not torch.equal(default[0][0], again[0][0]), \
        "the same records had the same crops in epochs 0 and 1"
    with ringtrain.Loader(photos, 8, image_size=S, shuffle=False, workers=2, crop_scale=(0.5, 0.6)) as loader:
        other = clone_epoch(loader)
    assert not torch.equal(default[0][0], other[0][0]), "crop_scale did not change the crops"
    assert torch.equal(default[0][1], other[0][1]), "crop_scale changed the order"


def test_image_size_is_required_and_checked(photos, data):
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.Loader(photos, 8)
    assert e.value.errno == errno.EINVAL, e.value
    assert "--image-size" in str(e.value) and "image_size=" in str(e.value), str(e.value)
    # a fixed-size dataset: its own size or nothing
    with ringtrain.Loader(data, 32, image_size=32, workers=1) as loader:
        assert loader.shape == (3, 32, 32)
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.Loader(data, 32, image_size=64)
    assert e.value.errno == errno.EINVAL and "--max-side" in str(e.value), str(e.value)
    for bad in (dict(image_size=0), dict(image_size=5000), dict(image_size=S, crop_scale=(1.0, 0.5)),
                dict(image_size=S, crop_ratio=(0, 1)), dict(image_size=S, center_ratio=1.5)):
        with pytest.raises(ValueError):
            ringtrain.Loader(photos, 8, **bad)
    with pytest.raises(TypeError):
        ringtrain.Loader(photos, 8, image_size=S, crop_scale=0.5)


def read_pnm(path):
    """A binary PPM (P6) or PGM (P5) with maxval 255 as uint8 (H, W, C)."""
    raw = Path(path).read_bytes()
    fields, pos = [], 0
    while len(fields) < 4:
        while raw[pos:pos + 1].isspace():
            pos += 1
        if raw[pos:pos + 1] == b"#":
            pos = raw.index(b"\n", pos)
            continue
        end = pos
        while not raw[end:end + 1].isspace():
            end += 1
        fields.append(raw[pos:end])
        pos = end
    magic, w, h, maxval = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    assert magic in (b"P5", b"P6") and maxval == 255, fields
    c = 3 if magic == b"P6" else 1
    return np.frombuffer(raw[pos + 1:pos + 1 + h * w * c], np.uint8).reshape(h, w, c)


def test_dataset_items_are_the_records_whole(photos, cli, tmp_path):
    m = manifest(photos)
    for split in ("train", "val"):
        ds = ringtrain.Dataset(photos, split)
        assert ds.variable and ds.shape == (3, None, None) and len(ds) == m["splits"][split]["records"]
        items = [ds[i] for i in range(len(ds))]  # in order: each block read once
        for i in (0, 1, len(ds) // 2, len(ds) - 1):
            out = tmp_path / f"{split}-{i}.ppm"
            line = cli("inspect", photos, "--record", i, "--split", split, "--out", out).stdout
            want = read_pnm(out)
            img, label = items[i]
            assert img.dtype == np.uint8 and img.shape == want.shape, (split, i, img.shape, want.shape)
            assert np.array_equal(img, want), f"{split} record {i}: pixels differ from `inspect --out`"
            assert f"label {label} " in line, (label, line)
            again, _ = ds[i]  # out of order: the block read again
            assert np.array_equal(again, img)
        sizes = {im.shape[:2] for im, _ in items}
        assert len(sizes) > 10 and max(max(s) for s in sizes) <= MAX_SIDE, sorted(sizes)
        counts = np.bincount([label for _, label in items], minlength=len(m["classes"]))
        assert counts.tolist() == m["splits"][split]["class_counts"]


def test_dataset_info_reports_the_variable_sizes(photos_dataset):
    path, expected = photos_dataset
    info = ringtrain.dataset_info(path)
    v = manifest(path)["variable_size"]
    assert info["variable"] is True and (info["channels"], info["height"], info["width"]) == (3, 0, 0), info
    assert info["max_side"] == MAX_SIDE == v["max_side"]
    for key in ("min", "median", "max"):
        assert info["size_" + key] == tuple(v[key]), (key, info["size_" + key], v[key])
    assert (info["skipped_files"], info["ignored_files"]) == (expected["counts"]["bad"], expected["counts"]["ignored"])
    sizes = set()
    for split in ("train", "val"):
        ds = ringtrain.Dataset(path, split)
        sizes |= {ds[i][0].shape[:2] for i in range(len(ds))}
    assert info["size_min"] in sizes and info["size_max"] in sizes, (info["size_min"], info["size_max"], sizes)


def test_fixed_size_info_has_no_variable_fields(data):
    info = ringtrain.dataset_info(data)
    assert info["variable"] is False and (info["height"], info["width"]) == (32, 32)
    assert info["max_side"] == 0 and info["size_min"] is None and info["size_median"] is None
    assert info["size_max"] is None and (info["skipped_files"], info["ignored_files"]) == (0, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_batches_are_the_cpu_batches(photos):
    opts = dict(batch_size=8, image_size=S, seed=3, workers=2, digest=True)
    with ringtrain.Loader(photos, **opts) as loader:
        want = clone_epoch(loader)
        want_digest = loader.digest()
    with ringtrain.Loader(photos, device="cuda", **opts) as loader:
        got = [(x.cpu(), y.cpu()) for x, y in loader]
        assert loader.digest() == want_digest
    assert_same_batches(got, want, "device='cuda'")


def test_pack_from_python_is_the_command_line_pack(photos, tmp_path):
    """ringtrain.pack with the image-folder options writes what `ringtrain pack` wrote, byte for byte."""
    folder = Path(photos).parent / "photos"
    st = ringtrain.pack(folder, tmp_path / "again", codec="jpeg", max_side=MAX_SIDE, skip_bad=True, val_split=0.2,
                        threads=1)
    for f in sorted(p.name for p in Path(photos).iterdir()):
        assert (tmp_path / "again" / f).read_bytes() == (Path(photos) / f).read_bytes(), f
    assert st["skipped"] == 6 and st["ignored"] == 4 and st["files"] == st["records"] + 6
    assert st["skipped_summary"] == "1 zero-sized, 1 not an image, 3 truncated, 1 unsupported"
    # The file decoded through a libjpeg warning: kept, counted and named, as `ringtrain pack` prints it.
    assert st["warned"] == 1 and st["first_warning"].endswith("warned.jpg: Corrupt JPEG data: 3 extraneous bytes "
                                                              "before marker 0xda"), st["first_warning"]
    assert st["scaled_decode"] == {"1/2": 0, "1/4": 0, "1/8": 0}  # --max-side decodes whole
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.pack(folder, tmp_path / "strict", size=24)
    assert "--skip-bad" in str(e.value) and not (tmp_path / "strict").exists()
    st = ringtrain.pack(folder, tmp_path / "small", size=(24, 32), fit="pad", skip_bad=True)
    manifest = json.loads((tmp_path / "small" / "manifest.json").read_text())
    # The manifest names the scales used; the dict has all three.
    assert sum(st["scaled_decode"].values()) > 0
    assert {k: n for k, n in st["scaled_decode"].items() if n} == manifest["files"]["scaled_decode"]
    info = ringtrain.dataset_info(tmp_path / "small")
    assert (info["height"], info["width"]) == (24, 32)
    assert st["records"] == info["splits"]["train"] and info["skipped_files"] == 6


def test_pack_names_a_warned_file_whose_name_is_not_utf8(photos, tmp_path):
    """A file name is bytes: first_warning gives it back as os.fsdecode does, and the pack still returns."""
    src = Path(photos).parent / "photos" / "dogs" / "warned.jpg"
    name = os.fsencode(str(tmp_path / "in" / "a")) + b"/caf\xe9.jpg"  # Latin-1, not UTF-8
    os.makedirs(os.fsdecode(os.path.dirname(name)))
    with open(name, "wb") as f:
        f.write(src.read_bytes())
    st = ringtrain.pack(tmp_path / "in", tmp_path / "out", size=16)
    assert st["records"] == 1 and st["warned"] == 1
    assert os.fsencode(st["first_warning"]).startswith(name + b": Corrupt JPEG data"), st["first_warning"]
