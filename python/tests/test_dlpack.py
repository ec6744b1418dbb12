"""The DLPack traps, on the C module's own batches: a capsule is consumed once (a second from_dlpack fails
cleanly), an unconsumed capsule gives its slot back when it is freed, a consumed one when its tensor is,
the buffer-protocol views hold the slot the same way, and padding shows as id -1."""

import errno

import numpy as np
import pytest

import ringtrain
import torch
from torch.utils.dlpack import from_dlpack

from ringtrain import _ringtrain

BATCH, SLOTS = 50, 4


@pytest.fixture
def cloader(data):
    """The test split in record order, unaugmented, padded: batch k holds records 50k.. (the last one 1)."""
    L = _ringtrain.open_loader(data, split="test", batch=BATCH, shuffle="none", last="pad", seed=0,
                               augment="none", workers=1, slots=SLOTS, epochs=0)
    yield L
    L.close()


def test_a_capsule_is_consumed_once(cloader, raw_test_records):
    images, labels = raw_test_records
    b = cloader.next()
    cap = b.images()
    t = from_dlpack(cap)
    with pytest.raises((RuntimeError, TypeError, ValueError, BufferError)):
        from_dlpack(cap)
    assert t.dtype == torch.uint8 and tuple(t.shape) == (BATCH, 3, 32, 32) and t.device.type == "cpu"
    assert np.array_equal(t.numpy(), images[:BATCH])
    y = from_dlpack(b.labels())
    assert y.dtype == torch.int64 and np.array_equal(y.numpy(), labels[:BATCH])
    ids = from_dlpack(b.ids())
    assert ids.tolist() == list(range(BATCH))
    assert (b.epoch, b.step, b.valid, b.batch) == (0, 0, BATCH, BATCH)


def test_unconsumed_capsules_give_their_slot_back(cloader):
    for k in range(4 * SLOTS):
        b = cloader.next()
        assert b.step == k % cloader.steps_per_epoch and cloader.held() == 1, (k, b.step, cloader.held())
        caps = [b.images(), b.labels(), b.ids()]
        del b
        assert cloader.held() == 1, "a capsule that was never consumed no longer holds its slot"
        del caps
        assert cloader.held() == 0, f"batch {k}: capsules freed unconsumed, {cloader.held()} slots still held"


def test_a_consumed_capsule_holds_the_slot_until_its_tensor_is_freed(cloader, raw_test_records):
    images, _ = raw_test_records
    b = cloader.next()
    t = from_dlpack(b.images())
    b.release()
    del b
    assert cloader.held() == 1
    for k in range(1, SLOTS):  # the ring turns round to the held slot: SLOTS - 1 batches can follow it
        nb = cloader.next()
        x = from_dlpack(nb.images())
        assert nb.step == k % cloader.steps_per_epoch
        first = nb.step * BATCH
        assert np.array_equal(x.numpy()[:nb.valid], images[first:first + nb.valid])
        del nb, x
        assert cloader.held() == 1
    with pytest.raises(ringtrain.Error) as e:  # the next one needs the held slot: refused, not a deadlock
        cloader.next()
    assert e.value.errno == errno.EBUSY
    assert np.array_equal(t.numpy(), images[:BATCH]), "the held batch was overwritten"
    del t
    assert cloader.held() == 0
    nb = cloader.next()  # freed: the loader goes on where it was
    assert nb.step == SLOTS % cloader.steps_per_epoch


def test_buffer_views_hold_the_slot(cloader, raw_test_records):
    images, labels = raw_test_records
    b = cloader.next()
    v = np.asarray(b.images_view())
    lv = np.asarray(b.labels_view())
    del b
    assert cloader.held() == 1
    assert v.dtype == np.uint8 and np.array_equal(v.reshape(BATCH, 3, 32, 32), images[:BATCH])
    assert np.array_equal(lv.reshape(-1).astype(np.int64), labels[:BATCH])
    del v, lv
    assert cloader.held() == 0


def test_padding_shows_as_id_minus_one(cloader, raw_test_records):
    images, labels = raw_test_records
    n = len(labels)
    steps = cloader.steps_per_epoch
    assert steps == -(-n // BATCH)
    for _ in range(steps - 1):
        cloader.next().release()
    b = cloader.next()
    valid = n - (steps - 1) * BATCH
    assert (b.step, b.valid) == (steps - 1, valid)
    ids = from_dlpack(b.ids())
    assert ids[:valid].tolist() == list(range((steps - 1) * BATCH, n))
    assert ids[valid:].tolist() == [-1] * (BATCH - valid)
    x = from_dlpack(b.images())
    assert np.array_equal(x.numpy()[:valid], images[(steps - 1) * BATCH:])
    assert not x[valid:].any(), "padding images are not zero"
    assert not from_dlpack(b.labels())[valid:].any(), "padding labels are not 0"
    st = cloader.state()
    assert (st["epoch"], st["step"]) in ((0, steps), (1, 0)), st
