#!/usr/bin/env bash
# test_cluster_python.sh PYDIR - the PyTorch example's Slurm job script, run for real.
#
# PYDIR is the build's python folder (<build>/python, holding ringtrain/ and its C module). Brings
# up the throwaway one-node Slurm of tests/cluster/slurm_one_node.sh (state in /var/tmp/rt-cl-py),
# and:
#   1. `cifar10_resnet18_ddp.py --prepare` writes a small synthetic CIFAR-10 both ways; the packed
#      copy and the torchvision copy hold the same records (images and labels, per split);
#   2. python/examples/slurm_ddp.sbatch, as it is in the tree, with the resources overridden on the
#      sbatch line (one node, 2 tasks, one CPU each) and the run shortened by the script's options
#      after the dataset (2 epochs of 2 steps, batch 4 per rank): COMPLETED 0:0; staged once (one
#      task) under $SLURM_TMPDIR; 2 ranks trained (one task each), and the JSON line says world 2,
#      gloo, ringtrain, 2 steps and 2 x 2 x 4 images per epoch, every one of the 35 test images
#      validated exactly once per epoch across the ranks (35 is odd: the ranks' shares differ, and
#      each rank's last batch is a short one), a finite loss, and equal parameter digests on both
#      ranks (the replicas agree);
#   3. docs/STAGING.md (the staging and Slurm guide) shows that job script word for word (the ```sh block after
#      `<!-- file: python/examples/slurm_ddp.sbatch -->`).
# About 30 s on 2 cores (most of it the job: torch starting, ResNet-18's first steps on one core). Needs root, Debian's slurmctld, slurmd, slurm-client, munge, python3-torch
# and python3-torchvision, and the ringtrain module in PYDIR; exits 77 without them.
# KEEP=1 leaves Slurm up (SLURM_CONF printed); "$0 down" tears it down later. Exit 0 pass, 1 fail, 77 skip.
set -uo pipefail
T=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$T/.." && pwd)
JOB=$TOP/python/examples/slurm_ddp.sbatch
SCRIPT=$TOP/python/examples/cifar10_resnet18_ddp.py
W=/var/tmp/rt-cl-py
PY=/usr/bin/python3
. "$T/cluster/lib.sh"
. "$T/cluster/slurm_one_node.sh"
[ "${1:-}" = down ] && { export SLURM_CONF=$W/etc/slurm.conf; slurm_one_node_down "$W"; exit 0; }
PYDIR=$(realpath "${1:?usage: $0 path/to/build/python | down}")
cl_require slurmctld slurmd slurm-client munge python3-torch python3-torchvision
[ "$(nproc)" -ge 2 ] || { echo "SKIP: the job needs 2 CPUs, this machine has $(nproc)"; exit 77; }
ls "$PYDIR"/ringtrain/_ringtrain*.so > /dev/null 2>&1 ||
    { echo "SKIP: no ringtrain module in $PYDIR/ringtrain (a build without python3-dev)"; exit 77; }
cl_stop_daemons "$W" # a KEEP=1 run's, if any
ss -ltn 2>/dev/null | grep -qE ':681[78]\b' &&
    { echo "SKIP: ports 6817/6818 are taken (another Slurm in this network namespace)"; exit 77; }

# Whatever launched this test: no launcher variables leak into the job.
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export PYTHONPATH=$PYDIR # sbatch passes it on to the job

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

slurm_one_node_up "$W" 2 || fail "Slurm did not come up"
cd "$W" || exit 1
mkdir -p "$W/out"
cl_el "slurm up: $(sinfo -h -o '%P %D %t %N %c CPUs') ($(dpkg-query -W -f '${Version}' slurmd))"

# --- 1. the data, both ways ---------------------------------------------------------
TRAIN=512 TEST=35
# --prepare, then the two copies compared, in one process (one start of torch).
"$PY" - "$SCRIPT" "$W/data" $TRAIN $TEST << 'EOF' || fail "--prepare, or the packed and torchvision copies differ"
import os
import runpy
import sys

script, root, sizes = sys.argv[1], sys.argv[2], {"train": int(sys.argv[3]), "test": int(sys.argv[4])}
sys.path.insert(0, os.path.dirname(script))  # as `python3 SCRIPT` has it
sys.argv = [script, "--prepare", root, "--synth-train", str(sizes["train"]), "--synth-test", str(sizes["test"])]
runpy.run_path(script, run_name="__main__")
import common
import ringtrain

CIFAR10 = common.local_cifar("cifar10")
for split, n in sizes.items():
    tv = CIFAR10(root + "/torchvision", train=split == "train")
    rt = ringtrain.Dataset(root + "/packed", split)
    a = sorted((tv.data[i].tobytes(), tv.targets[i]) for i in range(len(tv)))
    b = sorted((rt[i][0].tobytes(), rt[i][1]) for i in range(len(rt)))
    if len(a) != n or len(b) != n:
        sys.exit(f"{split}: {len(a)} records in the torchvision copy, {len(b)} packed, {n} written")
    diff = sum(x != y for x, y in zip(a, b))
    if diff or tv.classes != rt.classes:
        sys.exit(f"{split}: {diff} of {n} (image, label) pairs differ; classes {tv.classes} / {rt.classes}")
    print(f"  {split}: the same {n} images and labels in both copies, classes {', '.join(rt.classes)}")
EOF
cl_el "dataset: $TRAIN train + $TEST test images in $W/data/packed and $W/data/torchvision"

# --- 2. the job script --------------------------------------------------------------
EPOCHS=2 STEPS=2 BATCH=4
J=$(sbatch --parsable --chdir="$TOP" --output="$W/out/%x-%j.out" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
    "$JOB" "$W/data/packed" --epochs $EPOCHS --steps $STEPS --batch-size $BATCH --workers 1 --lr 0.01 --json) ||
    fail "sbatch"
O=$W/out/r18-ddp-$J.out
cl_el "job $J: sbatch --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 slurm_ddp.sbatch $W/data/packed --epochs $EPOCHS --steps $STEPS --batch-size $BATCH --workers 1 --lr 0.01 --json"
jf() { scontrol -o show job "$1" 2> /dev/null | grep -oP "(^| )$2=\K\S*"; }
cl_waitfor 120 '[[ $(jf $J JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]' || true
state="$(jf "$J" JobState) $(jf "$J" ExitCode)"
cl_el "job $J: $state"
sed 's/^/  /' "$O"
[ "$state" = "COMPLETED 0:0" ] || fail "job $J: $state, not COMPLETED 0:0"

tasks() { awk -v j="$J" -v s="$1" '$1 == j && $2 == s { print $3 }' "$W/log/tasks" | sort | paste -sd' '; }
[ "$(tasks 0)" = 0 ] || fail "job $J: the staging step ran on tasks '$(tasks 0)', not once"
[ "$(tasks 1)" = "0 1" ] || fail "job $J: the training step ran ranks '$(tasks 1)', not 0 and 1"
grep -qE "^staged $W/data/packed to $W/jobtmp/$J/ringtrain-[0-9]+/[0-9a-f]{16}\$" "$O" ||
    fail "job $J: the data not staged under SLURM_TMPDIR ($W/jobtmp/$J)"
awk -v j="$J" '$1 == j' "$W/log/jobtmp" | grep -qE ' ringtrain-[0-9]+' || fail "job $J: no staged copy left in SLURM_TMPDIR"
cl_el "job $J: staged by one task into SLURM_TMPDIR, trained by ranks 0 and 1"

grep -E '^\{' "$O" | tail -n 1 > "$W/out/result.json"
"$PY" - "$W/out/result.json" $EPOCHS $STEPS $BATCH $TEST << 'EOF' || fail "job $J: the JSON line"
import json, math, sys

with open(sys.argv[1]) as f:
    r = json.load(f)
epochs, steps, batch, test = map(int, sys.argv[2:])
bad = []


def want(what, got, expected):
    if got != expected:
        bad.append(f"{what}: {got!r}, expected {expected!r}")


want("world_size", r["world_size"], 2)
want("backend", r["backend"], "gloo")
want("loader", r["loader"], "ringtrain")
want("device", r["device"], "cpu")
want("epochs", len(r["epochs"]), epochs)
for e in r["epochs"]:
    n, loss, test_loss = e["epoch"], e["train_loss"], e["test_loss"]
    want(f"epoch {n} steps", e["steps"], steps)
    want(f"epoch {n} images", e["images"], steps * batch * 2)
    want(f"epoch {n} test images", e["test_images"], test)
    if not (math.isfinite(loss) and 0 < loss < 20 and math.isfinite(test_loss)):
        bad.append(f"epoch {n}: training loss {loss}, test loss {test_loss}")
    if not 0 <= e["wait_share"] < 1:
        bad.append(f"epoch {n}: data wait share {e['wait_share']}")
want("steps_total", r["steps_total"], epochs * steps)
d = r["param_digests"]
if len(d) != 2 or len(set(d)) != 1:
    bad.append(f"parameter digests of the ranks: {d} (replicas out of step)")
if bad:
    sys.exit("\n".join(bad))
print(f"  world {r['world_size']} ({r['backend']}), {epochs} epochs of {steps} steps x 2 ranks x {batch} images, "
      f"all {test} test images validated each epoch, final loss {r['final_loss']:.3f}, "
      f"parameter digest {d[0]} on both ranks, data wait {100 * r['data_wait_share']:.1f}% of the step")
EOF

# --- 3. the guide's copy ----------------------------------------------------------
readme=$(awk -v m="<!-- file: python/examples/slurm_ddp.sbatch -->" '
    $0 == m { f = 1; next }
    f == 1 { f = $0 == "```sh" ? 2 : 0; next }
    f == 2 { if ($0 == "```") { f = 0; done = 1 } else print }
    END { exit !done }' "$TOP/docs/STAGING.md") || fail "docs/STAGING.md: no \`\`\`sh block right after <!-- file: python/examples/slurm_ddp.sbatch -->"
diff <(printf '%s\n' "$readme") "$JOB" > /dev/null ||
    { diff -u <(printf '%s\n' "$readme") "$JOB" | head -n 30; fail "docs/STAGING.md's slurm_ddp.sbatch differs from $JOB"; }
cl_el "docs/STAGING.md shows python/examples/slurm_ddp.sbatch as it is"
cl_el "PASS"
