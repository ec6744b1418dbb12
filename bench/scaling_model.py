#!/usr/bin/python3
"""scaling_model.py - predicts the step time and scaling efficiency of
data-parallel training with ringtrain on N GPUs (or CPU ranks) from measured
inputs, and checks the prediction against what this machine can measure.

  bench/scaling_model.py predict [--model M[,M...]] [--hardware H] [--gpus LIST] ...
  bench/scaling_model.py check   [--bin PATH] [--model mnist-net] [--ranks 1,2,4,8] ...
  bench/scaling_model.py params  --model M [--bin PATH]

The model of one optimizer step on one rank (weak scaling: the batch per rank
is fixed, so the global batch is N x B):

  step(N) = other + forward + backward + sync(N) + exposed(N) + optimizer

  - forward, backward, optimizer, other (data wait, copy, the rest): the
    per-rank compute, measured (check: each step's spans in a `ringtrain
    train --trace` of that run) or assumed (predict: the table it prints).
  - The gradient buckets are comm/bucket.c's plan, recomputed here from the
    model's parameter table in gradient-buffer order (backward order, each
    tensor padded to 64 floats): the first bucket up to 1 MiB, the tail (the
    tensors backward finishes last) up to 1 MiB, the others up to the cap.
  - Bucket k is ready when backward has finished its last tensor: at
    f_k x backward after backward starts, where f_k comes from the per-layer
    backward spans of a `--trace` (check), from each layer's share of the
    backward multiply-adds (predict: --ready flops), or from the tensor's
    position in the buffer (--ready params).
  - One communication channel, FIFO in bucket order (the comm thread over
    MPI; one NCCL stream on GPUs): bucket k starts at max(ready_k, end_{k-1})
    and takes t_allreduce(N, bytes_k). The control word (4 bytes, MPI) follows
    the last bucket on the same thread over MPI (CPU), or runs beside NCCL on
    the host (GPU). exposed(N) = end of the last of them - end of backward.
  - sync(N): the slowest of N ranks ends backward later than the typical
    one: cv x (forward + backward) x E[max of N standard normal draws]
    (0.56 at 2, 1.42 at 8, 3.24 at 1024); cv is --jitter-cv (predict; 0 in
    check, which shows the skew it measures beside).
  - images/s = N x B / step(N); efficiency = step(1) / step(N) (1 rank has no
    all-reduce: ringtrain reduces nothing in a world of one).

All-reduce cost of B bytes over n ranks (busbw as nccl-tests and
`ringtrain commbench` define it: algbw x 2(n-1)/n; alpha: the latency of one
step; o: the cost of one call):
  ring  t = o + 2(n-1)/n x B / busbw + 2(n-1) x alpha
  tree  t = o + 2 x B / busbw + 2 x ceil(log2 n) x alpha   (double binary tree:
        each rank sends and receives about 2B, up the tree and down again)
  hier  (g GPUs per node, M = n/g nodes) reduce-scatter in the node (ring over
        NVLink), all-reduce of B/g between the nodes over each GPU's own NIC
        (ring or tree, whichever is faster), all-gather in the node:
        t = o + 2 x [(g-1)/g x B / busbw_nvl + (g-1) x alpha_nvl]
              + min(ring, tree)(M, B/g; busbw_ib, alpha_ib)
  flat ring over nodes: every step waits for the slowest link, so
        t = o + 2(n-1)/n x B / min(busbw_nvl, g x busbw_ib) + 2(n-1) x alpha_ib
  In one node: ring over NVLink. Across nodes NCCL's tuner picks the
  algorithm by its own cost model; here the fastest of flat ring and hier.
  check: the all-reduce is not a formula but the curve `ringtrain commbench
  --path bucketer --json` measured at that rank count (median over the
  repeats), interpolated (log-log) at each bucket's size: a bucket costs
  T(B) - T(4 B), and the step pays T(4 B) once after the last bucket (the
  hand-over to the comm thread and back, and the control word).

predict (GPU clusters): the per-GPU compute is assumed (a public or this
project's measured images/s; the table of assumptions is printed), the
parameter tables and bucket plans are ringtrain's (the models below mirror
compute/models.c; `params --bin` checks them against a checkpoint).

check (this machine): runs 1, 2, 4, 8 CPU ranks of `ringtrain train
--synthetic-data` with and without overlap (traced), `ringtrain commbench` at
each rank count above 1 and one traced 1-rank run for the buckets' readiness,
then predicts every traced step of rank 0 from that step's own measured
compute (forward, backward, optimizer, rest) plus the modelled all-reduce
wait, and compares medians. The compute at N ranks is an input, not derived
from the cores: with more ranks than cores (8 on 2) each rank's compute slows
by more than N / cores (other processes, the comm threads, caches), and the
model is about what the all-reduce adds. A second prediction (B) does derive
it, compute(1 rank) x max(1, N x threads / cores), to show how far that is
off. Measurements go to --out DIR; --from DIR reads them again.

Standard library and numpy only.
"""
import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = 1 << 20
ALIGN_FLOATS = 64  # compute/net.c: every parameter view starts on 256 bytes


# ---- the tool's architectures as parameter tables (mirrors compute/models.c) ----------------

class Net:
    """The layers with parameters of one of ringtrain's models, in the order
    compute/models.c makes its nodes (the state_dict order): for each, its
    name, its tensors (name, floats) and its forward multiply-adds per image.
    Shapes are (C, H, W) per image."""

    def __init__(self, name, c, h, w, classes):
        self.name, self.input, self.classes = name, (c, h, w), classes
        self.layers = []

    def _add(self, name, kind, tensors, macs):
        self.layers.append({"name": name, "kind": kind, "tensors": tensors, "macs": macs,
                            "first": not self.layers})

    def conv(self, x, name, cout, k, stride, pad, bias):
        c, h, w = x
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        t = [(name + ".weight", cout * c * k * k)] + ([(name + ".bias", cout)] if bias else [])
        self._add(name, "conv", t, cout * c * k * k * oh * ow)
        return (cout, oh, ow)

    def bn(self, x, name):
        self._add(name, "bn", [(name + ".weight", x[0]), (name + ".bias", x[0])], 0)
        return x

    def linear(self, features, name, out, bias):
        t = [(name + ".weight", out * features)] + ([(name + ".bias", out)] if bias else [])
        self._add(name, "linear", t, out * features)
        return out

    @staticmethod
    def pool(x, k, stride, pad):
        c, h, w = x
        return (c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)

    def params(self):
        return sum(n for layer in self.layers for _, n in layer["tensors"])

    def macs(self):
        return sum(layer["macs"] for layer in self.layers)


def _conv_bn_relu(n, x, prefix, cout):
    return n.bn(n.conv(x, prefix + ".0", cout, 3, 1, 1, False), prefix + ".1")


def build_model(name, classes=10, c=3, h=32, w=32):
    """Net of model `name` (mnist-net, resnet18, resnet50, resnet9, wrn-D-K)."""
    n = Net(name, c, h, w, classes)
    x = (c, h, w)
    if name == "mnist-net":
        x = n.conv(x, "conv1", 32, 3, 1, 0, True)
        x = n.conv(x, "conv2", 64, 3, 1, 0, True)
        x = Net.pool(x, 2, 2, 0)
        f = n.linear(x[0] * x[1] * x[2], "fc1", 128, True)
        n.linear(f, "fc2", classes, True)
    elif name in ("resnet18", "resnet50"):
        bottleneck = name == "resnet50"
        blocks = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
        x = n.bn(n.conv(x, "conv1", 64, 7, 2, 3, False), "bn1")
        x = Net.pool(x, 3, 2, 1)
        exp = 4 if bottleneck else 1
        cin = 64
        for l, width in enumerate([64, 128, 256, 512]):
            cout = width * exp
            for b in range(blocks[l]):
                p = "layer%d.%d" % (l + 1, b)
                stride = 2 if l > 0 and b == 0 else 1
                if bottleneck:
                    y = n.bn(n.conv(x, p + ".conv1", width, 1, 1, 0, False), p + ".bn1")
                    y = n.bn(n.conv(y, p + ".conv2", width, 3, stride, 1, False), p + ".bn2")
                    y = n.bn(n.conv(y, p + ".conv3", 4 * width, 1, 1, 0, False), p + ".bn3")
                else:
                    y = n.bn(n.conv(x, p + ".conv1", width, 3, stride, 1, False), p + ".bn1")
                    y = n.bn(n.conv(y, p + ".conv2", width, 3, 1, 1, False), p + ".bn2")
                if stride != 1 or cin != cout:
                    n.bn(n.conv(x, p + ".downsample.0", cout, 1, stride, 0, False), p + ".downsample.1")
                x, cin = y, cout
        n.linear(x[0], "fc", classes, True)
    elif name == "resnet9":
        x = _conv_bn_relu(n, x, "prep", 64)
        x = Net.pool(_conv_bn_relu(n, x, "layer1.0", 128), 2, 2, 0)
        x = _conv_bn_relu(n, _conv_bn_relu(n, x, "res1.0", 128), "res1.1", 128)
        x = Net.pool(_conv_bn_relu(n, x, "layer2.0", 256), 2, 2, 0)
        x = Net.pool(_conv_bn_relu(n, x, "layer3.0", 512), 2, 2, 0)
        x = _conv_bn_relu(n, _conv_bn_relu(n, x, "res3.0", 512), "res3.1", 512)
        n.linear(x[0], "fc", classes, False)
    elif re.fullmatch(r"wrn-\d+-\d+", name):
        depth, widen = (int(v) for v in name.split("-")[1:])
        if depth < 10 or (depth - 4) % 6:
            raise ValueError("%s: WideResNet depth must be 6n+4" % name)
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        x = n.conv(x, "conv1", 16, 3, 1, 1, False)
        cin = 16
        for g in range(3):
            for b in range((depth - 4) // 6):
                p = "block%d.layer.%d" % (g + 1, b)
                stride = 2 if g > 0 and b == 0 else 1
                cout = widths[g + 1]
                a = n.bn(x, p + ".bn1")
                y = n.bn(n.conv(a, p + ".conv1", cout, 3, stride, 1, False), p + ".bn2")
                y = n.conv(y, p + ".conv2", cout, 3, 1, 1, False)
                if cin != cout:
                    n.conv(a, p + ".convShortcut", cout, 1, stride, 0, False)
                x, cin = y, cout
        x = n.bn(x, "bn1")
        n.linear(x[0], "fc", classes, True)
    else:
        raise ValueError("unknown model '%s' (mnist-net, resnet18, resnet50, resnet9, wrn-D-K)" % name)
    return n


def gradient_layout(net):
    """The gradient buffer as compute/net.c lays it out: the layers from the
    last to the first, each its weight then its bias, every tensor starting on
    64 floats. Returns (tensors, total floats); a tensor is a dict with name,
    layer, offset and count (floats)."""
    out, off = [], 0
    for layer in reversed(net.layers):
        for tname, count in layer["tensors"]:
            out.append({"name": tname, "layer": layer["name"], "offset": off, "count": count})
            off = (off + count + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS
    return out, off


def plan_buckets(tensors, total, cap_bytes=25 * MIB, first_cap_bytes=1 * MIB):
    """comm/bucket.c's plan over the gradient buffer: contiguous buckets cut at
    tensor boundaries in buffer order; the first up to first_cap_bytes, the
    tail (the tensors backward finishes last) up to first_cap_bytes and never
    merged into the body, the others up to cap_bytes; a tensor over the cap is
    a bucket of its own. Returns a list of dicts: offset, count (floats, the
    alignment gaps included), t0, t1 (the tensors [t0, t1) it holds)."""
    t = sorted(tensors, key=lambda e: e["offset"])
    nt = len(t)
    if nt == 0 or total == 0:
        raise ValueError("no gradients to reduce")
    first = min(first_cap_bytes, cap_bytes)
    tail = nt - 1
    if sum(e["count"] for e in t) <= first // 4:
        tail = nt  # one bucket holds everything
    elif nt > 1:
        held = t[tail]["count"]
        while tail > 1 and held + t[tail - 1]["count"] <= first // 4:
            tail -= 1
            held += t[tail]["count"]
    buckets, i = [], 0
    while i < nt:
        limit = (first if not buckets else cap_bytes) // 4
        stop = tail if i < tail else nt
        t0 = i
        offset = 0 if not buckets else buckets[-1]["offset"] + buckets[-1]["count"]
        held = 0
        while True:
            held += t[i]["count"]
            i += 1
            if not (i < stop and held + t[i]["count"] <= limit):
                break
        end = t[i]["offset"] if i < nt else total
        buckets.append({"offset": offset, "count": end - offset, "t0": t0, "t1": i})
    return buckets


def ready_fractions(net, tensors, how="flops", layer_frac=None):
    """For each tensor of the buffer (gradient_layout order), the share of the
    backward pass done when its gradient is final.
      flops:  each layer's backward costs 2 x its forward multiply-adds (input
              gradient and weight gradient; 1 x for the first layer, whose
              input needs none); batch norm and the layers without
              parameters count for nothing.
      params: proportional to the tensor's end in the buffer.
      trace:  layer_frac[layer] measured (a layer missing from it takes the
              fraction of the one backward finished before it)."""
    total = max(e["offset"] + e["count"] for e in tensors)
    if how == "params":
        return [(e["offset"] + e["count"]) / total for e in tensors]
    if how == "trace":
        out, last = [], 0.0
        for e in tensors:
            last = layer_frac.get(e["layer"], last)
            out.append(last)
        return out
    cost = {}
    for layer in net.layers:
        cost[layer["name"]] = layer["macs"] * (1 if layer["first"] else 2)
    whole = sum(cost.values()) or 1.0
    done, frac = 0.0, {}
    for layer in reversed(net.layers):
        done += cost[layer["name"]]
        frac[layer["name"]] = done / whole
    return [frac[e["layer"]] for e in tensors]


def bucket_inputs(net, cap_mb=25.0, how="flops", layer_frac=None):
    """(bucket sizes in bytes, each one's ready fraction of backward, the plan)."""
    tensors, total = gradient_layout(net)
    plan = plan_buckets(tensors, total, int(cap_mb * MIB))
    frac = ready_fractions(net, tensors, how, layer_frac)
    sizes = [4 * b["count"] for b in plan]
    ready = [frac[b["t1"] - 1] for b in plan]
    return sizes, ready, plan


# ---- all-reduce cost models --------------------------------------------------------------

def t_ring(n, nbytes, busbw, alpha, o=0.0):
    """Ring all-reduce of nbytes over n ranks: o + 2(n-1)/n B / busbw + 2(n-1) alpha (seconds)."""
    if n <= 1:
        return 0.0
    return o + 2.0 * (n - 1) / n * nbytes / busbw + 2.0 * (n - 1) * alpha


def t_tree(n, nbytes, busbw, alpha, o=0.0):
    """Double-binary-tree all-reduce: o + 2 B / busbw + 2 ceil(log2 n) alpha (seconds)."""
    if n <= 1:
        return 0.0
    return o + 2.0 * nbytes / busbw + 2.0 * math.ceil(math.log2(n)) * alpha


class Fabric:
    """A GPU cluster's all-reduce: g GPUs per node on NVLink, one NIC per GPU between nodes."""

    def __init__(self, p):
        self.p = dict(p)

    def allreduce(self, n, nbytes):
        """(seconds, algorithm) of the fastest algorithm for n GPUs (n <= g: one node)."""
        p = self.p
        g, o = p["gpus_per_node"], p["call_s"]
        if n <= 1:
            return 0.0, "-"
        if n <= g:
            return t_ring(n, nbytes, p["nvl_busbw"], p["nvl_alpha"], o), "ring"
        m = -(-n // g)  # nodes
        intra = 2.0 * ((g - 1) / g * nbytes / p["nvl_busbw"] + (g - 1) * p["nvl_alpha"])
        inter_ring = t_ring(m, nbytes / g, p["ib_busbw"], p["ib_alpha"])
        inter_tree = t_tree(m, nbytes / g, p["ib_busbw"], p["ib_alpha"])
        cands = [(o + intra + inter_ring, "hier-ring"), (o + intra + inter_tree, "hier-tree"),
                 (t_ring(n, nbytes, min(p["nvl_busbw"], g * p["ib_busbw"]), p["ib_alpha"], o), "ring")]
        return min(cands)

    def control_word(self, n):
        """The step's 4-byte control word over MPI (recursive doubling), beside NCCL."""
        if n <= 1:
            return 0.0
        a = self.p["mpi_alpha"] if n <= self.p["gpus_per_node"] else self.p["ib_alpha"]
        return self.p["host_s"] + math.ceil(math.log2(n)) * a


class MeasuredLink:
    """The all-reduce as `ringtrain commbench --path bucketer --json` measured it
    at one rank count: time per call against size, interpolated log-log
    between the measured sizes, with the last bandwidth beyond the largest.
    A bucket is charged T(B) - T(smallest), the part that grows with its size;
    the step pays T(smallest) once after the last bucket (the hand-over to
    the comm thread and back, and the control word: commbench's bucketer path
    runs one bucket and the control word per iteration, as a step does)."""

    def __init__(self, sizes, times_s):
        order = np.argsort(sizes)
        self.b = np.asarray(sizes, dtype=float)[order]
        self.t = np.asarray(times_s, dtype=float)[order]
        if len(self.b) < 2:
            raise ValueError("commbench gave fewer than 2 sizes")
        # A monotone envelope: noise may make a bigger message look faster.
        self.t = np.maximum.accumulate(self.t)

    def total(self, nbytes):
        b, t = self.b, self.t
        if nbytes <= b[0]:
            return float(t[0])
        if nbytes >= b[-1]:
            slope = (t[-1] - t[-2]) / (b[-1] - b[-2])
            return float(t[-1] + slope * (nbytes - b[-1]))
        return float(np.exp(np.interp(np.log(nbytes), np.log(b), np.log(t))))

    def bucket(self, nbytes):
        return max(self.total(nbytes) - float(self.t[0]), 0.0)

    def fixed(self):
        return float(self.t[0])

    def fit(self):
        """(alpha-like intercept s, busbw-like B/s) of t = a + B/bw over the sizes >= 64 KiB."""
        m = self.b >= 65536
        if m.sum() < 2:
            m = np.ones_like(self.b, dtype=bool)
        slope, icpt = np.polyfit(self.b[m], self.t[m], 1)
        return icpt, (1.0 / slope if slope > 0 else float("inf"))


class ScaledLink(MeasuredLink):
    """A MeasuredLink whose every cost is k times the measured one."""

    def __init__(self, link, k):
        self.b, self.t = link.b, link.t * k


# ---- the overlap simulation --------------------------------------------------------------

def simulate(ready, costs, bwd_end, overlap=True, tail=0.0, tail_parallel=False):
    """One FIFO channel: bucket k starts at max(ready[k], end of k-1) (or after
    backward without overlap) and takes costs[k]. Then the tail (control word,
    hand-over): after the last bucket on the same channel, or, tail_parallel,
    from the end of backward beside it. Times in seconds from the start of
    backward. Returns (exposed seconds after backward, the buckets' (start, end))."""
    free, spans = 0.0, []
    for r, c in zip(ready, costs):
        start = max(free, r if overlap else bwd_end)
        free = start + c
        spans.append((start, free))
    if tail_parallel:
        end = max(free, bwd_end + tail)
    else:
        end = max(free, bwd_end) + tail
    return max(end - bwd_end, 0.0), spans


def expected_max_normal(n):
    """E[max of n independent standard normal draws] (0 for n = 1), by quadrature:
    the integral of x n phi(x) Phi(x)^(n-1) over x."""
    if n <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 16001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy 2 renamed it
    return float(trapezoid(x * n * phi * cdf ** (n - 1), x))


def predict_step(n, compute, sizes, ready_frac, link, overlap=True, jitter_cv=0.0, tail_parallel=False):
    """The step time at n ranks. compute: dict of seconds (forward, backward,
    optimizer, other). link: a Fabric (GPU) or a MeasuredLink (this CPU).
    Returns a dict: step, exposed, sync, comm (the buckets' serial sum), algo."""
    fwd, bwd = compute["forward"], compute["backward"]
    sync = jitter_cv * (fwd + bwd) * expected_max_normal(n)
    exposed, comm, algo = 0.0, 0.0, "-"
    if n > 1:
        if isinstance(link, Fabric):
            res = [link.allreduce(n, s) for s in sizes]
            costs = [r[0] for r in res]
            algo = res[sizes.index(max(sizes))][1]
            tail = link.control_word(n)
        else:
            costs = [link.bucket(s) for s in sizes]
            tail = link.fixed()
        ready = [f * bwd for f in ready_frac]
        exposed, _ = simulate(ready, costs, bwd, overlap, tail, tail_parallel)
        comm = sum(costs) + tail
    step = compute["other"] + fwd + bwd + sync + exposed + compute["optimizer"]
    return {"step": step, "exposed": exposed, "sync": sync, "comm": comm, "algo": algo}


# ---- predict: H100 clusters ------------------------------------------------------------------

HARDWARE = {
    "h100-nvlink-ib400": {
        "what": "H100 SXM, 8 per node on NVLink 4 (NVSwitch); one 400 Gb/s InfiniBand NDR NIC per GPU",
        "gpus_per_node": 8,
        "nvl_busbw": 360e9,   # NCCL ring all-reduce busbw in an 8x H100 SXM node (NVLS reaches ~450)
        "nvl_alpha": 1.0e-6,  # per ring step over NVLink
        "ib_busbw": 45e9,     # per GPU: 400 Gb/s = 50 GB/s line rate, ~90 % of it
        "ib_alpha": 5.0e-6,   # per step between nodes (NIC, switch, NCCL proxy)
        "mpi_alpha": 1.0e-6,  # MPI control word, per round inside a node
        "call_s": 5.0e-6,     # one NCCL all-reduce: launch and start-up
        "host_s": 10e-6,      # the host's poll for the end of the step's all-reduces
        "jitter_cv": 0.01,    # per-rank step-to-step spread of forward + backward
        "hbm_Bps": 2.5e12,    # effective HBM3 bandwidth for the optimizer (3.35 TB/s peak)
    },
}

A100_RN50_AMP = 2470.0  # img/s, 1x A100 80GB, ResNet-50 v1.5, PyTorch AMP, batch 256 (public NVIDIA figure)
H100_OVER_A100 = 1.6    # assumed for convolutional networks in bf16 (peak math 3.2x, HBM 1.7x)
RT_H100_WRN16_4 = 46326.0  # img/s, this project's measured wrn-16-4, bf16, batch 512, one H100 (docs/PERFORMANCE.md)
RT_H100_RN18_CIFAR = 85835.0  # img/s, this project's measured resnet18 on 3x32x32, bf16, batch 512 (docs/PERFORMANCE.md)

WORKLOADS = {
    "resnet18": {"model": "resnet18", "classes": 1000, "hw": 224, "batch": 256, "data": "ImageNet 224x224",
                 "ips": lambda: A100_RN50_AMP * H100_OVER_A100 * build_model("resnet50", 1000, 3, 224, 224).macs()
                 / build_model("resnet18", 1000, 3, 224, 224).macs(),
                 "source": "resnet50's figure x its/resnet18's forward MACs (assumed; resnet18 is less "
                           "compute-dense, so likely lower)"},
    "resnet50": {"model": "resnet50", "classes": 1000, "hw": 224, "batch": 256, "data": "ImageNet 224x224",
                 "ips": lambda: A100_RN50_AMP * H100_OVER_A100,
                 "source": "assumed: %.1f x %.0f img/s, the public A100 80GB PyTorch AMP figure "
                           "(NVIDIA DeepLearningExamples, ResNet-50 v1.5, batch 256)" % (H100_OVER_A100,
                                                                                         A100_RN50_AMP)},
    "wrn-28-10": {"model": "wrn-28-10", "classes": 10, "hw": 32, "batch": 128, "data": "CIFAR-10 32x32",
                  "ips": lambda: RT_H100_WRN16_4 * build_model("wrn-16-4").macs() / build_model("wrn-28-10").macs(),
                  "source": "this project's H100 wrn-16-4 bf16 figure (%.0f img/s, docs/PERFORMANCE.md) x wrn-16-4/wrn-28-10 "
                            "forward MACs, i.e. the same ~109 TFLOP/s" % RT_H100_WRN16_4},
    "resnet18-cifar": {"model": "resnet18", "classes": 10, "hw": 32, "batch": 512, "data": "3x32x32 (CIFAR)",
                       "ips": lambda: RT_H100_RN18_CIFAR,
                       "source": "measured: this project's resnet18 bf16 batch 512 on one H100 (docs/PERFORMANCE.md)"},
}


def workload_compute(wl, net, hw, batch=None, ips=None):
    """The per-GPU step of a workload: (compute dict, images/s at 1 GPU, batch).
    The assumed images/s cover the whole step; the optimizer (SGD momentum:
    read weight, gradient, momentum, write weight, momentum: 20 bytes a
    parameter at the HBM rate) comes off it, the rest splits forward 1 :
    backward 2 (backward computes two products per forward one)."""
    batch = batch or wl["batch"]
    ips = ips or wl["ips"]()
    total = batch / ips
    opt = 20.0 * net.params() / hw["hbm_Bps"]
    fb = max(total - opt, 0.0)
    return {"forward": fb / 3, "backward": 2 * fb / 3, "optimizer": opt, "other": 0.0}, ips, batch


def fmt_ms(s):
    return "%.3f" % (s * 1e3) if s < 0.01 else "%.2f" % (s * 1e3)


def cmd_predict(a):
    hw = dict(HARDWARE[a.hardware])
    for k, v in (("nvl_busbw", a.nvlink_busbw), ("ib_busbw", a.ib_busbw)):
        if v is not None:
            hw[k] = v * 1e9
    for k, v in (("nvl_alpha", a.nvlink_latency_us), ("ib_alpha", a.ib_latency_us)):
        if v is not None:
            hw[k] = v * 1e-6
    if a.jitter_cv is not None:
        hw["jitter_cv"] = a.jitter_cv
    if a.gpus_per_node:
        hw["gpus_per_node"] = a.gpus_per_node
    fabric = Fabric(hw)
    gpus = [int(v) for v in a.gpus.split(",")]
    names = a.model.split(",")
    results = {"hardware": a.hardware, "assumptions": {k: v for k, v in hw.items()}, "models": {}}
    print("== ringtrain data-parallel scaling model: %s ==" % ", ".join(names))
    print("hardware %s: %s" % (a.hardware, hw["what"]))
    print("  in a node:      ring all-reduce busbw %.0f GB/s over NVLink, latency %.1f us per ring step"
          % (hw["nvl_busbw"] / 1e9, hw["nvl_alpha"] * 1e6))
    print("  between nodes:  busbw %.0f GB/s per GPU (its own NIC), latency %.1f us per step; "
          "%d GPUs per node" % (hw["ib_busbw"] / 1e9, hw["ib_alpha"] * 1e6, hw["gpus_per_node"]))
    print("  per all-reduce: %.0f us (launch); control word over MPI beside NCCL: %.0f us + %.1f us x "
          "ceil(log2 N) (%.1f in a node); rank jitter cv %.1f %% of forward + backward"
          % (hw["call_s"] * 1e6, hw["host_s"] * 1e6, hw["ib_alpha"] * 1e6, hw["mpi_alpha"] * 1e6,
             100 * hw["jitter_cv"]))
    print("  algorithm: ring in a node; across nodes the fastest of flat ring and hierarchical "
          "(NVLink reduce-scatter, ring or tree between nodes on B/g, NVLink all-gather)")
    print()
    rows_out = []
    for name in names:
        if name not in WORKLOADS:
            raise SystemExit("scaling_model: unknown --model '%s' (%s)" % (name, ", ".join(WORKLOADS)))
        wl = WORKLOADS[name]
        net = build_model(wl["model"], wl["classes"], 3, wl["hw"], wl["hw"])
        compute, ips, batch = workload_compute(wl, net, hw, a.batch, a.images_per_s)
        sizes, ready, plan = bucket_inputs(net, a.bucket_cap_mb, a.ready)
        rows_out.append((name, wl, net, compute, ips, batch, sizes))
        print("%s (%s), %.2f M parameters (ringtrain's %s with %d classes), %.3g GMAC forward per image;"
              % (name, wl["data"], net.params() / 1e6, wl["model"], wl["classes"], net.macs() / 1e9))
        print("  gradients %.1f MB fp32 in %d buckets (cap %g MiB): %s MB; ready at %s of backward (--ready %s)"
              % (sum(sizes) / 1e6, len(sizes), a.bucket_cap_mb, " ".join("%.2f" % (s / 1e6) for s in sizes),
                 " ".join("%.0f%%" % (100 * f) for f in ready), a.ready))
        print("  one GPU: %.0f img/s at batch %d (bf16): forward %.1f + backward %.1f + optimizer %.2f ms = "
              "%.1f ms a step" % (ips, batch, 1e3 * compute["forward"], 1e3 * compute["backward"],
                                   1e3 * compute["optimizer"], 1e3 * batch / ips))
        print("  source: %s" % wl["source"])
        print()
        print("| GPUs | nodes | step ms | images/s | efficiency | without jitter | exposed comm ms | sync wait ms "
              "| all-reduce ms (serial) | largest bucket by |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        # One GPU reduces nothing: its step is the compute alone, the base of every efficiency.
        base = predict_step(1, compute, sizes, ready, fabric)["step"]
        table = []
        for n in gpus:
            r = predict_step(n, compute, sizes, ready, fabric, True, hw["jitter_cv"], tail_parallel=True)
            r0 = predict_step(n, compute, sizes, ready, fabric, True, 0.0, tail_parallel=True)
            nodes = -(-n // hw["gpus_per_node"])
            row = {"gpus": n, "nodes": nodes, "step_s": r["step"], "images_per_s": n * batch / r["step"],
                   "efficiency": base / r["step"], "efficiency_no_jitter": base / r0["step"],
                   "exposed_s": r["exposed"], "sync_s": r["sync"], "comm_s": r["comm"], "algorithm": r["algo"]}
            print("| %d | %d | %.2f | %.0f | %.1f %% | %.1f %% | %s | %s | %s | %s |" % (
                n, nodes, 1e3 * r["step"], row["images_per_s"], 100 * row["efficiency"],
                100 * row["efficiency_no_jitter"], fmt_ms(r["exposed"]), fmt_ms(r["sync"]), fmt_ms(r["comm"]),
                r["algo"]))
            table.append(row)
        print()
        results["models"][name] = {"data": wl["data"], "params": net.params(), "gmac": net.macs() / 1e9,
                                   "batch": batch, "images_per_s_1gpu": ips, "compute_s": compute,
                                   "source": wl["source"], "buckets_bytes": sizes, "ready": ready, "rows": table}
    print("Weak scaling (the batch per GPU fixed), synthetic data (no input pipeline), gradients fp32 as")
    print("ringtrain reduces them. Not modelled: NCCL kernels taking SMs from backward, network congestion")
    print("and adaptive routing, NVLS/SHARP in-network reduction, the input pipeline.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print("JSON: %s" % a.json)
    return 0


# ---- check: this machine's CPU ranks -----------------------------------------------------

def cpu_busy_s():
    """Seconds every CPU together spent busy since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_logged(cmd, path, timeout):
    """Runs cmd with stdout+stderr to path. Returns (rc, wall s, other processes' share of the CPUs)."""
    b0, c0, t0 = cpu_busy_s(), children_cpu_s(), time.monotonic()
    with open(path, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - t0
    others = ((cpu_busy_s() - b0) - (children_cpu_s() - c0)) / (wall * os.cpu_count())
    return rc, wall, max(others, 0.0)


def last_json(path):
    out = None
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                try:
                    out = json.loads(line)
                except ValueError:
                    pass
    return out


def mpirun(n):
    cmd = ["mpirun"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["--oversubscribe", "--bind-to", "none", "-np", str(n)]


def safetensors_table(path):
    """{name: floats} of the parameters (not running statistics) in a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        if k.endswith((".running_mean", ".running_var", ".num_batches_tracked")):
            continue
        out[k] = int(np.prod(v["shape"])) if v["shape"] else 1
    return out


def compare_tables(net, tool):
    """Differences between the walker's parameter table and the tool's checkpoint's (empty: identical)."""
    mine = {k: c for layer in net.layers for k, c in layer["tensors"]}
    bad = ["%s: here %s, ringtrain %s" % (k, mine.get(k), tool.get(k))
           for k in sorted(set(mine) | set(tool)) if mine.get(k) != tool.get(k)]
    return bad


def trace_layer_fracs(path):
    """{layer: median share of backward done when its backward span ends}, from a --trace file's
    compute-stream spans ("backward", "bwd LAYER")."""
    with open(path) as f:
        j = json.load(f)
    ev = j["traceEvents"] if isinstance(j, dict) else j
    xs = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "compute"), key=lambda e: e["ts"])
    fr = {}
    for b in (e for e in xs if e["name"] == "backward"):
        t0, t1 = b["ts"], b["ts"] + b["dur"]
        if b["dur"] <= 0:
            continue
        for e in xs:
            if e["name"].startswith("bwd ") and t0 - 1 <= e["ts"] and e["ts"] + e["dur"] <= t1 + 1 \
                    and e.get("tid") == b.get("tid"):
                fr.setdefault(e["name"][4:], []).append((e["ts"] + e["dur"] - t0) / (t1 - t0))
    return {k: min(max(statistics.median(v), 0.0), 1.0) for k, v in fr.items()}


def trace_steps(path):
    """Rank 0's steps from a --trace file (all ranks of one host share its clock): for each recorded
    step, in seconds, its length (the "step N" span) and within it forward, backward and optimizer
    (the compute stream), the all-reduce wait (the training thread); other = the rest of the step.
    With several ranks also
      skew:   the last rank's end of backward - rank 0's (rank 0 waiting for a slower rank);
      insitu: rank 0's end of the step's last collective (buckets, control word) - the last rank's
              end of backward: the all-reduce as it ran inside training once every rank was ready.
    Returns a list of dicts (empty when the trace lacks the spans)."""
    try:
        with open(path) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return []
    ev = j["traceEvents"] if isinstance(j, dict) else j
    spans = [e for e in ev if e.get("ph") == "X"]
    bwd, opened, colls = {}, {}, []
    for e in spans:
        if e.get("name") == "backward":
            bwd.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for e in ev:
        name = e.get("name", "")
        if e.get("pid") == 0 and e.get("ph") in ("b", "e") and (name.startswith("bucket all-reduce")
                                                                 or name.startswith("collective the step")):
            k = (name, e.get("id"))
            if e["ph"] == "b":
                opened[k] = e["ts"]
            elif k in opened:
                colls.append((opened.pop(k), e["ts"]))
    for v in bwd.values():
        v.sort()
    mine = [e for e in spans if e.get("pid") == 0]
    steps = sorted((e for e in mine if re.fullmatch(r"step \d+", e.get("name", ""))), key=lambda e: e["ts"])
    stream = {e["tid"] for e in mine if e.get("name") == "backward"}
    out = []
    for i, st in enumerate(steps):
        t0, t1 = st["ts"], st["ts"] + st["dur"]

        def inside(name, tids=None):
            return sum(e["dur"] for e in mine if e.get("name") == name and t0 <= e["ts"] < t1
                       and (tids is None or e["tid"] in tids)) * 1e-6

        r = {"step": st["dur"] * 1e-6, "forward": inside("forward"), "backward": inside("backward"),
             "optimizer": inside("optimizer", stream), "wait": inside("all-reduce wait")}
        r["other"] = max(r["step"] - r["forward"] - r["backward"] - r["optimizer"] - r["wait"], 0.0)
        mybwd = [b for b in bwd.get(0, []) if t0 <= b[0] < t1]
        if len(bwd) > 1 and mybwd:
            k = bwd[0].index(mybwd[-1])
            if all(len(v) > k for v in bwd.values()):
                last = max(v[k][1] for v in bwd.values())
                r["skew"] = (last - mybwd[-1][1]) * 1e-6
                done = [c1 for c0, c1 in colls if t0 <= c0 < t1]
                if done:
                    r["insitu"] = max(max(done) - last, 0.0) * 1e-6
        if r["backward"] > 0:
            out.append(r)
    return out


def check_run(a, out):
    """Runs the measurements into out/: a traced 1-rank run (readiness, the parameter table), commbench
    at every rank count above 1, and train at every rank count with and without overlap."""
    env_ok = shutil.which("mpirun")
    if not env_ok:
        raise SystemExit("scaling_model: no mpirun (apt-get install openmpi-bin)")
    if os.geteuid() == 0:
        os.environ["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        os.environ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    ranks = [int(v) for v in a.ranks.split(",")]
    train = [a.bin, "train", "--synthetic-data", "--model", a.model, "--batch-size", str(a.batch_size),
             "--threads", str(a.threads), "--bucket-cap-mb", str(a.bucket_cap_mb), "--json", "--no-progress"]
    runs = {"settings": {"model": a.model, "batch_size": a.batch_size, "threads": a.threads, "ranks": ranks,
                         "steps": a.steps, "repeats": a.repeats, "bucket_cap_mb": a.bucket_cap_mb,
                         "cpu": cpu_name(), "nproc": os.cpu_count()}, "runs": []}
    t_start = time.monotonic()
    print("measuring into %s" % out)
    ck = os.path.join(out, "ckpt")
    rc, wall, oth = run_logged(train + ["--steps", "16", "--trace", os.path.join(out, "trace.json"),
                                        "--checkpoint-dir", ck], os.path.join(out, "trace.out"), 300)
    print("  traced 1-rank run: rc %d, %.1f s, others %.0f %% of the CPUs" % (rc, wall, 100 * oth))
    if rc:
        raise SystemExit("scaling_model: the traced run failed: see %s" % os.path.join(out, "trace.out"))
    configs = [(n, m) for n in ranks for m in (["overlap"] if n == 1 else ["overlap", "no-overlap"])]
    for rep in range(a.repeats):
        order = configs if rep % 2 == 0 else configs[::-1]
        # The link first, every repeat: its figure then comes from the same stretch of the machine's load.
        for n in sorted({n for n in ranks if n > 1}, reverse=rep % 2 == 1):
            path = os.path.join(out, "commbench-np%d-r%d.json" % (n, rep))
            cmd = mpirun(n) + [a.bin, "commbench", "--path", "bucketer", "--min-bytes", "4", "--max-bytes",
                               a.cb_max, "--factor", "4", "--warmup", "3", "--iters", str(a.cb_iters), "--json", path]
            rc, wall, oth = run_logged(cmd, path[:-5] + ".out", 300)
            print("  commbench np %d repeat %d: rc %d, %.1f s, others %.0f %% of the CPUs"
                  % (n, rep + 1, rc, wall, 100 * oth))
            runs["runs"].append({"kind": "commbench", "ranks": n, "repeat": rep, "rc": rc, "wall_s": wall,
                                 "others": oth, "file": os.path.basename(path)})
        for n, mode in order:
            name = "train-np%d-%s-r%d.out" % (n, mode, rep)
            cmd = mpirun(n) + train + ["--steps", str(a.steps + 3)] + (["--no-overlap"] if mode != "overlap" else [])
            # The trace's cost is below this machine's noise (docs/PERFORMANCE.md, bench/trace_overhead.sh).
            cmd += ["--trace", os.path.join(out, name[:-4] + ".trace.json"), "--trace-steps", "3:%d" % (a.steps + 3)]
            rc, wall, oth = run_logged(cmd, os.path.join(out, name), 300)
            print("  train np %d %-10s repeat %d: rc %d, %.1f s, others %.0f %% of the CPUs"
                  % (n, mode, rep + 1, rc, wall, 100 * oth))
            runs["runs"].append({"kind": "train", "ranks": n, "mode": mode, "repeat": rep, "rc": rc,
                                 "wall_s": wall, "others": oth, "file": name})
    runs["settings"]["measure_s"] = time.monotonic() - t_start
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump(runs, f, indent=1)
        f.write("\n")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def check_report(a, out):
    """Reads out/ and prints predicted against measured step times. Returns 0, or 1 when a run failed."""
    with open(os.path.join(out, "runs.json")) as f:
        runs = json.load(f)
    st = runs["settings"]
    fails = 0
    net = build_model(st["model"])
    tool = safetensors_table(os.path.join(out, "ckpt", "model.safetensors"))
    diff = compare_tables(net, tool)
    fr = trace_layer_fracs(os.path.join(out, "trace.json"))
    sizes, ready, plan = bucket_inputs(net, st["bucket_cap_mb"], "trace", fr)
    tj = last_json(os.path.join(out, "trace.out"))
    print()
    print("Check: %s, batch %d per rank, %d compute thread%s per rank, weak scaling; %d CPUs (%s)."
          % (st["model"], st["batch_size"], st["threads"], "" if st["threads"] == 1 else "s", st["nproc"], st["cpu"]))
    if a.max_others < 1:
        trains = [r for r in runs["runs"] if r["kind"] == "train"]
        left = [r for r in trains if r["others"] > a.max_others]
        print("left out: %d of %d train runs, during which other processes took more than %.0f %% of the CPUs"
              % (len(left), len(trains), 100 * a.max_others))
    print("parameter table: %s" % ("ringtrain's checkpoint and this script's model agree tensor by tensor (%d "
                                   "tensors, %.3f M parameters)" % (len(tool), net.params() / 1e6) if not diff
                                   else "DIFFERS: " + "; ".join(diff[:5])))
    if diff:
        fails += 1
    if tj and tj.get("buckets") != len(sizes):
        print("bucket plan: DIFFERS: ringtrain made %s buckets, this script %d" % (tj.get("buckets"), len(sizes)))
        fails += 1
    print("buckets: %s MB (this script's plan; ringtrain's count %s), ready at %s of backward (measured: "
          "trace of 1 rank, medians)" % (" ".join("%.2f" % (s / 1e6) for s in sizes),
                                        tj.get("buckets") if tj else "?",
                                        " ".join("%.0f%%" % (100 * f) for f in ready)))
    links, curves = {}, {}
    for r in runs["runs"]:
        if r["kind"] != "commbench":  # the link: every repeat, however busy (its medians take the noise)
            continue
        if r["rc"]:
            print("commbench np %d repeat %d FAILED (rc %d)" % (r["ranks"], r.get("repeat", 0) + 1, r["rc"]))
            fails += 1
            continue
        with open(os.path.join(out, r["file"])) as f:
            cb = json.load(f)
        for x in cb["results"]:
            if x["path"] == "bucketer":
                curves.setdefault(r["ranks"], {}).setdefault(x["size"], []).append(x["time_us"] * 1e-6)
    for n, c in curves.items():
        # The median over the repeats at each size (the mean of two).
        links[n] = MeasuredLink(sorted(c), [statistics.median(c[b]) for b in sorted(c)])
    for n in sorted(links):
        lk = links[n]
        icpt, bw = lk.fit()
        print("commbench np %d (bucketer path): %.0f us at 4 B; per bucket %s us; line above 64 KiB: %.0f us + "
              "B / %.2f GB/s (busbw %.2f GB/s)" % (
                  n, 1e6 * lk.fixed(), " ".join("%.0f" % (1e6 * lk.bucket(s)) for s in sizes), 1e6 * icpt, bw / 1e9,
                  bw / 1e9 * 2 * (n - 1) / n))
    meas = {}
    for r in runs["runs"]:
        if r["kind"] != "train" or r["others"] > a.max_others:
            continue
        j = last_json(os.path.join(out, r["file"]))
        steps = trace_steps(os.path.join(out, r["file"][:-4] + ".trace.json"))
        if r["rc"] or not j or j.get("world_size") != r["ranks"] or len(steps) < 3:
            print("train np %d %s repeat %d FAILED (rc %d, %d traced steps): %s" % (
                r["ranks"], r["mode"], r["repeat"] + 1, r["rc"], len(steps), os.path.join(out, r["file"])))
            fails += 1
            continue
        meas.setdefault((r["ranks"], r["mode"]), []).append({"steps": steps, "others": r["others"], "json": j})
    if not meas:
        print("no train run to compare with%s" % (" (--max-others %g left none)" % a.max_others
                                                 if a.max_others < 1 else ""))
        return 1

    def pooled(xs, key):
        return [s_[key] for x in xs for s_ in x["steps"] if key in s_]

    def med(xs, key):
        v = pooled(xs, key)
        return statistics.median(v) if v else None

    base = ({k: med(meas[(1, "overlap")], k) for k in ("forward", "backward", "optimizer", "other")}
            if (1, "overlap") in meas else None)
    cores = st["nproc"]
    # The all-reduce inside training against commbench's, from the no-overlap runs (every bucket after backward).
    factor, diag = {}, []
    for n in sorted(links):
        xs = meas.get((n, "no-overlap"), [])
        insitu = med(xs, "insitu")
        model = sum(links[n].bucket(b) for b in sizes) + links[n].fixed()
        if insitu:
            factor[n] = insitu / model
        diag.append((n, model, insitu, med(xs, "skew"), med(meas.get((n, "overlap"), []), "skew")))
    print()
    print("The all-reduce inside training (no-overlap runs' traces, rank 0: the end of its last collective - the")
    print("last rank's end of backward) against commbench's figure for the same buckets; skew: the last rank's")
    print("end of backward - rank 0's. Medians over the traced steps:")
    print()
    print("| ranks | commbench: buckets + fixed, ms | inside training, ms | ratio | skew no-overlap, ms "
          "| skew overlap, ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, model, insitu, sk0, sk1 in diag:
        print("| %d | %.1f | %s | %s | %s | %s |" % (n, 1e3 * model, "%.1f" % (1e3 * insitu) if insitu else "n/a",
                                                  "%.1fx" % (insitu / model) if insitu else "n/a",
                                                  "%.1f" % (1e3 * sk0) if sk0 is not None else "n/a",
                                                  "%.1f" % (1e3 * sk1) if sk1 is not None else "n/a"))
    print()
    print("Predicted against measured step time, ms (rank 0, from each run's trace: %d steps a run after 3 untimed,"
          % st["steps"])
    print("%d repeat%s; medians over all of them):" % (st["repeats"], "" if st["repeats"] == 1 else "s"))
    print("  A: each step's own compute (forward, backward, optimizer, the rest of the step) as measured in that")
    print("     run; the model adds the all-reduce wait: commbench's curve at that rank count, the buckets'")
    print("     readiness from the 1-rank trace, the FIFO overlap simulation. The prediction to judge.")
    print("  B: the 1-rank run's median compute x max(1, ranks x threads / %d CPUs), the oversubscription a rank"
          % cores)
    print("     count above the cores brings, else as A: a prediction from 1 rank and commbench alone.")
    print("  C: A plus two inputs taken from the same traces: each step's skew between ranks and the all-reduce")
    print("     scaled by the in-training ratio above. Not a prediction: a test of the simulation and the sum.")
    print()
    print("| ranks | mode | compute | measured step | A: predicted | A: error | B: predicted | B: error "
          "| C: predicted | C: error | measured wait | A: wait | steady img/s | others' CPU |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for (n, mode) in sorted(meas, key=lambda k: (k[0], k[1] != "overlap")):
        xs = meas[(n, mode)]
        link = links.get(n)
        if n > 1 and link is None:
            continue
        overlap = mode == "overlap"
        meas_step, pa, pc, wa = [], [], [], []
        for x in xs:
            for s_ in x["steps"]:
                ra = predict_step(n, s_, sizes, ready, link, overlap)
                meas_step.append(s_["step"])
                pa.append(ra["step"])
                wa.append(ra["exposed"])
                if n == 1:
                    pc.append(ra["step"])
                elif n in factor and "skew" in s_:
                    rc_ = predict_step(n, s_, sizes, ready, ScaledLink(link, factor[n]), overlap)
                    pc.append(rc_["step"] + max(s_["skew"], 0.0))
        scale = max(1.0, n * st["threads"] / cores)
        b_ = predict_step(n, {k: v * scale for k, v in base.items()}, sizes, ready, link, overlap)["step"] \
            if base else None
        m = statistics.median(meas_step)
        a_, c_ = statistics.median(pa), statistics.median(pc) if pc else None
        err = {"a": 100 * (a_ - m) / m, "b": 100 * (b_ - m) / m if base else None,
               "c": 100 * (c_ - m) / m if pc else None}
        compute = med(xs, "forward") + med(xs, "backward") + med(xs, "optimizer")
        ips = statistics.median(x["json"].get("steady_images_per_s") or 0 for x in xs)
        others = max(x["others"] for x in xs)
        print(("| %d | %s | %.1f | %.1f | %.1f | %+.0f %% | %s | %s | %s | %s | %.1f | %.1f | %.0f "
               "| %.0f %% |") % (
            n, mode, 1e3 * compute, 1e3 * m, 1e3 * a_, err["a"], "%.1f" % (1e3 * b_) if base else "n/a",
            "%+.0f %%" % err["b"] if base else "n/a",
            "%.1f" % (1e3 * c_) if pc else "n/a", "%+.0f %%" % err["c"] if pc else "n/a",
            1e3 * med(xs, "wait"), 1e3 * statistics.median(wa), ips, 100 * others))
        rows.append({"ranks": n, "mode": mode, "steps": len(meas_step), "measured_step_s": m, "compute_s": compute,
                     "predicted_a_s": a_, "error_a": err["a"] / 100, "predicted_b_s": b_,
                     "error_b": err["b"] / 100 if base else None, "predicted_c_s": c_,
                     "error_c": err["c"] / 100 if pc else None,
                     "measured_wait_s": med(xs, "wait"), "predicted_wait_s": statistics.median(wa),
                     "steady_images_per_s": ips, "others_cpu": others})
    multi = [r for r in rows if r["ranks"] > 1]
    if multi:
        print()
        def mean_err(k):
            v = [abs(r["error_" + k]) for r in multi if r["error_" + k] is not None]
            return "%s %.0f %%" % (k.upper(), 100 * statistics.mean(v)) if v else "%s n/a" % k.upper()
        print("mean |error| over the rows above 1 rank: %s" % ", ".join(mean_err(k) for k in "abc"))
    busy = [r for r in rows if r["others_cpu"] > 0.10]
    if busy:
        print("NOTE: other processes used more than 10 %% of the CPUs during the runs of %d row%s (up to %.0f %%): "
              "their figures are noisy" % (len(busy), "" if len(busy) == 1 else "s",
                                          100 * max(r["others_cpu"] for r in busy)))
    print("The measurements took %.0f s." % st.get("measure_s", 0))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"settings": st, "buckets_bytes": sizes, "ready": ready, "rows": rows,
                       "insitu_ratio": factor}, f, indent=1)
            f.write("\n")
        print("JSON: %s" % a.json)
    return 1 if fails else 0


def cmd_check(a):
    if a.from_dir:
        return check_report(a, a.from_dir)
    if not os.access(a.bin, os.X_OK):
        raise SystemExit("scaling_model: no ringtrain at %s (--bin PATH)" % a.bin)
    out = a.out or tempfile.mkdtemp(prefix="rt-scaling-model.")
    os.makedirs(out, exist_ok=True)
    check_run(a, out)
    return check_report(a, out)


def cmd_params(a):
    """The model's parameter table here against ringtrain's (a 1-step run's checkpoint)."""
    net = build_model(a.model, a.classes)
    print("%s, %d classes: %d parameters (%.2f M), %.3f GMAC forward per 3x32x32 image"
          % (a.model, a.classes, net.params(), net.params() / 1e6, net.macs() / 1e9))
    if not a.bin:
        return 0
    if a.classes != 10:
        raise SystemExit("scaling_model: --bin compares at 10 classes (train --synthetic-data)")
    d = tempfile.mkdtemp(prefix="rt-params.")
    try:
        cmd = [a.bin, "train", "--synthetic-data", "--model", a.model, "--batch-size", "1", "--steps", "1",
               "--no-progress", "--json", "--checkpoint-dir", d]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            print(p.stdout[-2000:] + p.stderr[-2000:])
            return 1
        j = next((json.loads(l) for l in p.stdout.splitlines()[::-1] if l.startswith("{")), {})
        diff = compare_tables(net, safetensors_table(os.path.join(d, "model.safetensors")))
        sizes, _, _ = bucket_inputs(net, a.bucket_cap_mb)
        print("ringtrain's table: %s" % ("the same, tensor by tensor" if not diff else "DIFFERS: " + "; ".join(diff)))
        print("buckets at %g MiB: ringtrain %s, this script %d (%s MB)" % (
            a.bucket_cap_mb, j.get("buckets"), len(sizes), " ".join("%.2f" % (s / 1e6) for s in sizes)))
        return 0 if not diff and j.get("buckets") == len(sizes) else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None):
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(prog="scaling_model.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="The model, its formulas, its inputs and the check: the header of "
                                        "bench/scaling_model.py. Each command takes --help.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict", help="the scaling table of a model on a stated GPU cluster")
    p.add_argument("--model", default="resnet18,resnet50,wrn-28-10",
                   help="comma-separated: %s (default the first three)" % ", ".join(WORKLOADS))
    p.add_argument("--hardware", default="h100-nvlink-ib400", choices=sorted(HARDWARE))
    p.add_argument("--gpus", default="1,2,4,8,16,32,64,128,256,512,1024")
    p.add_argument("--batch", type=int, help="images per GPU per step (default: the workload's)")
    p.add_argument("--images-per-s", type=float, help="one GPU's training images/s at that batch (default: the "
                   "workload's assumption)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--ready", default="flops", choices=["flops", "params"],
                   help="when backward makes each bucket ready (default flops)")
    p.add_argument("--nvlink-busbw", type=float, help="GB/s")
    p.add_argument("--ib-busbw", type=float, help="GB/s per GPU")
    p.add_argument("--nvlink-latency-us", type=float)
    p.add_argument("--ib-latency-us", type=float)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--jitter-cv", type=float, help="per-rank spread of forward + backward (default 0.01)")
    p.add_argument("--json", help="also write the tables as JSON to this file")
    c = sub.add_parser("check", help="predicted against measured step times on this machine's CPU ranks",
                       description="Runs (or, with --from, reads) this machine's measurements: a traced 1-rank "
                       "run, commbench at each rank count above 1 and train at each rank count with and without "
                       "overlap, then prints predicted against measured step times.")
    c.add_argument("--bin", default=os.path.join(top, "build", "ringtrain"),
                   help="the ringtrain binary (default build/ringtrain)")
    c.add_argument("--model", default="mnist-net", help="train --model (default mnist-net, the fastest on CPUs)")
    c.add_argument("--batch-size", type=int, default=32, help="images per rank per step (default 32)")
    c.add_argument("--threads", type=int, default=1, help="compute threads per rank (default 1)")
    c.add_argument("--ranks", default="1,2,4,8", help="rank counts (default 1,2,4,8; mpirun --oversubscribe)")
    c.add_argument("--steps", type=int, default=30, help="timed steps per run, after 3 untimed")
    c.add_argument("--repeats", type=int, default=2, help="rounds of every train configuration, the order "
                   "reversed every round (default 2)")
    c.add_argument("--bucket-cap-mb", type=float, default=25.0, help="train --bucket-cap-mb (default 25)")
    c.add_argument("--cb-max", default="16M", help="commbench --max-bytes, above the largest bucket (default 16M)")
    c.add_argument("--cb-iters", type=int, default=10, help="commbench --iters (default 10)")
    c.add_argument("--out", help="keep the measurements in this directory (default a new one under $TMPDIR)")
    c.add_argument("--max-others", type=float, default=1.0, help="leave out the train runs during which "
                   "other processes took more than this share of the CPUs (0..1; default 1: keep all)")
    c.add_argument("--from", dest="from_dir", help="read the measurements of an earlier --out instead of running")
    c.add_argument("--json", help="also write the table as JSON to this file")
    q = sub.add_parser("params", help="a model's parameter table, against ringtrain's with --bin")
    q.add_argument("--model", required=True, help="mnist-net, resnet18, resnet50, resnet9, wrn-D-K")
    q.add_argument("--classes", type=int, default=10)
    q.add_argument("--bin", help="ringtrain binary: compare with its 1-step checkpoint and bucket count")
    q.add_argument("--bucket-cap-mb", type=float, default=25.0)
    a = ap.parse_args(argv)
    return {"predict": cmd_predict, "check": cmd_check, "params": cmd_params}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
