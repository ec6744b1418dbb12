# tests/cluster/slurm_one_node.sh - a throwaway one-node Slurm (sourced after lib.sh, not run).
#
# slurm_one_node_up DIR [GPUS] brings up munged (its own socket), slurmctld and
# slurmd in this machine's root network namespace, on the default ports, all
# state under DIR and SLURM_CONF=DIR/etc/slurm.conf exported (nothing is written
# under /etc/slurm); slurm_one_node_down DIR stops only those daemons (their pid
# files in DIR). The settings are the known-working recipe's (docs/ARCHITECTURE.md,
# "Cluster tests"): SlurmUser=root, proctrack/linuxproc, no cgroup plugins,
# NodeName = hostname -s. The site conventions the job scripts of docs/STAGING.md rely on
# are set up as a site would:
#   - SLURM_TMPDIR: the Prolog makes DIR/jobtmp/JOBID, the TaskProlog exports it,
#     the Epilog removes it;
#   - GPUS (default 2) GPUs of gres type gpu: character devices with the NVIDIA
#     driver's major number, which nothing opens on a GPU-less machine; they give
#     Slurm GPUs to hand out and to bind tasks to.
# For the tests to look at: the TaskProlog appends "JOBID STEP RANK HOST
# CUDA_VISIBLE_DEVICES" to DIR/log/tasks for every task it starts (STEP is "?"
# for the batch shell), the Epilog "JOBID NAMES..." of what the job left in its
# SLURM_TMPDIR to DIR/log/jobtmp. slurmctld logs at debug2, which includes its
# time-limit checks ("Testing job time limits") and the --signal warnings it sends.
# batch_sched_delay=0: a job is started as soon as the node is free, not up to 3 s
# later.

# slurm_one_node_up DIR [GPUS]: 0 once the node is idle; 1 (with the logs' tails) if not.
slurm_one_node_up() {
    local w=$1 h gpus=${2:-2} i
    h=$(hostname -s)
    rm -rf "$w"
    mkdir -p "$w"/{etc,ctld,spool,log,jobtmp,dev}
    cl_munge_up "$w" || return 1
    for ((i = 0; i < gpus; i++)); do mknod -m 600 "$w/dev/nvidia$i" c 195 "$i" || return 1; done
    printf '#!/bin/sh\nmkdir -p %s/jobtmp/$SLURM_JOB_ID && chown $SLURM_JOB_UID %s/jobtmp/$SLURM_JOB_ID\n' \
        "$w" "$w" > "$w/etc/prolog"
    printf '#!/bin/sh\nd=%s/jobtmp/$SLURM_JOB_ID\necho "$SLURM_JOB_ID $(ls $d | paste -sd" ")" >> %s/log/jobtmp\nrm -rf $d\n' \
        "$w" "$w" > "$w/etc/epilog"
    printf '#!/bin/sh\necho "$SLURM_JOB_ID ${SLURM_STEP_ID:-?} $SLURM_PROCID $(hostname -s) ${CUDA_VISIBLE_DEVICES-unset}" >> %s/log/tasks\n%s\n' \
        "$w" "echo export SLURM_TMPDIR=$w/jobtmp/\$SLURM_JOB_ID" > "$w/etc/taskprolog"
    chmod 755 "$w"/etc/{prolog,epilog,taskprolog}
    : > "$w/log/tasks"
    : > "$w/log/jobtmp"
    chmod 666 "$w/log/tasks"
    echo IgnoreSystemdOnFailure=yes > "$w/etc/cgroup.conf" # cgroup v2 without systemd
    echo "NodeName=$h Name=gpu File=$w/dev/nvidia[0-$((gpus - 1))]" > "$w/etc/gres.conf"
    {
        printf 'ClusterName=rtslurm\nSlurmctldHost=%s(127.0.0.1)\n' "$h"
        cl_slurm_conf "$w"
        cat <<EOF
SlurmdSpoolDir=$w/spool
SlurmdPidFile=$w/slurmd.pid
SlurmdLogFile=$w/log/slurmd.log
SlurmctldDebug=debug2
TaskPlugin=task/affinity
SchedulerParameters=batch_sched_delay=0
GresTypes=gpu
Prolog=$w/etc/prolog
Epilog=$w/etc/epilog
TaskProlog=$w/etc/taskprolog
NodeName=$h NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    } > "$w/etc/slurm.conf"
    export SLURM_CONF=$w/etc/slurm.conf
    slurmctld && slurmd || return 1
    cl_waitfor 30 '[ "$(sinfo -h -o %t 2>/dev/null)" = idle ]' && return 0
    tail -n 20 "$w"/log/*.log
    return 1
}

# slurm_one_node_down DIR: cancels what is left, stops the daemons DIR's pid
# files name, removes DIR.
slurm_one_node_down() {
    local w=$1
    [ -n "${SLURM_CONF:-}" ] && scancel --full --quiet -u root 2>/dev/null && sleep 0.5
    cl_stop_daemons "$w"
    rm -rf "$w"
}
