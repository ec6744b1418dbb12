#!/usr/bin/env bash
# test_cluster_two_nodes.sh - ringtrain across two "nodes" on this machine (tests/cluster/two_nodes.sh:
# network namespaces n0 and n1 with their own hostnames, CPUs and node-local disk, joined by a veth),
# under both launchers: mpirun (through an ssh stand-in, --mca btl tcp,self) and two slurmd
# (srun --mpi=pmix -N 2). Under each:
#   1. `ringtrain ranks` shows 2 nodes, hosts n0 and n1, and names the launcher;
#   2. training traffic crosses the veth: its byte counters grow by at least the gradient volume;
#   3. `train --stage-to DIR`, 2 ranks per node: each node's local rank 0 copies once into its own
#      node-local DIR, the other rank of the node reads that same copy (same file, same disk);
#   4. the param digest equals a one-node run's with the same world size and settings;
#      and under srun, the srun job script of docs/STAGING.md (`<!-- job: srun -->`) with --nodes=2;
#   5. faults on the other node end the job within LIMIT (5) s of the injection, with a message
#      from ringtrain naming the rank, its host and the step; the time to rank 0's message, to the
#      ranks' exit and to the launcher's return are measured and printed:
#      a. a rank SIGKILLed;  b. the node gone: all its processes killed / its link down;
#      c. a rank SIGSTOPped / and SIGCONTinued during the abort (it must not blame another rank);
#      d. SIGTERM while a peer is already dead (as srun --kill-on-bad-exit sends it).
#      The launcher's return counts too, but where it waits on a node that is gone (the link down:
#      rank 1, cut off, must end on its own instead; srun with n1's slurmd killed: KillWait), and
#      mpirun after a stopped rank gets 3 s more: its clean-up sends SIGCONT, SIGTERM and SIGKILL a
#      second apart, node after node (--mca odls_base_sigkill_timeout 0 removes that).
# Usage: test_cluster_two_nodes.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip. About a minute.
# TN_FAULT_CAP=S (default 10): how long a fault run may take before it is ended and failed.
# For a closer look: TN_LAUNCHERS="mpirun srun", TN_CASES="a c1 c2 d b2 b1" (a subset), TN_KEEP=1 (leaves
# it all up; tests/cluster/two_nodes.sh's tn_down tears it down).
set -u
RT=${1:?usage: test_cluster_two_nodes.sh path/to/ringtrain}
[ -x "$RT" ] || { echo "not an executable: $RT"; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # absolute: the launchers exec it on both nodes
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster/lib.sh"
. "$HERE/cluster/two_nodes.sh"
cl_require openmpi-bin iproute2 util-linux procps slurmctld slurmd slurm-client munge

# Whatever launched this script: no launcher variables leak into the runs.
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE

LIMIT=5                       # seconds from a fault to the job's end
CAP=${TN_FAULT_CAP:-10}       # a fault run still going after this is ended (and has failed)
STEPS=20                      # the staged training run
LAUNCHERS=${TN_LAUNCHERS:-mpirun srun}
CASES=${TN_CASES:-a c1 c2 d b2 b1}  # b1 last: under srun it leaves n1 without its slurmd
W=/var/tmp/rt-cl-2n
# One run at a time on this machine (ctest's RESOURCE_LOCK covers one ctest only): the lock is held by a
# process of its own that lives as long as this script, even one killed, and that no daemon inherits.
flock -w 200 "$W.lock" sh -c ': >"$0"; exec tail --pid="$1" -f /dev/null' "$W.held.$$" $$ </dev/null >/dev/null 2>&1 &
until [ -e "$W.held.$$" ]; do
    kill -0 $! 2>/dev/null || { echo "SKIP: another run of this test held $W.lock for 200 s"; exit 77; }
    sleep 0.1
done
rm -f "$W.held.$$"
tn_init "$W"
[ "${TN_KEEP:-0}" = 1 ] || trap tn_down EXIT
trap 'exit 1' INT TERM
tn_down
mkdir -p "$W"

fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
show() { sed 's/^/     | /' "$@" | tail -n 15; }
since() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.2f", b - a }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
rank_col() { # rank_col FILE RANK COL: column COL (2 host, 3 pid, 4 node, 5 local) of RANK's row of the rank table
    awk -v r="$2" -v c="$3" '/ranks +rank +host/ { f = 1; next } f && $1 ~ /^[0-9]+$/ && $1 == r { print $c; exit }' "$1"
}
table_rows() { awk '/ranks +rank +host/ { f = 1; next } f && $1 ~ /^[0-9]+$/ { n++ } END { print n + 0 }' "$1" 2>/dev/null; }

# launch L BASE NP [launcher options] -- COMMAND...: the launcher L (mpirun or srun) in the background, NP
# ranks over the two nodes (2 per node for 4, else 1 per node), output in BASE.out and BASE.err; sets LP;
# BASE.end gets "exit-code time" when the launcher returns.
launch() {
    local l=$1 b=$2 np=$3 lo=()
    shift 3
    while [ "$1" != -- ]; do lo+=("$1"); shift; done
    shift
    rm -f "$b.end"
    if [ "$l" = mpirun ]; then
        [ "$np" -lt 4 ] && lo+=(--map-by node)
        (tn_mpirun -np "$np" ${lo[@]+"${lo[@]}"} "$@" >"$b.out" 2>"$b.err"; echo "$? $EPOCHREALTIME" >"$b.end") &
    else
        [ "$np" -ge 4 ] && lo+=(--overcommit) # 2 ranks on a node's one CPU
        (tn_srun -N 2 -n "$np" ${lo[@]+"${lo[@]}"} "$@" >"$b.out" 2>"$b.err"; echo "$? $EPOCHREALTIME" >"$b.end") &
    fi
    LP=$!
}
launcher_pid() { pgrep -P "$LP" | head -1; } # mpirun or srun (the namespace tools before it exec)
finished() { [ -s "$1.end" ]; } # finished BASE: the launcher returned
# finish BASE SECONDS: waits for the launcher to return; one still running then is killed (status 1)
finish() {
    cl_waitfor "$2" "finished '$1'" && wait "$LP" && return 0
    echo "the launcher of $1 still ran after $2 s: killed"
    kill -KILL $(launcher_pid) 2>/dev/null
    wait "$LP"
    return 1
}

# ---- data ---------------------------------------------------------------------------------------
"$RT" synth --out "$W/src" --train 2000 --test 500 --threads 1 >/dev/null && "$RT" pack "$W/src" --out "$W/small" >/dev/null &&
    "$RT" synth --out "$W/src-tiny" --train 320 --test 64 --threads 1 >/dev/null &&
    "$RT" pack "$W/src-tiny" --out "$W/tiny" >/dev/null || { echo "FAIL: synth/pack"; exit 1; }
TRAIN=(train --data "$W/small" --model mnist-net --steps $STEPS --batch-size 32 --threads 1 --no-progress)

# ---- the one-node reference: the same world size and settings on this machine -------------------
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 120 mpirun -np 4 --oversubscribe --bind-to none \
    "$RT" "${TRAIN[@]}" --stage-to "$W/ref-stage" >"$W/ref.out" 2>"$W/ref.err"
REF=$(sed -nE 's/^\[[0-9]\/4\] param digest: ([0-9a-f]+)$/\1/p' "$W/ref.err" | sort -u)
[ "$(grep -c 'param digest' "$W/ref.err")" = 4 ] && [ "$(echo "$REF" | wc -l)" = 1 ] && [ -n "$REF" ] ||
    { echo "FAIL: the one-node reference run"; show "$W/ref.out" "$W/ref.err"; exit 1; }
cl_el "one node, 4 ranks, $STEPS steps: param digest $REF"

tn_net_up || { echo "FAIL: the namespaces"; exit 1; }
cl_el "nodes up: n0 = ${TN_P}0 (CPUs ${TN_CPUS[0]}), n1 = ${TN_P}1 (CPUs ${TN_CPUS[1]}), veth ${TN_P}v0 <-> ${TN_P}v1"

# ---- 1-4 under launcher L -------------------------------------------------------------------------
checks() {
    local l=$1 d=$W/$1 p r n
    mkdir -p "$d"
    # 1. the rank table
    launch "$l" "$d/ranks" 4 -- "$RT" ranks
    finish "$d/ranks" 60
    local hosts
    hosts=$(for r in 0 1 2 3; do rank_col "$d/ranks.out" $r 2; done | paste -sd' ')
    if grep -qE "^world 4: 2 nodes, 2 ranks on this node; ranks from MPI \($l[ )]" "$d/ranks.out" &&
        [ "$hosts" = "n0 n0 n1 n1" ]; then
        pass "$l: ranks: $(head -1 "$d/ranks.out" | cut -d';' -f1-2), hosts of ranks 0-3: $hosts"
    else
        fail "$l: ranks: not 2 nodes n0, n1 (hosts: $hosts) with ranks from MPI ($l)"
        show "$d/ranks.out" "$d/ranks.err"
    fi
    # 2-4. a staged training run, 2 ranks per node
    local before after sn0 sn1 pid=() node=() dev=() file=() copies=() lock=() staged= sp= r n t
    before=$(tn_ctr)
    sn0=$(tn_snmp)
    # The ranks are looked at while they run, so the run must outlast the looking: on an AMD EPYC (Zen 4) the
    # 20 steps ended within a second of the rank table, and the loop below found every rank gone. Each loader
    # worker waits 400 ms per batch (RINGTRAIN_TEST_SLOW_LOADER): timing only, the digest is the same.
    local slow=(-x RINGTRAIN_TEST_SLOW_LOADER=400)
    [ "$l" = srun ] && slow=(--export=ALL,RINGTRAIN_TEST_SLOW_LOADER=400)
    launch "$l" "$d/train" 4 "${slow[@]}" -- "$RT" "${TRAIN[@]}" --stage-to "$W/local/stage"
    cl_waitfor 60 "[ \"\$(table_rows '$d/train.out')\" = 4 ] || finished '$d/train'"
    for r in 0 1 2 3; do pid[r]=$(rank_col "$d/train.out" $r 3); done
    # While it runs, as each rank sees it: the dataset file it reads (device:inode path), its node, its
    # node-local disk (device), the copies on it (manifests) and the copy's lock (who made it)
    for _ in $(seq 100); do
        sp=$(sed -nE "s|^\[[0-9]/4\] staged $W/small to ([^:]+): .*|\1|p" "$d/train.err" | head -1) # the copy's path
        n=0
        for r in 0 1 2 3; do
            file[r]=$(for f in /proc/${pid[r]}/fd/*; do
                t=$(readlink "$f" 2>/dev/null)
                [[ $t == */train-00000.rts ]] && echo "$(stat -L -c %d:%i "$f" 2>/dev/null) $t" && break
            done)
            [ -n "${file[r]}" ] && n=$((n + 1))
        done
        [ $n = 4 ] && [ -n "$sp" ] || finished "$d/train" && break
        sleep 0.05
    done
    for r in 0 1 2 3; do
        node[r]=$(tn_node_of "${pid[r]}")
        dev[r]=$(stat -c %d "/proc/${pid[r]}/root$W/local" 2>/dev/null)
        copies[r]=$(find "/proc/${pid[r]}/root$W/local/stage" -name manifest.json 2>/dev/null | wc -l)
        lock[r]=$(head -1 "/proc/${pid[r]}/root$sp.lock" 2>/dev/null)
    done
    finish "$d/train" 60
    after=$(tn_ctr)
    sn1=$(tn_snmp)
    staged=$(grep -E "^\[[0-9]/4\] staged $W/small to " "$d/train.err")
    local rc
    rc=$(cut -d' ' -f1 "$d/train.end" 2>/dev/null)
    [ "$rc" = 0 ] || { fail "$l: train exit $rc"; show "$d/train.out" "$d/train.err"; }
    # 2. traffic over the veth: each side must receive the other side's sum of every step's gradients;
    # over TCP: n0 sent at least that many bytes' worth of TCP segments (at most MTU - 40 bytes each), no UDP
    local mp grad tx0 rx0 tx1 rx1 tcp0 udp0 tcp1 udp1 mss
    mp=$(sed -nE 's/^  model +mnist-net, ([0-9.]+) M parameters.*/\1/p' "$d/train.out")
    grad=$(awk -v m="$mp" -v s=$STEPS 'BEGIN { printf "%.0f", (m - 0.005) * 1e6 * 4 * s }')
    read -r tx0 rx0 <<<"$before"
    read -r tx1 rx1 <<<"$after"
    read -r tcp0 udp0 <<<"$sn0"
    read -r tcp1 udp1 <<<"$sn1"
    mss=$(($(ip netns exec "${TN_P}0" cat "/sys/class/net/${TN_P}v0/mtu") - 40))
    if [ -n "$mp" ] && [ $((tx1 - tx0)) -ge "$grad" ] && [ $((rx1 - rx0)) -ge "$grad" ] &&
        [ $(((tcp1 - tcp0) * mss)) -ge "$grad" ] && [ $((udp1 - udp0)) -lt 100 ]; then
        pass "$l: veth ${TN_P}v0 sent $(((tx1 - tx0) / 1000000)) MB, received $(((rx1 - rx0) / 1000000)) MB in $STEPS steps, n0 sent $((tcp1 - tcp0)) TCP segments, $((udp1 - udp0)) UDP datagrams; the gradients: $((grad / 1000000)) MB ($STEPS x $mp M x 4 bytes)"
    else
        fail "$l: veth ${TN_P}v0 tx/rx bytes $before -> $after, n0's TCP segments/UDP datagrams out $sn0 -> $sn1 (MSS $mss): not the gradient volume $grad each way over TCP (params $mp M)"
    fi
    # 3. one copy per node, by its local rank 0 (ranks 0 and 2), read by both ranks of the node
    local ok=1 why=
    [ "${node[*]}" = "0 0 1 1" ] || { ok=0; why+=" ranks 0-3 run on nodes '${node[*]}';"; }
    [ "$(grep -c . <<<"$staged")" = 2 ] && grep -qE '^\[0/4\] staged .*: 3 of 3 files copied' <<<"$staged" &&
        grep -qE '^\[2/4\] staged .*: 3 of 3 files copied' <<<"$staged" ||
        { ok=0; why+=" not one copy of 3 files by each of ranks 0 and 2;"; }
    for r in 0 1 2 3; do
        [ "${file[r]#* }" = "$sp/train-00000.rts" ] || { ok=0; why+=" rank $r reads '${file[r]}', not $sp;"; }
        [ "${copies[r]}" = 1 ] || { ok=0; why+=" rank $r's node-local disk holds ${copies[r]} copies;"; }
    done
    [[ ${lock[0]} == "pid ${pid[0]} on n0 "* ]] && [[ ${lock[2]} == "pid ${pid[2]} on n1 "* ]] && [ "${lock[1]}" = "${lock[0]}" ] &&
        [ "${lock[3]}" = "${lock[2]}" ] || { ok=0; why+=" the locks as ranks 0-3 see them: '${lock[0]}' '${lock[1]}' '${lock[2]}' '${lock[3]}';"; }
    # the two ranks of a node: the same disk and file; the two nodes: different disks, neither the root's
    [ -n "${dev[0]}" ] && [ "${dev[0]}" = "${dev[1]}" ] && [ "${dev[2]}" = "${dev[3]}" ] && [ "${dev[0]}" != "${dev[2]}" ] &&
        [ "${dev[0]}" != "$(stat -c %d "$W/local")" ] || { ok=0; why+=" node-local disks (device ids) of ranks 0-3: ${dev[*]};"; }
    [ -n "${file[0]}" ] && [ "${file[0]%% *}" = "${file[1]%% *}" ] && [ "${file[2]%% *}" = "${file[3]%% *}" ] &&
        [ "${file[0]%% *}" != "${file[2]%% *}" ] || { ok=0; why+=" files (device:inode) read by ranks 0-3: ${file[*]%% *};"; }
    if [ $ok = 1 ]; then
        pass "$l: --stage-to: $(sed -E 's/^(\[[0-9]\/4\]) staged .*: ([0-9]+ of [0-9]+ files copied).*/\1 \2/' <<<"$staged" | sort | paste -sd'|' | sed 's/|/, /') (ranks 0, 2: local rank 0 of n0, n1); one copy on each node-local disk (devices ${dev[0]}, ${dev[2]}), its lock naming pid ${pid[0]} on n0, ${pid[2]} on n1; ranks 1, 3 read their node's copy (device:inode ${file[1]%% *}, ${file[3]%% *}, as ranks 0, 2)"
    else
        fail "$l: --stage-to:$why"
        show "$d/train.err"
    fi
    # 4. the digest
    local dg
    dg=$(sed -nE 's/^\[[0-9]\/4\] param digest: ([0-9a-f]+)$/\1/p' "$d/train.err" | sort -u)
    if [ "$(grep -c 'param digest' "$d/train.err")" = 4 ] && [ "$dg" = "$REF" ]; then
        pass "$l: 4 ranks on 2 nodes: param digest $dg, the same as on one node"
    else
        fail "$l: param digests $(echo $dg) on 2 nodes, $REF on one node"
    fi
    cl_el "$l: checks 1-4 done"
}

# ---- 5. faults ----------------------------------------------------------------------------------
FAULT=(train --data "$W/tiny" --model mnist-net --batch-size 32 --threads 1 --no-progress --epochs 100000)
RESULTS=()

gone() { # gone PID: exited (or a zombie)
    local s
    { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 0
    s=${s##*) }
    [ "${s:0:1}" = Z ]
}

# watch_until CAP PID...: polls (10 ms) until the PIDs and, unless NOL=1, the launcher are gone, or CAP s
# after T0. Sets, in seconds after T0: EXIT[pid], LEXIT (the launcher), M0 and M1 (rank 0's and rank 1's
# first error line); "" while not seen.
watch_until() {
    local cap=$1 p all
    shift
    while :; do
        all=1
        for p in "$@"; do
            [ -n "${EXIT[$p]:-}" ] || { gone "$p" && EXIT[$p]=$(since "$T0"); } || all=0
        done
        [ -n "$M0" ] || ! grep -qE '^\[0/2\] error' "$FD/r0.log" 2>/dev/null || M0=$(since "$T0")
        [ -n "$M1" ] || ! grep -qE '^\[1/2\] error' "$FD/r1.log" 2>/dev/null || M1=$(since "$T0")
        if [ -z "$LEXIT" ] && [ -z "${NOL:-}" ]; then
            finished "$FD/launcher" && LEXIT=$(since "$T0" "$(cut -d' ' -f2 "$FD/launcher.end")") || all=0
        fi
        [ $all = 1 ] && return 0
        le "$cap" "$(since "$T0")" && return 1
        sleep 0.01
    done
}

# fault L CASE: one 2-rank run (rank 0 on n0, rank 1 on n1; each rank's output in FD/rR.log), the fault
# CASE injected on n1 once training runs (rank 0 printed its first epoch), times measured, messages checked.
fault() {
    local l=$1 k=$2 lo=() p0 p1 what ts=$EPOCHREALTIME
    FD=$W/$l-$k
    mkdir -p "$FD"
    [ "$k" = d ] && [ "$l" = srun ] && lo+=(--kill-on-bad-exit=1)
    launch "$l" "$FD/launcher" 2 ${lo[@]+"${lo[@]}"} -- sh -c \
        'exec "$0" "$@" >"'"$FD"'/r${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID}.log" 2>&1' "$RT" "${FAULT[@]}"
    if ! cl_waitfor 30 "grep -q '^epoch ' '$FD/r0.log' 2>/dev/null || finished '$FD/launcher'" || finished "$FD/launcher"; then
        fail "$l $k: training did not start"
        show "$FD"/launcher.{out,err} "$FD"/r*.log
        fault_cleanup "$l" "$k"
        return
    fi
    p0=$(rank_col "$FD/r0.log" 0 3)
    p1=$(rank_col "$FD/r0.log" 1 3)
    if [ -z "$p0" ] || [ -z "$p1" ] || [ "$(tn_node_of "$p0")$(tn_node_of "$p1")" != 01 ]; then
        fail "$l $k: ranks 0 and 1 (pids '$p0', '$p1') are not on n0 and n1"
        fault_cleanup "$l" "$k"
        return
    fi
    declare -gA EXIT=()
    LEXIT= M0= M1=
    local tc= tup= wcap=$CAP
    case $k in
    a) what="SIGKILL of rank 1 on n1"
       kill -KILL "$p1" ;;
    b1) what="node n1 gone: its $(tn_node_pids 1 | wc -l) processes SIGKILLed"
        kill -KILL $(tn_node_pids 1) ;;
    b2) what="n1's link down"
        ip -n "${TN_P}1" link set "${TN_P}v1" down ;;
    c1) what="SIGSTOP of rank 1 on n1"
        kill -STOP "$p1" ;;
    c2) what="SIGSTOP of rank 1 on n1, SIGCONT once rank 0 reports"
        kill -STOP "$p1" ;;
    d) # what srun --kill-on-bad-exit does once it hears of the death; sent here at once, so that it
       # surely arrives before rank 0 could have noticed anything
       what="SIGKILL of rank 1 on n1, at once SIGTERM to rank 0"
       [ "$l" = srun ] && what+=" (and srun --kill-on-bad-exit=1)"
       kill -KILL "$p1"
       kill -TERM "$p0" ;;
    esac
    T0=$EPOCHREALTIME
    case $k in
    c2) # the abort has begun: rank 0 has said why
        while ! gone "$p0" && ! le "$CAP" "$(since "$T0")"; do
            grep -qE '^\[0/2\] error' "$FD/r0.log" && M0=$(since "$T0") && break
            sleep 0.01
        done
        kill -CONT "$p1" 2>/dev/null
        tc=$(since "$T0")
        watch_until "$CAP" "$p0" "$p1" ;;
    b2) # the ranks, with n1 cut off; then the link back, and the launcher
        NOL=1 watch_until "$CAP" "$p0" "$p1"
        ip -n "${TN_P}1" link set "${TN_P}v1" up
        tup=$(since "$T0")
        watch_until "$(awk -v a="$tup" -v c="$CAP" 'BEGIN { print a + c }')" "$p0" "$p1" ;;
    b1) # srun then waits for n1's step (see below): no need to wait here for more than the goal and a bit
        if [ "$l" = srun ]; then wcap=$((LIMIT + 1)); fi
        watch_until "$wcap" "$p0" ;;
    a | d) watch_until "$CAP" "$p0" ;;
    c1) watch_until "$CAP" "$p0" "$p1" ;;
    esac
    local r0=${EXIT[$p0]:-} r1=${EXIT[$p1]:-} lrc msg0 msg1
    lrc=$(cut -sd' ' -f1 "$FD/launcher.end" 2>/dev/null)
    msg0=$(grep -m1 -E '^\[0/2\] error' "$FD/r0.log")
    msg1=$(grep -m1 -E '^\[1/2\] error' "$FD/r1.log" 2>/dev/null)
    # the verdict
    local ok=1 why= lnote=
    [ -n "$r0" ] && le "$r0" $LIMIT || { ok=0; why+=" rank 0 took ${r0:->$wcap} s;"; }
    # with its link down, n1's rank is on its own: it must end too
    [ "$k" != b2 ] || { [ -n "$r1" ] && le "$r1" $LIMIT; } || { ok=0; why+=" rank 1 (cut off) took ${r1:->$CAP} s;"; }
    if [ "$k" = b2 ]; then
        lnote=" (not asserted: with the link down the launcher waits on n1)"
        [ -n "$LEXIT" ] || { ok=0; why+=" the launcher still ran $CAP s after the link came back;"; }
    elif [ "$k$l" = b1srun ]; then
        lnote=" (not asserted: srun waits for n1's step, which died with the node: $(grep -m1 -oE 'Waiting up to [0-9]+ seconds for job step to finish' "$FD/launcher.err" || echo 'no word from srun'); KillWait + 2 s)"
    elif [ "$l" = mpirun ] && [[ $k == c* ]]; then
        # A stopped rank is found by its silence (--peer-timeout, 3 s); after the abort, Open MPI's own clean-up
        # sends SIGCONT, SIGTERM and SIGKILL a second apart (odls_base_sigkill_timeout), node after node.
        lnote=" (mpirun's clean-up after the abort: 1 s between its signals, node after node; asserted <= $((LIMIT + 3)) s)"
        [ -n "$LEXIT" ] && le "$LEXIT" $((LIMIT + 3)) || { ok=0; why+=" the launcher took ${LEXIT:->$CAP} s;"; }
    else
        [ -n "$LEXIT" ] && le "$LEXIT" $LIMIT || { ok=0; why+=" the launcher took ${LEXIT:->$CAP} s;"; }
    fi
    [ "${lrc:-1}" != 0 ] || { ok=0; why+=" the launcher exited 0;"; }
    grep -qE "^\[0/2\] .*rank 1 \(n1, pid $p1\).*step [0-9]+" "$FD/r0.log" ||
        { ok=0; why+=" rank 0 does not name rank 1 (n1, pid $p1) and the step;"; }
    # n1's rank (but for a cut link) must not blame rank 0: once continued it says who ended the job
    if [ "$k" != b2 ] &&
        grep -qE '^\[1/2\] .*rank 0 \([^)]*\) (died|has sent no heartbeat|is behind|stopped|went silent)' "$FD/r1.log" 2>/dev/null; then
        ok=0
        why+=" rank 1 blames rank 0;"
    fi
    [ "$k" != c2 ] || [ -z "$msg1" ] || grep -qE "^\[1/2\] error: rank 0 \(n0, pid $p0\) ended the job" <<<"$msg1" ||
        { ok=0; why+=" rank 1, continued, does not say that rank 0 (n0, pid $p0) ended the job;"; }
    # a survivor that got SIGTERM while its peer was dead has no step to finish, no checkpoint to write
    ! grep -qE '^\[0/2\] stopped by signal' "$FD/r0.log" || { ok=0; why+=" rank 0 says it stopped by a signal;"; }
    local times="rank 0's message ${M0:--} s, rank 0 gone ${r0:->$wcap} s"
    [ "$k" = c1 ] || [ "$k" = c2 ] || [ "$k" = b2 ] && times+=", rank 1's message ${M1:--} s, rank 1 gone ${r1:->$CAP} s"
    times+=", $l returned ${LEXIT:->$wcap} s (exit ${lrc:-none})$lnote"
    [ -n "$tc" ] && times+="; SIGCONT at $tc s"
    [ -n "$tup" ] && times+="; link up at $tup s"
    if [ $ok = 1 ]; then
        pass "$l $k, $what: $times"
    else
        fail "$l $k, $what: $times:$why"
        show "$FD"/launcher.{out,err} "$FD/r0.log" "$FD/r1.log"
    fi
    echo "     rank 0: ${msg0:-(no error line)}"
    [ "$k" = c1 ] || [ "$k" = c2 ] || [ "$k" = b2 ] && echo "     rank 1: ${msg1:-(no error line)}"
    RESULTS+=("$(printf '%-6s %-3s %6s %7s %7s %8s%s' "$l" "$k" "${M0:--}" "${r0:->$wcap}" "${r1:--}" \
        "${LEXIT:->$wcap}" "$([ -n "$tup" ] && echo " (link up at $tup)")")")
    fault_cleanup "$l" "$k"
    cl_el "$l $k: $(since "$ts") s in all"
}

# Ends what a fault run left: the launcher, and on the two nodes the ranks (before Slurm is up: all that
# runs there is the run's); a Slurm job is cancelled and waited for (not after b1: n1's slurmd is gone);
# n1's link is up again.
fault_cleanup() {
    local i p slurm=0
    [ -s "$W/slurmctld.pid" ] && slurm=1
    for p in $(launcher_pid); do kill -KILL "$p" 2>/dev/null; done
    for i in 0 1; do
        for p in $(tn_node_pids $i); do
            [ $slurm = 0 ] || tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$RT " && kill -KILL "$p" 2>/dev/null
        done
    done
    wait "$LP" 2>/dev/null
    ip -n "${TN_P}1" link set "${TN_P}v1" up 2>/dev/null
    if [ $slurm = 1 ] && [ "$2" != b1 ]; then
        tn_in0 scancel --quiet -u root 2>/dev/null
        cl_waitfor 20 '[ -z "$(tn_in0 squeue -h 2>/dev/null)" ]' || true
    fi
}

# ---- docs/STAGING.md's srun job script (its "Several nodes" case) on both nodes ------------------------
# As test_cluster_slurm.sh runs it on one node, here with --nodes=2 on the sbatch line (one task per node:
# Slurm 22.05 will not overcommit --ntasks-per-node=2 on these one-CPU nodes): 2 ranks on 2 nodes, each node
# staging once to its own $SLURM_TMPDIR (its node-local disk), one param digest, COMPLETED.
readme_job() {
    local d=$W/readme j st o staged digests
    mkdir -p "$d" && ln -sf "$RT" "$d/ringtrain"
    cl_guide_job "$HERE/../docs/STAGING.md" srun "$d/ringtrain" "$W/small" "$d/runs" >"$d/srun.sh" ||
        { fail "srun job: not taken from docs/STAGING.md"; return; }
    j=$(tn_in0 sbatch --parsable --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
        --output="$d/job-%j.out" --export="ALL,SLURM_TMPDIR=$W/local" "$d/srun.sh" \
        --model mnist-net --batch-size 32 --threads 1 --epochs 1 2>&1) ||
        { fail "srun job of docs/STAGING.md: sbatch: $j"; return; }
    cl_waitfor 120 "[ -z \"\$(tn_in0 squeue -h -j $j 2>/dev/null)\" ]" || true
    st=$(tn_in0 scontrol -o show job "$j" | grep -oE '(^| )(JobState|Restarts|ExitCode|NodeList)=\S+' | sed 's/^ //' |
        paste -sd' ')
    o=$d/job-$j.out
    staged=$(grep -cE "^\[[01]/2\] staged $W/small to $W/local/" "$o")
    digests=$(sed -nE 's/^\[[01]\/2\] param digest: ([0-9a-f]+)$/\1/p' "$o" | sort | uniq -c | sed 's/^ *//')
    if [ "$st" = "JobState=COMPLETED Restarts=0 ExitCode=0:0 NodeList=n[0-1]" ] &&
        [ "$(rank_col "$o" 0 2) $(rank_col "$o" 1 2)" = "n0 n1" ] && [ "$staged" = 2 ] &&
        [ "${digests%% *}" = 2 ] && [ -e "$d/runs/r18-dp/finished" ]; then
        pass "srun job of docs/STAGING.md on --nodes=2: $st; ranks on n0, n1, each staged once to its node's disk; param digest ${digests#* } on both; 'finished' written"
    else
        fail "srun job of docs/STAGING.md on --nodes=2: $st; staged lines $staged (want 2); digests: $digests"
        show "$o"
    fi
}

faults() {
    local k
    for k in $CASES; do fault "$1" "$k"; done
}

for l in $LAUNCHERS; do
    # Slurm comes up after mpirun's faults: "all of n1's processes" there are mpirun's alone.
    if [ "$l" = srun ]; then
        tn_slurm_up || { echo "FAIL: Slurm did not come up"; show "$W"/log/*.log; exit 1; }
        cl_el "slurm up: $(tn_in0 sinfo -h -o '%D nodes %t %N')"
    fi
    checks "$l"
    [ "$l" = srun ] && readme_job
    faults "$l"
done

echo "fault times in seconds from the injection (goal: <= $LIMIT s): rank 0's error line, rank 0's exit (n0),"
echo "rank 1's exit (n1; where it lived on), the launcher's return"
printf '%-6s %-3s %6s %7s %7s %8s\n' launch case msg0 rank0 rank1 launcher
printf '%s\n' ${RESULTS[@]+"${RESULTS[@]}"}
cl_el "done, $fails failed"
[ $fails = 0 ] && exit 0 || exit 1
