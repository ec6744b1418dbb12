"""The loader's named augmentations, value for value against torchvision's functions.

`augment="crop,flip,jitter=V,erase=P,cutout=S"` runs in the C loader's workers on the uint8 slot. For every
image of an epoch, `_ringtrain.aug_draw` says what its sample drew (crop offset, flip, ColorJitter's factors
in the order applied, the erased rectangles); torchvision.transforms.functional applied with those draws to
the stored record must give the loader's image bit for bit. The draws themselves are checked for their
distributions (flip and erase rates, factor ranges, every order of the three adjustments).
"""
import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F

import ringtrain
from ringtrain import _ringtrain
from rtcheck import TEST_RAW, clone_epoch

SEED = 5
PAD = 4
ADJUST = {"brightness": F.adjust_brightness, "contrast": F.adjust_contrast, "saturation": F.adjust_saturation}


def fill_of(loader):
    """The erased pixels' value: the data's mean colour, as the C loader rounds it (float32, to nearest even)."""
    m = np.clip(np.asarray(loader.input_mean, np.float32), 0, 1) * np.float32(255)
    return torch.from_numpy(np.rint(m).astype(np.uint8)).view(-1, 1, 1)


def reference(record, draw, fill):
    """torchvision's RandomCrop(padding=PAD), hflip, the jitter in its order, erase and cutout, with `draw`."""
    img = torch.from_numpy(record)
    h, w = img.shape[1:]
    y, x = PAD + draw["dy"], PAD + draw["dx"]
    out = F.pad(img, [PAD] * 4)[:, y:y + h, x:x + w]
    if draw["flip"]:
        out = F.hflip(out)
    for name, factor in draw["jitter"]:
        out = ADJUST[name](out, factor)
    for box in (draw["erase"], draw["cutout"]):
        if box is not None:
            out = F.erase(out, *box, v=fill)
    return out


@pytest.mark.parametrize("spec", ["crop,flip,jitter=0.5,erase=0.7,cutout=10",
                                  "crop=2,brightness=0.8,saturation=0.9,erase=1:0.1:0.4:0.5:2"])
def test_named_operations_are_torchvisions(data, raw_test_records, spec):
    records, labels = raw_test_records
    with ringtrain.Loader(data, 100, split="test", shuffle=False, augment=spec, drop_last=False, seed=SEED,
                          workers=2) as loader:
        batches = clone_epoch(loader)
        fill = fill_of(loader)
    x = torch.cat([b[0] for b in batches])
    assert torch.equal(torch.cat([b[1] for b in batches]), torch.from_numpy(labels))
    assert x.shape[0] == TEST_RAW
    bad = []
    for i in range(TEST_RAW):
        draw = _ringtrain.aug_draw(spec, SEED, 0, i, 32, 32)
        want = reference(records[i], draw, fill)
        if not torch.equal(x[i], want):
            bad.append((i, int((x[i].int() - want.int()).abs().max()), draw))
    assert not bad, f"{len(bad)} of {TEST_RAW} images differ from torchvision's, first {bad[0]}"


def test_draws_have_torchvisions_distributions():
    spec = "crop,flip,jitter=0.4,erase=0.5,cutout=8"
    draws = [_ringtrain.aug_draw(spec, SEED, 3, i, 32, 32) for i in range(3000)]
    flips = sum(d["flip"] for d in draws)
    erased = [d["erase"] for d in draws if d["erase"] is not None]
    assert 1300 < flips < 1700, f"{flips} of 3000 flipped"
    assert 1300 < len(erased) < 1700, f"{len(erased)} of 3000 erased at p 0.5"
    for y, x, h, w in erased:
        assert y + h <= 32 and x + w <= 32 and 0 < h < 32 and 0 < w < 32
        # area share (0.02, 0.33) and aspect (0.3, 3.3), up to the rounding of h and w
        assert 0.02 * 1024 * 0.6 <= h * w <= 0.33 * 1024 * 1.4, (h, w)
    orders = {tuple(n for n, _ in d["jitter"]) for d in draws}
    assert len(orders) == 6, f"ColorJitter's random order: {len(orders)} of the 6 orders seen"
    factors = np.array([f for d in draws for _, f in d["jitter"]])
    assert factors.min() >= 0.6 and factors.max() < 1.4 and factors.min() < 0.61 and factors.max() > 1.39
    cuts = [d["cutout"] for d in draws]
    assert all(c is not None and c[2] <= 8 and c[3] <= 8 for c in cuts)
    assert sum(c[2] == 8 and c[3] == 8 for c in cuts) > 1000, "most cutouts lie inside the image whole"
    # each part has its own stream: adding the jitter and erasing changes no crop or flip
    plain = [_ringtrain.aug_draw("crop,flip", SEED, 3, i, 32, 32) for i in range(3000)]
    assert [(d["dy"], d["dx"], d["flip"]) for d in draws] == [(d["dy"], d["dx"], d["flip"]) for d in plain]
    # another epoch, other draws
    other = [_ringtrain.aug_draw(spec, SEED, 4, i, 32, 32) for i in range(100)]
    assert sum(a != b for a, b in zip(draws[:100], other)) > 90


def test_variable_size_images_take_the_pixel_operations(photos):
    """After RandomResizedCrop (variable-size records) the pixel operations run too: the image is the plain
    crop's outside the drawn rectangles, the fill inside them, and jitter changes it."""
    S, seed = 24, 11
    runs = {}
    for spec in ("crop,flip", "crop,flip,erase=1,cutout=6", "crop,flip,jitter=0.5"):
        with ringtrain.Loader(photos, 8, image_size=S, shuffle=False, augment=spec, drop_last=False, seed=seed,
                              workers=2) as loader:
            runs[spec] = torch.cat([b[0] for b in clone_epoch(loader)])
            fill = fill_of(loader)
    plain, erased = runs["crop,flip"], runs["crop,flip,erase=1,cutout=6"]
    assert plain.shape == erased.shape and plain.shape[0] >= 8
    for i in range(plain.shape[0]):
        draw = _ringtrain.aug_draw("crop,flip,erase=1,cutout=6", seed, 0, i, S, S)
        want = plain[i]
        for box in (draw["erase"], draw["cutout"]):
            if box is not None:
                want = F.erase(want, *box, v=fill)
        assert torch.equal(erased[i], want), f"image {i}: not the plain crop with {draw['erase']}, {draw['cutout']}"
    assert not torch.equal(runs["crop,flip,jitter=0.5"], plain), "jitter left variable-size images as they were"


def test_resized_crop_ranges_by_name(photos, data):
    """crop-scale= / crop-ratio= in the spelling are RandomResizedCrop's ranges (what train --aug and loadbench
    --aug can say): the same batches as the Loader's crop_scale / crop_ratio arguments; fixed-size images refuse
    them, saying why."""
    S = 24

    def epoch(**kw):
        with ringtrain.Loader(photos, 8, image_size=S, shuffle=False, drop_last=False, seed=3, workers=2,
                              **kw) as loader:
            return torch.cat([b[0] for b in clone_epoch(loader)])

    named = epoch(augment="crop,flip,crop-scale=0.5:0.6,crop-ratio=0.9:1.1")
    assert torch.equal(named, epoch(augment="crop,flip", crop_scale=(0.5, 0.6), crop_ratio=(0.9, 1.1)))
    assert not torch.equal(named, epoch(augment="crop,flip"))
    with pytest.raises(ringtrain.Error, match="RandomResizedCrop"):
        ringtrain.Loader(data, 10, augment="crop,crop-scale=0.5:1")


def test_spelling_errors_name_the_part(data):
    for spec, words in (("crop,sharpen", "unknown 'sharpen'"), ("erase=1.5", "probability"),
                        ("jitter=-1", "strength"), ("flip=1", "takes no value")):
        with pytest.raises(ValueError, match=words):
            ringtrain.Loader(data, 10, augment=spec)
