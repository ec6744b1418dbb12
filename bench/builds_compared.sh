#!/usr/bin/env bash
# builds_compared.sh - two builds of ringtrain against each other on the same
# work, alternated, medians and their ratio: did a change make training
# slower? (tools/dev/compare_digests.sh says whether it trains the same thing.)
#   bench/builds_compared.sh --old PATH --new PATH [--models LIST] [--runs R]
#                            [--steps N] [--batch-size B] [--threads T]
#                            [--np N] [--ddp-model M] [--ddp-steps N]
# Two parts, each way alternated RUNS times with the other (the build that
# goes first swaps every run; these machines swing +-25 % between runs):
#   compute   `train --synthetic-data --model M --steps N+3 --json` on one
#             rank, for each model: steady_images_per_s (the steps after the
#             first 3), fp32 on the CPU.
#   ddp       `mpirun -np N --bind-to none train --synthetic-data --model M
#             --threads 1 --steps N+3 --json`: rank 0's global
#             steady_images_per_s and exposed_comm_frac (--np 1 skips it).
# Prints the median of each and new / old; a ratio below 0.95 is flagged.
# Options:
#   --old PATH, --new PATH  the two ringtrain binaries (required)
#   --models LIST     compute models (default resnet9,mnist-net,wrn-16-4)
#   --runs R          rounds of both builds (default 5)
#   --steps N         timed steps of the compute runs (default 20)
#   --batch-size B    per rank (default 64)
#   --threads T       compute threads of the one-rank runs (default: nproc)
#   --np N            ranks of the ddp part (default 2; 1: no ddp part)
#   --ddp-model M     (default resnet18)
#   --ddp-steps N     timed steps of the ddp runs (default 20)
# Exits 1 when a run fails (its output is shown), 2 on bad usage.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_name=builds_compared.sh
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

OLD= NEW= MODELS=resnet9,mnist-net,wrn-16-4 RUNS=5 STEPS=20 BATCH=64 THREADS=$(nproc) NP=2 DDP_MODEL=resnet18
DDP_STEPS=20
bench_options --old=OLD --new=NEW --models=MODELS --runs=RUNS --steps=STEPS --batch-size=BATCH \
    --threads=THREADS --np=NP --ddp-model=DDP_MODEL --ddp-steps=DDP_STEPS -- "$@"
bench_posint "$RUNS" "$STEPS" "$BATCH" "$THREADS" "$NP" "$DDP_STEPS"
for b in "$OLD" "$NEW"; do
    [ -n "$b" ] && [ -x "$b" ] || bench_fail "--old and --new must name ringtrain binaries"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

bench_machine
echo "old:      $OLD ($("$OLD" --version 2>/dev/null | head -n 1))"
echo "new:      $NEW ($("$NEW" --version 2>/dev/null | head -n 1))"
echo

# one BUILD OUT ARGS...: one run, its JSON summary in OUT; exits 1 showing the output on failure.
one() {
    local bin=$1 out=$2
    shift 2
    if ! "$@" >"$out" 2>"$out.err" || [ -z "$(bench_json_field "$PY" "$out" steady_images_per_s)" ]; then
        echo "$bench_name: a run of $bin failed:" >&2
        tail -n 20 "$out" "$out.err" >&2
        exit 1
    fi
}

# median OUTS KEY: the median of KEY over the JSON summaries OUTS (a glob).
median() {
    for f in $1; do bench_json_field "$PY" "$f" "$2"; done | bench_median
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { r = b / a; printf "%.3f%s", r, r < 0.95 ? "  (slower)" : "" }'; }

# Both builds in fp32: a build from before the CPU's bf16 table trains fp32 under the default --amp auto, a later
# one bf16 on a CPU with AVX512_BF16; --amp off (which every build accepts) compares like with like.
AMP=(--amp off)
echo "compute: train --synthetic-data, 1 rank, batch $BATCH, $THREADS threads, $STEPS timed steps, $RUNS runs each"
printf "  %-12s %14s %14s %10s\n" model "old img/s" "new img/s" "new/old"
for m in ${MODELS//,/ }; do
    for r in $(seq 1 "$RUNS"); do
        for side in $(bench_order "$r" old new); do
            bin=$OLD
            [ "$side" = new ] && bin=$NEW
            one "$bin" "$W/c-$m-$side-$r" "$bin" train --synthetic-data --model "$m" --batch-size "$BATCH" \
                --threads "$THREADS" --steps $((STEPS + 3)) --json --no-progress "${AMP[@]}"
        done
    done
    o=$(median "$W/c-$m-old-*[0-9]" steady_images_per_s)
    n=$(median "$W/c-$m-new-*[0-9]" steady_images_per_s)
    printf "  %-12s %14.1f %14.1f %10s\n" "$m" "$o" "$n" "$(ratio "$o" "$n")"
done

if [ "$NP" -gt 1 ]; then
    echo
    echo "ddp: mpirun -np $NP, $DDP_MODEL, batch $BATCH per rank, 1 thread per rank, $DDP_STEPS timed steps, $RUNS runs each"
    for r in $(seq 1 "$RUNS"); do
        for side in $(bench_order "$r" old new); do
            bin=$OLD
            [ "$side" = new ] && bin=$NEW
            one "$bin" "$W/d-$side-$r" mpirun --oversubscribe --bind-to none -np "$NP" "$bin" train --synthetic-data \
                --model "$DDP_MODEL" --batch-size "$BATCH" --threads 1 --steps $((DDP_STEPS + 3)) --json --no-progress \
                "${AMP[@]}"
        done
    done
    o=$(median "$W/d-old-*[0-9]" steady_images_per_s)
    n=$(median "$W/d-new-*[0-9]" steady_images_per_s)
    oc=$(median "$W/d-old-*[0-9]" exposed_comm_frac)
    nc=$(median "$W/d-new-*[0-9]" exposed_comm_frac)
    printf "  %-12s %14s %14s %10s\n" "" old new new/old
    printf "  %-12s %14.1f %14.1f %10s\n" "img/s" "$o" "$n" "$(ratio "$o" "$n")"
    printf "  %-12s %13.1f%% %13.1f%%\n" "exposed comm" "$(awk -v x="$oc" 'BEGIN{print 100*x}')" \
        "$(awk -v x="$nc" 'BEGIN{print 100*x}')"
fi
