"""What a PyTorch user does out of habit must not silently give other data or a confusing error:

- resume, then the usual ``set_epoch(epoch)`` at the top of the resumed epoch: the rest of that epoch, not its
  first batches again;
- evaluation splits are not augmented unless asked;
- a one-process job started by the batch shell of a multi-task Slurm allocation is a world of one;
- pickle and copy.deepcopy give a loader at the same position, with the same batches;
- labels kept for evaluation (``targets.append(y)``) hold no ring slot;
- each iteration is one epoch, as a DataLoader's: after a ``break`` (or ``next(iter(L))``) the next ``for`` is
  the next epoch;
- Ctrl-C (a KeyboardInterrupt between the C loader's hand-over and the user's batch) loses nothing and breaks
  nothing: the next ``for`` has the batch that was interrupted;
- a non-integral batch size, a state without a position, and iterating a closed loader are clear errors;
  workers=0 (DataLoader's main-process loading) is one worker thread."""

import copy
import pickle

import pytest
import torch

import ringtrain
from rtcheck import assert_same_batches, clone_epoch, take

OPTS = dict(batch_size=64, seed=5, shuffle=True, workers=2)


def test_set_epoch_after_resume_keeps_the_position(data):
    with ringtrain.Loader(data, **OPTS) as ref:
        clone_epoch(ref)
        epoch1 = clone_epoch(ref)
    with ringtrain.Loader(data, **OPTS) as a:
        clone_epoch(a)
        take(a, 10)
        state = a.state_dict()
    assert (state["epoch"], state["step"]) == (1, 10)
    with ringtrain.Loader(data, **OPTS) as b:
        b.load_state_dict(state)
        b.set_epoch(1)  # the loop's usual first line
        rest = clone_epoch(b)
        assert_same_batches(rest, epoch1[10:], "resumed at epoch 1 step 10, then set_epoch(1)")
        # Past the resumed batches set_epoch is DistributedSampler's again: the epoch from its start.
        b.set_epoch(1)
        assert_same_batches(clone_epoch(b), epoch1, "set_epoch(1) once the resumed epoch ran")


def test_evaluation_splits_are_not_augmented_by_default(data, raw_test_records):
    images, _ = raw_test_records
    with ringtrain.Loader(data, 100, split="test", shuffle=False, drop_last=False, workers=1) as t:
        x, _ = next(iter(t))
    assert torch.equal(x, torch.from_numpy(images[:100])), "the test split's first batch is not the records"


def test_a_batch_shell_python_is_a_world_of_one(data, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
              "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")  # the allocation's, seen by the batch shell
    with ringtrain.Loader(data, **OPTS) as one:
        assert (one.rank, one.world_size) == (0, 1)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")  # inside `srun -n 2`
    with ringtrain.Loader(data, **OPTS) as srun:
        assert (srun.rank, srun.world_size) == (0, 2)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickle_and_deepcopy_give_a_loader_at_the_same_position(data, how):
    with ringtrain.Loader(data, **OPTS) as a:
        take(a, 7)
        b = pickle.loads(pickle.dumps(a)) if how == "pickle" else copy.deepcopy(a)
        with b:
            assert b.state_dict() == a.state_dict()
            # the next iteration is the original's: the next epoch, after the one left early
            assert_same_batches(take(b, 3), take(a, 3), f"the batches after {how}")
            assert a.epoch == b.epoch == 1


def test_keeping_the_labels_holds_no_slot(data):
    with ringtrain.Loader(data, 50, split="test", shuffle=False, drop_last=False, workers=1, slots=4) as t:
        targets = [y for _, y in t]  # every batch's labels kept: far more batches than slots
        assert len(targets) == len(t) > 4
    with ringtrain.Loader(data, 50, split="test", shuffle=False, drop_last=False, workers=1) as t:
        want = [y.clone() for _, y in t]
    assert all(torch.equal(a, b) for a, b in zip(targets, want))


def test_each_iteration_is_an_epoch(data):
    with ringtrain.Loader(data, **OPTS) as ref:
        epochs = [clone_epoch(ref) for _ in range(3)]
    with ringtrain.Loader(data, **OPTS) as a:
        assert_same_batches(take(a, 3), epochs[0][:3], "epoch 0's first batches")
        assert_same_batches(clone_epoch(a), epochs[1], "the for after a break: epoch 1 whole")
        x, _ = next(iter(a))
        assert torch.equal(x, epochs[2][0][0]), "next(iter(loader)): epoch 2's first batch"
        assert a.epoch == 2 and a.state_dict()["step"] == 1


def test_an_interrupted_hand_over_loses_no_batch(data, monkeypatch):
    with ringtrain.Loader(data, **OPTS) as ref:
        epoch0 = clone_epoch(ref)
    with ringtrain.Loader(data, **OPTS) as a:
        real = a._cpu_batch
        calls = []

        def interrupted_once(cb):
            calls.append(cb.step)
            if len(calls) == 1:
                raise KeyboardInterrupt  # as Python raises it when the C call returns
            return real(cb)

        monkeypatch.setattr(a, "_cpu_batch", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            next(iter(a))
        # the for after it: epoch 0 whole, its first batch made again (it said "expected batch ... got ...")
        assert_same_batches(clone_epoch(a), epoch0, "the epoch after an interrupted first batch")


def test_ctrl_c_in_a_tight_loop_leaves_a_working_loader(data):
    import signal

    def settle():
        """A Python call: a SIGALRM that came in just before the disarm runs its handler here, inside the try."""

    with ringtrain.Loader(data, 16, workers=2) as a:
        old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        # the handler before any timer is armed (SIGALRM's default action ends the process), the timer armed and
        # disarmed inside the try: the interrupt may come at any point of the epoch, never outside the try
        old_alrm = signal.signal(signal.SIGALRM, lambda *_: signal.raise_signal(signal.SIGINT))
        interrupted = 0
        try:
            for k in range(40):
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0.0005 + 0.0001 * k)
                    for _ in a:
                        pass
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    settle()
                except KeyboardInterrupt:
                    interrupted += 1
                x, y = next(iter(a))  # never "expected batch (epoch e, step s), got ..."
                assert x.shape[0] == 16
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alrm)
            signal.signal(signal.SIGINT, old_int)
        print(f"{interrupted} of 40 epochs interrupted")
        assert interrupted >= 10, "the timers should cut most epochs short, or this checks nothing"


def test_clear_errors(data):
    with pytest.raises(TypeError):
        ringtrain.Loader(data, 64.7)
    with ringtrain.Loader(data, 64, workers=0) as zero:  # DataLoader's num_workers=0: one thread here
        assert zero.workers == 1 and next(iter(zero))[0].shape[0] == 64
    with pytest.raises(ValueError, match="at least 0"):
        ringtrain.Loader(data, 64, workers=-1)
    with ringtrain.Loader(data, **OPTS) as a:
        with pytest.raises(ValueError, match="no epoch or step"):
            a.load_state_dict({})
        it = iter(a)
        next(it)
        a.close()
        with pytest.raises(ValueError, match="closed loader"):
            next(it)


def test_sampler_and_batch_sampler_as_a_dataloaders(data):
    """Frameworks keep `loader.sampler` and call set_epoch on it later; Lightning 2.5+ reads `batch_sampler`."""
    with ringtrain.Loader(data, **OPTS) as loader:
        assert loader.sampler is loader.sampler, "a new sampler object on every access"
        assert loader.batch_sampler is None
        kept = loader.sampler
        kept.set_epoch(3)
        assert loader.epoch == 3
