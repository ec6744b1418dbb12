#!/usr/bin/env bash
# ddp_vs_pytorch.sh - ringtrain's multi-process data-parallel training on the
# CPU against PyTorch DistributedDataParallel (gloo backend), on one machine,
# side by side, fp32, synthetic data, same model, batch and thread count.
#   bench/ddp_vs_pytorch.sh [--bin PATH] [--np N] [--model M] [--batch-size B]
#                           [--threads T] [--bucket-cap-mb X] [--steps S]
#                           [--runs R] [--sweep LIST|none] [--no-overlap-too]
#                           [--only ringtrain|pytorch]
# Each way runs with N processes and with 1 (for its scaling efficiency),
# alternated RUNS times with the other way (these machines swing +-25 %
# between runs; the way that goes first swaps every run); medians printed.
#   ringtrain  mpirun --allow-run-as-root --oversubscribe -np N --bind-to none
#              BIN train --model M --synthetic-data --batch-size B --threads T
#              --bucket-cap-mb X --steps S+3 --json --no-progress
#              (Open MPI's mpirun; the same with -np 1). Rank 0's JSON line:
#              steady_images_per_s (global images/s after the first 3 steps;
#              images_per_s when absent), exposed_comm_frac, buckets. A run
#              printing several summaries, or at N > 1 none with world_size =
#              N, counts as failed: its ranks trained alone, and one rank's
#              images/s would pass for the world's.
#   PyTorch    python3 -m torch.distributed.run --nproc_per_node N
#              bench/torch_ddp.py --model M --batch-size B --threads T
#              --bucket-cap-mb X --steps S (and with 1 process): 3 untimed
#              warm-up steps, then S synced DDP steps and S steps under
#              no_sync(); step time = median over steps of the slowest rank's;
#              exposed communication = (synced - no-sync step time) / synced
#              (see bench/torch_ddp.py). Its launcher is started with a
#              rendezvous on a free port (torch 1.13's --standalone always
#              takes port 29400, so two runs on one machine would collide)
#              and with --redirects 9:1 --tee 9:1 (torch 1.13 on Python 3.11
#              fails at their defaults: its Std enum no longer lists 0).
# Step time = world x batch / global images/s; scaling efficiency = N-rank
# images/s / (N x 1-rank images/s). Goals, at N ranks, PASS/MISS:
#   ringtrain step time <= PyTorch DDP's (ratio ringtrain / PyTorch <= 1.0)
#   ringtrain exposed communication <= 10 % of its step
# Then, unless --sweep none, ringtrain alone at N ranks once per bucket size
# of the sweep: images/s and exposed-communication share per size.
# Options:
#   --bin PATH          ringtrain binary (default build/ringtrain)
#   --np N              processes of the multi-rank runs (default 2)
#   --model M           mnist-net, resnet18, resnet9, wrn-D-K (default resnet18)
#   --batch-size B      images per step per rank (default 64)
#   --threads T         compute threads per rank, both ways (default 1)
#   --bucket-cap-mb X   gradient bucket size in MB, both ways (default 25)
#   --steps S           timed steps per run (default 30)
#   --runs R            rounds of both ways (default 3)
#   --sweep LIST        comma-separated bucket sizes in MB for the ringtrain
#                       sweep, 1 run each (default 1,5,25,100); none: no sweep
#   --no-overlap-too    also run ringtrain once with --no-overlap (all-reduce
#                       after the whole backward) at N ranks, for comparison
#   --only WAY          run one way only: ringtrain or pytorch (no goals then;
#                       the sweep and --no-overlap-too are ringtrain's)
# Needs /usr/bin/python3 with torch (gloo) + torchvision and Open MPI's mpirun
# (it says how to install them). With the defaults, about 8 minutes on 2
# quiet cores if ringtrain is as fast as PyTorch (a PyTorch run of resnet18 at
# 2 ranks: ~10 s launcher and start-up, then 63 steps of ~0.4 s).
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
NP=2
MODEL=resnet18
B=64
THREADS=1
BUCKET=25
STEPS=30
RUNS=3
SWEEP=1,5,25,100
NO_OVERLAP=0
ONLY=
PY=/usr/bin/python3
MPIRUN=mpirun

bench_options --bin=RT --np=NP --model=MODEL --batch-size=B --threads=THREADS --bucket-cap-mb=BUCKET \
    --steps=STEPS --runs=RUNS --sweep=SWEEP --no-overlap-too=NO_OVERLAP:1 --only=ONLY -- "$@"
bench_posint "$NP" "$B" "$THREADS" "$STEPS" "$RUNS"
bench_posnum "$BUCKET" || bench_fail "--bucket-cap-mb '$BUCKET' is not a positive number"
sweep=()
if [ "$SWEEP" != none ]; then
    bench_list sweep "$SWEEP" --sweep " (none skips it)"
    for x in "${sweep[@]}"; do
        bench_posnum "$x" || bench_fail "--sweep: '$x' is not a positive number of MB"
    done
fi
case $ONLY in '' | ringtrain | pytorch) ;; *) bench_fail "--only takes ringtrain or pytorch" ;; esac
[ "$ONLY" != pytorch ] || { sweep=(); NO_OVERLAP=0; }
RT=$(bench_bin "$RT")

# --- prerequisites -----------------------------------------------------------
bench_sudo
if [ "$(id -u)" -eq 0 ]; then
    # Open MPI refuses to start as root without both (--allow-run-as-root alone
    # covers mpirun's own check; these cover the launched daemons too).
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if [ "$ONLY" != pytorch ]; then
    bench_need_bin
    if ! command -v "$MPIRUN" >/dev/null 2>&1; then
        echo "ddp_vs_pytorch: no $MPIRUN (Open MPI); install:" >&2
        echo "  ${sudo}apt-get install -y openmpi-bin libopenmpi-dev" >&2
        exit 2
    fi
fi
if [ "$ONLY" != ringtrain ]; then
    bench_need_torch "PyTorch (with gloo) for $PY is missing or broken" "$PY" "$top/bench/torch_ddp.py" --check
fi

bench_scratch rt-ddp

# --- the report helper: parses each result line, prints the tables at the end -
bench_report_helper "$t/report.py" <<'EOF'
WAY = {"rt": "ringtrain", "pt": "PyTorch DDP"}

def add(results, kind, way, np_, run, bucket, batch, path, wall):
    """Appends one measurement to results; 0 when it holds what is needed."""
    r = last_json(path)
    what = {"main": "", "sweep": "%g MB" % float(bucket), "no-overlap": "no-overlap"}[kind]
    label = "%-11s np %-2s %-10s" % (WAY[way], np_, what)
    key = "images_per_s"
    if way == "rt" and r is not None and isnum(r.get("steady_images_per_s")):
        key = "steady_images_per_s"
    if r is None or not isnum(r.get(key)) or r[key] <= 0:
        print("  %s FAILED: no JSON line with %s in its output" % (label, key))
        return 1
    # Several summaries, or none naming the world, from N processes: each
    # trained alone (a binary without multi-rank training) and its images/s
    # are one process's, not the world's.
    n_json = len(json_lines(path))
    if n_json > 1:
        print("  %s FAILED: %d JSON summary lines, one expected (from rank 0): did the ranks train alone?"
              % (label, n_json))
        return 1
    if not isnum(r.get("world_size")) and int(np_) > 1:
        print("  %s FAILED: no world_size in its JSON line" % label)
        return 1
    world = int(r["world_size"]) if isnum(r.get("world_size")) else 1
    if world != int(np_):
        print("  %s FAILED: world_size %s in its JSON line, %s processes started" % (label, world, np_))
        return 1
    b = r.get("batch_per_rank", r.get("batch_size")) if way == "pt" else r.get("batch_size")
    b = b if isnum(b) else int(batch)
    rec = {"kind": kind, "way": way, "np": int(np_), "run": int(run), "bucket": float(bucket),
           "ips": float(r[key]), "ips_key": key, "world": int(world), "batch": b,
           "process_s": float(wall)}
    rec["step_s"] = world * b / rec["ips"]
    e = r.get("exposed_comm_frac")
    rec["exposed"] = float(e) if isnum(e) else None
    if isnum(r.get("buckets")):
        rec["buckets"] = int(r["buckets"])
    if way == "pt":
        note = "no-sync step %.1f ms" % (1e3 * r.get("nosync_step_time_s", 0))
    else:
        note = "%s, %s steps, %s threads, %s buckets" % (key, r.get("steps", "?"), r.get("threads", "?"),
                                                         r.get("buckets", "?"))
        rec["backend"] = setup_line(path)
    print("  %s %8.1f images/s, step %7.1f ms, exposed comm %s  (%s)" % (
        label, rec["ips"], 1e3 * rec["step_s"], pct(rec["exposed"]), note))
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0

def pct(x):
    return "n/a" if x is None else "%.1f %%" % (100 * x)

def cell(rs, way, np_):
    """Medians of one way at one world size: ips, lo, hi, step_s, exposed, runs."""
    xs = [r for r in rs if r["way"] == way and r["np"] == np_]
    if not xs:
        return None
    ips = [r["ips"] for r in xs]
    ex = [r["exposed"] for r in xs if r["exposed"] is not None]
    m = statistics.median(ips)
    return {"ips": m, "lo": min(ips), "hi": max(ips), "step_s": xs[0]["world"] * xs[0]["batch"] / m,
            "exposed": statistics.median(ex) if ex else None, "n": len(xs)}

def main_table(results, np_):
    np_ = int(np_)
    rs = [r for r in load(results) if r["kind"] == "main"]
    worlds = [np_] + ([1] if np_ != 1 else [])
    print("| impl | world | images/s (median) | min - max | step time ms | exposed comm % "
          "| scaling efficiency | runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    c = {}
    for way in ("rt", "pt"):
        for w in worlds:
            c[way, w] = cell(rs, way, w)
        for w in worlds:
            x = c[way, w]
            if x is None:
                print("| %s | %d | n/a | | | | | 0 |" % (WAY[way], w))
                continue
            one = c.get((way, 1))
            if w == 1:
                eff = "(base)"
            elif one:
                eff = "%.2f" % (x["ips"] / (w * one["ips"]))
            else:
                eff = "n/a"
            print("| %s | %d | %.1f | %.1f - %.1f | %.1f | %s | %s | %d |" % (
                WAY[way], w, x["ips"], x["lo"], x["hi"], 1e3 * x["step_s"], pct(x["exposed"]).replace(" %", ""),
                eff, x["n"]))
    rt, pt = c.get(("rt", np_)), c.get(("pt", np_))
    print()
    print("| goal (%d ranks) | result |" % np_)
    print("|---|---|")
    if rt and pt:
        x = rt["step_s"] / pt["step_s"]
        res = "%.2f (%.1f ms / %.1f ms) %s" % (x, 1e3 * rt["step_s"], 1e3 * pt["step_s"],
                                              "PASS" if x <= 1.0 else "MISS")
    else:
        res = "n/a"
    print("| ringtrain step time <= PyTorch DDP's (ringtrain / PyTorch <= 1.0) | %s |" % res)
    if rt and rt["exposed"] is not None:
        res = "%s %s" % (pct(rt["exposed"]), "PASS" if rt["exposed"] <= 0.10 else "MISS")
    else:
        res = "n/a"
    print("| ringtrain exposed communication <= 10 %% of its step | %s |" % res)
    return 0

def sweep_table(results):
    rs = [r for r in load(results) if r["kind"] in ("sweep", "no-overlap")]
    if not rs:
        print("(no ringtrain sweep runs succeeded)")
        return 0
    print("| bucket cap MB | overlap | buckets | images/s | step time ms | exposed comm % |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in sorted(rs, key=lambda r: (r["kind"] != "sweep", r["bucket"])):
        print("| %g | %s | %s | %.1f | %.1f | %s |" % (
            r["bucket"], "yes" if r["kind"] == "sweep" else "no (--no-overlap)", r.get("buckets", "n/a"),
            r["ips"], 1e3 * r["step_s"], pct(r["exposed"]).replace(" %", "")))
    return 0

if __name__ == "__main__":
    main({"add": add, "main": main_table, "sweep": sweep_table, "backends": backends})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
# Each sets cmd=(...) to the command line of one measurement.
cmd_rt() { # np bucket_mb [extra ringtrain options...]
    local n=$1 x=$2
    shift 2
    # --steps S+3: its steady figure leaves out the first 3 steps, as
    # torch_ddp.py leaves out its 3 warm-up steps.
    cmd=("$MPIRUN" --allow-run-as-root --oversubscribe -np "$n" --bind-to none
        "$RT" train --model "$MODEL" --synthetic-data --batch-size "$B" --threads "$THREADS" --amp off
        --bucket-cap-mb "$x" --steps $((STEPS + 3)) --json --no-progress "$@")
}
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
cmd_pt() { # np
    cmd=("$PY" -m torch.distributed.run --nnodes 1 --nproc_per_node "$1"
        --rdzv_backend c10d --rdzv_endpoint "localhost:$(free_port)" --rdzv_id "ddp-bench-$$-$RANDOM"
        --redirects 9:1 --tee 9:1
        "$top/bench/torch_ddp.py" --model "$MODEL" --batch-size "$B" --threads "$THREADS"
        --bucket-cap-mb "$BUCKET" --steps "$STEPS" --warmup 3)
}

echo "== ringtrain data-parallel training vs PyTorch DDP (gloo): fp32 on the CPU =="
bench_machine
if [ $((NP * THREADS)) -gt "$(nproc)" ]; then
    echo "          NOTE: $NP ranks x $THREADS threads > $(nproc) CPUs: ranks share cores"
fi
sw="software:"
[ "$ONLY" = pytorch ] || sw="$sw $("$RT" --version 2>/dev/null | head -n 1); $("$MPIRUN" --version 2>/dev/null | head -n 1);"
[ "$ONLY" = ringtrain ] || sw="$sw $torch_versions"
echo "$sw"
echo "settings: $MODEL, synthetic 3x32x32 uint8 batch of $B per rank, 10 classes, normalised every step;"
echo "          SGD lr 0.1 momentum 0.9 weight decay 5e-4; $THREADS compute threads per rank; buckets"
echo "          of $BUCKET MB; $NP ranks and 1; $STEPS timed steps after 3 warm-up; $RUNS runs alternated"
echo "          (the way that goes first swaps each run)"

fails=0
measure() { # kind way np run bucket
    local rc wall out=$t/$2-$3.out err=$t/$2-$3.err
    bench_run "$out" "$err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$5" "$B" "$out" "$wall" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_rank_failure "$rc" "$err"
    fi
}
order() { # run -> the ways, the first swapping every run
    case $ONLY in
    ringtrain) echo rt ;;
    pytorch) echo pt ;;
    *) bench_order "$1" rt pt ;;
    esac
}
worlds="$NP"
[ "$NP" = 1 ] || worlds="$NP 1"

for i in $(seq "$RUNS"); do
    echo "run $i/$RUNS"
    for w in $(order "$i"); do
        for n in $worlds; do
            if [ "$w" = rt ]; then cmd_rt "$n" "$BUCKET"; else cmd_pt "$n"; fi
            measure main "$w" "$n" "$i" "$BUCKET"
        done
    done
done
if [ $NO_OVERLAP = 1 ]; then
    echo "ringtrain without overlap"
    cmd_rt "$NP" "$BUCKET" --no-overlap
    measure no-overlap rt "$NP" 1 "$BUCKET"
fi
if [ ${#sweep[@]} -gt 0 ]; then
    echo "ringtrain bucket sweep"
    for x in "${sweep[@]}"; do
        cmd_rt "$NP" "$x"
        measure sweep rt "$NP" 1 "$x"
    done
fi

echo
echo "Medians of $RUNS runs: $MODEL, batch $B per rank, $THREADS threads per rank, buckets of $BUCKET MB,"
echo "$(nproc) CPUs (${cpu:-unknown CPU}). images/s are global (all ranks); step time = world x batch /"
echo "images/s; scaling efficiency = $NP-rank images/s / ($NP x 1-rank images/s); exposed comm = share"
echo "of the step the gradient all-reduce adds (ringtrain: its exposed_comm_frac; PyTorch: synced vs"
echo "no_sync() step time)."
report backends "$t/results.jsonl"
echo
report main "$t/results.jsonl" "$NP"
if [ ${#sweep[@]} -gt 0 ] || [ $NO_OVERLAP = 1 ]; then
    echo
    echo "ringtrain at $NP ranks, 1 run per row: bucket size against exposed communication"
    echo
    report sweep "$t/results.jsonl"
fi
bench_finish $fails
