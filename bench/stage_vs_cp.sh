#!/usr/bin/env bash
# stage_vs_cp.sh - `ringtrain stage` against `cp -r` copying the same packed
# dataset (synthetic CIFAR-10, 100000 train + 10000 test records, about
# 340 MB in 64 MiB shards), alternated RUNS times (default 5), medians printed.
#   bench/stage_vs_cp.sh [build/ringtrain] [RUNS]
#
# Both sides are timed to durability: stage fsyncs every file and the
# directory itself, so cp is followed by `sync DEST/* DEST` (fsync of each
# file copied and of the directory). Each run writes a fresh destination on
# the filesystem of $TMPDIR (or /tmp); the previous one is deleted and synced
# away first. The source is read once beforehand, so both read it from the
# page cache: this measures the write side, which is what staging to node-local
# disk costs. MB/s = dataset bytes / wall seconds of the whole command.
#
# The dataset is packed once into ${STAGE_BENCH_DATA:-$TMPDIR/rt-stage-bench}
# and reused by later runs; delete that directory to rebuild it.
set -eu
. "$(dirname "$0")/lib.sh"
RT=${1:-build/ringtrain}
RUNS=${2:-5}
BASE=${TMPDIR:-/tmp}
DATA=${STAGE_BENCH_DATA:-$BASE/rt-stage-bench}
DS=$DATA/ds

if [ ! -f "$DS/manifest.json" ]; then
    rm -rf "$DATA"
    bench_dataset "$DATA/src" "$DS" "" "" --train 100000 --test 10000 --seed 1 >/dev/null
    rm -rf "$DATA/src"
fi
bench_scratch rt-stage-vs-cp
bytes=$(du -cb "$DS"/* | tail -1 | cut -f1)
files=$(ls "$DS" | wc -l)
cat "$DS"/* >/dev/null

now() { date +%s.%N; }
# run NAME CMD...: times CMD into $t/NAME.txt (seconds).
run() {
    local name=$1; shift
    rm -rf "$t/dest"
    sync
    local t0 t1
    t0=$(now)
    "$@" >/dev/null
    t1=$(now)
    echo "$t0 $t1" | awk '{printf "%.4f\n", $2 - $1}' >>"$t/$name.txt"
}
stage_run() { "$RT" stage "$DS" --to "$t/dest" --quiet; }
cp_run() { cp -r "$DS" "$t/dest" && sync "$t/dest"/* "$t/dest"; }

for i in $(seq "$RUNS"); do
    run stage stage_run
    run cp cp_run
done
s_stage=$(bench_median <"$t/stage.txt")
s_cp=$(bench_median <"$t/cp.txt")
fs=$(df -T "$t" | awk 'NR==2{print $1" ("$2")"}')
printf "dataset %s: %s files, %.1f MB; destination on %s; %s runs each, alternated, %s CPUs\n" \
    "$DS" "$files" "$(echo "$bytes" | awk '{print $1/1e6}')" "$fs" "$RUNS" "$(nproc)"
printf "%-32s %10s %10s\n" "" "MB/s" "seconds"
printf "%-32s %10.1f %10.3f\n" "ringtrain stage (fsync each)" "$(echo "$bytes $s_stage" | awk '{print $1/$2/1e6}')" "$s_stage"
printf "%-32s %10.1f %10.3f\n" "cp -r + sync of each file" "$(echo "$bytes $s_cp" | awk '{print $1/$2/1e6}')" "$s_cp"
printf "stage / cp speed ratio: %.2f\n" "$(echo "$s_cp $s_stage" | awk '{print $1/$2}')"
