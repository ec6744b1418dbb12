#!/usr/bin/env bash
# freeze.sh - what --freeze saves a step: the same model with and without frozen layers, alternated, medians
# and their ratio.
#   bench/freeze.sh [--ringtrain PATH] [--model M] [--freeze GLOBS] [--runs R] [--steps N] [--batch-size B]
#                   [--threads T]
# Each run is `train --synthetic-data --model M --steps N+3 --json` on one rank (the steps after the first 3
# timed), once without --freeze and once with it, the one that goes first swapping every run (these machines
# swing +-25 % between runs). Prints the medians of steady_images_per_s and of the backward phase's p50, and
# frozen / unfrozen; the parameters that train and the bytes an all-reduce would move per update come from the
# same summaries.
# Options:
#   --ringtrain PATH  the binary (default: build/ringtrain beside this directory)
#   --model M         (default resnet18)
#   --freeze GLOBS    (default 'conv1.*,bn1.*,layer1.*', the README's)
#   --runs R          rounds of both (default 3)
#   --steps N         timed steps per run (default 22)
#   --batch-size B    (default 128)
#   --threads T       compute threads (default: nproc)
# Exits 1 when a run fails (its output is shown), 2 on bad usage.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_name=freeze.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

RT=$HERE/../build/ringtrain MODEL=resnet18 FREEZE='conv1.*,bn1.*,layer1.*' RUNS=3 STEPS=22 BATCH=128
THREADS=$(nproc)
bench_options --ringtrain=RT --model=MODEL --freeze=FREEZE --runs=RUNS --steps=STEPS --batch-size=BATCH \
    --threads=THREADS -- "$@"
bench_posint "$RUNS" "$STEPS" "$BATCH" "$THREADS"
[ -x "$RT" ] || bench_fail "--ringtrain $RT is not an executable"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

bench_machine
echo "ringtrain: $RT ($("$RT" --version 2>/dev/null | head -n 1))"
echo "train --synthetic-data --model $MODEL, batch $BATCH, $THREADS threads, $STEPS timed steps, $RUNS runs each"
echo

# one OUT ARGS...: one run, its JSON summary in OUT; exits 1 showing the output on failure.
one() {
    local out=$1
    shift
    if ! "$RT" train --synthetic-data --model "$MODEL" --batch-size "$BATCH" --threads "$THREADS" \
        --steps $((STEPS + 3)) --json --no-progress "$@" >"$out" 2>"$out.err" ||
        [ -z "$(bench_json_field "$PY" "$out" steady_images_per_s)" ]; then
        echo "$bench_name: a run failed:" >&2
        tail -n 20 "$out" "$out.err" >&2
        exit 1
    fi
}

for r in $(seq 1 "$RUNS"); do
    for side in $(bench_order "$r" all frozen); do
        if [ "$side" = frozen ]; then one "$W/frozen-$r" --freeze "$FREEZE"; else one "$W/all-$r"; fi
    done
done

# field FILES EXPR: the median over the JSON summaries FILES (a glob) of a Python expression of the summary `s`.
field() {
    for f in $1; do
        "$PY" -c "import json, sys; s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]; print($2)" "$f"
    done | bench_median
}
ips=steady_images_per_s
bwd="s['profile']['phases']['backward']['p50_ms']"
a=$(field "$W/all-*[0-9]" "s['$ips']") f=$(field "$W/frozen-*[0-9]" "s['$ips']")
ab=$(field "$W/all-*[0-9]" "$bwd") fb=$(field "$W/frozen-*[0-9]" "$bwd")
at=$(field "$W/all-*[0-9]" "s['params']['trainable']") ft=$(field "$W/frozen-*[0-9]" "s['params']['trainable']")
abytes=$(field "$W/all-*[0-9]" "s['allreduce_bytes']") fbytes=$(field "$W/frozen-*[0-9]" "s['allreduce_bytes']")
printf "  %-24s %16s %16s %10s\n" "" "no --freeze" "--freeze" "ratio"
printf "  %-24s %16.1f %16.1f %10.3f\n" "img/s (median)" "$a" "$f" "$(awk -v a="$a" -v b="$f" 'BEGIN{print b/a}')"
printf "  %-24s %16.1f %16.1f %10.3f\n" "backward p50 ms" "$ab" "$fb" "$(awk -v a="$ab" -v b="$fb" 'BEGIN{print b/a}')"
printf "  %-24s %16.0f %16.0f\n" "parameters trained" "$at" "$ft"
printf "  %-24s %16.0f %16.0f\n" "all-reduce bytes/update" "$abytes" "$fbytes"
echo "  (--freeze '$FREEZE')"
