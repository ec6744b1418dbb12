"""Fixtures shared by the ringtrain package's tests.

Run from the source tree against a build (the module and the package's .py files in <build>/python):

    PYTHONPATH=build/python RINGTRAIN_BIN=build/ringtrain /usr/bin/python3 -m pytest -q python/tests

RINGTRAIN_BIN is the `ringtrain` command the batches are compared with (`loadbench --digest`); unset, the one
beside the package's build folder is used. When the C module was not built (no python3-dev), or torch, numpy
or the module's folder is missing, nothing is collected and the run exits 77 (ctest's "skipped"); a module that
is there but fails to import is an error, not a skip.

The dataset: one synthetic CIFAR-10 (2000 train + 501 test records, seed 26) packed with a 10 % validation
split (train 1800, val 200, test 501), made once per run with the command line (synth + pack).

The variable-size dataset (test_variable.py): the image folder tests/rt_mkfolder writes (every JPEG, PNG,
WebP and PPM variant, bad and ignored files, PHOTOS_PER_CLASS generated JPEGs per class), packed with
`--codec jpeg --max-side 256 --skip-bad --val-split 0.2`. rt_mkfolder is RT_MKFOLDER, else the one in the
`tests` folder beside the ringtrain command.
"""

import importlib.util
import multiprocessing
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from rtcheck import C, H, MAX_SIDE, PHOTOS_PER_CLASS, RECORD, SEED, TEST_RAW, TRAIN_RAW, W

SKIP_EXIT = 77


def _missing():
    """Why the package cannot be tested here (None: it can)."""
    for mod in ("numpy", "torch"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed for {sys.executable} (tools/install-deps.sh --test)"
    spec = importlib.util.find_spec("ringtrain")
    if spec is None or spec.origin is None:
        return ("ringtrain is not on PYTHONPATH: build the project with python3-dev installed and run with "
                "PYTHONPATH=<build>/python")
    pkg = Path(spec.origin).parent
    if not any(pkg.glob("_ringtrain*.so")):
        return f"the C module _ringtrain.abi3.so is not in {pkg} (built only when python3-dev is installed)"
    return None


MISSING = _missing()


def pytest_ignore_collect(collection_path, config):
    if MISSING and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return True
    return None


def pytest_report_header(config):
    if MISSING:
        return f"ringtrain tests skipped: {MISSING}"
    import ringtrain

    return f"ringtrain {ringtrain.__version__} from {Path(ringtrain.__file__).parent}; ringtrain command {_bin()}"


def pytest_sessionfinish(session, exitstatus):
    if MISSING and exitstatus in (0, 5):
        print(f"\nskipped: {MISSING}", file=sys.stderr)
        session.exitstatus = SKIP_EXIT


def _bin():
    b = os.environ.get("RINGTRAIN_BIN")
    if b:
        return b
    import ringtrain

    beside = Path(ringtrain.__file__).resolve().parents[2] / "ringtrain"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("ringtrain")


@pytest.fixture(scope="session")
def rt_bin():
    b = _bin()
    if not b:
        pytest.fail("no ringtrain command: set RINGTRAIN_BIN to the build's `ringtrain`")
    return b


def run_cli(rt_bin, *args, check=True):
    r = subprocess.run([rt_bin, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        pytest.fail(f"`ringtrain {' '.join(map(str, args))}` exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def cli(rt_bin):
    """cli(*args) runs the ringtrain command and returns the CompletedProcess (fails the test on exit != 0)."""
    return lambda *args, check=True: run_cli(rt_bin, *args, check=check)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory, rt_bin):
    """(packed dataset dir, synth source dir), made once per run."""
    root = tmp_path_factory.mktemp("data")
    src, packed = root / "src", root / "c10"
    run_cli(rt_bin, "synth", "--out", src, "--train", TRAIN_RAW, "--test", TEST_RAW, "--seed", SEED, "-j", 2)
    run_cli(rt_bin, "pack", src, "--out", packed, "--val-split", "0.1", "-j", 2)
    return packed, src


@pytest.fixture(scope="session")
def photos_dataset(tmp_path_factory, rt_bin):
    """(packed variable-size dataset dir, rt_mkfolder's expected.json as a dict), made once per run."""
    import json

    mk = os.environ.get("RT_MKFOLDER") or str(Path(rt_bin).resolve().parent / "tests" / "rt_mkfolder")
    if not os.access(mk, os.X_OK):
        pytest.fail(f"no rt_mkfolder at {mk}: build the `rt_mkfolder` target or set RT_MKFOLDER")
    root = tmp_path_factory.mktemp("photos")
    folder, packed = root / "photos", root / "packed"
    r = subprocess.run([mk, str(folder), "--count", str(PHOTOS_PER_CLASS)], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        pytest.fail(f"`{mk} {folder}` exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    run_cli(rt_bin, "pack", folder, "--out", packed, "--codec", "jpeg", "--max-side", MAX_SIDE, "--skip-bad",
            "--val-split", "0.2", "-j", 2)
    return packed, json.loads((root / "photos.expected.json").read_text())


@pytest.fixture(scope="session")
def photos(photos_dataset):
    return str(photos_dataset[0])


@pytest.fixture(scope="session")
def data(dataset):
    return str(dataset[0])


@pytest.fixture(scope="session")
def mnist(tmp_path_factory, cli):
    """A packed synthetic MNIST (1x28x28; 480 train, 64 test records)."""
    root = tmp_path_factory.mktemp("mnist")
    cli("synth", "--out", root / "src", "--format", "mnist", "--train", 480, "--test", 64, "--seed", 2)
    cli("pack", root / "src", "--out", root / "packed")
    return str(root / "packed")


@pytest.fixture(scope="session")
def raw_test_records(dataset):
    """The test split read straight from the synthetic CIFAR file: (images uint8 (N,C,H,W), labels int64 (N,))."""
    import numpy as np

    raw = (dataset[1] / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    assert len(raw) == TEST_RAW * (RECORD + 1)
    a = np.frombuffer(raw, dtype=np.uint8).reshape(TEST_RAW, RECORD + 1)
    return a[:, 1:].reshape(TEST_RAW, C, H, W).copy(), a[:, 0].astype(np.int64)


@pytest.fixture(scope="session")
def loadbench_digest(rt_bin):
    """loadbench_digest(data, **options) -> the 16 hex digits `ringtrain loadbench --digest` prints."""

    def digest(data, **opts):
        args = ["loadbench", data, "--digest"]
        for k, v in opts.items():
            args += ["--" + k.replace("_", "-"), v]
        r = run_cli(rt_bin, *args)
        lines = [l for l in r.stdout.splitlines() if l.startswith("digest: ")]
        assert len(lines) == 1, f"no digest line in loadbench's output:\n{r.stdout}"
        return lines[0].split()[1]

    return digest


def _child(conn, fn, args):
    try:
        res = ("ok", fn(*args))
    except BaseException as e:  # reported to the parent, which decides
        res = ("raised", type(e).__name__, getattr(e, "errno", None), str(e), traceback.format_exc())
    conn.send(res)
    conn.close()


def _run_forked(calls, timeout):
    """Runs every (fn, args) of `calls` in a forked process of its own, all at once; returns their results."""
    ctx = multiprocessing.get_context("fork")
    procs = []
    try:
        for fn, args in calls:
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(w, fn, args))
            p.start()
            w.close()
            procs.append((fn.__name__, p, r))
        results = []
        for name, p, r in procs:
            if not r.poll(timeout):
                pytest.fail(f"{name} gave no answer within {timeout} s (a deadlock?): killed")
            try:
                res = r.recv()
            except EOFError:
                p.join(timeout)
                pytest.fail(f"{name}'s process died without an answer: exit code {p.exitcode}")
            p.join(timeout)
            if p.is_alive():
                pytest.fail(f"{name} answered but its process did not end within {timeout} s")
            assert p.exitcode == 0, f"{name}'s process ended with exit code {p.exitcode}"
            if res[0] != "ok":
                pytest.fail(f"{name} raised {res[1]}: {res[3]}\n{res[4]}")
            results.append(res[1])
        return results
    finally:
        for _, p, r in procs:
            if p.is_alive():
                p.kill()
                p.join()
            r.close()


@pytest.fixture(scope="session")
def forked():
    """forked(fn, *args, timeout=s) runs fn(*args) in a forked process and returns its result.

    The test fails when the process dies (a crash: signal or exit code), gives no answer within `timeout`
    seconds (a deadlock: it is killed) or fn raised (its traceback is shown). fn's result must pickle."""
    return lambda fn, *args, timeout=60: _run_forked([(fn, args)], timeout)[0]


@pytest.fixture(scope="session")
def forked_group():
    """forked_group([(fn, args), ...], timeout=s): the same for processes that run side by side (ranks)."""
    return lambda calls, timeout=60: _run_forked(calls, timeout)
