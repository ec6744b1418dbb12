#!/usr/bin/env bash
# layer_times.sh - where ringtrain's training step loses or wins against
# PyTorch's, layer by layer: the forward and backward time of every layer of
# one model in one precision, both ways at the same batch and thread count,
# side by side with their ratio, sorted by the gap.
#   bench/layer_times.sh [--bin PATH] [--model M] [--amp off|bf16]
#                        [--batch-size B] [--threads T] [--steps N]
#                        [--warmup W] [--runs R] [--pt-format F]
#                        [--no-ceiling] [--keep DIR]
# The step is train_vs_pytorch.sh's compute step: forward + backward + SGD
# (momentum 0.9, weight decay 5e-4) on a fixed synthetic uint8 batch of
# 3x32x32 images normalised every step, 10 classes, CrossEntropyLoss.
#   ringtrain: `train --synthetic-data --model M --amp A --batch-size B
#             --threads T --steps W+N --trace FILE --trace-steps W:W+N`; the
#             trace's "compute stream" track holds a `fwd LAYER` and a
#             `bwd LAYER` span for every layer of every recorded step, the
#             loss (its forward and backward in one) and the optimizer.
#   PyTorch:  bench/torch_train.py layers (the same model from
#             tools/reference_models.py, autocast bf16 with --amp bf16): a
#             forward pre-hook on every leaf module and a hook on the gradient
#             of its output stamp the clock; a module's forward and backward
#             times run from its stamp to the next (functional operations
#             between modules, F.relu or a residual add, count with the module
#             before them); in-place ReLUs run out of place; W untimed steps,
#             then the mean of N.
# Both sides name layers by the PyTorch state_dict names (conv, batch norm,
# linear, pooling). A layer that only one side has as a layer of its own
# (ringtrain's relu nodes and residual adds, PyTorch's ReLU and Dropout
# modules, a label the trace cut short) is counted with the layer before it
# on that side, so that every row holds the same work both ways; the rows
# say what was folded into them. Rows are sorted by the gap, ringtrain's
# time minus PyTorch's (ms per step), largest first: the top rows are where
# ringtrain loses most. The speed ratio is PyTorch's time / ringtrain's (above
# 1: ringtrain faster), as train_vs_pytorch.sh's images/s ratio. GFLOP/s per
# row: 3 x 2 x the forward multiply-adds of its convolutions and linear
# layers x B, over the row's time; % of the ceiling: of the GFLOP/s of a large
# matrix product in the same precision on the same threads (bench/gemm_ceiling.c,
# as train_vs_pytorch.sh prints it).
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --model M         resnet18, resnet9, mnist-net, wrn-D-K (default resnet9)
#   --amp P           off (fp32, default) or bf16, both ways
#   --batch-size B    images per step (default 128)
#   --threads T       compute threads of both ways (default: nproc)
#   --steps N         recorded steps (default 5)
#   --warmup W        untimed steps before them (default 3)
#   --runs R          rounds of both ways, alternated; each row is the median
#                     of the R runs (default 1)
#   --pt-format F     PyTorch's memory format: channels_last (default: the
#                     faster or as fast for every model in both precisions on
#                     the AMD EPYC Zen 4 it was tried on; train_vs_pytorch.sh
#                     says by how much) or contiguous
#   --no-ceiling      skip the matrix-product ceiling (and the % columns)
#   --keep DIR        keep the traces and the PyTorch JSON in DIR
# Needs /usr/bin/python3 with torch + torchvision; the ceiling needs cc and
# libdnnl-dev. About a minute for resnet9 with the defaults on 2 cores.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
MODEL=resnet9
AMP=off
B=128
THREADS=$(nproc)
STEPS=5
WARMUP=3
RUNS=1
PT_FORMAT=channels_last
CEIL=1
KEEP=
PY=/usr/bin/python3

bench_options --bin=RT --model=MODEL --amp=AMP --batch-size=B --threads=THREADS --steps=STEPS --warmup=WARMUP \
    --runs=RUNS --pt-format=PT_FORMAT --no-ceiling=CEIL:0 --keep=KEEP -- "$@"
bench_posint "$B" "$THREADS" "$STEPS" "$RUNS"
case $WARMUP in '' | *[!0-9]*) bench_fail "--warmup '$WARMUP' is not a whole number" ;; esac
case $AMP in off | bf16) ;; *) bench_fail "--amp takes off or bf16" ;; esac
case $PT_FORMAT in channels_last | contiguous) ;; *) bench_fail "--pt-format takes channels_last or contiguous" ;; esac
RT=$(bench_bin "$RT")
prec=fp32
[ "$AMP" = off ] || prec=$AMP

bench_sudo
bench_need_bin
bench_need_torch "PyTorch for $PY is missing or broken" "$PY" "$top/bench/torch_train.py" check --amp "$AMP"
"$PY" "$top/bench/torch_train.py" flops --model "$MODEL" >/dev/null || bench_fail "PyTorch cannot build $MODEL (above)"
bench_scratch rt-layers
if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP" || bench_fail "cannot make --keep $KEEP"
fi

bench_report_helper "$t/report.py" <<'EOF'
RT_LABEL_MAX = 23  # the trace cuts span labels at 23 characters (common/trace.c LABEL_LEN - 1)


def rt_steps(path):
    """The compute stream's spans of a ringtrain trace: (steps, [[label, fwd ns, bwd ns]] per layer call in
    forward order, summed over the steps; loss ns; optimizer ns)."""
    d = json.load(open(path))
    ev = d["traceEvents"]
    tracks = [(e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"
              and e.get("args", {}).get("name") == "compute stream"]
    if not tracks:
        raise SystemExit("%s: no \"compute stream\" track (was it recorded with --trace?)" % path)
    tr = tracks[0]
    xs = sorted((e for e in ev if (e["pid"], e["tid"]) == tr and e.get("ph") == "X"), key=lambda e: e["ts"])
    steps, order, fsum, bsum = 0, None, None, None
    fwd, bwd, loss, opt = [], [], 0.0, 0.0
    for e in xs:
        name, dur = e["name"], float(e["dur"]) * 1e3
        if name.startswith("fwd "):
            fwd.append((name[4:], dur))
        elif name.startswith("bwd "):
            bwd.append((name[4:], dur))
        elif name == "loss":
            loss += dur
        elif name == "optimizer":
            opt += dur
            if not fwd:
                continue  # an optimizer span without its step's layers (the window's edge)
            labels = [l for l, _ in fwd]
            if order is None:
                order, fsum, bsum = labels, [0.0] * len(labels), [0.0] * len(labels)
            elif labels != order:
                raise SystemExit("%s: the layers ran in another order in a later step" % path)
            # The k-th forward call of a label is the k-th from the end of its backward calls.
            where = {}
            for i, l in enumerate(labels):
                where.setdefault(l, []).append(i)
            for i, (_, t) in enumerate(fwd):
                fsum[i] += t
            seen = {}
            for l, t in bwd:
                k = seen.get(l, 0)
                seen[l] = k + 1
                idx = where.get(l, [])
                if k < len(idx):
                    bsum[idx[len(idx) - 1 - k]] += t
            steps += 1
            fwd, bwd = [], []
    if not steps:
        raise SystemExit("%s: no whole step on the compute stream track" % path)
    return steps, [[l, f, b] for l, f, b in zip(order, fsum, bsum)], loss, opt


def canonical(label, names):
    """A ringtrain label cut short by the trace -> the PyTorch name it starts, when just one does."""
    if label in names or len(label) < RT_LABEL_MAX:
        return label
    hits = [n for n in names if n.startswith(label)]
    return hits[0] if len(hits) == 1 else label


def fold(calls, common):
    """[(key, fwd, bwd, flops, kind)] in forward order -> {key: [fwd, bwd, flops, folded names]} and the keys'
    order: a call whose key the other side lacks counts with the row before it."""
    rows, order = {}, []
    cur = None
    for key, f, b, fl, kind in calls:
        if key in common or cur is None:
            cur = key
            if key not in rows:
                rows[key] = [0.0, 0.0, 0, []]
                order.append(key)
        else:
            if kind not in rows[cur][3]:
                rows[cur][3].append(kind)
        r = rows[cur]
        r[0] += f
        r[1] += b
        r[2] += fl
    return rows, order


def kind_of_rt(label):
    """How a folded ringtrain node is named in a row: relu, residual add, flatten, scale, ... (no layer
    indices; the trace may have cut the label short)."""
    if " (" in label:
        what = label.split(" (", 1)[1].rstrip(")")
        return "residual add" if "residual".startswith(what) else what
    return label.split(" ")[0]


def one_run(rt_trace, pt_json):
    """{key: {rt_f, rt_b, pt_f, pt_b, flops, rt_folded, pt_folded}}, the key order, ringtrain's and PyTorch's
    step totals."""
    steps, rt_calls, loss, opt = rt_steps(rt_trace)
    pt = last_json(pt_json)
    if pt is None or "layers" not in pt:
        raise SystemExit("%s: no JSON line from torch_train.py layers" % pt_json)
    pt_names = {l["name"] for l in pt["layers"]}
    ms = 1e-6 / steps
    rt = [("input" if l == "input" else canonical(l, pt_names), f * ms, b * ms, 0, l) for l, f, b in rt_calls]
    rt.append(("loss", loss * ms, 0.0, 0, "loss"))
    ptc = [("input", pt["input_ms"], 0.0, 0, "input")]
    ptc += [(l["name"], l["fwd_ms"], l["bwd_ms"], l["train_flops"], l["type"]) for l in pt["layers"]]
    ptc.append(("loss", pt["loss_fwd_ms"], pt["loss_bwd_ms"], 0, "loss"))
    # Rows are the names each side calls once (ringtrain's "relu" nodes share one name, a PyTorch module
    # called twice is two calls).
    once = lambda calls: {k for k in {c[0] for c in calls} if sum(1 for c in calls if c[0] == k) == 1}
    common = once(rt) & once(ptc)
    rrows, rorder = fold(rt, common)
    prows, porder = fold(ptc, common)
    out = {}
    for k in rorder + [k for k in porder if k not in rrows]:
        r, p = rrows.get(k), prows.get(k)
        out[k] = {"rt_f": r[0] if r else None, "rt_b": r[1] if r else None,
                  "pt_f": p[0] if p else None, "pt_b": p[1] if p else None, "flops": p[2] if p else 0,
                  "rt_folded": [kind_of_rt(x) for x in r[3]] if r else [], "pt_folded": p[3] if p else []}
    out["optimizer"] = {"rt_f": None, "rt_b": None, "pt_f": None, "pt_b": None, "flops": 0,
                        "rt_o": opt * ms, "pt_o": pt["optimizer_ms"], "rt_folded": [], "pt_folded": []}
    rt_step = sum(f + b for _, f, b, _, _ in rt) + opt * ms
    return out, rorder + [k for k in porder if k not in rrows] + ["optimizer"], rt_step, pt["step_ms"], pt


def show_run(rt_trace, pt_json):
    out, order, rt_step, pt_step, pt = one_run(rt_trace, pt_json)
    print("  ringtrain  compute stream %.1f ms per step (forward %.1f, backward %.1f, optimizer %.1f)" % (
        rt_step, sum(v["rt_f"] or 0 for v in out.values()), sum(v["rt_b"] or 0 for v in out.values()),
        out["optimizer"]["rt_o"]))
    print("  PyTorch    step %.1f ms (forward %.1f, backward %.1f, optimizer %.1f); %s" % (
        pt_step, pt["forward_ms"], pt["backward_ms"], pt["optimizer_ms"],
        "convolutions in %s" % pt["conv_dtype"] if pt.get("conv_dtype") else "no convolution"))
    return 0


def table(runs, batch, ceiling_path, prec, prefix):
    runs = int(runs)
    res = [one_run("%s.%d.trace.json" % (prefix, i), "%s.%d.pt.json" % (prefix, i)) for i in range(1, runs + 1)]
    order = res[0][1]
    ceil = None
    c = last_line_json(ceiling_path) if ceiling_path else None
    if c:
        ceil = c.get("fp32_gflops") if prec == "fp32" else c.get("bf16_gflops")

    def med(key, field):
        xs = [r[0][key].get(field) for r in res if key in r[0] and r[0][key].get(field) is not None]
        return statistics.median(xs) if xs else None

    rows = []
    for k in order:
        v = res[0][0][k]
        if k == "optimizer":
            rt_t, pt_t = med(k, "rt_o"), med(k, "pt_o")
            rf = rb = pf = pb = None
        else:
            rf, rb, pf, pb = med(k, "rt_f"), med(k, "rt_b"), med(k, "pt_f"), med(k, "pt_b")
            rt_t = rf + rb if rf is not None else None
            pt_t = pf + pb if pf is not None else None
        gap = rt_t - pt_t if rt_t is not None and pt_t is not None else None
        folded = []
        if v["rt_folded"]:
            folded.append("ringtrain +" + ", ".join(sorted(set(v["rt_folded"]))))
        if v["pt_folded"]:
            folded.append("PyTorch +" + ", ".join(sorted(set(v["pt_folded"]))))
        rows.append((k, v["flops"], rf, pf, rb, pb, rt_t, pt_t, gap, "; ".join(folded)))
    rows.sort(key=lambda r: -(r[8] if r[8] is not None else -1e18))

    def ms(x):
        return "%.2f" % x if x is not None else "-"

    def speed(r, p):
        return "%.2f" % (p / r) if r and p is not None and r > 0 else "-"

    def gfs(fl, t):
        return fl / (t * 1e-3) / 1e9 if fl and t else None

    def pct(g):
        return "%.0f %%" % (100 * g / ceil) if g and ceil else "-"

    print("| layer | train GFLOP | ringtrain fwd | PyTorch fwd | fwd speed rt:pt | ringtrain bwd | PyTorch bwd "
          "| bwd speed rt:pt | ringtrain total | PyTorch total | gap (rt - pt) | ringtrain GFLOP/s | of ceiling "
          "| PyTorch GFLOP/s | of ceiling | counted with it |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    tot = [0.0] * 6
    for k, fl, rf, pf, rb, pb, rt_t, pt_t, gap, folded in rows:
        g_rt, g_pt = gfs(fl, rt_t), gfs(fl, pt_t)
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            k, "%.2f" % (fl / 1e9) if fl else "", ms(rf), ms(pf), speed(rf, pf), ms(rb), ms(pb), speed(rb, pb),
            ms(rt_t), ms(pt_t), "%+.2f" % gap if gap is not None else "-",
            "%.1f" % g_rt if g_rt else "", pct(g_rt), "%.1f" % g_pt if g_pt else "", pct(g_pt), folded))
        for i, x in enumerate((rf, pf, rb, pb, rt_t, pt_t)):
            tot[i] += x or 0
    fl_all = sum(r[1] for r in rows)
    g_rt, g_pt = gfs(fl_all, tot[4]), gfs(fl_all, tot[5])
    print("| **all** | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %s | %.2f | %.2f | %+.2f | %.1f | %s | %.1f | %s | |" % (
        fl_all / 1e9, tot[0], tot[1], speed(tot[0], tot[1]), tot[2], tot[3], speed(tot[2], tot[3]), tot[4], tot[5],
        tot[4] - tot[5], g_rt or 0, pct(g_rt), g_pt or 0, pct(g_pt)))
    pt_step = statistics.median([r[3] for r in res])
    print()
    print("ms per step, medians of %d run(s); all = the rows' sum: %.0f images/s ringtrain, %.0f images/s PyTorch "
          "(PyTorch's whole step with zero_grad and Python: %.2f ms, %.0f images/s)." % (
              runs, int(batch) / tot[4] * 1e3, int(batch) / tot[5] * 1e3, pt_step, int(batch) / pt_step * 1e3))
    print("ringtrain's loss row is its fused softmax cross-entropy forward + backward; PyTorch's loss backward is "
          "in its bwd column.")
    return 0


if __name__ == "__main__":
    main({"run": show_run, "table": table})
EOF
report() { "$PY" "$t/report.py" "$@"; }

cmd_way() { # way run
    if [ "$1" = rt ]; then
        cmd=("$RT" train --synthetic-data --model "$MODEL" --amp "$AMP" --batch-size "$B" --threads "$THREADS"
            --steps $((WARMUP + STEPS)) --trace "$t/r.$2.trace.json" --trace-steps "$WARMUP:$((WARMUP + STEPS))"
            --no-progress --json)
    else
        cmd=("$PY" "$top/bench/torch_train.py" layers --model "$MODEL" --amp "$AMP" --memory-format "$PT_FORMAT"
            --batch-size "$B" --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP")
    fi
}

echo "== per-layer times: $MODEL, $prec, batch $B, $THREADS threads, ringtrain vs PyTorch ($PT_FORMAT) =="
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $torch_versions"
echo "settings: $STEPS recorded steps after $WARMUP warm-up, $RUNS run(s) alternated; ringtrain: the trace's compute"
echo "          stream (--trace-steps $WARMUP:$((WARMUP + STEPS))); PyTorch: module and gradient hooks (torch_train.py layers)"
[ "$CEIL" = 0 ] || echo "ceiling:  oneDNN fp32 sgemm and bf16 matmul, 3072x3072x3072, $THREADS threads, in every run"

fails=0
measure() { # way run
    # shellcheck disable=SC2034 # bench_run sets wall too; the hooks' times are what counts here
    local rc wall
    bench_run "$t/$1.$2.out" "$t/$1.$2.err"
    if [ "$rc" -ne 0 ]; then
        echo "  $([ "$1" = rt ] && echo ringtrain || echo PyTorch) FAILED"
        bench_show_failure "$rc" "$t/$1.$2.err" "$t/$1.$2.out"
        fails=$((fails + 1))
    fi
}
for i in $(seq "$RUNS"); do
    echo "run $i/$RUNS"
    if [ "$CEIL" = 1 ] && ! bench_ceiling "$THREADS" "$t/ceiling.$i.json" brief; then
        [ -x "$t/gemm_ceiling" ] || CEIL=0
    fi
    for w in $(bench_order "$i" rt pt); do
        cmd_way "$w" "$i" && measure "$w" "$i"
    done
    [ "$fails" -gt 0 ] || cp "$t/pt.$i.out" "$t/r.$i.pt.json"
    [ "$fails" -gt 0 ] || report run "$t/r.$i.trace.json" "$t/r.$i.pt.json"
done
bench_finish $fails
ceiling=
if [ "$CEIL" = 1 ] && bench_ceiling_merge "$t/ceiling.json" "$t"/ceiling.[0-9]*.json 2>/dev/null; then
    ceiling=$t/ceiling.json
fi
if [ -n "$KEEP" ]; then
    cp "$t"/r.*.trace.json "$t"/r.*.pt.json "$KEEP"/
    cp "$t"/rt.*.out "$KEEP"/ 2>/dev/null || true
fi

echo
echo "Per layer, ms per step ($MODEL, $prec, batch $B, $THREADS threads; PyTorch $PT_FORMAT), sorted by the gap,"
echo "ringtrain's time - PyTorch's, largest first; speed rt:pt = PyTorch ms / ringtrain ms (above 1: ringtrain"
echo "faster); GFLOP/s of the row's conv + linear work (3 x 2 x multiply-adds x $B) over its time; of ceiling: of the"
if [ -n "$ceiling" ]; then
    echo "$prec matrix product's $("$PY" -c 'import json, sys
c = json.loads(open(sys.argv[1]).read())
g = c["fp32_gflops"] if sys.argv[2] == "fp32" else c["bf16_gflops"]
print("%.1f GFLOP/s (median of %d run(s))" % (g, c["rounds"]) if g else "GFLOP/s: n/a (%s)" % c["bf16_note"])' "$ceiling" "$prec")."
else
    echo "$prec matrix product (n/a here)."
fi
echo
report table "$RUNS" "$B" "$ceiling" "$prec" "$t/r"
