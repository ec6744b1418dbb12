"""state_dict() / load_state_dict(): a loader stopped mid-epoch and rebuilt from its state goes on with
exactly the batches an uninterrupted one yields, to the end of that epoch and into the next."""

import pickle

import pytest

import ringtrain
from rtcheck import assert_same_batches, clone_epoch

CASES = {
    "shuffled-crop+flip": dict(batch_size=64, seed=5, shuffle=True, augment="crop+flip", workers=2),
    "rank1-of-2-pad": dict(batch_size=48, seed=13, shuffle=True, augment="crop+flip", drop_last=False, rank=1,
                           world_size=2, workers=2),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("stop_epoch,stop_step", [(0, 10), (1, 3)])
def test_resume_mid_epoch_gives_the_uninterrupted_batches(data, case, stop_epoch, stop_step):
    opts = CASES[case]
    with ringtrain.Loader(data, **opts) as ref:
        epochs = [clone_epoch(ref) for _ in range(stop_epoch + 2)]

    first = ringtrain.Loader(data, **opts)
    for e in range(stop_epoch):
        assert_same_batches(clone_epoch(first), epochs[e], f"epoch {e} before the stop")
    taken = []
    for x, y in first:
        taken.append((x.clone(), y.clone()))
        if len(taken) == stop_step:
            break
    assert_same_batches(taken, epochs[stop_epoch][:stop_step], "the batches before the stop")
    state = first.state_dict()
    first.close()
    del first
    # as a checkpoint carries it
    state = pickle.loads(pickle.dumps(state))

    resumed = ringtrain.Loader(data, **opts)
    resumed.load_state_dict(state)
    rest = clone_epoch(resumed)
    assert_same_batches(rest, epochs[stop_epoch][stop_step:],
                        f"resumed at epoch {stop_epoch} step {stop_step}: the rest of the epoch")
    assert_same_batches(clone_epoch(resumed), epochs[stop_epoch + 1], f"the epoch after the resumed one")
    resumed.close()


def test_state_dict_at_an_epoch_boundary_starts_the_next_epoch(data):
    opts = CASES["shuffled-crop+flip"]
    with ringtrain.Loader(data, **opts) as ref:
        epochs = [clone_epoch(ref) for _ in range(2)]
    with ringtrain.Loader(data, **opts) as a:
        for _ in a:
            pass
        state = a.state_dict()
    with ringtrain.Loader(data, **opts) as b:
        b.load_state_dict(state)
        assert_same_batches(clone_epoch(b), epochs[1], "resumed after a whole epoch")


def test_set_epoch_gives_that_epochs_batches(data):
    opts = CASES["shuffled-crop+flip"]
    with ringtrain.Loader(data, **opts) as ref:
        epochs = [clone_epoch(ref) for _ in range(3)]
    with ringtrain.Loader(data, **opts) as a:
        a.set_epoch(2)
        assert_same_batches(clone_epoch(a), epochs[2], "set_epoch(2)")
        a.set_epoch(1)
        assert_same_batches(clone_epoch(a), epochs[1], "set_epoch(1) after epoch 2")


def test_load_state_dict_refuses_another_order(data):
    # Another batch size goes on in the same global order (test_resume_world.py); another shuffle is another
    # order, and the window shuffle's depends on the batch and world.
    with ringtrain.Loader(data, 64, seed=5, workers=2) as a:
        next(iter(a))
        state = a.state_dict()
    with ringtrain.Loader(data, 64, seed=5, workers=2, shuffle="none") as b:
        with pytest.raises(ValueError, match="shuffle"):
            b.load_state_dict(state)
    with ringtrain.Loader(data, 64, seed=5, workers=2, shuffle="window") as a:
        next(iter(a))
        state = a.state_dict()
    with ringtrain.Loader(data, 32, seed=5, workers=2, shuffle="window") as b:
        with pytest.raises(ValueError, match="window"):
            b.load_state_dict(state)
