# tests/cluster/lib.sh - shared pieces of the cluster tests (sourced, not run).
#
# The cluster tests bring up real daemons on this machine: a throwaway Slurm
# (munge, slurmctld, slurmd from Debian's packages) and two "nodes" as network
# namespaces joined by a veth pair. They need root with CAP_SYS_ADMIN and
# CAP_NET_ADMIN and the packages tools/install-deps.sh --test installs; where
# any of that is missing they exit 77 (ctest's skip) saying what is missing.
#
# Every test keeps its state in its own directory outside /tmp (a job's private
# /tmp would hide it), runs its own munged on its own socket (so two tests, or
# a site's munged, never share one), and stops only the daemons whose pid files
# it wrote. The recipes these settings come from ran end to end on a 2-core
# Debian 12 machine without systemd; docs/ARCHITECTURE.md ("Cluster tests")
# lists the settings that mattered.

# Seconds since the test started, before a message.
cl_t0=${EPOCHREALTIME}
cl_el() { awk -v a="$cl_t0" -v b="$EPOCHREALTIME" -v m="$*" 'BEGIN{printf "[%7.2fs] %s\n", b-a, m}'; }

# cl_waitfor SECONDS 'shell condition': polls every 0.2 s; 1 when it timed out.
cl_waitfor() {
    local i
    for i in $(seq $(($1 * 5))); do
        eval "$2" && return 0
        sleep 0.2
    done
    echo "timed out after $1 s: $2" >&2
    return 1
}

# cl_require PACKAGE...: exits 77 unless this is root with the capabilities to
# make namespaces and the packages are installed.
cl_require() {
    local miss=() p
    [ "$(id -u)" = 0 ] || { echo "SKIP: needs root (daemons, namespaces, other users)"; exit 77; }
    unshare --net --uts true 2>/dev/null ||
        { echo "SKIP: needs CAP_SYS_ADMIN and CAP_NET_ADMIN (unshare --net --uts failed)"; exit 77; }
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || miss+=("$p"); done
    [ ${#miss[@]} = 0 ] || { echo "SKIP: packages missing: ${miss[*]} (tools/install-deps.sh --test installs them)"; exit 77; }
}

# cl_munge_up DIR: a munged of our own, its key, socket and pid file under DIR
# (DIR/run/sock is the socket; slurm.conf names it with AuthInfo=socket=...).
cl_munge_up() {
    local d=$1
    mkdir -p "$d/munge" "$d/run"
    mungekey -c -k "$d/munge/munge.key" >/dev/null
    chown -R munge: "$d/munge" "$d/run"
    chmod 700 "$d/munge"
    chmod 755 "$d/run" "$d"
    runuser -u munge -- /usr/sbin/munged --socket="$d/run/sock" --key-file="$d/munge/munge.key" \
        --pid-file="$d/run/munged.pid" --log-file="$d/munge/munged.log" --seed-file="$d/munge/seed"
    cl_waitfor 10 "[ -s '$d/run/munged.pid' ]"
    cp "$d/run/munged.pid" "$d/munged.pid"
}

# cl_slurm_conf DIR: the slurm.conf lines every throwaway Slurm here shares: state, pid and log
# files of slurmctld under DIR, the munged of cl_munge_up DIR, no cgroup plugins (proctrack/linuxproc;
# the caller writes cgroup.conf with IgnoreSystemdOnFailure=yes beside slurm.conf), root as SlurmUser.
# The caller adds the cluster's name and host, its slurmd, node and partition lines.
cl_slurm_conf() {
    cat <<EOF
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$1/run/sock
StateSaveLocation=$1/ctld
SlurmctldPidFile=$1/slurmctld.pid
SlurmctldLogFile=$1/log/slurmctld.log
ProctrackType=proctrack/linuxproc
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
EOF
}

# cl_stop_daemons DIR: stops the slurmd, slurmctld and munged whose pid files
# are DIR/*.pid, and waits up to 10 s for them to go.
cl_stop_daemons() {
    local f p pids=
    for f in "$1"/*.pid; do
        p=$(cat "$f" 2>/dev/null) || continue
        grep -qxE 'slurmd|slurmctld|munged' "/proc/$p/comm" 2>/dev/null && pids+=" $p"
    done
    [ -n "$pids" ] || return 0
    kill $pids 2>/dev/null
    for p in $(seq 100); do kill -0 $pids 2>/dev/null || return 0; sleep 0.1; done
    kill -9 $pids 2>/dev/null
    return 0
}

# cl_netns_up PREFIX: two "nodes", network namespaces PREFIX0 and PREFIX1
# joined by the veth pair PREFIXv0 <-> PREFIXv1 (10.77.0.1 <-> 10.77.0.2).
# Enter them with nsenter --net=/run/netns/PREFIXn (not ip netns exec, which
# remounts /sys without the cgroup filesystem slurmd needs).
cl_netns_up() {
    local p=$1 i
    cl_netns_down "$p"
    ip netns add "${p}0"
    ip netns add "${p}1"
    ip link add "${p}v0" netns "${p}0" type veth peer name "${p}v1" netns "${p}1"
    for i in 0 1; do
        ip -n "$p$i" addr add "10.77.0.$((i + 1))/24" dev "${p}v$i"
        ip -n "$p$i" link set lo up
        ip -n "$p$i" link set "${p}v$i" up
    done
}

# cl_guide_jobs GUIDE: the names of the job scripts GUIDE's "## Slurm" section marks with
# `<!-- job: NAME -->` (docs/STAGING.md, the staging and Slurm guide), one a line, in order.
cl_guide_jobs() {
    awk '/^## / { sl = $0 == "## Slurm" }
        sl && /^<!-- job: [a-z0-9-]+ -->$/ { sub(/^<!-- job: /, ""); sub(/ -->$/, ""); print }' "$1"
}

# cl_guide_job GUIDE NAME RT DATA RUNS: prints the job script GUIDE's "## Slurm" section marks
# with `<!-- job: NAME -->` (the ```sh block right after the marker), with only the site's tokens
# replaced: build/ringtrain -> RT, /shared/datasets/cifar10 -> DATA, $HOME/runs -> RUNS. 1 when
# there is no such block, or a site path is left (RT must not itself contain "build/ringtrain").
cl_guide_job() {
    local guide=$1 name=$2 rt=$3 data=$4 runs=$5 text
    # One awk over the whole file, reading to its end (an early exit would SIGPIPE a writer before it: a
    # failure under pipefail, now and then).
    text=$(awk -v m="<!-- job: $name -->" '
        /^## / { sl = $0 == "## Slurm" }
        done || !sl { next }
        $0 == m { f = 1; next }
        f == 1 { if ($0 != "```sh") f = 0; else f = 2; next }
        f == 2 { if ($0 == "```") done = 1; else print }
        END { exit !done }' "$guide") || { echo "$guide: no \`\`\`sh block right after <!-- job: $name --> under \"## Slurm\"" >&2; return 1; }
    text=$(printf '%s\n' "$text" | sed -e "s|build/ringtrain|$rt|g" -e "s|/shared/datasets/cifar10|$data|g" \
        -e "s|\$HOME/runs|$runs|g")
    if printf '%s\n' "$text" | grep -nE 'build/ringtrain|/shared/|\$HOME' >&2; then
        echo "$guide: job $name: a site path left unreplaced" >&2
        return 1
    fi
    printf '%s\n' "$text"
}

cl_netns_down() {
    ip netns del "${1}0" 2>/dev/null
    ip netns del "${1}1" 2>/dev/null
    return 0
}
