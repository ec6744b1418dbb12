#!/usr/bin/python3
"""torch_train.py - the PyTorch side of bench/train_vs_pytorch.sh (CPU, fp32
and bf16), bench/layer_times.sh (CPU, per layer) and bench/gpu_vs_pytorch.sh
(one CUDA GPU, fp32 or mixed precision, eager or torch.compile, and the
per-op profile; its profile part also on the CPU).

Trains ringtrain's models as PyTorch defines them (tools/reference_models.py,
build(name, C, H, W, classes)), in these modes:

  compute  forward + backward + optimizer step on one fixed synthetic batch:
           a random uint8 (B,3,32,32) batch and random labels made once (on
           the device), then per step what a real pipeline does to a uint8
           batch, (x.float() / 255 - mean) / std, the forward pass,
           CrossEntropyLoss, zero_grad(set_to_none=True), backward,
           SGD(lr 0.01, momentum 0.9, nesterov False, weight_decay 5e-4).step().
           --warmup steps (default 3) untimed, then --steps timed (on CUDA
           between two torch.cuda.synchronize()). Also counts the model's
           training FLOPs per image (below). --compile: the model through
           torch.compile (mode default: forward and, through AOTAutograd,
           backward compiled; the normalisation, the loss and the optimizer
           eager); the first step compiles and is timed apart ("compile_s"),
           then --warmup and --steps as above; where torch.compile is absent
           (PyTorch 1.x) or the compile fails, one JSON line {"skipped": why}
           and exit status 0. Its JSON holds "settings" (torch_settings()).
  tta      time to accuracy on a CIFAR-10 dataset: the binary version
           (DIR/data_batch_*.bin and DIR/test_batch.bin, per record 1 label
           byte + 3072 bytes, the R, G, B 32x32 planes) or the python version
           (DIR/data_batch_1..5 and DIR/test_batch, pickles read by an
           unpickler that admits only numpy arrays), DIR itself or its
           cifar-10-batches-bin/ or cifar-10-batches-py/. The recipe of
           `ringtrain train`: per-channel mean/std over the train set; each
           epoch a new permutation, drop_last; random crop 32 with 4-pixel
           zero padding + random horizontal flip done on uint8 tensors by one
           advanced-indexing gather per batch (bench/torch_loader.py's
           "tensor" way; on CUDA the whole set lives on the GPU);
           SGD lr --lr momentum 0.9 (--nesterov) weight_decay --weight-decay;
           CrossEntropyLoss(label_smoothing=--label-smoothing); --schedule
           cosine: CosineAnnealingLR(T_max = epochs x steps per epoch), or
           onecycle: OneCycleLR(anneal_strategy='linear', div_factor 25,
           final_div_factor 1e4, pct_start = --warmup-epochs / epochs or 0.3,
           cycle_momentum False) as `ringtrain train --schedule onecycle`;
           stepped every step; after each epoch an eval of the test set in
           eval mode; stops once test accuracy >= --target-accuracy.
           time_s is wall time from before reading the data files to the end
           (reading, statistics, training, evals; not the Python start-up or
           `import torch`), as ringtrain's time_s runs from the start of
           `train` to its end.
  flops    prints the training FLOPs per image of each --model (a comma-separated
           list), one JSON line each; no training.
  layers   the compute step of `compute` with every leaf module's forward and
           backward time (bench/layer_times.sh): forward pre-hooks and hooks on
           the gradients of each module's output and input stamp the clock,
           each module's time runs to the next stamp (see bench_layers);
           --warmup untimed steps, then the means over --steps. CPU only.
  check    exits 0 when torch, torchvision, numpy and reference_models.py
           import and --device/--amp can run, printing the versions; with
           --amp bf16 on the CPU also that a Conv2d under autocast yields
           bfloat16 (compute with --amp bf16 checks it again on the model's
           first convolution, "conv_dtype" in its JSON, and fails otherwise).
  profile  the compute step under torch.profiler for bench/gpu_vs_pytorch.sh's
           profile part: --warmup steps, then --steps with the CPU activity
           (and CUDA's on a GPU) and shapes recorded, the wall time between
           two synchronizations; the normalisation and the optimizer step in
           the spans "rt:input" and "rt:optimizer". bench/op_profile.py turns
           the result into ms per step by op and category (kernel time per
           launching op on a GPU, self CPU time per op on the CPU): one JSON
           line {"mode": "profile", "step_ms", "categories", "ops",
           "kernels_by_category" (GPU), "settings", ...}. --trace-out FILE
           keeps the chrome trace (gzipped when FILE ends in .gz).

Device and precision (compute, profile and tta):
  --device cpu   (default) torch.set_num_threads(--threads).
  --device cuda  GPU 0 (CUDA_VISIBLE_DEVICES picks another);
                 torch.backends.cudnn.benchmark = True; fp32 by --tf32:
  --tf32 on      (default) PyTorch's own defaults, left as they are:
                 convolutions on TF32 tensor cores (cudnn.allow_tf32 True),
                 matmuls strict (cuda.matmul.allow_tf32 False), as ringtrain's
                 default --tf32 on.
  --tf32 off     strict fp32 for both (PyTorch 2.9 and later:
                 cudnn.conv/cudnn.rnn/cuda.matmul fp32_precision "ieee"; before:
                 the allow_tf32 flags False; never both APIs, which torch
                 refuses to mix), as ringtrain --tf32 off.
  --amp off      (default) fp32.
  --amp bf16     torch.autocast(device, dtype=torch.bfloat16) around the
                 forward pass and the loss; weights and optimizer fp32; on the
                 CPU that is torch.autocast('cpu', dtype=torch.bfloat16)
                 (in 1.13 the Conv2d outputs under it are bfloat16, computed by
                 oneDNN's native bf16 kernels, brgconv/jit avx512_core_bf16 on
                 an AMD EPYC Zen 4, for forward, backward data and weights).
  --amp fp16     torch.autocast('cuda', dtype=torch.float16) + a
                 GradScaler (torch.amp's, torch.cuda.amp's before 2.3; dynamic
                 loss scaling); CUDA only.
  On the CPU, bf16 is PyTorch 1.13's own mixed precision: autocast runs
  convolutions and linear layers in bfloat16 (oneDNN's AVX512_BF16 or AMX
  kernels where the CPU has them), weights, gradients and the SGD step stay
  fp32; `check --amp bf16` says whether a convolution under autocast yields
  bfloat16 here.
  --memory-format auto           (default) channels_last with bf16 or fp16,
                                 contiguous NCHW with fp32.
  --memory-format channels_last  model and every input batch channels_last
                                 (NHWC; on a GPU the layout tensor cores take
                                 without a transpose; on the CPU oneDNN's
                                 NHWC kernels, no reorder per layer).
  --memory-format contiguous     model and batches contiguous NCHW (oneDNN
                                 reorders to its blocked layouts per call).

FLOPs: forward multiply-adds of every Conv2d and Linear layer, counted with
forward hooks on one forward pass, x 2 (a multiply-add is 2 FLOPs) x 3
(backward costs about twice the forward: input and weight gradients). Batch
norm, activations, pooling, the loss and the optimizer are not counted.

Each run prints a human summary on stderr and, last on stdout, one line holding
one JSON object ({"mode", "model", "images_per_s", ...} or {"mode": "tta",
"time_s", "epochs", "val_acc", ...}).

Usage:
  torch_train.py check [--device cpu|cuda] [--amp off|bf16|fp16]
  torch_train.py compute --model M [--batch-size B] [--threads T] [--steps N]
                         [--warmup W] [--device D] [--amp A] [--tf32 on|off]
                         [--memory-format F] [--compile]
  torch_train.py profile --model M [--batch-size B] [--threads T] [--steps N]
                         [--warmup W] [--device D] [--amp A] [--tf32 on|off]
                         [--memory-format F] [--trace-out FILE]
  torch_train.py tta --data DIR [--model M] [--epochs E] [--batch-size B]
                     [--lr LR] [--target-accuracy A] [--threads T] [--seed S]
                     [--schedule cosine|onecycle] [--warmup-epochs E]
                     [--nesterov] [--label-smoothing EPS] [--weight-decay WD]
                     [--device D] [--amp A] [--tf32 on|off] [--memory-format F]
  torch_train.py flops --model M[,M...]
  torch_train.py layers --model M [--batch-size B] [--threads T] [--steps N]
                        [--warmup W] [--amp off|bf16] [--memory-format F]
"""
import argparse
import contextlib
import glob
import json
import os
import pickle
import sys
import time
import warnings

RECORD = 1 + 3 * 32 * 32
here = os.path.dirname(os.path.abspath(__file__))


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def reference_models():
    sys.path.insert(0, os.path.join(here, "..", "tools"))
    import reference_models
    return reference_models


def model_spec(name):
    """A model as the benchmarks name it: "resnet50@224" is resnet50 on 3x224x224 images of 1000 classes
    (ImageNet's shape, `ringtrain train --synthetic-data --image-size 224 --num-classes 1000`); a plain name
    is the CIFAR shape, 3x32x32 and 10 classes. Returns (architecture, image size, classes)."""
    arch, _, size = name.partition("@")
    if not size:
        return arch, 32, 10
    if not size.isdigit() or int(size) < 8:
        sys.exit("torch_train.py: %s: the image size after @ must be a number of pixels (8 or more)" % name)
    return arch, int(size), 1000


def build_model(name):
    """The reference model for a benchmark model name (model_spec) and its (size, classes)."""
    arch, size, classes = model_spec(name)
    return reference_models().build(arch, 3, size, size, classes), size, classes


def train_flops_per_image(model, c, h, w):
    """Training FLOPs per image: 2 x 3 x forward multiply-adds of Conv2d and Linear."""
    import torch
    import torch.nn as nn

    macs = [0]

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
            macs[0] += out.numel() // out.shape[0] * k
        elif isinstance(m, nn.Linear):
            macs[0] += out.numel() // out.shape[0] * m.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, c, h, w))
    model.train(was_training)
    for x in hs:
        x.remove()
    return 6 * macs[0], macs[0]


class Precision:
    """Where a run computes and in which precision: the device, the autocast
    context, the memory format and, for fp16, the loss scaler. Precision(torch)
    is the CPU in fp32, what train_vs_pytorch.sh and torch_ddp.py measure."""

    def __init__(self, torch, device="cpu", amp="off", memory_format="auto"):
        self.torch = torch
        self.device = torch.device(device)
        self.amp = amp
        self.dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
        if memory_format == "auto":
            memory_format = "contiguous" if amp == "off" else "channels_last"
        self.memory_format = memory_format
        self.channels_last = memory_format == "channels_last"
        self.scaler = None
        if amp == "fp16":  # torch.amp's where it has one (2.3 and later), torch.cuda.amp's before
            amp_mod = getattr(torch, "amp", None)
            self.scaler = (amp_mod.GradScaler("cuda") if hasattr(amp_mod, "GradScaler")
                           else torch.cuda.amp.GradScaler())

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def model(self, m):
        """m moved to the device (and to channels_last when that is the format); returns m."""
        m = m.to(self.device)
        return m.to(memory_format=self.torch.channels_last) if self.channels_last else m

    def batch(self, x):
        """A float batch in the layout the model takes."""
        return x.contiguous(memory_format=self.torch.channels_last) if self.channels_last else x

    def backward_step(self, loss, opt, span=None):
        """Backward and the optimizer step (with the loss scaler's unscale and
        update for fp16), the step inside the context manager span (a profiler
        span) when one is given."""
        if self.scaler is None:
            loss.backward()
            with span or contextlib.nullcontext():
                opt.step()
        else:
            self.scaler.scale(loss).backward()
            with span or contextlib.nullcontext():
                self.scaler.step(opt)
                self.scaler.update()

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def describe(self):
        """e.g. "cuda NVIDIA H100 80GB HBM3, amp bf16, channels_last" or "cpu, fp32"
        (the memory format named where it is not the precision's default)."""
        where = "cpu"
        if self.device.type == "cuda":
            where = "cuda " + self.torch.cuda.get_device_name(self.device)
        if self.amp == "off":
            return where + ", fp32" + (", channels_last" if self.channels_last else "")
        return "%s, amp %s%s, %s" % (where, self.amp, " + GradScaler" if self.scaler else "",
                                     "channels_last" if self.channels_last else "contiguous NCHW")


def precision_problem(torch, device, amp):
    """Why --device/--amp cannot run with this torch, or None."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return ("--device cuda: this torch %s sees no CUDA GPU (built with CUDA %s; torch.cuda.is_available() "
                    "is False)" % (torch.__version__, torch.version.cuda or "none"))
        if amp == "bf16" and not torch.cuda.is_bf16_supported():
            return "--amp bf16: %s has no bfloat16 support" % torch.cuda.get_device_name(0)
    elif amp == "fp16":
        return "--amp fp16 runs on CUDA only (torch.autocast('cpu') takes bfloat16: --amp bf16)"
    return None


def _fp32_precision_api(torch):
    """The 2.9+ TF32 switches (cudnn.conv, cudnn.rnn, cuda.matmul objects with an
    fp32_precision), or None where this torch has only the allow_tf32 flags. The two
    must not be mixed: torch raises when flags were set through one and are read
    through the other."""
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    mm = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if isinstance(conv, str) and isinstance(mm, str):
        return torch.backends.cudnn.conv, getattr(torch.backends.cudnn, "rnn", None), torch.backends.cuda.matmul
    return None


def set_strict_fp32(torch):
    """fp32 convolutions and matmuls without TF32, through the API this torch has."""
    api = _fp32_precision_api(torch)
    if api is None:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return
    for obj in api:
        if obj is not None and hasattr(obj, "fp32_precision"):
            obj.fp32_precision = "ieee"


def tf32_state(torch):
    """How fp32 convolutions and matmuls run now: {"cudnn_allow_tf32", "matmul_allow_tf32",
    "float32_matmul_precision", and with 2.9+ "cudnn_conv_fp32_precision",
    "matmul_fp32_precision"} (None where torch would not say)."""
    out = {}
    api = _fp32_precision_api(torch)
    if api is None:
        out["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        out["matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    else:
        def resolve(value, *parents):
            # "none" inherits from the level above (cudnn, then torch.backends)
            for p in parents:
                if value != "none":
                    break
                value = getattr(p, "fp32_precision", "none") if p is not None else "none"
            return value
        conv = resolve(api[0].fp32_precision, torch.backends.cudnn, torch.backends)
        mm = resolve(api[2].fp32_precision, torch.backends.cuda, torch.backends)
        out["cudnn_conv_fp32_precision"] = conv
        out["matmul_fp32_precision"] = mm
        out["cudnn_allow_tf32"] = conv in ("tf32", "none")  # "none" all the way up: cuDNN's default, TF32
        out["matmul_allow_tf32"] = mm == "tf32"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except Exception:  # torch refusing to read a flag set through the other API
        out["float32_matmul_precision"] = None
    return out


def setup_precision(torch, a):
    """The Precision of the arguments, after the global settings it needs. On CUDA:
    cudnn.benchmark on; fp32 as PyTorch's defaults leave it (--tf32 on: convolutions
    on TF32 tensor cores, matmuls strict) or strict (--tf32 off: neither uses TF32)."""
    why = precision_problem(torch, a.device, a.amp)
    if why:
        sys.exit("torch_train.py: %s" % why)
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
        if getattr(a, "tf32", "on") == "off":
            set_strict_fp32(torch)
    return Precision(torch, a.device, a.amp, a.memory_format)


def torch_settings(torch, prec, compile_mode=None):
    """The settings a result was measured with, for its JSON: torch's version, the
    precision switches (TF32, cudnn.benchmark and .deterministic, autocast's dtype),
    channels_last, the GradScaler, torch.compile's mode (None: eager)."""
    s = {"torch": torch.__version__, "device": prec.device.type,
         "autocast_dtype": str(prec.dtype).replace("torch.", "") if prec.dtype is not None else None,
         "channels_last": prec.channels_last, "grad_scaler": prec.scaler is not None, "compile": compile_mode}
    if prec.device.type == "cuda":
        s.update(tf32_state(torch))
        s.update(cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
                 cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
                 cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                 gpu=torch.cuda.get_device_name(prec.device))
    else:
        s["threads"] = torch.get_num_threads()
    return s


def make_optimizer(torch, model, lr, nesterov=False, weight_decay=5e-4):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=nesterov, weight_decay=weight_decay)


def synthetic_step(torch, model, opt, batch_size, seed, prec=None, spans=False, size=32, classes=10):
    """The step `ringtrain train --synthetic-data` times: one fixed random uint8
    batch (3 x size x size, `classes` classes), normalised every step with ringtrain's defaults
    for data without statistics, cross-entropy, backward, optimizer step.
    model and opt must already be on prec's device (default: the CPU, fp32).
    spans: the normalisation and the optimizer step inside the profiler spans
    "rt:input" and "rt:optimizer" (op_profile.py's categories copies, optimizer).
    Returns the step function (it returns the loss)."""
    prec = prec or Precision(torch)
    span = contextlib.nullcontext  # span(name): no span
    if spans:
        from torch.profiler import record_function as span
    crit = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)
    xb = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=g).to(prec.device)
    yb = torch.randint(0, classes, (batch_size,), dtype=torch.int64, generator=g).to(prec.device)
    mean = torch.tensor([0.5, 0.5, 0.5], device=prec.device).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.25], device=prec.device).view(1, 3, 1, 1)

    def step():
        with span("rt:input"):
            x = prec.batch((xb.float() / 255 - mean) / std)
        with prec.autocast():
            loss = crit(model(x), yb)
        opt.zero_grad(set_to_none=True)
        prec.backward_step(loss, opt, span("rt:optimizer"))
        return loss

    return step


def watch_conv_dtype(torch, model):
    """A dict whose "dtype" becomes the output dtype of model's first Conv2d
    (its name, e.g. "bfloat16") the first time it runs; the hook then removes
    itself. None when the model has no Conv2d."""
    conv = next((m for m in model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if conv is None:
        return None
    seen = {}

    def hook(m, inp, out):
        seen["dtype"] = str(out.dtype).replace("torch.", "")
        handle.remove()

    handle = conv.register_forward_hook(hook)
    return seen


def timed_steps(step, prec, steps):
    """Runs step() steps times from now to a synchronization after the last:
    (seconds, the last step's loss tensor). Synchronize before calling."""
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    prec.sync()
    return time.perf_counter() - t0, loss


def finite_loss(loss, model):
    """The loss as a float; exits naming model when it is NaN."""
    loss = float(loss)
    if loss != loss:
        sys.exit("torch_train.py: %s: the loss is NaN" % model)
    return loss


def bench_compute(a):
    """The compute mode: images/s of the synthetic step, eager or (--compile)
    torch.compile(model) with its compile time apart. A compile that cannot run
    here returns {"skipped": why} instead of failing."""
    import torch

    prec = setup_precision(torch, a)
    torch.manual_seed(a.seed)
    model, size, classes = build_model(a.model)
    flops, macs = train_flops_per_image(model, 3, size, size)
    model = prec.model(model)
    model.train()
    opt = make_optimizer(torch, model, 0.01)
    base = {"mode": "compute", "model": a.model, "batch_size": a.batch_size, "device": a.device, "amp": a.amp,
            "settings": torch_settings(torch, prec, "default" if a.compile else None)}
    compile_s = None
    conv = None
    if a.compile:
        if not hasattr(torch, "compile"):
            return dict(base, skipped="torch.compile is not in torch %s (it came with PyTorch 2.0)" % torch.__version__)
        # The model's forward and, through AOTAutograd, its backward compiled; the
        # normalisation, the loss and the optimizer step stay eager.
        step = synthetic_step(torch, torch.compile(model), opt, a.batch_size, a.seed, prec, size=size,
                              classes=classes)
        t0 = time.perf_counter()
        try:
            step()
            prec.sync()
        except Exception as e:  # a backend that cannot build here (no compiler, an old triton)
            first = (str(e).strip().splitlines() or [""])[0][:200]
            return dict(base, skipped="torch.compile failed: %s: %s" % (e.__class__.__name__, first))
        compile_s = time.perf_counter() - t0
    else:
        step = synthetic_step(torch, model, opt, a.batch_size, a.seed, prec, size=size, classes=classes)
        conv = watch_conv_dtype(torch, model)

    for _ in range(a.warmup):
        step()
    prec.sync()
    secs, loss = timed_steps(step, prec, a.steps)
    loss = finite_loss(loss, a.model)
    conv_dtype = conv.get("dtype") if conv is not None else None
    if prec.dtype is not None and conv_dtype not in (None, str(prec.dtype).replace("torch.", "")):
        sys.exit("torch_train.py: %s: --amp %s, but the first convolution's output is %s under autocast"
                 % (a.model, a.amp, conv_dtype))
    ips = a.steps * a.batch_size / secs
    if a.device == "cpu" and a.amp == "off" and not prec.channels_last:
        how = "%d threads" % torch.get_num_threads()
    elif a.device == "cpu":
        how = "%d threads, %s" % (torch.get_num_threads(), prec.describe())
    else:
        how = prec.describe()
        if a.amp == "off":
            how += ", TF32 convolutions" if base["settings"].get("cudnn_allow_tf32") else ", strict fp32"
    if a.compile:
        how += ", torch.compile (compiled in %.1f s, apart)" % compile_s
    return dict(base, threads=torch.get_num_threads(), memory_format=prec.memory_format, steps=a.steps,
                warmup=a.warmup, images=a.steps * a.batch_size, seconds=secs, images_per_s=ips,
                train_flops_per_image=flops, forward_macs_per_image=macs, gflops_per_s=ips * flops / 1e9,
                loss=loss, conv_dtype=conv_dtype, compile_s=compile_s,
                note="%d steps after %d warm-up, %s, %.2f GFLOP/s" % (a.steps, a.warmup, how, ips * flops / 1e9))


def bench_profile(a):
    """The profile mode: --warmup steps (the last under the profiler, outside
    what counts), then --steps under torch.profiler (CPU activity, and CUDA's on
    a GPU; shapes recorded) in the span op_profile.PROFILED_SPAN, the wall time
    between two synchronizations; the step's time by op and category from
    op_profile.py (kernel time per launching op on a GPU, self CPU time per op
    on the CPU)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import op_profile

    prec = setup_precision(torch, a)
    torch.manual_seed(a.seed)
    built, size, classes = build_model(a.model)
    model = prec.model(built)
    model.train()
    opt = make_optimizer(torch, model, 0.01)
    step = synthetic_step(torch, model, opt, a.batch_size, a.seed, prec, spans=True, size=size, classes=classes)
    for _ in range(max(a.warmup - 1, 0)):
        step()
    prec.sync()
    cuda = prec.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, record_shapes=True) as prof:
        # The last warm-up step runs under the profiler, outside the profiled span: the first launches
        # after the profiler starts pay for CUPTI's start. 2 ms of nothing keep its kernels apart.
        if a.warmup:
            step()
        prec.sync()
        time.sleep(0.002)
        with record_function(op_profile.PROFILED_SPAN):
            wall, loss = timed_steps(step, prec, a.steps)
    loss = finite_loss(loss, a.model)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        if cuda or a.trace_out:  # the GPU's kernels are read from the chrome trace
            prof.export_chrome_trace(path)
        if cuda:
            res = op_profile.from_chrome_trace(op_profile.load_trace(path), a.steps, wall, a.batch_size)
        else:
            res = op_profile.from_function_events(prof.events(), a.steps, wall, a.batch_size)
        if a.trace_out:
            keep_trace(path, a.trace_out)
    res.update(mode="profile", model=a.model, amp=a.amp, batch_size=a.batch_size, device=a.device,
               warmup=a.warmup, loss=loss, settings=torch_settings(torch, prec))
    return res


def keep_trace(src, dst):
    """Copies the chrome trace src to dst, gzipped when dst ends in .gz."""
    import gzip
    import shutil

    with open(src, "rb") as f, (gzip.open(dst, "wb") if dst.endswith(".gz") else open(dst, "wb")) as g:
        shutil.copyfileobj(f, g)


def layer_macs(torch, model, c, h, w):
    """{module: forward multiply-adds per image} of every Conv2d and Linear (as
    train_flops_per_image counts them)."""
    nn = torch.nn
    macs = {}

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
            macs[m] = macs.get(m, 0) + out.numel() // out.shape[0] * k
        else:
            macs[m] = macs.get(m, 0) + out.numel() // out.shape[0] * m.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, c, h, w))
    model.train(was_training)
    for x in hs:
        x.remove()
    return macs


def bench_layers(a):
    """Per-layer forward and backward times of the compute step, from clock
    stamps as a timeline's marks. Forward: a pre-hook on every leaf module
    stamps its start; a module's forward runs to the next module's start, so
    the functional operations after it (F.relu, a residual add, a flatten)
    count with it. Backward: a hook on the gradient of the module's output
    stamps when its backward starts, a hook on the gradient of its input when
    it ends; the time from its end to the next stamp (the backward of the
    functional operations between it and the module before it) counts with
    the module before it, as in the forward. Each call of a module is an entry
    of its own (torchvision's BasicBlock calls its ReLU twice). In-place
    modules (ReLU(inplace=True)) run out of place here, so that every output is
    a tensor of its own and its hooks stamp the right moment. Also: the input's
    normalisation, the loss (its forward; its backward up to the first stamp),
    the optimizer step. --warmup steps untimed, then the means over --steps."""
    import torch

    prec = setup_precision(torch, a)
    torch.manual_seed(a.seed)
    rm = reference_models()
    model = rm.build(a.model, 3, 32, 32, 10)
    macs = layer_macs(torch, model, 3, 32, 32)
    model = prec.model(model)
    model.train()
    opt = make_optimizer(torch, model, 0.01)
    crit = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    xb = torch.randint(0, 256, (a.batch_size, 3, 32, 32), dtype=torch.uint8, generator=g)
    yb = torch.randint(0, 10, (a.batch_size,), dtype=torch.int64, generator=g)
    mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1)
    clock = time.perf_counter_ns

    calls = []  # this step's module calls in forward order: [name, module type, macs per image]
    fwd = []    # (ns, call) at each call's start; call -1: the loss
    bwd = []    # (ns, call, 0 at the start of its backward | 1 at its end)
    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]

    def stamp(i, end):
        def hook(grad):
            bwd.append((clock(), i, end))
        return hook

    def pre(name):
        def hook(m, inp):
            i = len(calls)
            fwd.append((clock(), i))
            calls.append([name, type(m).__name__, macs.get(m, 0)])
            for x in inp:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    x.register_hook(stamp(i, 1))
        return hook

    def post(m, inp, out):
        if isinstance(out, torch.Tensor) and out.requires_grad and not any(out is x for x in inp):
            out.register_hook(stamp(len(calls) - 1, 0))

    for n, m in leaves:
        m.register_forward_pre_hook(pre(n))
        m.register_forward_hook(post)
        # An in-place module returns its input: a tensor hook on it would sit
        # on the producer's gradient function and stamp both modules at once.
        if getattr(m, "inplace", False):
            m.inplace = False
    conv = watch_conv_dtype(torch, model)

    totals = {}  # (call, "fwd"|"bwd") -> ns over the recorded steps
    other = {"input": 0, "loss_fwd": 0, "loss_bwd": 0, "optimizer": 0, "step": 0}
    names = None
    for it in range(a.warmup + a.steps):
        del calls[:], fwd[:], bwd[:]
        t0 = clock()
        x = prec.batch((xb.float() / 255 - mean) / std)
        with prec.autocast():
            out = model(x)
            fwd.append((clock(), -1))
            loss = crit(out, yb)
        t1 = clock()
        opt.zero_grad(set_to_none=True)
        t2 = clock()
        loss.backward()
        t3 = clock()
        opt.step()
        t4 = clock()
        if it < a.warmup:
            continue
        if names is None:
            names = [c[:] for c in calls]
        elif [c[0] for c in calls] != [c[0] for c in names]:
            sys.exit("torch_train.py: layers: the modules ran in another order in step %d" % (it + 1))
        other["input"] += fwd[0][0] - t0
        other["loss_fwd"] += t1 - fwd[-1][0]
        for (ta, i), (tb, _) in zip(fwd, fwd[1:]):
            totals[i, "fwd"] = totals.get((i, "fwd"), 0) + tb - ta
        bwd.sort(key=lambda e: e[0])
        other["loss_bwd"] += (bwd[0][0] if bwd else t3) - t2
        for k, (ta, i, end) in enumerate(bwd):
            tb = bwd[k + 1][0] if k + 1 < len(bwd) else t3
            j = max(i - 1, 0) if end else i  # after a module's end: the operations before it
            totals[j, "bwd"] = totals.get((j, "bwd"), 0) + tb - ta
        other["optimizer"] += t4 - t3
        other["step"] += t4 - t0
    loss = finite_loss(loss, a.model)
    ms = 1e-6 / a.steps
    layers = [{"name": c[0], "type": c[1], "fwd_ms": totals.get((i, "fwd"), 0) * ms,
               "bwd_ms": totals.get((i, "bwd"), 0) * ms, "train_flops": 6 * c[2] * a.batch_size}
              for i, c in enumerate(names)]
    res = {"mode": "layers", "model": a.model, "batch_size": a.batch_size, "threads": torch.get_num_threads(),
           "device": a.device, "amp": a.amp, "memory_format": prec.memory_format, "steps": a.steps,
           "warmup": a.warmup, "conv_dtype": conv.get("dtype") if conv is not None else None,
           "input_ms": other["input"] * ms, "loss_fwd_ms": other["loss_fwd"] * ms,
           "loss_bwd_ms": other["loss_bwd"] * ms, "optimizer_ms": other["optimizer"] * ms,
           "step_ms": other["step"] * ms,
           "forward_ms": (other["input"] + other["loss_fwd"]) * ms + sum(l["fwd_ms"] for l in layers),
           "backward_ms": other["loss_bwd"] * ms + sum(l["bwd_ms"] for l in layers),
           "layers": layers, "loss": loss}
    res["note"] = "%d steps after %d warm-up, %d threads, %s: step %.1f ms (forward %.1f, backward %.1f, " \
                  "optimizer %.1f)" % (a.steps, a.warmup, res["threads"], prec.describe(), res["step_ms"],
                                       res["forward_ms"], res["backward_ms"], res["optimizer_ms"])
    return res


def read_records(paths):
    """CIFAR-10 binary files -> (uint8 (N, 3072) pixels, int64 (N,) labels)."""
    import numpy as np

    parts = []
    for path in paths:
        r = np.fromfile(path, dtype=np.uint8)
        if r.size == 0 or r.size % RECORD:
            sys.exit("torch_train.py: %s: %d bytes, not a multiple of %d" % (path, r.size, RECORD))
        parts.append(r.reshape(-1, RECORD))
    rec = np.concatenate(parts)
    return np.ascontiguousarray(rec[:, 1:]), rec[:, 0].astype(np.int64)


class CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR python batch (a dict of a numpy array, lists and
    strings, written by Python 2 or 3) and refuses every other global, so a
    file that is not one cannot run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.multiarray", "scalar"), ("numpy.core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError("%s.%s is not part of a CIFAR batch" % (module, name))


def read_pickles(paths):
    """CIFAR-10 python batches -> (uint8 (N, 3072) pixels, int64 (N,) labels)."""
    import numpy as np

    xs, ys = [], []
    for path in paths:
        try:
            with open(path, "rb") as f:
                d = CifarUnpickler(f, encoding="latin1").load()
            d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}
            x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3072)
            y = np.asarray(d["labels"], dtype=np.int64)
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, ValueError, AttributeError) as e:
            sys.exit("torch_train.py: %s: not a CIFAR-10 python batch (%s: %s)" % (path, e.__class__.__name__, e))
        if x.shape[0] != y.shape[0]:
            sys.exit("torch_train.py: %s: %d images, %d labels" % (path, x.shape[0], y.shape[0]))
        xs.append(x)
        ys.append(y)
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def load_cifar10(path):
    """The train and test splits of the CIFAR-10 files under path (binary or
    python version; path itself or its cifar-10-batches-bin/ or
    cifar-10-batches-py/): (xtr, ytr, xte, yte), numpy uint8 (N, 3072) and int64."""
    for d in (path, os.path.join(path, "cifar-10-batches-bin"), os.path.join(path, "cifar-10-batches-py")):
        train = sorted(glob.glob(os.path.join(d, "data_batch_*.bin")))
        if train and os.path.isfile(os.path.join(d, "test_batch.bin")):
            return read_records(train) + read_records([os.path.join(d, "test_batch.bin")])
        train = [os.path.join(d, "data_batch_%d" % i) for i in range(1, 6)]
        if all(os.path.isfile(f) for f in train) and os.path.isfile(os.path.join(d, "test_batch")):
            return read_pickles(train) + read_pickles([os.path.join(d, "test_batch")])
    sys.exit("torch_train.py: %s holds neither CIFAR-10 binary files (data_batch_*.bin, test_batch.bin) nor the "
             "python version (data_batch_1..5, test_batch), nor cifar-10-batches-bin/ or cifar-10-batches-py/" % path)


def bench_tta(a):
    import torch

    prec = setup_precision(torch, a)
    dev = prec.device
    torch.manual_seed(a.seed)
    t_start = time.perf_counter()
    xtr, ytr, xte, yte = load_cifar10(a.data)
    xtr = torch.from_numpy(xtr).view(-1, 3, 32, 32).to(dev)
    ytr = torch.from_numpy(ytr).to(dev)
    xte = torch.from_numpy(xte).view(-1, 3, 32, 32).to(dev)
    yte = torch.from_numpy(yte).to(dev)
    n, B = xtr.shape[0], a.batch_size
    if n < B:
        sys.exit("torch_train.py: %d training records: fewer than one batch of %d" % (n, B))
    # Per-channel statistics of the train set, pixels scaled to [0, 1].
    f = xtr.permute(1, 0, 2, 3).reshape(3, -1).double() / 255
    mean = f.mean(1).float().view(1, 3, 1, 1)
    std = f.std(1, unbiased=False).float().view(1, 3, 1, 1)
    del f
    # Padded by 4 once, with a mirrored copy: (2N,3,40,40); crops is the
    # (2N,3,9,9,32,32) view whose [i, c, dy, dx] is image i's crop at (dy, dx).
    padded = torch.nn.functional.pad(xtr, (4, 4, 4, 4))
    both = torch.cat([padded, padded.flip(3)])
    del padded
    crops = both.unfold(2, 32, 1).unfold(3, 32, 1)

    rm = reference_models()
    model = rm.build(a.model, 3, 32, 32, int(max(int(ytr.max()), int(yte.max())) + 1))
    model = prec.model(model)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
    opt = make_optimizer(torch, model, a.lr, a.nesterov, a.weight_decay)
    steps_per_epoch = n // B
    total = a.epochs * steps_per_epoch
    if a.schedule == "onecycle":
        pct = a.warmup_epochs / a.epochs if a.warmup_epochs > 0 else 0.3
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=a.lr, total_steps=total, pct_start=min(pct, 1.0), anneal_strategy="linear",
            cycle_momentum=False, div_factor=25.0, final_div_factor=1e4)
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    # A step GradScaler skips (inf/NaN gradients) makes the scheduler warn that
    # it stepped before the optimizer; the order is right.
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()` before `optimizer.step()`")
    prec.sync()
    setup_s = time.perf_counter() - t_start
    chunk = 500 if dev.type == "cpu" else 2000

    def evaluate():
        model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=dev)
        with torch.no_grad(), prec.autocast():
            for s in range(0, xte.shape[0], chunk):
                x = prec.batch((xte[s:s + chunk].float() / 255 - mean) / std)
                correct += (model(x).argmax(1) == yte[s:s + chunk]).sum()
        model.train()
        return int(correct) / xte.shape[0]

    history = []
    acc = best = 0.0
    train_s = eval_s = 0.0
    epochs = 0
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n, device=dev)
        flip = torch.randint(0, 2, (n,), device=dev)
        dy = torch.randint(0, 9, (n,), device=dev)
        dx = torch.randint(0, 9, (n,), device=dev)
        # Summed on the device: reading the loss every step would wait for the GPU.
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        for s in range(0, steps_per_epoch * B, B):
            idx = perm[s:s + B]
            # Mirroring the padded image and cropping at dx equals cropping at
            # 8 - dx and mirroring the crop: RandomCrop(32, 4) + RandomHorizontalFlip.
            xb = crops[idx + n * flip[s:s + B], :, dy[s:s + B], dx[s:s + B]]
            x = prec.batch((xb.float() / 255 - mean) / std)
            with prec.autocast():
                loss = crit(model(x), ytr[idx])
            opt.zero_grad(set_to_none=True)
            prec.backward_step(loss, opt)
            sched.step()
            loss_sum += loss.detach()
        loss_mean = float(loss_sum) / steps_per_epoch  # waits for the epoch's last step
        t1 = time.perf_counter()
        acc = evaluate()
        t2 = time.perf_counter()
        train_s += t1 - t0
        eval_s += t2 - t1
        epochs = epoch + 1
        best = max(best, acc)
        history.append({"epoch": epochs, "train_loss": loss_mean, "val_acc": acc,
                        "train_s": t1 - t0, "eval_s": t2 - t1})
        print("  epoch %d: train loss %.4f, test acc %.4f, %.1f s train + %.1f s eval"
              % (epochs, loss_mean, acc, t1 - t0, t2 - t1), file=sys.stderr)
        if loss_mean != loss_mean:
            sys.exit("torch_train.py: %s: the loss is NaN in epoch %d" % (a.model, epochs))
        if a.target_accuracy is not None and acc >= a.target_accuracy:
            break
    time_s = time.perf_counter() - t_start
    reached = a.target_accuracy is not None and acc >= a.target_accuracy
    return {"mode": "tta", "model": a.model, "batch_size": B, "threads": torch.get_num_threads(), "lr": a.lr,
            "device": a.device, "amp": a.amp, "memory_format": prec.memory_format, "schedule": a.schedule, "nesterov": a.nesterov,
            "label_smoothing": a.label_smoothing, "weight_decay": a.weight_decay,
            "train_records": n, "test_records": int(xte.shape[0]), "steps_per_epoch": steps_per_epoch,
            "planned_epochs": a.epochs, "epochs": epochs, "steps": epochs * steps_per_epoch,
            "target_accuracy": a.target_accuracy, "reached": reached, "val_acc": acc, "best_val_acc": best,
            "time_s": time_s, "setup_s": setup_s, "train_time_s": train_s, "eval_time_s": eval_s,
            "images_per_s": epochs * steps_per_epoch * B / train_s if train_s > 0 else 0,
            "mean": [round(float(v), 6) for v in mean.flatten()], "std": [round(float(v), 6) for v in std.flatten()],
            "history": history,
            "note": "%s after %d epoch(s), test acc %.4f, %.1f s (%.1f s setup, %.1f s train, %.1f s eval)%s"
                    % ("target reached" if reached else "target NOT reached", epochs, acc, time_s, setup_s,
                       train_s, eval_s,
                       "" if a.device == "cpu" and a.amp == "off" and not prec.channels_last else "; " + prec.describe())}


def check(device="cpu", amp="off"):
    """Exit 0 when torch, torchvision, numpy and tools/reference_models.py import
    and --device/--amp can run; prints versions (and the GPU), or what is missing."""
    missing = []
    versions = {}
    for mod in ("torch", "torchvision", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:  # ImportError, or a broken install
            missing.append("%s (%s)" % (mod, e.__class__.__name__))
    if missing:
        print("missing: " + ", ".join(missing))
        return 1
    try:
        reference_models()
    except Exception as e:
        print("tools/reference_models.py does not import: %s: %s" % (e.__class__.__name__, e))
        return 1
    import torch
    why = precision_problem(torch, device, amp)
    if why:
        print(why)
        return 1
    line = " ".join("%s %s" % kv for kv in versions.items())
    if device == "cuda":
        line += " (CUDA %s, cuDNN %s, %s)" % (torch.version.cuda, torch.backends.cudnn.version(),
                                             torch.cuda.get_device_name(0))
    elif torch.backends.mkldnn.is_available():
        line += " (oneDNN)"
    if device == "cpu" and amp == "bf16":
        # Autocast's rules in this torch: is a convolution under it computed in bfloat16?
        conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(x)
        if y.dtype != torch.bfloat16:
            print("torch %s: a Conv2d under torch.autocast('cpu', dtype=torch.bfloat16) yields %s, not bfloat16"
                  % (torch.__version__, y.dtype))
            return 1
        line += ", autocast('cpu', bfloat16): Conv2d -> bfloat16, weights %s" % str(conv.weight.dtype)[6:]
    print(line)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Modes: compute, tta, flops, layers, check (see the module docstring).")
    p.add_argument("mode", choices=["check", "compute", "tta", "flops", "layers", "profile"])
    p.add_argument("--model", default="mnist-net",
                   help="mnist-net, resnet18, resnet9, resnet50, wrn-D-K, each on 3x32x32 images of 10 classes, or "
                        "NAME@S on 3xSxS images of 1000 classes (resnet50@224: ImageNet's; compute, profile and "
                        "flops) (default mnist-net)")
    p.add_argument("--data", help="tta: directory holding the CIFAR-10 binary or python files")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=cpu_count(), help="torch threads (default: the CPUs usable)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="compute, tta, profile, check (default cpu)")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off",
                   help="compute, tta, check: autocast precision (default off: fp32; fp16 on CUDA only)")
    p.add_argument("--memory-format", choices=["auto", "channels_last", "contiguous"], default="auto",
                   help="compute, tta: layout of the model and batches (default auto: channels_last with "
                        "--amp bf16/fp16, contiguous NCHW with fp32)")
    p.add_argument("--tf32", choices=["on", "off"], default="on",
                   help="CUDA fp32: on (default) leaves PyTorch's defaults (convolutions on TF32 tensor cores, "
                        "matmuls strict), off makes both strict fp32")
    p.add_argument("--compile", action="store_true",
                   help="compute: torch.compile(model) (mode default), compile time reported apart")
    p.add_argument("--trace-out", help="profile: keep torch.profiler's chrome trace here (.gz: gzipped)")
    p.add_argument("--steps", type=int, default=20, help="compute: timed steps; profile: profiled steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="compute, profile: untimed steps first (default 3)")
    p.add_argument("--epochs", type=int, default=10, help="tta: planned epochs, the schedule's length (default 10)")
    p.add_argument("--lr", type=float, default=0.05, help="tta: peak learning rate (default 0.05)")
    p.add_argument("--schedule", choices=["cosine", "onecycle"], default="cosine", help="tta (default cosine)")
    p.add_argument("--warmup-epochs", type=float, default=0,
                   help="tta, onecycle: epochs of the rising part (default 0: 30 %% of the run)")
    p.add_argument("--nesterov", action="store_true", help="tta: Nesterov momentum")
    p.add_argument("--label-smoothing", type=float, default=0.0, help="tta (default 0)")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="tta (default 5e-4)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="tta: stop once test accuracy >= A (0..1 or a percentage)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.mode == "check":
        return check(a.device, a.amp)
    if a.batch_size < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.epochs < 1 or a.lr <= 0:
        p.error("--batch-size, --threads, --steps, --epochs must be >= 1, --warmup >= 0, --lr > 0")
    if not 0 <= a.label_smoothing < 1 or a.weight_decay < 0 or a.warmup_epochs < 0:
        p.error("--label-smoothing must be in [0, 1), --weight-decay and --warmup-epochs >= 0")
    if a.target_accuracy is not None and a.target_accuracy > 1:
        a.target_accuracy /= 100
    if a.mode == "flops":
        for name in a.model.split(","):
            try:
                model, size, _ = build_model(name)
            except ValueError as e:
                sys.exit("torch_train.py: %s" % e)
            flops, macs = train_flops_per_image(model, 3, size, size)
            print(json.dumps({"mode": "flops", "model": name, "train_flops_per_image": flops,
                              "forward_macs_per_image": macs}))
        return 0
    if a.mode == "tta" and not a.data:
        p.error("tta needs --data DIR")
    if a.mode == "layers":
        if a.device != "cpu":
            p.error("layers runs on the CPU only (--device cpu)")
        result = bench_layers(a)
        print("layers     %-10s %s" % (a.model, result["note"]), file=sys.stderr)
        print(json.dumps(result), flush=True)
        return 0
    if a.mode == "profile":
        result = bench_profile(a)
        print("profile    %-10s step %.3f ms, device busy %.3f ms (%d steps after %d warm-up; %s)" % (
            a.model, result["step_ms"], result["busy_ms"], a.steps, a.warmup, result["source"]), file=sys.stderr)
        print(json.dumps(result), flush=True)
        return 0
    result = bench_compute(a) if a.mode == "compute" else bench_tta(a)
    if a.mode == "compute" and "skipped" in result:
        print("compute    %-10s skipped: %s" % (a.model, result["skipped"]), file=sys.stderr)
    elif a.mode == "compute":
        print("%-10s %-10s %9.1f images/s  (%d images in %.2f s)  %s" % (
            "compute", a.model, result["images_per_s"], result["images"], result["seconds"], result["note"]),
            file=sys.stderr)
    else:
        print("tta        %-10s %s" % (a.model, result["note"]), file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
