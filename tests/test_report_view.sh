#!/usr/bin/env bash
# test_report_view.sh - the report page as a person sees it: real runs' outputs made into pages by
# `train --report` and `ringtrain report`, checked by tests/report_view.py (self-contained, the charts
# expected, every series' points = the metrics records through the chart's pixel mapping, every
# profile bar = its record's field); the page of `ringtrain report` also drawn by headless Chromium
# (every chart whole on the PNG with its points drawn, no console message).
# The runs are small: 512 synthetic MNIST-shaped images, mnist-net, 3 epochs on 2 ranks (1 rank
# without a working mpirun) and 2 epochs on 1 rank; a loadbench over 1 and 2 workers; a commbench
# of 2 ranks over 4 sizes.
# Usage: test_report_view.sh path/to/ringtrain [python3]. Exit 0 pass, 1 fail, 77 skip (no chromium,
# or no numpy/PIL).
set -u
RT=${1:?usage: test_report_view.sh path/to/ringtrain [python3]}
PY=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # absolute: mpirun execs it
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "skip: no chromium (tools/install-deps.sh --test installs it)"; exit 77; }
"$PY" -c "import numpy, PIL" 2>/dev/null || { echo "skip: $PY has no numpy or PIL"; exit 77; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
. "$HERE/train_lib.sh"
show() { sed 's/^/     | /' "$@" | tail -n 12; }
T0=$(date +%s.%N)

"$RT" synth --format mnist --out "$W/src" --train 512 --test 128 --seed 5 >/dev/null \
    && "$RT" pack "$W/src" --out "$W/mnist" >/dev/null || { echo "FAIL synth/pack"; exit 1; }
# Run a on 2 ranks under mpirun; where mpirun cannot start them here, on one process.
T=(--data "$W/mnist" --model mnist-net --batch-size 32 --threads 1 --no-progress)
A=(train "${T[@]}" --epochs 3 --lr 0.05 --metrics "$W/a.jsonl" --checkpoint-dir "$W/a" --report "$W/train.html" --json)
np=2
if ! { command -v mpirun >/dev/null && timeout -k 10 120 mpirun -np 2 --bind-to none --oversubscribe "$RT" "${A[@]}" \
        >"$W/a.out" 2>"$W/a.err"; }; then
    grep -q "^ringtrain train:" "$W/a.out" && { fail "train run a on 2 ranks"; show "$W/a.out" "$W/a.err"; exit 1; }
    echo "note: no 2-rank run here (mpirun missing or failing), one process instead:"; show "$W/a.err"
    np=1
    rm -rf "$W/a" "$W/a.jsonl"
    timeout -k 10 120 "$RT" "${A[@]}" >"$W/a.out" 2>"$W/a.err" || { fail "train run a"; show "$W/a.out" "$W/a.err"; exit 1; }
fi
pass "train on $np rank(s) with --metrics --json --checkpoint-dir --report"
"$RT" train "${T[@]}" --epochs 2 --lr 0.02 --metrics "$W/b.jsonl" --checkpoint-dir "$W/b" --json >"$W/b.out" 2>"$W/b.err" \
    || { fail "train run b"; show "$W/b.out" "$W/b.err"; exit 1; }
"$RT" loadbench "$W/mnist" --batch-size 64 --workers 1,2 --epochs 1 --json >"$W/loadbench.out" 2>&1 \
    || { fail "loadbench"; show "$W/loadbench.out"; exit 1; }
MPI=(timeout -k 10 120)
[ $np -eq 2 ] && MPI+=(mpirun -np 2 --bind-to none --oversubscribe)
"${MPI[@]}" "$RT" commbench --min-bytes 1K --max-bytes 64K --factor 4 --warmup 1 --iters 3 --json "$W/commbench.json" \
    >"$W/commbench.out" 2>&1 || { fail "commbench"; show "$W/commbench.out"; exit 1; }
"$RT" report "$W/a.jsonl,$W/a.out,$W/a" "$W/b.jsonl,$W/b.out,$W/b" "$W/loadbench.out" "$W/commbench.json" \
    -o "$W/report.html" --title "test_report_view" >"$W/report.out" 2>&1 \
    && pass "ringtrain report over two runs, a loadbench and a commbench" \
    || { fail "ringtrain report"; show "$W/report.out"; exit 1; }
T1=$(date +%s.%N)

# The charts each page must have: the epoch charts of a CPU run without fp16 and the step profile; the
# benchmarks' too on the report of all. Chromium draws the report of all, the superset (a launch costs
# about 2.5 s of CPU); train --report's page, made by the same code, is checked without drawing.
train_charts=loss,accuracy,throughput,lr,profile-p50,profile-p99
all_charts=$train_charts,loadbench-workers,loadbench-stages,commbench-busbw
"$PY" "$HERE/report_view.py" "$W/train.html" --no-render --metrics "$W/a.jsonl" --expect-charts "$train_charts" \
    >"$W/view-train.out" 2>&1
rc=$?
sed 's/^/  train.html | /' "$W/view-train.out"
[ $rc -eq 0 ] && pass "train --report's page checked" || fail "train --report's page (report_view.py exit $rc)"
"$PY" "$HERE/report_view.py" "$W/report.html" --png "$W/report.png" --metrics "$W/a.jsonl" --metrics "$W/b.jsonl" \
    --expect-charts "$all_charts" --chromium "$CHROMIUM" >"$W/view-all.out" 2>&1
rc=$?
sed 's/^/  report.html | /' "$W/view-all.out"
[ $rc -eq 0 ] && pass "ringtrain report's page drawn and checked" || fail "ringtrain report's page (report_view.py exit $rc)"

# The checker itself fails a page whose drawn points are not the data: one point of the loss moved
# by 10 px (HTML and data only: no drawing needed).
"$PY" - "$W/report.html" "$W/moved.html" <<'EOF'
import re, sys
s = open(sys.argv[1]).read()
m = re.search(r'(<g class="series"[^>]*data-key="train_loss"[^>]*>\s*<polyline[^>]*points=")([-0-9.]+),([-0-9.]+)', s)
open(sys.argv[2], "w").write(s[:m.start(3)] + "%.2f" % (float(m.group(3)) - 10) + s[m.end(3):])
EOF
if "$PY" "$HERE/report_view.py" "$W/moved.html" --no-render --metrics "$W/a.jsonl" --metrics "$W/b.jsonl" >"$W/moved.out" 2>&1; then
    fail "report_view.py passes a page with a point 10 px off"
else
    grep -q "^FAIL chart loss series run 0 train_loss" "$W/moved.out" && pass "report_view.py fails a page with a point 10 px off" \
        || { fail "report_view.py failed the moved point for another reason"; show "$W/moved.out"; }
fi
T2=$(date +%s.%N)
awk -v a="$T0" -v b="$T1" -v c="$T2" 'BEGIN { printf "time: runs and pages %.1f s, drawing and checks %.1f s\n", b - a, c - b }'
echo "test_report_view: $fails failed"
[ "$fails" -eq 0 ]
