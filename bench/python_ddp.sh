#!/usr/bin/env bash
# python_ddp.sh - the converted ResNet-18 DDP example
# (python/examples/cifar10_resnet18_ddp.py) with its input pipeline both ways,
# N ranks on this machine through torchrun (gloo, on the CPU), side by side:
#   bench/python_ddp.sh [--build DIR] [--data DIR] [--np N] [--batch-size B]
#                       [--steps S] [--epochs E] [--workers W] [--runs R]
#                       [--synth-train N]
#   --loader ringtrain  ringtrain.Loader (the C loader's crop + flip, its
#                       share of each epoch per rank)
#   --loader torch      torchvision CIFAR10 + DistributedSampler + DataLoader
#                       (RandomCrop, RandomHorizontalFlip, ToTensor, Normalize)
# Same model (the CIFAR variant of ResNet-18), SGD, batch, steps and workers
# both ways. Alternated RUNS times (the way that goes first swaps every run;
# these machines swing +-25 % between runs); from each run rank 0's JSON line:
# the last epoch's time (the first one carries the start of the loader's
# workers and is shown on its own), its images/s, and the share of the step
# spent waiting for data (time blocked in next() over the step time) on rank
# 0 and on the rank that waited most. Medians printed, min - max beside them.
# Options:
#   --build DIR       the build holding python/ringtrain (default build);
#                     the example runs with PYTHONPATH=DIR/python
#   --data DIR        the synthetic CIFAR-10 in both layouts, DIR/packed and
#                     DIR/torchvision (default data/bench-python, shared with
#                     python_loader.py); made with the example's --prepare
#                     when absent and kept
#   --np N            ranks (default 2)
#   --batch-size B    images per step per rank (default 32)
#   --steps S         training steps per epoch (default 10)
#   --epochs E        epochs per run, at least 2 (default 2)
#   --workers W       loader workers per rank, both ways: ringtrain threads,
#                     DataLoader processes (default 2, the example's)
#   --runs R          rounds of both ways (default 3)
#   --synth-train N   training records when the data is made (default 50000)
# Needs /usr/bin/python3 with torch (gloo) + torchvision and the ringtrain
# package built (it says how). About 4 minutes on 2 quiet cores with the
# defaults.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
BUILD=$top/build
DATA=$top/data/bench-python
NP=2
B=32
STEPS=10
EPOCHS=2
WORKERS=2
RUNS=3
SYNTH_TRAIN=50000
PY=/usr/bin/python3
EXAMPLE=$top/python/examples/cifar10_resnet18_ddp.py

bench_options --build=BUILD --data=DATA --np=NP --batch-size=B --steps=STEPS --epochs=EPOCHS \
    --workers=WORKERS --runs=RUNS --synth-train=SYNTH_TRAIN -- "$@"
bench_posint "$NP" "$B" "$STEPS" "$EPOCHS" "$WORKERS" "$RUNS" "$SYNTH_TRAIN"
[ "$EPOCHS" -ge 2 ] || bench_fail "--epochs must be at least 2 (the first epoch is the start-up's)"

# --- prerequisites -----------------------------------------------------------
bench_sudo
bench_need_torch "PyTorch (with gloo) for $PY is missing or broken" "$PY" "$top/bench/torch_ddp.py" --check
[ -f "$EXAMPLE" ] || bench_fail "no $EXAMPLE"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
if ! rt_version=$("$PY" -c 'import ringtrain; print(ringtrain.__version__, ringtrain.__file__)' 2>&1); then
    echo "python_ddp: the ringtrain package does not import from $BUILD/python ($(echo "$rt_version" | tail -n 1));" >&2
    echo "  build it (needs python3-dev): cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2
    exit 2
fi

# --- dataset -----------------------------------------------------------------
packed=$DATA/packed
tvroot=$DATA/torchvision
if [ ! -f "$packed/manifest.json" ] || [ ! -f "$tvroot/cifar-10-batches-py/batches.meta" ]; then
    echo "making $DATA (the example's --prepare: ringtrain.synth + ringtrain.pack, torchvision's pickles)"
    "$PY" "$EXAMPLE" --prepare "$DATA" --synth-train "$SYNTH_TRAIN" --synth-test $((SYNTH_TRAIN / 5)) >/dev/null
fi

bench_scratch rt-pyddp
# Both ways read from the page cache: warm it once up front.
cat "$packed"/* "$tvroot"/cifar-10-batches-py/* >/dev/null 2>&1 || true

# --- the report helper: parses each result line, prints the table at the end --
bench_report_helper "$t/report.py" <<'EOF'
WAY = {"ringtrain": "ringtrain.Loader", "torch": "DataLoader (torchvision CIFAR10)"}

def add(results, way, run, np_, path):
    """Appends rank 0's summary of one run to results; 0 when it holds what is needed."""
    r = last_json(path)
    label = "%-34s" % ("--loader " + way)
    if r is None or not isinstance(r.get("epoch_time_s"), list) or len(r["epoch_time_s"]) < 2:
        print("  %s FAILED: no JSON line with 2 or more epoch times in its output" % label)
        return 1
    if r.get("world_size") != int(np_):
        print("  %s FAILED: world_size %s in its JSON line, %s ranks started" % (label, r.get("world_size"), np_))
        return 1
    digests = set(r.get("param_digests") or [])
    if len(digests) != 1:
        print("  %s FAILED: the ranks' parameters differ at the end (digests %s)" % (label, sorted(digests)))
        return 1
    last = r["epochs"][-1]
    shares = [s for s in r.get("data_wait_share_per_rank") or [] if isnum(s)] or [r["data_wait_share"]]
    rec = {"way": way, "run": int(run), "epoch_s": r["epoch_time_s"][-1], "first_s": r["epoch_time_s"][0],
           "ips": last["images_per_s"], "wait0": r["data_wait_share"], "wait_max": max(shares),
           "steps": last["steps"], "threads": r.get("threads"), "loss": r.get("final_loss")}
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print("  %s last epoch %6.2f s (%d steps, %5.1f img/s), first %6.2f s, data wait %4.1f %% of the step "
          "(rank 0; most %4.1f %%)" % (label, rec["epoch_s"], rec["steps"], rec["ips"], rec["first_s"],
                                       100 * rec["wait0"], 100 * rec["wait_max"]))
    return 0

def table(results, runs):
    rs = load(results)
    print("| loader | epoch time s (median) | min - max | first epoch s | images/s | data wait, rank 0 "
          "| min - max | data wait, most-waiting rank | runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for way in ("ringtrain", "torch"):
        xs = [r for r in rs if r["way"] == way]
        if not xs:
            print("| %s | n/a | | | | | | | 0 |" % WAY[way])
            continue
        e, elo, ehi = med_lo_hi([r["epoch_s"] for r in xs])
        w, wlo, whi = med_lo_hi([r["wait0"] for r in xs])
        med[way] = e
        print("| %s | %.2f | %.2f - %.2f | %.2f | %.1f | %.1f %% | %.1f - %.1f %% | %.1f %% | %d |" % (
            WAY[way], e, elo, ehi, statistics.median(r["first_s"] for r in xs),
            statistics.median(r["ips"] for r in xs), 100 * w, 100 * wlo, 100 * whi,
            100 * statistics.median(r["wait_max"] for r in xs), len(xs)))
    print()
    if len(med) == 2:
        print("epoch time, --loader torch / --loader ringtrain: %.2fx" % (med["torch"] / med["ringtrain"]))
    return 0

if __name__ == "__main__":
    main({"add": add, "table": table})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
cmd_way() { # ringtrain|torch
    local data=$packed
    [ "$1" = ringtrain ] || data=$tvroot
    # A rendezvous on a free port (torch 1.13's --standalone always takes 29400) and --redirects
    # 9:1 --tee 9:1 (torch 1.13 on Python 3.11 fails at their defaults), as ddp_vs_pytorch.sh.
    cmd=("$PY" -m torch.distributed.run --nnodes 1 --nproc_per_node "$NP"
        --rdzv_backend c10d --rdzv_endpoint "localhost:$(free_port)" --rdzv_id "pyddp-bench-$$-$RANDOM"
        --redirects 9:1 --tee 9:1
        "$EXAMPLE" --loader "$1" --data "$data" --device cpu --epochs "$EPOCHS" --batch-size "$B"
        --steps "$STEPS" --val-steps 2 --workers "$WORKERS" --json)
}

echo "== the ResNet-18 DDP example: --loader ringtrain vs --loader torch, $NP ranks, gloo on the CPU =="
bench_machine
if [ "$NP" -gt "$(nproc)" ]; then
    echo "          NOTE: $NP ranks > $(nproc) CPUs: ranks share cores"
fi
echo "software: ringtrain $rt_version; $torch_versions"
echo "dataset:  $packed (ringtrain) and $tvroot/cifar-10-batches-py (torch): the same synthetic records"
echo "settings: ResNet-18 (CIFAR variant), batch $B per rank, $STEPS steps per epoch, $EPOCHS epochs (the last"
echo "          is reported), $WORKERS loader workers per rank, torchrun's 1 compute thread per rank,"
echo "          2 validation batches per epoch (not timed); $RUNS runs alternated"
echo "commands:"
cmd_way ringtrain && echo "  PYTHONPATH=$PYTHONPATH ${cmd[*]}"
cmd_way torch && echo "  PYTHONPATH=$PYTHONPATH ${cmd[*]}"

fails=0
measure() { # way run
    # shellcheck disable=SC2034 # wall: the example times its own epochs
    local rc wall out=$t/$1.out err=$t/$1.err
    bench_run "$out" "$err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$NP" "$out" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_rank_failure "$rc" "$err"
    fi
}
for i in $(seq "$RUNS"); do
    echo "run $i/$RUNS"
    for w in $(bench_order "$i" ringtrain torch); do
        cmd_way "$w"
        measure "$w" "$i"
    done
done

echo
echo "Medians of $RUNS runs: ResNet-18 (CIFAR variant), $NP ranks x batch $B, $STEPS steps per epoch, $WORKERS"
echo "loader workers per rank, $(nproc) CPUs (${cpu:-unknown CPU}). Epoch time: the last epoch's training"
echo "steps (validation excluded); data wait: time blocked in the loader's next() over the step time."
echo
report table "$t/results.jsonl" "$RUNS"
bench_finish $fails
