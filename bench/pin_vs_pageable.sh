#!/usr/bin/env bash
# pin_vs_pageable.sh - what page-locked ring slots buy on the CPU: `ringtrain loadbench` (the loader
# and ring alone, 3 epochs, steady images/s) and `ringtrain train` (mnist-net, 100 steps, img/s) with
# `--pin` against `--no-pin`, alternated RUNS times (default 5), medians and their ratio printed.
#   bench/pin_vs_pageable.sh [build/ringtrain] [RUNS]
#
# Synthetic CIFAR-10 (50000 + 10000) is packed once into ${PIN_BENCH_DATA:-$TMPDIR/rt-pin-bench}.
# `--pin` needs `ulimit -l` above the ring (or root); this script raises the soft limit to the hard
# one and stops if that is still too low. Pageable slots are what an ordinary user gets by default
# beyond the limit (8 MiB on Debian 12), so a ratio near 1 says that fallback costs nothing.
set -eu
. "$(dirname "$0")/lib.sh"
RT=${1:-build/ringtrain}
RUNS=${2:-5}
[ "$RUNS" = -h ] || [ "$RUNS" = --help ] || [ "$RT" = -h ] || [ "$RT" = --help ] && bench_usage
bench_posint "$RUNS" || bench_fail "RUNS must be a positive integer, not '$RUNS'"
DATA=${PIN_BENCH_DATA:-${TMPDIR:-/tmp}/rt-pin-bench}
bench_machine
bench_dataset "$DATA/src" "$DATA/ds" "" "" --seed 1 >/dev/null
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
bench_scratch rt-pin-vs-pageable

# one KIND MODE RUN: a figure in $t/KIND-MODE.txt (images/s).
one() {
    local kind=$1 mode=$2 out=$t/$1-$2-$3.log
    if [ "$kind" = loadbench ]; then
        "$RT" loadbench "$DATA/ds" --epochs 3 --workers 2 --json "--$mode" >"$out" 2>&1 ||
            { tail -3 "$out"; bench_fail "loadbench --$mode failed"; }
        bench_json_field python3 "$out" images_per_s >>"$t/$kind-$mode.txt"
    else
        "$RT" train --data "$DATA/ds" --steps 100 --threads 2 --json --no-progress "--$mode" >"$out" 2>&1 ||
            { tail -3 "$out"; bench_fail "train --$mode failed"; }
        bench_json_field python3 "$out" images_per_s >>"$t/$kind-$mode.txt"
    fi
}
for r in $(seq "$RUNS"); do
    for kind in loadbench train; do
        if [ $((r % 2)) -eq 1 ]; then one $kind pin "$r"; one $kind no-pin "$r"; else one $kind no-pin "$r"; one $kind pin "$r"; fi
    done
done
printf '%-10s %16s %16s %8s\n' "" "--pin img/s" "--no-pin img/s" "ratio"
for kind in loadbench train; do
    p=$(bench_median <"$t/$kind-pin.txt")
    n=$(bench_median <"$t/$kind-no-pin.txt")
    printf '%-10s %16.0f %16.0f %8.3f\n' "$kind" "$p" "$n" "$(awk -v a="$n" -v b="$p" 'BEGIN { print a / b }')"
done
echo "(medians of $RUNS alternated runs; ratio = pageable / page-locked; $cpu)"
