#!/bin/bash
# test_finetune.sh - fine-tuning as a user drives it: `train --init FILE --reset-head --freeze GLOBS --lr-head LR`
# and `eval` of a state_dict without ringtrain's metadata.
#   1. a model trained on one synthetic dataset (A) starts a run on a second one (B, other images of the same
#      pattern families) with its classifier replaced and its first layers frozen: it reaches the stated
#      validation accuracy in fewer epochs than the same model from scratch;
#   2. the frozen layers' parameters, batchnorm statistics and num_batches_tracked are bit-identical after
#      training, every trainable tensor moved, and the optimizer holds no state for the frozen layers;
#   3. the same run stopped after its first epoch and resumed ends on the same parameter digest;
#   4. a file whose classifier has another number of classes fails naming fc's tensors and their shapes, and
#      --reset-head takes it; a glob matching nothing fails naming it; a torch.save file names the converter;
#   5. two ranks: the all-reduce leaves the frozen layers out (bytes per update against the unfrozen run) and
#      the replicas stay identical;
#   6. `eval --model` scores the fine-tuned weights saved without metadata exactly as its checkpoint.
# The numbers are printed; the PyTorch side (logits of torchvision's files) is test_init_torch.
# Usage: test_finetune.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_finetune.sh path/to/ringtrain}
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT")
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "skip: /usr/bin/python3 not found (needed to read safetensors)"; exit 77; }
"$PY" -c "import numpy" 2>/dev/null || { echo "skip: numpy missing"; exit 77; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
FAILS=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
show() { sed 's/^/     | /' "$@" | tail -n 15; }

MODEL=wrn-10-1
FREEZE='conv1.*,block1.*'
COMMON=(--model $MODEL --batch-size 64 --threads 2 --amp off --no-progress)
for s in A:4 B:9; do
    "$RT" synth --format cifar10 --out "$W/src${s%%:*}" --train 2048 --test 256 --seed "${s##*:}" >/dev/null &&
        "$RT" pack "$W/src${s%%:*}" --out "$W/${s%%:*}" --val-split 0.2 >/dev/null || { echo "FAIL synth/pack"; exit 1; }
done

# safetensors, read with numpy: the tensors of a file as {name: array}
cat >"$W/st.py" <<'EOF'
import fnmatch, json, struct
import numpy as np
DT = {"F32": "<f4", "I64": "<i8", "F16": "<f2"}
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=DT[v["dtype"]]).reshape(v["shape"])
    return out, meta
def save(p, t, meta=None):
    hdr, off, blobs = {}, 0, []
    if meta:
        hdr["__metadata__"] = meta
    for k, a in t.items():
        a = np.asarray(a, order="C")
        dt = {"float32": "F32", "int64": "I64"}[str(a.dtype)]
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    j = json.dumps(hdr).encode()
    j += b" " * (-len(j) % 8)
    open(p, "wb").write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
def frozen(name, globs):
    layer = name.rsplit(".", 1)[0]
    return any(fnmatch.fnmatch(layer + ".weight", g) for g in globs.split(","))
EOF

# ---- 1. pre-train on A; fine-tune on B against training B from scratch ------------------------------------
"$RT" train --data "$W/A" "${COMMON[@]}" --epochs 5 --checkpoint-dir "$W/pre" >"$W/pre.out" 2>&1 ||
    { fail "pre-training on A"; show "$W/pre.out"; exit 1; }
FT=(--data "$W/B" "${COMMON[@]}" --epochs 2 --init "$W/pre/model.safetensors" --reset-head --freeze "$FREEZE"
    --lr-head 0.2)
"$RT" train "${FT[@]}" --checkpoint-dir "$W/ft" --metrics "$W/ft.jsonl" --json >"$W/ft.out" 2>&1 ||
    { fail "fine-tuning on B"; show "$W/ft.out"; exit 1; }
"$RT" train --data "$W/B" "${COMMON[@]}" --epochs 2 --metrics "$W/scratch.jsonl" >"$W/scratch.out" 2>&1 ||
    { fail "training B from scratch"; show "$W/scratch.out"; exit 1; }
TARGET=0.35
res=$("$PY" - "$W/ft.jsonl" "$W/scratch.jsonl" $TARGET <<'EOF'
import json, sys
def accs(p):
    return [json.loads(l)["val_acc"] for l in open(p) if l.strip()]
ft, sc, t = accs(sys.argv[1]), accs(sys.argv[2]), float(sys.argv[3])
first = lambda a: next((i + 1 for i, v in enumerate(a) if v >= t), None)
ok = first(ft) is not None and (first(sc) is None or first(ft) < first(sc))
print("ok" if ok else "bad", "fine-tuned", " ".join("%.1f%%" % (100 * v) for v in ft), "| scratch",
      " ".join("%.1f%%" % (100 * v) for v in sc), "| epochs to %.0f%%: %s vs %s" % (100 * t, first(ft), first(sc)))
EOF
)
case $res in
ok*) pass "fine-tuning reaches the target sooner: ${res#ok }" ;;
*) fail "fine-tuning: ${res#bad }"; show "$W/ft.out" ;;
esac
grep -q "^  init      $W/pre/model.safetensors: [0-9]* tensors loaded; fc starts afresh for 10 classes" "$W/ft.out" &&
    grep -q "^  freeze    $FREEZE: [0-9]* layers frozen" "$W/ft.out" && grep -q "lr 0.1 (fc 0.2)" "$W/ft.out" &&
    pass "the banner says what was loaded, what is frozen and the head's learning rate" ||
    { fail "banner"; show "$W/ft.out"; }

# ---- 2. frozen layers untouched, trainable ones moved, no optimizer state for the frozen ------------------
res=$("$PY" - "$W" "$FREEZE" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, st
w, g = sys.argv[1], sys.argv[2]
a, _ = st.load(w + "/pre/model.safetensors")
b, _ = st.load(w + "/ft/model.safetensors")
o, _ = st.load(w + "/ft/optimizer.safetensors")
bad = [k for k in a if st.frozen(k, g) and not np.array_equal(a[k], b[k])]
still = [k for k in a if not st.frozen(k, g) and np.array_equal(a[k], b[k])]
nfro = sum(st.frozen(k, g) for k in a)
opt_frozen = [k for k in o if st.frozen(k.rsplit(".", 1)[0], g)]
trainable = [k for k in a if not st.frozen(k, g) and not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
ok = not bad and not still and not opt_frozen and len(o) == len(trainable) and nfro > 0
print("ok" if ok else "bad", "%d frozen tensors bit-identical (of them changed: %s), trainable unchanged: %s, "
      "optimizer tensors %d for %d trainable (frozen ones: %s)" % (nfro, bad[:3], still[:3], len(o), len(trainable),
      opt_frozen[:3]))
EOF
)
case $res in
ok*) pass "${res#ok }" ;;
*) fail "frozen layers: ${res#bad }" ;;
esac

# ---- 3. resume of the fine-tuning run is exact ---------------------------------------------------------------
steps=$("$PY" -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['steps'])" "$W/ft.jsonl" 2>/dev/null)
"$RT" train "${FT[@]}" --checkpoint-dir "$W/ft2" --steps "${steps:-1}" >"$W/r1.out" 2>&1 &&
    "$RT" train "${FT[@]}" --checkpoint-dir "$W/ft2" --resume >"$W/r2.out" 2>&1 ||
    { fail "stop and resume"; show "$W/r1.out" "$W/r2.out"; }
d1=$(grep -o "param digest: [0-9a-f]*" "$W/ft.out")
d2=$(grep -o "param digest: [0-9a-f]*" "$W/r2.out")
[ -n "$d1" ] && [ "$d1" = "$d2" ] && grep -q "^  init      $W/pre/model.safetensors not read: the run resumes" "$W/r2.out" &&
    pass "stopped after epoch 1 (step $steps) and resumed: $d2, as the run in one go" ||
    { fail "resume: '$d1' vs '$d2'"; show "$W/r2.out"; }
"$RT" train "${FT[@]}" --freeze 'conv1.*' --checkpoint-dir "$W/ft2" --resume >"$W/r3.out" 2>&1
[ $? -ne 0 ] && grep -q "trained with --freeze '$FREEZE'; resume with the same" "$W/r3.out" &&
    pass "a resume with another --freeze is refused" || { fail "resume, other --freeze"; show "$W/r3.out"; }

# ---- 4. a file of other classes; a glob matching nothing -------------------------------------------------------
"$PY" - "$W" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, st
t, _ = st.load(sys.argv[1] + "/pre/model.safetensors")
t = dict(t)
t["fc.weight"] = np.zeros((1000, t["fc.weight"].shape[1]), np.float32)
t["fc.bias"] = np.zeros(1000, np.float32)
st.save(sys.argv[1] + "/imagenet-head.safetensors", t)
EOF
"$RT" train --data "$W/B" "${COMMON[@]}" --steps 1 --init "$W/imagenet-head.safetensors" >"$W/h1.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -Eq "^  shape +fc.weight +file F32 \[1000, 64\], model F32 \[10, 64\]" "$W/h1.out" &&
    grep -Eq "^  shape +fc.bias +file F32 \[1000\], model F32 \[10\]" "$W/h1.out" &&
    grep -q "add --reset-head to train a new one for 10 classes" "$W/h1.out" &&
    pass "a 1000-class file into 10 classes: both fc tensors named with their shapes, --reset-head suggested" ||
    { fail "head mismatch (exit $rc)"; show "$W/h1.out"; }
"$RT" train --data "$W/B" "${COMMON[@]}" --steps 1 --init "$W/imagenet-head.safetensors" --reset-head >"$W/h2.out" 2>&1 &&
    pass "--reset-head takes it" || { fail "--reset-head"; show "$W/h2.out"; }
"$RT" train --data "$W/B" "${COMMON[@]}" --steps 1 --freeze 'conv1.*,blok1.*' >"$W/g.out" 2>&1
[ $? -ne 0 ] && grep -q "'blok1.\*' matches no parameter" "$W/g.out" && pass "a glob matching nothing is named" ||
    { fail "unmatched glob"; show "$W/g.out"; }

# torch.save's files are zip archives: recognised, and the converter named
"$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1], 'w').writestr('archive/data.pkl', b'\x80\x02}q\x00.')" \
    "$W/model.pth"
"$RT" train --data "$W/B" "${COMMON[@]}" --steps 1 --init "$W/model.pth" >"$W/pth.out" 2>&1
[ $? -ne 0 ] && grep -q "model.pth is a PyTorch file of torch.save (a pickle), not safetensors: convert it with \`python3 -m ringtrain.convert" "$W/pth.out" &&
    pass "--init of a .pth names the converter" || { fail "--init of a .pth"; show "$W/pth.out"; }

# ---- 5. two ranks: fewer bytes all-reduced, identical replicas -------------------------------------------------
if command -v mpirun >/dev/null 2>&1 && timeout 60 mpirun -np 2 --bind-to none --oversubscribe true >/dev/null 2>&1; then
    mpi() { timeout -k 10 180 mpirun -np 2 --bind-to none --oversubscribe "$@"; }
    TWO=(--data "$W/B" --model $MODEL --batch-size 32 --threads 1 --amp off --no-progress --steps 4 --json
         --init "$W/pre/model.safetensors" --reset-head)
    mpi "$RT" train "${TWO[@]}" --freeze "$FREEZE" >"$W/np2f.out" 2>&1 &&
        mpi "$RT" train "${TWO[@]}" >"$W/np2.out" 2>&1 || { fail "2 ranks"; show "$W/np2f.out" "$W/np2.out"; }
    res=$("$PY" - "$W" "$FREEZE" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
import st
w, g = sys.argv[1], sys.argv[2]
def summary(p):
    return [json.loads(l) for l in open(p) if l.startswith("{")][-1]
f, u = summary(w + "/np2f.out"), summary(w + "/np2.out")
t, _ = st.load(w + "/pre/model.safetensors")
params = [k for k in t if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
frozen = sum(t[k].size for k in params if st.frozen(k, g))
total = sum(t[k].size for k in params)
ok = (f["params"] == {"trainable": total - frozen, "frozen": frozen} and
      u["allreduce_bytes"] - f["allreduce_bytes"] >= 4 * frozen and f["allreduce_bytes"] >= 4 * (total - frozen))
print("ok" if ok else "bad", "all-reduce %d bytes per update with --freeze, %d without (%d saved; the frozen layers "
      "hold %d parameters); params %s" % (f["allreduce_bytes"], u["allreduce_bytes"],
      u["allreduce_bytes"] - f["allreduce_bytes"], frozen, f["params"]))
EOF
)
    case $res in
    ok*) pass "${res#ok }" ;;
    *) fail "2 ranks: ${res#bad }" ;;
    esac
    digests=$(grep -o "^\[[01]/2\] param digest: [0-9a-f]*" "$W/np2f.out" | awk '{print $NF}' | sort -u)
    [ "$(grep -c "param digest" "$W/np2f.out")" -ge 2 ] && [ "$(echo "$digests" | wc -l)" = 1 ] &&
        pass "2 ranks fine-tuning with frozen layers: replicas identical ($digests)" ||
        { fail "2-rank replicas"; show "$W/np2f.out"; }
else
    echo "skip (part 5): mpirun cannot start 2 processes here"
fi

# ---- 6. eval of the weights without ringtrain's metadata ---------------------------------------------------------
"$PY" - "$W" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import st
t, _ = st.load(sys.argv[1] + "/ft/model.safetensors")
st.save(sys.argv[1] + "/plain.safetensors", t)
EOF
"$RT" eval --data "$W/B" --checkpoint "$W/ft/model.safetensors" --amp off --json >"$W/e1.out" 2>&1 &&
    "$RT" eval --data "$W/B" --checkpoint "$W/plain.safetensors" --model $MODEL --amp off --json >"$W/e2.out" 2>&1 ||
    { fail "eval"; show "$W/e1.out" "$W/e2.out"; }
e1=$(grep '^{' "$W/e1.out" | sed 's/"time_s":[0-9.]*//')
e2=$(grep '^{' "$W/e2.out" | sed 's/"time_s":[0-9.]*//')
[ -n "$e1" ] && [ "$e1" = "$e2" ] && pass "eval --model of the bare state_dict: $e2" || fail "eval: '$e1' vs '$e2'"
"$RT" eval --data "$W/B" --checkpoint "$W/plain.safetensors" >"$W/e3.out" 2>&1
[ $? -ne 0 ] && grep -q "no ringtrain metadata.*--model" "$W/e3.out" && pass "eval without --model asks for it" ||
    { fail "eval without --model"; show "$W/e3.out"; }

[ $FAILS -eq 0 ] && { echo "all passed"; exit 0; }
echo "$FAILS failed"
exit 1
