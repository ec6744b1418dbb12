#!/usr/bin/env bash
# test_trace_split.sh - `train --trace FILE --trace-split rank` and `ringtrain trace merge`, end to end:
#   1. two ranks split: each writes FILE.rankNNNNN.json, a whole trace of its own (tools/check_trace.py
#      passes it) with otherData.part naming its rank and the run; rank 0 names the files and prints
#      the merge command, and that command works;
#   2. the merge is the merged path's file: its events are exactly the parts' events (line for line),
#      its otherData the parts' counts summed; it passes check_trace.py with both ranks, the buckets
#      on each and the clocks aligned on the run's last collective; the files given in any order make
#      the same bytes;
#   3. against a run of the merged path (the default at 2 ranks) with the same options: the same
#      tracks on each rank, and the same events per rank, track and name on the tracks whose events do
#      not depend on timing (the training thread, the compute stream, the comm thread; the loader's
#      threads share out batches as they come);
#   4. the merge refuses what is not one run: a rank missing (unless --partial, whose file passes
#      check_trace.py), a rank twice, another run's file, an already merged file, a cut-short file;
#      and nothing is left at -o when it refuses;
#   5. one rank split, FILE without an extension: FILE.rank00000, merged, checked.
# Usage: test_trace_split.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_trace_split.sh path/to/ringtrain}
[ -x "$RT" ] || { echo "not an executable: $RT"; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT")
HERE=$(cd "$(dirname "$0")" && pwd)
CHECK="$HERE/../tools/check_trace.py"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: python3 not found (the trace checker is Python)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE RINGTRAIN_TEST_STALL

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$HERE/train_lib.sh"
show() { sed 's/^/     | /' "$@" | tail -n 15; }
mpi() {
    local np=$1
    shift
    timeout -k 10 120 mpirun -np "$np" --bind-to none --oversubscribe "$@"
}
if ! mpirun -np 2 --bind-to none --oversubscribe true >/dev/null 2>&1; then
    echo "skip: mpirun cannot start 2 processes here"
    exit 77
fi

"$RT" synth --out "$W/src" --train 1024 --test 128 --seed 5 --threads 1 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src" --out "$W/cifar" >/dev/null || { echo "pack failed"; exit 1; }
COMMON=(--data "$W/cifar" --batch-size 32 --threads 1 --workers 2 --no-progress --seed 1 --steps 8 --trace-steps 2:6)
EACH=(--require-each-rank '^bucket ready->reduced' --require-each-rank '^bucket all-reduce'
      --require-each-rank '^fwd conv1$' --require-each-rank '^step 2$' --require-track-each-rank '^training$'
      --aligned 'run end' --within-ms 1)

# ---- 1. two ranks, one file each --------------------------------------------------------------
P0="$W/s.rank00000.json" P1="$W/s.rank00001.json"
if ! mpi 2 "$RT" train "${COMMON[@]}" --trace "$W/s.json" --trace-split rank --json >"$W/run_s" 2>&1; then
    fail "train --trace-split rank at 2 ranks"
    show "$W/run_s"
    echo "$fails failed"
    exit 1
fi
[ -f "$P0" ] && [ -f "$P1" ] && [ ! -e "$W/s.json" ] && pass "2 ranks, --trace-split rank: s.rank00000.json and s.rank00001.json" ||
    { fail "the per-rank files: $(ls "$W")"; show "$W/run_s"; }
grep -q "^trace: 2 files, one per rank: $P0 to $P1 (.* events from 2 ranks, optimizer steps 2:6)" "$W/run_s" &&
    grep -q "^trace: to merge them into one file: ringtrain trace merge -o $W/s.json $W/s.rank\*.json$" "$W/run_s" &&
    pass "rank 0 names the files and the merge command" || { fail "rank 0's trace lines"; show "$W/run_s"; }
# --json's summary names the files as the merge command does, with their count and bytes
sz=$(($(stat -c %s "$P0") + $(stat -c %s "$P1")))
"$PY" - "$W/run_s" "$W/s.rank*.json" "$sz" <<'PYEOF' && pass "--json: trace.file is the files' pattern, 2 files, $sz bytes" ||
import json, sys
t = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["trace"]
want = {"file": sys.argv[2], "files": 2, "split": True, "bytes": int(sys.argv[3])}
sys.exit(0 if t == want else print("trace:", t, "want", want) or 1)
PYEOF
    { fail "--json trace of a split run"; show "$W/run_s"; }
for r in 0 1; do
    f="$W/s.rank0000$r.json"
    if "$PY" "$CHECK" "$f" >"$W/chk_p$r" 2>&1 &&
        "$PY" - "$f" "$r" >"$W/part_p$r" 2>&1 <<'PYEOF'; then
import json, sys
d = json.load(open(sys.argv[1])); r = int(sys.argv[2]); od = d["otherData"]; part = od["part"]
pids = {e["pid"] for e in d["traceEvents"]}
assert od["world"] == 2 and part["ranks"] == [r] and pids == {r}, (od, pids)
assert od["events"] == sum(1 for e in d["traceEvents"] if e["ph"] != "M") - sum(1 for e in d["traceEvents"] if e["ph"] == "e"), od
assert (r == 0) == (part["shift_ns"] == 0) and part["run"] and part["base_ns"] > 0, part
PYEOF
        pass "rank $r's file: a valid trace of rank $r alone, its part, run and clock offset stated"
    else
        fail "rank $r's file"
        show "$W/chk_p$r" "$W/part_p$r"
    fi
done
# The command rank 0 printed, as printed.
merge_cmd=$(sed -n 's/^trace: to merge them into one file: ringtrain //p' "$W/run_s")
if (cd "$W" && eval "\"$RT\" $merge_cmd") >"$W/merge" 2>&1; then
    grep -q "^trace: $W/s.json (.* events from 2 of 2 ranks, 2 files, optimizer steps 2:6)$" "$W/merge" &&
        pass "the printed merge command joins them ($(cat "$W/merge"))" || { fail "trace merge's line"; show "$W/merge"; }
else
    fail "the printed merge command: $merge_cmd"
    show "$W/merge"
fi

# ---- 2. the merge is the merged path's file ------------------------------------------------------
if "$PY" "$CHECK" "$W/s.json" --ranks 2 "${EACH[@]}" >"$W/chk_s" 2>&1; then
    pass "the merged file: both ranks, the buckets on each, clocks aligned ($(tail -n 1 "$W/chk_s"))"
else
    fail "the merged file"
    show "$W/chk_s"
fi
if "$PY" - "$W/s.json" "$P0" "$P1" >"$W/same" 2>&1 <<'PYEOF'; then
import json, sys
HEAD = '{"traceEvents":[\n'
def events(p):  # the event lines of a file the way the writer lays it out
    t = open(p).read()
    assert t.startswith(HEAD), p
    return t[len(HEAD):t.rindex("\n],\n")].split(",\n")
merged, parts = events(sys.argv[1]), [events(p) for p in sys.argv[2:]]
assert merged == parts[0] + parts[1], "the merged events are not rank 0's then rank 1's, line for line"
od, pods = json.load(open(sys.argv[1]))["otherData"], [json.load(open(p))["otherData"] for p in sys.argv[2:]]
assert "part" not in od and od["world"] == 2 and od["step_window"] == "2:6", od
for k in ("events", "dropped_events", "event_bytes"):
    assert od[k] == sum(p[k] for p in pods), (k, od, pods)
assert od["cap_bytes"] == pods[0]["cap_bytes"], od
print(len(merged), "lines")
PYEOF
    pass "its events are the parts' events in rank order, line for line, its counts their sums ($(cat "$W/same"))"
else
    fail "the merged file against its parts"
    show "$W/same"
fi
if "$RT" trace merge -o "$W/s_rev.json" "$P1" "$P0" >"$W/merge_rev" 2>&1 && cmp -s "$W/s.json" "$W/s_rev.json"; then
    pass "the files given in another order make the same bytes"
else
    fail "merge in reverse order"
    show "$W/merge_rev"
fi

# ---- 3. against the merged path --------------------------------------------------------------
if mpi 2 "$RT" train "${COMMON[@]}" --trace "$W/m.json" >"$W/run_m" 2>&1 && [ -f "$W/m.json" ] &&
    ! ls "$W"/m.rank* >/dev/null 2>&1; then
    pass "2 ranks, --trace-split auto (the default): one file, m.json"
    if "$PY" - "$W/m.json" "$W/s.json" >"$W/counts" 2>&1 <<'PYEOF'; then
import collections, json, sys
STEADY = {"training", "compute stream", "all-reduce (comm thread)"}
def load(p):
    ev = json.load(open(p))["traceEvents"]
    track = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks = collections.defaultdict(set)
    counts = collections.Counter()
    for e in ev:
        if e["ph"] == "M":
            continue
        t = track[(e["pid"], e["tid"])]
        tracks[e["pid"]].add(t)
        if t in STEADY:
            counts[(e["pid"], t, e["name"])] += 1
    return tracks, counts
(tm, cm), (ts, cs) = load(sys.argv[1]), load(sys.argv[2])
assert tm == ts, ("tracks", dict(tm), dict(ts))
assert set(tm) == {0, 1} and all(STEADY <= t for t in tm.values()), dict(tm)
diff = {k: (cm[k], cs[k]) for k in set(cm) | set(cs) if cm[k] != cs[k]}
assert not diff, sorted(diff.items())[:10]
print(sum(cm.values()), "events on", len({k[:2] for k in cm}), "steady tracks")
PYEOF
        pass "the same tracks per rank as the merged path, the same events per rank, track and name ($(cat "$W/counts"))"
    else
        fail "the split run against the merged run"
        show "$W/counts"
    fi
else
    fail "train --trace at 2 ranks (merged)"
    show "$W/run_m"
fi

# ---- 4. what the merge refuses -----------------------------------------------------------------
refuses() { # refuses WHAT PATTERN MERGE-ARGS...: exit 1, PATTERN in the message, no output file
    local what=$1 pat=$2
    shift 2
    rm -f "$W/bad.json"
    "$RT" trace merge -o "$W/bad.json" "$@" >"$W/bad" 2>&1
    local rc=$?
    if [ $rc = 1 ] && grep -q -- "$pat" "$W/bad" && [ ! -e "$W/bad.json" ] && ! ls "$W"/bad.json.tmp* >/dev/null 2>&1; then
        pass "refused: $what ($(head -n 1 "$W/bad" | cut -c1-150))"
    else
        fail "$what: exit $rc"
        show "$W/bad"
    fi
}
refuses "a rank missing" "no file was given for rank 1" "$P0"
refuses "a rank twice" "rank 0 is in both" "$P0" "$P0" "$P1"
refuses "an already merged file" "one trace for the whole run already" "$W/s.json"
cp "$P1" "$W/other.rank00001.json"
sed -i 's/"run":"[0-9a-f]*-/"run":"1-/' "$W/other.rank00001.json"
refuses "another run's file" "are from different runs" "$P0" "$W/other.rank00001.json"
head -c 2000 "$P1" >"$W/cut.rank00001.json"
refuses "a cut-short file" "cut short" "$P0" "$W/cut.rank00001.json"
if "$RT" trace merge --partial -o "$W/p1.json" "$P1" >"$W/partial" 2>&1 &&
    grep -q "events from 1 of 2 ranks, 1 file," "$W/partial" && "$PY" "$CHECK" "$W/p1.json" >"$W/chk_p" 2>&1; then
    pass "--partial joins the ranks given ($(cat "$W/partial"))"
else
    fail "merge --partial"
    show "$W/partial" "$W/chk_p"
fi

# ---- 5. one rank, FILE without an extension -----------------------------------------------------
if "$RT" train "${COMMON[@]}" --steps 4 --trace-steps all --trace "$W/one" --trace-split rank >"$W/run_1" 2>&1 &&
    [ -f "$W/one.rank00000" ] && "$RT" trace merge -o "$W/one.json" "$W/one.rank00000" >"$W/merge_1" 2>&1 &&
    "$PY" "$CHECK" "$W/one.json" --ranks 1 --require '^step 3$' --require-track '^training$' >"$W/chk_1" 2>&1; then
    pass "one rank: one.rank00000, merged and checked ($(tail -n 1 "$W/chk_1"))"
else
    fail "one rank split"
    show "$W/run_1" "$W/merge_1" "$W/chk_1"
fi

echo "$fails failed"
[ $fails = 0 ]
