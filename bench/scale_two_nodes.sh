#!/usr/bin/env bash
# scale_two_nodes.sh - bench/scale.py across two "nodes" on this machine: the
# cluster harness's network namespaces n0 and n1 (tests/cluster/two_nodes.sh:
# their own hostnames, half the CPUs each, joined by a veth, mpirun reaching
# n1 through an ssh stand-in, TCP only), with --per-node ranks on each node, so
# that the heartbeat mesh, the rank table's node summary and the faults cross a
# node boundary. Needs root (namespaces); exits 77 without.
#   bench/scale_two_nodes.sh [--per-node 16,32] [scale.py options...]
#   bench/scale_two_nodes.sh --per-node 16 --faults kill,stop,term
# Each --per-node count K runs scale.py --ranks 2K with mpirun --npernode K.
# The victim of the faults, rank 3N/4+1, is on n1; rank 0, which prints, on n0.
set -u
here=$(cd "$(dirname "$0")" && pwd)
per_node=16,32
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --per-node) per_node=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
    *) args+=("$1"); shift ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "scale_two_nodes: needs root (network namespaces); skipped"; exit 77; }
. "$here/../tests/cluster/lib.sh"
. "$here/../tests/cluster/two_nodes.sh"
W=/var/tmp/rt-scale-2n
tn_init "$W"
trap tn_down EXIT
tn_down
mkdir -p "$W"
tn_net_up || { echo "scale_two_nodes: cannot make the namespaces; skipped"; exit 77; }
# The launcher scale.py runs: tn_mpirun with the harness's state, as a command of its own.
cat >"$W/mpirun" <<EOS
#!/usr/bin/env bash
. "$here/../tests/cluster/lib.sh"
. "$here/../tests/cluster/two_nodes.sh"
TN_W=$W
TN_CPUS=(${TN_CPUS[0]} ${TN_CPUS[1]})
tn_mpirun "\$@"
EOS
chmod +x "$W/mpirun"
rc=0
for k in ${per_node//,/ }; do
    echo "== two nodes, $k ranks each"
    /usr/bin/python3 "$here/scale.py" --launcher "$W/mpirun" --mpirun-args "--npernode $k" --ranks $((2 * k)) \
        ${args[@]+"${args[@]}"} || rc=1
done
exit $rc
