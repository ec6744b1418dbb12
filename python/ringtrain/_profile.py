"""The input profiler for any iterable: how long the training step waits for its next batch.

Only the timing happens here (it has to: it wraps the user's own iterator); the figures, the rule that
names the limit and the verdict's wording are the C trainer's (the loader library's verdict engine:
rt_input_verdict, and rt_loader_alone_verdict for a loop with no work of its own).
"""

import sys
import time

from . import _ringtrain


def _batch_images(batch):
    """Images in a batch as the usual loaders yield it: (images, labels), a dict, or a tensor."""
    first = batch
    if isinstance(batch, dict):
        first = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 0 else 1


def _workers_of(iterable):
    for attr in ("workers", "num_workers"):
        v = getattr(iterable, attr, None)
        if isinstance(v, int):
            return v
    return 0


class Profile:
    """What ringtrain.profile() measured: per-step medians and the verdict.

    wait_ms   median time a step waited inside next() for its batch
    step_ms   median time from one batch's arrival to the next (the wait plus the consumer's work)
    share     wait_ms / step_ms
    limit     "input" when the input pipeline is the limit, else "compute" (the consumer's own work); "none"
              for profile() without a body, whose loop did no work (the verdict then gives the delivery rate)
    verdict   the verdict in the C trainer's words: "verdict: input-bound: ...\\n  try: ..."
    images_per_s  images per second over the measured steps
    """

    def __init__(self, waits_ns, steps_ns, images, workers, staged, no_work=False):
        if not steps_ns:
            raise ValueError("ringtrain.profile: no step was measured (the iterable ended during the warm-up)")
        v = _ringtrain.wait_verdict(list(waits_ns), list(steps_ns), int(images), int(workers), bool(staged),
                                    bool(no_work))
        self.steps = len(steps_ns)
        self.wait_ms = v["wait_p50_ms"]
        self.step_ms = v["step_p50_ms"]
        self.share = v["share"]
        self.limit = v["limit"]
        self.evidence = v["evidence"]
        self.advice = v["advice"]
        self.verdict = v["text"]
        total = sum(steps_ns)
        self.images_per_s = images * len(steps_ns) / (total * 1e-9) if total else 0.0

    @property
    def input_bound(self):
        return self.limit == "input"

    def __str__(self):
        return (f"{self.steps} steps: wait {self.wait_ms:.1f} ms of a {self.step_ms:.1f} ms step "
                f"({100 * self.share:.0f}%), {self.images_per_s:.0f} img/s\n{self.verdict}")

    __repr__ = __str__


class Profiler:
    """Wraps an iterable and times its batches, for profiling inside one's own training loop:

        prof = ringtrain.Profiler(train_loader)
        for images, labels in prof:
            train_step(images, labels)
        print(prof.result().verdict)

    A step is the time from one batch's arrival to the next one's: the wait inside next() plus the
    loop body's work. The first `warmup` batches (workers starting, caches filling) are not counted.
    On a GPU, the body's work is what the host spends, so let the loop synchronise now and then (a
    loss.item() each step does) for the step time to include the device's.
    """

    def __init__(self, iterable, warmup=5, steps=None, staged=False):
        self.iterable = iterable
        self.warmup = int(warmup)
        self.limit_steps = None if steps is None else int(steps)
        self.staged = bool(staged)
        self.waits_ns, self.steps_ns = [], []
        self.images = 0

    def __iter__(self):
        it = iter(self.iterable)
        n = 0
        arrived = None
        while self.limit_steps is None or len(self.steps_ns) < self.limit_steps:
            t0 = time.perf_counter_ns()
            try:
                batch = next(it)
            except StopIteration:
                # With a step count beyond one pass, an iterable that iterates again (a Loader: its next epoch;
                # a DataLoader) goes on into it. An iterator, or one whose next pass is empty, ends it.
                if self.limit_steps is None:
                    return
                again = iter(self.iterable)
                if again is it:
                    return
                it = again
                t0 = time.perf_counter_ns()
                try:
                    batch = next(it)
                except StopIteration:
                    return
            t1 = time.perf_counter_ns()
            if arrived is not None and n > self.warmup:
                self.waits_ns.append(t1 - t0)
                self.steps_ns.append(t1 - arrived)
            if not self.images:
                self.images = _batch_images(batch)
            arrived = t1
            n += 1
            yield batch
            del batch

    def result(self, no_work=False):
        return Profile(self.waits_ns, self.steps_ns, self.images or 1, _workers_of(self.iterable), self.staged,
                       no_work)


def profile(iterable, steps=None, batch_size=None, warmup=5, body=None, staged=False, quiet=False, file=None):
    """Time `iterable` (a ringtrain.Loader, a torch DataLoader, any iterable of batches) and say whether
    the input is what limits the step.

    body(batch) is the step's work (a training step; None: the wait alone, which measures how fast the
    iterable delivers: the verdict then names no limit, limit "none", and gives the delivery rate). Runs `warmup` batches, then `steps` measured ones (None: to the end of the
    iterable). Prints the verdict in the C trainer's format unless quiet, and returns a Profile:

        verdict: input-bound: the step waits 41.0 ms for data in a 60.0 ms step (68%); ...
          try: ...
    """
    prof = Profiler(iterable, warmup=warmup, steps=steps, staged=staged)
    for batch in prof:
        if body is not None:
            body(batch)
    if batch_size is not None:
        prof.images = int(batch_size)
    res = prof.result(no_work=body is None)
    if not quiet:
        print(str(res), file=file or sys.stdout, flush=True)
    return res
