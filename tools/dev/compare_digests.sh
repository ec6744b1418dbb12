#!/usr/bin/env bash
# compare_digests.sh - proves that two versions of ringtrain train the same
# thing: builds both, runs the same small training recipes with each on one
# dataset, and compares what the runs leave, bit for bit.
#
#   tools/dev/compare_digests.sh [options] [OLD_REV] [NEW]
#
#   OLD_REV  a git revision (default 3919d55), built from `git archive OLD_REV`
#   NEW      a git revision, built the same way, or nothing (the default): the
#            working tree as it is, uncommitted changes and files git does not
#            track yet (and does not ignore) included
#
# Both are built Release, -DRT_CUDA=OFF, with Ninja, in a scratch directory
# under ${TMPDIR:-/tmp}; nothing is written to the repository. One dataset is
# made once (`synth --format cifar10 --train 3000 --test 1000 --seed 4`,
# packed with --val-split 0.1: 2700 train, 300 val, 1000 test; and packed
# again without a val split for eval, whose test split is the same records --
# up to 3919d55 `eval` scored the val split when there was one). Recipes,
# mnist-net, batch 64, --threads 2 (1 per rank under mpirun), --workers 1:
#   1 sgd-cosine   1 rank, 2 epochs, SGD + cosine (the defaults); also
#                  `eval --json` on its checkpoint
#   2 adamw-accum  1 rank, 2 epochs, --grad-accum 2 --label-smoothing 0.1
#                  --schedule onecycle --optimizer adamw --clip-grad-norm 1
#   3 loss-scale   1 rank, 1 epoch, --loss-scale dynamic with
#                  RINGTRAIN_TEST_OVERFLOW=2:3 (3 updates skipped)
#   4 resume       recipe 1 stopped by --steps 20 (mid epoch 1), then --resume
#   5 sigterm      recipe 1 sent SIGTERM a second into training (it finishes
#                  the step, saves, exits 0), then --resume
#   6 np2          mpirun -np 2, 2 epochs, batch 32 per rank, --grad-accum 2
#                  --bucket-cap-mb 0.05
#   6r np2-resume  recipe 6 stopped by --steps 10 (mid epoch 1), then --resume
#   7 resnet9-np2  mpirun -np 2, resnet9 (batchnorm running statistics),
#                  --steps 6, batch 8 per rank, --check-replicas 2
# Compared between the old and the new build, recipe by recipe: every rank's
# `[r/w] param digest` line; model.safetensors and optimizer.safetensors
# (every tensor's name, dtype, shape and bytes; the metadata but for
# checkpoint_id); state.json but for checkpoint_id and train_ns; the --metrics
# rows but for their timing fields (for recipe 5 the last row of each epoch:
# where SIGTERM lands is a matter of timing); the --json summary line but for
# its timing fields; recipe 1's eval loss and accuracy. The resumed runs
# (4, 5, 6r) must also end with the digest, weights and optimizer state of
# their uninterrupted run (1, 1, 6) of the same build ("=uninterrupted(N)").
# tools/compare_checkpoints.py does the reading; run it alone to compare two
# checkpoints.
#
# Prints the CPU, then one line per recipe: name, old and new rank-0 digest,
# MATCH or DIFFER, the artefacts compared (and what differed, under the line),
# then a verdict line. Exit status: 0 when every recipe matches, 1 when any
# differs or a run fails, 2 on a usage error or a failed build. The scratch
# directory is removed on success and kept (its path printed) otherwise.
#
# Options:
#   --only LIST   comma-separated recipes to run (e.g. 1,6r), default all
#   --keep        keep the scratch directory even when everything matches
#   -h, --help    this text
# Environment:
#   RT_COMPARE_NEW_EXTRA  options added to every `train` of the new side only.
#                         Self-check: RT_COMPARE_NEW_EXTRA="--seed 1" must make
#                         every recipe DIFFER and the script exit 1.
#   TMPDIR                where the scratch directory goes (default /tmp)
# Needs git, cmake, ninja, a C compiler, Open MPI's mpirun (recipes 6, 6r, 7)
# and python3. About 3 minutes on 2 cores.
set -eu
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$here/../.." && pwd)
ALL_RECIPES="1 2 3 4 5 6 6r 7"

usage() {
    sed -n '2,/^set -eu/p' "$0" | sed -n 's/^# \{0,1\}//p'
    exit "${1:-0}"
}
ONLY=
KEEP=0
pos=()
while [ $# -gt 0 ]; do
    case $1 in
    --only) ONLY=${2:?--only needs a list}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage 0 ;;
    -*) echo "compare_digests: unknown option '$1'" >&2; usage 2 >&2 ;;
    *) pos+=("$1"); shift ;;
    esac
done
[ ${#pos[@]} -le 2 ] || { echo "compare_digests: at most two revisions (OLD_REV NEW)" >&2; exit 2; }
OLD_REV=${pos[0]:-3919d55}
NEW_REV=${pos[1]:-}
recipes=$ALL_RECIPES
if [ -n "$ONLY" ]; then
    recipes=$(echo "$ONLY" | tr ',' ' ')
    for r in $recipes; do
        case " $ALL_RECIPES " in *" $r "*) ;; *) echo "compare_digests: no recipe '$r' (recipes: $ALL_RECIPES)" >&2; exit 2 ;; esac
    done
fi
read -r -a NEW_EXTRA <<<"${RT_COMPARE_NEW_EXTRA:-}"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "compare_digests: python3 is needed" >&2; exit 2; }
CMP=$ROOT/tools/compare_checkpoints.py
for tool in git cmake ninja tar timeout; do
    command -v "$tool" >/dev/null 2>&1 || { echo "compare_digests: $tool is needed" >&2; exit 2; }
done
case " $recipes " in
*" 6 "* | *" 6r "* | *" 7 "*)
    command -v mpirun >/dev/null 2>&1 ||
        { echo "compare_digests: recipes 6, 6r and 7 need Open MPI's mpirun (or leave them out: --only 1,2,3,4,5)" >&2; exit 2; } ;;
esac
for rev in "$OLD_REV" ${NEW_REV:+"$NEW_REV"}; do
    git -C "$ROOT" rev-parse -q --verify "$rev^{commit}" >/dev/null ||
        { echo "compare_digests: '$rev' is not a revision of $ROOT" >&2; exit 2; }
done
rev_label() { # REV -> "REV (abbreviated hash)", or the hash alone when REV is one
    local h
    h=$(git -C "$ROOT" rev-parse --short "$1^{commit}")
    case $h in "$1"*) echo "$h" ;; *) echo "$1 ($h)" ;; esac
}
old_label=$(rev_label "$OLD_REV")
if [ -n "$NEW_REV" ]; then
    new_label=$(rev_label "$NEW_REV")
else
    new_label="the working tree (on $(git -C "$ROOT" rev-parse --short HEAD))"
fi

if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# One machine, whatever launched this script: no launcher variables or test
# hooks leak into the runs.
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD|RINGTRAIN_)' || true); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE

S=$(mktemp -d "${TMPDIR:-/tmp}/rt-compare-XXXXXX")
status=2 # what the exit trap reports; 0 only once every recipe matched
BG=      # the background job of recipe 5's interrupted run, and its ringtrain
RT_PID=
finish() {
    [ -z "$RT_PID" ] || kill "$RT_PID" 2>/dev/null || true
    [ -z "$BG" ] || wait "$BG" 2>/dev/null || true
    if [ "$status" = 0 ] && [ "$KEEP" = 0 ]; then
        rm -rf "$S"
    else
        echo "scratch directory kept: $S"
    fi
}
trap finish EXIT
trap 'exit 2' INT TERM

echo "== compare_digests: does $new_label train what $old_label trained? =="
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "cpu:      ${cpu:-unknown CPU}, $(nproc) CPUs"
[ ${#NEW_EXTRA[@]} -eq 0 ] || echo "NOTE:     RT_COMPARE_NEW_EXTRA: the new side's train runs add: ${NEW_EXTRA[*]}"

# --- the two builds ------------------------------------------------------------
# export_tree REV DIR: the tree of REV (the working tree when REV is empty) into DIR.
export_tree() {
    mkdir -p "$2"
    if [ -n "$1" ]; then
        git -C "$ROOT" archive "$1" | tar -x -C "$2"
    else
        # Tracked files deleted in the working tree are left out.
        git -C "$ROOT" ls-files -co --exclude-standard -z |
            while IFS= read -r -d '' f; do
                if [ -e "$ROOT/$f" ] || [ -L "$ROOT/$f" ]; then printf '%s\0' "$f"; fi
            done |
            tar -C "$ROOT" --null -T - -cf - | tar -x -C "$2"
    fi
}
# build SIDE REV: $S/SIDE-build/ringtrain, or exit 2 with the build's last lines.
build() {
    local side=$1 rev=$2 t0=$SECONDS
    export_tree "$rev" "$S/$side-src"
    if ! { cmake -S "$S/$side-src" -B "$S/$side-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRT_CUDA=OFF &&
        cmake --build "$S/$side-build" -j2 --target ringtrain; } >"$S/$side-build.log" 2>&1; then
        echo "build:    $side FAILED (the end of $S/$side-build.log):"
        tail -n 15 "$S/$side-build.log" | sed 's/^/          /'
        exit 2
    fi
    echo "build:    $side ok in $((SECONDS - t0)) s: $S/$side-build/ringtrain"
}
build old "$OLD_REV"
build new "$NEW_REV"
RT_old=$S/old-build/ringtrain

# --- the dataset, made once (by the old build) -----------------------------------
D=$S/data
"$RT_old" synth --format cifar10 --out "$D/src" --train 3000 --test 1000 --seed 4 --threads 1 >/dev/null
"$RT_old" pack "$D/src" --out "$D/ds" --val-split 0.1 >"$D/pack.out"
"$RT_old" pack "$D/src" --out "$D/ds-test" >/dev/null
echo "dataset:  $(sed -n 's/^pack: \([0-9]* records ([^)]*)\).*/\1/p' "$D/pack.out"), synth cifar10 --seed 4, pack --val-split 0.1"
echo

# --- running one side ------------------------------------------------------------
BASE=(--data "$D/ds" --model mnist-net --batch-size 64 --threads 2 --workers 1 --no-progress --json)
NP2=(--data "$D/ds" --model mnist-net --batch-size 32 --threads 1 --workers 1 --no-progress --json
    --grad-accum 2 --bucket-cap-mb 0.05)
RESNET=(--data "$D/ds" --model resnet9 --batch-size 8 --threads 1 --workers 1 --no-progress --json
    --steps 6 --check-replicas 2)

# train SIDE OUT NP [VAR=VALUE ...] -- OPTIONS...: one `train` of SIDE's binary
# (under mpirun when NP > 1), stdout to OUT.out, stderr to OUT.err; its status.
train() {
    local side=$1 out=$2 np=$3 rt envs=()
    shift 3
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rt=$S/$side-build/ringtrain
    local extra=()
    [ "$side" = old ] || extra=(${NEW_EXTRA[@]+"${NEW_EXTRA[@]}"})
    local launch=()
    [ "$np" = 1 ] || launch=(mpirun --oversubscribe --bind-to none -np "$np")
    echo "${envs[*]+${envs[*]} }${launch[*]+${launch[*]} }$rt train $* ${extra[*]+${extra[*]}}" >"$out.cmd"
    env ${envs[@]+"${envs[@]}"} timeout -k 10 600 ${launch[@]+"${launch[@]}"} "$rt" train "$@" \
        ${extra[@]+"${extra[@]}"} >"$out.out" 2>"$out.err"
}

# run_recipe NAME SIDE: the recipe's runs for SIDE under $S/SIDE/NAME/; 1 when
# one of them failed (its output in run.err names which).
run_recipe() {
    local name=$1 side=$2 d=$S/$2/$1
    rm -rf "$d" && mkdir -p "$d"
    case $name in
    1) train "$side" "$d/run" 1 -- "${BASE[@]}" --epochs 2 --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" &&
        "$S/$side-build/ringtrain" eval --data "$D/ds-test" --checkpoint "$d/ck/model.safetensors" --threads 2 --workers 1 \
            --json >"$d/eval.out" 2>"$d/eval.err" ;;
    2) train "$side" "$d/run" 1 -- "${BASE[@]}" --epochs 2 --grad-accum 2 --label-smoothing 0.1 --schedule onecycle \
        --optimizer adamw --clip-grad-norm 1 --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" ;;
    3) train "$side" "$d/run" 1 RINGTRAIN_TEST_OVERFLOW=2:3 -- "${BASE[@]}" --epochs 1 --loss-scale dynamic \
        --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" ;;
    4) train "$side" "$d/part" 1 -- "${BASE[@]}" --epochs 2 --steps 20 --checkpoint-dir "$d/ck" \
        --metrics "$d/metrics.jsonl" &&
        train "$side" "$d/run" 1 -- "${BASE[@]}" --epochs 2 --resume --checkpoint-dir "$d/ck" \
            --metrics "$d/metrics.jsonl" ;;
    5) sigterm_run "$side" "$d" &&
        train "$side" "$d/run" 1 -- "${BASE[@]}" --epochs 2 --resume --checkpoint-dir "$d/ck" \
            --metrics "$d/metrics.jsonl" ;;
    6) train "$side" "$d/run" 2 -- "${NP2[@]}" --epochs 2 --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" ;;
    6r) train "$side" "$d/part" 2 -- "${NP2[@]}" --epochs 2 --steps 10 --checkpoint-dir "$d/ck" \
        --metrics "$d/metrics.jsonl" &&
        train "$side" "$d/run" 2 -- "${NP2[@]}" --epochs 2 --resume --checkpoint-dir "$d/ck" \
            --metrics "$d/metrics.jsonl" ;;
    7) train "$side" "$d/run" 2 -- "${RESNET[@]}" --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" ;;
    esac
}

# sigterm_run SIDE DIR: recipe 1 in the background, SIGTERM to it once it has
# trained for a second; 0 when it stopped by the signal, saved and exited 0.
sigterm_run() {
    local side=$1 d=$2 rc=0
    train "$side" "$d/part" 1 -- "${BASE[@]}" --epochs 2 --checkpoint-dir "$d/ck" --metrics "$d/metrics.jsonl" &
    BG=$!
    RT_PID=
    for _ in $(seq 600); do # the banner's rank table gives its pid; training starts after it
        RT_PID=$(awk '/ranks +rank +host/ { f = 1; next } f && $1 == "0" { print $3; exit }' "$d/part.out" 2>/dev/null)
        [ -z "$RT_PID" ] || break
        sleep 0.1
    done
    sleep 1
    [ -z "$RT_PID" ] || kill -TERM "$RT_PID" 2>/dev/null || true
    wait "$BG" || rc=$?
    BG=
    RT_PID=
    if [ $rc -ne 0 ] || ! grep -q 'stopped by signal 15' "$d/part.err"; then
        echo "SIGTERM did not stop the run as it should (status $rc; did the run end before the signal?)" >>"$d/part.err"
        return 1
    fi
}

# digests FILE: the sorted "[r/w] param digest: X" lines of FILE.
digests() { grep -oE '^\[[0-9]+/[0-9]+\] param digest: [0-9a-f]{16}' "$1" 2>/dev/null | sort || true; }
rank0() { digests "$1" | sed -n 's/^\[0\/[0-9]*\] param digest: //p'; }

# The artefacts of the recipe being compared, and what differed.
same=()
differ=()
details=
# art WHAT COMPARISON...: runs the comparison and files WHAT as same or differing.
art() {
    local what=$1
    shift
    if "$@"; then same+=("$what"); else differ+=("$what"); fi
}
# cmp_files TAG KIND A B: compare_checkpoints.py KIND A B; its complaints, tagged, go to details.
cmp_files() {
    local tag=$1 out rc=0
    out=$("$PY" "$CMP" "$2" "$3" "$4" 2>&1) || rc=$?
    [ "$rc" -ne 0 ] || return 0
    details+=$(echo "$out" | grep -v '^same: ' | sed "s|^|      $tag|")$'\n'
    return 1
}
# cmp_digests TAG A B: every rank's digest line of A equals B's, and there is at least one.
cmp_digests() {
    local a b
    a=$(digests "$2")
    b=$(digests "$3")
    [ -z "$a" ] || [ "$a" != "$b" ] || return 0
    details+="      ${1}digests differ: old: $(echo "${a:-none}" | paste -sd,); new: $(echo "${b:-none}" | paste -sd,)"$'\n'
    return 1
}
# cmp_uninterrupted BASE NAME: for each build, the resumed recipe NAME ends with
# BASE's digest, weights and optimizer state.
cmp_uninterrupted() {
    local side ok=0 u r tag
    for side in old new; do
        u=$S/$side/$1
        r=$S/$side/$2
        tag="$side, resumed against uninterrupted: "
        cmp_digests "$tag" "$u/run.err" "$r/run.err" || ok=1
        cmp_files "$tag" safetensors "$u/ck/model.safetensors" "$r/ck/model.safetensors" || ok=1
        cmp_files "$tag" safetensors "$u/ck/optimizer.safetensors" "$r/ck/optimizer.safetensors" || ok=1
    done
    return "$ok"
}

# compare_recipe NAME: old against new (and a resumed run against its
# uninterrupted one); prints the recipe's line, and under it what differed.
fails=0
compare_recipe() {
    local name=$1 o=$S/old/$1 n=$S/new/$1 label
    same=()
    differ=()
    details=
    art digest cmp_digests "" "$o/run.err" "$n/run.err"
    art model cmp_files "" safetensors "$o/ck/model.safetensors" "$n/ck/model.safetensors"
    art optim cmp_files "" safetensors "$o/ck/optimizer.safetensors" "$n/ck/optimizer.safetensors"
    art state cmp_files "" state "$o/ck/state.json" "$n/ck/state.json"
    if [ "$name" = 5 ]; then # where the signal lands is timing: the whole epochs' rows only
        art metrics cmp_files "" metrics-final "$o/metrics.jsonl" "$n/metrics.jsonl"
    else
        art metrics cmp_files "" metrics "$o/metrics.jsonl" "$n/metrics.jsonl"
        art summary cmp_files "" summary "$o/run.out" "$n/run.out"
    fi
    [ "$name" != 1 ] || art eval cmp_files "" eval "$o/eval.out" "$n/eval.out"
    case $name in
    4 | 5) art "=uninterrupted(1)" cmp_uninterrupted 1 "$name" ;;
    6r) art "=uninterrupted(6)" cmp_uninterrupted 6 "$name" ;;
    esac
    label=$(printf '%-3s %-12s' "$name" "$(recipe_title "$name")")
    if [ ${#differ[@]} -eq 0 ]; then
        printf '%s %-16s  %-16s  MATCH   %s%s\n' "$label" "$(rank0 "$o/run.err")" "$(rank0 "$n/run.err")" \
            "${same[*]}" "$(recipe_note "$name")"
    else
        fails=$((fails + 1))
        printf '%s %-16s  %-16s  DIFFER  differ: %s; same: %s%s\n' "$label" "$(rank0 "$o/run.err")" \
            "$(rank0 "$n/run.err")" "${differ[*]}" "${same[*]:-none}" "$(recipe_note "$name")"
        printf '%s' "$details"
    fi
}
# recipe_note NAME: what shows the recipe did what it is for, old / new.
recipe_note() {
    local side x=() v
    case $1 in
    3) for side in old new; do
        v=$("$PY" -c 'import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print("%s of %s" % (r.get("skipped_steps"), r.get("steps")))' "$S/$side/3/run.out" 2>/dev/null || echo "?")
        x+=("$v")
    done
        echo " (updates skipped: ${x[0]} / ${x[1]})" ;;
    5) for side in old new; do
        v=$(sed -n 's/.*stopped by signal 15 .*: checkpoint saved at \(epoch [0-9]* step [0-9]*\).*/\1/p' \
            "$S/$side/5/part.err")
        x+=("${v:-?}")
    done
        echo " (SIGTERM stopped at ${x[0]} / ${x[1]})" ;;
    esac
}
recipe_title() {
    case $1 in
    1) echo sgd-cosine ;; 2) echo adamw-accum ;; 3) echo loss-scale ;; 4) echo resume ;; 5) echo sigterm ;;
    6) echo np2 ;; 6r) echo np2-resume ;; 7) echo resnet9-np2 ;;
    esac
}

# --- the recipes -------------------------------------------------------------------
# A resumed recipe needs its uninterrupted one: run it too (not printed).
need=$recipes
for r in $recipes; do
    case $r in 4 | 5) need="1 $need" ;; 6r) need="6 $need" ;; esac
done
printf '%-16s %-16s  %-16s  %-7s %s\n' recipe "old digest" "new digest" result "artefacts"
t0=$SECONDS
for r in $ALL_RECIPES; do
    case " $need " in *" $r "*) ;; *) continue ;; esac
    run_failed=0
    for side in old new; do
        if ! run_recipe "$r" "$side"; then
            run_failed=1
            printf '%-3s %-12s %s run FAILED; the end of its output (%s):\n' "$r" "$(recipe_title "$r")" "$side" "$S/$side/$r"
            for f in "$S/$side/$r"/*.err; do
                [ -s "$f" ] && tail -n 4 "$f" | sed 's/^/      /'
            done
        fi
    done
    if [ $run_failed = 1 ]; then
        fails=$((fails + 1))
        continue
    fi
    case " $recipes " in *" $r "*) compare_recipe "$r" ;; esac
done
n=$(echo "$recipes" | wc -w)
echo
if [ $fails -eq 0 ]; then
    echo "verdict:  MATCH: all $n recipes bit-identical, $new_label against $old_label ($((SECONDS - t0)) s of runs)"
    status=0
else
    echo "verdict:  DIFFER: $fails of $n recipes differ or failed, $new_label against $old_label"
    status=1
fi
exit $status
