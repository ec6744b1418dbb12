#!/usr/bin/env bash
# trace_overhead.sh - what tracing costs: `train --trace` on and off against a
# build without the trace calls, on the whole pipeline (the loader feeding a
# model from a packed dataset, so the loader's, the ring's and the model's
# trace points all run), alternated, medians and ratios.
#   bench/trace_overhead.sh --old PATH [--new PATH] [--model M] [--runs R]
#                           [--steps N] [--batch-size B] [--threads T]
#                           [--workers W] [--data DIR]
# Three ways, alternated RUNS times (the order rotates every run; these
# machines swing +-25 % between runs):
#   old     PATH of --old: a ringtrain built before the trace points existed
#           (e.g. `git worktree add /tmp/old <commit before them>` and build it)
#   off     the new build, no --trace: the points are a load and a branch each
#   on      the new build with --trace FILE --trace-steps all: every step recorded
# each `train --data DIR --model M --steps N+3 --json`: steady_images_per_s
# (after the first 3 steps). Prints the medians, off/old (the cost of the
# points when tracing is off; goal: under 1 %) and on/off (the cost of
# recording; goal: under 3 %) both as the ratio of the medians and as the
# median of each round's own ratio (the ways of a round ran back to back,
# which cancels the slower drifts of a shared machine), and the trace's size.
# Options:
#   --old PATH        the build without trace points (required)
#   --new PATH        this build (default build/ringtrain)
#   --model M         (default mnist-net: the fastest model, where the points weigh most)
#   --runs R          rounds of the three ways (default 7)
#   --steps N         timed steps per run (default 40)
#   --batch-size B    (default 64)
#   --threads T       compute threads (default: nproc)
#   --workers W       loader workers (default 1)
#   --data DIR        a packed dataset (default: a synthetic CIFAR-10 kept in $TMPDIR)
# Exits 1 when a run fails (its output is shown), 2 on bad usage.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_name=trace_overhead.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

OLD= NEW=$HERE/../build/ringtrain MODEL=mnist-net RUNS=7 STEPS=40 BATCH=64 THREADS=$(nproc) WORKERS=1 DATA=
bench_options --old=OLD --new=NEW --model=MODEL --runs=RUNS --steps=STEPS --batch-size=BATCH --threads=THREADS \
    --workers=WORKERS --data=DATA -- "$@"
bench_posint "$RUNS" "$STEPS" "$BATCH" "$THREADS" "$WORKERS"
for b in "$OLD" "$NEW"; do
    [ -n "$b" ] && [ -x "$b" ] || bench_fail "--old and --new must name ringtrain binaries"
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
RT=$NEW
if [ -z "$DATA" ]; then
    DATA=${TMPDIR:-/tmp}/ringtrain-bench-cifar10
    bench_dataset --quiet "$DATA-src" "$DATA" "" ""
fi

bench_machine
echo "old:      $OLD ($("$OLD" --version 2>/dev/null | head -n 1))"
echo "new:      $NEW ($("$NEW" --version 2>/dev/null | head -n 1))"
echo "work:     train --data $DATA --model $MODEL --batch-size $BATCH --threads $THREADS --workers $WORKERS,"
echo "          $STEPS timed steps after 3, $RUNS runs of each way, alternated"
echo

# one WAY RUN: one run of WAY (old, off, on); its JSON summary in $W/WAY-RUN; exits 1 showing the output on failure.
one() {
    local way=$1 r=$2 bin=$NEW extra=()
    [ "$way" = old ] && bin=$OLD
    [ "$way" = on ] && extra=(--trace "$W/trace-$r.json" --trace-steps all)
    local out=$W/$way-$r
    if ! "$bin" train --data "$DATA" --model "$MODEL" --batch-size "$BATCH" --threads "$THREADS" --amp off \
        --workers "$WORKERS" --steps $((STEPS + 3)) --epochs 1000 --json --no-progress ${extra[@]+"${extra[@]}"} \
        >"$out" 2>"$out.err" || [ -z "$(bench_json_field "$PY" "$out" steady_images_per_s)" ]; then
        echo "$bench_name: a run ($way) failed:" >&2
        tail -n 20 "$out" "$out.err" >&2
        exit 1
    fi
}

for r in $(seq 1 "$RUNS"); do
    case $((r % 3)) in
    1) order="old off on" ;;
    2) order="off on old" ;;
    0) order="on old off" ;;
    esac
    for way in $order; do one "$way" "$r"; done
done

median() { for f in "$W/$1"-*[0-9]; do bench_json_field "$PY" "$f" steady_images_per_s; done | bench_median; }
spread() {
    for f in "$W/$1"-*[0-9]; do bench_json_field "$PY" "$f" steady_images_per_s; done | sort -n |
        awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.1f-%.1f", lo, hi}'
}
o=$(median old)
f=$(median off)
n=$(median on)
printf "  %-28s %12s %16s\n" way "img/s (median)" "range"
printf "  %-28s %12.1f %16s\n" "old (no trace points)" "$o" "$(spread old)"
printf "  %-28s %12.1f %16s\n" "new, tracing off" "$f" "$(spread off)"
printf "  %-28s %12.1f %16s\n" "new, --trace-steps all" "$n" "$(spread on)"
echo
awk -v o="$o" -v f="$f" -v n="$n" 'BEGIN {
    printf "  tracing off vs no trace points: %.3f (cost %+.1f %%; goal: under 1 %%)\n", f / o, 100 * (o - f) / o
    printf "  tracing on vs off:              %.3f (cost %+.1f %%; goal: under 3 %%)\n", n / f, 100 * (f - n) / f
}'
# paired A B: the median over rounds of B's rate / A's rate in the same round.
paired() {
    for r in $(seq 1 "$RUNS"); do
        awk -v a="$(bench_json_field "$PY" "$W/$1-$r" steady_images_per_s)" \
            -v b="$(bench_json_field "$PY" "$W/$2-$r" steady_images_per_s)" 'BEGIN { print b / a }'
    done | bench_median
}
awk -v p="$(paired old off)" -v q="$(paired off on)" 'BEGIN {
    printf "  per-round ratios, median:       off/old %.3f, on/off %.3f\n", p, q
}'
sz=$(stat -c %s "$W/trace-1.json" 2>/dev/null || echo 0)
ev=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["otherData"]["events"])' "$W/trace-1.json" 2>/dev/null || echo "?")
echo "  one traced run: $ev events, $(awk -v s="$sz" 'BEGIN {printf "%.1f MB", s / 1e6}') of JSON"
