"""The batch lifetime: a batch kept across next() keeps its values (its slot comes back only when its last
tensor is freed). Batch n lives in slot n % slots, so a batch may be kept while slots - 1 later batches are
taken; the next() after that raises ringtrain.Error (EBUSY) instead of waiting for ever, and never hands out a
slot that is still in use."""

import errno

import torch

import ringtrain
from rtcheck import assert_same_batches, clone_epoch, error_info

OPTS = dict(batch_size=64, seed=21, shuffle=True, augment="crop+flip", workers=2)


def reference(data, epochs=1):
    with ringtrain.Loader(data, **OPTS) as ref:
        return [clone_epoch(ref) for _ in range(epochs)]


def test_kept_batches_keep_their_values(data):
    """A batch and a view of the next one, kept while the loader hands out slots - 1 = 4 batches after the
    first (slots=5), keep their values; once freed, the rest of the epoch and the next one follow."""
    (want,) = reference(data)
    with ringtrain.Loader(data, slots=5, **OPTS) as loader:
        it = iter(loader)
        kept = next(it)
        view = next(it)[1][3:9]  # a view keeps its batch's slot too
        seen = []
        for _ in range(3):  # batches 2, 3, 4: the last one before batch 0's slot is needed again
            x, y = next(it)
            seen.append((x.clone(), y.clone()))
        assert_same_batches([kept], want[:1], "the kept batch, 4 batches later")
        assert torch.equal(view, want[1][1][3:9]), "the kept view, 3 batches later"
        del kept, view, x, y
        for x, y in it:
            seen.append((x.clone(), y.clone()))
        assert_same_batches(seen, want[2:], "the batches after the kept ones")
        del x, y
        assert sum(1 for _ in loader) == len(loader)


def test_a_batch_kept_past_the_loader_outlives_close(data):
    (want,) = reference(data)
    loader = ringtrain.Loader(data, slots=4, **OPTS)
    x, y = next(iter(loader))
    loader.close()
    del loader
    assert torch.equal(x, want[0][0]) and torch.equal(y, want[0][1])
    x += 1  # the memory is still ours to write
    assert torch.equal(x, want[0][0] + 1)


def hold_every_batch(data, slots, want):
    """Keeps every batch without copying until next() refuses; what happened, as plain values."""
    loader = ringtrain.Loader(data, slots=slots, **OPTS)
    held, err = [], None
    try:
        for x, y in loader:
            held.append((x, y))
            if len(held) > slots:
                break
    except ringtrain.Error as e:
        err = error_info(e)
    intact = [bool(torch.equal(x, w[0]) and torch.equal(y, w[1])) for (x, y), w in zip(held, want)]
    return {"held": len(held), "error": err, "intact": intact}


def test_holding_too_many_batches_raises_ebusy_not_a_deadlock(data, forked):
    (want,) = reference(data)
    for slots in (4, 6):
        res = forked(hold_every_batch, data, slots, want[:slots + 1], timeout=60)
        err = res["error"]
        assert err is not None, f"slots={slots}: {res['held']} batches held and next() never refused"
        assert err["type"] == "Error" and err["oserror"], err
        assert err["errno"] == errno.EBUSY, f"slots={slots}: errno {err['errno']} ({err['str']}), expected EBUSY"
        assert "clone" in err["str"] or "slots" in err["str"], f"the message does not say what to do: {err['str']}"
        assert res["held"] == slots, \
            f"slots={slots}: next() refused with {res['held']} batches held (batch {slots} needs batch 0's slot)"
        assert all(res["intact"]), f"slots={slots}: held batches overwritten: {res['intact']}"
