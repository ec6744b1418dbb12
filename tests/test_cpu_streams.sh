#!/usr/bin/env bash
# test_cpu_streams.sh - the stream protocol on the CPU backend's asynchronous
# streams (RINGTRAIN_CPU_STREAMS=async: compute, the input copies and the
# gradient buckets' all-reduces each on their own thread, ordered only by the
# events the code records and waits for). `ringtrain train` must give the
# same weights, bit for bit (the param digest), as the ordinary synchronous
# backend:
#   - one rank, real data through the loader and the copy stream: mnist-net
#     (dropout on a spatial tensor and on features) and resnet18 (batchnorm,
#     residual adds), with gradient accumulation;
#   - two ranks under mpirun: the gradient buckets' all-reduces on the comm
#     thread while backward is still queued, with small buckets and with no
#     overlap;
#   - a resume from a checkpoint written in the asynchronous mode.
# And that the asynchronous runs' steps never wait for the compute stream:
# `train --json` reports host_waits_per_step 0 (loss sums, the step profile
# and the other ranks' control words read a step late, the all-reduce waited
# for on the stream), at one and at two ranks, with clipping and with loss
# scaling (its overflow decided on the device, the host's verdict a step
# late, the digest the synchronous run's with two skipped updates); the counter
# itself is checked against a run that must wait (see `waits`). In fp32: the
# asynchronous streams queue the fp32 table only (no bf16 there).
# A wait left out anywhere (an input copy not waited for, a bucket reduced
# before backward wrote it) changes the digest; under ThreadSanitizer (CI's
# TSan build runs this script) it is also reported as a race.
# Usage: test_cpu_streams.sh path/to/ringtrain. RT_TEST_THREADS: compute threads of the one-rank runs (default 2;
# the TSan build uses 1: OpenMP's own synchronisation is invisible to ThreadSanitizer). Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_cpu_streams.sh path/to/ringtrain}
THREADS=${RT_TEST_THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
. "$HERE/train_lib.sh"
unset RINGTRAIN_CPU_STREAMS

# RT_TEST_SMALL=1 (the ThreadSanitizer build, ten times slower): fewer records, mnist-net only.
SMALL=${RT_TEST_SMALL:-0}
NTRAIN=1024
[ "$SMALL" = 1 ] && NTRAIN=384
PER_EPOCH=$((NTRAIN / 32))
"$RT" synth --format mnist --out "$W/src-mnist" --train $NTRAIN --test 256 --seed 5 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-mnist" --out "$W/mnist" >/dev/null || { echo "pack failed"; exit 1; }
"$RT" synth --format cifar10 --out "$W/src-cifar" --train 512 --test 128 --seed 6 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-cifar" --out "$W/cifar" >/dev/null || { echo "pack failed"; exit 1; }

digest() { sed -n 's/.*param digest: \([0-9a-f]*\).*/\1/p' "$1" | sort -u | tr '\n' ' ' | sed 's/ $//'; }

# same NAME CMD...: runs CMD synchronously and asynchronously; the digests must be equal (one per run).
same() {
    local name=$1
    shift
    RINGTRAIN_CPU_STREAMS=sync "$@" >"$W/$name.sync" 2>&1
    local rs=$?
    RINGTRAIN_CPU_STREAMS=async "$@" >"$W/$name.async" 2>&1
    local ra=$?
    local ds da
    ds=$(digest "$W/$name.sync")
    da=$(digest "$W/$name.async")
    if [ $rs -ne 0 ] || [ $ra -ne 0 ]; then
        fail "$name: exit $rs (sync), $ra (async)"
        tail -n 5 "$W/$name.sync" "$W/$name.async"
    elif ! grep -q "asynchronous streams (RINGTRAIN_CPU_STREAMS=async)" "$W/$name.async"; then
        fail "$name: the banner does not say the asynchronous streams are on"
        head -3 "$W/$name.async"
    elif [ -z "$ds" ] || [ "$ds" != "$da" ] || [ "${ds#* }" != "$ds" ]; then
        fail "$name: param digest '$ds' (sync) vs '$da' (async)"
    else
        pass "$name: same param digest $ds in both modes"
    fi
    waits "$name" 0
}

# waits NAME WANT: the asynchronous run's --json summary says host_waits_per_step WANT.
waits() {
    local got
    got=$(grep '^{' "$W/$1.async" | tail -n 1 | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("host_waits_per_step"))' 2>/dev/null)
    if "$PY" -c "import sys; sys.exit(0 if sys.argv[1] != 'None' and float(sys.argv[1]) == float(sys.argv[2]) else 1)" "$got" "$2" 2>/dev/null; then
        pass "$1: $got host waits per steady step in the asynchronous mode"
    else
        fail "$1: host_waits_per_step '$got', expected $2"
    fi
}

# --amp off: the asynchronous streams queue the fp32 table only, so both modes must train in fp32 (on a CPU with
# AVX512_BF16 the default would be bf16 in the synchronous mode).
COMMON=(--epochs 1 --no-progress --threads "$THREADS" --workers 2 --amp off --json)
same mnist-net "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --steps 12 --grad-accum 2 "${COMMON[@]}"
same mnist-net-clip "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --steps 8 --clip-grad-norm 0.5 \
    "${COMMON[@]}"
# Loss scaling decided on the device (unscale, the scale's update, the skipped update), with injected overflows.
same mnist-net-scaled env RINGTRAIN_TEST_OVERFLOW=2:2 "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 \
    --steps 10 --loss-scale dynamic "${COMMON[@]}"
grep -q "step 3: gradients overflowed at loss scale 32768: update skipped, scale now 16384" "$W/mnist-net-scaled.async" &&
    pass "mnist-net-scaled: the second injected overflow logged a step late with its scales" ||
    fail "mnist-net-scaled: no skip line for step 3: $(grep -i overflow "$W/mnist-net-scaled.async" | head -3)"
# --cuda-graph on: the asynchronous streams record each micro-batch's calls once per input buffer and replay them
# (the CUDA graph's twin); the weights must be the ordinary backend's, op by op, bit for bit, with dropout too
# (mnist-net: each replay draws its masks from the micro-batch's stream, written to the device before it).
graphs() {
    local got
    got=$(grep '^{' "$W/$1.async" | tail -n 1 | "$PY" -c 'import json,sys; g=json.load(sys.stdin)["cuda_graph"]; print(g["graphs"], g["replays"], g["why_not"])' 2>/dev/null)
    set -- "$1" "$2" $got
    if [ "${3:-0}" -ge 1 ] 2>/dev/null && [ "${4:-0}" -ge "$2" ] && [ "$5" = None ]; then
        pass "$1: $3 graphs captured, $4 micro-batches replayed"
    else
        fail "$1: graphs '${3:-}' replays '${4:-}' (want >= $2), why not: ${*:5}"
    fi
}
if [ "$SMALL" != 1 ]; then
    same resnet9-graph "$RT" train --data "$W/cifar" --model resnet9 --batch-size 8 --steps 8 --grad-accum 2 \
        --cuda-graph on "${COMMON[@]}"
    graphs resnet9-graph 8
fi
same mnist-net-graph "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --steps 8 --cuda-graph on \
    "${COMMON[@]}"
graphs mnist-net-graph 3
# The count's own check: a run told to wait for the stream before each micro-batch reports exactly that.
RINGTRAIN_CPU_STREAMS=async RINGTRAIN_TEST_HOST_WAIT=1 "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 \
    --steps 8 --grad-accum 2 "${COMMON[@]}" >"$W/forced.async" 2>&1
waits forced 2
[ "$SMALL" = 1 ] || same resnet18 "$RT" train --data "$W/cifar" --model resnet18 --batch-size 16 --steps 6 "${COMMON[@]}"

# Resume: a checkpoint written asynchronously, resumed asynchronously, equals an uninterrupted synchronous run.
RINGTRAIN_CPU_STREAMS=sync "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --epochs 2 --no-progress \
    --threads "$THREADS" --amp off >"$W/full.out" 2>&1
RINGTRAIN_CPU_STREAMS=async "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --epochs 2 --no-progress \
    --threads "$THREADS" --amp off --steps $((PER_EPOCH * 3 / 2)) --checkpoint-dir "$W/ck" >"$W/part.out" 2>&1
RINGTRAIN_CPU_STREAMS=async "$RT" train --data "$W/mnist" --model mnist-net --batch-size 32 --epochs 2 --no-progress \
    --threads "$THREADS" --amp off --checkpoint-dir "$W/ck" --resume >"$W/rest.out" 2>&1
d1=$(digest "$W/full.out")
d2=$(digest "$W/rest.out")
[ -n "$d1" ] && [ "$d1" = "$d2" ] && pass "resume in the asynchronous mode: digest $d2 = the uninterrupted run's" ||
    { fail "resume: '$d2' vs uninterrupted '$d1'"; tail -n 3 "$W/part.out" "$W/rest.out"; }

# Two ranks: the buckets' all-reduces on the comm thread while backward is queued on the compute thread.
# By name, not path: Open MPI takes its prefix from an absolute argv[0], and /bin/mpirun (a PATH with /bin
# first on a merged-/usr system) gives "/", which it refuses.
MPIRUN=$(command -v mpirun >/dev/null && echo mpirun)
if [ -n "$MPIRUN" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    MPI=("$MPIRUN" -np 2 --oversubscribe --bind-to none -x RINGTRAIN_CPU_STREAMS)
    R2=(--epochs 1 --no-progress --threads 1 --workers 1 --steps 6 --amp off --json)
    same np2-mnist-net "${MPI[@]}" "$RT" train --data "$W/mnist" --model mnist-net --batch-size 16 --bucket-cap-mb 0.05 "${R2[@]}"
    if [ "$SMALL" != 1 ]; then
        same np2-resnet18 "${MPI[@]}" "$RT" train --data "$W/cifar" --model resnet18 --batch-size 8 --bucket-cap-mb 1 "${R2[@]}"
        same np2-no-overlap "${MPI[@]}" "$RT" train --data "$W/cifar" --model resnet18 --batch-size 8 --no-overlap "${R2[@]}"
        # Graphs at two ranks (--cuda-graph on): the buckets' all-reduces start after each replayed backward.
        same np2-graph "${MPI[@]}" "$RT" train --data "$W/cifar" --model resnet9 --batch-size 8 --bucket-cap-mb 1 \
            --cuda-graph on "${R2[@]}" --steps 8
        graphs np2-graph 3
    else
        same np2-graph "${MPI[@]}" "$RT" train --data "$W/mnist" --model mnist-net --batch-size 16 --cuda-graph on \
            "${R2[@]}" --steps 8
        graphs np2-graph 3
    fi
else
    echo "skip two ranks: no mpirun"
fi

[ $fails -eq 0 ] && echo "all passed" && exit 0
echo "$fails failed"
exit 1
