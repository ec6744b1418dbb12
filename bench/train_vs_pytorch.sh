#!/usr/bin/env bash
# train_vs_pytorch.sh - ringtrain's training speed against PyTorch's on one
# machine, side by side, fp32, CPU, same batch, same thread count.
#   bench/train_vs_pytorch.sh [--bin PATH] [--models LIST] [--runs R]
#                             [--batch-size B] [--threads T] [--steps-scale F]
#                             [--data DIR] [--tta-model M] [--target A]
#                             [--epochs E] [--only compute|tta]
# Two parts, each way alternated RUNS times with the other (these machines
# swing +-25 % between runs; the way that goes first swaps every run), medians
# printed with PASS/MISS against the goals:
#   compute   forward + backward + SGD step on synthetic data, images/s, for
#             resnet18, resnet9, mnist-net and wrn-16-4 on 3x32x32 inputs, 10
#             classes, CrossEntropyLoss, SGD momentum 0.9 (not Nesterov),
#             weight decay 5e-4, each step normalising a fixed uint8 batch.
#             ringtrain: `train --synthetic-data --steps N+3 --json`, its
#             steady_images_per_s (the steps after the first 3).
#             PyTorch: bench/torch_train.py compute: 3 untimed steps, N timed.
#             N per model (x --steps-scale) makes each measurement ~10 s at
#             PyTorch 1.13's speed on 2 cores. GFLOP/s: training FLOPs per
#             image = 3 x 2 x the forward multiply-adds of the Conv2d and
#             Linear layers (counted on the PyTorch model with forward hooks).
#             Goal: ringtrain images/s >= 1.0x PyTorch's, every model.
#   tta       time to accuracy: mnist-net on a synthetic CIFAR-10-format set
#             (`ringtrain synth --train 10000 --test 2000`, kept under --data),
#             batch 128, SGD lr 0.05 momentum 0.9 weight decay 5e-4, cosine
#             over E epochs, random crop 32 pad 4 + horizontal flip, eval on
#             the test split after every epoch, stopping once its accuracy
#             >= A. ringtrain: `train --data DIR/packed --target-accuracy A`;
#             PyTorch: bench/torch_train.py tta on the CIFAR binary files (uint8
#             tensors, crops and flips by indexing). Wall time of each run from
#             its start (data read included; PyTorch's interpreter start-up and
#             `import torch` not). mnist-net is the fastest model per epoch,
#             so the part stays short; the ResNets take minutes per epoch on
#             2 cores.
#             Goal: ringtrain's time to A <= PyTorch's (ratio >= 1.0).
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --models LIST     comma-separated compute models (default
#                     resnet18,resnet9,mnist-net,wrn-16-4)
#   --runs R          rounds of both ways, each part (default 3)
#   --batch-size B    images per step, both parts (default 128)
#   --threads T       compute threads of both ways (default: nproc)
#   --steps-scale F   multiply every model's timed step count by F (default 1;
#                     0.1 for a quick check: at least 1 step each)
#   --data DIR        time-to-accuracy dataset (default data/bench-train); made
#                     when absent (synth, then pack) and kept for the next run
#   --tta-model M     time-to-accuracy model (default mnist-net)
#   --target A        target test accuracy, 0..1 (default 0.9)
#   --epochs E        planned epochs, the cosine's length and the limit
#                     (default 10)
#   --only PART       run one part only: compute or tta
# ringtrain's set-up line (compute backend, BLAS and the core type) is
# printed with the tables. OpenBLAS 0.3.21 takes its slow generic "Prescott"
# kernels on CPUs it does not recognise; ringtrain picks the core type itself
# ("chosen for this CPU" in that line), PyTorch's convolutions do not use
# OpenBLAS.
# Needs /usr/bin/python3 with torch + torchvision (it says how to install
# them) and tools/reference_models.py. About 15 minutes on 2 quiet cores with
# the defaults (compute ~7, tta ~8) if ringtrain is as fast as PyTorch, less
# when it is faster.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
DATA=$top/data/bench-train
MODELS=resnet18,resnet9,mnist-net,wrn-16-4
RUNS=3
B=128
THREADS=$(nproc)
SCALE=1
TTA_MODEL=mnist-net
TARGET=0.9
EPOCHS=10
LR=0.05
ONLY=
PY=/usr/bin/python3

# Timed steps per model at --steps-scale 1: ~10 s each at PyTorch 1.13's speed
# on 2 cores, batch 128 (about 650, 390, 60 and 43 images/s).
steps_for() {
    case $1 in
    mnist-net) echo 50 ;;
    resnet18) echo 30 ;;
    resnet9) echo 5 ;;
    wrn-16-4) echo 4 ;;
    wrn-*) echo 3 ;;
    *) echo 10 ;;
    esac
}

bench_options --bin=RT --models=MODELS --runs=RUNS --batch-size=B --threads=THREADS --steps-scale=SCALE \
    --data=DATA --tta-model=TTA_MODEL --target=TARGET --epochs=EPOCHS --only=ONLY -- "$@"
bench_posint "$B" "$RUNS" "$THREADS" "$EPOCHS"
bench_posnum "$SCALE" || bench_fail "--steps-scale '$SCALE' is not a positive number"
bench_accuracy "$TARGET" || bench_fail "--target '$TARGET' is not an accuracy in (0, 1]"
case $ONLY in '' | compute | tta) ;; *) bench_fail "--only takes compute or tta" ;; esac
models=()
bench_list models "$MODELS" --models
RT=$(bench_bin "$RT")

# --- prerequisites -----------------------------------------------------------
bench_sudo
bench_need_bin
bench_need_torch "PyTorch for $PY is missing or broken" "$PY" "$top/bench/torch_train.py" check
# Every model's FLOPs up front: also fails early on a model name PyTorch lacks.
flops_models=()
[ "$ONLY" = tta ] || flops_models=("${models[@]}")
[ "$ONLY" = compute ] || flops_models+=("$TTA_MODEL")
flops_json=$("$PY" "$top/bench/torch_train.py" flops --model "$(IFS=,; echo "${flops_models[*]}")") ||
    bench_fail "could not build every model in PyTorch (above)"

# --- dataset (time to accuracy) ----------------------------------------------
src=$DATA/src/cifar-10-batches-bin
packed=$DATA/packed
if [ "$ONLY" != compute ]; then
    bench_dataset "$DATA/src" "$packed" ": 10000 train + 2000 test records" "" --train 10000 --test 2000
    cat "$src"/*.bin "$packed"/* >/dev/null 2>&1 || true  # page cache warm for both ways
fi

bench_scratch rt-tvp
echo "$flops_json" >"$t/flops.jsonl"

# --- the report helper: parses each result line, prints the tables at the end -
bench_report_helper "$t/report.py" <<'EOF'
WAY = {"rt": "ringtrain", "pt": "PyTorch"}

def add(results, part, way, model, run, path, wall, target):
    """Appends one measurement to results; 0 when it holds what the part needs."""
    r = last_line_json(path)
    label = "%-9s %-10s" % (WAY[way], model)
    if part == "compute":
        key = "steady_images_per_s" if way == "rt" else "images_per_s"
        if r is None or not isnum(r.get(key)):
            print("  %s FAILED: no JSON line with %s at the end of its output" % (label, key))
            return 1
        r["ips"] = r[key]
        if way == "rt":
            note = "%s steps, the first 3 untimed; %s threads; all steps %.1f images/s" % (
                r.get("steps", "?"), r.get("threads", "?"), r.get("images_per_s") or 0)
        else:
            note = r.get("note", "")
        print("  %s %8.1f images/s  (%s)" % (label, r["ips"], note))
    else:
        if r is None or not isnum(r.get("time_s")) or not isnum(r.get("val_acc")):
            print("  %s FAILED: no JSON line with time_s and val_acc at the end of its output" % label)
            return 1
        best = r.get("best_val_acc") if isnum(r.get("best_val_acc")) else r["val_acc"]
        r["reached"] = bool(r.get("reached")) or max(r["val_acc"], best) >= float(target) - 1e-9
        print("  %s %7.1f s, %s epoch(s), test acc %.4f, %s  (training %.0f images/s)" % (
            label, r["time_s"], r.get("epochs", "?"), r["val_acc"],
            "target reached" if r["reached"] else "target NOT reached", r.get("images_per_s") or 0))
    if way == "rt":
        r["backend"] = setup_line(path)
    r.update(part=part, way=way, model=model, run=int(run), process_s=float(wall))
    r.pop("history", None)
    with open(results, "a") as f:
        f.write(json.dumps(r) + "\n")
    return 0

def compute_table(results, flops_path, models, runs, batch, threads, scale):
    rs = [r for r in load(results) if r["part"] == "compute"]
    flops = {}
    for l in open(flops_path):
        if l.strip():
            r = json.loads(l)
            flops[r["model"]] = r["train_flops_per_image"]
    print("| model | train GFLOP/image | ringtrain images/s | min - max | PyTorch images/s | min - max "
          "| ringtrain : PyTorch | ringtrain GFLOP/s | PyTorch GFLOP/s | goal >= 1.0x |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for m in models.split(","):
        cell = {}
        for w in ("rt", "pt"):
            xs = [r["ips"] for r in rs if r["model"] == m and r["way"] == w]
            cell[w] = med_lo_hi(xs) if xs else None
        f = flops.get(m)
        def gf(c):
            return "%.1f" % (c[0] * f / 1e9) if c and f else "n/a"
        def ips(c):
            return ("%.1f" % c[0], "%.1f - %.1f" % (c[1], c[2])) if c else ("n/a", "")
        if cell["rt"] and cell["pt"]:
            x = cell["rt"][0] / cell["pt"][0]
            ratio, goal = "%.2f" % x, "PASS" if x >= 1.0 else "MISS"
        else:
            ratio, goal = "n/a", "n/a"
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            m, "%.3f" % (f / 1e9) if f else "n/a", *ips(cell["rt"]), *ips(cell["pt"]), ratio,
            gf(cell["rt"]), gf(cell["pt"]), goal))
    return 0

def tta_table(results, model, target, epochs):
    rs = [r for r in load(results) if r["part"] == "tta"]
    target = float(target)
    pt = [r for r in rs if r["way"] == "pt"]
    if pt:
        print("records: %s train, %s test; %s steps per epoch" % (
            pt[0].get("train_records"), pt[0].get("test_records"), pt[0].get("steps_per_epoch")))
        print()
    med = tta_rows(rs, target)
    print()
    print("| goal | result |")
    print("|---|---|")
    print("| %s time to %.0f %% test accuracy <= PyTorch's (PyTorch s / ringtrain s >= 1.0) | %s |" % (
        model, 100 * target, tta_goal(med, target, epochs) or "n/a"))
    return 0

if __name__ == "__main__":
    main({"add": add, "compute": compute_table, "tta": tta_table, "backends": backends})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
# Each sets cmd=(...) to the command line of one measurement.
cmd_compute() { # way model steps
    if [ "$1" = rt ]; then
        cmd=("$RT" train --synthetic-data --model "$2" --batch-size "$B" --threads "$THREADS"
            --steps $(($3 + 3)) --json --no-progress)
    else
        cmd=("$PY" "$top/bench/torch_train.py" compute --model "$2" --batch-size "$B"
            --threads "$THREADS" --steps "$3" --warmup 3)
    fi
}
cmd_tta() { # way
    if [ "$1" = rt ]; then
        cmd=("$RT" train --data "$packed" --model "$TTA_MODEL" --epochs "$EPOCHS" --batch-size "$B"
            --lr "$LR" --schedule cosine --threads "$THREADS" --target-accuracy "$TARGET"
            --no-progress --json)
    else
        cmd=("$PY" "$top/bench/torch_train.py" tta --data "$src" --model "$TTA_MODEL" --epochs "$EPOCHS"
            --batch-size "$B" --lr "$LR" --threads "$THREADS" --target-accuracy "$TARGET")
    fi
}

echo "== ringtrain training vs PyTorch: fp32 on the CPU, batch $B, $THREADS threads =="
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $torch_versions"
echo "settings: $RUNS runs alternated (the way that goes first swaps each run); fp32; $THREADS compute"
echo "          threads both ways; SGD momentum 0.9, weight decay 5e-4; CrossEntropyLoss"
declare -A steps  # model -> timed steps
if [ "$ONLY" != tta ]; then
    echo "compute:  synthetic 3x32x32 uint8 batch of $B, 10 classes, normalised every step; 3 warm-up"
    echo -n "          steps, then timed steps:"
    for m in "${models[@]}"; do
        n=$(bench_scaled_steps "$(steps_for "$m")" "$SCALE")
        steps[$m]=$n
        echo -n " $m $n"
    done
    echo
fi
if [ "$ONLY" != compute ]; then
    echo "tta:      $TTA_MODEL, lr $LR cosine over $EPOCHS epochs, crop+flip, until $TARGET test accuracy;"
    echo "          ringtrain reads $packed, PyTorch $src"
fi

fails=0
measure() { # part way model run
    local rc wall
    bench_run "$t/$2.out" "$t/$2.err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$t/$2.out" "$wall" "$TARGET" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$t/$2.err"
    fi
}

if [ "$ONLY" != tta ]; then
    for i in $(seq "$RUNS"); do
        echo "compute run $i/$RUNS"
        for m in "${models[@]}"; do
            for w in $(bench_order "$i" rt pt); do
                cmd_compute "$w" "$m" "${steps[$m]}" && measure compute "$w" "$m" "$i"
            done
        done
    done
fi
if [ "$ONLY" != compute ]; then
    for i in $(seq "$RUNS"); do
        echo "time-to-accuracy run $i/$RUNS"
        for w in $(bench_order "$i" rt pt); do
            cmd_tta "$w" && measure tta "$w" "$TTA_MODEL" "$i"
        done
    done
fi

echo
echo "Medians of $RUNS runs, batch $B, $THREADS threads both ways, $(nproc) CPUs (${cpu:-unknown CPU})."
report backends "$t/results.jsonl"
if [ "$ONLY" != tta ]; then
    echo
    echo "Compute only (synthetic data): training images/s; GFLOP/s = images/s x train GFLOP/image"
    echo "(3 x 2 x forward multiply-adds of conv + linear layers, from the PyTorch model)."
    echo
    report compute "$t/results.jsonl" "$t/flops.jsonl" "$MODELS" "$RUNS" "$B" "$THREADS" "$SCALE"
fi
if [ "$ONLY" != compute ]; then
    echo
    echo "Time to accuracy: $TTA_MODEL on $DATA (synthetic CIFAR-10 records),"
    echo "lr $LR cosine over $EPOCHS epochs, stopping at $TARGET test accuracy; time_s of each run (wall,"
    echo "data read and evals included); process wall adds process start-up (PyTorch: import torch)."
    echo
    report tta "$t/results.jsonl" "$TTA_MODEL" "$TARGET" "$EPOCHS"
fi
bench_finish $fails
