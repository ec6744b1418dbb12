#!/usr/bin/env bash
# test_multirank.sh - `ringtrain train` over several ranks (Open MPI), driven as a
# user drives it from the command line:
#   1. 2, 3 and 4 ranks end with one model: every rank's parameter digest is the same;
#   2. the gradient bucket size (one bucket per tensor up to the whole model) and
#      --no-overlap change nothing in the result, only the number of all-reduces;
#   3. --grad-accum all-reduces once per optimizer step, not once per micro-batch;
#   4. real data at 2 ranks learns, reports its communication share, and validates
#      on the exact split (single-process eval reproduces the accuracy);
#   5. a rank killed with SIGKILL ends the job in bounded time, and the survivors
#      name the dead rank, the step and the bucket in flight;
#   6. a stalled rank (test hook) and a stopped rank (SIGSTOP) end the job in
#      bounded time (--comm-timeout, --peer-timeout), naming the lagging rank;
#   7. SIGTERM / SIGUSR1 to one rank stops all ranks at one step with a checkpoint;
#      --resume continues bit for bit; a 2-rank checkpoint resumes on 1 rank
#      (accumulation 2) and on 4 (micro-batches split), and a world size that
#      cannot share out its global batch is refused, naming those that can; in a
#      run with --grad-accum whose epochs leave records out (the global order's
#      whole updates), every way of stopping -- --steps at an epoch's end and
#      inside one, SIGTERM, a kill right after an epoch's checkpoint -- resumes
#      exactly; and the same run uninterrupted on 4 ranks, resumed on 2 and on 1
#      trains every update on the same micro-batches (sample ids), to
#      parameters equal up to summation order;
#   8. rank discovery from the environment (mpirun, Slurm, torchrun-style variables);
#   9. --stage-to copies the dataset once per node and the ranks read the copy.
# Usage: test_multirank.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_multirank.sh path/to/ringtrain}
[ -x "$RT" ] || { echo "not an executable: $RT"; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # absolute: mpirun and sh -c exec it
command -v mpirun >/dev/null 2>&1 || { echo "skip: mpirun not found"; exit 77; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: python3 not found (needed to read JSON)"; exit 77; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine, whatever launched this script: no launcher variables leak into the runs.
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE RINGTRAIN_TEST_STALL

W=$(mktemp -d)
PIDS=() # rank pids this script signalled: stopped ones are resumed and killed on exit
cleanup() {
    local p
    for p in ${PIDS[@]+"${PIDS[@]}"}; do
        if grep -qa ringtrain "/proc/$p/cmdline" 2>/dev/null; then
            kill -CONT "$p" 2>/dev/null
            kill -KILL "$p" 2>/dev/null
        fi
    done
    for p in $(jobs -p); do kill "$p" 2>/dev/null; done
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
. "$(cd "$(dirname "$0")" && pwd)/train_lib.sh"
show() { sed 's/^/     | /' "$@" | tail -n 12; }
T_START=$(date +%s)

# mpi NP ARGS...: mpirun on this machine, never longer than 3 minutes.
mpi() {
    local np=$1
    shift
    timeout -k 10 180 mpirun -np "$np" --bind-to none --oversubscribe "$@"
}
mpirun -np 2 --bind-to none --oversubscribe true >"$W/smoke" 2>&1 || { echo "skip: mpirun cannot start 2 processes here:"; show "$W/smoke"; exit 77; }

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

digest_of() { # digest_of FILE NP: the digest all NP ranks printed (one line each), else status 1
    "$PY" - "$1" "$2" <<'EOF'
import re, sys
n, got = int(sys.argv[2]), {}
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"\[(\d+)/(\d+)\] param digest: ([0-9a-f]{16})\s*$", l)
    if m:
        r, w = int(m.group(1)), int(m.group(2))
        if w != n or r in got:
            sys.exit("digest line of world %d or repeated: %s" % (w, l.strip()))
        got[r] = m.group(3)
if sorted(got) != list(range(n)):
    sys.exit("digests from ranks %s, expected 0..%d" % (sorted(got), n - 1))
if len(set(got.values())) != 1:
    sys.exit("ranks differ: %s" % got)
print(got[0])
EOF
}
table_rows() { awk '/ranks +rank +host/ { f = 1; next } f && $1 ~ /^[0-9]+$/ { n++ } END { print n + 0 }' "$1"; }
rank_pid() { # rank_pid FILE RANK: the pid the banner's rank table gives RANK
    awk -v r="$2" '/ranks +rank +host/ { f = 1; next } f && $1 ~ /^[0-9]+$/ && $1 == r { print $3; exit }' "$1"
}
rank_host() { awk -v r="$2" '/ranks +rank +host/ { f = 1; next } f && $1 ~ /^[0-9]+$/ && $1 == r { print $2; exit }' "$1"; }
wait_table() { # wait_table FILE NP: until rank 0 has printed the table of NP ranks (60 s at most)
    local _
    for _ in $(seq 1 600); do
        [ "$(table_rows "$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}

# Data: MNIST-shaped (learns in 2 epochs with mnist-net). The test split (251) is
# not a multiple of batch x ranks, so validation pads and must mask the padding.
"$RT" synth --format mnist --out "$W/src" --train 1024 --test 251 --seed 3 --threads 1 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src" --out "$W/mnist" >/dev/null || { echo "pack failed"; exit 1; }

SYN=(--synthetic-data --model mnist-net --batch-size 16 --threads 1 --no-progress --json)

# ---- 1. 2, 3, 4 ranks: one model ---------------------------------------------------
for np in 2 3 4; do
    extra=()
    [ "$np" = 3 ] && extra=(--check-replicas 2) # compare the replicas every 2 steps too
    mpi "$np" "$RT" train "${SYN[@]}" --steps 6 ${extra[@]+"${extra[@]}"} >"$W/np$np.out" 2>"$W/np$np.err"
    rc=$?
    d=$(digest_of "$W/np$np.err" "$np" 2>&1)
    drc=$?
    ws=$(jfield "$W/np$np.out" world_size)
    st=$(jfield "$W/np$np.out" steps)
    im=$(jfield "$W/np$np.out" images)
    if [ $rc -eq 0 ] && [ $drc -eq 0 ] && [ "$ws" = "$np" ] && [ "$st" = 6 ] && [ "$im" = $((6 * 16 * np)) ] \
        && [ "$(grep -c '^{' "$W/np$np.out")" = 1 ] && grep -q "^ringtrain train: world $np " "$W/np$np.out"; then
        pass "np $np: $np identical param digests ($d), world_size $ws, $st steps, $im images${extra[*]+ (${extra[*]})}"
    else
        fail "np $np: rc=$rc digests: $d; world_size=$ws steps=$st images=$im"
        show "$W/np$np.out" "$W/np$np.err"
    fi
done

# ---- 2. bucket sizes and overlap do not change the result ---------------------------------
declare -A BK AR DG
for cap in 0.001 0.5 25 1000 noovl; do
    opt=(--bucket-cap-mb "$cap")
    [ "$cap" = noovl ] && opt=(--bucket-cap-mb 25 --no-overlap)
    mpi 2 "$RT" train "${SYN[@]}" --steps 4 "${opt[@]}" >"$W/b$cap.out" 2>"$W/b$cap.err"
    rc=$?
    DG[$cap]=$(digest_of "$W/b$cap.err" 2 2>&1) || DG[$cap]="bad($rc): ${DG[$cap]}"
    BK[$cap]=$(jfield "$W/b$cap.out" buckets)
    AR[$cap]=$(jfield "$W/b$cap.out" bucket_allreduces)
done
if [ "${DG[0.001]}" = "${DG[0.5]}" ] && [ "${DG[0.5]}" = "${DG[25]}" ] && [ "${DG[25]}" = "${DG[1000]}" ] \
    && [ "${DG[25]}" = "${DG[noovl]}" ] && [[ ${DG[25]} =~ ^[0-9a-f]{16}$ ]]; then
    pass "--bucket-cap-mb 0.001/0.5/25/1000 and --no-overlap: one param digest (${DG[25]})"
else
    fail "digests by bucket cap: 0.001=${DG[0.001]} 0.5=${DG[0.5]} 25=${DG[25]} 1000=${DG[1000]} no-overlap=${DG[noovl]}"
fi
if [ "${BK[0.001]}" = 8 ] && [ -n "${BK[0.5]}" ] && [ -n "${BK[25]}" ] && [ -n "${BK[1000]}" ] \
    && [ "${BK[0.001]}" -gt "${BK[0.5]}" ] && [ "${BK[0.5]}" -ge "${BK[25]}" ] && [ "${BK[25]}" -ge "${BK[1000]}" ] \
    && [ "${BK[1000]}" -ge 1 ] && [ "${BK[noovl]}" = "${BK[25]}" ]; then
    pass "buckets by cap: 0.001 MB ${BK[0.001]} (one per parameter tensor), 0.5 MB ${BK[0.5]}, 25 MB ${BK[25]}, 1000 MB ${BK[1000]}"
else
    fail "buckets by cap: 0.001=${BK[0.001]} 0.5=${BK[0.5]} 25=${BK[25]} 1000=${BK[1000]} no-overlap=${BK[noovl]}"
fi
ok=1
for cap in 0.001 0.5 25 1000 noovl; do
    [ -n "${BK[$cap]}" ] && [ "${AR[$cap]}" = $((4 * BK[$cap])) ] || ok=0
done
[ "$(jfield "$W/bnoovl.out" overlap)" = False ] && [ "$(jfield "$W/b25.out" overlap)" = True ] || ok=0
[ $ok = 1 ] && pass "4 steps: bucket_allreduces = 4 x buckets at every cap; --no-overlap reported" \
    || fail "bucket_allreduces: $(for c in 0.001 0.5 25 1000 noovl; do printf '%s=%s/%s ' $c "${AR[$c]}" "${BK[$c]}"; done)"

# ---- 3. accumulation: one all-reduce per bucket per optimizer step -------------------------
mpi 2 "$RT" train "${SYN[@]}" --steps 4 --grad-accum 3 >"$W/acc.out" 2>"$W/acc.err"
rc=$?
ab=$(jfield "$W/acc.out" buckets)
aa=$(jfield "$W/acc.out" bucket_allreduces)
as=$(jfield "$W/acc.out" steps)
ai=$(jfield "$W/acc.out" images)
if [ $rc -eq 0 ] && [ -n "$ab" ] && [ "$as" = 4 ] && [ "$aa" = $((4 * ab)) ] && [ "$ai" = $((4 * 3 * 16 * 2)) ] \
    && digest_of "$W/acc.err" 2 >/dev/null && [ "${AR[25]}" = $((4 * BK[25])) ]; then
    pass "--grad-accum 3 --steps 4: $aa bucket all-reduces = 4 x $ab buckets (not 12 x), as without accumulation (${AR[25]})"
else
    fail "--grad-accum 3: rc=$rc steps=$as buckets=$ab bucket_allreduces=$aa images=$ai"
    show "$W/acc.out" "$W/acc.err"
fi

# ---- 4. real data at 2 ranks ------------------------------------------------------------
R4=(--data "$W/mnist" --model mnist-net --epochs 2 --batch-size 16 --lr 0.05 --threads 1 --no-progress --json)
mpi 2 "$RT" train "${R4[@]}" --metrics "$W/m4.jsonl" --checkpoint-dir "$W/ck4" >"$W/r4.out" 2>"$W/r4.err"
rc=$?
D4=$(digest_of "$W/r4.err" 2 2>&1)
drc=$?
vacc=$(jfield "$W/r4.out" val_acc)
if [ $rc -eq 0 ] && [ $drc -eq 0 ] && [ "$(jfield "$W/r4.out" world_size)" = 2 ] \
    && "$PY" -c "import sys; sys.exit(0 if float('$vacc') > 0.3 else 1)" 2>/dev/null; then
    pass "2 ranks, 2 epochs on 1024 images: val accuracy $vacc (chance 0.1), digests agree ($D4)"
else
    fail "2-rank training: rc=$rc val_acc=$vacc digests: $D4"
    show "$W/r4.out" "$W/r4.err"
fi
n=$(grep -cE '^epoch +[0-9]+/2 .* comm +[0-9.]+%$' "$W/r4.out")
[ "$n" = 2 ] && pass "epoch lines report the comm share: $(grep -oE 'comm +[0-9.]+%' "$W/r4.out" | tr '\n' ' ')" \
    || fail "$n epoch lines with a comm share"; [ "$n" = 2 ] || show "$W/r4.out"
if "$PY" - "$W/m4.jsonl" "$W/r4.out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["epoch"] for r in rows] == [1, 2], rows
for r in rows:
    assert r["world_size"] == 2, r
    assert 0 <= r["exposed_comm_frac"] <= 1, r
    # each rank's own rate; they trained as many images each, so their sum is at least the run's rate
    ips = r["rank_images_per_s"]
    assert len(ips) == 2 and all(x > 0 for x in ips) and sum(ips) >= r["images_per_s"] * (1 - 1e-9), r
s = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
assert s["world_size"] == 2 and 0 <= s["exposed_comm_frac"] <= 1 and s["images_per_s"] > 0, s
assert s["steps"] == 2 * (1024 // (16 * 2)) and s["val_acc"] == rows[-1]["val_acc"], s
EOF
then pass "metrics JSONL and --json: world_size 2, exposed_comm_frac in [0, 1], 64 steps"; else fail "metrics/json of the 2-rank run"; fi
"$RT" eval --data "$W/mnist" --checkpoint "$W/ck4/model.safetensors" --threads 1 --json >"$W/e4.out" 2>&1
eacc=$(jfield "$W/e4.out" accuracy)
eimg=$(jfield "$W/e4.out" images)
if [ "$eimg" = 251 ] && "$PY" -c "import sys; sys.exit(0 if abs(float('$eacc') - float('$vacc')) < 1e-6 else 1)" 2>/dev/null; then
    pass "single-process eval on the 251 test images: accuracy $eacc = the 2-rank run's last val accuracy $vacc"
else
    fail "eval accuracy $eacc on $eimg images vs the 2-rank val accuracy $vacc"
    show "$W/e4.out"
fi

# ---- 5. a rank killed with SIGKILL --------------------------------------------------
# With --enable-recovery mpirun does not end the job itself when a rank dies: what
# ends it is the survivors' watchdog (mpirun then exits 0; the message and the time
# are what count).
LONG=(--synthetic-data --model mnist-net --batch-size 16 --threads 1 --no-progress --steps 100000)
kill_run() { # kill_run NAME NP RANK [mpirun options] -- [train options]: SIGKILL RANK mid-run
    local name=$1 np=$2 victim=$3 mp
    shift 3
    local mo=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do mo+=("$1"); shift; done
    shift
    mpi "$np" ${mo[@]+"${mo[@]}"} "$RT" train "${LONG[@]}" "$@" >"$W/$name.out" 2>"$W/$name.err" &
    mp=$!
    VPID=
    if wait_table "$W/$name.out" "$np"; then
        VPID=$(rank_pid "$W/$name.out" "$victim")
        VHOST=$(rank_host "$W/$name.out" "$victim")
        PIDS+=("$VPID")
        sleep 2
        T0=$(now)
        kill -KILL "$VPID"
    fi
    wait $mp
    KRC=$?
    T1=$(now)
    KSECS=$(secs "$T0" "$T1")
}
T0=0
kill_run kill3 3 1 --enable-recovery --
ok=1
[ -n "$VPID" ] || ok=0
for r in 0 2; do
    grep -qE "^\[$r/3\] error: rank 1 \($VHOST, pid $VPID\) died \(last heard at step [0-9]+, [a-z /]+\) while this rank was at step [0-9]+, [a-z /]+; in flight: [^.]+" "$W/kill3.err" || ok=0
done
if [ $ok = 1 ] && lt "$KSECS" 5; then
    pass "np 3, SIGKILL of rank 1 (pid $VPID) at a random step: job over ${KSECS}s later, ranks 0 and 2 name rank 1, its pid and the steps"
    grep -oE '^\[0/3\] error: .*in flight: [^.(]+' "$W/kill3.err" | sed 's/^/     /'
else
    fail "np 3 SIGKILL of rank 1 (pid $VPID): ${KSECS}s, rc=$KRC"
    show "$W/kill3.out" "$W/kill3.err"
fi
# Rank 1 held before optimizer step 4 (test hook, long --comm-timeout), so both
# survivors are inside step 4's gradient all-reduce when it is killed.
export RINGTRAIN_TEST_STALL=1:4
kill_run killb 3 1 --enable-recovery -x RINGTRAIN_TEST_STALL -- --comm-timeout 120
unset RINGTRAIN_TEST_STALL
ok=1
[ -n "$VPID" ] || ok=0
for r in 0 2; do
    grep -qE "^\[$r/3\] error: rank 1 \($VHOST, pid $VPID\) died .* while this rank was at step 4, [a-z /]+; in flight: the all-reduce of gradient bucket [0-9]+ of [0-9]+ .*submitted at step 4" "$W/killb.err" || ok=0
done
if [ $ok = 1 ] && lt "$KSECS" 5; then
    pass "np 3, SIGKILL of rank 1 held before step 4: over ${KSECS}s later; ranks 0 and 2 name rank 1, step 4 and the bucket in flight"
else
    fail "np 3 SIGKILL of the held rank 1 (pid $VPID): ${KSECS}s, rc=$KRC"
    show "$W/killb.out" "$W/killb.err"
fi
kill_run killp 3 1 --
if [ -n "$VPID" ] && [ "$KRC" -ne 0 ] && lt "$KSECS" 10; then # (mpirun's own SIGTERM, then SIGKILL)
    pass "plain mpirun, SIGKILL of rank 1: exit $KRC ${KSECS}s later"
else
    fail "plain mpirun SIGKILL of rank 1 (pid $VPID): rc=$KRC after ${KSECS}s"
    show "$W/killp.out" "$W/killp.err"
fi

# ---- 6. a stalled rank and a stopped rank ----------------------------------------------
export RINGTRAIN_TEST_STALL=2:3
T0=$(now)
mpi 3 -x RINGTRAIN_TEST_STALL "$RT" train "${LONG[@]}" --comm-timeout 5 >"$W/stall.out" 2>"$W/stall.err"
rc=$?
S=$(secs "$T0" "$(now)")
unset RINGTRAIN_TEST_STALL
p2=$(rank_pid "$W/stall.out" 2)
h2=$(rank_host "$W/stall.out" 2)
re="^\[[01]/3\] error: step 3: the all-reduce of gradient bucket [0-9]+ of [0-9]+ .* did not complete within 5 s \(--comm-timeout\); rank 2 \($h2, pid $p2\) is behind: step [0-9]+"
if [ $rc -ne 0 ] && [ -n "$p2" ] && grep -qE "$re" "$W/stall.err" \
    && ! grep -E '^\[[01]/3\] .*is behind' "$W/stall.err" | grep -qv "rank 2 (" && lt 5 "$S" && lt "$S" 30; then
    pass "rank 2 held before step 3, --comm-timeout 5: exit $rc after ${S}s (whole run), rank 2 named as behind"
    grep -oE '^\[[01]/3\] error: step 3: .*' "$W/stall.err" | head -1 | sed 's/^/     /'
else
    fail "comm timeout: rc=$rc after ${S}s"
    show "$W/stall.out" "$W/stall.err"
fi
mpi 3 "$RT" train "${LONG[@]}" --peer-timeout 3 >"$W/stop.out" 2>"$W/stop.err" &
mp=$!
p2=
if wait_table "$W/stop.out" 3; then
    p2=$(rank_pid "$W/stop.out" 2)
    h2=$(rank_host "$W/stop.out" 2)
    PIDS+=("$p2")
    sleep 2
    T0=$(now)
    kill -STOP "$p2"
fi
wait $mp
rc=$?
S=$(secs "$T0" "$(now)")
[ -n "$p2" ] && { kill -CONT "$p2"; kill -KILL "$p2"; } 2>/dev/null
if [ $rc -ne 0 ] && [ -n "$p2" ] \
    && grep -qE "^\[[01]/3\] error: rank 2 \($h2, pid $p2\) has sent no heartbeat for [0-9.]+ s \(--peer-timeout 3\)" "$W/stop.err" \
    && ! grep -E '^\[[01]/3\] .*has sent no heartbeat' "$W/stop.err" | grep -qv "rank 2 (" \
    && ! grep -qE '^\[2/3\] error: rank [01] \([^)]*\) (died|has sent no heartbeat)' "$W/stop.err" && lt "$S" 6; then
    # (mpirun continues a stopped rank before it kills it: rank 2 then wakes to the job ending and must not
    # blame the ranks that ended it.)
    pass "SIGSTOP of rank 2 (pid $p2), --peer-timeout 3: exit $rc ${S}s later, rank 2 named as silent, and blames no one"
    grep -E '^\[2/3\] error' "$W/stop.err" | cut -c1-160 | sed 's/^/     /'

else
    fail "SIGSTOP of rank 2 (pid $p2): rc=$rc after ${S}s"
    show "$W/stop.out" "$W/stop.err"
fi

# ---- 7. a signal to one rank; exact resume; another world size ------------------------
# Same options as the uninterrupted run of section 4 (checkpoint $W/ck4, digest $D4).
sig_resume() { # sig_resume NAME SIGNAL RANK WHEN: WHEN = table (mid epoch 1) or epoch1 (after epoch 1's row)
    local name=$1 sig=$2 victim=$3 when=$4 mp pid rc1 rc2
    mpi 2 "$RT" train "${R4[@]}" --metrics "$W/$name.jsonl" --checkpoint-dir "$W/$name" >"$W/$name.1.out" 2>"$W/$name.1.err" &
    mp=$!
    pid=
    if wait_table "$W/$name.1.out" 2; then
        pid=$(rank_pid "$W/$name.1.out" "$victim")
        if [ "$when" = epoch1 ]; then
            for _ in $(seq 1 600); do [ -s "$W/$name.jsonl" ] && break; sleep 0.05; done
        else
            sleep 0.5
        fi
        kill -s "$sig" "$pid"
    fi
    wait $mp
    rc1=$?
    local rows
    rows=$(wc -l <"$W/$name.jsonl" 2>/dev/null || echo 0)
    local signum
    signum=$(kill -l "$sig")
    local steps
    steps=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["optimizer_steps"])' "$W/$name/state.json" 2>/dev/null)
    if [ $rc1 -eq 0 ] && [ -n "$pid" ] && grep -q '^done (signal)' "$W/$name.1.out" && digest_of "$W/$name.1.err" 2 >/dev/null \
        && [ -n "$steps" ] && [ "$steps" -gt 0 ] && [ "$steps" -lt 64 ]; then
        pass "SIG$sig to rank $victim ($when): both ranks stopped at optimizer step $steps, checkpoint written, mpirun exit 0"
    else
        fail "SIG$sig to rank $victim: rc=$rc1 pid=$pid checkpoint steps=$steps"
        show "$W/$name.1.out" "$W/$name.1.err"
        return
    fi
    grep -qE "^\[0/2\] stopped by signal $signum \(SIG$sig\): checkpoint saved at epoch [0-9]+ step [0-9]+" "$W/$name.1.err" \
        && pass "SIG$sig to rank $victim: rank 0 reports 'stopped by signal $signum'" \
        || fail "SIG$sig to rank $victim: no 'stopped by signal $signum' report: $(grep 'stopped by' "$W/$name.1.err")"
    cp -r "$W/$name" "$W/$name.saved"
    mpi 2 "$RT" train "${R4[@]}" --metrics "$W/$name.jsonl" --checkpoint-dir "$W/$name" --resume >"$W/$name.2.out" 2>"$W/$name.2.err"
    rc2=$?
    local d
    d=$(digest_of "$W/$name.2.err" 2 2>&1)
    if [ $rc2 -eq 0 ] && grep -q "resuming from $W/$name at epoch" "$W/$name.2.err" && [ "$d" = "$D4" ] \
        && same_weights "$W/ck4/model.safetensors" "$W/$name/model.safetensors" \
        && same_weights "$W/ck4/optimizer.safetensors" "$W/$name/optimizer.safetensors"; then
        pass "resumed at 2 ranks: param digest $d and every model and optimizer tensor equal the uninterrupted run's"
    else
        fail "resume after SIG$sig: rc=$rc2 digest '$d' vs uninterrupted '$D4'"
        show "$W/$name.2.out" "$W/$name.2.err"
    fi
    # The rows the resumed run appends (one per epoch it closes) hold the figures
    # of the uninterrupted run's epochs.
    if out=$("$PY" - "$W/m4.jsonl" "$W/$name.jsonl" "$rows" 2>&1 <<'EOF'
import json, sys
a = {r["epoch"]: r for r in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])][int(sys.argv[3]):]
assert b and b[-1]["epoch"] == 2 and [r["epoch"] for r in b] == sorted({r["epoch"] for r in b}), b
for y in b:
    x = a[y["epoch"]]
    for k in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert abs(x[k] - y[k]) < 1e-5, "epoch %d %s: uninterrupted %.6f, resumed %.6f" % (x["epoch"], k, x[k], y[k])
    assert x["steps"] == y["steps"], (x, y)
EOF
    ); then
        pass "resumed run's epoch metrics (train/val loss and accuracy) equal the uninterrupted run's"
    else
        fail "resumed run's metrics differ from the uninterrupted run's: $(echo "$out" | tail -n 1)"
    fi
}
sig_resume sigterm TERM 1 table
sig_resume sigusr1 USR1 0 epoch1
# Another world size: 2 ranks x 16 = a global batch of 32. 3 ranks cannot share it out (refused, the
# checkpoint untouched); 1 rank runs it as 16 x accumulation 2, 4 ranks as micro-batches of 8.
if [ -f "$W/sigterm.saved/state.json" ]; then
    before=$(cat "$W/sigterm.saved"/* | md5sum)
    mpi 3 "$RT" train "${R4[@]}" --checkpoint-dir "$W/sigterm.saved" --resume >"$W/ws3.out" 2>"$W/ws3.err"
    rc3=$?
    if [ $rc3 -ne 0 ] && [ $rc3 -ne 124 ] && grep -q "which 3 ranks cannot share out in whole micro-batches; it resumes on 1, 2, 4, 8, 16, 32 ranks" "$W/ws3.err" \
        && [ "$(cat "$W/sigterm.saved"/* | md5sum)" = "$before" ]; then
        pass "resume of a 2-rank checkpoint at 3 ranks refused, checkpoint untouched: $(grep -m1 -o 'which 3 ranks.*' "$W/ws3.err")"
    else
        fail "resume at 3 ranks: rc=$rc3"
        show "$W/ws3.err"
    fi
    cp -r "$W/sigterm.saved" "$W/ws1"
    cp -r "$W/sigterm.saved" "$W/ws4"
    at=$(grep -oP 'checkpoint saved at \Kepoch \d+ step \d+' "$W/sigterm.1.err")
    "$RT" train "${R4[@]}" --checkpoint-dir "$W/ws1" --resume >"$W/ws1.out" 2>"$W/ws1.err"
    rc1=$?
    mpi 4 "$RT" train "${R4[@]}" --checkpoint-dir "$W/ws4" --resume >"$W/ws4.out" 2>"$W/ws4.err"
    rc4=$?
    e1=$(grep -oP 'resuming from \S+ at epoch \d+ step \K\d+' "$W/ws1.err")
    e4=$(grep -oP 'resuming from \S+ at epoch \d+ step \K\d+' "$W/ws4.err")
    s2=${at##* }
    if [ $rc1 -eq 0 ] && grep -q "^  resumed   a 2-rank run on 1 rank: accumulation 1 -> 2; micro-batch 16 and global batch 32 kept" "$W/ws1.out" \
        && grep -q "^  batch     16 per rank x 1 ranks x 2 accumulation = 32 effective" "$W/ws1.out" && [ "$e1" = $((s2 * 2)) ] \
        && grep -q '^done (completed)' "$W/ws1.out" && digest_of "$W/ws1.err" 1 >/dev/null && [ -e "$W/ws1/finished" ] \
        && [ "$(jfield "$W/ws1.out" images)" = "$(jfield "$W/r4.out" images)" ]; then
        pass "2-rank checkpoint ($at) resumed on 1 rank: accumulation 2, micro-batch 16 kept, from micro-batch $e1, finished; $(jfield "$W/ws1.out" images) images in all, as uninterrupted"
    else
        fail "2-rank checkpoint on 1 rank: rc=$rc1 resumed at step '$e1' (stopped at '$at')"
        show "$W/ws1.out" "$W/ws1.err"
    fi
    if [ $rc4 -eq 0 ] && grep -q "^  resumed   a 2-rank run on 4 ranks: micro-batch 16 -> 8, accumulation 1 -> 1; global batch 32 kept" "$W/ws4.out" \
        && [ "$e4" = "$s2" ] && grep -q '^done (completed)' "$W/ws4.out" && digest_of "$W/ws4.err" 4 >/dev/null \
        && [ "$(jfield "$W/ws4.out" images)" = "$(jfield "$W/r4.out" images)" ] \
        && "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); assert (s["batch_size"], s["run_batch"], s["world_size"]) == (16, 8, 4), s' "$W/ws4/state.json"; then
        pass "2-rank checkpoint ($at) resumed on 4 ranks: micro-batches of 8, finished; state.json keeps --batch-size 16 (run as 8)"
    else
        fail "2-rank checkpoint on 4 ranks: rc=$rc4 resumed at step '$e4' (stopped at '$at')"
        show "$W/ws4.out" "$W/ws4.err"
    fi
else
    fail "world-size change: no checkpoint from the SIGTERM run to resume"
fi

# ---- 7b. --grad-accum at 2 ranks, an epoch that leaves records out ----------------------
# 1024 records, updates of 24 per rank x 2 ranks x --grad-accum 2 = 96: 10 whole updates an epoch (20 in all),
# the last 64 records of each epoch's order left out. Each way of stopping -- --steps at the first epoch's end
# and inside an epoch, SIGTERM to one rank, and both ranks killed right after the first epoch's checkpoint --
# resumes to the uninterrupted run's parameters, bit for bit.
RA=(--data "$W/mnist" --model mnist-net --epochs 2 --batch-size 24 --grad-accum 2 --lr 0.05 --threads 1 --no-progress)
mpi 2 "$RT" train "${RA[@]}" --checkpoint-dir "$W/ra" >"$W/ra.out" 2>"$W/ra.err"
DA=$(digest_of "$W/ra.err" 2 2>&1)
if grep -q "= 96 effective, 10 steps/epoch, 2 epochs; 64 of the 1024 records left out each epoch (drop_last)" "$W/ra.out" && grep -q "^done (completed): 20 steps" "$W/ra.out" &&
    [ ${#DA} -eq 16 ]; then
    pass "2 ranks, 1024 records in updates of 96 (--grad-accum 2): 10 whole updates an epoch; digest $DA"
else
    fail "2 ranks, --grad-accum 2: $(grep -E 'steps/epoch|^done' "$W/ra.out") digest '$DA'"; show "$W/ra.err"
fi
accum_resumed() { # accum_resumed NAME WHAT: resume $W/NAME at 2 ranks, compare with the uninterrupted run
    mpi 2 "$RT" train "${RA[@]}" --checkpoint-dir "$W/$1" --resume >"$W/$1.2.out" 2>"$W/$1.2.err"
    local rc=$? d
    d=$(digest_of "$W/$1.2.err" 2 2>&1)
    if [ $rc -eq 0 ] && [ "$d" = "$DA" ] && grep -q "resuming from" "$W/$1.2.err" &&
        same_weights "$W/ra/model.safetensors" "$W/$1/model.safetensors" &&
        same_weights "$W/ra/optimizer.safetensors" "$W/$1/optimizer.safetensors"; then
        pass "2 ranks, $2, resumed: $(grep -o 'at epoch [0-9]* step [0-9]* (optimizer step [0-9]*)' "$W/$1.2.err" | head -1), digest $d = the uninterrupted run's"
    else
        fail "2 ranks, $2, resumed: rc=$rc digest '$d' vs '$DA'"; show "$W/$1.2.err"
    fi
}
for k in 10 5; do
    mpi 2 "$RT" train "${RA[@]}" --checkpoint-dir "$W/ra$k" --steps $k >"$W/ra$k.1.out" 2>"$W/ra$k.1.err"
    accum_resumed "ra$k" "--steps $k$([ $k = 10 ] && echo ' (the first epoch'"'"'s end)')"
done
# SIGTERM to rank 1 in the second epoch (the loader slowed so that the signal lands mid-run).
RINGTRAIN_TEST_SLOW_LOADER=40 mpi 2 -x RINGTRAIN_TEST_SLOW_LOADER "$RT" train "${RA[@]}" --checkpoint-dir "$W/raterm" \
    >"$W/raterm.1.out" 2>"$W/raterm.1.err" &
mp=$!
if wait_table "$W/raterm.1.out" 2; then
    for _ in $(seq 1 600); do grep -q '"epoch": 1' "$W/raterm/state.json" 2>/dev/null && break; sleep 0.05; done
    sleep 0.3
    kill -TERM "$(rank_pid "$W/raterm.1.out" 1)"
fi
wait $mp
grep -q '^done (signal)' "$W/raterm.1.out" && accum_resumed raterm "SIGTERM to rank 1 in epoch 2" ||
    { fail "2 ranks, SIGTERM: the run did not stop on the signal"; show "$W/raterm.1.out" "$W/raterm.1.err"; }
# Both ranks killed outright right after the first epoch's checkpoint (a test fault hangs rank 0 in the update
# after it; rank 1 waits for it in the all-reduce).
RINGTRAIN_TEST_STALL=0:10 mpi 2 -x RINGTRAIN_TEST_STALL "$RT" train "${RA[@]}" --checkpoint-dir "$W/rakill" \
    >"$W/rakill.1.out" 2>"$W/rakill.1.err" &
mp=$!
if wait_table "$W/rakill.1.out" 2; then
    for _ in $(seq 1 600); do grep -q '"epoch": 1' "$W/rakill/state.json" 2>/dev/null && break; sleep 0.05; done
    sleep 0.5
    for r in 0 1; do p=$(rank_pid "$W/rakill.1.out" $r) && PIDS+=("$p") && kill -KILL "$p"; done
fi
wait $mp 2>/dev/null
accum_resumed rakill "killed right after the first epoch's checkpoint"

# ---- 7c. the same run on 4 ranks, resumed on 2 and on 1 ----------------------------------
# Micro-batches of 8, global batch 32: uninterrupted on 4 ranks for 8 updates; stopped at update 4 and resumed
# on 2 ranks (accumulation 2) and on 1 (accumulation 4). Every rank logs each micro-batch's sample ids with its
# place in the update (a test hook): the three logs are the same. The parameters agree up to summation order:
# each update adds the same 4 micro-batch gradients in another order (all-reduce, or accumulation on a rank),
# about 1e-7 of a tensor's largest weight an update; a ReLU or max-pool comparison that lands on the other side
# of such a difference changes one unit's gradient, so the bound is 1e-3 (seen: 1e-7 over these 8 updates, up to
# 6e-4 over 32). A micro-batch with other samples or other dropout masks moves them by about 0.4.
RE=(--data "$W/mnist" --model mnist-net --epochs 1 --batch-size 8 --lr 0.05 --threads 1 --no-progress --amp off)
RINGTRAIN_TEST_SAMPLE_LOG="$W/ids.u" mpi 4 -x RINGTRAIN_TEST_SAMPLE_LOG "$RT" train "${RE[@]}" --checkpoint-dir "$W/eu" \
    --steps 8 >"$W/eu.out" 2>"$W/eu.err"
RINGTRAIN_TEST_SAMPLE_LOG="$W/ids.s" mpi 4 -x RINGTRAIN_TEST_SAMPLE_LOG "$RT" train "${RE[@]}" --checkpoint-dir "$W/e2" \
    --steps 4 >"$W/es.out" 2>"$W/es.err"
cp -r "$W/e2" "$W/e1"
RINGTRAIN_TEST_SAMPLE_LOG="$W/ids.2" mpi 2 -x RINGTRAIN_TEST_SAMPLE_LOG "$RT" train "${RE[@]}" --checkpoint-dir "$W/e2" \
    --resume --steps 8 >"$W/e2.out" 2>"$W/e2.err"
RINGTRAIN_TEST_SAMPLE_LOG="$W/ids.1" "$RT" train "${RE[@]}" --checkpoint-dir "$W/e1" --resume --steps 8 >"$W/e1.out" 2>"$W/e1.err"
cat "$W"/ids.u.* | sort >"$W/ids.u"
cat "$W"/ids.s.* "$W"/ids.2.* | sort >"$W/ids.2"
cat "$W"/ids.s.* "$W"/ids.1.* | sort >"$W/ids.1"
close_weights() { # close_weights A B BOUND: every tensor within BOUND of its largest magnitude in A; prints the worst
    "$PY" - "$(cd "$(dirname "$0")" && pwd)/../tools" "$@" <<'EOF'
import array, sys
sys.path.insert(0, sys.argv.pop(1))
from compare_checkpoints import load_safetensors
def load(p):
    _, tensors, data = load_safetensors(p)
    assert all(dt == "F32" for _, dt, _, _ in tensors), tensors
    return {k: array.array("f", data[s:e]) for k, _, _, (s, e) in tensors}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b)
worst = max(max(abs(x - y) for x, y in zip(a[k], b[k])) / max(max(map(abs, a[k])), 1e-30) for k in a)
print("%.2g" % worst)
sys.exit(worst > float(sys.argv[3]))
EOF
}
if [ "$(wc -l <"$W/ids.u")" = 32 ] && cmp -s "$W/ids.u" "$W/ids.2" && cmp -s "$W/ids.u" "$W/ids.1" \
    && grep -q "^  resumed   a 4-rank run on 2 ranks: accumulation 1 -> 2" "$W/e2.out" \
    && grep -q "^  resumed   a 4-rank run on 1 rank: accumulation 1 -> 4" "$W/e1.out" \
    && d2=$(close_weights "$W/eu/model.safetensors" "$W/e2/model.safetensors" 1e-3) \
    && d1=$(close_weights "$W/eu/model.safetensors" "$W/e1/model.safetensors" 1e-3); then
    pass "8 updates on 4 ranks = 4 on 4 then 4 on 2 = 4 on 4 then 4 on 1: the same 32 micro-batches (sample ids) in the same updates; parameters within $d2 and $d1 of the largest weight (bound 1e-3)"
else
    fail "the same run on 4, 2 and 1 ranks: $(wc -l <"$W/ids.u") micro-batches; $(diff "$W/ids.u" "$W/ids.2" | head -c 300) $(diff "$W/ids.u" "$W/ids.1" | head -c 300) weights: ${d2:-?} ${d1:-?}"
    show "$W/e2.out" "$W/e1.out" "$W/e2.err" "$W/e1.err"
fi

# ---- 8. rank discovery -------------------------------------------------------------
ranks_case() { # ranks_case NAME EXPECT(ok|fail) PATTERN COMMAND...: exit status and output matching PATTERN
    local name=$1 expect=$2 pat=$3 rc
    shift 3
    "$@" >"$W/rk.out" 2>&1
    rc=$?
    if { [ "$expect" = ok ] && [ $rc -eq 0 ]; } || { [ "$expect" = fail ] && [ $rc -ne 0 ] && [ $rc -ne 124 ]; }; then
        if grep -qE -- "$pat" "$W/rk.out"; then
            pass "ranks: $name ($expect: $(grep -m1 -oE -- "$pat" "$W/rk.out"))"
            return
        fi
    fi
    fail "ranks: $name: rc=$rc, expected $expect and /$pat/"
    show "$W/rk.out"
}
ranks_case "no launcher, no variables" ok "^world 1: .*ranks from none" "$RT" ranks
ranks_case "RANK=1 WORLD_SIZE=2 without a launcher" fail "rank 1 of 2 by RANK/WORLD_SIZE.*mpirun" \
    env RANK=1 WORLD_SIZE=2 "$RT" ranks
ranks_case "SLURM_PROCID=1 SLURM_NTASKS=2 without a launcher" fail "rank 1 of 2 by SLURM_PROCID/SLURM_NTASKS.*srun --mpi=pmix" \
    env SLURM_PROCID=1 SLURM_NTASKS=2 "$RT" ranks
ranks_case "RANK=0 WORLD_SIZE=1" ok "^world 1: .*ranks from torchrun" env RANK=0 WORLD_SIZE=1 "$RT" ranks
ranks_case "mpirun -np 2 with matching RANK/WORLD_SIZE" ok "^world 2: .*ranks from MPI" \
    mpi 2 sh -c 'RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=2 exec "$0" ranks' "$RT"
[ "$(table_rows "$W/rk.out")" = 2 ] && pass "ranks: the mpirun table lists 2 ranks" || fail "ranks table: $(table_rows "$W/rk.out") rows"
ranks_case "mpirun -np 2 with swapped RANK" fail "disagree: mpirun: rank [01] of 2, but RANK=[01] WORLD_SIZE=2" \
    mpi 2 sh -c 'RANK=$((1 - OMPI_COMM_WORLD_RANK)) WORLD_SIZE=2 exec "$0" ranks' "$RT"
ranks_case "MPI launch with Slurm variables (as srun --mpi=pmix)" ok "^world 2: " \
    mpi 2 sh -c 'unset OMPI_COMM_WORLD_SIZE; SLURM_PROCID=$OMPI_COMM_WORLD_RANK SLURM_NTASKS=2 exec "$0" ranks' "$RT"
ranks_case "MPI launch with SLURM_NTASKS=3 for 2 ranks" fail "disagree: .*SLURM_NTASKS=3" \
    mpi 2 sh -c 'unset OMPI_COMM_WORLD_SIZE; SLURM_PROCID=$OMPI_COMM_WORLD_RANK SLURM_NTASKS=3 exec "$0" ranks' "$RT"
ranks_case "plain mpirun ignores the daemons' Slurm variables" ok "^world 2: .*ranks from MPI \(mpirun\)" \
    mpi 2 sh -c 'SLURM_PROCID=5 SLURM_NTASKS=9 exec "$0" ranks' "$RT"

# ---- 9. --stage-to: one copy per node, read by every rank ------------------------------
mpi 2 "$RT" train "${R4[@]}" --epochs 5 --stage-to "$W/stage" >"$W/stage.out" 2>"$W/stage.err" &
mp=$!
fds=
if wait_table "$W/stage.out" 2; then
    for _ in $(seq 1 100); do # the ranks' open dataset files
        fds=$(for r in 0 1; do p=$(rank_pid "$W/stage.out" $r); for f in /proc/"$p"/fd/*; do readlink "$f"; done 2>/dev/null | grep '\.rts$' | sed "s/^/$r /"; done | sort -u)
        [ "$(echo "$fds" | cut -d' ' -f1 | sort -u | wc -l)" = 2 ] && break
        sleep 0.05
    done
    sleep 0.3
    kill -TERM "$(rank_pid "$W/stage.out" 1)"
fi
wait $mp
rc=$?
n=$(grep -cE "^\[[01]/2\] staged $W/mnist to $W/stage/[^ ]+: ([0-9]+) of \1 files copied" "$W/stage.err")
[ $rc -eq 0 ] && [ "$n" = 1 ] && [ "$(grep -c ' staged ' "$W/stage.err")" = 1 ] \
    && pass "--stage-to at 2 ranks on one node: copied once: $(grep -m1 -oE 'staged .* files copied' "$W/stage.err")" \
    || { fail "--stage-to: rc=$rc, $n copy reports"; show "$W/stage.out" "$W/stage.err"; }
[ -n "$fds" ] && [ "$(echo "$fds" | cut -d' ' -f1 | sort -u | wc -l)" = 2 ] && ! echo "$fds" | grep -qv " $W/stage/" \
    && pass "both ranks read the staged copy: $(echo "$fds" | cut -d' ' -f2 | sort -u | tr '\n' ' ')" \
    || fail "the ranks' open dataset files are not all under $W/stage: ${fds:-none}"
grep -qE "^  data      $W/stage/" "$W/stage.out" && pass "the banner's data line names the staged copy" \
    || fail "the banner's data line does not name the staged copy under $W/stage: $(grep -m1 '^  data ' "$W/stage.out")"

echo "time: $(($(date +%s) - T_START))s"
[ $fails -eq 0 ] && echo "all multi-rank checks passed" || echo "$fails multi-rank check(s) failed"
[ $fails -eq 0 ]
