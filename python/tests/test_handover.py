"""What the Loader's batches become at hand-over, done once in C on the CPU (the ring's slots stay uint8):
normalize / dtype / channels_last give torchvision's ToTensor + Normalize of the same uint8 batch (float32 bit
for bit, with the trainer's expression; bfloat16 its rounding), the memory format asked for, and a tensor that
holds no slot; pin_memory pins; a per-batch transform runs on each batch; and the DataLoader attributes
frameworks read (sampler.set_epoch, dataset, batch_size, drop_last) are there. Where CUDA is, the GPU hand-over
gives the CPU one's bits."""

import pytest
import torch

import ringtrain
from rtcheck import take

OPTS = dict(batch_size=32, seed=3, shuffle=True, workers=1)


def first_batches(data, n=3, **kw):
    with ringtrain.Loader(data, **OPTS, **kw) as loader:
        return take(loader, n)


def torchvision_normalize(x, mean, std):
    """ToTensor + Normalize of a uint8 batch, in float32, in the trainer's order of operations."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x.float() / 255.0 - m) / s


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalized_float_batches_are_the_uint8_ones_normalized(data, channels_last):
    raw = first_batches(data)
    with ringtrain.Loader(data, **OPTS) as probe:
        mean, std = probe.input_mean, probe.input_std
    got = first_batches(data, normalize=True, channels_last=channels_last)
    for (x8, y8), (xf, yf) in zip(raw, got):
        assert xf.dtype == torch.float32 and xf.shape == x8.shape
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert xf.is_contiguous(memory_format=fmt)
        want = torchvision_normalize(x8, mean, std)
        assert torch.equal(xf, want), f"max difference {float((xf - want).abs().max())}"
        assert torch.equal(yf, y8)


def test_bfloat16_and_plain_float_and_user_constants(data):
    raw = first_batches(data, n=1)[0][0]
    mean, std = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
    bf = first_batches(data, n=1, normalize=(mean, std), dtype=torch.bfloat16)[0][0]
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, torchvision_normalize(raw, mean, std).to(torch.bfloat16))
    plain = first_batches(data, n=1, dtype=torch.float32)[0][0]
    assert torch.equal(plain, raw.float() / 255.0), "a float batch without normalize is ToTensor's x / 255"


def test_converted_and_pinned_batches_hold_no_slot(data):
    # (pinning needs CUDA: without it DataLoader's rule, a warning and no pinning)
    for kw in [dict(normalize=True)] + ([dict(pin_memory=True)] if torch.cuda.is_available() else []):
        with ringtrain.Loader(data, **OPTS, slots=4, **kw) as loader:
            kept = [x for x, _ in loader]  # every batch of the epoch kept: far more than 4 slots
            assert len(kept) == len(loader) > 4
            if kw.get("pin_memory"):
                assert all(x.is_pinned() for x in kept)
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="not pinned"):
            ringtrain.Loader(data, **OPTS, pin_memory=True).close()


def test_transform_runs_on_every_batch(data):
    seen = []

    def flip_and_count(images, labels):
        seen.append(images.shape[0])
        return images.flip(-1), labels

    raw = first_batches(data, n=2)
    got = first_batches(data, n=2, transform=flip_and_count)
    assert seen == [32, 32]
    assert all(torch.equal(g[0], r[0].flip(-1)) for g, r in zip(got, raw))


def test_dataloader_attributes(data):
    with ringtrain.Loader(data, **OPTS) as loader:
        assert loader.batch_size == 32 and loader.drop_last is True
        assert len(loader.dataset) == ringtrain.Dataset(data, "train").__len__()
        assert len(loader.sampler) == len(loader) * 32
        first = next(iter(loader))[0].clone()
        loader.sampler.set_epoch(0)  # as a framework does before each epoch
        assert torch.equal(next(iter(loader))[0], first)


def test_bad_handover_options(data):
    with pytest.raises(ValueError, match="float dtype"):
        ringtrain.Loader(data, **OPTS, normalize=True, dtype=torch.uint8)
    with pytest.raises(ValueError, match="3 values each"):
        ringtrain.Loader(data, **OPTS, normalize=((0.5,), (0.5,)))
    with pytest.raises(TypeError, match="callable"):
        ringtrain.Loader(data, **OPTS, transform=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU hand-over is checked where one is")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_handover_is_the_cpu_one(data, dtype):
    """device="cuda" converts after the copy, with torch; the CPU path converts in C: the same bits."""
    cpu = first_batches(data, normalize=True, dtype=dtype, channels_last=True)
    gpu = first_batches(data, normalize=True, dtype=dtype, channels_last=True, device="cuda")
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(xg.cpu(), xc), f"max difference {float((xg.cpu().float() - xc.float()).abs().max())}"
        assert torch.equal(yg.cpu(), yc)


KERNELS = ("table", "avx512", "avx512vbmi")


def converter_kernels(mean, std, **kw):
    """A Converter per kernel this CPU has for the layout (the table always), and the names that ran."""
    from ringtrain import _ringtrain

    out = []
    for k in KERNELS:
        try:
            out.append(_ringtrain.Converter(mean, std, kernel=k, **kw))
        except ValueError:
            pass
    return out


@pytest.mark.parametrize("kind", ["cifar", "mnist", "photos"])
def test_every_conversion_kernel_gives_torchs_bits(request, kind):
    """The hand-over's kernels (the table; AVX-512's expression with its exactness check; the table by VBMI byte
    permutes) over random constants, both dtypes and layouts, one and three threads: torch's values bit for bit.
    3x32x32, 1x28x28 and 3x30x30 images (900 pixels: the vector kernels' tail, past their last full vector)."""
    import random

    from torch.utils.dlpack import from_dlpack

    from ringtrain import _ringtrain

    rnd = random.Random(1)
    path = request.getfixturevalue({"cifar": "data", "mnist": "mnist", "photos": "photos"}[kind])
    size = 30 if kind == "photos" else None
    core = _ringtrain.open_loader(path, batch=9, workers=1, augment="none", slots=4, image_size=size)
    cb = core.next()
    x8 = from_dlpack(cb.images()).clone()
    b, c, h, w = x8.shape
    consts = [([0.0] * c, [1.0] * c), ([0.485, 0.456, 0.406][:c], [0.229, 0.224, 0.225][:c])]
    consts += [([rnd.uniform(-1, 2) for _ in range(c)], [rnd.uniform(0.01, 3) for _ in range(c)]) for _ in range(12)]
    ran = set()
    for mean, std in consts:
        for bf16 in (False, True):
            dt = torch.bfloat16 if bf16 else torch.float32
            want = torchvision_normalize(x8, mean, std).to(dt)
            for nhwc in (False, True):
                for threads in (1, 3):
                    for conv in converter_kernels(mean, std, bf16=bf16, channels_last=nhwc, threads=threads):
                        mem = torch.full((b, h, w, c) if nhwc else (b, c, h, w), float("nan"), dtype=dt)
                        out = mem.permute(0, 3, 1, 2) if nhwc else mem
                        conv.run(cb, out.data_ptr())
                        ran.add(conv.kernel)
                        assert torch.equal(out, want), (conv.kernel, mean, std, bf16, nhwc, threads)
    del cb
    core.close()
    assert "table" in ran


def test_converter_tensors_own_their_memory(data):
    """tensor(): the converter's reused buffers -- each tensor right, kept ones untouched by later batches, and
    alive after the converter is gone."""
    from torch.utils.dlpack import from_dlpack

    from ringtrain import _ringtrain

    mean, std = [0.4914, 0.4822, 0.4465], [0.247, 0.243, 0.261]
    core = _ringtrain.open_loader(data, batch=64, workers=1, augment="none", slots=4)
    cb = core.next()
    x8 = from_dlpack(cb.images()).clone()
    for bf16 in (False, True):
        for nhwc in (False, True):
            conv = _ringtrain.Converter(mean, std, bf16=bf16, channels_last=nhwc, threads=2)
            want = torchvision_normalize(x8, mean, std).to(torch.bfloat16 if bf16 else torch.float32)
            kept = []
            for i in range(9):
                t = from_dlpack(conv.tensor(cb))
                assert torch.equal(t, want)
                assert t.is_contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
                if i % 3 == 0:
                    kept.append(t)
                    t.add_(1)  # the user's own tensor: a later batch must not write over it
                del t
            unconsumed = conv.tensor(cb)
            del unconsumed  # a capsule never taken: freed by the capsule
            del conv
            assert all(torch.equal(k, want + 1) for k in kept)
    del cb
    core.close()
