#!/usr/bin/env bash
# gpu_vs_pytorch.sh - ringtrain's training on one NVIDIA GPU against PyTorch
# eager on the same GPU, side by side: compute speed per model and precision,
# the input pipeline's cost and headroom, and time to 94 % on CIFAR-10.
#   bench/gpu_vs_pytorch.sh [--bin PATH] [--python PATH] [--models LIST]
#                           [--amps LIST] [--runs R] [--batch-size B]
#                           [--steps-scale F] [--workers W] [--data DIR]
#                           [--cache DIR] [--cifar PATH] [--tta-epochs E]
#                           [--target A] [--only compute|loader|tta]
# Needs a machine with an NVIDIA GPU: without nvidia-smi, with nvidia-smi
# listing no GPU, or when `ringtrain train --device cuda` cannot train (a
# build without CUDA, no driver), it stops at once with exit status 2 and
# says why. Every way alternated RUNS times with the other (the way that goes
# first swaps every run), medians printed with min - max, ratios and
# PASS/MISS against the goals. Four parts:
#   compute   forward + backward + SGD step on synthetic data, images/s, for
#             each model (resnet18, resnet9, mnist-net, wrn-16-4) and each
#             precision (--amp off, bf16, fp16), batch B (default 512),
#             3x32x32 inputs, 10 classes, CrossEntropyLoss, SGD momentum 0.9,
#             weight decay 5e-4, each step normalising a fixed uint8 batch
#             that lives on the GPU.
#             ringtrain: `train --device cuda --amp A --synthetic-data --model M
#             --batch-size B --steps N+3 --json`, its steady_images_per_s (the
#             steps after the first 3; every step waits for its loss).
#             PyTorch eager: bench/torch_train.py compute --device cuda --amp A:
#             3 untimed steps, then N timed between two
#             torch.cuda.synchronize(); cudnn.benchmark = True; TF32 off (as
#             ringtrain's fp32); with bf16/fp16 torch.autocast around the
#             forward pass and the loss, channels_last model and batches, and
#             for fp16 a GradScaler (dynamic loss scaling, as ringtrain's fp16).
#             N per model (x --steps-scale) makes each measurement a few
#             seconds on an H100. TFLOP/s: training FLOPs per image = 3 x 2 x
#             the forward multiply-adds of the Conv2d and Linear layers.
#             Goal: ringtrain images/s >= PyTorch eager's (ratio >= 1.0) at
#             every model and precision.
#   loader    the same training step fed by the real loader, per model at the
#             default precision (no --amp: bf16 on a GPU that has it, fp32
#             otherwise): `train --device cuda --data DIR --workers W --steps
#             N+3` (the packed dataset read through io_uring, decompressed,
#             cropped + flipped and copied to the GPU every step) alternated
#             with the same run on --synthetic-data. The input-pipeline cost
#             = (synthetic - loader) / synthetic images/s, in %.
#             Then `ringtrain loadbench DIR --workers W --batch-size B --epochs
#             3 --json` (the loader and pinned ring alone, no compute), RUNS
#             times, its steady images_per_s against what the GPU consumes
#             (the synthetic images/s above), per model: loader headroom =
#             loader / GPU images/s. Goal: headroom >= 1.0x (the loader can
#             feed the GPU).
#             DIR: --data (a packed dataset, e.g. real CIFAR-10 packed with
#             `ringtrain pack`), by default CACHE/synth: `ringtrain synth`
#             (CIFAR-10-like, 50000 train + 10000 test) packed, made when
#             absent and kept.
#   tta       time to 94 % test accuracy on real CIFAR-10, resnet9, given with
#             --cifar PATH (the binary or the python version, a directory
#             holding the files or their cifar-10-batches-*/ folder, or the
#             .tar.gz as distributed); without --cifar this part is skipped
#             and says so. The recipe, the same both ways, is the DAWNBench
#             ResNet-9 one (Myrtle.ai, D. Page, "How to train your ResNet"):
#             batch 512, SGD momentum 0.9 Nesterov, weight decay 5e-4 on the
#             mean loss (Page's 5e-4 x 512 on the summed loss), one cycle:
#             lr linear from 0.4/25 up to 0.4 over 5 epochs, then linear down
#             to ~0 at the end of E epochs (--tta-epochs, default 24, Page's
#             length), label smoothing 0.2 (from the same series' later
#             posts), random crop 32 with 4-pixel zero padding + random
#             horizontal flip, evaluation on the 10000 test images after every
#             epoch, stopping once test accuracy >= A (--target, default 0.94);
#             precision: the default one of the part above, both ways.
#             Not taken from those recipes: cutout, input whitening, frozen
#             batch-norm scales, test-time flips; this plain recipe ends near
#             94 % after 24 epochs, so some runs may miss it (the table says
#             how many reached it).
#             ringtrain: CIFAR packed once with `ringtrain pack PATH` into
#             CACHE/cifar10 (kept), then `train --device cuda --data
#             CACHE/cifar10 --model resnet9 --batch-size 512 --optimizer sgd
#             --lr 0.4 --momentum 0.9 --nesterov --weight-decay 5e-4
#             --schedule onecycle --warmup-epochs 5 --label-smoothing 0.2
#             --aug crop,flip --epochs E --target-accuracy A --seed S --json`.
#             PyTorch eager: bench/torch_train.py tta with the same recipe
#             (OneCycleLR anneal_strategy='linear', cycle_momentum False), the
#             whole set on the GPU as uint8, crops and flips by indexing; a
#             tarball is unpacked once into CACHE/cifar10-src for it.
#             Seed S = the run's number, both ways. Wall time of each run from
#             its start (data read included; PyTorch's interpreter start-up
#             and `import torch` not).
#             Goal: ringtrain's time to A <= PyTorch's (ratio >= 1.0). For
#             context, the fastest published CIFAR-10 recipes: airbench94
#             (K. Jordan, 2024) reaches 94 % in 3.83 s on one A100 (3.29 s
#             with torch.compile), Page's ResNet-9 did it in 79 s on one V100
#             (24 epochs, 2018).
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --python PATH     the python3 with torch built with CUDA (default: the
#                     first of python3 on PATH and /usr/bin/python3 whose torch
#                     sees the GPU); without one, ringtrain's figures alone,
#                     saying that PyTorch with CUDA is absent
#   --models LIST     comma-separated models (default
#                     resnet18,resnet9,mnist-net,wrn-16-4)
#   --amps LIST       precisions of the compute part (default off,bf16,fp16)
#   --runs R          rounds of both ways, each part (default 3)
#   --batch-size B    images per step, compute and loader parts (default 512)
#   --steps-scale F   multiply every model's timed step count by F (default 1;
#                     0.1 for a quick check: at least 1 step each)
#   --workers W       ringtrain's loader threads, train and loadbench
#                     (default 1, train's default)
#   --data DIR        packed dataset of the loader part (default CACHE/synth)
#   --cache DIR       where made datasets are kept (default data/bench-gpu)
#   --cifar PATH      real CIFAR-10 for the time-to-accuracy part
#   --tta-epochs E    planned epochs of the recipe, the schedule's length and
#                     the limit (default 24)
#   --target A        target test accuracy, 0..1 (default 0.94)
#   --only PART       run one part only: compute, loader or tta
# About 20 minutes on one H100 with the defaults and --cifar (compute ~10,
# loader ~3, tta ~8), the first run a minute more (synth + pack).
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
PT_PY=
MODELS=resnet18,resnet9,mnist-net,wrn-16-4
AMPS=off,bf16,fp16
RUNS=3
B=512
SCALE=1
WORKERS=1
DATA=
CACHE=$top/data/bench-gpu
CIFAR=
TTA_EPOCHS=24
TARGET=0.94
ONLY=
# The time-to-accuracy recipe (see the header).
TTA_MODEL=resnet9
TTA_B=512
TTA_LR=0.4
TTA_WD=5e-4
TTA_WARMUP=5
TTA_LS=0.2

# Timed steps per model at --steps-scale 1: a few seconds each on an H100 at
# batch 512 in fp32, less with bf16/fp16.
steps_for() {
    case $1 in
    mnist-net) echo 200 ;;
    resnet18) echo 200 ;;
    resnet9) echo 100 ;;
    wrn-16-4) echo 100 ;;
    wrn-*) echo 50 ;;
    *) echo 100 ;;
    esac
}

bench_options --bin=RT --python=PT_PY --models=MODELS --amps=AMPS --runs=RUNS --batch-size=B --steps-scale=SCALE \
    --workers=WORKERS --data=DATA --cache=CACHE --cifar=CIFAR --tta-epochs=TTA_EPOCHS --target=TARGET --only=ONLY \
    -- "$@"
bench_posint "$B" "$RUNS" "$WORKERS" "$TTA_EPOCHS"
bench_posnum "$SCALE" || bench_fail "--steps-scale '$SCALE' is not a positive number"
bench_accuracy "$TARGET" || bench_fail "--target '$TARGET' is not an accuracy in (0, 1]"
case $ONLY in '' | compute | loader | tta) ;; *) bench_fail "--only takes compute, loader or tta" ;; esac
models=()
bench_list models "$MODELS" --models
amps=()
bench_list amps "$AMPS" --amps
for a in "${amps[@]}"; do
    case $a in off | bf16 | fp16) ;; *) bench_fail "--amps: '$a' is not off, bf16 or fp16" ;; esac
done
if [ -n "$CIFAR" ] && [ ! -e "$CIFAR" ]; then
    bench_fail "--cifar $CIFAR: no such file or directory"
fi
RT=$(bench_bin "$RT")

# --- prerequisites: the binary, a GPU, ringtrain training on it ----------------
bench_need_bin " (CUDA toolkit and cuDNN under /usr/local/cuda)" -DRT_CUDA=ON
RPY=$(command -v python3 || echo /usr/bin/python3)  # runs the report helper: json and statistics only
"$RPY" -c 'import json, statistics' 2>/dev/null || bench_fail "no python3 (it prints the tables)"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_vs_pytorch: no GPU: nvidia-smi is not installed; this benchmark needs a machine with an NVIDIA GPU" >&2
    echo "  and its driver (bench/train_vs_pytorch.sh compares training on the CPU)" >&2
    exit 2
fi
if ! gpu_list=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1) \
    || [ -z "$gpu_list" ]; then
    echo "gpu_vs_pytorch: no GPU: nvidia-smi lists none${gpu_list:+: $gpu_list}" >&2
    exit 2
fi

bench_scratch rt-gvp

# One step on the GPU: the binary was built with CUDA, the driver and the GPU
# work, and its JSON line names the default precision (when it has an "amp" field).
if ! "$RT" train --device cuda --synthetic-data --model mnist-net --batch-size 8 --steps 1 --json --no-progress \
    >"$t/probe.out" 2>&1; then
    echo "gpu_vs_pytorch: no GPU for ringtrain: \`$RT train --device cuda --synthetic-data --steps 1\` failed:" >&2
    tail -n 5 "$t/probe.out" | sed 's/^/  /' >&2
    exit 2
fi
HAVE_AMP=0
"$RT" train --help 2>&1 | grep -q -- '--amp' && HAVE_AMP=1
DEFAULT_AMP=$(bench_json_field "$RPY" "$t/probe.out" amp)
amp_source="from its --json line"
if [ -z "$DEFAULT_AMP" ]; then
    if [ $HAVE_AMP = 0 ]; then
        DEFAULT_AMP=off
        amp_source="this binary has no --amp: fp32"
    else
        # The documented default: bf16 where the GPU has it (compute capability 8.0 and later).
        cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
        if awk -v c="${cc:-0}" 'BEGIN { exit !(c + 0 >= 8.0) }'; then DEFAULT_AMP=bf16; else DEFAULT_AMP=off; fi
        amp_source="no amp field in its --json line: the documented default for compute capability ${cc:-unknown}"
    fi
fi
rt_amp() { # amp -> the ringtrain options asking for it; 1 when this binary cannot
    amp_args=()
    if [ $HAVE_AMP = 1 ]; then
        amp_args=(--amp "$1")
    elif [ "$1" != off ]; then
        return 1
    fi
}

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
[ -n "$DATA" ] || DATA=$CACHE/synth

# PyTorch with CUDA: --python, else the first python3 whose torch sees the GPU.
PT=0
pt_why=
cands=()
if [ -n "$PT_PY" ]; then
    cands=("$PT_PY")
else
    p=$(command -v python3 || true)
    [ -z "$p" ] || cands+=("$p")
    [ "$p" = /usr/bin/python3 ] || [ ! -x /usr/bin/python3 ] || cands+=(/usr/bin/python3)
fi
for p in "${cands[@]}"; do
    if out=$("$p" "$top/bench/torch_train.py" check --device cuda 2>&1); then
        PT=1 PT_PY=$p torch_versions=$out
        break
    fi
    pt_why="$pt_why${pt_why:+; }$p: $(echo "$out" | tail -n 1)"
done
if [ $PT = 0 ]; then
    [ -n "$pt_why" ] || pt_why="no python3 found"
    torch_versions="PyTorch with CUDA absent ($pt_why)"
fi
# FLOPs per image need torch, any build: the CUDA one, else any python3 with torch.
flops_py=
if [ $PT = 1 ]; then
    flops_py=$PT_PY
else
    for p in "${cands[@]}"; do
        if "$p" "$top/bench/torch_train.py" check >/dev/null 2>&1; then flops_py=$p; break; fi
    done
fi
: >"$t/flops.jsonl"
if [ -n "$flops_py" ] && [ "$ONLY" != tta ]; then
    "$flops_py" "$top/bench/torch_train.py" flops --model "$MODELS" >"$t/flops.jsonl" 2>"$t/flops.err" || {
        echo "gpu_vs_pytorch: could not build every model in PyTorch:" >&2
        cat "$t/flops.err" >&2
        exit 2
    }
fi

# --- datasets --------------------------------------------------------------------
if [ "$ONLY" = "" ] || [ "$ONLY" = loader ]; then
    if [ "$DATA" = "$CACHE/synth" ] && [ ! -f "$DATA/manifest.json" ]; then
        bench_dataset --quiet "$CACHE/synth-src" "$DATA" ": 50000 train + 10000 test records" ""
    fi
    if [ ! -f "$DATA/manifest.json" ]; then
        echo "gpu_vs_pytorch: --data $DATA: no manifest.json (a dataset packed with \`ringtrain pack\`)" >&2
        exit 2
    fi
    cat "$DATA"/* >/dev/null 2>&1 || true  # page cache warm for every run
fi
TTA=0
if [ "$ONLY" = "" ] || [ "$ONLY" = tta ]; then
    if [ -n "$CIFAR" ]; then
        TTA=1
        src_id=$(cd "$(dirname "$CIFAR")" && echo "$(pwd)/$(basename "$CIFAR")")
        packed=$CACHE/cifar10
        if [ ! -f "$packed/manifest.json" ] || [ "$(cat "$CACHE/cifar10.source" 2>/dev/null)" != "$src_id" ]; then
            echo "packing $packed from $CIFAR (ringtrain pack)"
            "$RT" pack "$CIFAR" --out "$packed" --force >/dev/null
            echo "$src_id" >"$CACHE/cifar10.source"
        fi
        if ! "$RPY" -c 'import json, sys
m = json.load(open(sys.argv[1]))
sys.exit(0 if m.get("num_classes") == 10 and m["splits"]["train"]["records"] == 50000
         and m["splits"]["test"]["records"] == 10000 else 1)' "$packed/manifest.json" 2>/dev/null; then
            echo "gpu_vs_pytorch: --cifar $CIFAR is not CIFAR-10 (10 classes, 50000 train + 10000 test images)" >&2
            exit 2
        fi
        pt_src=$src_id
        if [ -f "$CIFAR" ]; then  # PyTorch reads the files, not the tarball
            pt_src=$CACHE/cifar10-src
            if [ "$(cat "$pt_src.source" 2>/dev/null)" != "$src_id" ]; then
                echo "unpacking $CIFAR into $pt_src for PyTorch"
                rm -rf "$pt_src" && mkdir -p "$pt_src"
                tar -xf "$CIFAR" -C "$pt_src"
                echo "$src_id" >"$pt_src.source"
            fi
        fi
        cat "$packed"/* >/dev/null 2>&1 || true
    fi
fi

# --- the report helper: parses each result line, prints the tables at the end -
bench_report_helper "$t/report.py" <<'EOF'
WAY = {"rt": "ringtrain", "pt": "PyTorch eager", "syn": "synthetic", "data": "loader", "lb": "loadbench"}

def add(results, part, way, model, amp, run, path, wall, target):
    """Appends one measurement to results; 0 when it holds what the part needs.
    amp: the precision asked for ("default" when none was)."""
    r = last_json(path)
    label = "%-13s %-10s %-7s" % (WAY[way], model, amp)
    rec = {"part": part, "way": way, "model": model, "amp": amp, "run": int(run), "process_s": float(wall)}
    if part in ("compute", "loader"):
        key = "images_per_s" if way == "pt" else "steady_images_per_s"
        if r is None or not isnum(r.get(key)) or r[key] <= 0:
            print("  %s FAILED: no JSON line with %s at the end of its output" % (label, key))
            return 1
        rec["ips"] = float(r[key])
        if way == "pt":
            note = r.get("note", "")
        else:
            rec["backend"] = setup_line(path)
            if "cuda:" not in rec["backend"]:
                print("  %s FAILED: it did not train on the GPU (%s)" % (label, rec["backend"] or "no set-up line"))
                return 1
            got = r.get("amp")
            if isinstance(got, str):
                rec["amp_reported"] = got
                if amp != "default" and got != amp:
                    print("  %s FAILED: asked for --amp %s, its JSON line says amp %s" % (label, amp, got))
                    return 1
            note = "%s steps, the first 3 untimed; all steps %.1f images/s%s" % (
                r.get("steps", "?"), r.get("images_per_s") or 0,
                "; amp %s" % got if isinstance(got, str) else "")
        print("  %s %10.1f images/s  (%s)" % (label, rec["ips"], note))
    elif part == "loadbench":
        if r is None or not isnum(r.get("images_per_s")) or r["images_per_s"] <= 0:
            print("  %s FAILED: no JSON line with images_per_s at the end of its output" % label)
            return 1
        rec["ips"] = float(r["images_per_s"])
        rec["workers"] = r.get("workers")
        for l in open(path, errors="replace"):
            if l.startswith("verdict:"):
                rec["verdict"] = l.split(":", 1)[1].strip()
        print("  %s %10.1f images/s  (%s workers, %s)" % (label, rec["ips"], r.get("workers", "?"),
                                                         rec.get("verdict", "no verdict line")))
    else:
        if r is None or not isnum(r.get("time_s")) or not isnum(r.get("val_acc")):
            print("  %s FAILED: no JSON line with time_s and val_acc at the end of its output" % label)
            return 1
        best = r.get("best_val_acc") if isnum(r.get("best_val_acc")) else r["val_acc"]
        rec.update(time_s=r["time_s"], val_acc=r["val_acc"], epochs=r.get("epochs", 0),
                   images_per_s=r.get("images_per_s") or 0,
                   reached=bool(r.get("reached")) or max(r["val_acc"], best) >= float(target) - 1e-9)
        if way == "rt":
            rec["backend"] = setup_line(path)
        print("  %s %7.1f s, %s epoch(s), test acc %.4f, %s  (training %.0f images/s)" % (
            label, rec["time_s"], rec["epochs"], rec["val_acc"],
            "target reached" if rec["reached"] else "target NOT reached", rec["images_per_s"]))
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0

def cell(rs, **kv):
    """(median, min, max) of the matching records' ips, or None."""
    xs = [r["ips"] for r in rs if all(r.get(k) == v for k, v in kv.items())]
    return med_lo_hi(xs) if xs else None

def fmt(c):
    return ("%.1f" % c[0], "%.1f - %.1f" % (c[1], c[2])) if c else ("n/a", "")

def compute_table(results, flops_path, models, amps, pt_present):
    rs = [r for r in load(results) if r["part"] == "compute"]
    flops = {}
    for l in open(flops_path):
        if l.strip():
            x = json.loads(l)
            flops[x["model"]] = x["train_flops_per_image"]
    print("| model | precision | train GFLOP/image | ringtrain images/s | min - max | PyTorch eager images/s "
          "| min - max | ringtrain : PyTorch | ringtrain TFLOP/s | PyTorch TFLOP/s | goal >= 1.0x |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    passed = total = 0
    for m in models.split(","):
        f = flops.get(m)
        for a in amps.split(","):
            rt, pt = cell(rs, model=m, amp=a, way="rt"), cell(rs, model=m, amp=a, way="pt")
            def tf(c):
                return "%.1f" % (c[0] * f / 1e12) if c and f else "n/a"
            if rt and pt:
                x = rt[0] / pt[0]
                ratio, goal = "%.2f" % x, "PASS" if x >= 1.0 else "MISS"
                total += 1
                passed += x >= 1.0
            else:
                ratio, goal = "n/a", "n/a"
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                m, {"off": "fp32 (off)"}.get(a, a), "%.3f" % (f / 1e9) if f else "n/a", *fmt(rt), *fmt(pt),
                ratio, tf(rt), tf(pt), goal))
    print()
    print("| goal | result |")
    print("|---|---|")
    expected = len(models.split(",")) * len(amps.split(","))
    if total:
        res = "%s (%d of %d model x precision pairs)" % ("PASS" if passed == total else "MISS", passed, total)
        if total < expected:
            res += "; %d of %d pairs lack a figure (above)" % (expected - total, expected)
    elif pt_present != "1":
        res = "n/a (PyTorch with CUDA absent)"
    else:
        res = "n/a (no pair measured both ways)"
    print("| ringtrain images/s >= PyTorch eager's at every model and precision | %s |" % res)
    return 0

def loader_table(results, models, amp):
    rs = [r for r in load(results) if r["part"] == "loader"]
    print("| model | synthetic images/s | min - max | loader images/s | min - max | input-pipeline cost |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in models.split(","):
        syn, dat = cell(rs, model=m, way="syn"), cell(rs, model=m, way="data")
        cost = "%.1f %%" % (100 * (syn[0] - dat[0]) / syn[0]) if syn and dat else "n/a"
        print("| %s | %s | %s | %s | %s | %s |" % (m, *fmt(syn), *fmt(dat), cost))
    return 0

def headroom_table(results, models, workers):
    rs = load(results)
    lb = cell([r for r in rs if r["part"] == "loadbench"], way="lb")
    verdicts = [r["verdict"] for r in rs if r["part"] == "loadbench" and r.get("verdict")]
    if lb:
        print("loadbench, %s worker(s): %.1f images/s (min - max %.1f - %.1f)" % (workers, *lb))
    else:
        print("loadbench: no run succeeded")
    if verdicts:
        print("its verdict (last run): %s" % verdicts[-1])
    print()
    print("| model | GPU consumes (synthetic images/s) | loader images/s | loader headroom | goal >= 1.0x |")
    print("|---|---:|---:|---:|---|")
    for m in models.split(","):
        syn = cell([r for r in rs if r["part"] == "loader"], model=m, way="syn")
        if syn and lb:
            x = lb[0] / syn[0]
            hr, goal = "%.1fx" % x, "PASS" if x >= 1.0 else "MISS"
        else:
            hr, goal = "n/a", "n/a"
        print("| %s | %s | %s | %s | %s |" % (m, fmt(syn)[0], "%.1f" % lb[0] if lb else "n/a", hr, goal))
    return 0

def tta_table(results, model, target, epochs, pt_present):
    rs = [r for r in load(results) if r["part"] == "tta"]
    target = float(target)
    med = tta_rows(rs, target)
    print()
    print("| goal | result |")
    print("|---|---|")
    res = tta_goal(med, target, epochs)
    if res is None:
        res = "n/a (PyTorch with CUDA absent)" if "rt" in med and pt_present != "1" else "n/a"
    print("| %s time to %.0f %% test accuracy <= PyTorch eager's (PyTorch s / ringtrain s >= 1.0) | %s |" % (
        model, 100 * target, res))
    if "rt" in med and med["rt"][1] == med["rt"][2] and abs(target - 0.94) < 1e-9:
        print()
        print("Context (another recipe, another GPU): ringtrain's median is %.1fx airbench94's 3.83 s on one A100."
              % (med["rt"][0] / 3.83))
    return 0

if __name__ == "__main__":
    main({"add": add, "compute": compute_table, "loader": loader_table, "headroom": headroom_table,
          "tta": tta_table, "backends": backends})
EOF
report() { "$RPY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
# Each sets cmd=(...) to the command line of one measurement; 1 when it cannot run.
cmd_compute() { # way model amp steps
    if [ "$1" = rt ]; then
        rt_amp "$3" || return 1
        cmd=("$RT" train --device cuda --synthetic-data --model "$2" --batch-size "$B" "${amp_args[@]}"
            --steps $(($4 + 3)) --json --no-progress)
    else
        cmd=("$PT_PY" "$top/bench/torch_train.py" compute --device cuda --amp "$3" --model "$2"
            --batch-size "$B" --steps "$4" --warmup 3)
    fi
}
cmd_loader() { # way model steps: the default precision
    if [ "$1" = syn ]; then
        cmd=("$RT" train --device cuda --synthetic-data --model "$2" --batch-size "$B"
            --steps $(($3 + 3)) --json --no-progress)
    else
        cmd=("$RT" train --device cuda --data "$DATA" --workers "$WORKERS" --model "$2" --batch-size "$B"
            --steps $(($3 + 3)) --json --no-progress)
    fi
}
cmd_tta() { # way seed
    if [ "$1" = rt ]; then
        rt_amp "$DEFAULT_AMP" || return 1
        cmd=("$RT" train --device cuda --data "$packed" --workers "$WORKERS" --model "$TTA_MODEL"
            --batch-size "$TTA_B" --optimizer sgd --lr "$TTA_LR" --momentum 0.9 --nesterov
            --weight-decay "$TTA_WD" --schedule onecycle --warmup-epochs "$TTA_WARMUP"
            --label-smoothing "$TTA_LS" --aug "crop,flip" "${amp_args[@]}" --epochs "$TTA_EPOCHS"
            --target-accuracy "$TARGET" --seed "$2" --no-progress --json)
    else
        cmd=("$PT_PY" "$top/bench/torch_train.py" tta --device cuda --amp "$DEFAULT_AMP" --data "$pt_src"
            --model "$TTA_MODEL" --batch-size "$TTA_B" --lr "$TTA_LR" --nesterov --weight-decay "$TTA_WD"
            --schedule onecycle --warmup-epochs "$TTA_WARMUP" --label-smoothing "$TTA_LS"
            --epochs "$TTA_EPOCHS" --target-accuracy "$TARGET" --seed "$2")
    fi
}

echo "== ringtrain training on one GPU vs PyTorch eager on the same GPU =="
bench_machine
while IFS=, read -r idx name mem drv; do
    echo "gpu:      GPU$idx:$name,$mem, driver$drv"
done <<<"$gpu_list"
gpu_busy=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
if [ -n "$gpu_busy" ]; then
    echo "gpu busy: ${gpu_busy%%,*} % utilised,${gpu_busy#*,} MiB in use before the runs"
    if [ "${gpu_busy%%,*}" -gt 10 ] 2>/dev/null; then
        echo "          NOTE: something else is using the GPU; these numbers will be low and noisy"
    fi
fi
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $("$RT" --version 2>/dev/null | sed -n 's/^  cuda  *//p')"
if [ $PT = 1 ]; then
    echo "          PyTorch: $PT_PY: $torch_versions"
else
    echo "          NOTE: $torch_versions: ringtrain's figures alone"
fi
echo "settings: $RUNS runs alternated (the way that goes first swaps each run); batch $B; default precision"
echo "          $DEFAULT_AMP ($amp_source)"
[ $HAVE_AMP = 1 ] || echo "          NOTE: this ringtrain has no --amp option: its bf16/fp16 runs are skipped"
declare -A steps  # model -> timed steps
echo -n "steps:    3 untimed, then timed:"
for m in "${models[@]}"; do
    n=$(bench_scaled_steps "$(steps_for "$m")" "$SCALE")
    steps[$m]=$n
    echo -n " $m $n"
done
echo
if [ "$ONLY" = "" ] || [ "$ONLY" = loader ]; then
    echo "loader:   $DATA, $WORKERS loader worker(s)"
fi
if [ "$ONLY" = "" ] || [ "$ONLY" = tta ]; then
    if [ $TTA = 1 ]; then
        echo "tta:      $TTA_MODEL on $CIFAR: batch $TTA_B, SGD nesterov lr $TTA_LR one cycle (up over $TTA_WARMUP epochs)"
        echo "          over $TTA_EPOCHS epochs, weight decay $TTA_WD, label smoothing $TTA_LS, crop+flip, until $TARGET"
        echo "          test accuracy, precision $DEFAULT_AMP; ringtrain reads $packed${PT_PY:+, PyTorch $pt_src}"
    fi
fi

fails=0
measure() { # part way model amp run
    local rc wall out=$t/$1-$2.out err=$t/$1-$2.err
    bench_run "$out" "$err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$5" "$out" "$wall" "$TARGET" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$err" "$out"
    fi
}
ways_rt_pt() { # run -> rt and pt in this run's order, rt alone without PyTorch
    if [ $PT = 1 ]; then bench_order "$1" rt pt; else echo rt; fi
}

if [ "$ONLY" = "" ] || [ "$ONLY" = compute ]; then
    for i in $(seq "$RUNS"); do
        echo "compute run $i/$RUNS"
        for m in "${models[@]}"; do
            for a in "${amps[@]}"; do
                for w in $(ways_rt_pt "$i"); do
                    if cmd_compute "$w" "$m" "$a" "${steps[$m]}"; then
                        measure compute "$w" "$m" "$a" "$i"
                    elif [ "$i" = 1 ]; then
                        echo "  ringtrain     $m $a: skipped (this binary has no --amp)"
                    fi
                done
            done
        done
    done
fi
if [ "$ONLY" = "" ] || [ "$ONLY" = loader ]; then
    for i in $(seq "$RUNS"); do
        echo "loader run $i/$RUNS"
        for m in "${models[@]}"; do
            for w in $(bench_order "$i" syn data); do
                cmd_loader "$w" "$m" "${steps[$m]}" && measure loader "$w" "$m" default "$i"
            done
        done
        cmd=("$RT" loadbench "$DATA" --workers "$WORKERS" --batch-size "$B" --epochs 3 --json)
        measure loadbench lb - - "$i"
    done
fi
if [ $TTA = 1 ]; then
    for i in $(seq "$RUNS"); do
        echo "time-to-accuracy run $i/$RUNS (seed $i)"
        for w in $(ways_rt_pt "$i"); do
            if cmd_tta "$w" "$i"; then
                measure tta "$w" "$TTA_MODEL" "$DEFAULT_AMP" "$i"
            else
                echo "  ringtrain: skipped (precision $DEFAULT_AMP needs --amp, which this binary lacks)"
            fi
        done
    done
fi

echo
echo "Medians of $RUNS runs, batch $B; $(echo "$gpu_list" | head -n 1 | cut -d, -f2 | sed 's/^ //');"
echo "PyTorch eager: ${PT_PY:-absent}."
report backends "$t/results.jsonl"
if [ "$ONLY" = "" ] || [ "$ONLY" = compute ]; then
    echo
    echo "Compute only (synthetic data on the GPU): training images/s; TFLOP/s = images/s x train GFLOP/image"
    echo "(3 x 2 x forward multiply-adds of conv + linear layers, from the PyTorch model)."
    echo
    report compute "$t/results.jsonl" "$t/flops.jsonl" "$MODELS" "$AMPS" "$PT"
fi
if [ "$ONLY" = "" ] || [ "$ONLY" = loader ]; then
    echo
    echo "Real loader against synthetic data, ringtrain, default precision ($DEFAULT_AMP): the same step fed from"
    echo "$DATA ($WORKERS loader worker(s)); input-pipeline cost = (synthetic - loader) / synthetic."
    echo
    report loader "$t/results.jsonl" "$MODELS" "$DEFAULT_AMP"
    echo
    echo "Loader headroom: \`ringtrain loadbench\` (no compute) against what the GPU consumes (synthetic"
    echo "images/s above); >= 1.0x: the loader can feed the GPU."
    echo
    report headroom "$t/results.jsonl" "$MODELS" "$WORKERS"
fi
if [ "$ONLY" = "" ] || [ "$ONLY" = tta ]; then
    echo
    if [ $TTA = 1 ]; then
        echo "Time to accuracy: $TTA_MODEL on CIFAR-10 ($CIFAR), the recipe above, precision $DEFAULT_AMP;"
        echo "time_s of each run (wall, data read and evals included); process wall adds process start-up"
        echo "(PyTorch: import torch)."
        echo
        report tta "$t/results.jsonl" "$TTA_MODEL" "$TARGET" "$TTA_EPOCHS" "$PT"
    else
        echo "Time to accuracy: skipped (no --cifar PATH: it needs the real CIFAR-10, the binary or python"
        echo "version, e.g. --cifar ~/Downloads/cifar-10-python.tar.gz)."
    fi
    echo
    echo "Published reference: airbench94 (K. Jordan, 2024) reaches 94 % on CIFAR-10 in 3.83 s on one A100"
    echo "(3.29 s with torch.compile); the DAWNBench ResNet-9 (D. Page, 2018) in 79 s on one V100."
fi
bench_finish $fails
