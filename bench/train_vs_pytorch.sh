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

usage() {
    sed -n '2,/^set -eu/p' "$0" | sed -n 's/^# \{0,1\}//p'
    exit "${1:-0}"
}
while [ $# -gt 0 ]; do
    case $1 in
    --bin) RT=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --batch-size) B=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --steps-scale) SCALE=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --tta-model) TTA_MODEL=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "train_vs_pytorch: unknown option '$1'" >&2; usage 2 >&2 ;;
    esac
done
for v in "$B" "$RUNS" "$THREADS" "$EPOCHS"; do
    case $v in '' | *[!0-9]* | 0) echo "train_vs_pytorch: '$v' is not a positive integer" >&2; exit 2 ;; esac
done
if ! awk -v f="$SCALE" 'BEGIN { exit !(f ~ /^[0-9]*\.?[0-9]+$/ && f + 0 > 0) }'; then
    echo "train_vs_pytorch: --steps-scale '$SCALE' is not a positive number" >&2; exit 2
fi
if ! awk -v a="$TARGET" 'BEGIN { exit !(a ~ /^[0-9]*\.?[0-9]+$/ && a + 0 > 0 && a + 0 <= 1) }'; then
    echo "train_vs_pytorch: --target '$TARGET' is not an accuracy in (0, 1]" >&2; exit 2
fi
case $ONLY in '' | compute | tta) ;; *) echo "train_vs_pytorch: --only takes compute or tta" >&2; exit 2 ;; esac
IFS=, read -r -a models <<<"$MODELS"
[ ${#models[@]} -gt 0 ] || { echo "train_vs_pytorch: --models is empty" >&2; exit 2; }
case $RT in */*) ;; *) RT=$(command -v "$RT" || echo "$RT") ;; esac

# --- prerequisites -----------------------------------------------------------
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo "
if [ ! -x "$RT" ]; then
    echo "train_vs_pytorch: no ringtrain binary at $RT; build it:" >&2
    echo "  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build" >&2
    exit 2
fi
if [ ! -x "$PY" ] || ! torch_versions=$("$PY" "$top/bench/torch_train.py" check); then
    echo "train_vs_pytorch: PyTorch for $PY is missing or broken${torch_versions:+ ($torch_versions)}; install:" >&2
    echo "  ${sudo}apt-get install -y python3-torch python3-torchvision" >&2
    exit 2
fi
# Every model's FLOPs up front: also fails early on a model name PyTorch lacks.
flops_models=()
[ "$ONLY" = tta ] || flops_models=("${models[@]}")
[ "$ONLY" = compute ] || flops_models+=("$TTA_MODEL")
flops_json=$("$PY" "$top/bench/torch_train.py" flops --model "$(IFS=,; echo "${flops_models[*]}")") || {
    echo "train_vs_pytorch: could not build every model in PyTorch (above)" >&2
    exit 2
}

# --- dataset (time to accuracy) ----------------------------------------------
src=$DATA/src/cifar-10-batches-bin
packed=$DATA/packed
if [ "$ONLY" != compute ]; then
    if [ ! -f "$src/test_batch.bin" ]; then
        echo "making $DATA/src (ringtrain synth: 10000 train + 2000 test records)"
        "$RT" synth --out "$DATA/src" --format cifar10 --train 10000 --test 2000
    fi
    if [ ! -f "$packed/manifest.json" ]; then
        echo "packing $packed (ringtrain pack)"
        "$RT" pack "$DATA/src" --out "$packed" --force
    fi
    cat "$src"/*.bin "$packed"/* >/dev/null 2>&1 || true  # page cache warm for both ways
fi

t=$(mktemp -d "${TMPDIR:-/tmp}/rt-tvp-XXXXXX")
trap 'rm -rf "$t"' EXIT
echo "$flops_json" >"$t/flops.jsonl"

# --- the report helper: parses each result line, prints the tables at the end -
cat >"$t/report.py" <<'EOF'
import json, statistics, sys

def last_json(path):
    """The last non-empty line of path as a JSON object, or None."""
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.strip()]
        obj = json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None

def isnum(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)

WAY = {"rt": "ringtrain", "pt": "PyTorch"}

def add(results, part, way, model, run, path, wall, target):
    """Appends one measurement to results; 0 when it holds what the part needs."""
    r = last_json(path)
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
    if way == "rt":  # its set-up line, e.g. "ringtrain train: world 1 (1 node, 1 rank per node), cpu: 2 threads, ..."
        for l in open(path, errors="replace"):
            if l.startswith("ringtrain train:"):
                r["backend"] = l.split(":", 1)[1].strip()
                break
    r.update(part=part, way=way, model=model, run=int(run), process_s=float(wall))
    r.pop("history", None)
    with open(results, "a") as f:
        f.write(json.dumps(r) + "\n")
    return 0

def backends(results):
    """ringtrain's set-up lines (compute backend, BLAS core type), each once."""
    seen = []
    for r in load(results):
        if r.get("backend") and r["backend"] not in seen:
            seen.append(r["backend"])
    for b in seen:
        print("ringtrain: %s" % b)
    return 0

def med_lo_hi(xs):
    return statistics.median(xs), min(xs), max(xs)

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
    print("| way | time to %.0f %% (median s) | min - max | epochs (median) | test acc at the end "
          "| runs reaching it | training images/s | process wall s |" % (100 * target))
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for w in ("rt", "pt"):
        xs = [r for r in rs if r["way"] == w]
        if not xs:
            print("| %s | n/a | | | | | | |" % WAY[w])
            continue
        ok = [r for r in xs if r["reached"]]
        tm, tlo, thi = med_lo_hi([r["time_s"] for r in xs])
        med[w] = (tm, len(ok), len(xs))
        print("| %s | %.1f | %.1f - %.1f | %s | %.4f | %d of %d | %.0f | %.1f |" % (
            WAY[w], tm, tlo, thi, "%g" % statistics.median([r.get("epochs", 0) for r in xs]),
            statistics.median([r["val_acc"] for r in xs]), len(ok), len(xs),
            statistics.median([r.get("images_per_s") or 0 for r in xs]),
            statistics.median([r["process_s"] for r in xs])))
    print()
    print("| goal | result |")
    print("|---|---|")
    if "rt" in med and "pt" in med:
        x = med["pt"][0] / med["rt"][0]
        if med["rt"][1] < med["rt"][2]:
            res = "%.2fx MISS (ringtrain reached %.0f %% in %d of %d runs)" % (x, 100 * target, med["rt"][1], med["rt"][2])
        elif med["pt"][1] < med["pt"][2]:
            res = "%.2fx %s (PyTorch missed %.0f %% in %d of %d runs: those times are its full %s epochs)" % (
                x, "PASS" if x >= 1.0 else "MISS", 100 * target, med["pt"][2] - med["pt"][1], med["pt"][2], epochs)
        else:
            res = "%.2fx %s" % (x, "PASS" if x >= 1.0 else "MISS")
    else:
        res = "n/a"
    print("| %s time to %.0f %% test accuracy <= PyTorch's (PyTorch s / ringtrain s >= 1.0) | %s |" % (
        model, 100 * target, res))
    return 0

def load(results):
    try:
        return [json.loads(l) for l in open(results)]
    except OSError:
        return []

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({"add": add, "compute": compute_table, "tta": tta_table, "backends": backends}[cmd](*args) or 0)
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
. "$top/bench/lib.sh"
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $torch_versions"
echo "settings: $RUNS runs alternated (the way that goes first swaps each run); fp32; $THREADS compute"
echo "          threads both ways; SGD momentum 0.9, weight decay 5e-4; CrossEntropyLoss"
declare -A steps  # model -> timed steps
if [ "$ONLY" != tta ]; then
    echo "compute:  synthetic 3x32x32 uint8 batch of $B, 10 classes, normalised every step; 3 warm-up"
    echo -n "          steps, then timed steps:"
    for m in "${models[@]}"; do
        n=$(awk -v n="$(steps_for "$m")" -v f="$SCALE" 'BEGIN { s = int(n * f + 0.5); print s < 1 ? 1 : s }')
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
    local rc=0 t0 t1
    t0=$EPOCHREALTIME
    "${cmd[@]}" >"$t/$2.out" 2>"$t/$2.err" || rc=$?
    t1=$EPOCHREALTIME
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$t/$2.out" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$TARGET" || [ $rc -ne 0 ]; then
        fails=$((fails + 1))
        echo "    exit status $rc from: ${cmd[*]}" >&2
        tail -n 5 "$t/$2.err" | sed 's/^/    /' >&2
    fi
}
order() { # run -> the two ways, the first swapping every run
    if [ $(($1 % 2)) = 1 ]; then echo rt pt; else echo pt rt; fi
}

if [ "$ONLY" != tta ]; then
    for i in $(seq "$RUNS"); do
        echo "compute run $i/$RUNS"
        for m in "${models[@]}"; do
            for w in $(order "$i"); do
                cmd_compute "$w" "$m" "${steps[$m]}" && measure compute "$w" "$m" "$i"
            done
        done
    done
fi
if [ "$ONLY" != compute ]; then
    for i in $(seq "$RUNS"); do
        echo "time-to-accuracy run $i/$RUNS"
        for w in $(order "$i"); do
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
if [ $fails -gt 0 ]; then
    echo "train_vs_pytorch: $fails measurement(s) failed (above)" >&2
    exit 1
fi
