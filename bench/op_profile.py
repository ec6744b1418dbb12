#!/usr/bin/python3
"""op_profile.py - where a training step's time goes, per op and per category,
for bench/gpu_vs_pytorch.sh's profile part: PyTorch's side read from
torch.profiler, ringtrain's from its `train --profile-ops` summary, side by side
in a table a person reads and one JSON file that `ringtrain report` draws.

It does not run anything: torch_train.py profile runs PyTorch's step under
torch.profiler and calls the readers below; the bench runs ringtrain.

Categories (the same names as ringtrain's op_profile, ms per step each):
  conv_fwd     convolutions and linear layers (addmm/mm/linear) in the forward pass
  data_grad    gradient of a convolution's or linear layer's input
  weight_grad  gradient of its weight (and bias)
  batchnorm    batch norm forward and backward
  elementwise  relu, threshold_backward, add, mul, dropout, ...
  pooling      max/avg/adaptive pooling and a mean over H, W, forward and backward
  loss         log_softmax, nll_loss, cross_entropy and their backwards
  optimizer    the optimizer step's work (_foreach_*, sgd, the loss scaler's unscale and update)
  copies       to / copy_ / cat / contiguous, memcpy and memset, the uint8 input's normalisation
  other        the rest
  idle         wall time per step minus the time the device was busy

How an op's time finds its category, from the inside out:
  - the context: inside the optimizer's span (torch's "Optimizer.step#...", the
    step's own "rt:optimizer") -> optimizer; inside "rt:input" -> copies;
  - in backward, the autograd node the op runs for ("autograd::engine::
    evaluate_function: ConvolutionBackward0", ...): convolution nodes split into
    data_grad and weight_grad by kernel (cuDNN's kernel names say dgrad or wgrad;
    an unnamed compute kernel takes its place in the order PyTorch runs them,
    input gradient first; a helper kernel such as a layout transform goes with
    the compute kernel after it); linear nodes split by the output shape of each
    mm (batch rows: the input's gradient, else the weight's); batch norm,
    pooling, loss, element-wise and copy nodes by their names;
  - in forward, the outermost op of the chain that has a category
    (aten::batch_norm holds all under it, aten::linear its addmm, ...);
  - device-side memcpy and memset are copies wherever they run.

Where the time comes from:
  CUDA  from_chrome_trace(): the kernels, memcpys and memsets of the Kineto
        trace (torch.profiler with CPU and CUDA activities, exported with
        export_chrome_trace), each one's duration; each linked to the CPU op that
        launched it: the trace's "External id", or the innermost op around the
        launch call with the kernel's "correlation" (the inner of the two where
        both name one). An op's time is the self CUDA time of its own launches.
        idle = wall per step (between two synchronizations) minus the union of
        the device intervals. Only what lies in the "rt:profiled" span counts
        (device events from 1 ms before its start): the step torch_train.py runs
        under the profiler first, to pay for CUPTI's start, does not.
  CPU   from_function_events(): the self CPU time of every op (aten:: and other
        namespaced ops; the autograd engine's wrappers, the backward nodes' own
        records and the annotations count as host time) inside "rt:profiled";
        idle = wall per step minus that sum. A convolution's backward is one op
        there (oneDNN), so its time is split evenly between data_grad and
        weight_grad (said in "notes").
Not verified on a GPU yet: the Kineto trace's names and links are those of
PyTorch 2.x as documented (tests/test_bench_profile.sh checks the reader on a
canned trace of that shape); a trace that differs shows as kernels linked to
no op ("other") and as notes.

Commands (JSON on stdout, tables for people):
  op_profile.py trace TRACE.json[.gz] --steps N --batch B [--wall-ms MS]
      categorise a saved torch.profiler chrome trace (torch_train.py profile
      --trace-out keeps one; the wall time per step from its rt:profiled span
      unless given): the pytorch object of the comparison
  op_profile.py add --json FILE --gpu S --host S --model M --amp A --batch B
                    [--rt OUT] [--pt OUT]
      one model x precision: OUT files are the two runs' outputs (their last JSON
      line: ringtrain's --json summary with "op_profile", torch_train.py's
      profile line); prints the pair's tables and writes FILE (made when absent)
      with the pair added
  op_profile.py summary --json FILE
      the line of the three largest differences of every pair in FILE
The comparison file: {"profile_comparison": 1, "gpu": str, "host": str,
  "pairs": [{"model", "amp", "batch", "ringtrain": <its op_profile> | null,
  "pytorch": {"step_ms", "categories", "ops": [{"op", "category", "ms",
  "calls"}], "kernels_by_category"?, "settings", ...} | null,
  "largest": [{"category", "ringtrain_ms", "pytorch_ms"}]}]}.
ms and calls are per step; op names are torch's ("aten::convolution_backward"),
a device event no op launched goes by its own name.
"""
import argparse
import gzip
import json
import os
import re
import sys

CATEGORIES = ("conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling", "loss",
              "optimizer", "copies", "other", "idle")
BUSY = CATEGORIES[:-1]

# Forward ops by their name without "aten::" (the first rule that matches).
FWD_RULES = [
    ("conv_fwd", r"conv\d?d|conv_transpose\d?d|convolution|_convolution\w*|cudnn_convolution\w*|mkldnn_convolution\w*"
                 r"|miopen_convolution\w*|slow_conv\w*|thnn_conv\w*|linear|addmm|mm|matmul|bmm|baddbmm|_addmm_activation"),
    ("batchnorm", r"batch_norm|_batch_norm\w*|cudnn_batch_norm\w*|native_batch_norm\w*|_native_batch_norm\w*"
                  r"|miopen_batch_norm\w*|batch_norm_\w+"),
    ("pooling", r"max_pool\dd\w*|avg_pool\dd\w*|adaptive_(avg|max)_pool\dd\w*|_adaptive_(avg|max)_pool\dd\w*"),
    ("loss", r"cross_entropy_loss|log_softmax|_log_softmax\w*|nll_loss\w*|softmax|_softmax\w*"),
    ("optimizer", r"_foreach_\w+|sgd|_fused_sgd\w*|_fused_adam\w*|_amp_\w+"),
    ("copies", r"to|_to_copy|copy_|clone|contiguous|cat|stack|_copy_from\w*|pad|constant_pad_nd"),
    ("elementwise", r"relu_?|threshold_?|threshold_backward|clamp\w*|hardtanh\w*|add_?|sub_?|rsub|mul_?|div_?|neg_?"
                    r"|addcmul_?|addcdiv_?|sqrt_?|rsqrt_?|exp_?|pow_?|where|dropout|native_dropout\w*|bernoulli_?"
                    r"|fill_|zero_|ones_like|zeros_like|full_like|add_relu\w*|sigmoid\w*|gelu\w*|silu\w*|lerp_?"),
]
FWD_RULES = [(c, re.compile("(%s)$" % r)) for c, r in FWD_RULES]
MM_OPS = re.compile(r"(mm|addmm|matmul|bmm|baddbmm)$")
CONV_BWD_OPS = re.compile(r"\w*conv\w*backward\w*$")

# Backward nodes by their name without the trailing number ("ConvolutionBackward0" -> "ConvolutionBackward").
NODE_RULES = [
    ("conv", r"(Cudnn|Mkldnn|Miopen|Thnn|Slow)?Conv(olution)?(\dD|Transpose\dD)?\w*Backward"),
    ("mm", r"(Addmm|Mm|Linear|Matmul|Bmm|Baddbmm)Backward"),
    ("batchnorm", r"\w*BatchNorm\w*Backward"),
    ("pooling", r"(MaxPool|AvgPool|AdaptiveAvgPool|AdaptiveMaxPool|Mean)\w*Backward"),
    ("loss", r"(NllLoss|LogSoftmax|Softmax|CrossEntropy)\w*Backward"),
    ("weight_grad", r"(torch::autograd::)?AccumulateGrad"),
    ("copies", r"(ToCopy|Clone|Cat|Copy\w*|View|Reshape\w*|T|Transpose|Permute|Expand|Unsqueeze\w*|Squeeze\w*"
               r"|Flatten|AsStrided|Unsafe\w*|Contiguous)Backward"),
    ("elementwise", r"(Relu|Threshold|Add|Sub|Rsub|Mul|Div|Neg|Clamp\w*|Hardtanh|NativeDropout|Dropout|Sigmoid|Gelu"
                    r"|Silu|Where|Pow|Sqrt|Rsqrt|Exp)\w*Backward"),
]
NODE_RULES = [(c, re.compile("(%s)$" % r)) for c, r in NODE_RULES]
NODE_PREFIX = "autograd::engine::evaluate_function: "
OPTIMIZER_SPANS = ("rt:optimizer", "Optimizer.step", "Optimizer.zero_grad")
INPUT_SPAN = "rt:input"
# The profiled steps, between two synchronizations: what lies outside (a step run under the profiler
# first, whose launches pay for CUPTI's start) does not count. Device events count from 1 ms before
# its start on (the device's clock as the trace aligns it to the host's; the caller leaves 2 ms of
# nothing before the span).
PROFILED_SPAN = "rt:profiled"
SPAN_SLACK_US = 1000.0

# Convolution-backward kernels: what cuDNN's (and CUTLASS's) names say.
K_WGRAD = re.compile(r"wgrad|bwd_filter|backward_filter|backward_weight|filter_grad", re.I)
K_DGRAD = re.compile(r"dgrad|bwd_data|backward_data|backward_input", re.I)
K_COMPUTE = re.compile(r"gemm|conv|fprop|xmma|implicit|winograd|fft|engine|cutlass|sm\d\d_", re.I)


class Op:
    """One host-side event: an op ("op"), or a span that is not one ("wrapper": the
    autograd engine's records, backward nodes, annotations). start and end in
    microseconds on the thread's clock; self_us: its time outside its children."""
    __slots__ = ("name", "tid", "start", "end", "shapes", "parent", "kind", "self_us", "ext")

    def __init__(self, name, tid, start, end, shapes=None, kind=None, self_us=0.0, ext=None):
        self.name, self.tid, self.start, self.end = name, tid, float(start), float(end)
        self.shapes = shapes or []
        self.parent = None
        self.kind = kind or op_kind(name)
        self.self_us = self_us
        self.ext = ext


def op_kind(name):
    """"op" for a namespaced op (aten::add, torchvision::nms), "wrapper" for the autograd
    engine's spans, backward nodes, annotations and everything else."""
    if name.startswith(("autograd::", "torch::autograd::", "profiler::")) or "::" not in name:
        return "wrapper"
    return "op" if re.match(r"[A-Za-z_]\w*::\w", name) else "wrapper"


def short(name):
    return name[6:] if name.startswith("aten::") else name


def chain(op):
    out = []
    while op is not None:
        out.append(op)
        op = op.parent
    return out


def fwd_category(op):
    """The category an op's name gives it in forward, or None."""
    s = short(op.name)
    if s == "mean" and op.shapes and len(op.shapes[0]) == 4:
        return "pooling"  # a mean over H, W: global average pooling
    for cat, rx in FWD_RULES:
        if rx.match(s):
            return cat
    return None


def node_of(ch):
    """The backward node an op runs for ("ConvolutionBackward", ...), or None in forward."""
    for x in ch:
        if x.name.startswith(NODE_PREFIX):
            n = x.name[len(NODE_PREFIX):]
            return re.sub(r"\d+$", "", n)
    return None


def mm_grad(op, batch, order):
    """data_grad or weight_grad of an mm in a linear layer's backward. For a = the
    left operand, [rows, k]: the input's gradient is grad [B, out] x W [out, in]
    (B rows), the weight's contracts over the batch (k = B). When the shapes cannot
    tell (out = in = B), the node's first mm is the input's: PyTorch computes it
    first. order: 0 for the node's first mm, 1 for later ones."""
    sh = [s for s in op.shapes if isinstance(s, (list, tuple))]
    a = sh[1] if short(op.name) in ("addmm", "baddbmm") and len(sh) >= 3 else (sh[0] if sh else None)
    if a and len(a) >= 2 and batch:
        rows, k = a[-2], a[-1]
        if k == batch and rows != batch:
            return "weight_grad"
        if rows == batch and k != batch:
            return "data_grad"
    return "data_grad" if order == 0 else "weight_grad"


def node_call(op):
    """The autograd engine's span of the backward node op runs for, or None."""
    return next((x for x in chain(op) if x.name.startswith(NODE_PREFIX)), None)


def mm_orders(ops):
    """{id(op): 0 for the first mm-like op of its backward node's call, 1 after}."""
    seen, out = {}, {}
    for o in sorted(ops, key=lambda o: o.start):
        if o.kind == "op" and MM_OPS.match(short(o.name)):
            n = node_call(o)
            if n is not None:
                out[id(o)] = 1 if id(n) in seen else 0
                seen[id(n)] = True
    return out


def context(op):
    """("optimizer" | "copies" | None, backward node or None, the chain)."""
    ch = chain(op)
    for x in ch:
        if x.name.startswith(OPTIMIZER_SPANS):
            return "optimizer", None, ch
        if x.name == INPUT_SPAN:
            return "copies", None, ch
    return None, node_of(ch), ch


def op_category(op, batch, mm_order=0):
    """The category of op's own time (CPU) or of a kernel it launched, except for a
    convolution's backward, which the caller splits: returns "conv_bwd" then."""
    span, node, ch = context(op)
    if span:
        return span
    s = short(op.name)
    if node is not None:
        kind = next((cat for cat, rx in NODE_RULES if rx.match(node)), None)
        if kind == "conv":
            if re.search(r"backward_(input|data)$", s):
                return "data_grad"
            if re.search(r"backward_weight\w*$", s) or s == "sum":  # sum: the bias's gradient
                return "weight_grad"
            return "conv_bwd"  # the call's kernels are split by split_conv_kernels()
        if kind == "mm":
            if MM_OPS.match(s):
                return mm_grad(op, batch, mm_order)
            if s == "sum":
                return "weight_grad"  # the bias's gradient
            return fwd_category(op) or "other"
        if kind:
            return kind
        c = fwd_category(op)  # a node of no known kind: the op's own name, but no forward convolution
        if c == "conv_fwd":
            return "conv_bwd" if CONV_BWD_OPS.match(s) else "other"
        return c or "other"
    if op.kind == "op" and CONV_BWD_OPS.match(s):
        return "conv_bwd"  # a convolution backward without its node (a backward run by hand)
    for x in reversed(ch):  # the outermost op with a category holds what runs under it
        if x.kind == "op":
            c = fwd_category(x)
            if c:
                return c
    return "other"


def split_conv_kernels(names):
    """Per kernel of one convolution backward, in launch order: "data_grad",
    "weight_grad", or "half" (neither its name nor its place tells)."""
    tag = []
    for n in names:
        if K_WGRAD.search(n):
            tag.append("W")
        elif K_DGRAD.search(n):
            tag.append("D")
        elif K_COMPUTE.search(n):
            tag.append("C")
        else:
            tag.append("H")  # a helper: layout transform, memset, offsets
    w = [i for i, t in enumerate(tag) if t == "W"]
    d = [i for i, t in enumerate(tag) if t == "D"]
    out = [None] * len(tag)
    for i, t in enumerate(tag):
        if t == "W":
            out[i] = "weight_grad"
        elif t == "D":
            out[i] = "data_grad"
        elif t == "C":
            if w:
                out[i] = "data_grad" if i < w[0] else "weight_grad"
            elif d:
                out[i] = "data_grad" if i < d[-1] else "weight_grad"
            else:
                out[i] = "half"
    for i, t in enumerate(tag):
        if t == "H":
            after = [out[j] for j in range(i + 1, len(tag)) if tag[j] != "H"]
            before = [out[j] for j in range(i - 1, -1, -1) if tag[j] != "H"]
            out[i] = after[0] if after else (before[0] if before else "half")
    return out


def nest(ops):
    """Sets each Op's parent: the innermost event around it on its thread."""
    by_tid = {}
    for o in ops:
        by_tid.setdefault(o.tid, []).append(o)
    for evs in by_tid.values():
        evs.sort(key=lambda o: (o.start, -o.end))
        stack = []
        for o in evs:
            while stack and (o.start >= stack[-1].end - 1e-6 or o.end > stack[-1].end + 1e-3):
                stack.pop()
            o.parent = stack[-1] if stack else None
            stack.append(o)


def shape_str(shapes, conv_bwd=False):
    """A convolution's shapes as "in NxCxHxW, w KxCxRxS" (backward: inputs 1 and 2)."""
    sh = [s for s in (shapes or []) if isinstance(s, (list, tuple))]
    if conv_bwd and len(sh) >= 3:
        sh = sh[1:]
    if len(sh) >= 2 and sh[0] and sh[1]:
        return "in %s, w %s" % ("x".join(map(str, sh[0])), "x".join(map(str, sh[1])))
    return "x".join(map(str, sh[0])) if sh and sh[0] else ""


def kernel_short(name, n=110):
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= n else name[:n - 3] + "..."


def _result(cat_us, busy_us, wall_s, steps, rows, notes, source, kernels=None):
    """The pytorch object: ms per step; idle = wall - busy; ops sorted by time."""
    step_ms = wall_s * 1e3 / steps
    cats = {c: cat_us.get(c, 0.0) / 1e3 / steps for c in BUSY}
    busy_ms = busy_us / 1e3 / steps
    cats["idle"] = max(0.0, step_ms - busy_ms)
    overlap = sum(cats[c] for c in BUSY) - busy_ms
    ops = [{"op": k[0], "category": k[1], "ms": round(v[0] / 1e3 / steps, 4), "calls": round(v[1] / steps, 2)}
           for k, v in rows.items()]
    ops.sort(key=lambda r: -r["ms"])
    out = {"step_ms": round(step_ms, 4), "busy_ms": round(busy_ms, 4),
           "categories": {c: round(cats[c], 4) for c in CATEGORIES}, "ops": ops, "steps": steps,
           "source": source, "notes": notes}
    if overlap > 1e-3 * max(step_ms, 1e-9) and overlap > 1e-4:
        out["overlap_ms"] = round(overlap, 4)
        notes.append("device work overlapped (several streams): the categories sum to %.3f ms more than the "
                     "busy time" % overlap)
    if step_ms < busy_ms:
        notes.append("the device was busy longer than the wall time measured (%.3f > %.3f ms per step)"
                     % (busy_ms, step_ms))
    if kernels is not None:
        kb = {}
        for (cat, kname, opname, shape), (us, n) in kernels.items():
            kb.setdefault(cat, []).append({"kernel": kname, "op": opname, "shape": shape,
                                           "ms": round(us / 1e3 / steps, 4), "calls": round(n / steps, 2)})
        for cat in kb:
            kb[cat].sort(key=lambda r: -r["ms"])
            conv = [r for r in kb[cat] if "conv" in r["op"]]
            kb[cat] = (conv + [r for r in kb[cat] if "conv" not in r["op"]][:8]) if conv else kb[cat][:12]
        out["kernels_by_category"] = kb
    return out


def from_function_events(events, steps, wall_s, batch):
    """PyTorch's step on the CPU: events = prof.events() of torch.profiler (CPU
    activity, record_shapes=True) over `steps` steps that took wall_s seconds.
    Returns the pytorch object (see the module's docstring)."""
    ops, by_event = [], {}
    span = next((e.time_range for e in events if e.name == PROFILED_SPAN), None)
    for e in events:
        if getattr(e, "device_type", None) is not None and "CPU" not in str(e.device_type):
            continue
        if span is not None and (e.time_range.start < span.start or e.time_range.end > span.end):
            continue  # outside the profiled steps
        o = Op(e.name, e.thread, e.time_range.start, e.time_range.end, e.input_shapes,
               self_us=float(e.self_cpu_time_total))
        ops.append(o)
        by_event[id(e)] = (e, o)
    # torch's own nesting (the recorded parents); intervals of whole microseconds would tie
    for e, o in by_event.values():
        p = getattr(e, "cpu_parent", None)
        o.parent = by_event[id(p)][1] if p is not None and id(p) in by_event else None
    orders = mm_orders(ops)
    cat_us, rows = {}, {}
    busy = 0.0
    split = False
    for o in ops:
        if o.kind != "op":
            continue
        # A conv op's self time on the CPU holds both gradients (oneDNN): half each.
        cat = op_category(o, batch, orders.get(id(o), 0))
        us = max(o.self_us, 0.0)
        busy += us
        parts = [("data_grad", us / 2), ("weight_grad", us / 2)] if cat == "conv_bwd" else [(cat, us)]
        split = split or cat == "conv_bwd"
        for c, t in parts:
            cat_us[c] = cat_us.get(c, 0.0) + t
            r = rows.setdefault((o.name, c), [0.0, 0])
            r[0] += t
            r[1] += 1
    notes = []
    if split:
        notes.append("on the CPU a convolution's backward is one op (both gradients): its self time is split "
                     "evenly between data_grad and weight_grad")
    return _result(cat_us, busy, wall_s, steps, rows, notes, "torch.profiler, CPU: self CPU time per op")


def load_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_events(trace):
    """A chrome trace's events: trace is the dict with "traceEvents" or their list."""
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


def from_chrome_trace(trace, steps, wall_s, batch):
    """PyTorch's step on a CUDA GPU: trace = the Kineto chrome trace (a dict with
    "traceEvents", or its list) of torch.profiler with CPU and CUDA activities,
    record_shapes=True, over `steps` steps that took wall_s seconds between two
    synchronizations. Returns the pytorch object (see the module's docstring)."""
    evs = trace_events(trace)
    ops, devs, runtime = [], [], {}
    by_ext = {}
    for e in evs:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        ts, dur = float(e["ts"]), float(e.get("dur", 0) or 0)
        if cat in ("cpu_op", "operator", "user_annotation"):
            o = Op(e.get("name", "?"), (e.get("pid"), e.get("tid")), ts, ts + dur, args.get("Input Dims"),
                   kind="wrapper" if cat == "user_annotation" else None, ext=args.get("External id"))
            ops.append(o)
            if o.ext is not None and cat != "user_annotation":
                by_ext[o.ext] = o
        elif cat in ("cuda_runtime", "cuda_driver", "runtime"):
            o = Op(e.get("name", "?"), (e.get("pid"), e.get("tid")), ts, ts + dur, kind="runtime")
            ops.append(o)
            if "correlation" in args:
                runtime[args["correlation"]] = o
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"):
            devs.append({"name": e.get("name", "?"), "cat": cat, "start": ts, "end": ts + dur,
                         "ext": args.get("External id"), "corr": args.get("correlation")})
    span = next((o for o in ops if o.name == PROFILED_SPAN), None)
    if span is not None:
        n = len(devs)
        devs = [d for d in devs if span.start - SPAN_SLACK_US <= d["start"] <= span.end]
        outside = n - len(devs)
    nest(ops)
    for o in ops:  # a runtime call's op: the innermost op around it
        if o.kind == "runtime":
            p = o.parent
            while p is not None and p.kind != "op":
                p = p.parent
            o.parent = p
    for d in devs:
        # Two links: the trace's External id, and the innermost op around the launch call with the
        # kernel's correlation. Where both name an op, the inner one (the launching op, not a caller).
        by_id = by_ext.get(d["ext"]) if d["ext"] not in (None, 0) else None
        by_call = runtime[d["corr"]].parent if d["corr"] in runtime else None
        if by_id is not None and by_call is not None:
            d["op"] = by_call if by_id in chain(by_call) else by_id
        else:
            d["op"] = by_id or by_call
    devs.sort(key=lambda d: d["start"])

    # busy: the union of the device intervals
    busy = 0.0
    cur_s = cur_e = None
    for d in devs:
        if cur_e is None or d["start"] > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = d["start"], d["end"]
        else:
            cur_e = max(cur_e, d["end"])
    if cur_e is not None:
        busy += cur_e - cur_s

    # first pass: a category per device event; convolution backwards grouped per call
    conv_groups = {}
    orders = mm_orders([o for o in ops if o.kind == "op"])
    for d in devs:
        op = d["op"]
        if d["cat"] != "kernel":
            d["category"] = "copies"
        elif op is None:
            d["category"] = "other"
        else:
            d["category"] = op_category(op, batch, orders.get(id(op), 0))
            if d["category"] == "conv_bwd":
                call = node_call(op) or op
                conv_groups.setdefault(id(call), []).append(d)
    notes = []
    if span is None:
        notes.append("no %s span in the trace: every device event counted" % PROFILED_SPAN)
    elif outside:
        notes.append("%d device event(s) outside the profiled steps (the profiler's first step) left out" % outside)
    halves = 0
    for group in conv_groups.values():
        for d, c in zip(group, split_conv_kernels([d["name"] for d in group])):
            d["category"] = c
            halves += c == "half"
    if halves:
        notes.append("%d convolution-backward kernel(s) per run whose names and places tell neither gradient: "
                     "their time split evenly between data_grad and weight_grad" % halves)
    cat_us, rows, kernels = {}, {}, {}
    counted = set()  # (op, category): an op's call counts once per category, however many kernels it launched
    for d in devs:
        us = d["end"] - d["start"]
        parts = [("data_grad", us / 2), ("weight_grad", us / 2)] if d["category"] == "half" else [(d["category"], us)]
        op = d["op"]
        if op is None:
            opname, shape = d["name"].split(" (")[0], ""
        else:
            opname, shape = op.name, shape_str(op.shapes, CONV_BWD_OPS.match(short(op.name)) is not None)
        for c, t in parts:
            cat_us[c] = cat_us.get(c, 0.0) + t
            r = rows.setdefault((opname, c), [0.0, 0])
            r[0] += t
            if op is None or (id(op), c) not in counted:
                counted.add((id(op), c))
                r[1] += 1
            kv = kernels.setdefault((c, kernel_short(d["name"]), opname, shape), [0.0, 0])
            kv[0] += t
            kv[1] += 1
    unlinked = sum(1 for d in devs if d["op"] is None and d["cat"] == "kernel")
    if unlinked:
        notes.append("%d kernel(s) linked to no op (counted as other)" % unlinked)
    if not devs:
        notes.append("the trace holds no kernels: was the CUDA activity recorded?")
    return _result(cat_us, busy, wall_s, steps, rows, notes,
                   "torch.profiler, CUDA: kernel time per launching op (Kineto trace)", kernels)


# ---- the comparison ---------------------------------------------------------------------------------


def last_json(path):
    """The last line of path starting with '{' as a dict, or None."""
    if not path:
        return None
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.startswith("{")]
        obj = json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def cat_ms(side, c):
    v = (side or {}).get("categories", {}).get(c)
    return float(v) if num(v) else None


def largest(rt, pt, n=3):
    """The n categories with the largest |ringtrain - PyTorch|, largest first."""
    diffs = []
    for c in CATEGORIES:
        a, b = cat_ms(rt, c), cat_ms(pt, c)
        if a is not None and b is not None:
            diffs.append((abs(a - b), c, a, b))
    diffs.sort(key=lambda x: (-x[0], CATEGORIES.index(x[1])))
    return [{"category": c, "ringtrain_ms": round(a, 4), "pytorch_ms": round(b, 4)} for _, c, a, b in diffs[:n]]


def pair_label(pair):
    """"resnet9 bf16", "mnist-net fp32"."""
    return "%s %s" % (pair["model"], {"off": "fp32"}.get(pair["amp"], pair["amp"]))


def largest_line(pair):
    label = pair_label(pair)
    if not pair.get("largest"):
        return "%s: n/a (%s)" % (label, "no ringtrain profile" if not pair.get("ringtrain") else "no PyTorch profile")
    return "%s: %s" % (label, ", ".join("%s %+.2f ms" % (x["category"], x["ringtrain_ms"] - x["pytorch_ms"])
                                        for x in pair["largest"]))


def fmt_ms(x):
    return "%.3f" % x if num(x) else "n/a"


def fmt_share(x, step):
    return "%.1f %%" % (100.0 * x / step) if num(x) and num(step) and step > 0 else "n/a"


def describe_settings(s):
    if not isinstance(s, dict):
        return "settings not reported"
    return ", ".join("%s %s" % (k, v) for k, v in s.items() if not isinstance(v, (dict, list)))


def print_pair(pair, top=10):
    rt, pt = pair.get("ringtrain"), pair.get("pytorch")
    print()
    print("== %s, batch %s ==" % (pair_label(pair), pair["batch"]))
    if rt:
        print("ringtrain: %s step(s) profiled%s, step %s ms (its span on the compute stream); %s" % (
            rt.get("steps", "?"), " (its warm-up included)" if rt.get("warmup_included") else " (after its warm-up)",
            fmt_ms(rt.get("step_ms")), describe_settings(rt.get("settings"))))
    else:
        print("ringtrain: no profile (%s)" % pair.get("ringtrain_error", "no op_profile in its --json line"))
    if pt:
        print("PyTorch:   %s step(s) after %s warm-up, step %s ms (wall between synchronizations); %s" % (
            pt.get("steps", "?"), pt.get("warmup", "?"), fmt_ms(pt.get("step_ms")),
            describe_settings(pt.get("settings"))))
        print("           (%s)" % pt.get("source", ""))
        for n in pt.get("notes") or []:
            print("           note: %s" % n)
    else:
        print("PyTorch:   no profile (%s)" % pair.get("pytorch_error", "absent"))
    print()
    print("| category | ringtrain ms | PyTorch ms | ringtrain - PyTorch | ringtrain share | PyTorch share |")
    print("|---|---:|---:|---:|---:|---:|")
    rstep, pstep = (rt or {}).get("step_ms"), (pt or {}).get("step_ms")
    for c in CATEGORIES + ("step",):
        a = rstep if c == "step" else cat_ms(rt, c)
        b = pstep if c == "step" else cat_ms(pt, c)
        d = "%+.3f" % (a - b) if num(a) and num(b) else "n/a"
        print("| %s | %s | %s | %s | %s | %s |" % (c, fmt_ms(a), fmt_ms(b), d, fmt_share(a, rstep),
                                                   fmt_share(b, pstep)))
    for who, side in (("ringtrain", rt), ("PyTorch", pt)):
        ops = [o for o in (side or {}).get("ops") or [] if isinstance(o, dict)]
        if not ops:
            continue
        ops = sorted(ops, key=lambda o: -(o.get("ms") if num(o.get("ms")) else 0))[:top]
        print()
        print("Top ops, %s (ms per step):" % who)
        print("| op | category | ms | calls per step |")
        print("|---|---|---:|---:|")
        for o in ops:
            print("| %s | %s | %s | %s |" % (o.get("op", "?"), o.get("category", "?"), fmt_ms(o.get("ms")),
                                             o.get("calls", "?")))
    print_convolutions(rt, pt)
    print()
    print("largest differences: %s" % largest_line(pair))


def cell(v):
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v)) if all(num(x) for x in v) else "%d: %s" % (len(v), ", ".join(map(str, v[:3])))
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "%.3f" % v
    return "" if v is None else str(v)


def print_convolutions(rt, pt):
    convs = [c for c in (rt or {}).get("convolutions") or [] if isinstance(c, dict)]
    if convs:
        print()
        print("cuDNN per convolution, ringtrain (op_profile.convolutions):")
        print("| dir | dtype | shape | how | ms per call | workspace | deterministic | tensor cores | candidates |")
        print("|---|---|---|---|---:|---:|---|---|---|")
        for c in sorted(convs, key=lambda c: -(c.get("ms") if num(c.get("ms")) else 0)):
            print("| %s |" % " | ".join(cell(c.get(k)) for k in ("dir", "dtype", "shape", "how", "ms", "workspace",
                                                                 "deterministic", "tensor_cores", "candidates")))
    kb = (pt or {}).get("kernels_by_category") or {}
    rows = []
    for cat, d in (("conv_fwd", "fwd"), ("data_grad", "bwd_data"), ("weight_grad", "bwd_filter")):
        for k in kb.get(cat) or []:
            if "conv" in str(k.get("op", "")):
                rows.append((d, k))
    if rows:
        print()
        print("cuDNN per convolution, PyTorch (the kernels under its convolution ops):")
        print("| dir | shape | kernel | ms per step | calls per step |")
        print("|---|---|---|---:|---:|")
        for d, k in sorted(rows, key=lambda r: -(r[1].get("ms") or 0)):
            print("| %s | %s | %s | %s | %s |" % (d, k.get("shape", ""), k.get("kernel", ""), fmt_ms(k.get("ms")),
                                                  k.get("calls", "")))
    elif pt and not kb:
        print()
        print("cuDNN per convolution, PyTorch: n/a (no kernels: %s)" % pt.get("source", "host times"))


def load_comparison(path, gpu=None, host=None):
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or doc.get("profile_comparison") != 1:
            raise ValueError("not a profile comparison")
    except (OSError, ValueError):
        doc = {"profile_comparison": 1, "gpu": gpu or "", "host": host or "", "pairs": []}
    if gpu:
        doc["gpu"] = gpu
    if host:
        doc["host"] = host
    return doc


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def cmd_add(a):
    rt_line, pt_line = last_json(a.rt), last_json(a.pt)
    pair = {"model": a.model, "amp": a.amp, "batch": a.batch, "ringtrain": None, "pytorch": None, "largest": []}
    rc = 0
    if a.rt:
        prof = (rt_line or {}).get("op_profile")
        if isinstance(prof, dict) and isinstance(prof.get("categories"), dict):
            pair["ringtrain"] = prof
            if "settings" not in prof and isinstance(rt_line.get("settings"), dict):
                prof["settings"] = rt_line["settings"]
        else:
            pair["ringtrain_error"] = "no op_profile in its --json line" if rt_line else "no --json line"
            rc = 1
    if a.pt:
        if pt_line and isinstance(pt_line.get("categories"), dict):
            pair["pytorch"] = {k: v for k, v in pt_line.items() if k not in ("mode",)}
        else:
            pair["pytorch_error"] = "no JSON line from torch_train.py profile"
            rc = 1
    if pair["ringtrain"] and pair["pytorch"]:
        pair["largest"] = largest(pair["ringtrain"], pair["pytorch"])
    doc = load_comparison(a.json, a.gpu, a.host)
    doc["pairs"] = [p for p in doc["pairs"] if (p.get("model"), p.get("amp")) != (a.model, a.amp)] + [pair]
    write_json(a.json, doc)
    print_pair(pair)
    return rc


def cmd_summary(a):
    doc = load_comparison(a.json)
    if not doc["pairs"]:
        print("no pair profiled")
        return 1
    print("Largest differences per pair, ringtrain - PyTorch, ms per step (%s):" % (doc.get("gpu") or "?"))
    for p in doc["pairs"]:
        print("  %s" % largest_line(p))
    return 0


def cmd_trace(a):
    trace = load_trace(a.trace)
    wall_s = a.wall_ms * a.steps / 1e3 if a.wall_ms else None
    if wall_s is None:  # the profiled span's length (torch_train.py profile's traces have one)
        span = next((e for e in trace_events(trace) if e.get("name") == PROFILED_SPAN and e.get("ph") == "X"), None)
        if span is None:
            sys.exit("op_profile.py: %s has no %s span: give --wall-ms" % (a.trace, PROFILED_SPAN))
        wall_s = float(span.get("dur", 0)) / 1e6
    print(json.dumps(from_chrome_trace(trace, a.steps, wall_s, a.batch)))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="categorise a saved torch.profiler chrome trace")
    t.add_argument("trace")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--wall-ms", type=float, help="wall time per step (default: the rt:profiled span's / steps)")
    t.add_argument("--batch", type=int, required=True)
    ad = sub.add_parser("add", help="add one model x precision to the comparison, print its tables")
    ad.add_argument("--json", required=True)
    ad.add_argument("--gpu", default="")
    ad.add_argument("--host", default="")
    ad.add_argument("--model", required=True)
    ad.add_argument("--amp", required=True)
    ad.add_argument("--batch", type=int, required=True)
    ad.add_argument("--rt", help="ringtrain's output (its --json summary with op_profile)")
    ad.add_argument("--pt", help="torch_train.py profile's output")
    s = sub.add_parser("summary", help="the largest differences of every pair")
    s.add_argument("--json", required=True)
    a = p.parse_args()
    return {"trace": cmd_trace, "add": cmd_add, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
