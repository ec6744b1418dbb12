#!/usr/bin/env python3
"""
check_trace.py - checks a timeline written by `ringtrain train --trace FILE`
independently of the C code that wrote it.

The file is Chrome trace-event JSON in the "JSON Object Format":

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "otherData": {"world": N, ...}}

Why a checker: Perfetto and chrome://tracing load almost anything and show a
broken timeline without a word. A span that ends after its parent ends is
drawn clipped or on a made-up row, an "E" with no "B" is dropped, an unclosed
"B" runs to the end of the trace, a track with no thread_name shows as a bare
number, a counter with a string value is skipped, and ranks whose clocks were
not aligned when their buffers were merged look as if they never met in a
collective. None of that is visible in a test that only looks at the exit
status of the run, so this script checks the file against the format:

  * the top level: an object with a "traceEvents" list, "displayTimeUnit"
    "ms" or "ns" when present, "otherData" an object whose "world" is the
    number of ranks (and whose "steps", "events", "dropped_events",
    "cap_bytes" are counts when present); every pid lies in 0..world-1;
  * every event: "ph" one of M X B E C i I b e n, "pid" and "tid" integers,
    "name" a non-empty string (optional on "E" only), "ts" a finite number
    >= 0 in microseconds (on all but "M"), "cat" a string and "args" an
    object when present;
  * "M": process_name / thread_name with args {"name": str},
    process_sort_index / thread_sort_index with args {"sort_index": int};
    every pid with events has a process_name, every (pid, tid) with
    non-metadata events has a thread_name, and no pid or track is given two
    different names;
  * "X": "dur" a finite number >= 0; "C": "args" holds at least one value and
    every value is a finite number; "i"/"I": "s" in t, p, g when present;
    "b"/"e"/"n": "id" a string or integer and "cat" a string;
  * "B"/"E" pair up per track (an "E" closes the most recent open "B" on its
    (pid, tid), in time order, ties in file order; a named "E" must name its
    "B"); every "b" is closed by an "e" with the same (pid, cat, id, name)
    that is not earlier than it;
  * on every track the X spans and the B/E spans nest: two spans are either
    disjoint or one contains the other, allowing --epsilon microseconds for
    rounding. Spans are sorted per track by (start, -duration) and checked
    with a stack, O(n log n).

Options add checks on what the run should have recorded (ranks, names,
tracks, clock alignment, file size); see --help. --self-test runs the
checker on small synthetic traces, each built to hold one defect.

Exit status: 0 when the trace is clean, 1 when any check fails (the errors
are listed, at most 50, then a count), 2 for a usage error or a file that is
not readable JSON. Python 3 standard library only.
"""

import argparse
import json
import math
import re
import sys
import time

sys.dont_write_bytecode = True

KNOWN_PH = frozenset("MXBECiIben")
SPAN_PH = frozenset("XBb")  # what counts as "a span" for --ranks
NAMED_PH = frozenset("XBbCiIn")  # what --require / --require-each-rank look at
ALIGN_PH = frozenset("iInXBb")  # instants and span starts for --aligned
META_NAMES = {
    "process_name": ("name", str),
    "thread_name": ("name", str),
    "process_sort_index": ("sort_index", int),
    "thread_sort_index": ("sort_index", int),
}
OTHER_COUNTS = ("steps", "events", "dropped_events", "cap_bytes")
INSTANT_SCOPES = frozenset("tpg")
INF = float("inf")
MAX_LISTED = 50


class UsageError(Exception):
    """Bad options or an unreadable file: exit status 2."""


class Errors:
    """Counts every error, keeps the first MAX_LISTED messages."""

    def __init__(self, limit=MAX_LISTED):
        self.limit = limit
        self.count = 0
        self.messages = []

    def add(self, msg):
        self.count += 1
        if len(self.messages) < self.limit:
            self.messages.append(msg)

    def __bool__(self):
        return self.count > 0


def _num(v):
    """A finite JSON number (not a bool)."""
    t = type(v)
    return (t is int or t is float) and -INF < v < INF


def _fmt_ts(v):
    if type(v) is float:
        return "%.3f" % v
    return repr(v)


def describe(i, ev):
    """Names an event in an error: index, name, ph, pid, tid, ts."""
    if not isinstance(ev, dict):
        return "event #%d" % i
    s = "event #%d %r (ph %r, pid %r, tid %r" % (
        i, ev.get("name"), ev.get("ph"), ev.get("pid"), ev.get("tid"))
    if "ts" in ev:
        s += ", ts %s" % _fmt_ts(ev["ts"])
    if "dur" in ev:
        s += ", dur %s" % _fmt_ts(ev["dur"])
    return s + ")"


def _reject_constant(name):
    raise ValueError("%s is not valid JSON" % name)


def load(path):
    """Reads and parses the file; UsageError when that is impossible."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError("cannot read %s: %s" % (path, e.strerror or e))
    return parse(data, path), len(data)


def parse(data, label):
    """JSON text to a document; NaN and Infinity are not JSON."""
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise UsageError("%s: not readable JSON: %s" % (label, e))


class Options:
    """What to check beyond the format; mirrors the command line."""

    def __init__(self, ranks=None, require=(), require_each_rank=(),
                 require_track=(), require_track_each_rank=(), aligned=(),
                 within_ms=None, max_bytes=None, epsilon=0.002,
                 summary=False):
        self.ranks = ranks
        self.require = [re.compile(r) for r in require]
        self.require_each_rank = [re.compile(r) for r in require_each_rank]
        self.require_track = [re.compile(r) for r in require_track]
        self.require_track_each_rank = [re.compile(r) for r in
                                        require_track_each_rank]
        self.aligned = list(aligned)
        self.within_ms = within_ms
        self.max_bytes = max_bytes
        self.epsilon = epsilon
        self.summary = summary


class Result:
    def __init__(self):
        self.errors = Errors()
        self.n_events = 0
        self.ranks = set()
        self.tracks = set()
        self.summary_lines = []


def _check_top(doc, errs):
    """The top-level object; returns (events, world) or (None, None)."""
    if not isinstance(doc, dict):
        errs.add("top level: a JSON object {\"traceEvents\": [...], ...} "
                 "is needed, found %s" % type(doc).__name__)
        return None, None
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        errs.add("top level: \"traceEvents\" is %s, a list is needed" % (
            "missing" if "traceEvents" not in doc
            else "a " + type(events).__name__))
        events = None
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        errs.add("top level: \"displayTimeUnit\" is %r, \"ms\" or \"ns\" is "
                 "needed" % (doc["displayTimeUnit"],))
    world = None
    other = doc.get("otherData")
    if not isinstance(other, dict):
        errs.add("top level: \"otherData\" is %s, an object holding "
                 "\"world\" is needed" % ("missing" if "otherData" not in doc
                                          else "a " + type(other).__name__))
    else:
        w = other.get("world")
        if type(w) is not int or w < 1:
            errs.add("otherData: \"world\" is %s, a positive integer is "
                     "needed" % ("missing" if "world" not in other
                                 else repr(w)))
        else:
            world = w
        for k in OTHER_COUNTS:
            if k in other and (type(other[k]) is not int or other[k] < 0):
                errs.add("otherData: %r is %r, a count (integer >= 0) is "
                         "needed" % (k, other[k]))
    return events, world


def check(doc, opts, file_size=None):
    """Checks a parsed trace; returns a Result (errors, counts, summary)."""
    res = Result()
    errs = res.errors
    eps = opts.epsilon

    if opts.max_bytes is not None and file_size is not None \
            and file_size > opts.max_bytes:
        errs.add("file: %d bytes, more than --max-bytes %d" % (
            file_size, opts.max_bytes))

    events, world = _check_top(doc, errs)
    if events is None:
        return res
    res.n_events = len(events)
    if world is not None and opts.ranks is not None and world != opts.ranks:
        errs.add("otherData: \"world\" is %d, --ranks says %d" % (
            world, opts.ranks))

    want_names = bool(opts.require or opts.require_each_rank)
    align = {n: {} for n in opts.aligned}  # name -> pid -> (ts, index)

    spans = {}       # (pid, tid) -> [(start, -end, index)]  X and B/E spans
    be = {}          # (pid, tid) -> [(ts, index, is_begin)]
    asyncs = {}      # (pid, cat, id, name) -> [(ts, 0 for b / 1 for e, index)]
    proc_name = {}   # pid -> (name, index)
    thread_name = {}  # (pid, tid) -> (name, index)
    pids = set()     # pids with any event
    tracks = set()   # (pid, tid) with non-metadata events
    span_pids = set()
    names = {}       # pid -> set of names (NAMED_PH), only when wanted

    add_err = errs.add
    known_ph = KNOWN_PH
    for i, ev in enumerate(events):
        if type(ev) is not dict:
            add_err("event #%d: an object is needed, found %s" % (
                i, type(ev).__name__))
            continue
        ph = ev.get("ph")
        pid = ev.get("pid")
        tid = ev.get("tid")
        name = ev.get("name")
        bad = None
        ph_ok = type(ph) is str and ph in known_ph
        if not ph_ok:
            bad = ["\"ph\" missing" if "ph" not in ev
                   else "unknown \"ph\" %r" % (ph,)]
        if type(pid) is not int:
            bad = (bad or []) + ["\"pid\" %s" % (
                "missing" if "pid" not in ev else "not an integer")]
        if type(tid) is not int:
            bad = (bad or []) + ["\"tid\" %s" % (
                "missing" if "tid" not in ev else "not an integer")]
        if type(name) is not str or not name:
            if not (ph == "E" and name is None and "name" not in ev):
                bad = (bad or []) + ["\"name\" %s" % (
                    "missing" if "name" not in ev else
                    "empty" if name == "" else "not a string")]
        if not ph_ok:
            add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
            continue

        ts = ev.get("ts")
        if ph == "M":
            if "ts" in ev and not (_num(ts) and ts >= 0):
                bad = (bad or []) + ["\"ts\" not a number >= 0"]
        elif not ((type(ts) is int or type(ts) is float) and 0 <= ts < INF):
            bad = (bad or []) + ["\"ts\" %s" % (
                "missing" if "ts" not in ev else
                "not a finite number" if not _num(ts) else "negative")]
        if "args" in ev and type(ev["args"]) is not dict:
            bad = (bad or []) + ["\"args\" not an object"]
        if "cat" in ev and type(ev["cat"]) is not str:
            bad = (bad or []) + ["\"cat\" not a string"]

        if ph == "X":
            dur = ev.get("dur")
            if not ((type(dur) is int or type(dur) is float)
                    and 0 <= dur < INF):
                bad = (bad or []) + ["\"dur\" %s" % (
                    "missing" if "dur" not in ev else
                    "not a finite number" if not _num(dur) else "negative")]
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
            key = (pid, tid)
            lst = spans.get(key)
            if lst is None:
                lst = spans[key] = []
            lst.append((ts, -(ts + dur), i))
        elif ph == "M":
            spec = META_NAMES.get(name)
            args = ev.get("args")
            if spec is None:
                if not bad:
                    bad = ["unknown metadata name %r (one of %s)" % (
                        name, ", ".join(sorted(META_NAMES)))]
            elif type(args) is not dict or spec[0] not in args \
                    or type(args[spec[0]]) is not spec[1]:
                bad = (bad or []) + ["%s needs \"args\" {%r: %s}" % (
                    name, spec[0], spec[1].__name__)]
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
            pids.add(pid)
            if name == "process_name" or name == "thread_name":
                label = args["name"]
                if name == "process_name":
                    table, key, what = proc_name, pid, "pid %d" % pid
                else:
                    table, key, what = thread_name, (pid, tid), \
                        "pid %d tid %d" % (pid, tid)
                old = table.get(key)
                if old is None:
                    table[key] = (label, i)
                elif old[0] != label:
                    add_err("%s: %s for %s is %r, event #%d named it %r" % (
                        describe(i, ev), name, what, label, old[1], old[0]))
            continue
        elif ph == "B" or ph == "E":
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
            key = (pid, tid)
            lst = be.get(key)
            if lst is None:
                lst = be[key] = []
            lst.append((ts, i, ph == "B"))
        elif ph == "C":
            args = ev.get("args")
            if type(args) is not dict or not args:
                bad = (bad or []) + ["a counter needs \"args\" with at least "
                                     "one number"]
            else:
                nonnum = [k for k, v in args.items() if not _num(v)]
                if nonnum:
                    bad = (bad or []) + ["counter value%s %s not a finite "
                                         "number" % (
                                             "s" if len(nonnum) > 1 else "",
                                             ", ".join(repr(k)
                                                       for k in nonnum))]
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
        elif ph == "i" or ph == "I":
            if "s" in ev and ev["s"] not in INSTANT_SCOPES:
                bad = (bad or []) + ["\"s\" is %r, one of t, p, g is "
                                     "needed" % (ev["s"],)]
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
        else:  # b, e, n
            aid = ev.get("id")
            if not (type(aid) is str or type(aid) is int):
                bad = (bad or []) + ["\"id\" %s" % (
                    "missing" if "id" not in ev else
                    "not a string or integer")]
            cat = ev.get("cat")
            if "cat" not in ev:  # a "cat" of the wrong type is flagged above
                bad = (bad or []) + ["\"cat\" missing"]
            if bad:
                add_err("%s: %s" % (describe(i, ev), "; ".join(bad)))
                continue
            if ph != "n":
                key = (pid, cat, aid, name)
                lst = asyncs.get(key)
                if lst is None:
                    lst = asyncs[key] = []
                lst.append((ts, 0 if ph == "b" else 1, i))

        pids.add(pid)
        tracks.add((pid, tid))
        if ph in SPAN_PH:
            span_pids.add(pid)
        if want_names and ph in NAMED_PH:
            s = names.get(pid)
            if s is None:
                s = names[pid] = set()
            s.add(name)
        if align and name in align and ph in ALIGN_PH:
            per = align[name]
            old = per.get(pid)
            if old is None or ts >= old[0]:
                per[pid] = (ts, i)

    # B/E: match per track in time order (ties in file order), make spans.
    for key, lst in be.items():
        lst.sort()
        stack = []
        for ts, i, is_begin in lst:
            if is_begin:
                stack.append((ts, i))
                continue
            if not stack:
                add_err("%s: \"E\" with no open \"B\" on pid %d tid %d" % (
                    describe(i, events[i]), key[0], key[1]))
                continue
            bts, bi = stack.pop()
            ename = events[i].get("name")
            bname = events[bi]["name"]
            if ename is not None and ename != bname:
                add_err("%s: \"E\" named %r closes %s" % (
                    describe(i, events[i]), ename, describe(bi, events[bi])))
            lst2 = spans.get(key)
            if lst2 is None:
                lst2 = spans[key] = []
            lst2.append((bts, -ts, bi))
        for bts, bi in stack:
            add_err("%s: \"B\" never closed by an \"E\" on pid %d tid %d" % (
                describe(bi, events[bi]), key[0], key[1]))

    # b/e: every b closed by a later-or-equal e with the same key.
    for key, lst in asyncs.items():
        lst.sort()
        open_b = []
        for ts, kind, i in lst:
            if kind == 0:
                open_b.append(i)
            elif open_b:
                open_b.pop()
            else:
                add_err("%s: async \"e\" with no earlier open \"b\" of the "
                        "same pid, cat %r, id %r, name %r" % (
                            describe(i, events[i]), key[1], key[2], key[3]))
        for i in open_b:
            add_err("%s: async \"b\" never closed by an \"e\" of the same "
                    "pid, cat %r, id %r, name %r" % (
                        describe(i, events[i]), key[1], key[2], key[3]))

    # Nesting: per track, sorted by (start, -end); a stack of open ends.
    for key, lst in spans.items():
        lst.sort()
        stack = []  # [(end, index)]
        for start, nend, i in lst:
            end = -nend
            lim = start + eps
            while stack and stack[-1][0] <= lim:
                stack.pop()
            if stack and end > stack[-1][0] + eps:
                pend, pi = stack[-1]
                add_err("%s partially overlaps %s on pid %d tid %d: "
                        "[%s, %s) against [%s, %s)" % (
                            describe(i, events[i]), describe(pi, events[pi]),
                            key[0], key[1], _fmt_ts(start), _fmt_ts(end),
                            _fmt_ts(events[pi].get("ts")), _fmt_ts(pend)))
                continue  # leave the parent in place, skip the culprit
            stack.append((end, i))

    # Names for processes and tracks.
    for pid in sorted(pids):
        if pid not in proc_name:
            add_err("pid %d has events but no process_name metadata" % pid)
    for key in sorted(tracks):
        if key not in thread_name:
            add_err("pid %d tid %d has events but no thread_name metadata" %
                    key)

    # Ranks.
    if world is not None:
        for pid in sorted(pids):
            if not 0 <= pid < world:
                add_err("pid %d is not a rank: otherData \"world\" is %d" % (
                    pid, world))
    ranks_list = None
    if opts.ranks is not None:
        ranks_list = list(range(opts.ranks))
        for r in ranks_list:
            if r not in proc_name:
                add_err("--ranks %d: rank %d has no process_name" % (
                    opts.ranks, r))
            if r not in span_pids:
                add_err("--ranks %d: rank %d has no span (X, B or b)" % (
                    opts.ranks, r))
        for pid in sorted(pids):
            if not 0 <= pid < opts.ranks:
                add_err("--ranks %d: pid %d is not one of 0..%d" % (
                    opts.ranks, pid, opts.ranks - 1))
    elif world is not None:
        ranks_list = list(range(world))
    else:
        ranks_list = sorted(pids)

    # --require / --require-each-rank.
    if want_names:
        all_names = set()
        for s in names.values():
            all_names |= s
        for rx in opts.require:
            if not any(rx.search(n) for n in all_names):
                add_err("--require %r: no event (X, B, b, C, i, I, n) has a "
                        "matching name" % rx.pattern)
        for rx in opts.require_each_rank:
            missing = [r for r in ranks_list
                       if not any(rx.search(n) for n in names.get(r, ()))]
            if missing:
                add_err("--require-each-rank %r: no matching event on "
                        "rank%s %s" % (rx.pattern,
                                       "s" if len(missing) > 1 else "",
                                       _ranks_str(missing)))

    # --require-track / --require-track-each-rank.
    for rx in opts.require_track:
        if not any(rx.search(v[0]) for v in thread_name.values()):
            add_err("--require-track %r: no thread_name matches" % rx.pattern)
    for rx in opts.require_track_each_rank:
        missing = [r for r in ranks_list
                   if not any(rx.search(v[0]) for k, v in thread_name.items()
                              if k[0] == r)]
        if missing:
            add_err("--require-track-each-rank %r: no matching thread_name "
                    "on rank%s %s" % (rx.pattern,
                                      "s" if len(missing) > 1 else "",
                                      _ranks_str(missing)))

    # --aligned: the last NAME on each rank, all within --within-ms.
    for nm, per in align.items():
        missing = [r for r in ranks_list if r not in per]
        if missing:
            add_err("--aligned %r: no instant or span start of that name on "
                    "rank%s %s" % (nm, "s" if len(missing) > 1 else "",
                                   _ranks_str(missing)))
        got = [(per[r][0], r) for r in ranks_list if r in per]
        if len(got) >= 2:
            lo, hi = min(got), max(got)
            spread = hi[0] - lo[0]
            if spread > opts.within_ms * 1000.0 + eps:
                add_err("--aligned %r: the ranks' last %r lie %.3f ms apart, "
                        "more than --within-ms %g (rank %d at %s us, rank %d "
                        "at %s us): were the clocks aligned at the merge?" % (
                            nm, nm, spread / 1000.0, opts.within_ms, lo[1],
                            _fmt_ts(lo[0]), hi[1], _fmt_ts(hi[0])))

    res.ranks = pids
    res.tracks = tracks
    if opts.summary:
        res.summary_lines = _summary(events, spans, doc)
    return res


def _ranks_str(rs):
    if len(rs) > 16:
        return "%s and %d more" % (", ".join(map(str, rs[:16])), len(rs) - 16)
    return ", ".join(map(str, rs))


def _summary(events, spans, doc):
    """Per rank: events by ph, tracks, time covered, top 10 span names."""
    by_ph = {}     # pid -> {ph: count}
    tracks = {}    # pid -> set(tid)
    t_lo = {}
    t_hi = {}
    for ev in events:
        if type(ev) is not dict:
            continue
        pid = ev.get("pid")
        ph = ev.get("ph")
        if type(pid) is not int or type(ph) is not str:
            continue
        d = by_ph.get(pid)
        if d is None:
            d = by_ph[pid] = {}
            tracks[pid] = set()
        d[ph] = d.get(ph, 0) + 1
        if ph == "M":
            continue
        if type(ev.get("tid")) is int:
            tracks[pid].add(ev["tid"])
        ts = ev.get("ts")
        if not _num(ts):
            continue
        end = ts
        dur = ev.get("dur")
        if ph == "X" and _num(dur) and dur > 0:
            end = ts + dur
        if pid not in t_lo or ts < t_lo[pid]:
            t_lo[pid] = ts
        if pid not in t_hi or end > t_hi[pid]:
            t_hi[pid] = end
    totals = {}  # pid -> {name: [total us, count]}
    for (pid, _tid), lst in spans.items():
        d = totals.setdefault(pid, {})
        for start, nend, i in lst:
            nm = events[i]["name"]
            t = d.get(nm)
            if t is None:
                t = d[nm] = [0.0, 0]
            t[0] += -nend - start
            t[1] += 1
    lines = []
    other = doc.get("otherData") if isinstance(doc, dict) else None
    if isinstance(other, dict):
        lines.append("otherData: " + ", ".join(
            "%s %r" % (k, other[k]) for k in ("world",) + OTHER_COUNTS
            if k in other))
        if type(other.get("dropped_events")) is int \
                and other["dropped_events"] > 0:
            lines.append("note: %d events were dropped (the buffer cap)" %
                         other["dropped_events"])
        if type(other.get("events")) is int \
                and other["events"] != len(events):
            lines.append("note: otherData \"events\" is %d, the file holds "
                         "%d" % (other["events"], len(events)))
    order = "MXBECiIben"
    for pid in sorted(by_ph):
        d = by_ph[pid]
        counts = ", ".join("%s %d" % (ph, d[ph]) for ph in
                           sorted(d, key=lambda p: (order.find(p), p)))
        line = "rank %d: %d events (%s), %d tracks" % (
            pid, sum(d.values()), counts, len(tracks[pid]))
        if pid in t_lo:
            line += ", %.3f .. %.3f ms (%.3f ms)" % (
                t_lo[pid] / 1000.0, t_hi[pid] / 1000.0,
                (t_hi[pid] - t_lo[pid]) / 1000.0)
        lines.append(line)
        top = sorted(totals.get(pid, {}).items(),
                     key=lambda kv: (-kv[1][0], kv[0]))[:10]
        if top:
            lines.append("  top spans by total duration:")
            for nm, (tot, cnt) in top:
                lines.append("    %12.3f ms %8dx  %s" % (
                    tot / 1000.0, cnt, nm))
    return lines


# ---------------------------------------------------------------- self-test

def _meta(pid, tid=None, name=None):
    if tid is None:
        return {"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                "args": {"name": name or "rank %d" % pid}}
    return {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
            "args": {"name": name or "thread %d" % tid}}


def _good_trace(world=2):
    evs = []
    for r in range(world):
        evs += [_meta(r), _meta(r, 1, "main"), _meta(r, 2, "comm"),
                {"ph": "M", "pid": r, "tid": 0, "name": "process_sort_index",
                 "args": {"sort_index": r}},
                {"ph": "X", "pid": r, "tid": 1, "name": "step", "ts": 0,
                 "dur": 100.0, "cat": "train", "args": {"step": 0}},
                {"ph": "X", "pid": r, "tid": 1, "name": "forward", "ts": 0,
                 "dur": 40},
                {"ph": "X", "pid": r, "tid": 1, "name": "backward", "ts": 40,
                 "dur": 60.001},  # ends 0.001 us after "step": rounding
                {"ph": "B", "pid": r, "tid": 1, "name": "optimizer",
                 "ts": 100},
                {"ph": "E", "pid": r, "tid": 1, "ts": 120.5},
                {"ph": "X", "pid": r, "tid": 2, "name": "allreduce", "ts": 50,
                 "dur": 70},  # overlaps "backward", on another track
                {"ph": "C", "pid": r, "tid": 1, "name": "memory", "ts": 10,
                 "args": {"bytes": 1024, "frac": 0.5}},
                {"ph": "b", "pid": r, "tid": 2, "name": "bucket",
                 "cat": "comm", "id": 7, "ts": 45},
                {"ph": "n", "pid": r, "tid": 2, "name": "bucket",
                 "cat": "comm", "id": 7, "ts": 46},
                {"ph": "e", "pid": r, "tid": 2, "name": "bucket",
                 "cat": "comm", "id": 7, "ts": 110},
                {"ph": "i", "pid": r, "tid": 1, "name": "done", "s": "t",
                 "ts": 130 + r * 0.5}]
    return {"traceEvents": evs, "displayTimeUnit": "ms",
            "otherData": {"world": world, "steps": 1, "events": len(evs),
                          "dropped_events": 0, "cap_bytes": 1 << 20}}


def _edit(fn, world=2):
    doc = _good_trace(world)
    fn(doc["traceEvents"])
    return doc


def _find(evs, name, pid=0):
    for ev in evs:
        if ev.get("name") == name and ev.get("pid") == pid:
            return ev
    raise KeyError(name)


def _self_test():
    good_opts = dict(ranks=2, require=["^step$"],
                     require_each_rank=["allreduce"],
                     require_track_each_rank=["^comm$"], aligned=["done"],
                     within_ms=1.0)

    def partial_overlap(evs):
        evs += [{"ph": "X", "pid": 0, "tid": 3, "name": "A", "ts": 0,
                 "dur": 10},
                {"ph": "X", "pid": 0, "tid": 3, "name": "B", "ts": 5,
                 "dur": 10}, _meta(0, 3)]

    def overlap_other_tracks(evs):
        evs += [{"ph": "X", "pid": 0, "tid": 3, "name": "A", "ts": 0,
                 "dur": 10},
                {"ph": "X", "pid": 0, "tid": 4, "name": "B", "ts": 5,
                 "dur": 10}, _meta(0, 3), _meta(0, 4)]

    def be_overlap(evs):  # a B/E span crossing an X span on its track
        evs += [{"ph": "X", "pid": 1, "tid": 3, "name": "A", "ts": 0,
                 "dur": 10},
                {"ph": "B", "pid": 1, "tid": 3, "name": "late", "ts": 5},
                {"ph": "E", "pid": 1, "tid": 3, "name": "late", "ts": 15},
                _meta(1, 3)]

    def unbalanced_e(evs):
        evs.append({"ph": "E", "pid": 1, "tid": 1, "ts": 200})

    def unclosed_b(evs):
        evs.append({"ph": "B", "pid": 1, "tid": 1, "name": "open", "ts": 200})

    def e_wrong_name(evs):
        evs += [{"ph": "B", "pid": 1, "tid": 1, "name": "x", "ts": 200},
                {"ph": "E", "pid": 1, "tid": 1, "name": "y", "ts": 201}]

    def negative_dur(evs):
        _find(evs, "forward")["dur"] = -1

    def missing_ts(evs):
        del _find(evs, "forward", 1)["ts"]

    def string_ts(evs):
        _find(evs, "forward", 1)["ts"] = "12"

    def bool_pid(evs):
        _find(evs, "forward", 1)["pid"] = True

    def empty_name(evs):
        _find(evs, "forward", 1)["name"] = ""

    def unknown_ph(evs):
        evs.append({"ph": "Q", "pid": 0, "tid": 1, "name": "q", "ts": 1})

    def missing_thread_name(evs):
        evs.append({"ph": "X", "pid": 0, "tid": 9, "name": "stray", "ts": 1,
                    "dur": 1})

    def missing_process_name(evs):
        evs[:] = [ev for ev in evs if not (ev.get("name") == "process_name"
                                           and ev["pid"] == 1)]

    def async_unclosed(evs):
        evs.append({"ph": "b", "pid": 0, "tid": 2, "name": "bucket",
                    "cat": "comm", "id": 8, "ts": 50})

    def async_end_before_begin(evs):
        e = [ev for ev in evs if ev["ph"] == "e" and ev["pid"] == 0][0]
        e["ts"] = 40

    def counter_non_numeric(evs):
        _find(evs, "memory")["args"]["bytes"] = "1024"

    def counter_empty(evs):
        _find(evs, "memory")["args"] = {}

    def bad_scope(evs):
        _find(evs, "done")["s"] = "x"

    def pid_beyond_world(evs):
        evs += [_meta(2), _meta(2, 1),
                {"ph": "X", "pid": 2, "tid": 1, "name": "step", "ts": 0,
                 "dur": 1}]

    def misaligned(evs):
        _find(evs, "done", 1)["ts"] = 130 + 1500.0

    cases = [
        # (label, document or bytes, options, expected error substring or None)
        ("good trace passes", _good_trace(), good_opts, None),
        ("good 1-rank trace passes", _good_trace(1),
         dict(ranks=1, aligned=["done"], within_ms=0.0), None),
        ("overlap on different tracks is fine", _edit(overlap_other_tracks),
         good_opts, None),
        ("partial overlap on a track", _edit(partial_overlap), {},
         "partially overlaps"),
        ("B/E span crossing an X span", _edit(be_overlap), {},
         "partially overlaps"),
        ("overlap beyond --epsilon 0.0005", _good_trace(),
         dict(epsilon=0.0005), "partially overlaps"),
        ("E without B", _edit(unbalanced_e), {}, "no open \"B\""),
        ("B without E", _edit(unclosed_b), {}, "never closed by an \"E\""),
        ("E names another B", _edit(e_wrong_name), {}, "\"E\" named 'y'"),
        ("negative dur", _edit(negative_dur), {}, "\"dur\" negative"),
        ("missing ts", _edit(missing_ts), {}, "\"ts\" missing"),
        ("ts of the wrong type", _edit(string_ts), {},
         "\"ts\" not a finite number"),
        ("pid of the wrong type", _edit(bool_pid), {},
         "\"pid\" not an integer"),
        ("empty name", _edit(empty_name), {}, "\"name\" empty"),
        ("unknown ph", _edit(unknown_ph), {}, "unknown \"ph\" 'Q'"),
        ("missing thread_name", _edit(missing_thread_name), {},
         "pid 0 tid 9 has events but no thread_name"),
        ("missing process_name", _edit(missing_process_name), {},
         "pid 1 has events but no process_name"),
        ("async b without e", _edit(async_unclosed), {},
         "async \"b\" never closed"),
        ("async e before its b", _edit(async_end_before_begin), {},
         "async \"e\" with no earlier open \"b\""),
        ("counter with a non-numeric arg", _edit(counter_non_numeric), {},
         "counter value 'bytes' not a finite number"),
        ("counter with no values", _edit(counter_empty), {},
         "at least one number"),
        ("instant scope", _edit(bad_scope), {}, "\"s\" is 'x'"),
        ("pid beyond otherData world", _edit(pid_beyond_world), {},
         "pid 2 is not a rank"),
        ("--ranks mismatch", _good_trace(), dict(ranks=3),
         "rank 2 has no process_name"),
        ("--require not found", _good_trace(), dict(require=["^no_such$"]),
         "--require '^no_such$'"),
        ("--require-each-rank missing on a rank",
         _edit(lambda evs: _find(evs, "allreduce", 1).update(name="other")),
         dict(require_each_rank=["allreduce"]), "on rank 1"),
        ("--require-track not found", _good_trace(),
         dict(require_track=["^loader$"]), "no thread_name matches"),
        ("misaligned ranks for --aligned", _edit(misaligned),
         dict(aligned=["done"], within_ms=1.0), "1.500 ms apart"),
        ("--max-bytes exceeded", _good_trace(), dict(max_bytes=10),
         "more than --max-bytes"),
        ("X without dur", _edit(lambda evs: _find(evs, "forward").pop("dur")),
         {}, "\"dur\" missing"),
        ("async without cat",
         _edit(lambda evs: evs[-2].pop("cat")), {}, "\"cat\" missing"),
        ("thread_name args not a string",
         _edit(lambda evs: evs[1].update(args={"name": 3})), {},
         "thread_name needs \"args\" {'name': str}"),
        ("two process_names for a pid",
         _edit(lambda evs: evs.append(_meta(0, None, "other"))), {},
         "process_name for pid 0 is 'other'"),
        ("event not an object", _edit(lambda evs: evs.append([1])), {},
         "an object is needed"),
        ("no traceEvents list", {"otherData": {"world": 1}}, {},
         "\"traceEvents\" is missing"),
        ("no otherData world", {"traceEvents": []}, {}, "\"otherData\""),
        ("NaN is not JSON", b'{"traceEvents": [], "otherData": {"world": 1},'
         b' "x": NaN}', {}, "usage"),
    ]
    failed = 0
    t0 = time.perf_counter()
    for label, doc, kw, want in cases:
        got = []
        try:
            if isinstance(doc, bytes):
                doc = parse(doc, "<self-test>")
            raw = json.dumps(doc).encode()
            # Round-trip through JSON so the checker sees what a file holds.
            res = check(json.loads(raw), Options(**kw), len(raw))
            got = res.errors.messages
            hits = [m for m in got if want is not None and want in m]
            ok = (not got) if want is None else bool(hits)
            detail = hits[0] if hits else got[0] if got else "clean"
        except UsageError as e:
            ok = want == "usage"
            detail = "usage error: %s" % e
        failed += not ok
        print("%s  %-40s %s" % ("pass" if ok else "FAIL", label,
                                detail if not ok or want else ""))
        if not ok:
            print("      expected: %s" % (want or "no errors"))
            for m in got:
                print("      got: %s" % m)
    dt = time.perf_counter() - t0
    print("self-test: %d of %d cases behave (%.0f ms)" % (
        len(cases) - failed, len(cases), dt * 1000))
    return 0 if failed == 0 else 1


# --------------------------------------------------------------------- main

def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="check_trace.py",
        description="Checks a Chrome trace-event JSON file written by "
                    "`ringtrain train --trace`: event fields and types, "
                    "B/E and b/e pairing, span nesting per track, process "
                    "and thread names, and what the options ask for. Exit "
                    "status 0 clean, 1 errors found, 2 usage error or "
                    "unreadable JSON.")
    p.add_argument("trace", nargs="?", metavar="TRACE.json")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="pids 0..N-1 each have a process_name and a span; "
                        "no other pid appears")
    p.add_argument("--require", action="append", default=[], metavar="REGEX",
                   help="an X, B, b, C, i, I or n event whose name matches "
                        "(re.search) exists (repeatable)")
    p.add_argument("--require-each-rank", action="append", default=[],
                   metavar="REGEX", help="as --require, on every rank")
    p.add_argument("--require-track", action="append", default=[],
                   metavar="REGEX",
                   help="a thread_name matching REGEX exists (repeatable)")
    p.add_argument("--require-track-each-rank", action="append", default=[],
                   metavar="REGEX", help="as --require-track, on every rank")
    p.add_argument("--aligned", action="append", default=[], metavar="NAME",
                   help="the last instant or span start named NAME on each "
                        "rank: all within --within-ms of each other "
                        "(repeatable)")
    p.add_argument("--within-ms", type=float, metavar="T",
                   help="the tolerance for --aligned, in milliseconds")
    p.add_argument("--max-bytes", type=int, metavar="N",
                   help="the file is at most N bytes")
    p.add_argument("--epsilon", type=float, default=0.002, metavar="US",
                   help="slack in microseconds for span nesting "
                        "(default 0.002)")
    p.add_argument("--summary", action="store_true",
                   help="print per rank: events by ph, tracks, time covered, "
                        "top 10 span names by total duration")
    p.add_argument("--self-test", action="store_true",
                   help="run the checker's own tests on synthetic traces")
    a = p.parse_args(argv)
    if a.self_test:
        return a
    if a.trace is None:
        p.error("a TRACE.json is needed (or --self-test)")
    if a.aligned and a.within_ms is None:
        p.error("--aligned needs --within-ms")
    if a.within_ms is not None and not a.aligned:
        p.error("--within-ms goes with --aligned")
    if a.within_ms is not None and not (a.within_ms >= 0
                                        and math.isfinite(a.within_ms)):
        p.error("--within-ms must be a number >= 0")
    if a.ranks is not None and a.ranks < 1:
        p.error("--ranks must be >= 1")
    if a.max_bytes is not None and a.max_bytes < 0:
        p.error("--max-bytes must be >= 0")
    if not (a.epsilon >= 0 and math.isfinite(a.epsilon)):
        p.error("--epsilon must be a number >= 0")
    return a


def main(argv=None):
    a = _parse_args(sys.argv[1:] if argv is None else argv)
    if a.self_test:
        return _self_test()
    try:
        opts = Options(ranks=a.ranks, require=a.require,
                       require_each_rank=a.require_each_rank,
                       require_track=a.require_track,
                       require_track_each_rank=a.require_track_each_rank,
                       aligned=a.aligned, within_ms=a.within_ms,
                       max_bytes=a.max_bytes, epsilon=a.epsilon,
                       summary=a.summary)
    except re.error as e:
        print("check_trace.py: bad regular expression %r: %s" % (
            e.pattern, e), file=sys.stderr)
        return 2
    try:
        doc, size = load(a.trace)
    except UsageError as e:
        print("check_trace.py: %s" % e, file=sys.stderr)
        return 2
    res = check(doc, opts, size)
    for line in res.summary_lines:
        print(line)
    errs = res.errors
    if errs:
        for m in errs.messages:
            print("error: %s" % m)
        if errs.count > len(errs.messages):
            print("... and %d more errors" % (errs.count - len(errs.messages)))
        print("trace BROKEN: %d error%s in %s" % (
            errs.count, "" if errs.count == 1 else "s", a.trace))
        return 1
    print("trace OK: %d events, %d ranks, %d tracks" % (
        res.n_events, len(res.ranks), len(res.tracks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
