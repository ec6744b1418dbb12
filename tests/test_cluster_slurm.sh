#!/usr/bin/env bash
# test_cluster_slurm.sh RINGTRAIN - the Slurm job scripts of docs/STAGING.md, run for real.
#
# Brings up a throwaway one-node Slurm 22.05 (munged, slurmctld, slurmd in this
# machine's root network namespace; tests/cluster/slurm_one_node.sh) with its
# state in /var/tmp/rt-cl-slurm and SLURM_CONF pointing there, and runs every job
# script docs/STAGING.md's "## Slurm" section marks with `<!-- job: NAME -->`,
# taken from that page at test time. Only the site's tokens are replaced:
# build/ringtrain -> the binary under test, /shared/datasets/cifar10 -> a small
# packed dataset, $HOME/runs -> a folder of the test. Resources stay as
# written and are overridden on the sbatch line (one node, 2 tasks or 1, one CPU
# each, or 4 tasks on its 2 CPUs, 2 GPUs of the throwaway node's gres); the runs
# are shortened by train options given after the script's name, which the
# scripts pass on ("$@").
#
#   stage           one stage task per node (the TaskProlog counts them), the copy
#                   under $SLURM_TMPDIR, loadbench's verdict
#   gpu             the GPU job on this GPU-less node: its --gpus-per-node and srun
#                   lines accepted by this Slurm, 2 GPUs allocated and seen by both
#                   ranks, which train on the CPU
#   srun_scancel    srun --mpi=pmix under sbatch, 2 ranks, stopped by scancel
#                   --signal=USR1: every rank stops at the same step and exits 0,
#                   the script requeues the job, the test releases it (scontrol
#                   update StartTime=now), it resumes at that step and finishes
#   mpirun_scancel  mpirun inside the allocation, stopped by scancel --batch
#                   --signal=USR1 (what --signal=B:USR1@T does): the batch shell's
#                   trap passes it on to mpirun; the same checks
#   srun_ref        the srun job uninterrupted: the two above end with its param
#                   digest and checkpoint (same settings; the launcher differs)
#   srun_to_1       the srun job with a node range (--nodes=1-2), stopped as in
#                   srun_scancel, its requeued job given 1 task before it starts
#                   again (scontrol update TasksPerNode=1 NumTasks=1 ...): it resumes
#                   the 2-rank run on 1 rank at the same update (accumulation 1 -> 2,
#                   said in the banner), finishes, and ends with srun_ref's weights
#                   up to summation order
#   srun_to_4       the same continued on 4 tasks (2 CPUs: --exclusive --overcommit):
#                   micro-batches 32 -> 16, one digest on the 4 ranks. The node range
#                   is what lets the task count change: with a fixed node count,
#                   sbatch writes the job's task count into its environment
#                   (SLURM_NTASKS) and srun starts that many at every start; with a
#                   range, slurmd sets SLURM_NTASKS at each start from the job's count
#   one_process     one rank, stopped by the script's own --signal=USR1@120 under
#                   --time=1, requeued, resumed; beside it (one CPU each) the same
#                   job uninterrupted (its checkpoints in $W/runs/ref), whose
#                   digest and checkpoint it ends with. slurmctld sends the signal
#                   at its time-limit check, every 30 s from its start: this pair
#                   starts 4 s before a check, the other jobs fill the time before
#                   and after it
#
# About 65 s on 2 cores, a few seconds of it waiting for the first time-limit check.
# Needs root and Debian's slurmctld, slurmd, slurm-client, munge, Open MPI and numpy;
# exits 77 without them. KEEP=1 leaves Slurm up (SLURM_CONF printed);
# "$0 down" tears it down later. Exit 0 pass, 1 fail, 77 skip.
set -uo pipefail
T=$(cd "$(dirname "$0")" && pwd)
GUIDE=$T/../docs/STAGING.md # the staging and Slurm guide, which holds the job scripts
W=/var/tmp/rt-cl-slurm
. "$T/cluster/lib.sh"
. "$T/cluster/slurm_one_node.sh"
[ "${1:-}" = down ] && { export SLURM_CONF=$W/etc/slurm.conf; slurm_one_node_down "$W"; exit 0; }
RT=$(realpath "${1:?usage: $0 path/to/ringtrain | down}")
cl_require slurmctld slurmd slurm-client munge openmpi-bin python3 python3-numpy
[ "$(nproc)" -ge 2 ] || { echo "SKIP: the jobs need 2 CPUs, this machine has $(nproc)"; exit 77; }
cl_stop_daemons "$W" # a KEEP=1 run's, if any
ss -ltn 2>/dev/null | grep -qE ':681[78]\b' &&
    { echo "SKIP: ports 6817/6818 are taken (another Slurm in this network namespace)"; exit 77; }

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
finish() {
    local rc=$?
    if [ "${KEEP:-0}" = 1 ]; then
        echo "KEEP=1: Slurm left up: export SLURM_CONF=${SLURM_CONF:-}; tear down: bash $0 down"
    else
        slurm_one_node_down "$W"
    fi
    exit $rc
}
trap finish EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # the jobs run as root here

slurm_one_node_up "$W" 2 || fail "Slurm did not come up"
cd "$W" || exit 1
cl_el "slurm up: $(sinfo -h -o '%P %D %t %N %c CPUs %G') ($(dpkg-query -W -f '${Version}' slurmd))"
mkdir -p "$W"/{jobs,out,runs,bin}
# The scripts' build/ringtrain becomes a link of the state directory's, so that what is left unreplaced can be
# found whatever the binary's own path is (a build tree's has "build/ringtrain" in it too).
ln -sf "$RT" "$W/bin/ringtrain"
"$RT" synth --out "$W/src" --train 2000 --test 500 > /dev/null &&
    "$RT" pack "$W/src" --out "$W/data/cifar10" > /dev/null || fail "synth/pack"
cl_el "dataset: 2000 train + 500 test images packed in $W/data/cifar10"

# --- the job scripts, from docs/STAGING.md ---------------------------------
known="stage one-process srun mpirun gpu"
marked=$(cl_guide_jobs "$GUIDE" | paste -sd' ')
for n in $marked; do [[ " $known " == *" $n "* ]] || fail "$GUIDE: job '$n' is not run by this test"; done
for n in $known; do
    [[ " $marked " == *" $n "* ]] || fail "$GUIDE has no job script marked <!-- job: $n --> under \"## Slurm\""
    cl_guide_job "$GUIDE" "$n" "$W/bin/ringtrain" "$W/data/cifar10" "$W/runs" > "$W/jobs/$n.sh" ||
        fail "job $n: not taken from $GUIDE"
    head -1 "$W/jobs/$n.sh" | grep -qx '#!/bin/bash' || fail "job $n: does not start with #!/bin/bash"
    [ "$n" = one-process ] && sed "s|$W/runs|$W/runs/ref|g" "$W/jobs/$n.sh" > "$W/jobs/$n-ref.sh"
done
cl_el "job scripts of docs/STAGING.md: $marked; as run (site paths replaced):"
for n in $known; do echo "--- $n.sh" && sed 's/^/    /' "$W/jobs/$n.sh"; done

# --- helpers ------------------------------------------------------------------
TRAIN=(--model mnist-net --batch-size 32 --threads 1)
jf() { scontrol -o show job "$1" 2> /dev/null | grep -oP "(^| )$2=\K\S*"; }
jended() { [[ $(jf "$1" JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]; }
jrequeued() { [ "$(jf "$1" JobState)" = PENDING ] && [ "$(jf "$1" Restarts)" -ge 1 ]; }
jline() { echo "JobState=$(jf "$1" JobState) ExitCode=$(jf "$1" ExitCode) Restarts=$(jf "$1" Restarts)"; }
out() { echo "$W/out/$1-$2.out"; }
# submit NAME [sbatch options] -- [script arguments]: prints what it runs, sets J
submit() {
    local n=$1 o=()
    shift
    while [ "$1" != -- ]; do o+=("$1") && shift; done
    shift
    J=$(sbatch --parsable --job-name="$n" --output="$W/out/%x-%j.out" "${o[@]}" "$W/jobs/$n.sh" "$@") ||
        fail "sbatch $n"
    cl_el "job $J: sbatch ${o[*]} $n.sh $*"
}
# done_ok NAME J RESTARTS: waits for the end; COMPLETED 0:0 after RESTARTS requeues, or the output and FAIL
done_ok() {
    cl_waitfor 120 "jended $2" || true
    cl_el "job $2 ($1): $(jline "$2")"
    [ "$(jline "$2")" = "JobState=COMPLETED ExitCode=0:0 Restarts=$3" ] ||
        { tail -n 30 "$(out "$1" "$2")"; fail "job $2 ($1): not COMPLETED 0:0 after $3 requeue(s)"; }
}
# the param digests of the last run in a job's output: one per rank, all equal. Not anchored to a line's
# start: Slurm keeps no order between a task's stdout and stderr, and a stderr line can land inside a long
# stdout line (--json's) where that line reached srun in two pieces.
DIGEST_RE='\[\d+/\d+\] param digest: \K[0-9a-f]+'
digest() {
    local d
    d=$(grep -oP "$DIGEST_RE" "$1" | tail -n "$2" | sort -u)
    [ "$(grep -oP "$DIGEST_RE" "$1" | wc -l)" -ge "$2" ] && [ "$(echo "$d" | wc -l)" = 1 ] ||
        { tail -n 30 "$1" >&2; fail "$1: not $2 equal param digests at the end"; }
    echo "$d"
}
# requeued_and_resumed NAME J WORLD CK [WORLD2 ACCUM2 SAYS FIELD...]: after the signal, every rank
# stopped at the same step and exited 0, the script requeued the job; the test releases it; it
# resumes at that step and finishes. With WORLD2, the pending job is first given WORLD2 tasks
# (scontrol update JobId=J FIELD...): it resumes the run on WORLD2 ranks at the same update, which
# is step S x ACCUM2 of the epoch there (the first run's accumulation is 1), its banner's "resumed"
# line saying SAYS, and ends with one param digest on its WORLD2 ranks. Sets RESUMED to that digest.
requeued_and_resumed() {
    local n=$1 j=$2 w=$3 ck=$4 w2=${5:-$3} a2=${6:-1} says=${7:-} fields=("${@:8}") o at from first want moved
    o=$(out "$n" "$j")
    cl_waitfor 60 "jrequeued $j" || { tail -n 30 "$o"; fail "job $j ($n): not requeued after the signal"; }
    at=$(grep -oP 'stopped by signal 10 \(SIGUSR1\): checkpoint saved at \Kepoch \d+ step \d+' "$o")
    first=$(grep -oP "$DIGEST_RE" "$o" | sort -u)
    [ -n "$at" ] && [ "$(grep -oP "$DIGEST_RE" "$o" | wc -l)" = "$w" ] && [ "$(echo "$first" | wc -l)" = 1 ] ||
        { cat "$o"; fail "job $j ($n): no checkpoint on SIGUSR1 with one param digest on all $w ranks"; }
    [ -e "$W/runs/$ck/finished" ] && fail "job $j ($n): stopped by the signal, yet $ck/finished exists"
    cl_el "job $j ($n): all $w ranks stopped at $at (param digest $first), exit 0; requeued by its script: $(jline "$j") Reason=$(jf "$j" Reason) StartTime=$(jf "$j" StartTime)"
    # slurmd revokes the first run's credential, to the second: a start within that second is killed
    sleep 1.1
    if [ ${#fields[@]} -gt 0 ]; then
        scontrol update JobId="$j" "${fields[@]}" || fail "scontrol update JobId=$j ${fields[*]}"
        cl_el "job $j ($n): scontrol update JobId=$j ${fields[*]}: NumTasks=$(jf "$j" NumTasks) NumCPUs=$(jf "$j" NumCPUs)"
    fi
    scontrol update JobId="$j" StartTime=now || fail "scontrol update JobId=$j StartTime=now"
    done_ok "$n" "$j" 1
    from=$(grep -oP 'resuming from \S+ at \Kepoch \d+ step \d+' "$o")
    want=$(awk -v a="$a2" '{ print $1, $2, $3, $4 * a }' <<< "$at")
    [ "$from" = "$want" ] ||
        { tail -n 40 "$o"; fail "job $j ($n): resumed at '$from', stopped at '$at' (on $w2 rank(s): '$want')"; }
    [ -e "$W/runs/$ck/finished" ] || fail "job $j ($n): $ck/finished missing after the planned epochs"
    if [ "$w2" != "$w" ]; then
        # the banner line, wherever it landed in the output (a stderr line may cut into it)
        moved=$(grep -oP 'resumed +\Ka \d+-rank run on \d+ ranks?: [^;]*' "$o")
        cl_el "job $j ($n): resumed: $moved"
        [ "$moved" = "$says" ] || { tail -n 40 "$o"; fail "job $j ($n): the banner does not say '$says'"; }
    fi
    RESUMED=$(digest "$o" "$w2") || exit 1
    cl_el "job $j ($n): resumed at $from on $w2 rank(s), ended with param digest $RESUMED"
    mv "$W/runs/$ck" "$W/runs/$ck.job$j"
}
# same_as NAME J DIGEST REF_DIGEST CK REF_CK: the requeued run's weights are the uninterrupted run's
same_as() {
    cl_el "job $2 ($1): param digest $3 after the requeue, $4 uninterrupted"
    [ "$3" = "$4" ] || fail "job $2 ($1): param digest $3 after the requeue, $4 uninterrupted"
    /usr/bin/python3 "$T/../tools/compare_checkpoints.py" checkpoint "$W/runs/$6" "$W/runs/$5" | sed 's/^/  /' ||
        fail "job $2 ($1): the checkpoint differs from the uninterrupted run's"
}
# close_to NAME J CK REF_CK: the requeued run's weights are the uninterrupted run's up to summation order:
# the largest absolute difference of a parameter within 1e-4 of the largest absolute parameter. Measured
# with mpirun (mnist-net, 62 updates, stopped after 20; bf16, this test's --amp auto on a CPU with
# AVX512_BF16, and fp32): 2 ranks -> 1 rank adds the same two micro-batches and gives the same bits (0,
# both); 4 ranks -> 1 rank, four micro-batches summed in another order, 9e-7 (bf16) and 7e-5 (fp32);
# 4 -> 2 ranks 9e-6 (fp32); 2 -> 4 ranks, other micro-batches (other dropout masks), 0.1. The bound
# takes the summation orders and refuses the other computation.
close_to() {
    local r
    r=$(/usr/bin/python3 - "$T/../tools" "$W/runs/$3/model.safetensors" "$W/runs/$4/model.safetensors" <<'EOF'
import sys
sys.dont_write_bytecode = True  # nothing written under tools/
sys.path.insert(0, sys.argv[1])
import numpy as np
from compare_checkpoints import load_safetensors
def params(p):
    _, ts, data = load_safetensors(p)
    return {n: np.frombuffer(data[o[0]:o[1]], "<f4").astype(np.float64) for n, dt, sh, o in ts if dt == "F32"}
a, b = params(sys.argv[2]), params(sys.argv[3])
if not a or sorted(a) != sorted(b) or any(a[k].shape != b[k].shape for k in a):
    sys.exit("not the same fp32 tensors: %s vs %s" % (sorted(a), sorted(b)))
d = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
m = max(float(np.max(np.abs(b[k]))) for k in b)
print("%.3g %.3g %.3g %d" % (d, m, d / m, len(a)))
EOF
    ) || fail "job $2 ($1): cannot compare $3 with $4"
    set -- "$@" $r
    cl_el "job $2 ($1): $8 parameter tensors, max |difference| $5 from the uninterrupted run's, max |weight| $6: $7 of it (bound 1e-4)"
    awk -v x="$7" 'BEGIN { exit !(x <= 1e-4) }' || fail "job $2 ($1): the weights differ from the uninterrupted run's by $7 (> 1e-4) of the largest"
}
# uninterrupted NAME J WORLD CK: finished, one digest on every rank (in REF); CK kept as CK.ref
uninterrupted() {
    done_ok "$1" "$2" 0
    [ -e "$W/runs/$4/finished" ] || fail "job $2 ($1): $4/finished missing after the planned epochs"
    REF=$(digest "$(out "$1" "$2")" "$3") || exit 1
    mv "$W/runs/$4" "$W/runs/$4.ref"
}
# wait_for_line FILE REGEX: waits for the job's output to show it (the banner's rank table: training starts)
wait_for_line() { cl_waitfor 60 "grep -qE '$2' '$1' 2>/dev/null" || { cat "$1"; fail "$1: no line /$2/"; }; }

# --- the jobs -----------------------------------------------------------------
# stage: once per node, under $SLURM_TMPDIR
job_stage() {
    local o steps
    submit stage --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --
    done_ok stage "$J" 0
    o=$(out stage "$J")
    steps=$(awk -v j="$J" '$1 == j && $2 != "?" { n[$2]++ } END { for (s in n) printf "step %s: %d task(s); ", s, n[s] }' "$W/log/tasks")
    cl_el "job $J (stage): $steps SLURM_TMPDIR held: $(awk -v j="$J" '$1 == j { $1 = ""; print }' "$W/log/jobtmp")"
    [ "$(awk -v j="$J" '$1 == j && $2 == 0' "$W/log/tasks" | wc -l)" = 1 ] || fail "job $J: stage did not run once on the node"
    awk -v j="$J" '$1 == j' "$W/log/jobtmp" | grep -qE ' ringtrain-' || fail "job $J: no staged copy under SLURM_TMPDIR"
    grep -iE 'warning|error' "$o" && fail "job $J: warnings or errors"
    grep -E '^verdict:' "$o" || fail "job $J: no loadbench verdict"
}
# srun --mpi=pmix, 2 ranks: the reference run
job_srun_ref() {
    local o
    submit srun --ntasks-per-node=2 --cpus-per-task=1 -- "${TRAIN[@]}" --epochs 2
    o=$(out srun "$J")
    uninterrupted srun "$J" 2 r18-dp
    D2=$REF
    grep -E '^ringtrain train: world|staged ' "$o"
    grep -qE "staged .* to $W/jobtmp/$J/ringtrain-" "$o" || fail "job $J: not staged under SLURM_TMPDIR"
    cl_el "job $J (srun): uninterrupted, param digest $D2"
}
# the same, stopped by scancel --signal=USR1 (to every task of the step)
job_srun_scancel() {
    submit srun --ntasks-per-node=2 --cpus-per-task=1 -- "${TRAIN[@]}" --epochs 2
    wait_for_line "$(out srun "$J")" '^  ranks '
    scancel --signal=USR1 "$J" && cl_el "scancel --signal=USR1 $J"
    requeued_and_resumed srun "$J" 2 r18-dp
    LATER+=("srun $J $RESUMED r18-dp.job$J")
}
# The srun job again, 2 tasks on 1 of 1-2 nodes, stopped by scancel --signal=USR1 as above; its requeued
# job is given WORLD2 tasks (scontrol update FIELD...) and continues the run there.
# srun_to WORLD2 ACCUM2 SAYS "SBATCH OPTIONS" FIELD...: sets J
srun_to() {
    local w2=$1 a2=$2 says=$3 o
    read -ra o <<< "$4"
    shift 4
    submit srun --nodes=1-2 --ntasks-per-node=2 --cpus-per-task=1 "${o[@]}" -- "${TRAIN[@]}" --epochs 2
    wait_for_line "$(out srun "$J")" '^  ranks '
    scancel --signal=USR1 "$J" && cl_el "scancel --signal=USR1 $J"
    requeued_and_resumed srun "$J" 2 r18-dp "$w2" "$a2" "$says" "$@"
}
# ... on 1 task: the same micro-batches, two per update on the one rank
job_srun_to_1() {
    srun_to 1 2 'a 2-rank run on 1 rank: accumulation 1 -> 2' '' \
        TasksPerNode=1 NumTasks=1 MinCPUsNode=1 NumCPUs=1
    CLOSE+=("srun_to_1 $J r18-dp.job$J")
}
# ... on 4 tasks, on the 2 CPUs: half micro-batches, one per rank. A node takes no more tasks than it has
# CPUs (TasksPerNode=4: "Requested node configuration is not available"), so the job drops its count per
# node (TasksPerNode=0) and srun, still given 2 per node by sbatch's environment, says it ignores that
# ("can't honor --ntasks-per-node set to 2 ...") and starts 4.
job_srun_to_4() {
    srun_to 4 1 'a 2-rank run on 4 ranks: micro-batch 32 -> 16, accumulation 1 -> 1' \
        '--exclusive --overcommit' TasksPerNode=0 NumTasks=4
}
# mpirun inside the allocation, stopped through the batch shell's trap
job_mpirun_scancel() {
    submit mpirun --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 -- "${TRAIN[@]}" --epochs 2
    wait_for_line "$(out mpirun "$J")" '^  ranks '
    scancel --batch --signal=USR1 "$J" && cl_el "scancel --batch --signal=USR1 $J"
    requeued_and_resumed mpirun "$J" 2 r18-4n
    grep -E '^mpirun: Forwarding signal' "$(out mpirun "$J")" || fail "job $J: mpirun did not forward SIGUSR1"
    LATER+=("mpirun $J $RESUMED r18-4n.job$J")
}
# the GPU job on a node without GPUs
job_gpu() {
    local o g
    submit gpu --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 -- "${TRAIN[@]}" --epochs 1
    o=$(out gpu "$J")
    uninterrupted gpu "$J" 2 r18-gpu
    g=$(scontrol -d show job "$J" | grep -oE 'GRES=\S+' | head -1)
    cl_el "job $J (gpu): TresPerNode=$(jf "$J" TresPerNode) $g"
    [ "$(jf "$J" TresPerNode)" = gres:gpu:2 ] && [[ $g == GRES=gpu:2* ]] || fail "job $J: no GPUs allocated"
    grep -A2 -E '^  ranks ' "$o"
    cl_el "job $J (gpu): CUDA_VISIBLE_DEVICES of the ranks: $(awk -v j="$J" '$1 == j && $2 == 0 { printf "%s ", $5 }' "$W/log/tasks")"
    [ "$(awk -v j="$J" '$1 == j && $2 == 0 && $5 == "0,1"' "$W/log/tasks" | wc -l)" = 2 ] ||
        fail "job $J: the ranks do not both see the node's 2 GPUs"
    [ "$(grep -cE '^ +[01] +\S+ +[0-9]+ +0 +[01] .* cpu$' "$o")" = 2 ] || fail "job $J: both ranks not on the CPU"
}
# One process, stopped by the script's own --signal=USR1@120 under --time=1, and beside it
# (one CPU each) its reference run, with checkpoints in $W/runs/ref. slurmctld sends the
# signal at its time-limit check, every 30 s: the jobs start a few seconds before the next one.
next_tick() {
    local t
    t=$(grep -oP '^\[\K[^]]+(?=\] debug.*(Testing job time limits|slurmctld starting))' "$W/log/slurmctld.log" | tail -1)
    awk -v t="$(date -d "$t" +%s.%N)" -v now="$EPOCHREALTIME" -v lead="$1" \
        'BEGIN { n = t + 30; while (n - lead < now) n += 30; printf "%.3f", n }'
}
job_one_process() {
    local ref
    sleep "$(awk -v n="$(next_tick 4)" -v now="$EPOCHREALTIME" 'BEGIN { d = n - 4 - now; print (d > 0 ? d : 0) }')"
    submit one-process-ref --cpus-per-task=1 -- "${TRAIN[@]}" --epochs 5
    ref=$J
    submit one-process --cpus-per-task=1 --time=1 -- "${TRAIN[@]}" --epochs 5
    cl_waitfor 40 "grep -q 'warning signal 10 to JobId=$J\$' '$W/log/slurmctld.log'" || fail "job $J: no warning signal"
    cl_el "slurmctld: $(grep -E "warning signal 10 to JobId=$J\$" "$W/log/slurmctld.log")"
    requeued_and_resumed one-process "$J" 1 r18
    uninterrupted one-process-ref "$ref" 1 ref/r18
    cl_el "job $ref (one-process-ref): uninterrupted, param digest $REF"
    same_as one-process "$J" "$RESUMED" "$REF" "r18.job$J" ref/r18.ref
}

# The one-process pair goes in when the next check is 4 s away; the other jobs fill the time
# before it (the first, in this order, that fits: each one's usual length in seconds on 2
# cores, plus one) and after it. The scancel ones are compared with srun_ref at the end.
queued=(stage:4 gpu:3 srun_scancel:8 mpirun_scancel:8 srun_to_1:8 srun_to_4:10 srun_ref:4)
ONE='' D2='' LATER=() CLOSE=()
while [ ${#queued[@]} -gt 0 ]; do
    pick=
    for i in "${!queued[@]}"; do
        if [ -n "$ONE" ] || awk -v n="$(next_tick 4)" -v now="$EPOCHREALTIME" -v l="${queued[$i]#*:}" \
            'BEGIN { exit !(now + l + 1 <= n - 4) }'; then
            pick=$i
            break
        fi
    done
    if [ -z "$pick" ]; then
        job_one_process
        ONE=1
        continue
    fi
    "job_${queued[$pick]%:*}"
    unset "queued[$pick]"
done
[ -n "$ONE" ] || job_one_process
for c in "${LATER[@]}"; do
    set -- $c
    same_as "$1" "$2" "$3" "$D2" "$4" r18-dp.ref
done
for c in "${CLOSE[@]}"; do
    set -- $c
    close_to "$1" "$2" "$3" r18-dp.ref
done
cl_el "PASS"
