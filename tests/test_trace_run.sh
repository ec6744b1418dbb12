#!/usr/bin/env bash
# test_trace_run.sh - `ringtrain train --trace` and the step profile, end to end:
#   1. one rank on real data, the whole run traced: the file passes tools/check_trace.py
#      (schema, names, nesting per track) and every stage of the pipeline is in it --
#      the loader's planner, I/O and workers, the ring, the copy, forward and backward
#      per layer on the compute stream, the optimizer, validation, a checkpoint,
#      the counters;
#   2. two ranks: one file, both ranks, the buckets from ready to reduced on each,
#      the clocks aligned on the run's last collective;
#   3. the window (--trace-steps) and the memory cap (--trace-mb): steps outside the
#      window are not in the file; past the cap events are dropped and counted and
#      the file is still whole;
#   4. the step profile and verdict print on every run, and name the bottleneck of
#      three staged runs: a throttled loader (input), a heavy model with the data in
#      hand (compute), a stalled all-reduce (communication), through the test faults;
#   5. `loadbench --target FILE.json` takes the model's rate from a train --json file.
# With RT_TEST_SMALL=1 (the ThreadSanitizer run of tools/test.sh) only parts 1 and 2 run:
# the recorder under every thread of the pipeline and the merge across ranks.
# Usage: test_trace_run.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_trace_run.sh path/to/ringtrain}
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
    timeout -k 10 180 mpirun -np "$np" --bind-to none --oversubscribe "$@"
}

"$PY" "$CHECK" --self-test >"$W/self" 2>&1 && pass "the trace checker's own tests" || { fail "check_trace.py --self-test"; show "$W/self"; }

"$RT" synth --out "$W/src" --train 2048 --test 256 --seed 5 --threads 1 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src" --out "$W/cifar" >/dev/null || { echo "pack failed"; exit 1; }
COMMON=(--data "$W/cifar" --batch-size 32 --threads 1 --workers 2 --no-progress --seed 1)

# ---- 1. one rank, the whole run -------------------------------------------------------------
if "$RT" train "${COMMON[@]}" --epochs 1 --trace "$W/t1.json" --trace-steps all --checkpoint-dir "$W/ck" \
    --json >"$W/run1" 2>&1; then
    STAGES=("^plan batch" "^read blocks" "^batch" "^decompress" "^decode" "^augment" "^ring wait" "^ring occupancy$"
            "^data wait$" "^h2d copy" "^forward\+backward$" "^fwd conv1$" "^bwd conv1$" "^forward$" "^backward$" "^loss$"
            "^optimizer$" "^step [0-9]+$" "^validation$" "^checkpoint$" "^images/s$" "^run end$")
    args=()
    for s in "${STAGES[@]}"; do args+=(--require "$s"); done
    if "$PY" "$CHECK" "$W/t1.json" --ranks 1 "${args[@]}" --require-track '^training$' \
        --require-track '^compute stream$' --require-track '^loader' >"$W/chk1" 2>&1; then
        pass "a 1-rank trace: valid, every stage present ($(tail -n 1 "$W/chk1"))"
    else
        fail "the 1-rank trace"
        show "$W/chk1"
    fi
    grep -q "^trace: $W/t1.json (.* events from 1 rank, optimizer steps all); event memory .* of 64 MiB per rank, 0 events dropped" "$W/run1" &&
        pass "the summary states the file, its size, the events and the memory cap" ||
        { fail "trace summary line"; show "$W/run1"; }
    [ "$(jfield "$W/run1" trace | "$PY" -c 'import ast,sys; print(ast.literal_eval(sys.stdin.read())["bytes"])')" = \
      "$(stat -c %s "$W/t1.json")" ] && pass "--json names the trace and its size" || fail "--json trace member"
else
    fail "train --trace at 1 rank"
    show "$W/run1"
fi

# ---- 2. two ranks, one file -----------------------------------------------------------------
if ! mpirun -np 2 --bind-to none --oversubscribe true >/dev/null 2>&1; then
    echo "note: mpirun cannot start 2 processes here: the 2-rank parts are skipped"
    NP2=0
else
    NP2=1
fi
if [ $NP2 = 1 ]; then
    if mpi 2 "$RT" train "${COMMON[@]}" --steps 8 --trace "$W/t2.json" --trace-steps 2:6 >"$W/run2" 2>&1; then
        if "$PY" "$CHECK" "$W/t2.json" --ranks 2 --require-each-rank '^bucket ready->reduced' \
            --require-each-rank '^bucket all-reduce' --require-each-rank '^all-reduce wait$' \
            --require-each-rank '^fwd conv1$' --require-each-rank '^batch' --require-each-rank '^step 2$' \
            --require-track-each-rank '^training$' --require-track-each-rank '^all-reduce \(comm thread\)$' \
            --aligned 'run end' --within-ms 1 >"$W/chk2" 2>&1; then
            pass "a 2-rank trace: one file, both ranks, the buckets on each, clocks aligned ($(tail -n 1 "$W/chk2"))"
        else
            fail "the 2-rank trace"
            show "$W/chk2"
        fi
        # The window: steps 2..5 only.
        steps=$("$PY" -c 'import json,sys; print(sorted({e["name"] for e in json.load(open(sys.argv[1]))["traceEvents"] if e["name"].startswith("step ") and e["pid"]==0}))' "$W/t2.json")
        [ "$steps" = "['step 2', 'step 3', 'step 4', 'step 5']" ] && pass "--trace-steps 2:6 records steps 2 to 5 only" ||
            fail "the window recorded $steps"
    else
        fail "train --trace at 2 ranks"
        show "$W/run2"
    fi
fi

if [ "${RT_TEST_SMALL:-0}" = 1 ]; then
    echo "$fails failed (RT_TEST_SMALL: parts 1 and 2 only)"
    [ $fails = 0 ]
    exit
fi

# ---- 3. the cap ----------------------------------------------------------------------------
# 1 MiB holds 4 chunks of 4096 events: a whole run of a 2-worker loader fills them.
if "$RT" train "${COMMON[@]}" --epochs 2 --trace "$W/t3.json" --trace-steps all --trace-mb 1 >"$W/run3" 2>&1; then
    dropped=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["otherData"]["dropped_events"])' "$W/t3.json")
    if [ "${dropped:-0}" -gt 0 ] && grep -q "events dropped (the cap was reached" "$W/run3" &&
        "$PY" "$CHECK" "$W/t3.json" --ranks 1 >"$W/chk3" 2>&1; then
        pass "past --trace-mb 1 events are dropped ($dropped), said so, and the file is whole"
    else
        fail "the cap: dropped=$dropped"
        show "$W/run3"
        show "$W/chk3"
    fi
else
    fail "train --trace-mb 1"
    show "$W/run3"
fi

# ---- 4. the profile and its verdict on staged bottlenecks -----------------------------------
verdict() { # verdict FILE: the --json summary's verdict.limit
    "$PY" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["verdict"]["limit"])' "$1" 2>/dev/null
}
grep -q "^step profile (rank 0" "$W/run1" && grep -q "^verdict: " "$W/run1" && grep -q "^  try: " "$W/run1" &&
    pass "the step profile and verdict print at the end of a run" || { fail "no step profile"; show "$W/run1"; }

# A throttled loader: every batch 500 ms late (several times a step of this model, even under ASan).
RINGTRAIN_TEST_SLOW_LOADER=500 "$RT" train "${COMMON[@]}" --workers 1 --steps 8 --json >"$W/slow_loader" 2>&1
v=$(verdict "$W/slow_loader")
[ "$v" = input ] && pass "a throttled loader: input-bound ($(grep '^verdict' "$W/slow_loader" | cut -c1-110))" ||
    { fail "a throttled loader gave '$v'"; show "$W/slow_loader"; }

# A heavy model with the data in hand: the batches wait for the model.
"$RT" train "${COMMON[@]}" --model resnet9 --steps 5 --json >"$W/heavy" 2>&1
v=$(verdict "$W/heavy")
[ "$v" = compute ] && pass "a heavy model: compute-bound ($(grep '^verdict' "$W/heavy" | cut -c1-110))" ||
    { fail "a heavy model gave '$v'"; show "$W/heavy"; }

# A stalled all-reduce: every bucket starts 300 ms late on both ranks.
if [ $NP2 = 1 ]; then
    mpi 2 -x RINGTRAIN_TEST_SLOW_ALLREDUCE=300 "$RT" train "${COMMON[@]}" --synthetic-data --steps 10 --json \
        >"$W/slow_comm" 2>&1
    v=$(verdict "$W/slow_comm")
    [ "$v" = communication ] &&
        pass "a stalled all-reduce: communication-bound ($(grep '^verdict' "$W/slow_comm" | cut -c1-110))" ||
        { fail "a stalled all-reduce gave '$v'"; show "$W/slow_comm"; }
fi

# ---- 5. loadbench --target from a train --json file --------------------------------------------
grep '^{' "$W/heavy" | tail -n 1 >"$W/heavy.json"
if "$RT" loadbench "$W/cifar" --batch-size 32 --workers 1 --epochs 1 --target "$W/heavy.json" >"$W/lb" 2>&1; then
    rate=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f" % d.get("steady_images_per_s", d["images_per_s"]))' "$W/heavy.json")
    grep -q "^target: $rate img/s per rank, the rate resnet9 trained at on 1 rank ($W/heavy.json)" "$W/lb" && grep -q "feed --target $rate img/s" "$W/lb" &&
        pass "loadbench --target FILE.json reads the model's rate ($rate img/s)" ||
        { fail "loadbench did not use $rate img/s from the file"; show "$W/lb"; }
else
    fail "loadbench --target FILE.json"
    show "$W/lb"
fi

echo "$fails failed"
[ $fails = 0 ]
