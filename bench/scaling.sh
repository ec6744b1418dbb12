#!/usr/bin/env bash
# scaling.sh - data-parallel scaling of `ringtrain train`: images/s at 1, 2,
# 4, ... ranks, speedup and efficiency against the smallest rank count, with
# the all-reduce overlapped with backward and without (--no-overlap).
#   bench/scaling.sh [--bin PATH] [--model M] [--ranks LIST] [--batch-size B]
#                    [--strong] [--steps S] [--repeats R] [--threads T]
#                    [--device cpu|cuda] [--allreduce auto|nccl]
#                    [--bucket-cap-mb X] [--launcher mpirun|srun|PATH]
#                    [--launcher-args ARGS] [--train-args ARGS] [--json FILE]
# Every measurement is one launch of
#   LAUNCHER -np N BIN train --synthetic-data --model M --batch-size B
#            --threads T --bucket-cap-mb X --steps S+3 --json --no-progress
#            [--no-overlap]
# (one random batch made once per rank: compute and communication only, no
# data loading), and its figure is rank 0's JSON line: steady_images_per_s,
# the global images/s (all ranks) over the steps after the first 3, not the
# whole wall time; exposed_comm_frac, the share of the step spent waiting for
# the all-reduce after backward ended, averaged over the ranks. A run counts
# as failed (and the script exits 1 at the end) when it exits non-zero, prints
# no JSON line or several (the ranks trained alone), or its world_size,
# batch_size or overlap are not what was asked.
# Weak scaling by default: --batch-size is per rank, so the global batch
# grows with the ranks (N x B), as the DDP tutorials' tables run it; with
# --strong, --batch-size is the global batch, divided among the ranks (each
# rank count must divide it). Within each repeat every configuration runs once
# and the order reverses every repeat; medians over the repeats, with min - max.
# speedup = images/s at N ranks / images/s at the smallest rank count N0 of
# --ranks (1 by default); efficiency = speedup x N0 / N (1.00 is perfect;
# the tutorials' 4 GPUs at about 3.5x are 0.88). The run at the smallest rank
# count serves both columns when it is 1 rank (no all-reduce to overlap).
# Options:
#   --bin PATH          ringtrain binary (default build/ringtrain)
#   --model M           mnist-net, resnet18, resnet9, wrn-D-K (default
#                       mnist-net: the fastest on CPUs)
#   --ranks LIST        comma-separated rank counts (default 1,2,4)
#   --batch-size B      images per step per rank (default 64); with --strong
#                       the global batch
#   --strong            strong scaling: a fixed global batch of B
#   --steps S           timed steps per run, after 3 untimed (default 30)
#   --repeats R         rounds of every configuration (default 3; --runs too)
#   --threads T         compute threads per rank, the same at every rank count,
#                       so each rank is a device of T cores (default on the
#                       CPU: nproc / the largest rank count, at least 1;
#                       with --device cuda: ringtrain's default)
#   --device D          cpu (default) or cuda: one rank per GPU; rank counts
#                       above the GPUs this node shows are skipped (unless
#                       under Slurm or with --launcher-args, where the ranks
#                       may span nodes)
#   --allreduce E       passed to train: auto (default) or nccl (needs cuda)
#   --bucket-cap-mb X   gradient bucket size in MB (default 25)
#   --launcher L        mpirun (default), or srun when SLURM_JOB_ID is set (a
#                       Slurm allocation); a path is taken as srun when its
#                       name starts with srun, else as Open MPI's mpirun.
#                       mpirun: mpirun [--allow-run-as-root] --oversubscribe
#                       --bind-to none -np N; srun: srun --mpi=pmix
#                       --kill-on-bad-exit=1 --ntasks N (--cpus-per-task T on
#                       the CPU)
#   --launcher-args A   more options for the launcher, split on spaces (e.g.
#                       "--gres-flags=allow-task-sharing" for srun on GPUs, or
#                       "--hostfile hosts" for mpirun across machines)
#   --train-args A      more options for train, split on spaces (e.g.
#                       "--amp bf16")
#   --json FILE         also write the settings, the machine, the table's rows
#                       and every run as one JSON object to FILE
# What one machine cannot show, and the output says so: with ranks per node x
# T threads above the CPUs (nproc), ranks share cores and the row, noted
# "oversubscribed", measures the stack's overhead at that rank count
# (processes, MPI, the all-reduce, contention for cores), not scaling. Ranks on
# one node exchange gradients through shared memory, not a network: a
# cluster's all-reduce crosses the interconnect, costs more and leaves more
# for overlap to hide, while ranks on one node, even on cores of their own,
# share its memory bandwidth, caches and clock budget. A row is also noted
# "busy" when other processes took more than 10 % of the CPUs during one of
# its runs (the CPUs' busy time in /proc/stat less the runs' own CPU time;
# with mpirun only: srun's ranks are not this script's children).
# Under Slurm, run it from a batch script (or salloc) whose allocation holds
# the largest rank count, e.g. with #SBATCH --nodes=2 --ntasks-per-node=2
# --cpus-per-task=8: `bench/scaling.sh --ranks 1,2,4 --threads 8 --model
# resnet18`. With SLURM_JOB_ID set it launches with srun (--launcher mpirun
# for Open MPI's launcher there); the notes judge every row against the CPUs
# of the machine the script runs on, taken as every node's.
# Needs Open MPI (or Slurm's srun) and python3. With the defaults, about 2
# minutes on 2 quiet cores.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
MODEL=mnist-net
RANKS=1,2,4
B=64
STRONG=0
STEPS=30
RUNS=3
THREADS=
DEVICE=cpu
ALLREDUCE=
BUCKET=25
LAUNCHER=
LAUNCHER_ARGS=
TRAIN_ARGS=
JSON_OUT=

bench_options --bin=RT --model=MODEL --ranks=RANKS --batch-size=B --strong=STRONG:1 --steps=STEPS \
    --repeats=RUNS --runs=RUNS --threads=THREADS --device=DEVICE --allreduce=ALLREDUCE \
    --bucket-cap-mb=BUCKET --launcher=LAUNCHER --launcher-args=LAUNCHER_ARGS --train-args=TRAIN_ARGS \
    --json=JSON_OUT -- "$@"
bench_posint "$B" "$STEPS" "$RUNS"
bench_posnum "$BUCKET" || bench_fail "--bucket-cap-mb '$BUCKET' is not a positive number"
case $DEVICE in cpu | cuda) ;; *) bench_fail "--device takes cpu or cuda" ;; esac
case $ALLREDUCE in '' | auto) ;; nccl)
    [ "$DEVICE" = cuda ] || bench_fail "--allreduce nccl needs --device cuda" ;;
*) bench_fail "--allreduce takes auto or nccl" ;; esac
ranks=()
bench_list ranks "$RANKS" --ranks
bench_posint "${ranks[@]}"
# sorted, each once
mapfile -t ranks < <(printf '%s\n' "${ranks[@]}" | sort -n -u)
n0=${ranks[0]}
nmax=${ranks[${#ranks[@]} - 1]}
NPROC=$(nproc)
if [ -z "$THREADS" ]; then
    if [ "$DEVICE" = cpu ]; then
        THREADS=$((NPROC / nmax))
        [ "$THREADS" -ge 1 ] || THREADS=1
        threads_note="nproc $NPROC / largest rank count $nmax, at least 1"
    else
        threads_note="ringtrain's default"
    fi
else
    bench_posint "$THREADS"
    threads_note="--threads"
fi
if [ "$STRONG" = 1 ]; then
    for n in "${ranks[@]}"; do
        [ $((B % n)) = 0 ] || bench_fail "--strong: the global batch $B is not divisible by $n ranks"
    done
fi
launcher_args=() train_args=()
read -r -a launcher_args <<<"$LAUNCHER_ARGS"
read -r -a train_args <<<"$TRAIN_ARGS"
if [ -z "$LAUNCHER" ]; then
    if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCHER=srun; else LAUNCHER=mpirun; fi
fi
case ${LAUNCHER##*/} in srun*) LAUNCH_KIND=srun ;; *) LAUNCH_KIND=mpirun ;; esac
RT=$(bench_bin "$RT")
if [ -n "$JSON_OUT" ]; then
    : >"$JSON_OUT" 2>/dev/null || bench_fail "cannot write --json $JSON_OUT"
    JSON_OUT=$(cd "$(dirname "$JSON_OUT")" && pwd)/${JSON_OUT##*/}
fi

# --- prerequisites -----------------------------------------------------------
bench_sudo
if [ "$DEVICE" = cpu ]; then bench_need_bin "" -DRT_CUDA=OFF; else bench_need_bin " with CUDA" -DRT_CUDA=ON; fi
PY=$(command -v python3 || true)
[ -n "$PY" ] || bench_fail "no python3 (for the report); install: ${sudo}apt-get install -y python3"
if ! command -v "$LAUNCHER" >/dev/null 2>&1; then
    if [ $LAUNCH_KIND = mpirun ]; then
        bench_fail "no $LAUNCHER (Open MPI); install: ${sudo}apt-get install -y openmpi-bin libopenmpi-dev"
    fi
    bench_fail "no $LAUNCHER (Slurm); run inside an allocation, or --launcher mpirun"
fi
if [ $LAUNCH_KIND = mpirun ] && [ "$(id -u)" -eq 0 ]; then
    # Open MPI refuses to start as root without both (--allow-run-as-root alone
    # covers mpirun's own check; these cover the launched daemons too).
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
GPUS=0
gpu_names=
if [ "$DEVICE" = cuda ]; then
    command -v nvidia-smi >/dev/null 2>&1 || bench_fail "--device cuda: nvidia-smi is not installed; no GPU here"
    gpu_names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
        awk '{n = $1; $1 = ""; printf "%s%d x%s", s, n, $0; s = ", "}') || true
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "$GPUS" -gt 0 ] || bench_fail "--device cuda: nvidia-smi lists no GPU"
    if ! pre=$("$RT" train --device cuda --synthetic-data --model "$MODEL" --batch-size 8 --steps 1 --json \
        --no-progress 2>&1); then
        echo "$bench_name: \`$RT train --device cuda --synthetic-data --steps 1\` failed:" >&2
        echo "$pre" | tail -n 5 | sed 's/^/    /' >&2
        exit 2
    fi
fi

bench_scratch rt-scaling

# --- the report helper: parses each result line, prints the table at the end -
bench_report_helper "$t/report.py" <<'EOF'
import re

BUSY = 0.10  # other processes' share of the CPUs during a run above which it is flagged
SETUP = re.compile(r"world (\d+) \((\d+) nodes?, (\d+) ranks? per node\)")

def add(results, ranks, mode, run, batch, path, wall, others):
    """Appends one measurement to results; 0 when it holds what is needed."""
    n = int(ranks)
    label = "np %-3d %-10s" % (n, mode)
    lines = json_lines(path)
    r = last_json(path)
    def fail(why):
        print("  %s FAILED: %s" % (label, why))
        return 1
    if r is None:
        return fail("no JSON line in its output")
    if len(lines) > 1:
        return fail("%d JSON summary lines, one expected (from rank 0): did the ranks train alone?" % len(lines))
    ips = r.get("steady_images_per_s")
    if not isnum(ips) or ips <= 0:
        return fail("no positive steady_images_per_s in its JSON line (fewer than 4 steps?)")
    if r.get("world_size") != n:
        return fail("world_size %r in its JSON line, %d ranks launched" % (r.get("world_size"), n))
    if r.get("batch_size") != int(batch):
        return fail("batch_size %r in its JSON line, %s asked" % (r.get("batch_size"), batch))
    if n > 1 and r.get("overlap") is not (mode == "overlap"):
        return fail("overlap %r in its JSON line, %s asked" % (r.get("overlap"), mode))
    setup = setup_line(path)
    m = SETUP.search(setup)
    if not m or int(m.group(1)) != n:
        return fail("no 'world %d (K nodes, L ranks per node)' in its set-up line: %r" % (n, setup))
    e = r.get("exposed_comm_frac")
    rec = {"ranks": n, "mode": mode, "run": int(run), "images_per_s": float(ips),
           "images_per_s_all_steps": r.get("images_per_s"),
           "exposed_comm_frac": float(e) if isnum(e) and n > 1 else None,
           "nodes": int(m.group(2)), "ranks_per_node": int(m.group(3)), "threads": r.get("threads"),
           "batch_per_rank": int(batch), "steps": r.get("steps"), "buckets": r.get("buckets"),
           "bucket_allreduces": r.get("bucket_allreduces"), "device": r.get("device"),
           "process_s": float(wall), "others_busy_frac": float(others) if others else None, "backend": setup}
    print("  %s %9.1f images/s, exposed comm %s  (%s steps, %s thread%s per rank, %s node%s, %s buckets)" % (
        label, rec["images_per_s"], pct(rec["exposed_comm_frac"]), rec["steps"], rec["threads"],
        "" if rec["threads"] == 1 else "s", rec["nodes"], "" if rec["nodes"] == 1 else "s", rec["buckets"]))
    if rec["others_busy_frac"] is not None and rec["others_busy_frac"] > BUSY:
        print("  %s NOTE: other processes used %.0f %% of the CPUs during this run" % (
            " " * len(label), 100 * rec["others_busy_frac"]))
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0

def pct(x):
    return "-" if x is None else "%.1f %%" % (100 * x)

def cells(rs, ranks_list, n0):
    """One row per rank count: per mode the medians, spread, speedup and efficiency."""
    def runs(at, mode, n):
        # One rank has no all-reduce: its run serves both columns.
        return [r for r in at if r["mode"] == mode or n == 1]
    base = {}
    for mode in ("overlap", "no-overlap"):
        xs = [r["images_per_s"] for r in runs([r for r in rs if r["ranks"] == n0], mode, n0)]
        base[mode] = statistics.median(xs) if xs else None
    rows = []
    for n in ranks_list:
        row = {"ranks": n}
        at = [r for r in rs if r["ranks"] == n]
        if at:
            row.update(nodes=max(r["nodes"] for r in at), ranks_per_node=max(r["ranks_per_node"] for r in at),
                       others_busy_frac_max=max([r["others_busy_frac"] for r in at
                                                 if r["others_busy_frac"] is not None] or [None]),
                       threads=at[0]["threads"], batch_per_rank=at[0]["batch_per_rank"],
                       global_batch=at[0]["batch_per_rank"] * n)
        for mode in ("overlap", "no-overlap"):
            xs = runs(at, mode, n)
            if not xs:
                row[mode] = None
                continue
            med, lo, hi = med_lo_hi([r["images_per_s"] for r in xs])
            ex = [r["exposed_comm_frac"] for r in xs if r["exposed_comm_frac"] is not None]
            sp = med / base[mode] if base[mode] else None
            row[mode] = {"images_per_s": med, "min": lo, "max": hi, "runs": len(xs),
                         "speedup": sp, "efficiency": sp * n0 / n if sp is not None else None,
                         "exposed_comm_frac": statistics.median(ex) if ex else None}
        rows.append(row)
    return rows

def notes(row, device, nproc, gpus, threads, n0):
    out = []
    if row["ranks"] == n0:
        out.append("base")
    if "nodes" not in row:
        return ", ".join(out + ["no run succeeded"])
    if device == "cpu" and isnum(threads):
        what = "%d ranks x %d thread%s" % (row["ranks_per_node"], threads, "" if threads == 1 else "s")
        if row["ranks_per_node"] * threads > nproc:
            out.append("oversubscribed: %s > %d CPUs" % (what, nproc))
        elif row["ranks"] > 1:
            out.append("own cores: %s <= %d CPUs" % (what, nproc))
    if device == "cuda" and row["ranks_per_node"] > gpus:
        out.append("GPUs shared (%d ranks > %d GPUs)" % (row["ranks_per_node"], gpus))
    if row["nodes"] > 1:
        out.append("%d nodes: network" % row["nodes"])
    if (row["others_busy_frac_max"] or 0) > BUSY:
        out.append("busy: others took up to %.0f %% of the CPUs" % (100 * row["others_busy_frac_max"]))
    return ", ".join(out)

def table(results, ranks, n0, device, nproc, gpus, threads, json_out, settings, machine):
    rs = load(results)
    ranks_list = [int(x) for x in ranks.split(",")]
    n0, nproc, gpus = int(n0), int(nproc), int(gpus)
    threads = int(threads) if threads else None
    rows = cells(rs, ranks_list, n0)
    def f(c, k, fmt):
        return fmt % c[k] if c and c.get(k) is not None else "n/a"
    def comm(c):
        if not c:
            return "n/a"
        return "-" if c["exposed_comm_frac"] is None else "%.1f" % (100 * c["exposed_comm_frac"])
    print("| ranks | global batch | img/s overlap | min - max | speedup | efficiency | exposed comm % "
          "| img/s no overlap | min - max | speedup | efficiency | exposed comm % | note |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        cols = [str(row["ranks"]), str(row.get("global_batch", "n/a"))]
        for mode in ("overlap", "no-overlap"):
            c = row[mode]
            cols += [f(c, "images_per_s", "%.1f"),
                     "%.1f - %.1f" % (c["min"], c["max"]) if c else "",
                     f(c, "speedup", "%.2fx"), f(c, "efficiency", "%.2f"), comm(c)]
        row["note"] = notes(row, device, nproc, gpus, threads, n0)
        cols.append(row["note"])
        print("| " + " | ".join(cols) + " |")
    if json_out:
        with open(json_out, "w") as fo:
            json.dump({"settings": json.loads(settings), "machine": json.loads(machine), "rows": rows,
                       "runs": rs}, fo, indent=1)
            fo.write("\n")
    over = [row for row in rows if row["note"].count("oversubscribed")]
    if over:
        def pl(n, w):
            return "%d %s%s" % (n, w, "" if n == 1 else "s")
        print()
        print("Oversubscribed: at %s ranks x %s per node the ranks share the node's %d CPUs, so" % (
            ",".join(str(row["ranks"]) for row in over), pl(threads, "thread"), nproc))
        print("those rows measure the overhead of the stack at that rank count (processes, MPI, the")
        print("all-reduce, contention for cores and caches), not scaling: %s of %s fit on its cores." % (
            pl(max(nproc // threads, 1), "rank"), pl(threads, "thread")))
    if any((row.get("others_busy_frac_max") or 0) > BUSY for row in rows):
        print()
        print("Busy: other processes took more than %.0f %% of this node's CPUs during some runs (rows" % (100 * BUSY))
        print("noted 'busy'); their figures are low and noisy: run again on a quiet machine.")
    nodes = max([row.get("nodes", 1) for row in rows] + [1])
    print()
    if nodes == 1 and device == "cpu":
        print("All ranks ran on one node: they exchange gradients through shared memory, not a network.")
        print("On a cluster the all-reduce crosses the interconnect, costs more and leaves more for")
        print("overlap to hide; here ranks that fit on their own cores still share the node's memory")
        print("bandwidth, caches and clock budget. Neither effect is what separate machines would see.")
    elif nodes == 1:
        print("All ranks ran on one node: NCCL moves the gradients between its GPUs (NVLink or PCIe),")
        print("not over a network; across nodes the all-reduce crosses the interconnect and costs more.")
    else:
        print("Rows noted 'K nodes: network' crossed the network between nodes; the others stayed in one")
        print("node's shared memory%s." % (" or its GPUs' links" if device == "cuda" else ""))
    print("(Cluster tutorials report about 3.5x on 4 GPUs: an efficiency of 0.88.)")
    # A row without a figure is a failure the runs above have reported.
    return 0 if all(row["overlap"] and row["no-overlap"] for row in rows) else 1

if __name__ == "__main__":
    main({"add": add, "table": table, "backends": backends})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
pl() { # N WORD -> "N WORD", or "N WORDs" unless N is 1
    if [ "$1" = 1 ]; then echo "$1 $2"; else echo "$1 ${2}s"; fi
}
per_rank() { # ranks -> the batch per rank
    if [ "$STRONG" = 1 ]; then echo $((B / $1)); else echo "$B"; fi
}
# Sets cmd=(...) to the command line of one measurement: ranks, mode.
cmd_run() {
    local n=$1 mode=$2 launch
    if [ $LAUNCH_KIND = srun ]; then
        launch=("$LAUNCHER" --mpi=pmix --kill-on-bad-exit=1 --ntasks "$n")
        [ "$DEVICE" != cpu ] || launch+=(--cpus-per-task "$THREADS")
    else
        launch=("$LAUNCHER")
        [ "$(id -u)" -ne 0 ] || launch+=(--allow-run-as-root)
        launch+=(--oversubscribe --bind-to none -np "$n")
    fi
    cmd=("${launch[@]}" "${launcher_args[@]}" "$RT" train --synthetic-data --model "$MODEL"
        --batch-size "$(per_rank "$n")" --device "$DEVICE" --bucket-cap-mb "$BUCKET"
        --steps $((STEPS + 3)) --json --no-progress)
    [ -z "$THREADS" ] || cmd+=(--threads "$THREADS")
    [ -z "$ALLREDUCE" ] || cmd+=(--allreduce "$ALLREDUCE")
    [ "$mode" = overlap ] || cmd+=(--no-overlap)
    cmd+=("${train_args[@]}")
}

# --- what it says before measuring -------------------------------------------
echo "== ringtrain data-parallel scaling: $MODEL on $DEVICE, ranks $(IFS=,; echo "${ranks[*]}") =="
bench_machine
cores=$(lscpu -p=core,socket 2>/dev/null | grep -v '^#' | sort -u | wc -l || true)
echo "cores:    ${cores:-?} physical cores, $NPROC CPUs this process may use (nproc)"
[ "$DEVICE" = cpu ] || echo "gpus:     $GPUS visible on this node: $gpu_names"
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $("$LAUNCHER" --version 2>/dev/null | head -n 1)"
if [ "$STRONG" = 1 ]; then
    echo "scaling:  strong: a fixed global batch of $B images per step, $B / N per rank"
else
    echo "scaling:  weak: $B images per rank per step, so the global batch grows with the ranks (N x $B)"
fi
echo "threads:  $(pl "${THREADS:-default}" "compute thread") per rank at every rank count ($threads_note)"
echo "settings: synthetic 3x32x32 batches, 10 classes, fp32 unless --train-args says otherwise; SGD"
echo "          momentum 0.9; buckets of $BUCKET MB; $STEPS timed steps after 3 untimed; $(pl "$RUNS" repeat),"
echo "          the order of the configurations reversed every repeat"
launch_shown=$LAUNCHER
[ $LAUNCH_KIND = srun ] || launch_shown="$launch_shown (Open MPI)"
echo "launcher: $launch_shown${LAUNCHER_ARGS:+ $LAUNCHER_ARGS}${SLURM_JOB_ID:+ in Slurm job $SLURM_JOB_ID}"
cmd_run "$nmax" overlap
echo "command:  ${cmd[*]}   [--no-overlap]"

# The configurations of one repeat: the smallest rank count once when it is 1
# (no all-reduce), else with both modes; every other count with both.
configs=()
for n in "${ranks[@]}"; do
    if [ "$DEVICE" = cuda ] && [ -z "${SLURM_JOB_ID:-}$LAUNCHER_ARGS" ] && [ "$n" -gt "$GPUS" ]; then
        echo "NOTE:     $n ranks skipped: one rank per GPU, and this node shows $GPUS"
        continue
    fi
    configs+=("$n:overlap")
    [ "$n" = 1 ] || configs+=("$n:no-overlap")
done
[ ${#configs[@]} -gt 0 ] || bench_fail "no rank count to run"
measured=()
for c in "${configs[@]}"; do
    n=${c%%:*}
    case " ${measured[*]} " in *" $n "*) ;; *) measured+=("$n") ;; esac
done

HZ=$(getconf CLK_TCK)
# The seconds every CPU together spent busy since boot (user, nice, system, irq,
# softirq, steal).
cpu_busy_s() { awk -v hz="$HZ" '/^cpu / { print ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat; }
# The user + system seconds of the shell's waited-for children, from `times` in FILE.
children_s() {
    awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); sub(/s$/, "", a[2]); s += 60 * a[1] + a[2] }
        print s }' "$1"
}

fails=0
ok=0
measure() { # ranks mode run
    local rc wall others out=$t/np$1-$2.out err=$t/np$1-$2.err
    local j0 j1
    # Other processes' share of this node's CPUs during the run: the CPUs'
    # busy time (/proc/stat) less the CPU time of this run, its processes'
    # times, which the shell's `times` adds up once mpirun has been waited
    # for (it waits for the ranks it starts here). srun's ranks are Slurm's
    # children, not this shell's: no figure under srun.
    j0=$(cpu_busy_s)
    times >"$t/times0"
    bench_run "$out" "$err"
    times >"$t/times1"
    j1=$(cpu_busy_s)
    others=
    if [ $LAUNCH_KIND = mpirun ]; then
        others=$(awk -v j0="$j0" -v j1="$j1" -v c0="$(children_s "$t/times0")" -v c1="$(children_s "$t/times1")" \
            -v w="$wall" -v n="$NPROC" 'BEGIN { o = ((j1 - j0) - (c1 - c0)) / (w * n); printf "%.3f", o < 0 ? 0 : o }')
    fi
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$(per_rank "$1")" "$out" "$wall" "$others" ||
        [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_rank_failure "$rc" "$err"
    else
        ok=$((ok + 1))
    fi
}

for i in $(seq "$RUNS"); do
    echo "repeat $i/$RUNS"
    order=("${configs[@]}")
    if [ $((i % 2)) = 0 ]; then
        mapfile -t order < <(printf '%s\n' "${configs[@]}" | tac)
    fi
    for c in "${order[@]}"; do
        cmd_run "${c%%:*}" "${c#*:}"
        measure "${c%%:*}" "${c#*:}" "$i"
    done
    if [ "$i" = 1 ] && [ "$ok" = 0 ]; then
        echo "$bench_name: every run of the first repeat failed (above); stopping" >&2
        exit 1
    fi
done

settings=$("$PY" -c 'import json, sys; a = sys.argv[1:]
print(json.dumps({"model": a[0], "ranks": [int(x) for x in a[1].split(",")], "batch_size": int(a[2]),
    "scaling": "strong" if a[3] == "1" else "weak", "steps": int(a[4]), "repeats": int(a[5]),
    "threads_per_rank": int(a[6]) if a[6] else None, "device": a[7], "allreduce": a[8] or "auto",
    "bucket_cap_mb": float(a[9]), "launcher": a[10], "launcher_args": a[11], "train_args": a[12],
    "figure": "steady_images_per_s"}))' \
    "$MODEL" "$(IFS=,; echo "${measured[*]}")" "$B" "$STRONG" "$STEPS" "$RUNS" "$THREADS" "$DEVICE" \
    "$ALLREDUCE" "$BUCKET" "$LAUNCHER" "$LAUNCHER_ARGS" "$TRAIN_ARGS")
machine=$("$PY" -c 'import json, sys; a = sys.argv[1:]
print(json.dumps({"cpu": a[0], "nproc": int(a[1]), "physical_cores": int(a[2]) if a[2].isdigit() else None,
    "gpus": int(a[3]), "gpu_names": a[4] or None, "host": a[5]}))' \
    "${cpu:-unknown CPU}" "$NPROC" "${cores:-}" "$GPUS" "$gpu_names" "$(uname -n)")

echo
if [ "$STRONG" = 1 ]; then
    scaling_line="strong scaling, global batch $B"
else
    scaling_line="weak scaling, $B per rank"
fi
echo "Medians of $(pl "$RUNS" repeat): $MODEL, $scaling_line, $(pl "${THREADS:-default}" thread) per rank, buckets of"
echo "$BUCKET MB, $DEVICE; $NPROC CPUs (${cpu:-unknown CPU}${gpu_names:+; $gpu_names})."
echo "img/s: global steady images/s (all ranks, after 3 untimed steps); speedup: against $(pl "$n0" rank);"
echo "efficiency: speedup x $n0 / ranks (1.00 perfect); exposed comm: the share of the step waiting for"
echo "the all-reduce after backward (median); no overlap: --no-overlap, the all-reduce after backward."
report backends "$t/results.jsonl"
echo
table_rc=0
report table "$t/results.jsonl" "$(IFS=,; echo "${measured[*]}")" "$n0" "$DEVICE" "$NPROC" "$GPUS" \
    "$THREADS" "$JSON_OUT" "$settings" "$machine" || table_rc=$?

[ -z "$JSON_OUT" ] || echo "JSON: $JSON_OUT"
if [ "$table_rc" -ne 0 ] && [ "$fails" = 0 ]; then
    fails=1
fi
bench_finish $fails
