#!/usr/bin/env bash
# test_profile_ops.sh - `ringtrain train --profile-ops`, --tf32 and --deterministic on the CPU, and the report's
# drawing of op profiles:
#   1. mnist-net, 6 steps with --profile-ops --json --trace: the summary's op_profile has the documented shape,
#      every category, categories that add up to step_ms, conv_fwd > 0, the 3 steps after the warm-up; its ops
#      are called per step as often as the model's layers say (counted from the checkpoint's tensors: one
#      conv2d_fwd and conv2d_bwd_filter per convolution, a conv2d_bwd_data for all but the first, whose input is
#      the image; the same for the linear layers; one optimizer); the trace holds the op spans, each inside its
#      layer's span on the compute stream track, and passes tools/check_trace.py;
#   2. wrn-10-1 for 2 steps: bn_train_fwd and bn_bwd once per batchnorm (counted from the checkpoint's
#      running_mean tensors), the warm-up included and said so;
#   3. without --profile-ops no op_profile; --tf32 and --deterministic in the banner ("n/a on the CPU"), the
#      summary's settings and state.json; a resume with other settings says so in a note; bad values refused
#      (train and eval) with the option named;
#   4. `ringtrain report` on the summary and on a hand-written bench comparison file: the per-op section, its
#      charts, every category, the numbers given, the largest differences named.
# With a second argument `cuda` (for a registration in the GPU suite), the same on a GPU instead: resnet9 at fp32
# and bf16 with --profile-ops, the op_profile's shape and sums, one conv2d_fwd and bn_train_fwd per layer as on
# the CPU, cuDNN's choices for the convolutions with their fields, the settings (TF32 on by default; --tf32 off,
# --deterministic off and RINGTRAIN_CUDA_KERNELS=reference asked) in the banner and the summary; it skips (77)
# where `train --device cuda` finds no GPU.
# Usage: test_profile_ops.sh path/to/ringtrain [cpu|cuda]. Exit 0 pass, 1 fail, 77 skip (no python3; no GPU for
# cuda).
set -u
RT=${1:?usage: test_profile_ops.sh path/to/ringtrain [cpu|cuda]}
DEV=${2:-cpu}
[ -x "$RT" ] || { echo "not an executable: $RT"; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: python3 not found (the checks read JSON)"; exit 77; }
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE RINGTRAIN_CPU_STREAMS
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$HERE/train_lib.sh"
show() { sed 's/^/     | /' "$@" | tail -n 15; }

if [ "$DEV" = cuda ]; then
    "$RT" train --device cuda --synthetic-data --steps 1 --no-progress >"$W/probe.out" 2>&1
    if [ $? -ne 0 ]; then
        grep -q "error: --device cuda:" "$W/probe.out" && { echo "skip: $(grep "error: --device cuda:" "$W/probe.out" | head -n 1)"; exit 77; }
        echo "FAIL the GPU probe:"; show "$W/probe.out"; exit 1
    fi
    G=(train --device cuda --synthetic-data --model resnet9 --batch-size 64 --steps 5 --no-progress --json --profile-ops)
    for amp in off bf16; do
        "$RT" "${G[@]}" --amp $amp >"$W/g-$amp.out" 2>&1 || { fail "resnet9 --amp $amp --profile-ops on the GPU"; show "$W/g-$amp.out"; continue; }
        "$PY" - "$W/g-$amp.out" <<'EOF' && pass "GPU resnet9 --amp $amp: op_profile adds up, ops per layer, a cuDNN choice per shape" || fail "GPU resnet9 --amp $amp op profile"
import json, sys
summ = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
op, bad = summ["op_profile"], []
CATS = ["conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling", "loss", "optimizer",
        "copies", "other", "idle"]
if sorted(op["categories"]) != sorted(CATS):
    bad.append("categories %s" % sorted(op["categories"]))
if abs(sum(op["categories"].values()) - op["step_ms"]) > 1e-6 * max(1.0, op["step_ms"]):
    bad.append("categories do not add up to step_ms %s" % op["step_ms"])
if not (op["steps"] == 2 and op["warmup_included"] is False):
    bad.append("steps %s warmup_included %s" % (op["steps"], op["warmup_included"]))
ops = {o["op"]: o for o in op["ops"]}
# resnet9: 8 convolutions and 8 batchnorms (compute/models.c), whatever the kernels fuse.
for name, calls in (("conv2d_fwd", 8), ("conv2d_bwd_filter", 8), ("conv2d_bwd_data", 7), ("bn_train_fwd", 8),
                    ("bn_bwd", 8), ("linear_fwd", 1), ("optimizer", 1)):
    if not (name in ops and ops[name]["calls"] == calls and ops[name]["ms"] > 0):
        bad.append("%s: %s, expected %d calls" % (name, ops.get(name), calls))
conv = op["convolutions"]
seen = {c["dir"] for c in conv}
if len(conv) < 3 or seen != {"fwd", "bwd_data", "bwd_filter"}:
    bad.append("convolutions: %d rows, directions %s" % (len(conv), sorted(seen)))
for c in conv:
    if set(c) != {"dir", "dtype", "shape", "how", "ms", "workspace", "deterministic", "tensor_cores", "candidates"}:
        bad.append("convolution keys %s" % sorted(c))
        break
    if not c["how"] or not c["deterministic"]:
        bad.append("convolution %s: '%s', deterministic %s (the default is)" % (c["shape"], c["how"], c["deterministic"]))
        break
want = {"tf32": True, "deterministic": True, "kernels": "fast"}
if op["settings"] != want or summ["settings"] != want:
    bad.append("settings %s / %s" % (op["settings"], summ["settings"]))
print("  step %.3f ms: %s; %d convolution choices, e.g. %s" % (op["step_ms"], ", ".join(
    "%s %.3f" % (k, op["categories"][k]) for k in CATS), len(conv), conv[0]["how"] if conv else "-"))
if bad:
    print("\n".join(bad[:10]))
sys.exit(1 if bad else 0)
EOF
    done
    grep -q "^  fp32 conv TF32 (--tf32 on" "$W/g-off.out" && grep -q "^  cudnn     deterministic algorithms" "$W/g-off.out" \
        && pass "GPU banner: TF32 on, deterministic by default" || { fail "GPU banner"; show "$W/g-off.out"; }
    RINGTRAIN_CUDA_KERNELS=reference "$RT" "${G[@]}" --amp off --tf32 off --deterministic off >"$W/g-ref.out" 2>&1 \
        && grep -q "^  fp32 conv strict fp32 (--tf32 off)" "$W/g-ref.out" && grep -q "^  cudnn     any algorithm" "$W/g-ref.out" \
        && "$PY" -c 'import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
w = {"tf32": False, "deterministic": False, "kernels": "reference"}
assert s["settings"] == w and s["op_profile"]["settings"] == w, s["settings"]' "$W/g-ref.out" \
        && pass "GPU: --tf32 off --deterministic off with the reference kernels, in the banner and the settings" \
        || { fail "GPU --tf32 off --deterministic off, reference kernels"; show "$W/g-ref.out"; }
    [ "$fails" -eq 0 ] && { echo "test_profile_ops (cuda): all passed"; exit 0; }
    echo "test_profile_ops (cuda): $fails failed"
    exit 1
fi

"$RT" synth --format mnist --out "$W/src" --train 256 --test 64 --seed 11 >/dev/null \
    && "$RT" pack "$W/src" --out "$W/mnist" >/dev/null || { echo "FAIL synth/pack"; exit 1; }
T=(train --data "$W/mnist" --batch-size 16 --threads 1 --amp off --no-progress --seed 3)

# ---- 1. mnist-net, profiled ------------------------------------------------------------------------------
"$RT" "${T[@]}" --model mnist-net --steps 6 --profile-ops --json --trace "$W/a.json" --checkpoint-dir "$W/ca" \
    --tf32 off --deterministic on >"$W/a.out" 2>&1 || { fail "mnist-net --profile-ops run"; show "$W/a.out"; exit 1; }
pass "mnist-net --profile-ops --trace --json ran"
"$PY" - "$W/a.out" "$W/ca/model.safetensors" "$W/a.json" <<'EOF' && pass "mnist-net: op_profile as documented, ops per step as the model has them, op spans inside layer spans" || fail "mnist-net op profile"
import json, struct, sys
out, ckpt, trace = sys.argv[1:4]
summ = json.loads([l for l in open(out) if l.startswith("{")][-1])
bad = []
def check(ok, what):
    if not ok:
        bad.append(what)
op = summ.get("op_profile")
CATS = ["conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling", "loss", "optimizer",
        "copies", "other", "idle"]
assert isinstance(op, dict), "no op_profile in the summary"
check(set(op) == {"steps", "warmup_included", "step_ms", "categories", "ops", "convolutions", "settings"},
      "op_profile keys %s" % sorted(op))
check(sorted(op["categories"]) == sorted(CATS), "categories %s" % sorted(op["categories"]))
check(op["steps"] == 3 and op["warmup_included"] is False, "steps %s warmup_included %s (6 steps: 3 after the "
      "warm-up)" % (op["steps"], op["warmup_included"]))
total = sum(op["categories"].values())
check(abs(total - op["step_ms"]) <= 1e-6 * max(1.0, op["step_ms"]), "categories add up to %.9f, step_ms %.9f" %
      (total, op["step_ms"]))
check(op["categories"]["conv_fwd"] > 0, "conv_fwd %s" % op["categories"]["conv_fwd"])
check(all(v >= 0 for v in op["categories"].values()), "a negative category")
check(op["convolutions"] == [], "the CPU reports no convolution choices: %s" % op["convolutions"][:2])
want_settings = {"tf32": False, "deterministic": True, "kernels": "cpu"}
check(op["settings"] == want_settings and summ.get("settings") == want_settings,
      "settings %s / %s" % (op["settings"], summ.get("settings")))
ops = {o["op"]: o for o in op["ops"]}
check(len(ops) == len(op["ops"]), "an op listed twice")
ms = [o["ms"] for o in op["ops"]]
check(ms == sorted(ms, reverse=True), "ops not sorted by ms")
check(abs(sum(ms) + op["categories"]["idle"] - op["step_ms"]) <= 1e-6 * max(1.0, op["step_ms"]),
      "ops + idle != step_ms")
for o in op["ops"]:
    check(set(o) == {"op", "category", "ms", "calls"}, "op keys %s" % sorted(o))
# The model's layers, from its checkpoint: 4-D weights are convolutions, 2-D ones linear layers.
b = open(ckpt, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n]); hdr.pop("__metadata__", None)
convs = sum(1 for k, v in hdr.items() if k.endswith(".weight") and len(v["shape"]) == 4)
lins = sum(1 for k, v in hdr.items() if k.endswith(".weight") and len(v["shape"]) == 2)
bns = sum(1 for k in hdr if k.endswith(".running_mean"))
assert convs == 2 and lins == 2 and bns == 0, (convs, lins, bns)
want = {"conv2d_fwd": (convs, "conv_fwd"), "conv2d_bwd_filter": (convs, "weight_grad"),
        "conv2d_bwd_data": (convs - 1, "data_grad"), "linear_fwd": (lins, "conv_fwd"),
        "linear_bwd_filter": (lins, "weight_grad"), "linear_bwd_data": (lins, "data_grad"),
        "optimizer": (1, "optimizer"), "xent_fwd_bwd": (1, "loss"),
        "zero": (1, "copies"), "maxpool_fwd": (1, "pooling"),
        "flatten_bwd": (1, "pooling"), "relu_fwd": (3, "elementwise"), "dropout_bwd": (2, "elementwise")}
for name, (calls, cat) in want.items():
    o = ops.get(name)
    check(o is not None and abs(o["calls"] - calls) < 1e-9 and o["category"] == cat,
          "%s: %s, expected %d calls per step in %s" % (name, o, calls, cat))
inp = [o for o in op["ops"] if o["op"].startswith("input_u8")]
check(len(inp) == 1 and inp[0]["calls"] == 1 and inp[0]["category"] == "copies", "the input op: %s" % inp)
check("bn_train_fwd" not in ops, "mnist-net has no batchnorm, yet bn_train_fwd ran")
# The step never waits for the stream: its loss sums stay on the device (read a step late), so no download; and
# its labels come with the images in the input copy, so no upload from pageable memory either.
check("download" not in ops, "a download in the step (a host wait): %s" % ops.get("download"))
check("upload" not in ops, "an upload in the step (the labels not with the images): %s" % ops.get("upload"))
# The trace: each op span (named "OP LAYER") inside the span of its layer on the compute stream's track.
t = json.load(open(trace))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "compute"]
opnames = set(ops)
spans = [e for e in ev if e["name"].split(" ")[0] in opnames]
layers = [e for e in ev if e["name"].split(" ")[0] in ("fwd", "bwd", "loss")]
check(len(spans) >= 3 * 20, "%d op spans in the trace" % len(spans))
inside = 0
for s in spans:
    parts = s["name"].split(" ", 1)
    if len(parts) == 1:
        continue  # an op after the last layer
    lay = parts[1]
    host = [l for l in layers if l["tid"] == s["tid"] and (l["name"].split(" ", 1) + [""])[1] == lay or
            (lay == "loss" and l["name"] == "loss" and l["tid"] == s["tid"])]
    ok = any(l["ts"] - 0.002 <= s["ts"] and s["ts"] + s["dur"] <= l["ts"] + l["dur"] + 0.002 for l in host)
    check(ok, "op span %s at %.3f+%.3f not inside a span of its layer" % (s["name"], s["ts"], s["dur"]))
    inside += ok
check(inside >= 3 * 18, "%d op spans inside their layers" % inside)
if bad:
    print("\n".join(bad[:12]))
    sys.exit(1)
print("  %d ops, step %.3f ms, conv_fwd %.3f ms, idle %.3f ms; %d op spans in their layers" % (
    len(ops), op["step_ms"], op["categories"]["conv_fwd"], op["categories"]["idle"], inside))
EOF
"$PY" "$HERE/../tools/check_trace.py" "$W/a.json" >"$W/check.out" 2>&1 && pass "the trace with op spans passes check_trace.py" \
    || { fail "check_trace.py on the --profile-ops trace"; show "$W/check.out"; }
grep -q "^op profile (rank 0's compute stream, 3 optimizer steps after the first 3)" "$W/a.out" \
    && grep -qE "^  weight_grad +[0-9.]+ +[0-9.]+%" "$W/a.out" && grep -qE "^  conv2d_fwd +[0-9.]+ +2 +conv_fwd" "$W/a.out" \
    && pass "the op profile's table printed" || { fail "the op profile's table"; show "$W/a.out"; }
grep -q "^  fp32 conv n/a on the CPU (--tf32 off" "$W/a.out" && grep -q "^  cudnn     n/a on the CPU (--deterministic on" "$W/a.out" \
    && grep -q "^  profile   per op (--profile-ops)" "$W/a.out" && pass "the banner names --tf32 off, --deterministic on, --profile-ops" \
    || { fail "banner lines"; show "$W/a.out"; }
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["tf32"] is False and s["deterministic"] is True, s' \
    "$W/ca/state.json" && pass "state.json records tf32 false, deterministic true" || fail "state.json settings"

# ---- 2. a model with batchnorm, too short for a warm-up ---------------------------------------------------
"$RT" "${T[@]}" --model wrn-10-1 --batch-size 8 --steps 2 --profile-ops --json --checkpoint-dir "$W/cb" \
    >"$W/b.out" 2>&1 || { fail "wrn-10-1 --profile-ops run"; show "$W/b.out"; exit 1; }
"$PY" - "$W/b.out" "$W/cb/model.safetensors" <<'EOF' && pass "wrn-10-1: one bn_train_fwd and bn_bwd per batchnorm, the warm-up included" || fail "wrn-10-1 op profile"
import json, struct, sys
summ = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
op = summ["op_profile"]
b = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
bns = sum(1 for k in hdr if k.endswith(".running_mean"))
ops = {o["op"]: o for o in op["ops"]}
bad = []
if not (op["steps"] == 2 and op["warmup_included"] is True):
    bad.append("steps %s warmup_included %s" % (op["steps"], op["warmup_included"]))
for name in ("bn_train_fwd", "bn_bwd"):
    o = ops.get(name)
    if not (bns > 0 and o and o["calls"] == bns and o["category"] == "batchnorm"):
        bad.append("%s: %s, %d batchnorms" % (name, o, bns))
if not op["categories"]["batchnorm"] > 0:
    bad.append("batchnorm %s" % op["categories"]["batchnorm"])
if abs(sum(op["categories"].values()) - op["step_ms"]) > 1e-6 * max(1.0, op["step_ms"]):
    bad.append("categories do not add up to step_ms")
print("  %d batchnorms, %s" % (bns, "; ".join(bad) if bad else "batchnorm %.3f ms of %.3f" % (
    op["categories"]["batchnorm"], op["step_ms"])))
sys.exit(1 if bad else 0)
EOF
grep -q "^op profile (rank 0's compute stream, 2 optimizer steps, warm-up included: the run was short)" "$W/b.out" \
    && pass "a short run's table says the warm-up is included" || { fail "short run's op profile line"; show "$W/b.out"; }

# ---- 3. without the profile; the settings; a resume with other settings; bad values ----------------------
"$RT" "${T[@]}" --model mnist-net --steps 8 --json --checkpoint-dir "$W/ca" --resume >"$W/c.out" 2>&1 \
    || { fail "resumed run without --profile-ops"; show "$W/c.out"; }
"$PY" - "$W/c.out" "$W/ca/state.json" <<'EOF' && pass "no op_profile without --profile-ops; settings tf32/deterministic on by default in the summary and state.json" || fail "defaults"
import json, sys
summ = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
st = json.load(open(sys.argv[2]))
assert "op_profile" not in summ, "op_profile without --profile-ops"
assert summ["settings"] == {"tf32": True, "deterministic": True, "kernels": "cpu"}, summ["settings"]
assert st["tf32"] is True and st["deterministic"] is True, (st.get("tf32"), st.get("deterministic"))
EOF
grep -q "note: the checkpoint was written with --tf32 off --deterministic on, this run has --tf32 on --deterministic on: no effect on the CPU" "$W/c.out" \
    && pass "resume with other settings: a note, not an error" || { fail "no note on a resume with other settings"; show "$W/c.out"; }
! grep -q "^op profile" "$W/c.out" && grep -q "^  fp32 conv n/a on the CPU (--tf32 on" "$W/c.out" \
    && pass "no op table without --profile-ops; the banner says --tf32 on" || { fail "defaults' banner"; show "$W/c.out"; }
for bad in "train --synthetic-data --steps 1 --tf32 maybe:--tf32 maybe: expected on or off" \
    "train --synthetic-data --steps 1 --deterministic yes:--deterministic yes: expected on or off" \
    "eval --data $W/mnist --checkpoint $W/ca/model.safetensors --tf32 1:--tf32 1: expected on or off" \
    "eval --data $W/mnist --checkpoint $W/ca/model.safetensors --deterministic no:--deterministic no: expected on or off"; do
    args=${bad%%:*} msg=${bad#*:}
    # shellcheck disable=SC2086
    "$RT" $args >"$W/bad.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$msg" "$W/bad.out" && pass "${args%% *} refuses a bad value, exit 2: $msg" \
        || { fail "$args: rc=$rc"; show "$W/bad.out"; }
done
"$RT" eval --data "$W/mnist" --checkpoint "$W/ca/model.safetensors" --threads 1 --tf32 off --deterministic off --json \
    >"$W/e.out" 2>&1 && grep -q '"accuracy"' "$W/e.out" && pass "eval takes --tf32 off --deterministic off on the CPU" \
    || { fail "eval with --tf32/--deterministic"; show "$W/e.out"; }

# ---- 4. the report ------------------------------------------------------------------------------------------
cat >"$W/cmp.json" <<'EOF'
{"profile_comparison": 1, "gpu": "NVIDIA H200", "host": "a test's hand",
 "pairs": [{"model": "resnet9", "amp": "bf16", "batch": 512,
   "ringtrain": {"steps": 10, "warmup_included": false, "step_ms": 10.0,
     "categories": {"conv_fwd": 2.0, "data_grad": 1.5, "weight_grad": 3.25, "batchnorm": 1.0, "elementwise": 0.5,
                    "pooling": 0.25, "loss": 0.05, "optimizer": 0.2, "copies": 0.1, "other": 0.0, "idle": 1.15},
     "ops": [{"op": "conv2d_bwd_filter", "category": "weight_grad", "ms": 3.25, "calls": 8}], "convolutions": [],
     "settings": {"tf32": true, "deterministic": true, "kernels": "fast"}},
   "pytorch": {"step_ms": 8.0,
     "categories": {"conv_fwd": 1.75, "data_grad": 1.5, "weight_grad": 1.625, "batchnorm": 0.75, "elementwise": 0.5,
                    "pooling": 0.25, "loss": 0.05, "optimizer": 0.3, "copies": 0.1, "other": 0.0, "idle": 1.175},
     "ops": [{"op": "aten::convolution_backward", "category": "weight_grad", "ms": 1.625, "calls": 8}],
     "settings": {"tf32": true, "deterministic": false}},
   "largest": [{"category": "weight_grad", "ringtrain_ms": 3.25, "pytorch_ms": 1.625},
               {"category": "conv_fwd", "ringtrain_ms": 2.0, "pytorch_ms": 1.75}]}]}
EOF
"$RT" report "$W/a.out" "$W/cmp.json" -o "$W/r.html" >"$W/r.out" 2>&1 || { fail "ringtrain report"; show "$W/r.out"; }
"$PY" - "$W/r.html" "$W/a.out" <<'EOF' && pass "report: the per-op section, a bar per category with its value, the comparison's paired bars and largest differences" || fail "report's op sections"
import json, re, sys
h = open(sys.argv[1]).read()
summ = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
bad = []
for need in ('<h2 id="op-profile">', 'id="chart-ops"', 'id="chart-opcmp-0-0"', 'id="ops-0"', 'id="convs-0"',
             'id="opcmp"', "weight_grad 3.250 vs 1.625 ms (+1.625)", "<code>conv2d_fwd</code>"):
    if need not in h:
        bad.append("missing %s" % need)
assert "<script" not in h
CATS = ["conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling", "loss", "optimizer",
        "copies", "other", "idle"]
HBAR = (r'<rect class="hbar" data-run="(\d+)" data-cat="(\d+)" data-key="([^"]+)" data-value="([^"]+)" '
        r'x="([^"]+)" y="[^"]+" width="([^"]+)"')
bars = re.findall(HBAR, h)
if len(bars) != 11 + 22:
    bad.append("%d bars, expected 11 (the run) + 22 (the pair)" % len(bars))
for c in CATS:
    if not re.search(r'<text class="cat"[^>]*>%s</text>' % c, h):
        bad.append("no label %s" % c)
got = {k: float(v) for _, _, k, v, _, _ in bars}
for c in CATS:
    want = summ["op_profile"]["categories"][c]
    if abs(got.get("op_profile.categories." + c, -1) - want) > 1e-6 * max(1, want):
        bad.append("run bar %s = %s, summary %s" % (c, got.get("op_profile.categories." + c), want))
if got.get("pairs[0].ringtrain.categories.weight_grad") != 3.25 or got.get("pairs[0].pytorch.categories.weight_grad") != 1.625:
    bad.append("the pair's weight_grad bars: %s %s" % (got.get("pairs[0].ringtrain.categories.weight_grad"),
                                                     got.get("pairs[0].pytorch.categories.weight_grad")))
# Bar widths follow the value through each chart's x mapping (the run's chart, then the pair's).
for fig in re.findall(r'<figure class="chart" id="chart-(?:ops|opcmp-0-0)">.*?</figure>', h, re.S):
    m = re.search(r'<g class="area" data-x0="([^"]+)" data-x1="([^"]+)" data-y0="[^"]+" data-y1="[^"]+" '
                  r'data-px0="([^"]+)" data-px1="([^"]+)"', fig)
    x0, x1, p0, p1 = map(float, m.groups())
    for _, _, k, v, x, w in re.findall(HBAR, fig):
        want = (float(v) - x0) / (x1 - x0) * (p1 - p0)
        if abs(float(x) - p0) > 0.01 or abs(float(w) - want) > 0.6:
            bad.append("%s: width %s, value %s maps to %.2f" % (k, w, v, want))
if ">3.25 (32%)</text>" not in h:
    bad.append("the value 3.25 (32%) not printed beside its bar")
print("  %d bars checked" % len(bars) if not bad else "\n".join(bad[:10]))
sys.exit(1 if bad else 0)
EOF
"$RT" report "$W/c.out" -o "$W/r2.html" >"$W/r2.out" 2>&1 && ! grep -q 'id="op-profile"' "$W/r2.html" \
    && pass "report: no per-op section for a run without --profile-ops" || { fail "report without op profile"; show "$W/r2.out"; }
"$RT" report "$W/cmp.json" -o "$W/r3.html" >"$W/r3.out" 2>&1 && grep -q 'id="chart-opcmp-0-0"' "$W/r3.html" \
    && grep -q "1 profile comparison" "$W/r3.html" && pass "report: the comparison file alone, recognised by its content" \
    || { fail "report of the comparison alone"; show "$W/r3.out"; }

[ "$fails" -eq 0 ] && { echo "test_profile_ops: all passed"; exit 0; }
echo "test_profile_ops: $fails failed"
exit 1
