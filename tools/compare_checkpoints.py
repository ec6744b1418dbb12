#!/usr/bin/python3
"""
compare_checkpoints.py - says whether two training runs of ringtrain produced
the same thing, bit for bit, artefact by artefact. The reader of
tools/dev/compare_digests.sh, usable on its own:

    /usr/bin/python3 tools/compare_checkpoints.py KIND A B

KIND, and what A and B are:
  checkpoint    two checkpoint directories: model.safetensors,
                optimizer.safetensors and state.json, as the three kinds below
  safetensors   two safetensors files: the tensors' names (in file order),
                dtypes, shapes, data offsets and bytes, and __metadata__ but
                for checkpoint_id (which is new for every checkpoint)
  state         two state.json files, but for checkpoint_id, train_ns and the
                run's command line and banner facts (which name paths)
  metrics       two --metrics JSON Lines files, row by row, but for the timing
                fields (time_s, images_per_s, data_wait_frac, exposed_comm_frac,
                the GPU counters, the epoch's step profile, rank_images_per_s)
  metrics-final the same, keeping the last row of each epoch only: an
                interrupted run that was resumed writes a "(partial)" row for
                the epoch it stopped in, and the resumed run the whole epoch's
  summary       the last JSON line of two `train --json` outputs, but for the
                timing fields (images_per_s, steady_images_per_s, time_s,
                train_time_s, process_images_per_s, process_train_time_s (a
                resumed run's own share), exposed_comm_frac, profile, verdict,
                trace, startup, per_rank, host_waits_per_step, cuda_graph: how the build
                runs a step, not what it trains) and the command line and facts
  eval          the last JSON line of two `eval --json` outputs: model,
                images, loss and accuracy

Prints one line per artefact, "same: <what>" or "DIFFERS: <what>: <how>",
and exits 0 when everything is the same, 1 when something differs, 2 when a
file cannot be read or parsed. Floats are compared as parsed from the JSON
text (the writer prints 17 significant digits, so equal text is equal bits).

Needs Python 3 and its standard library; numpy, when installed, adds the
largest absolute difference of float tensors whose bytes differ.
"""

import json
import os
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in tools/

METRICS_TIMING = ("time_s", "images_per_s", "data_wait_frac", "exposed_comm_frac", "gpu_samples", "gpu_util_pct",
                  "gpu_mem_used_gib", "gpu_power_w", "gpu_sm_clock_mhz", "profile", "rank_images_per_s")
SUMMARY_TIMING = ("images_per_s", "steady_images_per_s", "time_s", "train_time_s", "process_images_per_s",
                  "process_train_time_s", "exposed_comm_frac", "profile", "verdict", "trace", "startup",
                  "per_rank", "host_waits_per_step", "cuda_graph", "command", "facts")
# "command" and "facts" (the run's command line and banner) name paths, which differ between two runs compared
STATE_VOLATILE = ("checkpoint_id", "train_ns", "command", "facts")
META_VOLATILE = ("checkpoint_id",)
EVAL_FIELDS = ("model", "images", "loss", "accuracy")
NUMPY_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1"}
SHOW = 4  # names listed per difference before "and N more"


class ReadError(Exception):
    pass


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError as e:
        raise ReadError("%s: %s" % (path, e.strerror))


def _json(text, path):
    try:
        return json.loads(text)
    except ValueError as e:
        raise ReadError("%s: not JSON: %s" % (path, e))


def _names(xs):
    xs = list(xs)
    more = " and %d more" % (len(xs) - SHOW) if len(xs) > SHOW else ""
    return ", ".join(xs[:SHOW]) + more


def load_safetensors(path):
    """Returns (metadata, [(name, dtype, shape, data_offsets)] in file order, data bytes)."""
    blob = _read(path, "rb")
    if len(blob) < 8:
        raise ReadError("%s: %d bytes, shorter than the header length" % (path, len(blob)))
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ReadError("%s: header length %d runs past the end of the file" % (path, n))
    header = _json(blob[8:8 + n].decode("utf-8", "replace"), path)
    if not isinstance(header, dict):
        raise ReadError("%s: the header is not a JSON object" % path)
    meta = header.pop("__metadata__", {})
    try:
        tensors = [(k, v["dtype"], v["shape"], v["data_offsets"]) for k, v in header.items()]
    except (TypeError, KeyError) as e:
        raise ReadError("%s: a tensor entry lacks %s" % (path, e))
    return meta, tensors, blob[8 + n:]


def _max_diff(dtype, a, b):
    """' (max |diff| X)' for float tensors when numpy is there, else ''."""
    if dtype not in ("F32", "F64", "F16"):
        return ""
    try:
        import numpy as np
    except ImportError:
        return ""
    x = np.frombuffer(a, NUMPY_DTYPES[dtype]).astype(np.float64)
    y = np.frombuffer(b, NUMPY_DTYPES[dtype]).astype(np.float64)
    if x.shape != y.shape:
        return ""
    bits = {"F32": "<u4", "F64": "<u8", "F16": "<u2"}[dtype]
    apart = int(np.count_nonzero(np.frombuffer(a, bits) != np.frombuffer(b, bits)))
    with np.errstate(invalid="ignore"):
        d = np.abs(x - y)
    return " (max |diff| %.3g, %d of %d elements)" % (np.nanmax(d), apart, x.size)


def compare_safetensors(a, b, what=None):
    what = what or os.path.basename(a)
    ma, ta, da = load_safetensors(a)
    mb, tb, db = load_safetensors(b)
    problems = []
    for k in META_VOLATILE:
        ma.pop(k, None)
        mb.pop(k, None)
    if ma != mb:
        keys = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
        problems.append("metadata %s" % "; ".join("%s %r vs %r" % (k, ma.get(k), mb.get(k)) for k in keys[:SHOW]))
    na, nb = [t[0] for t in ta], [t[0] for t in tb]
    if na != nb:
        only_a, only_b = [x for x in na if x not in nb], [x for x in nb if x not in na]
        if only_a or only_b:
            problems.append("tensors only in A: %s; only in B: %s" % (_names(only_a) or "none", _names(only_b) or "none"))
        else:
            problems.append("same tensors in another order (first apart: %s)"
                            % next(x for x, y in zip(na, nb) if x != y))
    eb = {t[0]: t for t in tb}
    layout, data = [], []
    for name, dt, shape, offs in ta:
        if name not in eb:
            continue
        _, dt2, shape2, offs2 = eb[name]
        if (dt, shape) != (dt2, shape2):
            layout.append("%s %s%s vs %s%s" % (name, dt, shape, dt2, shape2))
            continue
        if offs != offs2:
            layout.append("%s at %s vs %s" % (name, offs, offs2))
        x, y = da[offs[0]:offs[1]], db[offs2[0]:offs2[1]]
        if x != y:
            data.append((name, dt, x, y))
    if layout:
        problems.append("dtype, shape or offsets: %s" % _names(layout))
    if data:
        name, dt, x, y = data[0]
        problems.append("bytes of %d of %d tensors: %s; the first, %s%s" % (
            len(data), len(ta), _names(d[0] for d in data), name, _max_diff(dt, x, y)))
    if len(da) != len(db) and not layout:
        problems.append("data sections of %d and %d bytes" % (len(da), len(db)))
    return what, problems, "%d tensors, %d bytes" % (len(ta), len(da))


def _short(v, width=48):
    t = json.dumps(v)
    return t if len(t) <= width else t[:width - 3] + "..."


def _dict_diff(x, y, skip):
    """'key A vs B' for each key but those in skip whose values differ; a
    string holding a JSON object (state.json's loader) shows its own keys."""
    out = []
    for k in sorted(k for k in set(x) | set(y) if k not in skip and x.get(k, "(absent)") != y.get(k, "(absent)")):
        a, b = x.get(k, "(absent)"), y.get(k, "(absent)")
        try:
            ia, ib = json.loads(a), json.loads(b)
        except (TypeError, ValueError):
            ia = ib = None
        if isinstance(ia, dict) and isinstance(ib, dict):
            out += ["%s.%s" % (k, d) for d in _dict_diff(ia, ib, ())]
        else:
            out.append("%s %s vs %s" % (k, _short(a), _short(b)))
    return out


def compare_state(a, b, what=None):
    x, y = _json(_read(a), a), _json(_read(b), b)
    if not isinstance(x, dict) or not isinstance(y, dict):
        raise ReadError("%s or %s: not a JSON object" % (a, b))
    diff = _dict_diff(x, y, STATE_VOLATILE)
    return what or os.path.basename(a), (["fields %s" % "; ".join(diff[:SHOW])] if diff else []), \
        "%d fields" % len([k for k in x if k not in STATE_VOLATILE])


def _jsonl(path):
    rows = []
    for i, line in enumerate(_read(path).splitlines()):
        if line.strip():
            r = _json(line, "%s line %d" % (path, i + 1))
            if not isinstance(r, dict):
                raise ReadError("%s line %d: not a JSON object" % (path, i + 1))
            rows.append(r)
    return rows


def _final_rows(rows):
    last = {}
    for r in rows:
        last[r.get("epoch")] = r
    return [last[k] for k in sorted(last, key=lambda e: (e is None, e))]


def compare_metrics(a, b, what=None, final=False):
    x, y = _jsonl(a), _jsonl(b)
    if final:
        x, y = _final_rows(x), _final_rows(y)
    problems = []
    if len(x) != len(y):
        problems.append("%d rows vs %d" % (len(x), len(y)))
    for i, (r, s) in enumerate(zip(x, y)):
        diff = _dict_diff(r, s, METRICS_TIMING)
        if diff:
            problems.append("row %d (epoch %s): %s" % (i + 1, r.get("epoch"), "; ".join(diff[:SHOW])))
            break
    return what or os.path.basename(a), problems, "%d rows" % len(x)


def _last_json_line(path):
    lines = [l for l in _read(path).splitlines() if l.startswith("{")]
    if not lines:
        raise ReadError("%s: no JSON line" % path)
    r = _json(lines[-1], path)
    if not isinstance(r, dict):
        raise ReadError("%s: the last JSON line is not an object" % path)
    return r


def compare_summary(a, b, what=None):
    x, y = _last_json_line(a), _last_json_line(b)
    diff = _dict_diff(x, y, SUMMARY_TIMING)
    return what or "--json summary", (["fields %s" % "; ".join(diff[:SHOW])] if diff else []), \
        "%d fields" % len([k for k in x if k not in SUMMARY_TIMING])


def compare_eval(a, b, what=None):
    x, y = _last_json_line(a), _last_json_line(b)
    x = {k: x.get(k, "(absent)") for k in EVAL_FIELDS}
    y = {k: y.get(k, "(absent)") for k in EVAL_FIELDS}
    diff = _dict_diff(x, y, ())
    if x["images"] != y["images"]:
        diff.append("(another number of images: another split or dataset was evaluated)")
    return what or "eval", (["fields %s" % "; ".join(diff)] if diff else []), \
        "%s images, loss %s, accuracy %s" % (x["images"], x["loss"], x["accuracy"])


def compare_checkpoint(a, b):
    out = [compare_safetensors(os.path.join(a, f), os.path.join(b, f), f)
           for f in ("model.safetensors", "optimizer.safetensors")]
    out.append(compare_state(os.path.join(a, "state.json"), os.path.join(b, "state.json"), "state.json"))
    return out


KINDS = {
    "checkpoint": compare_checkpoint,
    "safetensors": compare_safetensors,
    "state": compare_state,
    "metrics": compare_metrics,
    "metrics-final": lambda a, b: compare_metrics(a, b, "metrics (last row per epoch)", final=True),
    "summary": compare_summary,
    "eval": compare_eval,
}


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) != 4 or argv[1] not in KINDS:
        sys.stderr.write("usage: compare_checkpoints.py %s A B\n" % "|".join(KINDS))
        return 2
    try:
        res = KINDS[argv[1]](argv[2], argv[3])
    except ReadError as e:
        print("ERROR: %s" % e)
        return 2
    differ = 0
    for what, problems, size in res if isinstance(res, list) else [res]:
        if problems:
            differ = 1
            print("DIFFERS: %s: %s" % (what, "; ".join(problems)))
        else:
            print("same: %s (%s)" % (what, size))
    return differ


if __name__ == "__main__":
    sys.exit(main(sys.argv))
