#!/usr/bin/env bash
# test_report_inputs.sh - `ringtrain report` over every kind of input it reads, from tests/fixtures/report/
# (real runs' outputs, remade by tools/dev/gen_report_fixtures.sh): a run's directory (metrics, captured --json
# output, a checkpoint's state.json, a --trace), a comma list, loadbench, commbench and bench/scaling.sh
# outputs. No training: it runs in every build, the sanitizers' included, in about a second.
#   - the page has exactly the charts the inputs give (the loss scale's and a traced step's included), and
#     tests/report_view.py finds every series equal to the metrics records through its pixel mapping;
#   - the runs are labelled by the options in which their command lines differ (--lr, --epochs,
#     --loss-scale), never by where they wrote (--metrics, --checkpoint-dir);
#   - the benchmark series are the outputs' own numbers (loadbench images/s per worker count, commbench
#     busbw per path and size, scaling speedups);
#   - GPU counters (NVML's fields, added to a run's records: no GPU here) give the three GPU charts;
#   - wrong inputs fail naming the file: two metrics files in one run, a file ringtrain does not write, a
#     directory holding none, a missing path; no RUN at all is a usage error (2).
# Usage: test_report_inputs.sh RINGTRAIN [python3]. Exit 0 pass, 1 fail.
set -u
RT=${1:?usage: test_report_inputs.sh RINGTRAIN [python3]}
PY=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
FX=$HERE/fixtures/report
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$HERE/train_lib.sh"

"$RT" report "$FX/run-a" "$FX/run-b/metrics.jsonl,$FX/run-b/train.out,$FX/run-b/checkpoint" "$FX/loadbench.out" \
    "$FX/commbench.json" "$FX/scaling.json" -o "$W/all.html" --title "fixtures" >"$W/out" 2>&1 \
    && pass "report over two runs, a trace and three benchmarks' outputs" || { fail "report: $(cat "$W/out")"; exit 1; }
charts=loss,accuracy,throughput,lr,loss-scale,profile-p50,profile-p99,timeline,loadbench-workers,loadbench-stages
charts=$charts,commbench-busbw,scaling-speedup,scaling-efficiency
if "$PY" "$HERE/report_view.py" "$W/all.html" --no-render --metrics "$FX/run-a/metrics.jsonl" \
    --metrics "$FX/run-b/metrics.jsonl" --expect-charts "$charts" >"$W/view" 2>&1; then
    pass "the charts expected, every series = the metrics records ($(grep -c . "$W/view") lines of checks)"
else
    fail "report_view.py:"
    sed 's/^/    /' "$W/view" | tail -20
fi

# Labels, benchmark values and the traced step, from the page against the fixtures themselves.
if "$PY" - "$W/all.html" "$FX" >"$W/py" 2>&1 <<'EOF'; then
import json, re, sys
from html.parser import HTMLParser
page, fx = open(sys.argv[1]).read(), sys.argv[2]

class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.series = []; self.spans = []; self.area = {}; self.chart = None; self.cur = None
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "figure" and a.get("class") == "chart":
            self.chart = a["id"][len("chart-"):]
        elif tag == "g" and a.get("class") == "area":
            self.area[self.chart] = a
        elif tag == "g" and a.get("class") == "series":
            self.cur = dict(a, chart=self.chart); self.series.append(self.cur)
        elif tag == "polyline" and self.cur is not None:
            self.cur["points"] = [tuple(map(float, p.split(","))) for p in a["points"].split()]
        elif tag == "rect" and a.get("class") == "span":
            self.spans.append(a)
p = P(); p.feed(page)

def values(s):
    a = p.area[s["chart"]]
    f = lambda k: float(a[k])
    out = []
    for px, py in s["points"]:
        def inv(v, v0, v1, p0, p1, log):
            t0, t1 = (__import__("math").log10(v0), __import__("math").log10(v1)) if log else (v0, v1)
            t = t0 + (v - p0) / (p1 - p0) * (t1 - t0)
            return 10 ** t if log else t
        out.append((inv(px, f("data-x0"), f("data-x1"), f("data-px0"), f("data-px1"), a["data-xlog"] == "1"),
                    inv(py, f("data-y0"), f("data-y1"), f("data-py0"), f("data-py1"), a["data-ylog"] == "1")))
    return out

def close(a, b, rel=0.01):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)

# Labels: the options that differ, never the output paths.
labels = sorted({s["data-label"].split(",")[0] for s in p.series if s["chart"] == "loss"})
want = ["--epochs 2 --lr 0.02 --loss-scale dynamic", "--epochs 3 --lr 0.05 no --loss-scale"]
assert labels == want, labels
assert "--metrics" not in page.split('id="runs"')[1].split("</table>")[0], "a run labelled by its --metrics path"

# loadbench: images/s per worker count.
lb = json.loads([l for l in open(fx + "/loadbench.out") if l.startswith("{")][-1])
s = [s for s in p.series if s["chart"] == "loadbench-workers"][0]
got = values(s)
assert len(got) == len(lb["scaling"]), (got, lb["scaling"])
for (x, y), w in zip(got, lb["scaling"]):
    assert close(x, w["workers"], 1e-6) and close(y, w["images_per_s"]), ((x, y), w)

# commbench: busbw per path and size.
cb = json.load(open(fx + "/commbench.json"))
for s in [s for s in p.series if s["chart"] == "commbench-busbw"]:
    path = re.match(r"results\[path=(\w+)\]\.busbw", s["data-key"]).group(1)
    rows = [r for r in cb["results"] if r["path"] == path]
    got = values(s)
    assert len(got) == len(rows) > 0, (path, len(got), len(rows))
    for (x, y), r in zip(got, rows):
        assert close(x, r["size"]) and abs(y - r["busbw"]) <= 0.01 * max(r["busbw"], 0.05), (path, (x, y), r)

# scaling: the speedups of each mode.
sc = json.load(open(fx + "/scaling.json"))
for s in [s for s in p.series if s["chart"] == "scaling-speedup" and s["data-key"] != "ideal"]:
    mode = s["data-key"].split(".")[1]
    rows = [r for r in sc["rows"] if r.get(mode) and r[mode].get("speedup") is not None]
    got = values(s)
    assert len(got) == len(rows) > 0, (mode, got)
    for (x, y), r in zip(got, rows):
        assert close(x, r["ranks"], 1e-6) and close(y, r[mode]["speedup"]), (mode, (x, y), r)

# The traced step: rank 0's spans, all within the window, the step among them.
assert len(p.spans) > 10, len(p.spans)
t1 = float(p.area["timeline"]["data-x1"])
assert all(0 <= float(a["data-t0"]) <= float(a["data-t1"]) <= t1 + 1e-6 for a in p.spans)
names = {a.get("data-row") for a in p.spans}
assert len(names) >= 3, names  # the training thread, the compute stream, the loader
print("labels %s; loadbench %d points, commbench %d series, scaling ok, %d spans in the traced step" % (
    labels, len(lb["scaling"]), len([s for s in p.series if s["chart"] == "commbench-busbw"]), len(p.spans)))
EOF
    pass "$(cat "$W/py")"
else
    fail "the page against the fixtures:"
    sed 's/^/    /' "$W/py" | tail -12
fi

# GPU counters: no GPU here, so run-a's records with NVML's fields added (as a GPU run's records carry them:
# tools/train/report.c gpu_members) must give the three GPU charts, each series = the added values.
"$PY" - "$FX/run-a/metrics.jsonl" "$W/gpu.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for i, r in enumerate(rows):
        r.update(gpu_samples=40 + i, gpu_util_pct=61.5 + 7 * i, gpu_mem_used_gib=3.25 + 0.5 * i, gpu_power_w=212.0 - 9 * i)
        f.write(json.dumps(r) + "\n")
EOF
if "$RT" report "$W/gpu.jsonl" -o "$W/gpu.html" >"$W/out" 2>&1 &&
    "$PY" "$HERE/report_view.py" "$W/gpu.html" --no-render --metrics "$W/gpu.jsonl" \
        --expect-charts loss,accuracy,throughput,lr,profile-p50,profile-p99,gpu-util,gpu-mem,gpu-power >"$W/view" 2>&1; then
    pass "GPU counters: $(grep -c '^ *ok *chart gpu-[a-z]* series' "$W/view") GPU series, each = the records"
else
    fail "GPU counters' charts:"
    sed 's/^/    /' "$W/out" "$W/view" | grep -v '^ *ok' | tail -8
fi

# A directory is one run; the same run given as its files gives the same series.
"$RT" report "$FX/run-a/metrics.jsonl,$FX/run-a/train.out,$FX/run-a/checkpoint" -o "$W/a1.html" >/dev/null 2>&1 &&
    "$RT" report "$FX/run-a" -o "$W/a2.html" >/dev/null 2>&1 &&
    [ "$(grep -o '<polyline[^>]*>' "$W/a1.html")" = "$(grep -o '<polyline[^>]*>' "$W/a2.html")" ] &&
    grep -q 'id="chart-timeline"' "$W/a2.html" && ! grep -q 'id="chart-timeline"' "$W/a1.html" &&
    pass "a run's directory = its files named (and its trace found)" || fail "a run's directory differs from its files"

# Wrong inputs: exit status and a message that names the file.
expect_fail() { # expect_fail CODE WORDS ARGS...: report ARGS exits CODE with WORDS in its message
    local code=$1 words=$2 rc
    shift 2
    "$RT" report "$@" -o "$W/bad.html" >"$W/bad" 2>&1
    rc=$?
    if [ $rc -eq "$code" ] && grep -q -- "$words" "$W/bad" && [ ! -e "$W/bad.html" ]; then
        pass "refused ($rc): $(head -1 "$W/bad")"
    else
        fail "report $* exit $rc (want $code, '$words'), page written: $([ -e "$W/bad.html" ] && echo yes || echo no)"
        sed 's/^/    /' "$W/bad"
    fi
    rm -f "$W/bad.html"
}
expect_fail 1 "two metrics files in one run" "$FX/run-a/metrics.jsonl,$FX/run-b/metrics.jsonl"
mkdir -p "$W/two" && cp "$FX/run-a/metrics.jsonl" "$W/two/a.jsonl" && cp "$FX/run-b/metrics.jsonl" "$W/two/b.jsonl"
expect_fail 1 "name each as a run of its own" "$W/two"
echo '{"format": "ringtrain-dataset", "splits": []}' >"$W/manifest.json"
expect_fail 1 "manifest.json: not a file ringtrain writes" "$W/manifest.json"
mkdir -p "$W/empty" && cp "$W/manifest.json" "$W/empty/"
expect_fail 1 "empty: holds no --metrics file" "$W/empty"
expect_fail 1 "nothing-here: No such file" "$W/nothing-here"
expect_fail 2 "name at least one RUN"

echo "test_report_inputs: $fails failed"
[ "$fails" -eq 0 ]
