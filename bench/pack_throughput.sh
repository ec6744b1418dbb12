#!/usr/bin/env bash
# pack_throughput.sh - pack throughput and compression ratio for the raw and
# jpeg codecs on the default synthetic CIFAR-10 (50000 + 10000 records), the
# two codecs alternated RUNS times (default 5), medians printed.
#   bench/pack_throughput.sh [build/ringtrain] [RUNS]
# MB/s counts decoded pixel bytes (records x 3072) per second of wall time.
set -eu
. "$(dirname "$0")/lib.sh"
RT=${1:-build/ringtrain}
RUNS=${2:-5}
bench_scratch rt-bench
"$RT" synth --out "$t/src" >/dev/null
# Warm the page cache so the first run is not the only one reading from disk.
cat "$t"/src/cifar-10-batches-bin/* >/dev/null
for i in $(seq "$RUNS"); do
    for codec in raw jpeg; do
        "$RT" pack "$t/src" --out "$t/$codec" --codec "$codec" --force |
            sed -E 's/.*ratio ([0-9.]+), ([0-9.]+) s, ([0-9.]+) MB\/s.*/\1 \2 \3/' >>"$t/$codec.txt"
    done
done
printf "%-6s %10s %10s %8s  (%s runs each, alternated, %s CPUs)\n" codec "MB/s" seconds ratio "$RUNS" "$(nproc)"
for codec in raw jpeg; do
    printf "%-6s %10s %10s %8s\n" "$codec" "$(cut -d' ' -f3 "$t/$codec.txt" | bench_median)" \
        "$(cut -d' ' -f2 "$t/$codec.txt" | bench_median)" "$(cut -d' ' -f1 "$t/$codec.txt" | bench_median)"
done
