#!/usr/bin/env bash
# gen_report_fixtures.sh [RINGTRAIN] - remakes tests/fixtures/report/: what real runs write, kept small, for
# tests/test_report_inputs.sh (`ringtrain report` over every kind of input, in every build, ASan's included):
#   run-a/   2 ranks (mpirun), mnist-net, 3 epochs of 512 synthetic MNIST images: --metrics, --json output,
#            the checkpoint's state.json (the weights left out) and a --trace of optimizer steps 3:5
#   run-b/   1 rank, 2 epochs, another --lr, --loss-scale dynamic (the loss scale in each record)
#   loadbench.out   loadbench --json over 1 and 2 workers (its output; the JSON is the last line)
#   commbench.json  commbench --json, 2 ranks, 1 KiB to 256 KiB
#   scaling.json    bench/scaling.sh --json, 1 and 2 ranks, 3 steps (a few minutes)
# Needs mpirun; as root it sets OMPI_ALLOW_RUN_AS_ROOT*. The numbers differ from run to run: the test reads
# the fixtures' own values, never constants.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
RT=$(realpath "${1:-$top/build/ringtrain}")
out=$top/tests/fixtures/report
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$RT" synth --format mnist --out src --train 512 --test 128 --seed 5 >/dev/null
"$RT" pack src --out mnist >/dev/null
T=(train --data mnist --model mnist-net --batch-size 32 --threads 1 --no-progress)
mkdir run-a run-b
mpirun -np 2 --oversubscribe --bind-to none "$RT" "${T[@]}" --epochs 3 --lr 0.05 --metrics run-a/metrics.jsonl \
    --checkpoint-dir run-a/checkpoint --trace run-a/trace.json --trace-steps 3:5 --json >run-a/train.out
"$RT" "${T[@]}" --epochs 2 --lr 0.02 --loss-scale dynamic --metrics run-b/metrics.jsonl \
    --checkpoint-dir run-b/checkpoint --json >run-b/train.out
rm -f run-a/checkpoint/*.safetensors run-b/checkpoint/*.safetensors
"$RT" loadbench mnist --batch-size 64 --workers 1,2 --epochs 1 --json >loadbench.out
mpirun -np 2 --oversubscribe --bind-to none "$RT" commbench --min-bytes 1K --max-bytes 256K --factor 4 --warmup 1 \
    --iters 3 --json commbench.json >/dev/null
"$top/bench/scaling.sh" --bin "$RT" --ranks 1,2 --steps 3 --repeats 1 --json scaling.json >/dev/null
rm -rf "$out"
mkdir -p "$out"
cp -r run-a run-b loadbench.out commbench.json scaling.json "$out/"
echo "gen_report_fixtures: $out ($(du -sh "$out" | cut -f1))"
