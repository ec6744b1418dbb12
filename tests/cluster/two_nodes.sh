# tests/cluster/two_nodes.sh - two "nodes" on one machine, for the two-node
# cluster test (sourced after lib.sh, not run).
#
# Node n0 is network namespace rtc0, node n1 is rtc1, joined by the veth pair
# rtcv0 <-> rtcv1 (10.77.0.1 <-> 10.77.0.2; cl_netns_up). Whatever runs "on"
# a node also gets the node's hostname (a UTS namespace), half of this
# machine's CPUs (taskset) and a node-local disk: a private mount namespace
# with a tmpfs over TN_W/local, so that the same --stage-to path is a
# different disk on each node, as on a cluster. Two launchers reach them:
#  - tn_mpirun: mpirun on n0; it starts n1's orted through an ssh stand-in
#    (TN_W/nsrsh) that enters n1's namespaces. A fresh node-local disk per
#    mpirun.
#  - tn_srun: srun on n0's network, after tn_slurm_up started slurmctld and
#    `slurmd -N n0` on n0 and `slurmd -N n1` on n1, with their own munged
#    (cl_munge_up) and SLURM_CONF under TN_W. One node-local disk per slurmd,
#    for as long as it runs.
# Nothing here uses /etc/slurm, the default munge socket or the root
# namespace's ports, so a one-node Slurm test may run beside it.

TN_P=rtc
TN_HOSTS=(10.77.0.1 10.77.0.2)

# tn_init DIR: state under DIR (outside /tmp: a job's private /tmp would hide it).
tn_init() {
    TN_W=$1
    local n
    n=$(nproc)
    if [ "$n" -ge 2 ]; then
        TN_CPUS=("0-$((n / 2 - 1))" "$((n / 2))-$((n - 1))")
        TN_NCPU=$((n / 2))
    else
        TN_CPUS=(0 0)
        TN_NCPU=1
    fi
    export SLURM_CONF=$TN_W/slurm.conf
}

# Runs a command on node n0's network (the clients: srun, scontrol).
tn_in0() { nsenter --net="/run/netns/${TN_P}0" "$@"; }

# tn_net_up: the namespaces, the veth, the ssh stand-in and mpirun's host file.
tn_net_up() {
    cl_netns_up "$TN_P" || return 1
    mkdir -p "$TN_W/local"
    # plm_rsh_agent: "nsrsh HOST COMMAND..." runs COMMAND on HOST's node as ssh would (one string for sh)
    cat >"$TN_W/nsrsh" <<EOF
#!/bin/sh
case \$1 in
  ${TN_HOSTS[0]}) i=0 ;;
  ${TN_HOSTS[1]}) i=1 ;;
  *) echo "nsrsh: unknown host \$1" >&2; exit 255 ;;
esac
shift
[ \$i = 0 ] && c=${TN_CPUS[0]} || c=${TN_CPUS[1]}
exec ip netns exec ${TN_P}\$i unshare --uts --mount taskset -c \$c \
    sh -c "hostname n\$i && mount -t tmpfs -o size=256m,mode=755 n\$i-local $TN_W/local && \$*"
EOF
    chmod +x "$TN_W/nsrsh"
    printf '%s slots=2\n%s slots=2\n' "${TN_HOSTS[@]}" >"$TN_W/hosts"
}

# tn_mpirun MPIRUN-ARGS...: mpirun on n0 (its own node-local disk) over both nodes, TCP only.
tn_mpirun() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        ip netns exec "${TN_P}0" unshare --uts --mount taskset -c "${TN_CPUS[0]}" \
        sh -c 'hostname n0 && mount -t tmpfs -o size=256m,mode=755 n0-local "$0" && exec "$@"' "$TN_W/local" \
        mpirun --hostfile "$TN_W/hosts" --bind-to none --oversubscribe --mca btl tcp,self \
        --mca plm_rsh_agent "$TN_W/nsrsh" "$@"
}

# tn_slurm_up: munged, slurmctld + slurmd -N n0 on n0, slurmd -N n1 on n1; waits (30 s) for both idle.
tn_slurm_up() {
    local w=$TN_W i
    mkdir -p "$w"/{ctld,log,spool-n0,spool-n1,tmp-n0,tmp-n1}
    cl_munge_up "$w" || return 1
    echo IgnoreSystemdOnFailure=yes >"$w/cgroup.conf" # cgroup v2 without systemd
    {
        printf 'ClusterName=rtc2n\nSlurmctldHost=n0(%s)\n' "${TN_HOSTS[0]}"
        cl_slurm_conf "$w"
        # Two slurmd on one machine: spool, TmpFS, pid and log files per node (%n), or they collide.
        cat <<EOF
SlurmdSpoolDir=$w/spool-%n
TmpFS=$w/tmp-%n
SlurmdPidFile=$w/slurmd-%n.pid
SlurmdLogFile=$w/log/slurmd-%n.log
TaskPlugin=task/none
NodeName=n0 NodeAddr=${TN_HOSTS[0]} CPUs=$TN_NCPU State=UNKNOWN
NodeName=n1 NodeAddr=${TN_HOSTS[1]} CPUs=$TN_NCPU State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    } >"$w/slurm.conf"
    # Each node's daemons in its namespaces; task/none: the tasks inherit the node's CPUs and disk.
    for i in 0 1; do
        local start="slurmd -N n$i"
        [ $i = 0 ] && start="slurmctld && $start"
        nsenter --net="/run/netns/$TN_P$i" unshare --uts --mount taskset -c "${TN_CPUS[$i]}" \
            sh -c "hostname n$i && mount -t tmpfs -o size=256m,mode=755 n$i-local '$w/local' && $start" || return 1
    done
    cl_waitfor 30 '[ "$(tn_in0 sinfo -h -o %t 2>/dev/null | sort -u)" = idle ]'
}

# tn_srun SRUN-ARGS...: srun --mpi=pmix from n0's network.
tn_srun() { tn_in0 srun --mpi=pmix "$@"; }

# The veth's byte counters on n0's side: "tx rx".
tn_ctr() {
    ip netns exec "${TN_P}0" cat "/sys/class/net/${TN_P}v0/statistics/tx_bytes" \
        "/sys/class/net/${TN_P}v0/statistics/rx_bytes" | paste -sd' '
}

# Every process on node i (its network namespace): ranks, orted, slurmd, slurmstepd.
tn_node_pids() { ip netns pids "$TN_P$1" 2>/dev/null; }

# tn_node_of PID: 0 or 1, the node PID runs on (nothing if neither, or it is gone).
tn_node_of() {
    local n i
    n=$(readlink "/proc/$1/ns/net" 2>/dev/null) || return 0
    for i in 0 1; do
        [ "$n" = "net:[$(stat -L -c %i "/run/netns/$TN_P$i" 2>/dev/null)]" ] && echo $i
    done
    return 0
}

# tn_snmp: n0's TCP segments out and UDP datagrams out, from its /proc/net/snmp: "tcp udp".
tn_snmp() {
    ip netns exec "${TN_P}0" awk '/^Tcp:/ && t++ { tcp = $12 } /^Udp:/ && u++ { udp = $5 } END { print tcp, udp }' /proc/net/snmp
}

# tn_down: ends what runs on the two nodes (the jobs' processes first, then the daemons this test started,
# by their pid files, then anything left there: all of it this test's), removes the namespaces and TN_W.
# Safe to call when nothing is up, and at the start of a run after one that was killed.
tn_down() {
    [ -n "${TN_W:-}" ] || return 0
    local p i daemons
    daemons=" $(cat "$TN_W"/*.pid 2>/dev/null | paste -sd' ') "
    for i in 0 1; do
        for p in $(tn_node_pids $i); do
            [[ $daemons == *" $p "* ]] || kill -KILL "$p" 2>/dev/null
        done
    done
    # Slurm's own shutdown can wait tens of seconds on a node that is gone; its state is thrown away
    for p in $(cat "$TN_W"/slurm*.pid 2>/dev/null); do
        grep -qxE 'slurmd|slurmctld' "/proc/$p/comm" 2>/dev/null && kill -KILL "$p"
    done
    cl_stop_daemons "$TN_W"
    for i in 0 1; do
        p=$(tn_node_pids $i)
        [ -n "$p" ] && kill -KILL $p 2>/dev/null
    done
    cl_netns_down "$TN_P"
    rm -rf "$TN_W"
}
