#!/usr/bin/env bash
# test_bench_profile.sh - bench/gpu_vs_pytorch.sh's compute and profile parts and bench/op_profile.py,
# without a GPU:
#   1. the compute part end to end on stand-ins (a fake nvidia-smi naming an NVIDIA H200, a stand-in
#      ringtrain and a stand-in PyTorch printing fixed images/s): the ways alternated (their order reversed
#      in run 2), the windows sized from the guess table in run 1 and from run 1's speeds in run 2,
#      torch.compile skipped with a note and not retried, the results JSON (every record with the settings
#      it ran with, rows, goals), the tables' new columns (torch.compile, compile s, TFLOP/s with the
#      share of the H200's peak, determinism's cost) and the PASS/MISS logic of the 1.2x and the
#      200 TFLOP/s goals at their boundaries; then --tables-from that JSON with a profile that names a
#      host-bound pair;
#   2. bench/op_profile.py on a canned Kineto trace of a GPU step (two host threads, kernels, a memcpy and
#      a memset): every category, the dgrad/wgrad split by kernel name and place, the mm split by shape,
#      the optimizer span, a kernel linked by correlation alone, idle = wall - the kernels' union;
#   3. `--only profile --device cpu --models mnist-net --amps off --batch-size 16` with the ringtrain given
#      and /usr/bin/python3's torch: the table (every category row with both sides' numbers, the
#      largest-differences line) and the JSON (its keys, the categories summing to step_ms on each side,
#      PyTorch's conv_fwd > 0);
#   4. `--only folder --device cpu` on a tiny folder (2 x 24 JPEGs, mnist-net at 32 px, batch 16), twice: the
#      folder made and packed by the first run and reused by the second, both sides trained end to end (at
#      least 2 timed epochs each), the table, both goals and CACHE/folder.json (~12 s on 2 cores).
# Also: each model at its own batch (NAME@S:B, resnet50@224 at 256 by default) on the stand-ins of part 1.
# Parts 1 and 2 need a python3 only. Parts 3 and 4 skip (exit 77, after 1 and 2 passed) without /usr/bin/python3
# with torch, or when the binary's train --help has no --profile-ops.
#   tests/test_bench_profile.sh RINGTRAIN
set -u
export LC_ALL=C
RT=${1:?usage: test_bench_profile.sh RINGTRAIN}
top=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$top/bench/gpu_vs_pytorch.sh
PY=$(command -v python3 || echo /usr/bin/python3)
"$PY" -c 'import json' 2>/dev/null || { echo "skip: no python3"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/test_bench_profile.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# ==== 1. the compute part on stand-ins ==================================================================
mkdir -p "$T/bin"
cat >"$T/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
*index,name*) echo "0, NVIDIA H200, 143771 MiB, 580.95.05" ;;
*utilization*) echo "0, 1" ;;
*compute_cap*) echo "9.0" ;;
*) echo "NVIDIA-SMI stand-in" ;;
esac
EOF
# images/s the stand-ins print: ringtrain by way (rt, rt-nd, rt-strict), PyTorch by way (pt, pt-strict, ptc)
cat >"$T/speeds.tsv" <<'EOF'
rt resnet9 off 30000
rt-nd resnet9 off 31500
rt-strict resnet9 off 12000
rt resnet9 bf16 100000
rt-nd resnet9 bf16 125000
rt resnet9 fp16 90000
rt-nd resnet9 fp16 90000
rt mnist-net off 200000
rt-nd mnist-net off 200000
rt-strict mnist-net off 150000
rt mnist-net bf16 250000
rt-nd mnist-net bf16 250000
rt mnist-net fp16 240000
rt-nd mnist-net fp16 240000
rt-eager mnist-net off 160000
pt resnet9 off 25000
pt-strict resnet9 off 10000
ptc resnet9 off 40000
pt resnet9 bf16 90000
pt resnet9 fp16 70000
ptc resnet9 fp16 80000
pt mnist-net off 180000
pt-strict mnist-net off 100000
ptc mnist-net off 190000
pt mnist-net bf16 200000
ptc mnist-net bf16 300000
pt mnist-net fp16 200000
ptc mnist-net fp16 210000
rt resnet50@224 bf16 3600
pt resnet50@224 bf16 3000
ptc resnet50@224 bf16 3700
EOF
cat >"$T/bin/ringtrain" <<EOF
#!/usr/bin/env bash
# a stand-in ringtrain: train --help lists the options the bench looks for; train prints a set-up line
# naming the GPU and a --json line with fixed images/s; every train call logged as "WAY MODEL AMP STEPS"
SPEEDS=$T/speeds.tsv LOG=$T/calls.log
EOF
cat >>"$T/bin/ringtrain" <<'EOF'
case "$1 ${2:-}" in
"--version "*) echo "ringtrain stand-in"; exit 0 ;;
"train --help") echo "  --amp P  --tf32 on|off  --deterministic on|off  --profile-ops  --cuda-graph on|off|auto"; exit 0 ;;
esac
shift
m=mnist-net a=bf16 n=0 way=rt size= b=0
while [ $# -gt 0 ]; do
    case $1 in
    --model) m=$2; shift ;;
    --image-size) size=$2; shift ;;
    --batch-size) b=$2; shift ;;
    --amp) a=$2; shift ;;
    --steps) n=$2; shift ;;
    --tf32) [ "$2" = off ] && way=rt-strict; shift ;;
    --deterministic) [ "$2" = off ] && way=rt-nd; shift ;;
    --cuda-graph) [ "$2" = off ] && way=rt-eager; shift ;;
    --profile-ops) way=rt-profile ;;
    esac
    shift
done
[ -z "$size" ] || m=$m@$size
ips=$(awk -v k="$way $m $a" '$1 " " $2 " " $3 == k {print $4}' "$SPEEDS")
echo "$way $m $a $n $b" >>"$LOG"
echo "ringtrain train: world 1 (1 node, 1 rank per node), cuda: GPU 0 NVIDIA H200 (stand-in)"
prof=
if [ $way = rt-profile ]; then
    prof=', "op_profile": {"steps": 12, "warmup_included": false, "step_ms": 10.0, "categories": {"conv_fwd": 2.0, "data_grad": 1.0, "weight_grad": 1.0, "batchnorm": 0.5, "elementwise": 1.5, "pooling": 0.2, "loss": 0.1, "optimizer": 0.5, "copies": 0.1, "other": 0.1, "idle": 3.0}, "ops": [{"op": "conv2d_fwd", "category": "conv_fwd", "ms": 2.0, "calls": 2}], "convolutions": [{"dir": "fwd", "dtype": "f32", "shape": "16x3x32x32", "how": "implicit gemm", "ms": 2.0, "workspace": 0, "deterministic": true, "tensor_cores": true, "candidates": 8}], "settings": {"tf32": true, "deterministic": true, "kernels": "fast"}}'
fi
printf '{"steady_images_per_s": %s, "images_per_s": %s, "amp": "%s", "steps": %s, "settings": {"tf32": %s, "deterministic": %s, "kernels": "fast"}%s}\n' \
    "${ips:-1000}" "${ips:-1000}" "$a" "$n" "$([ $way = rt-strict ] && echo false || echo true)" \
    "$([ $way = rt-nd ] && echo false || echo true)" "$prof"
EOF
cat >"$T/bin/torch-standin" <<EOF
#!/usr/bin/env bash
# a stand-in for python3 running bench/torch_train.py: check, flops, compute (fixed images/s, the settings;
# --compile of resnet9 bf16 fails, as a compile that cannot build here would)
SPEEDS=$T/speeds.tsv LOG=$T/calls.log
EOF
cat >>"$T/bin/torch-standin" <<'EOF'
shift  # torch_train.py
mode=$1
shift
m=mnist-net a=off n=0 way=pt b=0
while [ $# -gt 0 ]; do
    case $1 in
    --model) m=$2; shift ;;
    --batch-size) b=$2; shift ;;
    --amp) a=$2; shift ;;
    --steps) n=$2; shift ;;
    --tf32) [ "$2" = off ] && way=pt-strict; shift ;;
    --compile) way=ptc ;;
    esac
    shift
done
case $mode in
check) echo "torch 2.11.0 stand-in (CUDA 13.0, cuDNN 91900, NVIDIA H200)" ;;
flops) for x in ${m//,/ }; do
           f=100000000; [ "$x" = resnet9 ] && f=2000000000
           echo "{\"mode\": \"flops\", \"model\": \"$x\", \"train_flops_per_image\": $f}"
       done ;;
compute)
    echo "$way $m $a $n $b" >>"$LOG"
    tf=true; [ $way = pt-strict ] && tf=false
    s="{\"torch\": \"2.11.0\", \"cudnn_allow_tf32\": $tf, \"matmul_allow_tf32\": false, \"cudnn_benchmark\": true, \"cudnn_deterministic\": false, \"compile\": $([ $way = ptc ] && echo '"default"' || echo null)}"
    if [ $way = ptc ] && [ "$m $a" = "resnet9 bf16" ]; then
        echo "{\"mode\": \"compute\", \"model\": \"$m\", \"skipped\": \"torch.compile failed: stand-in\", \"settings\": $s}"
        exit 0
    fi
    ips=$(awk -v k="$way $m $a" '$1 " " $2 " " $3 == k {print $4}' "$SPEEDS")
    c=null; [ $way = ptc ] && c=12.5
    echo "{\"mode\": \"compute\", \"model\": \"$m\", \"images_per_s\": ${ips:-1000}, \"steps\": $n, \"compile_s\": $c, \"settings\": $s, \"note\": \"stand-in\"}" ;;
profile)
    echo "{\"mode\": \"profile\", \"model\": \"$m\", \"amp\": \"$a\", \"steps\": $n, \"warmup\": 5, \"step_ms\": 8.0, \"busy_ms\": 7.6, \"categories\": {\"conv_fwd\": 2.5, \"data_grad\": 1.5, \"weight_grad\": 1.0, \"batchnorm\": 0.5, \"elementwise\": 1.0, \"pooling\": 0.2, \"loss\": 0.1, \"optimizer\": 0.5, \"copies\": 0.2, \"other\": 0.1, \"idle\": 0.4}, \"ops\": [{\"op\": \"cudnn_convolution\", \"category\": \"conv_fwd\", \"ms\": 2.5, \"calls\": 2}], \"settings\": {\"torch\": \"2.11.0\"}}" ;;
*) echo "stand-in: no $mode" >&2; exit 2 ;;
esac
EOF
chmod +x "$T/bin/nvidia-smi" "$T/bin/ringtrain" "$T/bin/torch-standin"

PATH="$T/bin:$PATH" bash "$BENCH" --only compute --runs 2 --models resnet9,mnist-net --amps off,bf16,fp16 \
    --batch-size 512 --window-s 1 --bin "$T/bin/ringtrain" --python "$T/bin/torch-standin" --cache "$T/cache" \
    >"$T/compute.out" 2>&1
rc=$?
if [ $rc != 0 ]; then
    fail "the compute part on stand-ins exited $rc:"
    tail -n 30 "$T/compute.out"
else
    ok "the compute part ran on stand-ins (2 runs, 2 models x 3 precisions, every way)"
fi
"$PY" - "$T/compute.out" "$T/cache/compute.json" "$T/calls.log" <<'EOF' || fails=$((fails + 1))
import json, sys
out, res, log = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), open(sys.argv[3]).read().split("\n")
bad = []
def want(cond, what):
    if not cond:
        bad.append(what)
rows = [l for l in out.splitlines() if l.startswith("| ")]
def row(model, label, table):
    """The cells of the row of model and label in the table whose header holds `table`."""
    start = next((i for i, l in enumerate(rows) if table in l), None)
    if start is None:
        return None
    for l in rows[start + 1:]:
        c = [x.strip() for x in l.strip("|").split("|")]
        if c[0] == model and c[1] == label:
            return c
        if c[0] in ("model", "goal"):
            break
    return None
want(any("torch.compile images/s" in l and "compile s" in l and "ringtrain : compile" in l
         and "goal >= 1.2x" in l for l in rows), "the speed table's header lacks its new columns")
want(any("peak TFLOP/s" in l and "ringtrain nondeterministic" in l and "deterministic : nondeterministic" in l
         for l in rows), "the TFLOP/s table's header lacks its columns")
# ratio exactly 1.2 passes, 1.11 misses; both fp32 rows are there
for model, label, ratio, goal in (("resnet9", "fp32 (TF32)", "1.20", "PASS"), ("resnet9", "fp32 strict", "1.20", "PASS"),
                                  ("resnet9", "bf16", "1.11", "MISS"), ("mnist-net", "fp32 (TF32)", "1.11", "MISS"),
                                  ("mnist-net", "fp16", "1.20", "PASS")):
    c = row(model, label, "ringtrain : eager")
    want(c is not None and c[2] == "512" and c[7] == ratio and c[8] == goal, "%s %s: batch/ratio/goal %s, expected "
         "512 %s %s" % (model, label, c and [c[2]] + c[7:9], ratio, goal))
c = row("resnet9", "fp32 (TF32)", "ringtrain : eager")
want(c is not None and c[9] == "40000.0" and c[10] == "12.5" and c[11] == "0.75",
     "resnet9 fp32 torch.compile cells: %s" % (c and c[9:12]))
c = row("resnet9", "bf16", "ringtrain : eager")
want(c is not None and c[10] == "skipped" and "torch.compile failed: stand-in" in c[12],
     "resnet9 bf16: torch.compile not said skipped: %s" % c)
# TFLOP/s at 2 GFLOP/image: 100000 img/s = 200.0 TFLOP/s, 20.2 % of the H200's 989; 200 passes, 180 misses
c = row("resnet9", "bf16", "peak TFLOP/s")
want(c is not None and c[3] == "989" and c[4] == "200.0 (20.2 %)" and c[9] == "PASS",
     "resnet9 bf16 TFLOP/s row: %s" % c)
want(c is not None and c[8] == "0.80x", "resnet9 bf16 determinism cost: %s" % (c and c[8]))
c = row("resnet9", "fp16", "peak TFLOP/s")
want(c is not None and c[4] == "180.0 (18.2 %)" and c[9] == "MISS", "resnet9 fp16 TFLOP/s row: %s" % c)
c = row("resnet9", "fp32 strict", "peak TFLOP/s")
want(c is not None and c[3] == "67" and c[4] == "24.0 (35.8 %)", "resnet9 fp32 strict TFLOP/s row: %s" % c)
c = row("resnet9", "fp32 (TF32)", "peak TFLOP/s")
want(c is not None and c[3] == "495", "resnet9 fp32 (TF32) against the TF32 peak: %s" % c)
goal1 = next((l for l in rows if l.startswith("| ringtrain >= 1.2x PyTorch eager")), "")
want("MISS (6 of 8 pairs)" in goal1 and "resnet9 bf16" in goal1 and "mnist-net fp32 (TF32)" in goal1,
     "the 1.2x goal line: %s" % goal1)
goal2 = next((l for l in rows if l.startswith("| resnet9 and wrn-16-4 at bf16/fp16 >= 200 TFLOP/s")), "")
want("MISS (1 of 2 pairs)" in goal2 and "resnet9 fp16 (180.0)" in goal2, "the 200 TFLOP/s goal line: %s" % goal2)
want("cudnn.allow_tf32 False" in out and "cudnn.allow_tf32 True" in out, "the PyTorch settings are not printed")
# the results JSON
want(res.get("gpu_compute") == 1 and res.get("gpu") == "NVIDIA H200" and res.get("peaks_tflops", {}).get("16") == 989,
     "results JSON header: %s" % {k: res.get(k) for k in ("gpu_compute", "gpu", "peaks_tflops")})
pt = [r for r in res.get("records", []) if r.get("way") in ("pt", "pt-strict", "ptc")]
want(pt and all(isinstance(r.get("settings"), dict) and "cudnn_allow_tf32" in r["settings"] for r in pt),
     "a PyTorch record without its settings")
want(all(isinstance(r.get("settings"), dict) for r in res["records"] if r.get("way", "").startswith("rt")),
     "a ringtrain record without its settings")
want(res.get("goals", {}).get("ratio", {}).get("result") == "MISS" and res["goals"]["tflops"]["passed"] == 1,
     "results JSON goals: %s" % res.get("goals"))
# the calls: windows of 1 s at the guess (run 1) and at run 1's speed (run 2); the order reversed in run 2
calls = [l.split() for l in log if l]
r9off = [c for c in calls if c[1:3] == ["resnet9", "off"]]
want([c[0] for c in r9off[:6]] == ["rt", "rt-nd", "rt-strict", "pt", "pt-strict", "ptc"],
     "run 1's order: %s" % [c[0] for c in r9off[:6]])
want([c[0] for c in r9off[6:]] == ["ptc", "pt-strict", "pt", "rt-strict", "rt-nd", "rt"],
     "run 2's order: %s" % [c[0] for c in r9off[6:]])
bf = [c for c in calls if c[:3] == ["rt", "resnet9", "bf16"]]
want([c[3] for c in bf] == [str(round(75847 / 512) + 3), str(round(100000 / 512) + 3)],
     "ringtrain resnet9 bf16 --steps %s, expected the guess's then run 1's window" % [c[3] for c in bf])
want(sum(1 for c in calls if c[:3] == ["ptc", "resnet9", "bf16"]) == 1, "a failed torch.compile was retried")
if bad:
    print("FAIL: " + "\nFAIL: ".join(bad))
    sys.exit(1)
print("ok: the compute tables, their goals and the results JSON (%d records)" % len(res["records"]))
EOF

cat >"$T/profile-idle.json" <<'EOF'
{"profile_comparison": 1, "gpu": "NVIDIA H200", "host": "stand-in", "pairs": [
 {"model": "mnist-net", "amp": "off", "batch": 512, "ringtrain": {"step_ms": 10.0, "categories": {"idle": 3.0}},
  "pytorch": null, "largest": []},
 {"model": "resnet9", "amp": "bf16", "batch": 512, "ringtrain": {"step_ms": 10.0, "categories": {"idle": 1.0}},
  "pytorch": null, "largest": []}]}
EOF
bash "$BENCH" --tables-from "$T/cache/compute.json" --profile-json "$T/profile-idle.json" >"$T/tables.out" 2>&1 ||
    fail "--tables-from exited $?: $(tail -n 3 "$T/tables.out")"
if grep -q '^| mnist-net | fp32 (TF32) |.*| host-bound: GPU idle 30 % of ringtrain' "$T/tables.out" &&
    grep -q '^| resnet9 | bf16 |.*| GPU idle 10 % of ringtrain' "$T/tables.out" &&
    grep '^| ringtrain >= 1.2x' "$T/tables.out" | grep -q 'host-bound (GPU idle > 20 % of ringtrain.s step in the profile), left to the next issue: mnist-net fp32 (TF32) |$'; then
    ok "--tables-from names the host-bound pair (idle 30 % > 20 %) and not the other (10 %)"
else
    fail "--tables-from with a profile: no host-bound note where expected:"
    grep -E '^\| (mnist-net|resnet9|ringtrain >=)' "$T/tables.out"
fi

PATH="$T/bin:$PATH" bash "$BENCH" --only compute,profile --runs 1 --models mnist-net --amps off --extras none \
    --window-s 1 --bin "$T/bin/ringtrain" --python "$T/bin/torch-standin" --cache "$T/cache2" >"$T/both.out" 2>&1 ||
    fail "--only compute,profile on stand-ins exited $?: $(tail -n 5 "$T/both.out")"
if grep -q '^| mnist-net | fp32 (TF32) |.*| host-bound: GPU idle 30 % of ringtrain' "$T/both.out" &&
    grep -q '^largest differences: mnist-net fp32: idle +2.60 ms, conv_fwd -0.50 ms, data_grad -0.50 ms$' "$T/both.out" &&
    [ -f "$T/cache2/profile.json" ] && [ -f "$T/cache2/compute.json" ]; then
    ok "--only compute,profile: the profile's tables, its JSON, and the host-bound pair named in the compute table"
else
    fail "--only compute,profile: no host-bound note or largest-differences line:"
    grep -E '^\| mnist-net|^largest' "$T/both.out"
fi

# --extras eager: ringtrain op by op (--cuda-graph off) beside its default, and the graphs' gain printed.
PATH="$T/bin:$PATH" bash "$BENCH" --only compute --runs 1 --models mnist-net --amps off --extras eager \
    --window-s 1 --bin "$T/bin/ringtrain" --python "$T/bin/torch-standin" --cache "$T/cache3" >"$T/eager.out" 2>&1 ||
    fail "--extras eager on stand-ins exited $?: $(tail -n 5 "$T/eager.out")"
if grep -q "^CUDA graphs (ringtrain's default) : op by op (--cuda-graph off), images/s: mnist-net fp32 (TF32) 1.25x$" \
    "$T/eager.out" && grep -q '^rt-eager mnist-net off ' "$T/calls.log"; then
    ok "--extras eager: ringtrain --cuda-graph off measured, graphs : op by op 200000 / 160000 = 1.25x"
else
    fail "--extras eager: no gain line or no --cuda-graph off call: $(grep -i 'graph' "$T/eager.out" | head -3)"
fi

# Each model's own batch: without --batch-size resnet50@224 trains at 256 and mnist-net at 512 (resnet9:64 at 64),
# the speed cache keys each on its batch, the table shows it, and the resnet50@224 bf16 goal (>= 1.2x eager and
# >= 1.0x torch.compile) is judged: 3600 / 3000 = 1.20x, 3600 / 3700 = 0.97x: MISS.
: >"$T/calls.log"
PATH="$T/bin:$PATH" bash "$BENCH" --only compute --runs 1 --models mnist-net,resnet50@224,resnet9:64 --amps bf16 \
    --extras compile --window-s 1 --bin "$T/bin/ringtrain" --python "$T/bin/torch-standin" --cache "$T/cache4" \
    >"$T/batch.out" 2>&1 || fail "per-model batches on stand-ins exited $?: $(tail -n 5 "$T/batch.out")"
"$PY" - "$T/batch.out" "$T/cache4/speeds.json" "$T/cache4/compute.json" "$T/calls.log" <<'EOF' || fails=$((fails + 1))
import json, sys
out, sp, res = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
calls = [l.split() for l in open(sys.argv[4]) if l.strip()]
bad = []
def want(cond, what):
    if not cond:
        bad.append(what)
by = {(c[0], c[1]): c for c in calls}
none = [""] * 5
want(by.get(("rt", "resnet50@224"), none)[4] == "256" and by.get(("pt", "resnet50@224"), none)[4] == "256"
     and by.get(("ptc", "resnet50@224"), none)[4] == "256", "resnet50@224 not at batch 256: %s" % calls)
want(by.get(("rt", "mnist-net"), none)[4] == "512" and by.get(("pt", "resnet9"), none)[4] == "64",
     "mnist-net not at 512 or resnet9:64 not at 64: %s" % calls)
# 1 s at the guess of 3000 images/s, batch 256: round(11.7) = 12 timed steps, + 3 untimed for ringtrain
want(by.get(("rt", "resnet50@224"), none)[3] == "15", "resnet50@224's steps from the guess: %s"
     % by.get(("rt", "resnet50@224")))
g = sp.get("NVIDIA H200", {})
want(g.get("256", {}).get("rt resnet50@224 bf16") == 3600 and "rt mnist-net bf16" in g.get("512", {})
     and "pt resnet9 bf16" in g.get("64", {}), "speeds.json not keyed by each model's batch: %s" % g)
want(res.get("batches") == {"mnist-net": 512, "resnet50@224": 256, "resnet9": 64}, "results batches: %s"
     % res.get("batches"))
want(any(l.startswith("| resnet50@224 | bf16 | 256 | 3600.0 |") for l in out.splitlines()),
     "no resnet50@224 row at batch 256")
goal = next((l for l in out.splitlines() if l.startswith("| resnet50@224 bf16: ringtrain >= 1.2x PyTorch eager")), "")
want("MISS (0 of 1 pairs); misses: 1.20x eager, 0.97x compile" in goal, "the resnet50@224 goal line: %s" % goal)
want(res.get("goals", {}).get("resnet50", {}).get("result") == "MISS", "results JSON resnet50 goal")
if bad:
    print("FAIL: " + "\nFAIL: ".join(bad))
    sys.exit(1)
print("ok: each model at its own batch (resnet50@224 256, mnist-net 512, resnet9:64), keyed so in the speed cache,"
      " the results JSON and the table; the resnet50@224 goal")
EOF

# ==== 2. op_profile.py on a canned Kineto trace ========================================================
"$PY" - "$top/bench" >"$T/canned.out" 2>&1 <<'EOF'
# A canned Kineto chrome trace of one GPU training step (two host threads, one stream) and the
# categories op_profile.py must find in it.
import json, sys
sys.path.insert(0, sys.argv[1])
import op_profile

B = 8
ev = []
ext = [100]
corr = [5000]
gpu_t = [1000.0]  # the device's events from H on

H = 1000.0  # host and device times share the trace's clock; the host's ops from H on

def op(name, tid, ts, dur, dims=None, cat="cpu_op"):
    ext[0] += 1
    e = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": H + ts, "dur": dur,
         "args": {"External id": ext[0]}}
    if dims is not None:
        e["args"]["Input Dims"] = dims
    ev.append(e)
    return ext[0]

def kernel(name, owner, dur, gap=0.0, cat="kernel", link="ext", at=None):
    """A device event of dur us, gap us after the previous one; linked by External id, or only by
    correlation to a cudaLaunchKernel at host time `at` on thread 1 (link="corr")."""
    corr[0] += 1
    gpu_t[0] += gap
    args = {"correlation": corr[0], "stream": 7, "device": 0}
    args["External id"] = owner if link in ("ext", "both") else 0
    ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": gpu_t[0], "dur": dur, "args": args})
    if link in ("corr", "both"):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 1, "ts": H + at,
                   "dur": 1, "args": {"correlation": corr[0], "External id": 0}})
    gpu_t[0] += dur

# the profiler's first step, before the profiled span: its kernel does not count
w = op("aten::relu_", 1, -3100, 10)
ev.append({"ph": "X", "cat": "kernel", "name": "warm_up_kernel", "pid": 0, "tid": 7, "ts": H - 3000, "dur": 50,
           "args": {"External id": w, "correlation": 1}})
op("rt:profiled", 1, -1, 800, cat="user_annotation")
# forward, thread 1 (host times in us; the device ones are laid out by kernel())
op("rt:input", 1, 0, 40, cat="user_annotation")
op("aten::to", 1, 1, 20, [[B, 3, 32, 32]]); op("aten::_to_copy", 1, 2, 18); e = op("aten::copy_", 1, 3, 16)
kernel("void at::native::unrolled_elementwise_kernel<copy>", e, 10)
e = op("aten::div", 1, 22, 8, [[B, 3, 32, 32], []]); kernel("vectorized_elementwise_kernel<div>", e, 10)
e = op("aten::sub", 1, 31, 8); kernel("vectorized_elementwise_kernel<sub>", e, 10)
c2d = op("aten::conv2d", 1, 50, 30); op("aten::convolution", 1, 51, 28); op("aten::_convolution", 1, 52, 26)
e = op("aten::cudnn_convolution", 1, 53, 24, [[B, 3, 32, 32], [64, 3, 3, 3], [], [], []])
# its External id names an outer op, its launch call sits in cudnn_convolution: the inner one launched it
kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", c2d, 100, gap=5,
       link="both", at=60)
op("aten::batch_norm", 1, 90, 20); op("aten::_batch_norm_impl_index", 1, 91, 18)
e = op("aten::cudnn_batch_norm", 1, 92, 16); kernel("bn_fw_tr_1C11_kernel_NCHW", e, 50)
e = op("aten::add_", 1, 93, 3); kernel("vectorized_elementwise_kernel<add>", e, 2)  # num_batches_tracked, inside bn
e = op("aten::relu_", 1, 120, 10); kernel("vectorized_elementwise_kernel<relu>", e, 20, link="corr", at=125)
op("aten::adaptive_avg_pool2d", 1, 140, 10); e = op("aten::mean", 1, 141, 8, [[B, 64, 32, 32], [], []])
kernel("reduce_kernel<mean>", e, 30)
op("aten::linear", 1, 160, 20); op("aten::t", 1, 161, 2)
e = op("aten::addmm", 1, 164, 15, [[10], [B, 64], [64, 10], [], []]); kernel("sm90_xmma_gemm_bf16_tn", e, 10)
op("aten::cross_entropy_loss", 1, 190, 20); e = op("aten::_log_softmax", 1, 191, 8)
kernel("cunn_SoftMaxForward", e, 5); e = op("aten::nll_loss_forward", 1, 200, 8); kernel("nll_loss_forward_kernel", e, 5)
# backward, thread 2 (the autograd engine's device thread)
NODE = "autograd::engine::evaluate_function: "
op(NODE + "NllLossBackward0", 2, 300, 10); op("NllLossBackward0", 2, 301, 8)
e = op("aten::nll_loss_backward", 2, 302, 6); kernel("nll_loss_backward_kernel", e, 5, gap=40)
op(NODE + "AddmmBackward0", 2, 320, 40); op("AddmmBackward0", 2, 321, 38)
e = op("aten::mm", 2, 322, 10, [[B, 10], [10, 64]]); kernel("gemm_dgrad_like_name_free", e, 8)   # [B,in]: data_grad
e = op("aten::mm", 2, 335, 10, [[10, B], [B, 64]]); kernel("gemm_nn", e, 6)                     # k = B: weight_grad
e = op("aten::sum", 2, 347, 5, [[B, 10], [], []]); kernel("reduce_kernel<sum>", e, 2)           # bias: weight_grad
op(NODE + "AddmmBackward0", 2, 362, 7); op("AddmmBackward0", 2, 362.5, 6)  # a layer whose input needs no gradient
e = op("aten::mm", 2, 363, 5, [[10, B], [B, 64]]); kernel("gemm_nn", e, 3)                      # its only mm: weight
op(NODE + "CudnnBatchNormBackward0", 2, 370, 20); op("CudnnBatchNormBackward0", 2, 371, 18)
e = op("aten::cudnn_batch_norm_backward", 2, 372, 16); kernel("bn_bw_1C11_kernel_new", e, 60)
op(NODE + "ConvolutionBackward0", 2, 400, 40); op("ConvolutionBackward0", 2, 401, 38)
e = op("aten::convolution_backward", 2, 402, 36, [[B, 64, 32, 32], [B, 3, 32, 32], [64, 3, 3, 3]])
kernel("nhwcToNchwKernel", e, 4)                                            # helper: goes with the next: data
kernel("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc", e, 40)  # unnamed compute before wgrad: data
kernel("sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32", e, 30)             # weight
kernel("splitKreduce_kernel", e, 6)                                         # helper after: weight
kernel("Memset (Device)", e, 2, cat="gpu_memset")                           # memset: copies
op(NODE + "ConvolutionBackward0", 2, 450, 40); op("ConvolutionBackward0", 2, 451, 38)
e = op("aten::convolution_backward", 2, 452, 36, [[B, 64, 32, 32], [B, 64, 32, 32], [64, 64, 3, 3]])
kernel("cudnn::detail::dgrad_engine<float>", e, 20)
kernel("fft2d_r2c_32x32<float>", e, 10)                                     # unnamed compute after the dgrad: weight
# the optimizer, thread 1
op("rt:optimizer", 1, 500, 60, cat="user_annotation"); op("Optimizer.step#SGD.step", 1, 501, 58, cat="user_annotation")
e = op("aten::_foreach_add_", 1, 502, 20); kernel("multi_tensor_apply_kernel<add>", e, 25)
e = op("aten::_foreach_mul_", 1, 530, 20); kernel("multi_tensor_apply_kernel<mul>", e, 15)
e = op("aten::add_", 1, 552, 5); kernel("vectorized_elementwise_kernel<add>", e, 4)  # in the span: optimizer
# a copy back to the host, outside any span, and a kernel no op launched
e = op("aten::copy_", 1, 570, 10); kernel("Memcpy DtoH (Device -> Pinned)", e, 3, cat="gpu_memcpy")
kernel("mystery_kernel", 999999, 1)

expect_us = {"copies": 10 + 10 + 10 + 2 + 3, "conv_fwd": 100 + 10, "batchnorm": 50 + 2 + 60, "elementwise": 20,
             "pooling": 30, "loss": 5 + 5 + 5, "data_grad": 8 + 4 + 40 + 20, "weight_grad": 6 + 2 + 3 + 30 + 6 + 10,
             "optimizer": 25 + 15 + 4, "other": 1}
busy_us = sum(expect_us.values())
gaps_us = 5 + 40
assert abs(gpu_t[0] - 1000.0 - busy_us - gaps_us) < 1e-6, (gpu_t[0], busy_us, gaps_us)
wall_s = (busy_us + gaps_us + 100.0) * 1e-6   # 100 us of host time beyond the device's span
res = op_profile.from_chrome_trace({"traceEvents": ev}, 1, wall_s, B)
bad = []
for c, us in expect_us.items():
    if abs(res["categories"][c] - us / 1e3) > 1e-4:
        bad.append("%s: %.4f ms, expected %.4f" % (c, res["categories"][c], us / 1e3))
idle = (gaps_us + 100.0) / 1e3
if abs(res["categories"]["idle"] - idle) > 1e-4:
    bad.append("idle: %.4f ms, expected %.4f" % (res["categories"]["idle"], idle))
if abs(sum(res["categories"].values()) - res["step_ms"]) > 1e-3:
    bad.append("categories sum to %.4f, step %.4f" % (sum(res["categories"].values()), res["step_ms"]))
ops = {(o["op"], o["category"]): o for o in res["ops"]}
for k in (("cudnn_convolution", "conv_fwd"), ("convolution_backward", "data_grad"),
          ("convolution_backward", "weight_grad"), ("mm", "data_grad"), ("mm", "weight_grad"), ("relu_", "elementwise"),
          ("_foreach_add_", "optimizer")):
    k = ("aten::" + k[0], k[1])
    if k not in ops:
        bad.append("no op row %s" % (k,))
kb = res.get("kernels_by_category", {})
convs = [(k["kernel"], k["shape"]) for c in ("conv_fwd", "data_grad", "weight_grad") for k in kb.get(c, [])
         if "conv" in k["op"]]
if ("sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32", "in 8x3x32x32, w 64x3x3x3") not in convs:
    bad.append("the wgrad kernel with its shape is not among the convolution kernels: %s" % convs)
if not any("1 device event(s) outside the profiled steps" in n for n in res["notes"]):
    bad.append("no note on the warm-up kernel left out: %s" % res["notes"])
if not any("linked to no op" in n for n in res["notes"]):
    bad.append("no note on the kernel linked to no op: %s" % res["notes"])
if bad:
    print("\n".join(bad))
    sys.exit(1)
print("every category as expected, idle %.3f ms of %.3f" % (res["categories"]["idle"], res["step_ms"]))
EOF
rc=$?
if [ $rc = 0 ]; then ok "op_profile.py on a canned GPU trace: $(tail -n 1 "$T/canned.out")"
else fail "op_profile.py on a canned GPU trace:"; cat "$T/canned.out"; fi

# ==== 3. the profile part on the CPU, both sides for real =============================================
if [ $fails -gt 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
if ! /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
    echo "skip: parts 1 and 2 passed; no /usr/bin/python3 with torch and torchvision for part 3 (apt-get install python3-torch python3-torchvision)"
    exit 77
fi
if ! "$RT" train --help 2>&1 | grep -q -- '--profile-ops'; then
    echo "skip: parts 1 and 2 passed; $RT has no train --profile-ops yet: part 3 (its profile beside PyTorch's) cannot run"
    exit 77
fi
bash "$BENCH" --only profile --device cpu --models mnist-net --amps off --batch-size 16 --profile-steps 5 \
    --profile-warmup 2 --bin "$RT" --python /usr/bin/python3 --cache "$T/cpu" --profile-json "$T/cpu/profile.json" \
    >"$T/profile.out" 2>&1
rc=$?
if [ $rc != 0 ]; then
    fail "--only profile --device cpu exited $rc:"
    tail -n 30 "$T/profile.out"
    exit 1
fi
"$PY" - "$T/profile.out" "$T/cpu/profile.json" <<'EOF' || exit 1
import json, sys
out, doc = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
bad = []
def want(cond, what):
    if not cond:
        bad.append(what)
def isnum(s):
    try:
        float(s)
        return True
    except ValueError:
        return False
cats = ("conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling", "loss", "optimizer",
        "copies", "other", "idle")
for c in cats + ("step",):
    line = next((l for l in out.splitlines() if l.startswith("| %s |" % c)), None)
    cells = [x.strip() for x in line.strip("|").split("|")] if line else []
    want(len(cells) == 6 and isnum(cells[1]) and isnum(cells[2]) and isnum(cells[3]),
         "category row %s: %s" % (c, line))
want(any(l.startswith("largest differences: mnist-net fp32: ") and l.count(" ms") == 3 for l in out.splitlines()),
     "no largest-differences line naming three categories")
want(doc.get("profile_comparison") == 1 and isinstance(doc.get("gpu"), str) and isinstance(doc.get("host"), str)
     and len(doc.get("pairs", [])) == 1, "the JSON's top level: %s" % {k: doc.get(k) for k in ("profile_comparison", "gpu")})
p = doc["pairs"][0] if doc.get("pairs") else {}
want(set(("model", "amp", "batch", "ringtrain", "pytorch", "largest")) <= set(p), "pair keys: %s" % sorted(p))
want(p.get("model") == "mnist-net" and p.get("amp") == "off" and p.get("batch") == 16, "pair: %s" % p.get("model"))
for side in ("ringtrain", "pytorch"):
    s = p.get(side) or {}
    c = s.get("categories") or {}
    want(set(cats) <= set(c), "%s: categories %s" % (side, sorted(c)))
    step = s.get("step_ms")
    want(isinstance(step, (int, float)) and step > 0, "%s: step_ms %s" % (side, step))
    if c and isinstance(step, (int, float)):
        # The busy categories plus idle (wall - busy, never below 0): the step, or the busy time where the
        # profiler's events outlasted the wall clock (a loaded machine; op_profile.py notes it), plus any overlap.
        total = sum(c.get(k, 0) for k in cats)
        expect = max(step, s.get("busy_ms", step)) + s.get("overlap_ms", 0)
        want(abs(total - expect) <= 0.011 + 0.002 * expect,
             "%s: categories sum to %.4f, step_ms %.4f, busy_ms %s" % (side, total, step, s.get("busy_ms")))
    want(isinstance(s.get("ops"), list) and s["ops"] and all(set(("op", "category", "ms", "calls")) <= set(o)
                                                             for o in s["ops"]), "%s: ops" % side)
pt = p.get("pytorch") or {}
want((pt.get("categories") or {}).get("conv_fwd", 0) > 0, "PyTorch's conv_fwd is not > 0")
want(isinstance(pt.get("settings"), dict), "PyTorch's settings missing")
want(len(p.get("largest", [])) == 3 and all(set(("category", "ringtrain_ms", "pytorch_ms")) <= set(x)
                                             for x in p["largest"]), "largest: %s" % p.get("largest"))
if bad:
    print("FAIL: " + "\nFAIL: ".join(bad))
    sys.exit(1)
print("ok: the CPU profile's table and JSON (ringtrain step %.3f ms, PyTorch %.3f ms)"
      % (p["ringtrain"]["step_ms"], pt["step_ms"]))
EOF

# ==== 4. the folder part on the CPU: a tiny JPEG folder made, packed and trained from on both sides ===
folder_run() { # OUT: the folder part, 1 run, mnist-net at 32 px, 2 x 24 JPEGs, batch 16
    bash "$BENCH" --only folder --device cpu --folder-model mnist-net@32:16 --folder-classes 2 --folder-per-class 24 \
        --folder-seconds 0.3 --torch-workers 2 --folder-workers 2 --runs 1 --bin "$RT" --python /usr/bin/python3 \
        --cache "$T/folder" >"$1" 2>&1
}
folder_run "$T/folder1.out" || { fail "--only folder --device cpu exited $?:"; tail -n 30 "$T/folder1.out"; exit 1; }
folder_run "$T/folder2.out" || { fail "--only folder --device cpu (again) exited $?:"; tail -n 30 "$T/folder2.out"; exit 1; }
"$PY" - "$T/folder1.out" "$T/folder2.out" "$T/folder/folder.json" <<'EOF' || exit 1
import json, sys
out1, out2, doc = open(sys.argv[1]).read(), open(sys.argv[2]).read(), json.load(open(sys.argv[3]))
bad = []
def want(cond, what):
    if not cond:
        bad.append(what)
want("making " in out1 and "packing " in out1, "the first run did not make and pack the folder")
want("making " not in out2 and "packing " not in out2, "the second run did not reuse the folder and its pack")
for out in (out1, out2):
    rows = [l for l in out.splitlines() if l.startswith("| ")]
    want(any(l.startswith("| ringtrain (2 loader threads) |") for l in rows), "no ringtrain row")
    want(any(l.startswith("| PyTorch DataLoader num_workers 2 |") for l in rows), "no PyTorch row")
    want(any(l.startswith("| ringtrain's data wait <= 5 % of the step | ") and ("PASS" in l or "MISS" in l)
             for l in rows), "no data-wait goal")
    want(any(l.startswith("| ringtrain end to end >= 1.5x PyTorch + DataLoader") and ("PASS" in l or "MISS" in l)
             for l in rows), "no end-to-end goal")
recs = {r["way"]: r for r in doc.get("records", [])}
want(set(recs) == {"frt", "fpt-w2"}, "records: %s" % sorted(recs))
for w, r in recs.items():
    want(r.get("ips", 0) > 0 and 0 <= r.get("wait_frac", -1) <= 1 and r.get("batch") == 16, "%s: %s" % (w, r))
want(recs.get("frt", {}).get("timed_epochs", 0) >= 2 and recs.get("frt", {}).get("amp_reported") == "bf16",
     "ringtrain: fewer than 2 timed epochs, or not bf16: %s" % recs.get("frt"))
want(recs.get("fpt-w2", {}).get("timed_epochs", 0) >= 2, "PyTorch: fewer than 2 timed epochs")
want(doc.get("goals", {}).get("ratio", {}).get("result") in ("PASS", "MISS")
     and doc["goals"].get("wait", {}).get("result") in ("PASS", "MISS"), "goals: %s" % doc.get("goals"))
if bad:
    print("FAIL: " + "\nFAIL: ".join(bad))
    sys.exit(1)
print("ok: the folder part on the CPU (made, packed, reused; ringtrain %.0f images/s, PyTorch %.0f)"
      % (recs["frt"]["ips"], recs["fpt-w2"]["ips"]))
EOF
echo "all checks passed"
exit 0
