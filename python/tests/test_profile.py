"""ringtrain.profile(): times any iterable and gives the C trainer's input verdict -- input-bound where the
step waits for its batches, not where the consumer's own work is the step."""

import re
import time

import pytest
import torch

import ringtrain
from ringtrain import _ringtrain

# "verdict: input-bound: ... waits 41.0 ms ... 60.0 ms ... (68%)..." then "\n  try: ..."
INPUT_BOUND = re.compile(r"^verdict: input-bound: .*?waits (\d+\.\d) ms .*?(\d+\.\d) ms.*?\((\d+)%\)", re.S)


class Batches:
    """An iterable of `n` (images, labels) batches, each taking `delay` seconds inside __next__."""

    def __init__(self, n, delay, batch=32):
        self.n, self.delay, self.batch = n, delay, batch

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i == self.n:
            raise StopIteration
        self.i += 1
        if self.delay:
            time.sleep(self.delay)
        return torch.zeros(self.batch, 3, 4, 4, dtype=torch.uint8), torch.zeros(self.batch, dtype=torch.int64)


def sleeper(seconds):
    return lambda batch: time.sleep(seconds)


def test_slow_iterable_is_input_bound():
    p = ringtrain.profile(Batches(20, 0.020), steps=14, warmup=2, body=sleeper(0.002), quiet=True)
    assert p.limit == "input", p.verdict
    assert 19.0 <= p.wait_ms <= 60.0, f"wait {p.wait_ms} ms for a 20 ms __next__"
    assert p.wait_ms + 1.5 <= p.step_ms <= p.wait_ms + 40.0, (p.wait_ms, p.step_ms)
    assert p.share == pytest.approx(p.wait_ms / p.step_ms, abs=0.01) and p.share > 0.5
    m = INPUT_BOUND.match(p.verdict)
    assert m, f"not the trainer's verdict format: {p.verdict!r}"
    wait, step, pct = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert wait == pytest.approx(p.wait_ms, abs=0.051) and step == pytest.approx(p.step_ms, abs=0.051), p.verdict
    assert abs(pct - 100 * p.share) <= 0.51, p.verdict
    assert "\n  try: " in p.verdict


def test_fast_iterable_with_a_slow_body_is_not_input_bound():
    p = ringtrain.profile(Batches(20, 0.0), steps=14, warmup=2, body=sleeper(0.020), quiet=True)
    assert p.limit != "input", p.verdict
    assert "input-bound" not in p.verdict
    assert p.verdict.startswith("verdict: "), p.verdict
    assert p.step_ms >= 19.0 and p.wait_ms < 0.15 * p.step_ms, (p.wait_ms, p.step_ms)
    assert p.share < 0.15


def test_profile_prints_the_verdict_unless_quiet(capsys):
    p = ringtrain.profile(Batches(8, 0.005), steps=4, warmup=1, body=sleeper(0.001))
    assert p.verdict in capsys.readouterr().out
    ringtrain.profile(Batches(8, 0.005), steps=4, warmup=1, quiet=True)
    assert capsys.readouterr().out == ""


def test_profile_without_a_body_names_no_limit(data):
    """A loop that does nothing but take batches is all wait: that says how fast the loader delivers, not that
    the input limits training (it said "input-bound ... try: more loader workers")."""
    with ringtrain.Loader(data, 64, workers=2) as loader:
        p = ringtrain.profile(loader, steps=10, warmup=2, quiet=True)
    assert p.limit == "none" and not p.input_bound, p.verdict
    assert p.verdict.startswith("verdict: no limit measured: ") and "delivers about" in p.verdict, p.verdict
    assert "body=" in p.verdict


def test_profile_counts_the_steps_it_was_asked_for():
    seen = []
    ringtrain.profile(Batches(30, 0.0), steps=10, warmup=3, body=seen.append, quiet=True)
    assert 10 <= len(seen) <= 14, f"body ran {len(seen)} times for warmup 3 + 10 steps"


def test_profile_of_a_ringtrain_loader_and_a_dataloader(data):
    with ringtrain.Loader(data, 64, workers=2) as loader:
        p = ringtrain.profile(loader, steps=10, warmup=2, body=sleeper(0.010), quiet=True)
    assert p.step_ms >= 9.5 and p.limit in ("input", "compute"), p
    dl = torch.utils.data.DataLoader(list(range(400)), batch_size=20)
    p = ringtrain.profile(dl, steps=5, warmup=1, body=sleeper(0.005), quiet=True)
    assert p.limit != "input", p.verdict


MS = 1_000_000


def test_a_profile_longer_than_an_epoch_goes_on_into_the_next(data):
    """profile(L, steps=...) with more steps than one pass of the loader holds: it goes on into the next epoch
    and measures the steps asked for (it stopped at the epoch's end, a loader left near it measuring nothing)."""
    with ringtrain.Loader(data, 64, workers=1) as loader:
        n = len(loader)
        p = ringtrain.profile(loader, steps=n + 5, warmup=2, quiet=True)
    assert p.steps == n + 5, (p.steps, n)


def test_wait_verdict_threshold_and_wording():
    """The C rule itself: input-bound from a wait of 15 % of the step on, and the figures in the text."""
    v = _ringtrain.wait_verdict([41 * MS] * 9, [60 * MS] * 9, 256, 4, False)
    assert v["limit"] == "input"
    m = INPUT_BOUND.match(v["text"])
    assert m and (m.group(1), m.group(2), m.group(3)) == ("41.0", "60.0", "68"), v["text"]
    assert v["wait_p50_ms"] == pytest.approx(41.0) and v["step_p50_ms"] == pytest.approx(60.0)
    assert v["share"] == pytest.approx(41 / 60)
    assert "\n  try: " in v["text"]
    below = _ringtrain.wait_verdict([int(8.4 * MS)] * 9, [60 * MS] * 9, 256, 4, False)  # 14 %
    above = _ringtrain.wait_verdict([int(9.6 * MS)] * 9, [60 * MS] * 9, 256, 4, False)  # 16 %
    assert below["limit"] != "input" and "input-bound" not in below["text"], below["text"]
    assert above["limit"] == "input", above["text"]
    # medians, not means: one long wait does not make a run input-bound
    spiky = _ringtrain.wait_verdict([1 * MS] * 8 + [500 * MS], [60 * MS] * 8 + [560 * MS], 256, 4, False)
    assert spiky["limit"] != "input" and spiky["wait_p50_ms"] == pytest.approx(1.0), spiky["text"]
