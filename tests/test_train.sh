#!/usr/bin/env bash
# test_train.sh - `ringtrain train` and `ringtrain eval` as a user drives them:
#   - a short run on a small synthetic dataset reaches a stated accuracy;
#   - --metrics / --json carry the values the epoch lines print, and what the
#     report page reads (each epoch's step profile, each rank's images/s, the
#     loss scale; the command line and the banner's facts); --report writes the
#     page of a resumed run's whole history;
#   - an interrupted run resumed with --resume ends with the same weights, bit
#     for bit, as an uninterrupted one: stopped by --steps mid-epoch, by
#     SIGTERM mid-epoch, by a signal during start-up, and killed (SIGKILL)
#     right after an epoch's checkpoint -- in a run with --grad-accum 2 whose
#     epochs leave records out (whole updates of the global order);
#   - the checkpoint is read back by an independent reader (Python, and
#     PyTorch's load_state_dict(strict=True) when torch is installed);
#   - eval reproduces the last epoch's accuracy;
#   - bad input fails clearly and overwrites nothing.
# Usage: test_train.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_train.sh path/to/ringtrain}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
. "$HERE/train_lib.sh"

# Small datasets: MNIST-shaped (1x28x28) and CIFAR-shaped (3x32x32).
"$RT" synth --format mnist --out "$W/src-mnist" --train 3000 --test 1000 --seed 3 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-mnist" --out "$W/mnist" >/dev/null || { echo "pack failed"; exit 1; }
"$RT" synth --format cifar10 --out "$W/src-cifar" --train 1024 --test 256 --seed 4 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$W/src-cifar" --out "$W/cifar" --val-split 0.25 >/dev/null || { echo "pack failed"; exit 1; }


# ---- 1. learns: mnist-net on the MNIST-shaped set, 3 epochs ------------------------
T1=(--data "$W/mnist" --model mnist-net --epochs 3 --batch-size 64 --lr 0.05 --threads 2 --no-progress)
"$RT" train "${T1[@]}" --metrics "$W/m1.jsonl" --checkpoint-dir "$W/ck1" --json >"$W/t1.out" 2>"$W/t1.err"
rc=$?
acc=$(jfield "$W/t1.out" val_acc 2>/dev/null || echo 0)
if [ $rc -eq 0 ] && "$PY" -c "import sys; sys.exit(0 if float('$acc') >= 0.90 else 1)"; then
    pass "mnist-net reaches $acc validation accuracy (>= 0.90) in 3 epochs"
else
    fail "mnist-net training: rc=$rc val_acc=$acc"; cat "$W/t1.out" "$W/t1.err"
fi
grep -q "^ringtrain train: world 1 (1 node, 1 rank per node), cpu: 2 threads" "$W/t1.out" && grep -q "model     mnist-net" "$W/t1.out" \
    && pass "banner names backend, threads and model" || fail "banner: $(head -3 "$W/t1.out")"
n=$(grep -c '^epoch ' "$W/t1.out")
[ "$n" -eq 3 ] && pass "one line per epoch" || fail "$n epoch lines"
if "$PY" - "$W/m1.jsonl" "$W/t1.out" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
for k in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "images_per_s", "data_wait_frac", "time_s"):
    assert all(k in r for r in rows), k
assert [r["epoch"] for r in rows] == [1, 2, 3]
lines = [l for l in open(sys.argv[2]) if l.startswith("epoch")]
for r, l in zip(rows, lines):
    m = re.search(r"val loss ([0-9.]+) acc +([0-9.]+)%", l)
    assert abs(float(m.group(1)) - r["val_loss"]) < 1e-3 and abs(float(m.group(2)) - 100 * r["val_acc"]) < 0.01, (l, r)
s = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
for k in ("images_per_s", "steps", "time_s", "train_loss", "val_acc"):
    assert k in s, k
assert s["val_acc"] == rows[-1]["val_acc"] and s["steps"] == 3 * (3000 // 64), s
EOF
then pass "metrics JSONL and --json summary match the epoch lines"; else fail "metrics/json"; fi
# What the report page reads: each epoch's step profile (rank 0's steps of that epoch) and each rank's images/s,
# whose sum is the epoch's images_per_s (one rank here: equal; with more it is at least that, each rank's own
# time being at most the mean); the command line and the banner's facts in the summary and state.json.
if out=$("$PY" - "$W/m1.jsonl" "$W/t1.out" "$W/ck1/state.json" "$RT" <<'EOF' 2>&1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
per_epoch = 3000 // 64
for r in rows:
    p = r["profile"]
    assert set(p) == {"steps", "warmup_included", "phases"}, sorted(p)
    ph = p["phases"]
    assert p["steps"] >= 1 and ph["step"]["p50_ms"] > 0, p
    assert set(ph) == {"data", "copy", "forward", "backward", "comm", "optimizer", "rest", "step"}, sorted(ph)
    assert all(ph[k]["p99_ms"] >= ph[k]["p50_ms"] for k in ph), p
    ips = r["rank_images_per_s"]
    assert len(ips) == r["world_size"] == 1 and all(x > 0 for x in ips), ips
    assert abs(sum(ips) - r["images_per_s"]) <= 1e-9 * r["images_per_s"], (ips, r["images_per_s"])
    assert "loss_scale" not in r, r
# The first epoch leaves the run's 3 warm-up steps out; later epochs have none to leave out.
assert rows[0]["profile"]["steps"] == per_epoch - 3 and not rows[0]["profile"]["warmup_included"], rows[0]["profile"]
assert rows[1]["profile"]["steps"] == per_epoch, rows[1]["profile"]
s = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
st = json.load(open(sys.argv[3]))
for o in (s, st):
    assert o["command"][:2] == [sys.argv[4], "train"] and "--metrics" in o["command"], o["command"]
    facts = dict(o["facts"])
    assert [k for k, _ in o["facts"]][:2] == ["world", "model"], o["facts"]
    assert facts["data"].startswith(sys.argv[1].rsplit("/", 1)[0] + "/mnist (3000 train"), facts
    assert facts["batch"].startswith("64 per rank x 1 ranks"), facts
print("epoch 1: %d steps profiled, step p50 %.2f ms; %d facts" % (rows[0]["profile"]["steps"],
                                                                 rows[0]["profile"]["phases"]["step"]["p50_ms"], len(s["facts"])))
EOF
); then pass "metrics: per-epoch profile and per-rank images/s; summary and state.json: command and facts ($out)"
else fail "profile/rank_images_per_s/command/facts: $out"; fi

# ---- 2. eval reproduces the last validation (val = test split here) -------------
"$RT" eval --data "$W/mnist" --checkpoint "$W/ck1/model.safetensors" --json >"$W/e1.out" 2>&1
eacc=$(jfield "$W/e1.out" accuracy 2>/dev/null || echo x)
vacc=$(jfield "$W/t1.out" val_acc 2>/dev/null || echo y)
"$PY" -c "import sys; sys.exit(0 if abs(float('$eacc') - float('$vacc')) < 1e-6 else 1)" 2>/dev/null \
    && pass "eval accuracy $eacc equals the last epoch's val accuracy" || { fail "eval $eacc vs train $vacc"; cat "$W/e1.out"; }

# ---- 3. independent readers -------------------------------------------------------
if "$PY" -c "import torch, torchvision" 2>/dev/null; then
    if out=$("$PY" "$ROOT/tools/check_checkpoint.py" "$W/ck1/model.safetensors" --expect-model mnist-net 2>&1); then
        pass "PyTorch load_state_dict(strict=True) accepts the checkpoint: $out"
    else
        fail "check_checkpoint.py: $out"
    fi
else
    echo "skip PyTorch read-back (python3-torch not installed)"
fi
if "$PY" - "$W/ck1/model.safetensors" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__")
assert meta["model"] == "mnist-net" and meta["num_classes"] == "10", meta
assert json.loads(meta["input_shape"]) == [1, 28, 28]
mean, std = json.loads(meta["mean"]), json.loads(meta["std"])
assert len(mean) == 1 and 0 < mean[0] < 1 and 0 < std[0] < 1, (mean, std)
names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
assert list(h) == names, list(h)
assert h["fc1.weight"]["shape"] == [128, 9216] and h["conv1.weight"]["shape"] == [32, 1, 3, 3]
end = 0
for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, z = v["data_offsets"]
    assert a == end and v["dtype"] == "F32", (k, v)
    end = z
assert 8 + n + end == len(b)
EOF
then pass "safetensors header, names, shapes, offsets and metadata read by a plain parser"; else fail "plain safetensors parse"; fi

# ---- 4. resume equals uninterrupted -------------------------------------------------
# 768 training records in updates of 40 x --grad-accum 2 = 80: 9 whole updates an epoch (18 in all), the
# last 48 records of each epoch's order left out (short updates are --shuffle window's: test_train_step).
T4=(--data "$W/cifar" --model wrn-10-1 --epochs 2 --batch-size 40 --lr 0.05 --threads 2 --no-progress
    --label-smoothing 0.1 --grad-accum 2 --schedule onecycle --optimizer sgd --nesterov)
if "$RT" train "${T4[@]}" --checkpoint-dir "$W/full" >"$W/full.out" 2>&1; then
    grep -q "= 80 effective, 9 steps/epoch, 2 epochs; 48 of the 768 records left out each epoch (drop_last)" "$W/full.out" && grep -q "^done (completed): 18 steps" "$W/full.out" \
        && pass "768 records in updates of 80 (--grad-accum 2): 9 whole updates an epoch, 18 in all, 48 records left out (banner)" \
        || fail "updates of 80: $(grep -E 'steps/epoch|^done' "$W/full.out")"
    # Killed outright right after the first epoch's checkpoint (a test fault hangs the first update after it):
    # the epoch's checkpoint alone resumes the run exactly.
    RINGTRAIN_TEST_STALL=0:9 "$RT" train "${T4[@]}" --checkpoint-dir "$W/kill" >"$W/k1.out" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
        grep -q '"epoch": 1' "$W/kill/state.json" 2>/dev/null && break
        sleep 0.1
    done
    sleep 0.5
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    "$RT" train "${T4[@]}" --checkpoint-dir "$W/kill" --resume >"$W/k2.out" 2>&1
    rc2=$?
    if [ $rc2 -eq 0 ] && grep -q "resuming from $W/kill at epoch 2 step 0" "$W/k2.out" \
        && same_weights "$W/full/model.safetensors" "$W/kill/model.safetensors" \
        && same_weights "$W/full/optimizer.safetensors" "$W/kill/optimizer.safetensors"; then
        pass "killed right after the first epoch's checkpoint and resumed: weights and optimizer state bit-identical"
    else
        fail "resume after SIGKILL past the epoch's checkpoint: rc $rc2"; tail -n 3 "$W/k1.out" "$W/k2.out"
    fi
    "$RT" train "${T4[@]}" --checkpoint-dir "$W/part" --steps 7 --json --metrics "$W/part.jsonl" >"$W/p1.out" 2>&1
    rc1=$?
    # 7 updates are 14 of the first epoch's 18 micro-batches: no epoch completed.
    [ "$(jfield "$W/p1.out" epochs 2>/dev/null)" = 0 ] && [ "$(jfield "$W/p1.out" steps 2>/dev/null)" = 7 ] \
        && pass "--steps 7 inside the first epoch: the summary counts 0 epochs done, 7 steps" \
        || fail "--steps 7 summary: epochs $(jfield "$W/p1.out" epochs 2>&1), steps $(jfield "$W/p1.out" steps 2>&1)"
    [ -e "$W/part/finished" ] && had_finished=1 || had_finished=0
    "$RT" train "${T4[@]}" --checkpoint-dir "$W/part" --resume --metrics "$W/part.jsonl" --report "$W/part.html" \
        >"$W/p2.out" 2>&1
    rc2=$?
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "resuming from" "$W/p2.out" && same_weights "$W/full/model.safetensors" "$W/part/model.safetensors" \
        && same_weights "$W/full/optimizer.safetensors" "$W/part/optimizer.safetensors"; then
        pass "stopped at step 7 mid-epoch and resumed: weights and optimizer state bit-identical"
    else
        fail "resume after --steps: rc $rc1/$rc2"; tail -n 3 "$W/p1.out" "$W/p2.out"
    fi
    # The file a job script tests to know whether to requeue: absent after --steps, there once the run ended.
    if [ $had_finished = 0 ] && [ -e "$W/part/finished" ] && [ -e "$W/full/finished" ]; then
        pass "'finished': absent after a --steps stop, written when the run ends (resumed or not)"
    else
        fail "'finished' marker: after --steps $had_finished (want 0), at the end: $(ls "$W/part" "$W/full")"
    fi
    # --report on the resumed run: the page covers the whole run, the earlier process's epoch read back from
    # --metrics (its partial row replaced by the whole epoch's).
    if [ $rc2 -eq 0 ] && grep -q "^report: $W/part.html (2 epochs)$" "$W/p2.out" && [ "$(grep -c . "$W/part.jsonl")" = 3 ] \
        && grep -q 'id="chart-loss"' "$W/part.html"; then
        pass "--report after a resume: the page of the whole run's 2 epochs, with its loss chart"
    else
        fail "--report: $(grep '^report' "$W/p2.out"; grep -c . "$W/part.jsonl"; ls -l "$W/part.html" 2>&1)"
    fi
    # After a resume the summary keeps this process's steps apart from the whole run's.
    total=$(sed -n 's/^done (completed): \([0-9]*\) steps.*/\1/p' "$W/full.out")
    line=$(grep '^done (completed)' "$W/p2.out")
    if [[ "$line" =~ ^done\ \(completed\):\ ([0-9]+)\ steps,\ resumed\ at\ step\ 7:\ this\ process\ ([0-9]+)\ steps\ in ]] &&
        [ "${BASH_REMATCH[1]}" = "$total" ] && [ "${BASH_REMATCH[2]}" = $((total - 7)) ]; then
        pass "resumed summary: $total steps in all, resumed at 7, this process $((total - 7))"
    else
        fail "resumed summary line: '$line' (uninterrupted: $total steps)"
    fi
    # SIGTERM once the first epoch is done: finish the step, save, exit 0. The loader is slowed (100 ms a batch,
    # the data unchanged) so that the signal lands mid-run however fast the machine trains.
    RINGTRAIN_TEST_SLOW_LOADER=100 "$RT" train "${T4[@]}" --checkpoint-dir "$W/sig" --metrics "$W/sig.jsonl" \
        >"$W/s1.out" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do [ -s "$W/sig.jsonl" ] && break; sleep 0.1; done
    sleep 0.3
    kill -TERM $pid 2>/dev/null
    wait $pid
    rc1=$?
    "$RT" train "${T4[@]}" --checkpoint-dir "$W/sig" --resume >"$W/s2.out" 2>&1
    rc2=$?
    if [ $rc1 -eq 0 ] && grep -q "stopped by signal 15" "$W/s1.out" && [ $rc2 -eq 0 ] && same_weights "$W/full/model.safetensors" "$W/sig/model.safetensors"; then
        pass "SIGTERM mid-run: checkpoint, exit 0, resume gives bit-identical weights"
    else
        fail "SIGTERM resume: rc $rc1/$rc2"; tail -n 3 "$W/s1.out" "$W/s2.out"
    fi
    # A signal during start-up (here: while --stage-to copies, slowed by a test fault) is no kill: the run
    # stops before its first step with a checkpoint there, exits 0, and the resumed run is the planned one.
    RINGTRAIN_TEST_SLOW_COPY=300 "$RT" train "${T4[@]}" --stage-to "$W/stg-sig" --checkpoint-dir "$W/early" \
        >"$W/e1.out" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [ -n "$(find "$W/stg-sig" -name '*.partial' 2>/dev/null)" ] && break; sleep 0.05; done
    kill -USR1 $pid 2>/dev/null
    wait $pid
    rc1=$?
    "$RT" train "${T4[@]}" --checkpoint-dir "$W/early" --resume >"$W/e2.out" 2>&1
    rc2=$?
    if [ $rc1 -eq 0 ] && grep -q "stopped by signal 10 (SIGUSR1): checkpoint saved at epoch 1 step 0" "$W/e1.out" &&
        [ $rc2 -eq 0 ] && same_weights "$W/full/model.safetensors" "$W/early/model.safetensors"; then
        pass "SIGUSR1 while staging: stopped before the first step, exit 0, resume gives bit-identical weights"
    else
        fail "SIGUSR1 during start-up: rc $rc1/$rc2"; tail -n 3 "$W/e1.out" "$W/e2.out"
    fi
    # eval scores the test split (256 records) even where the dataset has a val split (102 here).
    "$RT" pack "$W/src-cifar" --out "$W/cifar-val10" --val-split 0.1 >/dev/null &&
        "$RT" eval --data "$W/cifar-val10" --checkpoint "$W/full/model.safetensors" --threads 2 --json >"$W/ev.out" 2>&1
    [ "$(jfield "$W/ev.out" images 2>/dev/null)" = 256 ] && grep -q "test split: 256 images" "$W/ev.out" \
        && pass "eval scores the test split, not the val split" || fail "eval split: $(cat "$W/ev.out")"
else
    fail "uninterrupted wrn-10-1 run"; tail -n 5 "$W/full.out"
fi

# ---- 5. bad input: clear errors, non-zero exit, nothing overwritten ---------------------
sum_ck() { cat "$W/ck1"/* | md5sum; }
before=$(sum_ck)
"$RT" train --data "$W/mnist" --model resnet101 --no-progress >"$W/b.out" 2>&1
[ $? -ne 0 ] && grep -q "unknown model 'resnet101'" "$W/b.out" && pass "unknown model" || fail "unknown model: $(cat "$W/b.out")"
"$RT" train --data "$W/mnist" --model wrn-16-4 --checkpoint-dir "$W/ck1" --resume --no-progress >"$W/b.out" 2>&1
[ $? -ne 0 ] && grep -q "checkpoint is of mnist-net, not wrn-16-4" "$W/b.out" && pass "resume with another model" \
    || fail "resume other model: $(cat "$W/b.out")"
"$RT" eval --data "$W/mnist" --checkpoint "$W/ck1/model.safetensors" --model resnet18 >"$W/b.out" 2>&1
[ $? -ne 0 ] && grep -q "is a checkpoint of mnist-net, not resnet18" "$W/b.out" && pass "eval with another model" \
    || fail "eval other model: $(cat "$W/b.out")"
"$RT" eval --data "$W/cifar" --checkpoint "$W/ck1/model.safetensors" >"$W/b.out" 2>&1
[ $? -ne 0 ] && grep -q "was trained on 1x28x28" "$W/b.out" && pass "eval on a dataset of another shape" \
    || fail "eval shape: $(cat "$W/b.out")"
cp "$W/ck1/model.safetensors" "$W/trunc.safetensors"
truncate -s -100 "$W/trunc.safetensors"
"$RT" eval --data "$W/mnist" --checkpoint "$W/trunc.safetensors" >"$W/b.out" 2>&1
[ $? -ne 0 ] && grep -q "trunc.safetensors" "$W/b.out" && pass "truncated checkpoint: $(grep error "$W/b.out" | head -1)" \
    || fail "truncated checkpoint: $(cat "$W/b.out")"
mkdir -p "$W/ck2" && cp "$W/ck1"/* "$W/ck2/" && truncate -s -100 "$W/ck2/model.safetensors"
before2=$(cat "$W/ck2"/* | md5sum)
"$RT" train "${T1[@]}" --checkpoint-dir "$W/ck2" --resume >"$W/b.out" 2>&1
[ $? -ne 0 ] && [ "$(cat "$W/ck2"/* | md5sum)" = "$before2" ] && pass "resume from a corrupt checkpoint fails and changes nothing" \
    || fail "corrupt resume: $(tail -n 2 "$W/b.out")"
# Another precision: refused without --amp-change (naming both), which then goes on from the same checkpoint
# (one more epoch). ck1's precision is --amp auto's on this CPU: the other one is asked for (bf16 only where
# this CPU trains it).
amp1=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["amp"])' "$W/ck1/state.json" 2>/dev/null)
amp2=off
[ "$amp1" = off ] && amp2=bf16
if [ -n "$amp1" ] && "$RT" train --synthetic-data --model mnist-net --batch-size 8 --steps 1 --amp "$amp2" --threads 1 \
    --no-progress >/dev/null 2>&1; then
    mkdir -p "$W/ckamp" && cp "$W/ck1"/* "$W/ckamp/"
    beforeamp=$(cat "$W/ckamp"/* | md5sum)
    "$RT" train "${T1[@]}" --amp "$amp2" --checkpoint-dir "$W/ckamp" --resume --epochs 4 >"$W/b.out" 2>&1
    rc=$?
    [ "$(cat "$W/ckamp"/* | md5sum)" = "$beforeamp" ] && same=1 || same=0
    "$RT" train "${T1[@]}" --amp "$amp2" --amp-change --checkpoint-dir "$W/ckamp" --resume --epochs 4 >"$W/b2.out" 2>&1
    rc2=$?
    if [ $rc -ne 0 ] && [ $same = 1 ] && grep -q "the checkpoint was trained with --amp $amp1, this run would train with --amp $amp2" "$W/b.out" \
        && [ $rc2 -eq 0 ] && grep -q '^done (completed)' "$W/b2.out" && grep -q "\"amp\": \"$amp2\"" "$W/ckamp/state.json"; then
        pass "resume at another --amp: refused ($(grep -o 'resume with --amp.*' "$W/b.out")), then goes on with --amp-change"
    else
        fail "resume at another --amp ($amp1 -> $amp2): rc $rc then $rc2: $(tail -n 2 "$W/b.out" "$W/b2.out")"
    fi
else
    pass "resume at another --amp: not tried (this CPU does not train --amp $amp2, or ck1 has no precision)"
fi
"$RT" train --data "$W/mnist" --model mnist-net --lr 1e5 --epochs 1 --batch-size 64 --threads 2 --no-progress \
    --checkpoint-dir "$W/ck3" >"$W/b.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -Eq "loss became (NaN|infinite) at epoch [0-9]+ micro-batch [0-9]+.*first non-finite tensor: [a-z0-9_.]+" "$W/b.out" \
    && [ ! -e "$W/ck3/model.safetensors" ] && pass "NaN loss names the step and tensor: $(grep -o 'first non-finite tensor: [^.]*\.[^ ]*' "$W/b.out")" \
    || fail "NaN loss: rc=$rc $(cat "$W/b.out")"
[ "$(sum_ck)" = "$before" ] && pass "failed runs left the checkpoint untouched" || fail "checkpoint changed by failed runs"

# ---- 6. synthetic data: compute only -------------------------------------------------
"$RT" train --synthetic-data --model mnist-net --batch-size 32 --steps 5 --threads 2 --json --no-progress >"$W/syn.out" 2>&1
steps=$(jfield "$W/syn.out" steps 2>/dev/null || echo 0)
ips=$(jfield "$W/syn.out" images_per_s 2>/dev/null || echo 0)
[ "$steps" = 5 ] && "$PY" -c "import sys; sys.exit(0 if float('$ips') > 0 else 1)" && pass "--synthetic-data --steps 5: $ips img/s" \
    || fail "synthetic: $(cat "$W/syn.out")"
[ "$(jfield "$W/syn.out" input_shape 2>/dev/null)" = "[3, 32, 32]" ] && [ "$(jfield "$W/syn.out" num_classes 2>/dev/null)" = 10 ] \
    && pass "--synthetic-data without --data or --image-size: 3x32x32, 10 classes (--json input_shape, num_classes)" \
    || fail "synthetic default shape: $(jfield "$W/syn.out" input_shape 2>&1) $(jfield "$W/syn.out" num_classes 2>&1)"
# Any shape: ResNet-50 at ImageNet's 224 pixels and 1000 classes, one step of 2 images (about 1 s on 2 cores).
"$RT" train --synthetic-data --model resnet50 --image-size 224 --num-classes 1000 --batch-size 2 --steps 1 --threads 2 \
    --json --no-progress >"$W/syn224.out" 2>&1
if grep -q "^  data      synthetic batches (3x224x224, 1000 classes), compute only" "$W/syn224.out" \
    && [ "$(jfield "$W/syn224.out" input_shape 2>/dev/null)" = "[3, 224, 224]" ] \
    && [ "$(jfield "$W/syn224.out" num_classes 2>/dev/null)" = 1000 ] && [ "$(jfield "$W/syn224.out" steps 2>/dev/null)" = 1 ]; then
    pass "--synthetic-data --image-size 224 --num-classes 1000: resnet50 trains on 3x224x224 batches of 1000 classes"
else
    fail "synthetic 224: $(tail -n 5 "$W/syn224.out")"
fi
"$RT" train --data "$W/mnist" --synthetic-data --num-classes 7 --steps 1 --no-progress >"$W/b.out" 2>&1
[ $? -eq 2 ] && grep -q "num-classes is for --synthetic-data without --data" "$W/b.out" \
    && pass "--num-classes with --data refused (a dataset has its own classes)" || fail "--num-classes with --data: $(cat "$W/b.out")"

# ---- 7. --device: without a usable GPU, cuda fails at once with the reason; auto takes the CPU ----
gpus=$("$RT" --version | sed -n 's/^  cuda .*; \([0-9]\+\) x .*/\1/p')
if [ -z "$gpus" ]; then
    t0=$(date +%s)
    "$RT" train --synthetic-data --steps 2 --device cuda --no-progress >"$W/dev.out" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ $rc -ne 0 ] && grep -qE "error: --device cuda: .*(driver|GPU|not compiled)" "$W/dev.out" && [ $((t1 - t0)) -le 5 ]; then
        pass "--device cuda without a GPU: exit $rc at once: $(grep error "$W/dev.out")"
    else
        fail "--device cuda without a GPU: rc=$rc after $((t1 - t0)) s: $(cat "$W/dev.out")"
    fi
    "$RT" eval --data "$W/mnist" --checkpoint "$W/ck1/model.safetensors" --device cuda >"$W/dev2.out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "error: --device cuda:" "$W/dev2.out" && pass "eval --device cuda without a GPU fails clearly" \
        || fail "eval --device cuda: rc=$rc $(cat "$W/dev2.out")"
    "$RT" train --synthetic-data --steps 2 --device auto --no-progress >"$W/dev3.out" 2>&1
    grep -q "^ringtrain train: world 1 (1 node, 1 rank per node), cpu:" "$W/dev3.out" && pass "--device auto takes the CPU here" \
        || fail "--device auto: $(head -3 "$W/dev3.out")"
else
    echo "skip --device checks without a GPU: this machine has $gpus"
fi

# ---- 8. loss scaling (the GradScaler path, fp32 here: it runs on any backend) ----------------
# Scaling by a power of two and unscaling is exact in fp32, so without an overflow the run is the unscaled run bit for bit.
for ls in off dynamic; do
    "$RT" train --synthetic-data --model resnet9 --batch-size 16 --steps 3 --threads 2 --loss-scale $ls --no-progress \
        >"$W/ls_$ls.out" 2>&1
done
d_off=$(grep -o 'param digest: [0-9a-f]*' "$W/ls_off.out"); d_dyn=$(grep -o 'param digest: [0-9a-f]*' "$W/ls_dynamic.out")
[ -n "$d_off" ] && [ "$d_off" = "$d_dyn" ] && grep -q "scaling   dynamic loss scale from 65536" "$W/ls_dynamic.out" \
    && pass "--loss-scale dynamic without overflow = unscaled run ($d_dyn)" || fail "loss scale changes the weights: '$d_off' vs '$d_dyn'"
# Injected overflows at optimizer steps 2, 3, 4: each is skipped and halves the scale; the optimizer applies 5 of 8.
RINGTRAIN_TEST_OVERFLOW=2:3 "$RT" train --synthetic-data --model mnist-net --batch-size 16 --steps 8 --threads 2 \
    --loss-scale dynamic --json --no-progress --metrics "$W/ovf.jsonl" >"$W/ovf.out" 2>&1
upd=$(jfield "$W/ovf.out" optimizer_updates 2>/dev/null || echo x); sk=$(jfield "$W/ovf.out" skipped_steps 2>/dev/null || echo x)
sc=$(jfield "$W/ovf.out" loss_scale 2>/dev/null || echo x)
msc=$(jfield "$W/ovf.jsonl" loss_scale 2>/dev/null || echo x)
[ "$upd" = 5 ] && [ "$sk" = 3 ] && [ "$sc" = 8192.0 ] && [ "$msc" = 8192.0 ] \
    && grep -q "step 2: gradients overflowed at loss scale 65536: update skipped, scale now 32768" "$W/ovf.out" \
    && grep -q "step 4: gradients overflowed at loss scale 16384: update skipped, scale now 8192" "$W/ovf.out" \
    && pass "3 injected overflows: 3 skipped steps logged with their scale, 5 of 8 updates applied, scale 8192" \
    || fail "overflow handling: updates=$upd skipped=$sk scale=$sc (metrics $msc) $(grep -E 'overflow|error' "$W/ovf.out")"
# Overflows that never stop end the run after --max-skipped-steps, naming the tensor.
RINGTRAIN_TEST_OVERFLOW=1:1000 "$RT" train --synthetic-data --model mnist-net --batch-size 16 --steps 30 --threads 2 \
    --loss-scale dynamic --max-skipped-steps 4 --no-progress >"$W/ovf2.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "error: 4 optimizer steps in a row overflowed (step 4, loss scale now 4096); first non-finite tensor: fc2.weight gradient" "$W/ovf2.out" \
    && pass "4 overflows in a row stop the run: $(grep -o 'first non-finite tensor: [^.]*\.[^ .]*' "$W/ovf2.out")" \
    || fail "skip limit: rc=$rc $(tail -2 "$W/ovf2.out")"
# --amp on the CPU: bf16 where the CPU computes it natively (AVX512_BF16 or AMX, as the banner's oneDNN line says),
# and then the default (auto); fp32 elsewhere, where a bf16 request is refused naming the missing instruction set.
# ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN's instruction set, so every CPU also takes the refusing path.
# (The asynchronous CPU streams, a test mode, run fp32 only.)
if grep -qE "cpu: .*oneDNN [^,]*(AVX512_BF16|AMX)" "$W/syn.out" && ! grep -q "asynchronous streams" "$W/syn.out"; then
    cpu_bf16=1 want=bf16
else
    cpu_bf16=0 want=off
fi
[ "$(jfield "$W/syn.out" amp 2>/dev/null)" = $want ] && [ "$(jfield "$W/syn.out" device 2>/dev/null)" = cpu ] \
    && pass "--amp auto on this CPU: $want (JSON amp=$want, device=cpu)" || fail "JSON amp/device: $(tail -1 "$W/syn.out")"
ONEDNN_MAX_CPU_ISA=AVX2 "$RT" train --synthetic-data --steps 1 --threads 2 --amp bf16 --no-progress >"$W/amp.out" 2>&1
rc=$?
refusal="this CPU has neither AVX512_BF16 nor AMX"
[ "${RINGTRAIN_CPU_STREAMS:-}" = async ] && refusal="the CPU's asynchronous streams (RINGTRAIN_CPU_STREAMS=async, a test mode) run fp32 only"
[ $rc -ne 0 ] && grep -qF "error: --amp bf16: bf16 activations: $refusal" "$W/amp.out" \
    && pass "--amp bf16 on a CPU without bf16 is refused: $(grep error "$W/amp.out")" \
    || fail "--amp bf16 without AVX512_BF16: rc=$rc $(cat "$W/amp.out")"
ONEDNN_MAX_CPU_ISA=AVX2 "$RT" train --synthetic-data --model mnist-net --batch-size 32 --steps 2 --threads 2 --json \
    --no-progress >"$W/amp2.out" 2>&1
[ "$(jfield "$W/amp2.out" amp 2>/dev/null)" = off ] && pass "--amp auto on a CPU without bf16: fp32" \
    || fail "--amp auto without AVX512_BF16: $(tail -1 "$W/amp2.out")"
"$RT" train --synthetic-data --steps 1 --threads 2 --amp fp16 --no-progress >"$W/amp3.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "error: --amp fp16: fp16 activations: the CPU backend has no fp16 table" "$W/amp3.out" \
    && pass "--amp fp16 on the CPU is refused: $(grep error "$W/amp3.out")" || fail "--amp fp16 on CPU: rc=$rc $(cat "$W/amp3.out")"
if [ $cpu_bf16 = 1 ]; then
    "$RT" train --synthetic-data --model mnist-net --batch-size 32 --steps 5 --threads 2 --amp off --json \
        --no-progress >"$W/f32.out" 2>&1
    [ "$(jfield "$W/f32.out" amp 2>/dev/null)" = off ] && pass "--amp off on a bf16 CPU: fp32" \
        || fail "--amp off: $(tail -1 "$W/f32.out")"
else
    echo "note: this CPU has no AVX512_BF16/AMX: the bf16 runs above trained in fp32"
fi

[ $fails -eq 0 ] && echo "all train checks passed" || echo "$fails train check(s) failed"
[ $fails -eq 0 ]
