#!/usr/bin/env bash
# test_gpu_train.sh - `ringtrain train --device cuda` learns, at every precision:
#   - mnist-net on a small MNIST-shaped synthetic set (tests/test_train.sh's
#     recipe) and wrn-10-1 (batch norm, residual adds) on a small CIFAR-shaped
#     one each reach a stated validation accuracy, with the default precision
#     (--amp not given: bf16 on a GPU that has it), --amp fp16 (dynamic loss
#     scaling) and --amp off (fp32);
#   - the run is on the GPU (its set-up line says "cuda: GPU ..."), and its
#     --json line says so ("device", when the line has that field) and names
#     the precision asked for ("amp", when the line has that field; the
#     default is expected to be bf16 from compute capability 8.0 on, off below);
#   - with --allreduce nccl the MNIST recipe reaches the same bound with its
#     gradients all-reduced through NCCL in a world of one (every update's
#     buckets counted), where the plain run reduces nothing;
#   - --cuda-graph on gives the weights of --cuda-graph off bit for bit, in
#     fp32 and the default precision, with graphs captured and replayed;
#   - a traced GPU run: the compute stream's per-layer spans from CUDA events
#     pass tools/check_trace.py (nesting, names) and lie inside the training
#     thread's steps (the anchor puts device times on the host clock), the
#     step profile's forward and backward are not zero, and where NVML is
#     there its counters are in the trace.
# Skips (77) when `ringtrain train --device cuda --steps 1 --synthetic-data`
# stops with "error: --device cuda: ..." (a build without CUDA, no driver, no
# usable GPU); any other failure of that probe fails the test.
# Usage: test_gpu_train.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_gpu_train.sh path/to/ringtrain}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
. "$HERE/train_lib.sh"

# First: the CUDA runtime, the driver it needs and the machine's driver (ringtrain --version's cuda line), so that a
# skip says why at once.
echo "test_gpu_train: $("$RT" --version 2>&1 | sed -n 's/^  cuda  *//p' | head -n 1)"
"$RT" train --device cuda --steps 1 --synthetic-data --no-progress >"$W/probe.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    if grep -q "error: --device cuda:" "$W/probe.out"; then
        echo "skip: no GPU for ringtrain: $(grep "error: --device cuda:" "$W/probe.out" | head -n 1)"
        exit 77
    fi
    echo "FAIL the GPU probe (train --device cuda --steps 1 --synthetic-data) exited $rc:"
    tail -n 20 "$W/probe.out"
    exit 1
fi
[ -n "$PY" ] || { echo "skip: no python3 to read the --json lines"; exit 77; }

# The default precision: bf16 where the GPU has it (sm_80 and later), fp32 below.
# Unknown (no sm_ in --version): the default's amp field is not checked.
sm=$("$RT" --version | sed -n 's/^  cuda .*(sm_\([0-9]*\)).*/\1/p' | head -n 1)
default_amp=
if [ -n "$sm" ]; then
    default_amp=off
    [ "$sm" -ge 80 ] && default_amp=bf16
fi
echo "$(grep -o 'cuda: GPU .*' "$W/probe.out" | head -n 1); default precision expected: ${default_amp:-unknown}"

# Small datasets, the same as test_train.sh's MNIST-shaped one.
"$RT" synth --format mnist --out "$W/src-mnist" --train 3000 --test 1000 --seed 3 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-mnist" --out "$W/mnist" >/dev/null || { echo "pack failed"; exit 1; }
"$RT" synth --format cifar10 --out "$W/src-cifar" --train 4096 --test 1024 --seed 5 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-cifar" --out "$W/cifar" >/dev/null || { echo "pack failed"; exit 1; }

# The recipes and their bounds. On the CPU backend (2 threads) the same
# recipes reached, with seeds 0..3 (the runs below take seed 0, the default):
#   mnist-net  0.945, 0.954, 0.973, 0.956  (test_train.sh asserts 0.90 for seed 0)
#   wrn-10-1   0.965, 0.976, 0.981, 0.976
# A GPU run is another rounding of the same sums (cuDNN's algorithms, and
# bf16/fp16 products with fp32 accumulation), so it follows a trajectory of
# its own, much as another seed does; the seeds spread over up to 3 points. Both
# bounds sit ~4.5 points under the lowest seed: a run that learns as on the
# CPU clears them, while a broken precision path (no loss scaling, wrong
# gradients, a cast lost) ends near chance (0.10) or well below.
MNIST=(--data "$W/mnist" --model mnist-net --epochs 3 --batch-size 64 --lr 0.05)
MNIST_MIN=0.90
WRN=(--data "$W/cifar" --model wrn-10-1 --epochs 8 --batch-size 64 --lr 0.1 --schedule onecycle --nesterov
    --label-smoothing 0.1)
WRN_MIN=0.92

# check NAME BOUND AMP(default|off|bf16|fp16) ringtrain-options...
check() {
    local name=$1 bound=$2 amp=$3 want out=$W/$1-$3.out
    shift 3
    local extra=()
    [ "$amp" = default ] || extra=(--amp "$amp")
    want=$amp
    [ "$amp" = default ] && want=$default_amp
    "$RT" train "$@" --device cuda "${extra[@]}" --no-progress --json >"$out" 2>&1
    local rc=$? acc dev jamp
    acc=$(jfield "$out" val_acc || echo 0)
    if [ $rc -eq 0 ] && "$PY" -c "import sys; sys.exit(0 if float('$acc') >= $bound else 1)" 2>/dev/null; then
        pass "$name --amp $amp: validation accuracy $acc (>= $bound)"
    else
        fail "$name --amp $amp: rc=$rc val_acc=$acc (bound $bound)"
        tail -n 15 "$out"
        return
    fi
    grep -q "^ringtrain train: world 1 .*, cuda: GPU" "$out" && pass "$name --amp $amp: trained on the GPU" \
        || fail "$name --amp $amp: set-up line does not name the GPU: $(grep '^ringtrain train:' "$out")"
    dev=$(jfield "$out" device)
    if [ -n "$dev" ]; then
        [ "$dev" = cuda ] && pass "$name --amp $amp: --json says device cuda" || fail "$name --amp $amp: --json device '$dev'"
    fi
    jamp=$(jfield "$out" amp)
    if [ -n "$jamp" ] && [ -n "$want" ]; then
        [ "$jamp" = "$want" ] && pass "$name --amp $amp: --json says amp $jamp" \
            || fail "$name --amp $amp: --json amp '$jamp', expected '$want'"
    else
        if [ -n "$jamp" ]; then
            echo "note $name --amp $amp: --json says amp $jamp; not checked (no sm_ in ringtrain --version)"
        else
            echo "note $name --amp $amp: no amp field in the --json line; precision not checked"
        fi
    fi
}

for amp in default fp16 off; do
    check mnist-net "$MNIST_MIN" "$amp" "${MNIST[@]}"
    check wrn-10-1 "$WRN_MIN" "$amp" "${WRN[@]}"
done

# One GPU through NCCL (--allreduce nccl: a world of one set up in-process, no MPI): the MNIST recipe reaches the
# plain run's bound, the banner names the communicator, and every update's buckets went through NCCL
# (bucket_allreduces = buckets x steps in the --json line, where the plain run, which reduces nothing, counts 0).
out=$W/mnist-net-nccl.out
"$RT" train "${MNIST[@]}" --device cuda --allreduce nccl --no-progress --json >"$out" 2>&1
rc=$?
acc=$(jfield "$out" val_acc || echo 0)
nb=$(jfield "$out" buckets || echo 0); st=$(jfield "$out" steps || echo 0); ar=$(jfield "$out" bucket_allreduces || echo x)
if [ $rc -eq 0 ] && "$PY" -c "import sys; sys.exit(0 if float('$acc') >= $MNIST_MIN else 1)" 2>/dev/null; then
    pass "mnist-net --allreduce nccl: validation accuracy $acc (>= $MNIST_MIN)"
else
    fail "mnist-net --allreduce nccl: rc=$rc val_acc=$acc (bound $MNIST_MIN)"
    tail -n 15 "$out"
fi
grep -q "^  gradients NCCL .* on GPU [0-9]*, transport: none (one rank" "$out" \
    && pass "mnist-net --allreduce nccl: $(grep -o 'gradients NCCL.*' "$out")" \
    || fail "mnist-net --allreduce nccl: no NCCL line in the banner: $(grep -E 'gradients|NCCL|error' "$out" | head -3)"
[ "$st" -gt 0 ] 2>/dev/null && [ "$nb" -gt 0 ] && [ "$ar" = $((nb * st)) ] \
    && pass "mnist-net --allreduce nccl: $ar bucket all-reduces through NCCL ($nb buckets x $st steps)" \
    || fail "mnist-net --allreduce nccl: bucket_allreduces '$ar', expected buckets ($nb) x steps ($st)"
plain=$(jfield "$W/mnist-net-default.out" bucket_allreduces || echo x)
[ "$plain" = 0 ] && pass "mnist-net without --allreduce: no bucket all-reduce (one process)" \
    || fail "mnist-net without --allreduce: bucket_allreduces '$plain', expected 0"

# fp16 loss scaling with injected overflows (RINGTRAIN_TEST_OVERFLOW=STEP:COUNT puts an Inf into the first
# gradient after the all-reduce of updates STEP..STEP+COUNT-1). What is checked is what was injected, not a count a
# correct run can change: at the initial scale of 65536 a natural overflow is possible (resnet18's largest weight
# gradient at initialisation, scaled, is above fp16's 65504; test_cuda_ops --stand-in prints it), and it is a skip
# like any other. So: each injected update (2, 3, 4) is skipped and logged; every skip halves the scale, and each
# skip line's scale is the one the skip before left (no growth in 10 steps: growth comes after 2000); updates +
# skips = 10; the --json line's skipped_steps counts the lines. Natural skips are named, not failed.
RINGTRAIN_TEST_OVERFLOW=2:3 "$RT" train --device cuda --amp fp16 --synthetic-data --model resnet9 --batch-size 64 \
    --steps 10 --no-progress --json >"$W/ovf.out" 2>&1
rc=$?
"$PY" - "$W/ovf.out" "$rc" >"$W/ovf.chk" 2>&1 <<'PYEOF'
import json, re, sys
out, rc = open(sys.argv[1]).read(), int(sys.argv[2])
assert rc == 0, f"exit {rc}: {out[-800:]}"
skips = [(int(a), float(b), float(c)) for a, b, c in
         re.findall(r"step (\d+): gradients overflowed at loss scale ([0-9.e+]+): update skipped, scale now ([0-9.e+]+)", out)]
j = [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]
steps = [s for s, _, _ in skips]
for want in (2, 3, 4):
    assert want in steps, f"injected update {want} not skipped: skip lines at {steps}"
scale = 65536.0
for s, used, now in skips:
    assert used == scale, f"step {s} skipped at scale {used}, but the scale then was {scale}"
    assert now == used / 2, f"step {s}: scale {used} backed off to {now}, not {used / 2}"
    scale = now
assert j["skipped_steps"] == len(skips), f"skipped_steps {j['skipped_steps']}, {len(skips)} skip lines"
assert j["optimizer_updates"] + j["skipped_steps"] == 10, f"{j['optimizer_updates']} updates + {j['skipped_steps']} skips"
natural = [s for s in steps if s not in (2, 3, 4)]
print(f"injected updates 2-4 skipped and logged, the scale halved at each of {len(skips)} skips to {scale:g}, "
      f"{j['optimizer_updates']} of 10 updates applied" + (f"; natural overflows at updates {natural}" if natural else ""))
PYEOF
[ $? -eq 0 ] && pass "fp16: $(tail -n 1 "$W/ovf.chk")" || fail "fp16 overflow: $(tail -n 3 "$W/ovf.chk")"
RINGTRAIN_TEST_OVERFLOW=0:1000 "$RT" train --device cuda --amp fp16 --synthetic-data --model resnet9 --batch-size 64 \
    --steps 30 --max-skipped-steps 5 --no-progress >"$W/ovf2.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "error: 5 optimizer steps in a row overflowed.*first non-finite tensor: [a-z0-9_.]*weight gradient" "$W/ovf2.out" \
    && pass "fp16: 5 overflows in a row stop the run naming the tensor" || fail "fp16 skip limit: rc=$rc $(tail -2 "$W/ovf2.out")"

# --cuda-graph: each micro-batch captured once after the warm-up and replayed gives the weights of the run op by op,
# bit for bit (deterministic cuDNN algorithms, the default), in fp32 and in the default precision; a host wait in
# the captured step would have failed the capture (CUDA rejects it), and the summary counts the replays.
for amp in off auto; do
    for g in off on; do
        "$RT" train --device cuda --synthetic-data --model resnet9 --batch-size 64 --steps 10 --amp $amp \
            --cuda-graph $g --json --no-progress >"$W/graph-$amp-$g.out" 2>&1
    done
    d0=$(grep -o 'param digest: [0-9a-f]*' "$W/graph-$amp-off.out"); d1=$(grep -o 'param digest: [0-9a-f]*' "$W/graph-$amp-on.out")
    gr=$("$PY" -c 'import json,sys; g=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["cuda_graph"]; print(g["graphs"], g["replays"], g["why_not"])' "$W/graph-$amp-on.out" 2>&1)
    set -- $gr
    if [ -n "$d0" ] && [ "$d0" = "$d1" ] && [ "${1:-0}" -ge 1 ] 2>/dev/null && [ "${2:-0}" -ge 5 ] && [ "${3:-}" = None ]; then
        pass "--cuda-graph, --amp $amp: $1 graph(s), $2 replays, the same $d1 as op by op"
    else
        fail "--cuda-graph, --amp $amp: '$d1' vs op by op '$d0'; graphs/replays/why: $gr $(grep -i 'error\|graph' "$W/graph-$amp-on.out" | head -3)"
    fi
done

# A traced run on the GPU: device spans from CUDA events, placed on the host's clock (op by op: a graph has no
# per-layer marks).
"$RT" train --device cuda --synthetic-data --model resnet9 --batch-size 64 --steps 12 --trace "$W/gpu.json" \
    --trace-steps 4:10 --json --no-progress --cuda-graph off >"$W/trace.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && "$PY" "$HERE/../tools/check_trace.py" "$W/gpu.json" --ranks 1 --require '^fwd ' --require '^bwd ' \
    --require '^optimizer$' --require-track '^compute stream$' >"$W/trace.chk" 2>&1; then
    pass "a traced GPU run: $(tail -n 1 "$W/trace.chk")"
else
    fail "a traced GPU run: rc=$rc $(tail -n 3 "$W/trace.chk" "$W/trace.out" 2>/dev/null)"
fi
"$PY" - "$W/gpu.json" "$W/trace.out" >"$W/trace.inside" 2>&1 <<'PYEOF'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
tid = {e["args"]["name"]: e["tid"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X" and e["tid"] == tid["training"] and e["name"].startswith("step ")]
dev = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X" and e["tid"] == tid["compute stream"]]
# Each device span inside some step, give or take 50 us for the anchor.
out = [d for d in dev if not any(s0 - 50 <= d[0] and d[1] <= s1 + 50 for s0, s1 in steps)]
assert dev and not out, f"{len(out)} of {len(dev)} device spans outside the steps"
prof = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]["profile"]["phases"]
assert prof["forward"]["p50_ms"] > 0 and prof["backward"]["p50_ms"] > 0, prof
print(f"{len(dev)} device spans inside {len(steps)} steps; forward {prof['forward']['p50_ms']:.2f} ms, backward {prof['backward']['p50_ms']:.2f} ms")
PYEOF
[ $? -eq 0 ] && pass "the GPU trace's device spans: $(tail -n 1 "$W/trace.inside")" || fail "the GPU trace: $(tail -n 2 "$W/trace.inside")"
if grep -q '"gpu utilisation %"' "$W/gpu.json"; then
    pass "NVML's counters are in the trace"
else
    echo "note: no NVML counters in the trace (no libnvidia-ml.so.1 here, or a short run)"
fi

[ $fails -eq 0 ] && echo "all GPU train checks passed" || echo "$fails GPU train check(s) failed"
[ $fails -eq 0 ]
