"""load_state_dict() from another world size or batch size: with shuffle "exact"/"none" an epoch is one global
sequence (a permutation of the split), of which step s takes positions [s*G, (s+1)*G), G = batch_size x
world_size, rank r the r-th batch_size of them. A state carries its position in that sequence ("sample"), so
a loader of any world and batch size goes on with exactly the samples the old run had not reached, in the
sequence's order; the same world and batch size give the same batches bit for bit, as before.

The samples a loader yields are read through the Loader itself (the C batch's ids, taken as the Loader hands
the batch over). The train split has 1800 records."""

import pickle

import pytest
import torch
from torch.utils.dlpack import from_dlpack

import ringtrain
from rtcheck import SPLITS, assert_same_batches

N = SPLITS["train"]
BASE = dict(seed=11, workers=1, augment="crop+flip")


def run(loader, n=None):
    """One ``for`` of `loader` (its first n batches when n is given): (ids per batch, [(images, labels)]),
    copies. The ids are the C batch's, without the padding of a short last batch."""
    ids = []
    real = loader._cpu_batch

    def spy(cb):
        ids.append(from_dlpack(cb.ids())[:cb.valid].clone().tolist())
        return real(cb)

    loader._cpu_batch = spy
    out = []
    try:
        for x, y in loader:
            out.append((x.clone(), y.clone()))
            if n is not None and len(out) == n:
                break
    finally:
        del loader._cpu_batch
    return ids, out


def flat(ids):
    return [i for batch in ids for i in batch]


def images_of(batches):
    return torch.cat([x for x, _ in batches]) if batches else torch.empty(0)


def sequence(data, epoch, batch_size, **opts):
    """The epoch's global sequence as an uninterrupted world-1 loader yields it: (ids, images), one row a sample."""
    with ringtrain.Loader(data, batch_size, **opts) as one:
        one.set_epoch(epoch)
        ids, batches = run(one)
    return flat(ids), images_of(batches)


def ranks_at(data, world, batch_size, epoch, k, **opts):
    """`world` loaders (ranks 0..world-1) after k steps of `epoch`: (loaders, ids each rank took per step)."""
    loaders = [ringtrain.Loader(data, batch_size, rank=r, world_size=world, **opts) for r in range(world)]
    taken = []
    for L in loaders:
        L.set_epoch(epoch)
        taken.append(run(L, k)[0])
    return loaders, taken


@pytest.mark.parametrize("batch_size", [48, 40])
def test_world_2_state_goes_on_at_world_1(data, batch_size):
    opts = dict(BASE, shuffle=True, drop_last=False)
    k, epoch = 7, 1
    seq, seq_images = sequence(data, epoch, batch_size, **opts)
    assert sorted(seq) == list(range(N))

    loaders, taken = ranks_at(data, 2, 48, epoch, k, **opts)
    # world 2's step s: rank 0 then rank 1, each the next 48 of the global sequence
    assert [i for s in range(k) for r in range(2) for i in taken[r][s]] == seq[:k * 96]
    state = loaders[0].state_dict()
    assert state["version"] == 2 and (state["epoch"], state["step"], state["sample"]) == (epoch, k, k * 96)
    assert loaders[1].state_dict()["sample"] == state["sample"]
    for L in loaders:
        L.close()

    with ringtrain.Loader(data, batch_size, **opts) as one:
        one.load_state_dict(pickle.loads(pickle.dumps(state)))
        one.set_epoch(epoch)  # the loop's usual first line keeps the resumed position
        start, length = one.state_dict(), len(one)
        assert start["sample"] == k * 96 and start["step"] == k * 96 // batch_size
        ids, batches = run(one)
        assert len(ids) == length - start["step"], "the resumed epoch: len() - its first step"
        got = flat(ids)
        assert got == seq[k * 96:], "the rest of the epoch's global sequence, in its order"
        assert sorted(flat(taken[0]) + flat(taken[1]) + got) == list(range(N)), "every record exactly once"
        # a sample's augmentation depends on (seed, epoch, id) alone: the same pixels as the uninterrupted run's
        assert torch.equal(images_of(batches), seq_images[k * 96:])
        assert one.epoch == epoch + 1 and len(one) == -(-N // batch_size), "the next epoch: a whole one"


def test_world_1_state_goes_on_at_world_2_from_a_ragged_position(data):
    opts = dict(BASE, shuffle=True, drop_last=True)
    k, b1, b2 = 5, 32, 24  # position 160: 3 world-2 global batches of 48 and 16 samples
    seq, _ = sequence(data, 0, b1, **opts)
    with ringtrain.Loader(data, b1, **opts) as one:
        run(one, k)
        state = one.state_dict()
    assert state["sample"] == k * b1 == 160

    ranks = [ringtrain.Loader(data, b2, rank=r, world_size=2, **opts) for r in range(2)]
    for L in ranks:
        L.load_state_dict(state)
    copies = [pickle.loads(pickle.dumps(L)) for L in ranks]  # a copy at the resumed position is one too
    for L in ranks:
        L.close()
    ranks = copies
    start = ranks[0].state_dict()
    assert (start["step"], start["sample"]) == (160 // 48, 160)
    left = (N - 160) // 48  # drop_last: the last (N - 160) % 48 records are left out
    assert [len(L) for L in ranks] == [160 // 48 + left] * 2

    # half-way, both are rebuilt from their state (same world and batch size, the steps still numbered from
    # the ragged start)
    half = [run(L, 10)[0] for L in ranks]
    mid = [L.state_dict() for L in ranks]
    assert (mid[0]["step"], mid[0]["sample"]) == (start["step"] + 10, 160 + 10 * 48)
    assert mid[1] == mid[0] | {"rank": 1}
    for L in ranks:
        L.close()
    ranks = [ringtrain.Loader(data, b2, rank=r, world_size=2, **opts) for r in range(2)]
    for L, st in zip(ranks, mid):
        L.load_state_dict(st)
    rest = [run(L)[0] for L in ranks]
    per_rank = [half[r] + rest[r] for r in range(2)]
    assert [len(p) for p in per_rank] == [left] * 2, "the resumed epoch's len() - its first step, on each rank"
    got = [i for s in range(left) for r in range(2) for i in per_rank[r][s]]
    assert got == seq[160:160 + left * 48], "the two ranks go on with the sequence from position 160"

    # the next epoch is a whole one again
    with ringtrain.Loader(data, b2, rank=0, world_size=2, **opts) as ref:
        ref.set_epoch(1)
        want = run(ref)[1]
    assert len(ranks[0]) == N // 48
    assert_same_batches(run(ranks[0])[1], want, "the epoch after the resumed one")
    for L in ranks:
        L.close()


def test_a_resumed_epoch_with_no_global_batch_left_is_empty(data):
    opts = dict(BASE, shuffle=True, drop_last=True)
    with ringtrain.Loader(data, 32, **opts) as one:
        one.set_epoch(2)
        run(one, N // 32 - 1)  # 40 records left: fewer than a global batch of 2 x 24
        state = one.state_dict()
    assert state["sample"] == N - N % 32 - 32
    with ringtrain.Loader(data, 24, rank=1, world_size=2, **opts) as two:
        two.load_state_dict(state)
        two.set_epoch(2)
        assert run(two)[0] == [] and two.epoch == 3
        with ringtrain.Loader(data, 24, rank=1, world_size=2, **opts) as ref:
            ref.set_epoch(3)
            want = run(ref)[1]
        assert_same_batches(run(two)[1], want, "the epoch after the empty one")


def test_an_interrupted_hand_over_in_a_resumed_epoch_loses_no_batch(data):
    opts = dict(BASE, shuffle=True, drop_last=False)
    seq, _ = sequence(data, 0, 40, **opts)
    with ringtrain.Loader(data, 48, rank=0, world_size=2, **opts) as a:
        run(a, 3)
        state = a.state_dict()
    with ringtrain.Loader(data, 40, **opts) as one:
        one.load_state_dict(state)
        real, calls = one._cpu_batch, []

        def interrupted_once(cb):
            calls.append(cb.step)
            if len(calls) == 1:
                raise KeyboardInterrupt  # as Python raises it when the C call returns
            return real(cb)

        one._cpu_batch = interrupted_once
        with pytest.raises(KeyboardInterrupt):
            next(iter(one))
        del one._cpu_batch
        assert flat(run(one)[0]) == seq[3 * 96:], "the resumed epoch, its interrupted first batch made again"


def test_same_world_and_batch_is_bit_exact(data):
    opts = dict(BASE, batch_size=48, shuffle=True, drop_last=False, rank=1, world_size=2)
    with ringtrain.Loader(data, **opts) as ref:
        epoch0 = run(ref)[1]
    with ringtrain.Loader(data, **opts) as a:
        run(a, 6)
        state = a.state_dict()
    assert (state["step"], state["sample"]) == (6, 6 * 96)
    with ringtrain.Loader(data, **opts) as b:
        b.load_state_dict(state)
        assert_same_batches(run(b)[1], epoch0[6:], "resumed at the same world and batch size")


def test_what_cannot_carry_over(data):
    window = dict(BASE, shuffle="window", drop_last=True)
    with ringtrain.Loader(data, 32, rank=0, world_size=2, **window) as a:
        run(a, 2)
        state = a.state_dict()
        assert state["sample"] is None
        at_start = dict(state, step=0)
    with ringtrain.Loader(data, 32, **window) as one:
        with pytest.raises(ValueError, match="window"):
            one.load_state_dict(state)
        one.load_state_dict(at_start)  # an epoch's start is a start at any world size
        assert (one.epoch, one.state_dict()["step"]) == (state["epoch"], 0)

    exact = dict(BASE, shuffle=True, drop_last=True)
    with ringtrain.Loader(data, 32, rank=0, world_size=2, **exact) as a:
        run(a, 3)
        old = {k: v for k, v in a.state_dict().items() if k not in ("sample", "version")}  # an older ringtrain's
    for world in (2, 1):
        with ringtrain.Loader(data, 32, rank=0, world_size=world, **exact) as b:
            with pytest.raises(ValueError, match="older ringtrain"):
                b.load_state_dict(old)
    with ringtrain.Loader(data, 32, **exact) as ref:
        epoch0 = run(ref)[1]
    old1 = dict(old, world_size=1)
    with ringtrain.Loader(data, 32, **exact) as c:
        c.load_state_dict(old1)  # world 1: its order was the whole sequence, as today's
        assert_same_batches(run(c)[1], epoch0[3:], "an older world-1 state")
    with ringtrain.Loader(data, 24, rank=1, world_size=3, **exact) as d:
        d.load_state_dict(old1)  # and it carries over to another world and batch size as a version-2 one
        assert d.state_dict()["sample"] == 3 * 32

    with ringtrain.Loader(data, 32, **exact) as e:
        with pytest.raises(ValueError, match="not a position"):
            e.load_state_dict(dict(old1, version=2, sample=N, batch_size=16))
