#!/usr/bin/env bash
# train_vs_pytorch.sh - ringtrain's training speed against PyTorch's on one
# machine, side by side, CPU, fp32 and bf16, same batch, same thread count.
#   bench/train_vs_pytorch.sh [--bin PATH] [--models LIST] [--amps LIST]
#                             [--runs R] [--batch-size B] [--threads T]
#                             [--steps-scale F] [--pt-format F] [--data DIR]
#                             [--tta-model M] [--target A] [--epochs E]
#                             [--acc-epochs E] [--only compute|tta|acc]
#                             [--json FILE]
# Three parts, each way alternated RUNS times with the other (these machines
# swing +-25 % between runs; the way that goes first swaps every run), medians
# printed with PASS/MISS against the goals. Precisions (--amps): fp32
# (`ringtrain train --amp off`, PyTorch fp32) and bf16 (`ringtrain train --amp
# bf16`: bf16 activations, fp32 weights; PyTorch's own CPU mixed precision:
# torch.autocast("cpu", dtype=torch.bfloat16) around forward + loss, which
# runs convolutions and linear layers in bfloat16 through oneDNN's AVX512_BF16
# / AMX kernels, fp32 weights and SGD). bf16 needs a CPU with AVX512_BF16 or
# AMX: where ringtrain refuses `--amp bf16`, the bf16 columns say n/a and why.
# PyTorch's memory format (--pt-format): channels_last by default, the faster
# layout on the machine this was written on (AMD EPYC Zen 4, 2 threads, best
# of 7 alternated rounds, over contiguous NCHW: fp32 resnet18 +6 %, resnet9
# +15 %, mnist-net +11 %, wrn-16-4 +28 %; bf16 +5, +18, a tie, +11 %); `both`
# measures both in every run and takes the faster median per model and
# precision, named in the table.
#   ceiling   the machine's ceiling on the same threads, measured at the
#             start of every compute run: the GFLOP/s of one large fp32 matrix
#             product (oneDNN dnnl_sgemm) and of one bf16 product (a oneDNN
#             matmul primitive, bf16 in, fp32 out), 3072^3 each, median of 5
#             after 2 warm-up (bench/gemm_ceiling.c, built with `cc -O2 ...
#             -ldnnl`; n/a without cc or libdnnl-dev); the tables use the
#             median of the runs' medians, printed before them.
#   compute   forward + backward + SGD step on synthetic data, images/s, for
#             resnet18, resnet9, mnist-net and wrn-16-4 on 3x32x32 inputs, 10
#             classes, CrossEntropyLoss, SGD momentum 0.9 (not Nesterov),
#             weight decay 5e-4, each step normalising a fixed uint8 batch.
#             ringtrain: `train --synthetic-data --amp off|bf16 --steps N+3
#             --json`, its steady_images_per_s (the steps after the first 3).
#             PyTorch: bench/torch_train.py compute --amp off|bf16
#             --memory-format F: 3 untimed steps, N timed.
#             N per model (x --steps-scale) makes each fp32 measurement ~10 s
#             at PyTorch 1.13's speed on 2 cores. GFLOP/s: training FLOPs per
#             image = 3 x 2 x the forward multiply-adds of the Conv2d and
#             Linear layers (counted on the PyTorch model with forward hooks),
#             x images/s; the share of the ceiling: of the fp32 product's
#             GFLOP/s for fp32 runs, of the bf16 product's for bf16 runs.
#             Goals: ringtrain images/s >= 1.0x PyTorch's in fp32 and >= 1.2x
#             PyTorch's in bf16, every model; ringtrain fp32 on resnet9 and
#             wrn-16-4 at >= 85 % of the fp32 ceiling.
#   tta       time to accuracy in each precision: mnist-net on a synthetic
#             CIFAR-10-format set (`ringtrain synth --train 10000 --test 2000`,
#             kept under --data), batch 128, SGD lr 0.05 momentum 0.9 weight
#             decay 5e-4, cosine over E epochs, random crop 32 pad 4 +
#             horizontal flip, eval on the test split after every epoch,
#             stopping once its accuracy >= A. ringtrain: `train --data
#             DIR/packed --amp off|bf16 --target-accuracy A`; PyTorch:
#             bench/torch_train.py tta --amp off|bf16 on the CIFAR binary files
#             (uint8 tensors, crops and flips by indexing). Wall time of each
#             run from its start (data read included; PyTorch's interpreter
#             start-up and `import torch` not). mnist-net is the fastest model
#             per epoch, so the part stays short; the ResNets take minutes per
#             epoch on 2 cores.
#             Goal: ringtrain's time to A <= PyTorch's (ratio >= 1.0), in each
#             precision, ringtrain fp32 against PyTorch fp32, bf16 against bf16.
#   acc       bf16's accuracy against fp32's: ringtrain, the tta recipe and
#             data without the target, --acc-epochs E epochs (the cosine's
#             length; default: --epochs), `--amp off` and `--amp bf16`
#             alternated, seed = the run's number in both. Goal (3 epochs or
#             more): the median final test accuracy of bf16 within 0.5 points
#             of fp32's. After 3 epochs mnist-net is at ~63 % on this set,
#             where seeds differ by 1-2 points; after 10, ~97 %.
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --models LIST     comma-separated compute models (default
#                     resnet18,resnet9,mnist-net,wrn-16-4)
#   --amps LIST       precisions of the compute and tta parts, off (fp32)
#                     and/or bf16 (default off,bf16)
#   --runs R          rounds of all ways, each part (default 3)
#   --batch-size B    images per step, all parts (default 128)
#   --threads T       compute threads of both ways and the ceiling (default:
#                     nproc)
#   --steps-scale F   multiply every model's timed step count by F (default 1;
#                     0.1 for a quick check: at least 1 step each)
#   --pt-format F     PyTorch's memory format: channels_last (default),
#                     contiguous, or both (compute: both measured, the faster
#                     median used; tta: the compute part's faster one for the
#                     tta model, channels_last without it)
#   --data DIR        time-to-accuracy dataset (default data/bench-train); made
#                     when absent (synth, then pack) and kept for the next run
#   --tta-model M     time-to-accuracy and accuracy model (default mnist-net)
#   --target A        target test accuracy, 0..1 (default 0.9)
#   --epochs E        planned epochs of tta, the cosine's length and the
#                     limit (default 10)
#   --acc-epochs E    epochs of the accuracy part (default: --epochs)
#   --only PART       run one part only: compute (with the ceiling), tta or acc
#   --json FILE       also write the tables' figures as one JSON object
# ringtrain's set-up line (compute backend, BLAS and the core type) is
# printed with the tables. PyTorch's convolutions are oneDNN's in both
# precisions (the Debian build's own ATen kernels are AVX2 only).
# Needs /usr/bin/python3 with torch + torchvision (it says how to install
# them) and tools/reference_models.py; cc and libdnnl-dev for the ceiling.
# About 35 minutes on 2 quiet cores with the defaults (compute ~10, tta ~18,
# acc ~7; --pt-format both adds ~3) if ringtrain is as fast as PyTorch, less
# when it is faster; --amps off about half of that.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
DATA=$top/data/bench-train
MODELS=resnet18,resnet9,mnist-net,wrn-16-4
AMPS=off,bf16
RUNS=3
B=128
THREADS=$(nproc)
SCALE=1
PT_FORMAT=channels_last
TTA_MODEL=mnist-net
TARGET=0.9
EPOCHS=10
ACC_EPOCHS=
LR=0.05
ONLY=
JSON=
PY=/usr/bin/python3

# Timed steps per model at --steps-scale 1: ~10 s each at PyTorch 1.13's fp32
# speed on 2 cores, batch 128 (about 650, 390, 60 and 43 images/s).
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

bench_options --bin=RT --models=MODELS --amps=AMPS --runs=RUNS --batch-size=B --threads=THREADS \
    --steps-scale=SCALE --pt-format=PT_FORMAT --data=DATA --tta-model=TTA_MODEL --target=TARGET --epochs=EPOCHS \
    --acc-epochs=ACC_EPOCHS --only=ONLY --json=JSON -- "$@"
ACC_EPOCHS=${ACC_EPOCHS:-$EPOCHS}
bench_posint "$B" "$RUNS" "$THREADS" "$EPOCHS" "$ACC_EPOCHS"
bench_posnum "$SCALE" || bench_fail "--steps-scale '$SCALE' is not a positive number"
bench_accuracy "$TARGET" || bench_fail "--target '$TARGET' is not an accuracy in (0, 1]"
case $ONLY in '' | compute | tta | acc) ;; *) bench_fail "--only takes compute, tta or acc" ;; esac
case $PT_FORMAT in channels_last | contiguous | both) ;; *) bench_fail "--pt-format takes channels_last, contiguous or both" ;; esac
models=()
bench_list models "$MODELS" --models
amps=()
bench_list amps "$AMPS" --amps
for a in "${amps[@]}"; do
    case $a in off | bf16) ;; *) bench_fail "--amps: '$a' is not off or bf16" ;; esac
done
RT=$(bench_bin "$RT")
part() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }
have_amp() { case ",$AMPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# --- prerequisites -----------------------------------------------------------
bench_sudo
bench_need_bin
bench_need_torch "PyTorch for $PY is missing or broken" "$PY" "$top/bench/torch_train.py" check
# Every model's FLOPs up front: also fails early on a model name PyTorch lacks.
flops_models=()
! part compute || flops_models=("${models[@]}")
{ ! part tta && ! part acc; } || flops_models+=("$TTA_MODEL")
flops_json=$("$PY" "$top/bench/torch_train.py" flops --model "$(IFS=,; echo "${flops_models[*]}")") ||
    bench_fail "could not build every model in PyTorch (above)"

# bf16 both ways, or why not: ringtrain refuses `--amp bf16` on a CPU without
# AVX512_BF16 or AMX, saying why; torch_train.py check --amp bf16 says whether
# a convolution under PyTorch's CPU autocast computes in bfloat16.
# A refusal (exit status 1 or 2 with an "error:" line) makes bf16 n/a; a crash
# makes it n/a too, and counts as a failed measurement.
rt_bf16_why=
rt_bf16_crash=0
pt_bf16_why=
pt_bf16_note=
if have_amp bf16 && { part compute || part tta || part acc; }; then
    probe_rc=0
    probe=$("$RT" train --synthetic-data --model mnist-net --amp bf16 --batch-size 8 --threads "$THREADS" \
        --steps 1 --no-progress 2>&1 >/dev/null) || probe_rc=$?
    if [ "$probe_rc" -ne 0 ]; then
        rt_bf16_why=$(printf '%s\n' "$probe" | sed '/^[[:space:]]*$/d' | tail -n 1)
        case $probe_rc:$rt_bf16_why in
        [12]:error:*) rt_bf16_why=${rt_bf16_why#error: } ;;
        *)
            rt_bf16_crash=1
            rt_bf16_why="\`train --amp bf16\` failed in a one-step probe (exit status $probe_rc${rt_bf16_why:+: $rt_bf16_why})"
            ;;
        esac
    fi
    if ! probe=$("$PY" "$top/bench/torch_train.py" check --amp bf16 2>&1); then
        pt_bf16_why=$(printf '%s\n' "$probe" | tail -n 1)
    else
        pt_bf16_note=${probe##*, autocast}
        pt_bf16_note="autocast${pt_bf16_note}"
    fi
fi
# The precisions each way runs: bf16 only where both ways can (a ratio needs both).
run_amps=()
for a in "${amps[@]}"; do
    if [ "$a" = bf16 ] && [ -n "$rt_bf16_why$pt_bf16_why" ]; then continue; fi
    run_amps+=("$a")
done

# --- dataset (time to accuracy, accuracy) --------------------------------------
src=$DATA/src/cifar-10-batches-bin
packed=$DATA/packed
if part tta || part acc; then
    bench_dataset "$DATA/src" "$packed" ": 10000 train + 2000 test records" "" --train 10000 --test 2000
    cat "$src"/*.bin "$packed"/* >/dev/null 2>&1 || true  # page cache warm for both ways
fi

bench_scratch rt-tvp
echo "$flops_json" >"$t/flops.jsonl"
: >"$t/results.jsonl"

# --- the report helper: parses each result line, prints the tables at the end -
bench_report_helper "$t/report.py" <<'EOF'
WAY = {"rt": "ringtrain", "pt": "PyTorch"}
PREC = {"off": "fp32", "bf16": "bf16"}
SPEED_GOAL = {"off": 1.0, "bf16": 1.2}       # ringtrain images/s : PyTorch's
CEILING_GOAL = {"resnet9": 0.85, "wrn-16-4": 0.85}  # ringtrain fp32 GFLOP/s : the fp32 ceiling's
ACC_GOAL = 0.005                               # bf16's final test accuracy within 0.5 points of fp32's


def summary(path, key, value):
    """Adds key: value to the JSON object in path (the --json summary)."""
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        d = {}
    d[key] = value
    with open(path, "w") as f:
        json.dump(d, f, indent=1)


def add(results, part, way, model, amp, fmt, run, path, wall, target):
    """Appends one measurement to results; 0 when it holds what the part needs."""
    r = last_line_json(path)
    label = "%-9s %-10s %-4s" % (WAY[way], model, PREC[amp])
    if way == "pt" and fmt:
        label += " %-13s" % fmt
    elif fmt:
        label += " %-13s" % ""
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
        if part == "tta":
            best = r.get("best_val_acc") if isnum(r.get("best_val_acc")) else r["val_acc"]
            r["reached"] = bool(r.get("reached")) or max(r["val_acc"], best) >= float(target) - 1e-9
            print("  %s %7.1f s, %s epoch(s), test acc %.4f, %s  (training %.0f images/s)" % (
                label, r["time_s"], r.get("epochs", "?"), r["val_acc"],
                "target reached" if r["reached"] else "target NOT reached", r.get("images_per_s") or 0))
        else:
            print("  %s %7.1f s, %s epoch(s), test acc %.4f  (training %.0f images/s)" % (
                label, r["time_s"], r.get("epochs", "?"), r["val_acc"], r.get("images_per_s") or 0))
    if way == "rt":
        r["backend"] = setup_line(path)
    r.update(part=part, way=way, model=model, amp=amp, fmt=fmt if way == "pt" else "", run=int(run),
             process_s=float(wall))
    r.pop("history", None)
    with open(results, "a") as f:
        f.write(json.dumps(r) + "\n")
    return 0


def pt_medians(rs, model, amp):
    """{format: median images/s} of PyTorch's compute runs of model in amp."""
    by = {}
    for r in rs:
        if r["way"] == "pt" and r["model"] == model and r["amp"] == amp:
            by.setdefault(r["fmt"], []).append(r["ips"])
    return {f: statistics.median(xs) for f, xs in by.items()}


def best_format(results, model, amp, default):
    """The memory format of PyTorch's faster compute median for model in amp, or default."""
    med = pt_medians([r for r in load(results) if r["part"] == "compute"], model, amp)
    print(max(med, key=med.get) if med else default)
    return 0


def read_ceiling(path):
    c = last_line_json(path) if path else None
    return {"off": c.get("fp32_gflops"), "bf16": c.get("bf16_gflops")} if c else {"off": None, "bf16": None}


def compute_table(results, flops_path, ceiling_path, models, amps, bf16_why, summary_path):
    rs = [r for r in load(results) if r["part"] == "compute"]
    flops = {}
    for l in open(flops_path):
        if l.strip():
            r = json.loads(l)
            flops[r["model"]] = r["train_flops_per_image"]
    ceil = read_ceiling(ceiling_path)
    amps = amps.split(",")
    cells, out = {}, []
    for m in models.split(","):
        for a in ("off", "bf16"):
            c = {"rt": None, "pt": None, "fmt": None}
            if a in amps and not (a == "bf16" and bf16_why):
                xs = [r["ips"] for r in rs if r["model"] == m and r["amp"] == a and r["way"] == "rt"]
                c["rt"] = med_lo_hi(xs) if xs else None
                med = pt_medians(rs, m, a)
                if med:
                    c["fmt"] = max(med, key=med.get)
                    xs = [r["ips"] for r in rs if r["model"] == m and r["amp"] == a and r["way"] == "pt"
                          and r["fmt"] == c["fmt"]]
                    c["pt"] = med_lo_hi(xs)
            cells[m, a] = c

    def ips(c):
        return ("%.1f" % c[0], "%.1f - %.1f" % (c[1], c[2])) if c else ("n/a", "")

    print("| model | train GFLOP/image | fp32 ringtrain images/s | min - max | fp32 PyTorch images/s | min - max "
          "| fp32 ringtrain : PyTorch | goal >= 1.0x | bf16 ringtrain images/s | min - max | bf16 PyTorch images/s "
          "| min - max | bf16 ringtrain : PyTorch | goal >= 1.2x | PyTorch layout fp32 / bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|")
    for m in models.split(","):
        f = flops.get(m)
        row = [m, "%.3f" % (f / 1e9) if f else "n/a"]
        rec = {"model": m, "train_flops_per_image": f}
        for a in ("off", "bf16"):
            c = cells[m, a]
            if c["rt"] and c["pt"]:
                x = c["rt"][0] / c["pt"][0]
                ratio, goal = "%.2f" % x, "PASS" if x >= SPEED_GOAL[a] - 1e-9 else "MISS"
            else:
                x, ratio, goal = None, "n/a", "n/a"
            row += [*ips(c["rt"]), *ips(c["pt"]), ratio, goal]
            g_rt = c["rt"][0] * f / 1e9 if c["rt"] and f else None
            g_pt = c["pt"][0] * f / 1e9 if c["pt"] and f else None
            rec[PREC[a]] = {"ringtrain_images_per_s": c["rt"][0] if c["rt"] else None,
                            "pytorch_images_per_s": c["pt"][0] if c["pt"] else None,
                            "pytorch_memory_format": c["fmt"], "ratio": x, "goal": SPEED_GOAL[a],
                            "pass": (x >= SPEED_GOAL[a] - 1e-9) if x is not None else None,
                            "ringtrain_gflops": g_rt, "pytorch_gflops": g_pt,
                            "ringtrain_of_ceiling": g_rt / ceil[a] if g_rt and ceil[a] else None,
                            "pytorch_of_ceiling": g_pt / ceil[a] if g_pt and ceil[a] else None}
        row.append(" / ".join(cells[m, a]["fmt"] or "n/a" for a in ("off", "bf16")))
        print("| " + " | ".join(row) + " |")
        out.append(rec)
    if bf16_why:
        print()
        print("bf16 n/a: %s" % bf16_why)

    # Efficiency: GFLOP/s and the share of the ceiling of the same precision.
    print()
    print("GFLOP/s = images/s x train GFLOP/image; of ceiling = of the matrix product's GFLOP/s in the same")
    print("precision on the same threads (the ceiling line above: fp32 %s, bf16 %s GFLOP/s)." % (
        "%.1f" % ceil["off"] if ceil["off"] else "n/a", "%.1f" % ceil["bf16"] if ceil["bf16"] else "n/a"))
    print()
    print("| model | fp32 ringtrain GFLOP/s | of fp32 ceiling | fp32 PyTorch GFLOP/s | of fp32 ceiling "
          "| bf16 ringtrain GFLOP/s | of bf16 ceiling | bf16 PyTorch GFLOP/s | of bf16 ceiling "
          "| goal: ringtrain fp32 >= 85 % of the fp32 ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for rec in out:
        row = [rec["model"]]
        for p in ("fp32", "bf16"):
            for w in ("ringtrain", "pytorch"):
                g, s = rec[p]["%s_gflops" % w], rec[p]["%s_of_ceiling" % w]
                row += ["%.1f" % g if g else "n/a", "%.0f %%" % (100 * s) if s else "n/a"]
        want = CEILING_GOAL.get(rec["model"])
        s = rec["fp32"]["ringtrain_of_ceiling"]
        if want is None:
            goal = "-"
        elif s is None:
            goal = "n/a"
        else:
            goal = "%s (%.0f %%)" % ("PASS" if s >= want - 1e-9 else "MISS", 100 * s)
        rec["fp32"]["ceiling_goal"] = want
        rec["fp32"]["ceiling_pass"] = (s >= want - 1e-9) if want is not None and s is not None else None
        row.append(goal)
        print("| " + " | ".join(row) + " |")

    # With --pt-format both: the two layouts side by side.
    both = [(m, a, pt_medians(rs, m, a)) for m in models.split(",") for a in ("off", "bf16")]
    both = [(m, a, med) for m, a, med in both if len(med) > 1]
    if both:
        print()
        print("PyTorch's layouts (median images/s):")
        print()
        print("| model | precision | channels_last | contiguous NCHW | faster |")
        print("|---|---|---:|---:|---|")
        for m, a, med in both:
            print("| %s | %s | %.1f | %.1f | %s (%+.0f %%) |" % (
                m, PREC[a], med.get("channels_last", 0), med.get("contiguous", 0), max(med, key=med.get),
                100 * (max(med.values()) / min(med.values()) - 1)))
    if summary_path:
        summary(summary_path, "compute", out)
    return 0


def tta_table(results, model, target, epochs, amps, summary_path):
    rs = [r for r in load(results) if r["part"] == "tta"]
    target = float(target)
    pt = [r for r in rs if r["way"] == "pt"]
    if pt:
        print("records: %s train, %s test; %s steps per epoch" % (
            pt[0].get("train_records"), pt[0].get("test_records"), pt[0].get("steps_per_epoch")))
        print()
    print("| way | precision | time to %.0f %% (median s) | min - max | epochs (median) | test acc at the end "
          "| runs reaching it | training images/s | process wall s |" % (100 * target))
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    goals, out = [], []
    for a in amps.split(","):
        med = {}
        for w in ("rt", "pt"):
            xs = [r for r in rs if r["way"] == w and r["amp"] == a]
            if not xs:
                print("| %s | %s | n/a | | | | | | |" % (WAY[w], PREC[a]))
                continue
            ok = [r for r in xs if r["reached"]]
            tm, tlo, thi = med_lo_hi([r["time_s"] for r in xs])
            med[w] = (tm, len(ok), len(xs))
            fmt = " (%s)" % xs[0]["fmt"] if w == "pt" and xs[0].get("fmt") else ""
            acc = statistics.median([r["val_acc"] for r in xs])
            print("| %s%s | %s | %.1f | %.1f - %.1f | %g | %.4f | %d of %d | %.0f | %.1f |" % (
                WAY[w], fmt, PREC[a], tm, tlo, thi, statistics.median([r.get("epochs", 0) for r in xs]), acc,
                len(ok), len(xs), statistics.median([r.get("images_per_s") or 0 for r in xs]),
                statistics.median([r["process_s"] for r in xs])))
            out.append({"way": WAY[w], "precision": PREC[a], "time_s": tm, "val_acc": acc, "reached": len(ok),
                        "runs": len(xs)})
        goals.append((a, tta_goal(med, target, epochs)))
    print()
    print("| goal | result |")
    print("|---|---|")
    for a, g in goals:
        print("| %s %s: time to %.0f %% test accuracy <= PyTorch %s's (PyTorch s / ringtrain s >= 1.0) | %s |" % (
            model, PREC[a], 100 * target, PREC[a], g or "n/a"))
    if summary_path:
        summary(summary_path, "tta", {"model": model, "target": target, "rows": out,
                                      "goals": {PREC[a]: g for a, g in goals}})
    return 0


def acc_table(results, model, epochs, summary_path):
    rs = [r for r in load(results) if r["part"] == "acc"]
    print("| ringtrain | final test accuracy (median) | min - max | per run | training images/s |")
    print("|---|---:|---:|---|---:|")
    med = {}
    for a in ("off", "bf16"):
        xs = sorted((r for r in rs if r["amp"] == a), key=lambda r: r["run"])
        if not xs:
            print("| %s | n/a | | | |" % PREC[a])
            continue
        m, lo, hi = med_lo_hi([r["val_acc"] for r in xs])
        med[a] = m
        print("| %s | %.4f | %.4f - %.4f | %s | %.0f |" % (
            PREC[a], m, lo, hi, ", ".join("%.4f" % r["val_acc"] for r in xs),
            statistics.median([r.get("images_per_s") or 0 for r in xs])))
    # Runs of the same seed, bf16 - fp32.
    pairs = {}
    for r in rs:
        pairs.setdefault(r["run"], {})[r["amp"]] = r["val_acc"]
    diffs = [p["bf16"] - p["off"] for p in pairs.values() if "bf16" in p and "off" in p]
    print()
    print("| goal | result |")
    print("|---|---|")
    if "off" in med and "bf16" in med:
        d = med["bf16"] - med["off"]
        res = "%+.2f points: %s; each seed's bf16 - fp32: %s" % (
            100 * d, ("PASS" if abs(d) <= ACC_GOAL + 1e-9 else "MISS") if int(epochs) >= 3
            else "n/a, the goal is for 3 epochs or more", ", ".join("%+.2f" % (100 * x) for x in diffs))
    else:
        d, res = None, "n/a"
    print("| %s after %s epoch(s): ringtrain bf16's final test accuracy within 0.5 points of fp32's (medians) "
          "| %s |" % (model, epochs, res))
    if summary_path:
        summary(summary_path, "acc", {"model": model, "epochs": int(epochs), "fp32_val_acc": med.get("off"),
                                      "bf16_val_acc": med.get("bf16"), "difference": d, "paired_differences": diffs,
                                      "pass": abs(d) <= ACC_GOAL + 1e-9 if d is not None else None})
    return 0


if __name__ == "__main__":
    main({"add": add, "best_format": best_format, "compute": compute_table, "tta": tta_table, "acc": acc_table,
          "backends": backends, "summary": lambda path, key, value: summary(path, key, json.loads(value))})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
# Each sets cmd=(...) to the command line of one measurement.
cmd_compute() { # way model amp format steps
    if [ "$1" = rt ]; then
        cmd=("$RT" train --synthetic-data --model "$2" --amp "$3" --batch-size "$B" --threads "$THREADS"
            --steps $(($5 + 3)) --json --no-progress)
    else
        cmd=("$PY" "$top/bench/torch_train.py" compute --model "$2" --amp "$3" --memory-format "$4"
            --batch-size "$B" --threads "$THREADS" --steps "$5" --warmup 3)
    fi
}
cmd_tta() { # way amp format
    if [ "$1" = rt ]; then
        cmd=("$RT" train --data "$packed" --model "$TTA_MODEL" --amp "$2" --epochs "$EPOCHS" --batch-size "$B"
            --lr "$LR" --schedule cosine --threads "$THREADS" --target-accuracy "$TARGET" --no-progress --json)
    else
        cmd=("$PY" "$top/bench/torch_train.py" tta --data "$src" --model "$TTA_MODEL" --amp "$2" --memory-format "$3"
            --epochs "$EPOCHS" --batch-size "$B" --lr "$LR" --threads "$THREADS" --target-accuracy "$TARGET")
    fi
}
cmd_acc() { # amp seed
    cmd=("$RT" train --data "$packed" --model "$TTA_MODEL" --amp "$1" --epochs "$ACC_EPOCHS" --batch-size "$B"
        --lr "$LR" --schedule cosine --threads "$THREADS" --seed "$2" --no-progress --json)
}

# pt_formats RUN: PyTorch's formats in the compute part, the order swapping every run.
pt_formats() {
    if [ "$PT_FORMAT" != both ]; then
        echo "$PT_FORMAT"
    else
        bench_order "$1" channels_last contiguous
    fi
}

precs=$(for a in "${amps[@]}"; do [ "$a" = off ] && echo -n "fp32 " || echo -n "$a "; done)
echo "== ringtrain training vs PyTorch: ${precs% } on the CPU, batch $B, $THREADS threads =="
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $torch_versions"
echo "settings: $RUNS runs alternated (the way that goes first swaps each run); ${precs% }; $THREADS compute"
echo "          threads both ways; SGD momentum 0.9, weight decay 5e-4; CrossEntropyLoss"
if have_amp bf16; then
    if [ -n "$rt_bf16_why" ]; then
        if [ "$rt_bf16_crash" = 1 ]; then
            echo "bf16:     n/a: ringtrain's $rt_bf16_why"
        else
            echo "bf16:     n/a: ringtrain refuses --amp bf16 here: $rt_bf16_why"
        fi
    elif [ -n "$pt_bf16_why" ]; then
        echo "bf16:     n/a: PyTorch cannot: $pt_bf16_why"
    else
        echo "bf16:     ringtrain --amp bf16; PyTorch torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights and SGD"
        echo "          ($pt_bf16_note)"
    fi
fi
echo "PyTorch:  memory format $PT_FORMAT$([ "$PT_FORMAT" = both ] && echo " (channels_last and contiguous NCHW, the faster median used)")"
declare -A steps  # model -> timed steps
if part compute; then
    echo "compute:  synthetic 3x32x32 uint8 batch of $B, 10 classes, normalised every step; 3 warm-up"
    echo -n "          steps, then timed steps:"
    for m in "${models[@]}"; do
        n=$(bench_scaled_steps "$(steps_for "$m")" "$SCALE")
        steps[$m]=$n
        echo -n " $m $n"
    done
    echo
fi
if part tta; then
    echo "tta:      $TTA_MODEL, lr $LR cosine over $EPOCHS epochs, crop+flip, until $TARGET test accuracy;"
    echo "          ringtrain reads $packed, PyTorch $src"
fi
if part acc; then
    echo "acc:      ringtrain $TTA_MODEL fp32 and bf16, the tta recipe over $ACC_EPOCHS epochs (no target), seed = run"
fi
if part compute; then
    echo "ceiling:  oneDNN fp32 sgemm and bf16 matmul, 3072x3072x3072, $THREADS threads, at the start of every"
    echo "          compute run (bench/gemm_ceiling.c)"
fi

fails=0
measure() { # part way model amp format run
    local rc wall
    bench_run "$t/$2.out" "$t/$2.err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$5" "$6" "$t/$2.out" "$wall" "$TARGET" ||
        [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$t/$2.err"
    fi
}

ceiling=
if part compute; then
    ceil_ok=1
    for i in $(seq "$RUNS"); do
        echo "compute run $i/$RUNS"
        if [ "$ceil_ok" = 1 ] && ! bench_ceiling "$THREADS" "$t/ceiling.$i.json" brief; then
            [ -x "$t/gemm_ceiling" ] || ceil_ok=0  # not built: no use trying again
        fi
        for m in "${models[@]}"; do
            for a in "${run_amps[@]}"; do
                for w in $(bench_order "$i" rt pt); do
                    if [ "$w" = rt ]; then
                        cmd_compute rt "$m" "$a" "" "${steps[$m]}" && measure compute rt "$m" "$a" "" "$i"
                    else
                        for f in $(pt_formats "$i"); do
                            cmd_compute pt "$m" "$a" "$f" "${steps[$m]}" && measure compute pt "$m" "$a" "$f" "$i"
                        done
                    fi
                done
            done
        done
    done
    if bench_ceiling_merge "$t/ceiling.json" "$t"/ceiling.[0-9]*.json 2>/dev/null; then
        ceiling=$t/ceiling.json
    fi
fi
if part tta; then
    declare -A tta_fmt
    for a in "${run_amps[@]}"; do
        tta_fmt[$a]=$PT_FORMAT
        [ "$PT_FORMAT" != both ] || tta_fmt[$a]=$(report best_format "$t/results.jsonl" "$TTA_MODEL" "$a" channels_last)
    done
    for i in $(seq "$RUNS"); do
        echo "time-to-accuracy run $i/$RUNS"
        for a in "${run_amps[@]}"; do
            for w in $(bench_order "$i" rt pt); do
                cmd_tta "$w" "$a" "${tta_fmt[$a]}" && measure tta "$w" "$TTA_MODEL" "$a" "${tta_fmt[$a]}" "$i"
            done
        done
    done
fi
acc_amps=()
if part acc; then
    if [ -n "$rt_bf16_why" ] || ! have_amp bf16; then
        echo "accuracy: skipped: ${rt_bf16_why:-no bf16 in --amps}"
    else
        acc_amps=(off bf16)
        for i in $(seq "$RUNS"); do
            echo "accuracy run $i/$RUNS"
            for a in $(bench_order "$i" off bf16); do
                cmd_acc "$a" "$i" && measure acc rt "$TTA_MODEL" "$a" "" "$i"
            done
        done
    fi
fi

bf16_why=
if have_amp bf16; then
    if [ "$rt_bf16_crash" = 1 ]; then
        bf16_why="ringtrain's $rt_bf16_why"
    elif [ -n "$rt_bf16_why" ]; then
        bf16_why="ringtrain refuses --amp bf16 here: $rt_bf16_why"
    fi
    [ -z "$pt_bf16_why" ] || bf16_why="${bf16_why:+$bf16_why; }PyTorch: $pt_bf16_why"
fi
summary=
if [ -n "$JSON" ]; then
    summary=$t/summary.json
    report summary "$summary" settings "$("$PY" -c 'import json, sys
print(json.dumps({"cpu": sys.argv[1], "cpus": int(sys.argv[2]), "threads": int(sys.argv[3]), "batch_size": int(sys.argv[4]),
                  "runs": int(sys.argv[5]), "steps_scale": float(sys.argv[6]), "pytorch_memory_format": sys.argv[7],
                  "amps": sys.argv[8].split(","), "bf16_na": sys.argv[9] or None, "torch": sys.argv[10]}))' \
        "${cpu:-unknown}" "$(nproc)" "$THREADS" "$B" "$RUNS" "$SCALE" "$PT_FORMAT" "$AMPS" "$bf16_why" "$torch_versions")"
    [ -z "$ceiling" ] || report summary "$summary" ceiling "$(cat "$ceiling")"
fi

echo
echo "Medians of $RUNS runs, batch $B, $THREADS threads both ways, $(nproc) CPUs (${cpu:-unknown CPU})."
report backends "$t/results.jsonl"
if part compute; then
    echo
    if [ -n "$ceiling" ]; then
        "$PY" -c 'import json, sys
c = json.loads(open(sys.argv[1]).read())
print("ceiling: fp32 %.1f GFLOP/s (dnnl_sgemm), bf16 %s" % (
    c["fp32_gflops"], "%.1f GFLOP/s (oneDNN matmul, bf16 in, fp32 out, %s)" % (c["bf16_gflops"], c["bf16_impl"])
    if c["bf16_gflops"] else "n/a (%s)" % c["bf16_note"]))
print("         %dx%dx%d on %s threads, oneDNN %s, %s; median of %d run(s), each the median of %d repeats;" % (
    c["size"], c["size"], c["size"], c["threads"], c["onednn"], c["isa"], c["rounds"], c["repeats"]))
print("         all repeats: fp32 %.1f - %.1f, bf16 %s GFLOP/s" % (
    c["fp32_gflops_min"], c["fp32_gflops_max"],
    "%.1f - %.1f" % (c["bf16_gflops_min"], c["bf16_gflops_max"]) if c["bf16_gflops"] else "n/a"))' "$ceiling"
    else
        echo "ceiling: n/a (see above)"
    fi
    echo
    echo "Compute only (synthetic data): training images/s; train GFLOP/image = 3 x 2 x forward multiply-adds"
    echo "of conv + linear layers, from the PyTorch model."
    echo
    report compute "$t/results.jsonl" "$t/flops.jsonl" "$ceiling" "$MODELS" "$AMPS" "$bf16_why" "$summary"
fi
if part tta; then
    echo
    echo "Time to accuracy: $TTA_MODEL on $DATA (synthetic CIFAR-10 records),"
    echo "lr $LR cosine over $EPOCHS epochs, stopping at $TARGET test accuracy; time_s of each run (wall,"
    echo "data read and evals included); process wall adds process start-up (PyTorch: import torch)."
    [ -z "$bf16_why" ] || echo "bf16 n/a: $bf16_why"
    echo
    report tta "$t/results.jsonl" "$TTA_MODEL" "$TARGET" "$EPOCHS" "$(IFS=,; echo "${run_amps[*]}")" "$summary"
fi
if part acc && [ ${#acc_amps[@]} -gt 0 ]; then
    echo
    echo "Accuracy, bf16 against fp32: ringtrain $TTA_MODEL on $DATA, lr $LR cosine over $ACC_EPOCHS epochs"
    echo "(no target), the same seed for both precisions in each run (seed = run number)."
    echo
    report acc "$t/results.jsonl" "$TTA_MODEL" "$ACC_EPOCHS" "$summary"
fi
if [ -n "$JSON" ]; then
    cp "$summary" "$JSON"
    echo
    echo "summary: $JSON"
fi
if [ "$rt_bf16_crash" = 1 ]; then
    echo "$bench_name: ringtrain's $rt_bf16_why" >&2
    fails=$((fails + 1))
fi
bench_finish $fails
