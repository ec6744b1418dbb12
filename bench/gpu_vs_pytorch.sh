#!/usr/bin/env bash
# gpu_vs_pytorch.sh - ringtrain's training on one NVIDIA GPU against PyTorch
# on the same GPU, side by side: compute speed per model and precision
# (against PyTorch eager and torch.compile, with TFLOP/s and the share of the
# GPU's peak), the input pipeline's cost and headroom, time to 94 % on
# CIFAR-10, a per-op profile of both sides that shows where each step's
# time goes, and (--only folder) ResNet-50 at 224 px trained from a folder of
# JPEGs through each side's loader.
#   bench/gpu_vs_pytorch.sh [--bin PATH] [--python PATH] [--models LIST]
#                           [--amps LIST] [--runs R] [--batch-size B]
#                           [--window-s W] [--steps-scale F] [--extras LIST]
#                           [--workers W] [--data DIR] [--cache DIR]
#                           [--cifar PATH] [--tta-epochs E] [--target A]
#                           [--profile-steps S] [--profile-warmup K]
#                           [--profile-json FILE] [--results-json FILE]
#                           [--trace-dir DIR] [--device cuda|cpu]
#                           [--folder-model NAME@S[:B]] [--folder-classes K]
#                           [--folder-per-class N] [--folder-seconds T]
#                           [--folder-workers W] [--torch-workers LIST]
#                           [--only compute|loader|tta|profile|folder[,...]]
#   bench/gpu_vs_pytorch.sh --tables-from RESULTS.json [--profile-json FILE]
# Needs a machine with an NVIDIA GPU: without nvidia-smi, with nvidia-smi
# listing no GPU, or when `ringtrain train --device cuda` cannot train (a
# build without CUDA, no driver), it stops at once with exit status 2 and
# says why (--device cpu runs the profile part or the folder part on the CPU
# instead). Every way alternated RUNS times with the others (the order of the
# ways reverses every run), medians printed with min - max, ratios and
# PASS/MISS against the goals. Four parts by default, run in this order, and a
# fifth (folder) only when --only names it:
#   compute   forward + backward + SGD step on synthetic data, images/s, for
#             each model and each precision (--amp off, bf16, fp16): resnet18,
#             resnet9, mnist-net, wrn-16-4 on 3x32x32 inputs of 10 classes at
#             batch 512, and resnet50@224 (torchvision's ResNet-50 on 3x224x224
#             inputs of 1000 classes, ImageNet's shape) at batch 256. Each
#             model's batch: NAME@S:B in --models gives its own, else
#             --batch-size B where given, else 256 for a model at 224 px or
#             more and 512 for the rest; the tables, the results JSON, the
#             speed cache and the step counts all go by each model's batch.
#             CrossEntropyLoss, SGD momentum 0.9, weight decay 5e-4, each step
#             normalising a fixed uint8 batch that lives on the GPU. The ways
#             of each model x precision:
#               ringtrain          `train --device cuda --amp A --synthetic-data
#                                  --model M --batch-size B --steps N+3 --json`,
#                                  its steady_images_per_s (the steps after the
#                                  first 3; every step waits for its loss), its
#                                  defaults: --tf32 on (fp32 convolutions on TF32
#                                  tensor cores, matmuls strict), --deterministic on
#               PyTorch eager      bench/torch_train.py compute --device cuda --amp
#                                  A: 3 untimed steps, then N timed between two
#                                  torch.cuda.synchronize(); cudnn.benchmark =
#                                  True; PyTorch's own TF32 defaults
#                                  (cudnn.allow_tf32 True, matmuls strict); with
#                                  bf16/fp16 torch.autocast around the forward pass
#                                  and the loss, channels_last model and batches,
#                                  and for fp16 a GradScaler (dynamic loss scaling,
#                                  as ringtrain's fp16)
#             and the extras (--extras, default compile,nondet,strict; none
#             with --steps-scale below 1, a quick check):
#               compile            PyTorch with torch.compile(model) (mode
#                                  default; forward and backward compiled, the
#                                  loss and optimizer eager): its steady state after
#                                  the compiling first step, whose time is reported
#                                  apart; skipped with a note where torch.compile is
#                                  absent (PyTorch 1.x) or fails
#               nondet             ringtrain --deterministic off: what determinism
#                                  costs (deterministic : nondeterministic images/s)
#               strict             fp32 also at strict settings, both sides:
#                                  ringtrain --tf32 off against PyTorch with TF32
#                                  off for convolutions and matmuls (a second fp32
#                                  row)
#               eager              (not in the default) ringtrain --cuda-graph off:
#                                  what replaying each micro-batch as a CUDA graph
#                                  gains (graph : op by op images/s, a line after
#                                  the TFLOP/s table)
#             Each result's JSON holds the PyTorch settings it ran with
#             (cudnn.allow_tf32, matmul allow_tf32 and float32_matmul_precision,
#             cudnn.benchmark, cudnn.deterministic, autocast dtype,
#             channels_last, GradScaler, compile) or ringtrain's "settings"; all
#             of them, the medians and the goals go to --results-json (default
#             CACHE/compute.json).
#             Windows: each measurement is sized to run about W seconds
#             (--window-s, default 3, times --steps-scale): N = W x images/s / B
#             at the speed that way measured in the run before; the first run
#             takes that way's median from the last invocation on this GPU at
#             that model's batch (CACHE/speeds.json) or, without one, a guess
#             from one H100's figures (docs/PERFORMANCE.md; for resnet50@224 a
#             guess from its FLOPs, not a measurement: 24.5 GFLOP per trained
#             image, ~3000 images/s in bf16/fp16, ~1350 in fp32 with TF32);
#             at least 5 steps.
#             TFLOP/s: training FLOPs per image = 3 x 2 x the forward
#             multiply-adds of the Conv2d and Linear layers; share of the GPU's
#             peak for that precision (dense, NVIDIA's datasheets: H100 SXM and
#             H200 fp32 67, TF32 495, bf16/fp16 989 TFLOP/s; H100 PCIe 51 / 378 /
#             756; A100 19.5 / 156 / 312; L40S 91.6 / 183 / 362; n/a elsewhere);
#             the fp32 rows against the TF32 peak (default) and the fp32 peak
#             (strict).
#             Goals: ringtrain >= 1.2x PyTorch eager at every model x precision,
#             fp32 at both settings; resnet9 and wrn-16-4 at bf16/fp16 >= 200
#             TFLOP/s; resnet50@224 in bf16 >= 1.2x PyTorch eager and >= 1.0x
#             torch.compile (so compile in --extras). A pair whose ringtrain
#             profile (the profile part of the same invocation, or
#             --profile-json with --tables-from) shows the GPU idle more than
#             20 % of the step is named host-bound.
#   loader    the same training step fed by the real loader, per model (the
#             32-px ones: NAME@S models are left out) at the default
#             precision (no --amp: bf16 on a GPU that has it, fp32 otherwise):
#             `train --device cuda --data DIR --workers W --steps N+3` (the
#             packed dataset read through io_uring, decompressed, cropped +
#             flipped and copied to the GPU every step) alternated
#             with the same run on --synthetic-data. The input-pipeline cost
#             = (synthetic - loader) / synthetic images/s, in %.
#             Then `ringtrain loadbench DIR --workers W --batch-size B --epochs
#             3 --json` (the loader and pinned ring alone, no compute), RUNS
#             times, its steady images_per_s against what the GPU consumes
#             (the synthetic images/s above), per model: loader headroom =
#             loader / GPU images/s. Goal: headroom >= 1.0x (the loader can
#             feed the GPU). Step counts: the old fixed table (below), x F.
#             DIR: --data (a packed dataset, e.g. real CIFAR-10 packed with
#             `ringtrain pack`), by default CACHE/synth: `ringtrain synth`
#             (CIFAR-10-like, 50000 train + 10000 test) packed, made when
#             absent and kept.
#   tta       time to 94 % test accuracy on real CIFAR-10, resnet9, given with
#             --cifar PATH (the binary or the python version, a directory
#             holding the files or their cifar-10-batches-*/ folder, or the
#             .tar.gz as distributed); without --cifar this part is skipped
#             and says so. The recipe, the same both ways, is the DAWNBench
#             ResNet-9 one (Myrtle.ai, D. Page, "How to train your ResNet"):
#             batch 512, SGD momentum 0.9 Nesterov, weight decay 5e-4 on the
#             mean loss (Page's 5e-4 x 512 on the summed loss), one cycle:
#             lr linear from 0.4/25 up to 0.4 over 5 epochs, then linear down
#             to ~0 at the end of E epochs (--tta-epochs, default 24, Page's
#             length), label smoothing 0.2 (from the same series' later
#             posts), random crop 32 with 4-pixel zero padding + random
#             horizontal flip, evaluation on the 10000 test images after every
#             epoch, stopping once test accuracy >= A (--target, default 0.94);
#             precision: the default one of the part above, both ways, fp32 at
#             both sides' default TF32 settings.
#             Not taken from those recipes: cutout, input whitening, frozen
#             batch-norm scales, test-time flips; this plain recipe ends near
#             94 % after 24 epochs, so some runs may miss it (the table says
#             how many reached it).
#             ringtrain: CIFAR packed once with `ringtrain pack PATH` into
#             CACHE/cifar10 (kept), then `train --device cuda --data
#             CACHE/cifar10 --model resnet9 --batch-size 512 --optimizer sgd
#             --lr 0.4 --momentum 0.9 --nesterov --weight-decay 5e-4
#             --schedule onecycle --warmup-epochs 5 --label-smoothing 0.2
#             --aug crop,flip --epochs E --target-accuracy A --seed S --json`.
#             PyTorch eager: bench/torch_train.py tta with the same recipe
#             (OneCycleLR anneal_strategy='linear', cycle_momentum False), the
#             whole set on the GPU as uint8, crops and flips by indexing; a
#             tarball is unpacked once into CACHE/cifar10-src for it.
#             Seed S = the run's number, both ways. Wall time of each run from
#             its start (data read included; PyTorch's interpreter start-up
#             and `import torch` not).
#             Goal: ringtrain's time to A <= PyTorch's (ratio >= 1.0). For
#             context, the fastest published CIFAR-10 recipes: airbench94
#             (K. Jordan, 2024) reaches 94 % in 3.83 s on one A100 (3.29 s
#             with torch.compile), Page's ResNet-9 did it in 79 s on one V100
#             (24 epochs, 2018).
#   profile   per model x precision, where one step's time goes on each side,
#             op by op, summed by category (conv_fwd, data_grad, weight_grad,
#             batchnorm, elementwise, pooling, loss, optimizer, copies, other,
#             idle; ms per step): ringtrain `train --device cuda --synthetic-data
#             --profile-ops --model M --batch-size B --amp A --steps K+S --json`
#             (its "op_profile": every op of its table timed on the device)
#             beside bench/torch_train.py profile (PyTorch eager at the compute
#             part's settings: K warm-up steps, then S steps under torch.profiler
#             with CPU and CUDA activities; each kernel's time to the aten op
#             that launched it, categorised by bench/op_profile.py; idle = wall
#             per step minus the union of the kernels' intervals). Per pair: the
#             table by category (both sides, the difference, each side's share
#             of its step), the top ops of each side, the cuDNN choice per
#             convolution (ringtrain's op_profile.convolutions; PyTorch's
#             convolution kernels' names with their ms) and one line naming the
#             three largest differences; all pairs go to --profile-json
#             (default CACHE/profile.json, rewritten after each pair, the shape
#             `ringtrain report FILE` draws). Profiling slows both sides (per-op
#             events, CUPTI): its idle is an upper bound, the compute part's
#             images/s the speed. --device cpu profiles on the CPU instead
#             (both sides: ringtrain's host-timed ops, torch.profiler's self CPU
#             time per op), for the table's format without a GPU. Pairs run
#             in this order: those that trailed PyTorch eager in the last table
#             (resnet9 and wrn-16-4 at bf16 and fp16, resnet18 and mnist-net in
#             fp32), then the rest (resnet50@224 last); a run cut short keeps
#             the most telling.
#   folder    (only with --only folder: not in the default parts) ResNet-50 at
#             224 px, bf16, batch 256 (--folder-model, default
#             resnet50@224:256), trained end to end from a folder of JPEGs on
#             both sides. The folder: CACHE/imagefolder-KxN, K classes x N
#             JPEGs (default 1000 x 25 = 25000, ~3 GB) with ImageNet's spread
#             of sizes and coding, written by bench/make_image_folder.py --jobs
#             (the CPUs), and CACHE/imagefolder-KxN-packed, `ringtrain pack DIR
#             --out PACKED --codec jpeg --max-side 512`; both kept, a rerun
#             reuses them; both read once before the runs (page cache warm).
#             The ways, alternated each run (order reversed every run):
#               ringtrain    `train --device cuda --data PACKED --model resnet50
#                            --image-size 224 --amp bf16 --batch-size 256
#                            --workers W --epochs E --metrics FILE --json`: W
#                            loader threads (--folder-workers, default the
#                            CPUs), RandomResizedCrop(224) + flip at load time
#                            (the records keep their own sizes); E = 1 untimed
#                            epoch + enough for >= T s (--folder-seconds,
#                            default 20) at the speed of the run before (the
#                            first: CACHE/speeds.json, else ~3000 images/s, a
#                            guess), at least 2 timed. Timed part: its --metrics
#                            epochs after the first: images/s = their images /
#                            their seconds, data wait = their data_wait_frac
#                            weighted by time
#               PyTorch      bench/torch_imagefolder.py train: torchvision
#                            ImageFolder + DataLoader (RandomResizedCrop(224),
#                            RandomHorizontalFlip, ToTensor, Normalize;
#                            shuffle, pin_memory, persistent workers, drop_last)
#                            at each num_workers of --torch-workers (default
#                            8,16), the same model (torchvision's resnet50, as
#                            many classes as the folder: the same on both
#                            sides), bf16 autocast, channels_last, SGD; 1
#                            untimed epoch, then whole epochs until >= T s and 2
#                            epochs (the clock stopped mid-epoch at 3T); data
#                            wait = the time in the DataLoader's next() / wall
#             Goals: ringtrain's data wait <= 5 % of the step; ringtrain end to
#             end >= 1.5x PyTorch + DataLoader at its best num_workers. Results
#             JSON: CACHE/folder.json. On the CPU (--device cpu --only folder,
#             a small --folder-model such as mnist-net@32:16 and a tiny folder)
#             it runs the same pipeline as a dry run of the script.
#             Time, estimated (no GPU run yet): on the GPU machine's 16 cores
#             generation ~20-30 s (measured here: ~100 JPEGs/s per core of a
#             2-core AMD EPYC (Zen 4); 25000 / 1600) and pack ~4-7 s (~450
#             images/s per thread here); then per run ringtrain ~35 s (start-up
#             with cuDNN's search ~5-10, 1 untimed epoch of ~8 s at ~3000
#             images/s, >= 20 timed) and PyTorch ~40 s per num_workers (import,
#             1 untimed epoch ~10 s, >= 20 timed): ~115 s per run, ~350 s for
#             3 runs; the whole part ~400 s the first time, ~360 s with the
#             folder cached: one 600-s device run (the machine's start-up
#             apart). --runs 2 saves ~115 s.
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --python PATH     the python3 with torch built with CUDA (default: the
#                     first of python3 on PATH and /usr/bin/python3 whose torch
#                     sees the GPU); without one, ringtrain's figures alone,
#                     saying that PyTorch with CUDA is absent
#   --models LIST     comma-separated models (default
#                     resnet18,resnet9,mnist-net,wrn-16-4,resnet50@224); NAME@S
#                     is NAME on 3xSxS synthetic images of 1000 classes in the
#                     compute and profile parts, both sides (resnet50@224:
#                     ImageNet's shape); NAME[@S]:B trains it at batch B
#                     (`--models resnet50@224:128`)
#   --amps LIST       precisions of the compute and profile parts (default
#                     off,bf16,fp16)
#   --runs R          rounds of every way, each part but profile (default 3)
#   --batch-size B    images per step of every model without :B, compute,
#                     loader and profile parts (default: 256 for models at 224
#                     px or more, 512 for the rest; the loader part's 512)
#   --window-s W      seconds each compute measurement aims at (default 3)
#   --steps-scale F   multiply every window and step count by F (default 1;
#                     0.1 for a quick check: at least 5 steps; below 1 the
#                     extras default to none)
#   --extras LIST     compute part: compile, nondet, strict, eager,
#                     comma-separated, or none (default compile,nondet,strict;
#                     none when F < 1)
#   --workers W       ringtrain's loader threads, train and loadbench
#                     (default 1, train's default)
#   --data DIR        packed dataset of the loader part (default CACHE/synth)
#   --cache DIR       where made datasets and result files are kept (default
#                     data/bench-gpu)
#   --cifar PATH      real CIFAR-10 for the time-to-accuracy part
#   --tta-epochs E    planned epochs of the recipe, the schedule's length and
#                     the limit (default 24)
#   --target A        target test accuracy, 0..1 (default 0.94)
#   --profile-steps S  profiled steps per side (default 10)
#   --profile-warmup K steps before them (default 5)
#   --profile-json FILE  the profile part's JSON (default CACHE/profile.json);
#                     with --tables-from, the profile whose idle names host-bound
#                     pairs
#   --results-json FILE  the compute part's JSON (default CACHE/compute.json)
#   --trace-dir DIR   keep PyTorch's torch.profiler traces there (gzipped chrome
#                     traces, one per model x precision; `bench/op_profile.py
#                     trace FILE` re-reads one)
#   --device D        cuda (default) or cpu: the profile part on the CPU (with
#                     --only profile alone) or the folder part (--only folder
#                     alone: a dry run of its pipeline)
#   --folder-model NAME@S[:B]  the folder part's model, crop size and batch
#                     (default resnet50@224:256)
#   --folder-classes K, --folder-per-class N  its folder (default 1000 x 25)
#   --folder-seconds T  timed seconds per side and run at least (default 20)
#   --folder-workers W  ringtrain's loader threads there (default: the CPUs)
#   --torch-workers LIST  the DataLoader's num_workers tried there, the best
#                     one compared (default 8,16)
#   --only LIST       run these parts only: compute, loader, tta, profile,
#                     folder
#   --tables-from FILE  print the compute tables of a results JSON written by an
#                     earlier run (--results-json) and stop: no GPU, no torch
# Estimated, not yet measured: about 55 minutes on one H100 or H200 with the
# defaults and --cifar (compute ~38, loader ~3, tta ~8, profile ~3), the first
# run a minute more (synth + pack); per model and run of the compute part about
# 75 s, resnet50@224 about 180 s (14 processes of ~13 s: start-up and cuDNN's
# search dominate its 3-s windows), plus torch.compile's compiles (20-60 s the
# first time per model x precision, 60-90 s for resnet50@224; 5-10 s cached).
# --only compute --runs 3 --models resnet9: about 6 minutes (3 without compile
# in --extras); --only compute --models resnet50@224 --runs 3: about 12;
# --only profile --models resnet9: about 30 s; the GPU kit's --only compute
# --steps-scale 0.5 --runs 1: about 3.5; --only folder: about 7 (above).
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
PT_PY=
MODELS=resnet18,resnet9,mnist-net,wrn-16-4,resnet50@224
AMPS=off,bf16,fp16
RUNS=3
B=  # --batch-size: every model's batch where given; else model_batch's rule
SCALE=1
WINDOW=3
EXTRAS=default
WORKERS=1
DATA=
CACHE=$top/data/bench-gpu
CIFAR=
TTA_EPOCHS=24
TARGET=0.94
ONLY=
DEVICE=cuda
PROFILE_STEPS=10
PROFILE_WARMUP=5
PROFILE_JSON=
RESULTS_JSON=
TRACE_DIR=
TABLES_FROM=
FOLDER_MODEL=resnet50@224
FOLDER_CLASSES=1000
FOLDER_PER_CLASS=25
FOLDER_SECONDS=20
FOLDER_WORKERS=
TORCH_WORKERS=8,16
# The time-to-accuracy recipe (see the header).
TTA_MODEL=resnet9
TTA_B=512
TTA_LR=0.4
TTA_WD=5e-4
TTA_WARMUP=5
TTA_LS=0.2

# Timed steps per model at --steps-scale 1 for the loader part (and the compute
# part's first run of a model the guess table lacks): a few seconds each on an
# H100 at batch 512 in fp32, less with bf16/fp16.
steps_for() {
    case $1 in
    mnist-net) echo 200 ;;
    resnet18) echo 200 ;;
    resnet9) echo 100 ;;
    wrn-16-4) echo 100 ;;
    wrn-*) echo 50 ;;
    *@*) echo 20 ;;
    *) echo 100 ;;
    esac
}

bench_options --bin=RT --python=PT_PY --models=MODELS --amps=AMPS --runs=RUNS --batch-size=B --steps-scale=SCALE \
    --window-s=WINDOW --extras=EXTRAS --workers=WORKERS --data=DATA --cache=CACHE --cifar=CIFAR \
    --tta-epochs=TTA_EPOCHS --target=TARGET --only=ONLY --device=DEVICE --profile-steps=PROFILE_STEPS \
    --profile-warmup=PROFILE_WARMUP --profile-json=PROFILE_JSON --results-json=RESULTS_JSON --trace-dir=TRACE_DIR \
    --tables-from=TABLES_FROM --folder-model=FOLDER_MODEL --folder-classes=FOLDER_CLASSES \
    --folder-per-class=FOLDER_PER_CLASS --folder-seconds=FOLDER_SECONDS --folder-workers=FOLDER_WORKERS \
    --torch-workers=TORCH_WORKERS -- "$@"
BATCH_SET=$B
B=${B:-512}
[ -n "$FOLDER_WORKERS" ] || FOLDER_WORKERS=$(nproc)
bench_posint "$B" "$RUNS" "$WORKERS" "$TTA_EPOCHS" "$PROFILE_STEPS" "$FOLDER_CLASSES" "$FOLDER_PER_CLASS" \
    "$FOLDER_WORKERS"
bench_posnum "$FOLDER_SECONDS" || bench_fail "--folder-seconds '$FOLDER_SECONDS' is not a positive number"
case $PROFILE_WARMUP in '' | *[!0-9]*) bench_fail "--profile-warmup '$PROFILE_WARMUP' is not a whole number" ;; esac
bench_posnum "$SCALE" || bench_fail "--steps-scale '$SCALE' is not a positive number"
bench_posnum "$WINDOW" || bench_fail "--window-s '$WINDOW' is not a positive number"
bench_accuracy "$TARGET" || bench_fail "--target '$TARGET' is not an accuracy in (0, 1]"
parts=()
[ -z "$ONLY" ] || bench_list parts "$ONLY" --only
for p in "${parts[@]}"; do
    case $p in compute | loader | tta | profile | folder) ;; *) bench_fail "--only takes compute, loader, tta, profile or folder (or several, comma-separated)" ;; esac
done
part_on() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
case $DEVICE in
cuda) ;;
cpu) [ "$ONLY" = profile ] || [ "$ONLY" = folder ] ||
    bench_fail "--device cpu runs the profile part or the folder part alone: add --only profile or --only folder" ;;
*) bench_fail "--device takes cuda or cpu" ;;
esac
# model_batch NAME: a model's batch without :B in its spec: --batch-size where given, else 256 for NAME@S at
# 224 px or more (ImageNet's shape: ResNet-50's usual batch per GPU) and 512 for the rest.
model_batch() {
    if [ -n "$BATCH_SET" ]; then
        echo "$BATCH_SET"
    else
        case $1 in
        *@*) local px=${1##*@}
            case $px in '' | *[!0-9]*) echo 512 ;; *) if [ "$px" -ge 224 ]; then echo 256; else echo 512; fi ;; esac ;;
        *) echo 512 ;;
        esac
    fi
}
# Model specs NAME[@S][:B] -> the names (models), each one's batch (mbatch[NAME]).
specs=()
bench_list specs "$MODELS" --models
models=()
declare -A mbatch
# spec_batch OPTION SPEC: SPEC's batch -- the number after ':', else model_batch's for its name.
spec_batch() {
    if [[ $2 == *:* ]]; then
        case ${2#*:} in '' | *[!0-9]* | 0) bench_fail "$1: $2: the batch after : is not a positive integer" ;; esac
        echo "${2#*:}"
    else
        model_batch "${2%%:*}"
    fi
}
for spec in "${specs[@]}"; do
    name=${spec%%:*}
    mb=$(spec_batch --models "$spec") || exit 2
    [ -z "${mbatch[$name]:-}" ] || bench_fail "--models: $name is listed twice"
    mbatch[$name]=$mb
    models+=("$name")
done
MODEL_NAMES=$(IFS=,; echo "${models[*]}")
MODEL_BATCHES=$(for m in "${models[@]}"; do echo -n "$m:${mbatch[$m]},"; done)
FOLDER_NAME=${FOLDER_MODEL%%:*}
case $FOLDER_NAME in
*@*) ;;
*) bench_fail "--folder-model $FOLDER_MODEL: needs NAME@S (the crop size), e.g. resnet50@224:256" ;;
esac
FOLDER_S=${FOLDER_NAME##*@}
bench_posint "$FOLDER_S"
FOLDER_B=$(spec_batch --folder-model "$FOLDER_MODEL") || exit 2
torch_workers=()
bench_list torch_workers "$TORCH_WORKERS" --torch-workers
bench_posint "${torch_workers[@]}"
amps=()
bench_list amps "$AMPS" --amps
for a in "${amps[@]}"; do
    case $a in off | bf16 | fp16) ;; *) bench_fail "--amps: '$a' is not off, bf16 or fp16" ;; esac
done
if [ "$EXTRAS" = default ]; then
    # A quick check (--steps-scale below 1, as the GPU kit's short run) measures the plain pairs only.
    if awk -v f="$SCALE" 'BEGIN { exit !(f + 0 < 1) }'; then EXTRAS=none; else EXTRAS=compile,nondet,strict; fi
fi
extras=()
[ "$EXTRAS" = none ] || bench_list extras "$EXTRAS" --extras
for x in "${extras[@]}"; do
    case $x in compile | nondet | strict | eager) ;; *) bench_fail "--extras: '$x' is not compile, nondet, strict or eager (or none)" ;; esac
done
extra_on() { [[ ",$EXTRAS," == *",$1,"* ]]; }
if [ -n "$CIFAR" ] && [ ! -e "$CIFAR" ]; then
    bench_fail "--cifar $CIFAR: no such file or directory"
fi
RT=$(bench_bin "$RT")
RPY=$(command -v python3 || echo /usr/bin/python3)  # runs the report helper: json and statistics only
"$RPY" -c 'import json, statistics' 2>/dev/null || bench_fail "no python3 (it prints the tables)"
bench_scratch rt-gvp

# --- the report helper: parses each result line, prints the tables -----------------------------
bench_report_helper "$t/report.py" <<'EOF'
import os

WAY = {"rt": "ringtrain", "rt-nd": "ringtrain nondeterministic", "rt-strict": "ringtrain fp32 strict",
       "rt-eager": "ringtrain op by op (--cuda-graph off)",
       "pt": "PyTorch eager", "pt-strict": "PyTorch eager fp32 strict", "ptc": "PyTorch torch.compile",
       "syn": "synthetic", "data": "loader", "lb": "loadbench", "frt": "ringtrain"}
PT_WAYS = ("pt", "pt-strict", "ptc")

# Dense TFLOP/s by GPU: fp32, TF32, bf16/fp16 (NVIDIA's H100/H200, A100 and L40S datasheets; the
# tensor-core figures there are with sparsity, halved here).
PEAKS = (
    ("H200", lambda n: "H200" in n and "NVL" not in n, (67.0, 495.0, 989.0)),
    ("H100 SXM", lambda n: "H100" in n and ("SXM" in n or "HBM3" in n), (67.0, 495.0, 989.0)),
    ("H100 PCIe", lambda n: "H100" in n and "PCIE" in n.upper(), (51.0, 378.0, 756.0)),
    ("A100", lambda n: "A100" in n, (19.5, 156.0, 312.0)),
    ("L40S", lambda n: "L40S" in n, (91.6, 183.0, 362.0)),
)
# Images/s at batch 512 on one H100 (docs/PERFORMANCE.md's first figures, the faster side of each
# pair): fp32, bf16, fp16. Sizes the compute part's first run where no earlier speed is known.
# resnet50@224 (at its batch of 256) is a guess, not a measurement: ResNet-50 trains at ~24.5 GFLOP per
# 224-px image, so ~3000 images/s in bf16/fp16 is ~74 TFLOP/s, what PyTorch is commonly quoted at on one
# H100; fp32 (TF32) at about 0.45 of that.
GUESS = {"resnet18": (68949, 85835, 115176), "resnet9": (25031, 75847, 70536),
         "mnist-net": (196144, 273324, 267585), "wrn-16-4": (14425, 66666, 71144),
         "resnet50@224": (1350, 3000, 3000)}
# The folder part's first run (no speed of an earlier one): the same guess for ringtrain fed from JPEGs.
FOLDER_GUESS = {"resnet50@224": 3000}
FOLDER_WAIT_GOAL = 0.05
FOLDER_RATIO_GOAL = 1.5
R50 = "resnet50@224"
R50_COMPILE_GOAL = 1.0
RATIO_GOAL = 1.2
TFLOPS_GOAL = 200.0
WIDE = ("resnet9", "wrn-16-4")
HOST_BOUND_IDLE = 0.20

def add(results, part, way, model, amp, run, path, wall, target, batch="0"):
    """Appends one measurement to results; 0 when it holds what the part needs, 3
    when the way was skipped (torch.compile absent or failing), 1 when it failed.
    amp: the precision asked for ("default" when none was). The folder part's runs go to folder_add, with
    the --metrics file ringtrain wrote beside its output."""
    if part == "folder":
        return folder_add(results, way, model, amp, run, path, wall, batch,
                          os.path.join(os.path.dirname(path), "folder-metrics.jsonl"))
    r = last_json(path)
    label = "%-26s %-10s %-7s" % (WAY[way], model, amp)
    rec = {"part": part, "way": way, "model": model, "amp": amp, "run": int(run), "process_s": float(wall)}
    if int(batch):
        rec["batch"] = int(batch)
    if part in ("compute", "loader"):
        pt = way in PT_WAYS
        if pt and r is not None and r.get("skipped"):
            rec.update(skipped=r["skipped"], settings=r.get("settings"))
            with open(results, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print("  %s skipped: %s" % (label, r["skipped"]))
            return 3
        key = "images_per_s" if pt else "steady_images_per_s"
        if r is None or not isnum(r.get(key)) or r[key] <= 0:
            print("  %s FAILED: no JSON line with %s at the end of its output" % (label, key))
            return 1
        rec["ips"] = float(r[key])
        rec["steps"] = r.get("steps")
        if isinstance(r.get("settings"), dict):
            rec["settings"] = r["settings"]
        if pt:
            note = r.get("note", "")
            if isnum(r.get("compile_s")):
                rec["compile_s"] = r["compile_s"]
        else:
            rec["backend"] = setup_line(path)
            if "cuda:" not in rec["backend"]:
                print("  %s FAILED: it did not train on the GPU (%s)" % (label, rec["backend"] or "no set-up line"))
                return 1
            got = r.get("amp")
            if isinstance(got, str):
                rec["amp_reported"] = got
                if amp != "default" and got != amp:
                    print("  %s FAILED: asked for --amp %s, its JSON line says amp %s" % (label, amp, got))
                    return 1
            note = "%s steps, the first 3 untimed; all steps %.1f images/s%s" % (
                r.get("steps", "?"), r.get("images_per_s") or 0,
                "; amp %s" % got if isinstance(got, str) else "")
        print("  %s %10.1f images/s  (%s)" % (label, rec["ips"], note))
    elif part == "loadbench":
        if r is None or not isnum(r.get("images_per_s")) or r["images_per_s"] <= 0:
            print("  %s FAILED: no JSON line with images_per_s at the end of its output" % label)
            return 1
        rec["ips"] = float(r["images_per_s"])
        rec["workers"] = r.get("workers")
        for l in open(path, errors="replace"):
            if l.startswith("verdict:"):
                rec["verdict"] = l.split(":", 1)[1].strip()
        print("  %s %10.1f images/s  (%s workers, %s)" % (label, rec["ips"], r.get("workers", "?"),
                                                         rec.get("verdict", "no verdict line")))
    else:
        if r is None or not isnum(r.get("time_s")) or not isnum(r.get("val_acc")):
            print("  %s FAILED: no JSON line with time_s and val_acc at the end of its output" % label)
            return 1
        best = r.get("best_val_acc") if isnum(r.get("best_val_acc")) else r["val_acc"]
        rec.update(time_s=r["time_s"], val_acc=r["val_acc"], epochs=r.get("epochs", 0),
                   images_per_s=r.get("images_per_s") or 0,
                   reached=bool(r.get("reached")) or max(r["val_acc"], best) >= float(target) - 1e-9)
        if way == "rt":
            rec["backend"] = setup_line(path)
        print("  %s %7.1f s, %s epoch(s), test acc %.4f, %s  (training %.0f images/s)" % (
            label, rec["time_s"], rec["epochs"], rec["val_acc"],
            "target reached" if rec["reached"] else "target NOT reached", rec["images_per_s"]))
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0

def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def steps(results, speeds, gpu, way, model, amp, batch, window, scale, fallback):
    """Prints the timed steps of one compute measurement: window x scale seconds at
    the speed this way measured in the runs before (the median), else in the last
    invocation on this GPU and batch (speeds), else GUESS's; fallback (already
    scaled) for a model GUESS lacks. At least 5."""
    rs = [r for r in load(results) if r.get("part") == "compute"]
    before = (load_json(speeds) or {}).get(gpu, {}).get(str(batch), {})
    ips = None
    # torch.compile's window at eager's speed until it has a speed of its own
    for w in (way, "pt") if way == "ptc" else (way,):
        c = cell(rs, way=w, model=model, amp=amp)
        ips = c[0] if c else before.get("%s %s %s" % (w, model, amp))
        if ips is not None:
            break
    if ips is None and model in GUESS:
        ips = GUESS[model][("off", "bf16", "fp16").index(amp)]
    if ips is None:
        print(max(5, int(fallback)))
        return 0
    print(max(5, int(round(float(window) * float(scale) * float(ips) / int(batch)))))
    return 0

def speeds(results, path, gpu, batch):
    """Keeps each compute way's median images/s in path, by GPU and each model's batch (batch: where a
    record has none), for the next invocation; the folder part's ways as "folder WAY MODEL AMP"."""
    s = load_json(path) or {}
    groups = {}
    for r in load(results):
        if r.get("part") in ("compute", "folder") and "ips" in r:
            key = "%s%s %s %s" % ("folder " if r["part"] == "folder" else "", r["way"], r["model"], r["amp"])
            groups.setdefault((str(r.get("batch", batch)), key), []).append(r["ips"])
    for (b, k), xs in groups.items():
        s.setdefault(gpu, {}).setdefault(b, {})[k] = statistics.median(xs)
    with open(path, "w") as f:
        json.dump(s, f, indent=1, sort_keys=True)
    return 0

def peaks_of(gpu):
    for name, test, p in PEAKS:
        if test(gpu or ""):
            return name, {"fp32": p[0], "tf32": p[1], "16": p[2]}
    return None, None

def cell(rs, **kv):
    """(median, min, max) of the matching records' ips, or None."""
    xs = [r["ips"] for r in rs if "ips" in r and all(r.get(k) == v for k, v in kv.items())]
    return med_lo_hi(xs) if xs else None

def fmt(c):
    return ("%.1f" % c[0], "%.1f - %.1f" % (c[1], c[2])) if c else ("n/a", "")

# A row's ways (its key in the row, the way measured) by setting: the fp32 rows' "tf32" and "strict",
# None for bf16/fp16.
PLAIN_WAYS = (("rt", "rt"), ("nd", "rt-nd"), ("eager", "rt-eager"), ("pt", "pt"), ("ptc", "ptc"))
ROW_WAYS = {"tf32": PLAIN_WAYS, "strict": (("rt", "rt-strict"), ("pt", "pt-strict")), None: PLAIN_WAYS}

def row_label(amp, setting):
    return {"tf32": "fp32 (TF32)", "strict": "fp32 strict"}.get(setting, amp)

def profile_idle(profile):
    """{(model, amp): ringtrain's idle share of its step} from a profile comparison file."""
    out = {}
    doc = load_json(profile) if profile else None
    for p in (doc or {}).get("pairs", []):
        rt = p.get("ringtrain") or {}
        idle, step = (rt.get("categories") or {}).get("idle"), rt.get("step_ms")
        if isnum(idle) and isnum(step) and step > 0:
            out[(p.get("model"), p.get("amp"))] = idle / step
    return out

def verdict(g):
    """A goal's result: PASS when every pair was measured and passed, n/a when none was measured."""
    return ("PASS" if g["passed"] == g["measured"] == g["pairs"] else "MISS") if g["measured"] else "n/a"

def summarise(doc, profile=""):
    """The rows of the compute tables and the goals, from a results document."""
    rs = [r for r in doc.get("records", []) if r.get("part") == "compute"]
    flops = doc.get("flops", {})
    _, pk = peaks_of(doc.get("gpu"))
    idle = profile_idle(profile)
    strict = "strict" in doc.get("extras", ["strict"])
    rows = []
    for m in doc["models"]:
        f = flops.get(m)
        for a in doc["amps"]:
            for setting in ((("tf32", "strict") if strict else ("tf32",)) if a == "off" else (None,)):
                row = {"model": m, "amp": a, "setting": setting, "label": row_label(a, setting),
                       "batch": doc.get("batches", {}).get(m, doc.get("batch")),
                       "train_flops_per_image": f, "ways": {}, "skipped": {}}
                peak = pk[{"tf32": "tf32", "strict": "fp32"}.get(setting, "16")] if pk else None
                row["peak_tflops"] = peak
                for key, way in ROW_WAYS[setting]:
                    mine = [r for r in rs if (r.get("model"), r.get("amp"), r.get("way")) == (m, a, way)]
                    skip = [r["skipped"] for r in mine if r.get("skipped")]
                    if skip:
                        row["skipped"][key] = skip[0]
                    ips = [r["ips"] for r in mine if "ips" in r]
                    if not ips:
                        continue
                    med, lo, hi = med_lo_hi(ips)
                    w = {"way": way, "median": med, "min": lo, "max": hi, "runs": len(ips)}
                    if f:
                        w["tflops"] = med * f / 1e12
                        if peak:
                            w["share_of_peak"] = w["tflops"] / peak
                    cs = [r["compile_s"] for r in mine if isnum(r.get("compile_s"))]
                    if cs:
                        w["compile_s"] = med_lo_hi(cs)
                    settings = [r["settings"] for r in mine if isinstance(r.get("settings"), dict)]
                    if settings:
                        w["settings"] = settings[0]
                    row["ways"][key] = w
                ws = row["ways"]
                if "rt" in ws and "pt" in ws:
                    row["ratio_eager"] = ws["rt"]["median"] / ws["pt"]["median"]
                    row["goal_ratio"] = "PASS" if row["ratio_eager"] >= RATIO_GOAL else "MISS"
                if "rt" in ws and "ptc" in ws:
                    row["ratio_compile"] = ws["rt"]["median"] / ws["ptc"]["median"]
                if "rt" in ws and "nd" in ws:
                    row["determinism_cost"] = ws["rt"]["median"] / ws["nd"]["median"]
                if "rt" in ws and "eager" in ws:
                    row["graph_gain"] = ws["rt"]["median"] / ws["eager"]["median"]
                if m in WIDE and a in ("bf16", "fp16"):
                    row["goal_tflops"] = ("PASS" if ws["rt"].get("tflops", 0) >= TFLOPS_GOAL else "MISS") \
                        if "rt" in ws and "tflops" in ws["rt"] else None
                if (m, a) in idle:
                    row["idle_share"] = idle[(m, a)]
                    row["host_bound"] = idle[(m, a)] > HOST_BOUND_IDLE
                rows.append(row)
    goals = {}
    ratio_rows = [r for r in rows if r.get("goal_ratio")]
    g = {"goal": "ringtrain >= %.1fx PyTorch eager at every model x precision, fp32 at both settings" % RATIO_GOAL,
         "pairs": len(rows), "measured": len(ratio_rows),
         "passed": sum(r["goal_ratio"] == "PASS" for r in ratio_rows),
         "misses": ["%s %s" % (r["model"], r["label"]) for r in ratio_rows if r["goal_ratio"] == "MISS"],
         "host_bound": ["%s %s" % (r["model"], r["label"]) for r in ratio_rows
                        if r["goal_ratio"] == "MISS" and r.get("host_bound")]}
    g["result"] = verdict(g)
    if "off" in doc["amps"] and not strict:
        g["note"] = "fp32 strict not measured (--extras)"
    goals["ratio"] = g
    tf_rows = [r for r in rows if r["model"] in WIDE and r["amp"] in ("bf16", "fp16")]
    done = [r for r in tf_rows if r.get("goal_tflops")]
    g = {"goal": "resnet9 and wrn-16-4 at bf16/fp16 >= %.0f TFLOP/s" % TFLOPS_GOAL, "pairs": len(tf_rows),
         "measured": len(done), "passed": sum(r["goal_tflops"] == "PASS" for r in done),
         "misses": ["%s %s (%.1f)" % (r["model"], r["label"], r["ways"]["rt"]["tflops"]) for r in done
                    if r["goal_tflops"] == "MISS"]}
    g["result"] = verdict(g)
    if not flops and any("rt" in r["ways"] for r in tf_rows):
        g["note"] = "no FLOP count: no python3 with torch to count them"
    goals["tflops"] = g
    r50 = [r for r in rows if r["model"] == R50 and r["amp"] == "bf16"]
    done = [r for r in r50 if "ratio_eager" in r and "ratio_compile" in r]
    g = {"goal": "%s bf16: ringtrain >= %.1fx PyTorch eager and >= %.1fx torch.compile"
                 % (R50, RATIO_GOAL, R50_COMPILE_GOAL), "pairs": len(r50), "measured": len(done),
         "passed": sum(r["ratio_eager"] >= RATIO_GOAL and r["ratio_compile"] >= R50_COMPILE_GOAL for r in done),
         "misses": ["%.2fx eager, %.2fx compile" % (r["ratio_eager"], r["ratio_compile"]) for r in done
                    if not (r["ratio_eager"] >= RATIO_GOAL and r["ratio_compile"] >= R50_COMPILE_GOAL)]}
    g["result"] = verdict(g)
    if r50 and not done:
        got = r50[0]
        g["note"] = "needs ringtrain, PyTorch eager and torch.compile (%s)" % (
            "; ".join("torch.compile: %s" % v for v in got["skipped"].values()) or "a way without a figure")
    elif done:
        g["detail"] = "%.2fx eager, %.2fx torch.compile" % (done[0]["ratio_eager"], done[0]["ratio_compile"])
    goals["resnet50"] = g
    return rows, goals

def results_json(results, flops_path, out, gpu, host, batch, runs, window, scale, models, amps, extras,
                 pytorch, profile="", batches=""):
    """Writes the compute part's results document to out: every record (with the settings it ran with),
    the FLOPs, the GPU's peaks, the rows with medians, ratios and TFLOP/s, and the goals."""
    flops = {}
    try:
        for l in open(flops_path):
            if l.strip():
                x = json.loads(l)
                flops[x["model"]] = x["train_flops_per_image"]
    except OSError:
        pass
    name, pk = peaks_of(gpu)
    doc = {"gpu_compute": 1, "gpu": gpu, "host": host, "batch": int(batch), "runs": int(runs),
           "window_s": float(window), "steps_scale": float(scale), "models": models.split(","),
           "batches": {m: int(b) for m, _, b in (x.rpartition(":") for x in batches.split(",") if x)},
           "amps": amps.split(","), "extras": [] if extras == "none" else extras.split(","), "pytorch": pytorch,
           "flops": flops, "peaks_tflops": pk, "peaks_of": name,
           "peaks_source": "NVIDIA datasheets, dense (H100/H200, A100, L40S)",
           "records": [r for r in load(results) if r.get("part") == "compute"]}
    doc["rows"], doc["goals"] = summarise(doc, profile)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0

def tf_cell(w):
    if not w or "tflops" not in w:
        return "n/a"
    return "%.1f (%.1f %%)" % (w["tflops"], 100 * w["share_of_peak"]) if "share_of_peak" in w \
        else "%.1f" % w["tflops"]

def describe(s):
    """A result's settings, briefly."""
    keys = (("cudnn_allow_tf32", "cudnn.allow_tf32"), ("matmul_allow_tf32", "matmul.allow_tf32"),
            ("float32_matmul_precision", "float32_matmul_precision"), ("cudnn_benchmark", "cudnn.benchmark"),
            ("cudnn_deterministic", "cudnn.deterministic"), ("autocast_dtype", "autocast"),
            ("channels_last", "channels_last"), ("grad_scaler", "GradScaler"), ("compile", "compile"))
    if "torch" in s:
        return ", ".join("%s %s" % (n, s.get(k)) for k, n in keys if k in s)
    return ", ".join("%s %s" % kv for kv in s.items() if not isinstance(kv[1], (dict, list)))

def compute(path, profile=""):
    """Prints the compute part's tables from a results document (results_json's)."""
    doc = load_json(path)
    if not isinstance(doc, dict) or doc.get("gpu_compute") != 1:
        print("%s: not a compute results file (results_json's)" % path)
        return 1
    rows, goals = summarise(doc, profile)
    name, pk = peaks_of(doc.get("gpu"))
    print("| model | precision | batch | ringtrain images/s | min - max | PyTorch eager images/s | min - max "
          "| ringtrain : eager | goal >= %.1fx | torch.compile images/s | compile s | ringtrain : compile | note |"
          % RATIO_GOAL)
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        ws = r["ways"]
        rt, pt, pc = (fmt((ws[k]["median"], ws[k]["min"], ws[k]["max"]) if k in ws else None)
                      for k in ("rt", "pt", "ptc"))
        comp = ("%.1f" % ws["ptc"]["compile_s"][0]) if "ptc" in ws and "compile_s" in ws["ptc"] else \
            ("skipped" if "ptc" in r["skipped"] else "n/a")
        notes = []
        if r.get("host_bound"):
            notes.append("host-bound: GPU idle %.0f %% of ringtrain's step (profile)" % (100 * r["idle_share"]))
        elif "idle_share" in r:
            notes.append("GPU idle %.0f %% of ringtrain's step (profile)" % (100 * r["idle_share"]))
        if "ptc" in r["skipped"] and "ptc" not in ws:
            notes.append("torch.compile: %s" % r["skipped"]["ptc"])
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["label"], r.get("batch") or "n/a", rt[0], rt[1], pt[0], pt[1],
            "%.2f" % r["ratio_eager"] if "ratio_eager" in r else "n/a", r.get("goal_ratio") or "n/a",
            pc[0], comp, "%.2f" % r["ratio_compile"] if "ratio_compile" in r else "n/a", "; ".join(notes)))
    print()
    print("TFLOP/s (%% of the %s's dense peak for the precision: fp32 (TF32) rows against TF32, fp32 strict "
          "against fp32, bf16/fp16 against 16-bit tensor cores%s) and what determinism costs:"
          % (name or "GPU", "" if pk else "; n/a: no peak known for %s" % (doc.get("gpu") or "this GPU")))
    print()
    print("| model | precision | train GFLOP/image | peak TFLOP/s | ringtrain | ringtrain nondeterministic "
          "| PyTorch eager | torch.compile | deterministic : nondeterministic | goal >= %.0f TFLOP/s |" % TFLOPS_GOAL)
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ws, f = r["ways"], r["train_flops_per_image"]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["label"], "%.3f" % (f / 1e9) if f else "n/a",
            "%g" % r["peak_tflops"] if r["peak_tflops"] else "n/a", tf_cell(ws.get("rt")), tf_cell(ws.get("nd")),
            tf_cell(ws.get("pt")), tf_cell(ws.get("ptc")),
            "%.2fx" % r["determinism_cost"] if "determinism_cost" in r else "n/a",
            r.get("goal_tflops") or ("n/a" if r["model"] in WIDE and r["amp"] != "off" else "")))
    print()
    gains = ["%s %s %.2fx" % (r["model"], r["label"], r["graph_gain"]) for r in rows if "graph_gain" in r]
    if gains:
        print("CUDA graphs (ringtrain's default) : op by op (--cuda-graph off), images/s: " + "; ".join(gains))
        print()
    print("Settings each result ran with (all in %s):" % path)
    seen = []
    for r in rows:
        for key, w in sorted(r["ways"].items()):
            s = w.get("settings")
            line = "  %s, %s: %s" % (WAY[w["way"]], r["label"],
                                     describe(s) if s else "no settings in its JSON line")
            if line not in seen:
                seen.append(line)
    for line in seen:
        print(line)
    print()
    print("| goal | result |")
    print("|---|---|")
    for g in (goals["ratio"], goals["tflops"], goals["resnet50"]):
        res = g["result"]
        if g["measured"]:
            res += " (%d of %d pairs" % (g["passed"], g["measured"])
            res += "; %d of %d lack a figure)" % (g["pairs"] - g["measured"], g["pairs"]) \
                if g["measured"] < g["pairs"] else ")"
            if g["misses"]:
                res += "; misses: " + ", ".join(g["misses"])
            elif g.get("detail"):
                res += "; " + g["detail"]
            if g.get("host_bound"):
                res += "; host-bound (GPU idle > %.0f %% of ringtrain's step in the profile), left to the next " \
                       "issue: %s" % (100 * HOST_BOUND_IDLE, ", ".join(g["host_bound"]))
        elif not g["pairs"]:
            res = "n/a (no such pair measured: --models/--amps)"
        elif doc.get("pytorch", "").startswith("PyTorch with CUDA absent") and g is goals["ratio"]:
            res = "n/a (PyTorch with CUDA absent)"
        else:
            res = "n/a (no pair measured)"
        if g.get("note"):
            res += "; %s" % g["note"]
        print("| %s | %s |" % (g["goal"], res))
    return 0

def loader_table(results, models, amp):
    rs = [r for r in load(results) if r["part"] == "loader"]
    print("| model | synthetic images/s | min - max | loader images/s | min - max | input-pipeline cost |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in models.split(","):
        syn, dat = cell(rs, model=m, way="syn"), cell(rs, model=m, way="data")
        cost = "%.1f %%" % (100 * (syn[0] - dat[0]) / syn[0]) if syn and dat else "n/a"
        print("| %s | %s | %s | %s | %s | %s |" % (m, *fmt(syn), *fmt(dat), cost))
    return 0

def headroom_table(results, models, workers):
    rs = load(results)
    lb = cell([r for r in rs if r["part"] == "loadbench"], way="lb")
    verdicts = [r["verdict"] for r in rs if r["part"] == "loadbench" and r.get("verdict")]
    if lb:
        print("loadbench, %s worker(s): %.1f images/s (min - max %.1f - %.1f)" % (workers, *lb))
    else:
        print("loadbench: no run succeeded")
    if verdicts:
        print("its verdict (last run): %s" % verdicts[-1])
    print()
    print("| model | GPU consumes (synthetic images/s) | loader images/s | loader headroom | goal >= 1.0x |")
    print("|---|---:|---:|---:|---|")
    for m in models.split(","):
        syn = cell([r for r in rs if r["part"] == "loader"], model=m, way="syn")
        if syn and lb:
            x = lb[0] / syn[0]
            hr, goal = "%.1fx" % x, "PASS" if x >= 1.0 else "MISS"
        else:
            hr, goal = "n/a", "n/a"
        print("| %s | %s | %s | %s | %s |" % (m, fmt(syn)[0], "%.1f" % lb[0] if lb else "n/a", hr, goal))
    return 0

def tta_table(results, model, target, epochs, pt_present):
    rs = [r for r in load(results) if r["part"] == "tta"]
    target = float(target)
    med = tta_rows(rs, target)
    print()
    print("| goal | result |")
    print("|---|---|")
    res = tta_goal(med, target, epochs)
    if res is None:
        res = "n/a (PyTorch with CUDA absent)" if "rt" in med and pt_present != "1" else "n/a"
    print("| %s time to %.0f %% test accuracy <= PyTorch eager's (PyTorch s / ringtrain s >= 1.0) | %s |" % (
        model, 100 * target, res))
    if "rt" in med and med["rt"][1] == med["rt"][2] and abs(target - 0.94) < 1e-9:
        print()
        print("Context (another recipe, another GPU): ringtrain's median is %.1fx airbench94's 3.83 s on one A100."
              % (med["rt"][0] / 3.83))
    return 0

def folder_label(way):
    return "ringtrain" if way == "frt" else "PyTorch DataLoader num_workers %s" % way.split("-w")[-1]

def folder_add(results, way, model, amp, run, path, wall, batch, metrics):
    """Appends one run of the folder part: ringtrain (way frt: its --json line, and its --metrics epochs
    after the first as the timed part) or PyTorch (fpt-wN: torch_imagefolder.py train's JSON line).
    0 when it holds images/s and the data wait, 1 otherwise."""
    r = last_json(path)
    label = "%-36s %-13s" % (folder_label(way), model)
    rec = {"part": "folder", "way": way, "model": model, "amp": amp, "run": int(run), "batch": int(batch),
           "process_s": float(wall)}
    if way == "frt":
        eps = []
        try:
            eps = [json.loads(l) for l in open(metrics) if l.startswith("{")]
        except (OSError, ValueError):
            pass
        timed = [e for e in eps if isnum(e.get("epoch")) and e["epoch"] >= 2 and isnum(e.get("time_s"))
                 and isnum(e.get("images_per_s")) and isnum(e.get("data_wait_frac")) and e["time_s"] > 0]
        if r is None or not timed:
            print("  %s FAILED: no --json line or no epoch after the first in its --metrics file" % label)
            return 1
        secs = sum(e["time_s"] for e in timed)
        rec.update(ips=sum(e["images_per_s"] * e["time_s"] for e in timed) / secs,
                   wait_frac=sum(e["data_wait_frac"] * e["time_s"] for e in timed) / secs,
                   timed_epochs=len(timed), timed_s=secs, steady_images_per_s=r.get("steady_images_per_s"),
                   workers=None, backend=setup_line(path), amp_reported=r.get("amp"))
        ph = (r.get("profile") or {}).get("phases") or {}
        if isnum((ph.get("data") or {}).get("p50_ms")) and isnum((ph.get("step") or {}).get("p50_ms")):
            rec.update(data_p50_ms=ph["data"]["p50_ms"], step_p50_ms=ph["step"]["p50_ms"])
        if isinstance(r.get("settings"), dict):
            rec["settings"] = r["settings"]
        note = "%d timed epochs, %.1f s; all steps after the first 3: %.1f images/s; amp %s" % (
            len(timed), secs, r.get("steady_images_per_s") or 0, r.get("amp", "?"))
    else:
        if r is None or not isnum(r.get("images_per_s")) or not isnum(r.get("data_wait_frac")):
            print("  %s FAILED: no JSON line with images_per_s and data_wait_frac" % label)
            return 1
        rec.update(ips=r["images_per_s"], wait_frac=r["data_wait_frac"], timed_epochs=r.get("timed_epochs"),
                   timed_s=r.get("seconds"), workers=r.get("workers"), settings=r.get("settings"),
                   cut=r.get("cut_at_max_seconds"), warmup_epoch_s=r.get("warmup_epoch_s"))
        note = "%.2f timed epochs, %.1f s%s" % (r.get("timed_epochs") or 0, r.get("seconds") or 0,
                                                ", clock stopped at --max-seconds" if rec["cut"] else "")
    print("  %s %9.1f images/s end to end, data wait %5.1f %% of the step  (%s)" % (
        label, rec["ips"], 100 * rec["wait_frac"], note))
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0

def folder_epochs(results, speeds, gpu, model, amp, batch, images, seconds):
    """Prints ringtrain's --epochs for the folder part: one untimed epoch, then enough to run `seconds` at the
    speed of the runs before (this invocation's median, else the last invocation's on this GPU and batch,
    else FOLDER_GUESS's); at least 2 timed epochs, at most 100."""
    xs = [r["ips"] for r in load(results) if r.get("part") == "folder" and r["way"] == "frt" and "ips" in r]
    ips = statistics.median(xs) if xs else \
        (load_json(speeds) or {}).get(gpu, {}).get(str(batch), {}).get("folder frt %s %s" % (model, amp))
    if ips is None:
        ips = FOLDER_GUESS.get(model)
    n = 2 if ips is None else max(2, -(-int(float(seconds) * float(ips)) // max(1, int(images))))
    print(1 + min(n, 100))
    return 0

def folder_table(results, out, model, amp, batch, gpu, host, folder, packed, workers, pytorch):
    """Prints the folder part's table and goals; writes its document to out."""
    rs = [r for r in load(results) if r.get("part") == "folder" and "ips" in r]
    ways = ["frt"] + sorted({r["way"] for r in rs if r["way"] != "frt"}, key=lambda w: int(w.split("-w")[-1]))
    print("| way | end-to-end images/s | min - max | data wait, share of the step | min - max | timed epochs "
          "| timed s | runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for w in ways:
        mine = [r for r in rs if r["way"] == w]
        if not mine:
            print("| %s | n/a | | | | | | |" % folder_label(w))
            continue
        ips, wait = med_lo_hi([r["ips"] for r in mine]), med_lo_hi([r["wait_frac"] for r in mine])
        med[w] = {"way": w, "median": ips[0], "min": ips[1], "max": ips[2], "wait_median": wait[0],
                  "wait_min": wait[1], "wait_max": wait[2], "runs": len(mine)}
        ep = statistics.median([r.get("timed_epochs") or 0 for r in mine])
        ts = statistics.median([r.get("timed_s") or 0 for r in mine])
        print("| %s | %.1f | %.1f - %.1f | %.1f %% | %.1f - %.1f %% | %g | %.1f | %d |" % (
            folder_label(w) + (" (%s loader threads)" % workers if w == "frt" else ""), ips[0], ips[1], ips[2],
            100 * wait[0], 100 * wait[1], 100 * wait[2], round(ep, 2), ts, len(mine)))
    pts = [m for w, m in med.items() if w != "frt"]
    best = max(pts, key=lambda m: m["median"]) if pts else None
    goals = {}
    if "frt" in med:
        x = med["frt"]["wait_median"]
        goals["wait"] = {"goal": "ringtrain's data wait <= %.0f %% of the step" % (100 * FOLDER_WAIT_GOAL),
                         "value": x, "result": "PASS" if x <= FOLDER_WAIT_GOAL else "MISS"}
    else:
        goals["wait"] = {"goal": "ringtrain's data wait <= %.0f %% of the step" % (100 * FOLDER_WAIT_GOAL),
                         "result": "n/a"}
    g = {"goal": "ringtrain end to end >= %.1fx PyTorch + DataLoader (its best num_workers)" % FOLDER_RATIO_GOAL}
    if "frt" in med and best:
        g.update(value=med["frt"]["median"] / best["median"], against=best["way"])
        g["result"] = "PASS" if g["value"] >= FOLDER_RATIO_GOAL else "MISS"
    else:
        g["result"] = "n/a (PyTorch with torchvision absent)" if "frt" in med and pytorch.startswith("absent") \
            else "n/a"
    goals["ratio"] = g
    print()
    print("| goal | result |")
    print("|---|---|")
    w = goals["wait"]
    print("| %s | %s |" % (w["goal"], "%.1f %% %s" % (100 * w["value"], w["result"]) if "value" in w else w["result"]))
    print("| %s | %s |" % (g["goal"], "%.2fx %s (against num_workers %s)" % (
        g["value"], g["result"], best["way"].split("-w")[-1]) if "value" in g else g["result"]))
    doc = {"gpu_folder": 1, "gpu": gpu, "host": host, "model": model, "amp": amp, "batch": int(batch),
           "folder": folder, "packed": packed, "ringtrain_workers": int(workers), "pytorch": pytorch,
           "records": rs, "ways": med, "goals": goals}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0

if __name__ == "__main__":
    main({"add": add, "steps": steps, "speeds": speeds, "results-json": results_json, "compute": compute,
          "loader": loader_table, "headroom": headroom_table, "tta": tta_table, "backends": backends,
          "folder-epochs": folder_epochs, "folder": folder_table})
EOF
report() { "$RPY" "$t/report.py" "$@"; }

# --tables-from: an earlier run's compute tables, nothing measured.
if [ -n "$TABLES_FROM" ]; then
    [ -f "$TABLES_FROM" ] || bench_fail "--tables-from $TABLES_FROM: no such file"
    [ -z "$PROFILE_JSON" ] || [ -f "$PROFILE_JSON" ] || bench_fail "--profile-json $PROFILE_JSON: no such file"
    report compute "$TABLES_FROM" "$PROFILE_JSON"
    exit $?
fi

# --- prerequisites: the binary, a GPU, ringtrain training on it ----------------
bench_need_bin " (CUDA toolkit and cuDNN under /usr/local/cuda)" -DRT_CUDA=ON
train_help=$("$RT" train --help 2>&1 || true)
has_opt() { grep -q -- "$1" <<<"$train_help"; }
HAVE_AMP=0 HAVE_TF32=0 HAVE_DET=0 HAVE_PROFILE=0 HAVE_GRAPH=0
has_opt '--amp' && HAVE_AMP=1
has_opt '--tf32' && HAVE_TF32=1
has_opt '--deterministic' && HAVE_DET=1
has_opt '--profile-ops' && HAVE_PROFILE=1
has_opt '--cuda-graph' && HAVE_GRAPH=1
if [ "$ONLY" = profile ] && [ $HAVE_PROFILE = 0 ]; then
    echo "gpu_vs_pytorch: this ringtrain ($RT) has no train --profile-ops: no profile part to run" >&2
    exit 2
fi
gpu_list=
GPU_NAME="none (--device cpu: host times)"
if [ "$DEVICE" = cuda ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu_vs_pytorch: no GPU: nvidia-smi is not installed; this benchmark needs a machine with an NVIDIA GPU" >&2
        echo "  and its driver (bench/train_vs_pytorch.sh compares training on the CPU; --device cpu --only profile" >&2
        echo "  shows the profile part's tables on the CPU)" >&2
        exit 2
    fi
    if ! gpu_list=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1) \
        || [ -z "$gpu_list" ]; then
        echo "gpu_vs_pytorch: no GPU: nvidia-smi lists none${gpu_list:+: $gpu_list}" >&2
        exit 2
    fi
    GPU_NAME=$(echo "$gpu_list" | head -n 1 | cut -d, -f2 | sed 's/^ *//; s/ *$//')
fi

# One step on the device: the binary was built with CUDA, the driver and the GPU
# work, and its JSON line names the default precision (when it has an "amp" field).
if ! "$RT" train --device "$DEVICE" --synthetic-data --model mnist-net --batch-size 8 --steps 1 --json --no-progress \
    >"$t/probe.out" 2>&1; then
    echo "gpu_vs_pytorch: no $( [ "$DEVICE" = cuda ] && echo GPU || echo CPU) for ringtrain: \`$RT train --device $DEVICE --synthetic-data --steps 1\` failed:" >&2
    tail -n 5 "$t/probe.out" | sed 's/^/  /' >&2
    exit 2
fi
DEFAULT_AMP=$(bench_json_field "$RPY" "$t/probe.out" amp)
amp_source="from its --json line"
if [ -z "$DEFAULT_AMP" ]; then
    if [ $HAVE_AMP = 0 ]; then
        DEFAULT_AMP=off
        amp_source="this binary has no --amp: fp32"
    elif [ "$DEVICE" = cpu ]; then
        DEFAULT_AMP=off
        amp_source="no amp field in its --json line: fp32 assumed on the CPU"
    else
        # The documented default: bf16 where the GPU has it (compute capability 8.0 and later).
        cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
        if awk -v c="${cc:-0}" 'BEGIN { exit !(c + 0 >= 8.0) }'; then DEFAULT_AMP=bf16; else DEFAULT_AMP=off; fi
        amp_source="no amp field in its --json line: the documented default for compute capability ${cc:-unknown}"
    fi
fi
rt_amp() { # amp -> the ringtrain options asking for it; 1 when this binary cannot
    amp_args=()
    if [ $HAVE_AMP = 1 ]; then
        amp_args=(--amp "$1")
    elif [ "$1" != off ]; then
        return 1
    fi
}

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
[ -n "$DATA" ] || DATA=$CACHE/synth
[ -n "$PROFILE_JSON" ] || PROFILE_JSON=$CACHE/profile.json
[ -n "$RESULTS_JSON" ] || RESULTS_JSON=$CACHE/compute.json
[ -z "$TRACE_DIR" ] || mkdir -p "$TRACE_DIR"

# PyTorch on the device: --python, else the first python3 whose torch sees it.
PT=0
pt_why=
cands=()
if [ -n "$PT_PY" ]; then
    cands=("$PT_PY")
else
    p=$(command -v python3 || true)
    [ -z "$p" ] || cands+=("$p")
    [ "$p" = /usr/bin/python3 ] || [ ! -x /usr/bin/python3 ] || cands+=(/usr/bin/python3)
fi
for p in "${cands[@]}"; do
    if out=$("$p" "$top/bench/torch_train.py" check --device "$DEVICE" 2>&1); then
        PT=1 PT_PY=$p torch_versions=$out
        break
    fi
    pt_why="$pt_why${pt_why:+; }$p: $(echo "$out" | tail -n 1)"
done
if [ $PT = 0 ]; then
    [ -n "$pt_why" ] || pt_why="no python3 found"
    if [ "$DEVICE" = cuda ]; then torch_versions="PyTorch with CUDA absent ($pt_why)"
    else torch_versions="PyTorch absent ($pt_why)"; fi
fi
# FLOPs per image need torch, any build: the CUDA one, else any python3 with torch.
flops_py=
if [ $PT = 1 ]; then
    flops_py=$PT_PY
else
    for p in "${cands[@]}"; do
        if "$p" "$top/bench/torch_train.py" check >/dev/null 2>&1; then flops_py=$p; break; fi
    done
fi
: >"$t/flops.jsonl"
if [ -n "$flops_py" ] && part_on compute; then
    "$flops_py" "$top/bench/torch_train.py" flops --model "$MODEL_NAMES" >"$t/flops.jsonl" 2>"$t/flops.err" || {
        echo "gpu_vs_pytorch: could not build every model in PyTorch:" >&2
        cat "$t/flops.err" >&2
        exit 2
    }
fi

# --- datasets --------------------------------------------------------------------
if part_on loader; then
    if [ "$DATA" = "$CACHE/synth" ] && [ ! -f "$DATA/manifest.json" ]; then
        bench_dataset --quiet "$CACHE/synth-src" "$DATA" ": 50000 train + 10000 test records" ""
    fi
    if [ ! -f "$DATA/manifest.json" ]; then
        echo "gpu_vs_pytorch: --data $DATA: no manifest.json (a dataset packed with \`ringtrain pack\`)" >&2
        exit 2
    fi
    cat "$DATA"/* >/dev/null 2>&1 || true  # page cache warm for every run
fi
TTA=0
if part_on tta; then
    if [ -n "$CIFAR" ]; then
        TTA=1
        src_id=$(cd "$(dirname "$CIFAR")" && echo "$(pwd)/$(basename "$CIFAR")")
        packed=$CACHE/cifar10
        if [ ! -f "$packed/manifest.json" ] || [ "$(cat "$CACHE/cifar10.source" 2>/dev/null)" != "$src_id" ]; then
            echo "packing $packed from $CIFAR (ringtrain pack)"
            "$RT" pack "$CIFAR" --out "$packed" --force >/dev/null
            echo "$src_id" >"$CACHE/cifar10.source"
        fi
        if ! "$RPY" -c 'import json, sys
m = json.load(open(sys.argv[1]))
sys.exit(0 if m.get("num_classes") == 10 and m["splits"]["train"]["records"] == 50000
         and m["splits"]["test"]["records"] == 10000 else 1)' "$packed/manifest.json" 2>/dev/null; then
            echo "gpu_vs_pytorch: --cifar $CIFAR is not CIFAR-10 (10 classes, 50000 train + 10000 test images)" >&2
            exit 2
        fi
        pt_src=$src_id
        if [ -f "$CIFAR" ]; then  # PyTorch reads the files, not the tarball
            pt_src=$CACHE/cifar10-src
            if [ "$(cat "$pt_src.source" 2>/dev/null)" != "$src_id" ]; then
                echo "unpacking $CIFAR into $pt_src for PyTorch"
                rm -rf "$pt_src" && mkdir -p "$pt_src"
                tar -xf "$CIFAR" -C "$pt_src"
                echo "$src_id" >"$pt_src.source"
            fi
        fi
        cat "$packed"/* >/dev/null 2>&1 || true
    fi
fi

# --- what runs ---------------------------------------------------------------
# rt_model M: ringtrain's model options for a benchmark model name into rt_model_args: NAME@S is NAME on 3xSxS
# synthetic images of 1000 classes (resnet50@224: ImageNet's shape), as bench/torch_train.py reads the name.
rt_model() {
    case $1 in
    *@*) rt_model_args=(--model "${1%@*}" --image-size "${1##*@}" --num-classes 1000) ;;
    *) rt_model_args=(--model "$1") ;;
    esac
}
# Each sets cmd=(...) to the command line of one measurement; 1 (and why=...) when it cannot run.
cmd_compute() { # way model amp steps
    local way=$1 m=$2 a=$3 n=$4
    why=
    case $way in
    rt | rt-nd | rt-strict | rt-eager)
        rt_amp "$a" || { why="this binary has no --amp"; return 1; }
        rt_model "$m"
        cmd=("$RT" train --device cuda --synthetic-data "${rt_model_args[@]}" --batch-size "${mbatch[$m]}" "${amp_args[@]}"
            --steps $((n + 3)) --json --no-progress)
        if [ "$way" = rt-nd ]; then
            [ $HAVE_DET = 1 ] || { why="this binary has no --deterministic"; return 1; }
            cmd+=(--deterministic off)
        elif [ "$way" = rt-strict ]; then
            [ $HAVE_TF32 = 1 ] || { why="this binary has no --tf32"; return 1; }
            cmd+=(--tf32 off)
        elif [ "$way" = rt-eager ]; then
            [ $HAVE_GRAPH = 1 ] || { why="this binary has no --cuda-graph"; return 1; }
            cmd+=(--cuda-graph off)
        fi ;;
    *)
        cmd=("$PT_PY" "$top/bench/torch_train.py" compute --device cuda --amp "$a" --model "$m"
            --batch-size "${mbatch[$m]}" --steps "$n" --warmup 3)
        [ "$way" != pt-strict ] || cmd+=(--tf32 off)
        [ "$way" != ptc ] || cmd+=(--compile) ;;
    esac
}
cmd_loader() { # way model steps: the default precision
    if [ "$1" = syn ]; then
        cmd=("$RT" train --device cuda --synthetic-data --model "$2" --batch-size "$B"
            --steps $(($3 + 3)) --json --no-progress)
    else
        cmd=("$RT" train --device cuda --data "$DATA" --workers "$WORKERS" --model "$2" --batch-size "$B"
            --steps $(($3 + 3)) --json --no-progress)
    fi
}
cmd_tta() { # way seed
    if [ "$1" = rt ]; then
        rt_amp "$DEFAULT_AMP" || return 1
        cmd=("$RT" train --device cuda --data "$packed" --workers "$WORKERS" --model "$TTA_MODEL"
            --batch-size "$TTA_B" --optimizer sgd --lr "$TTA_LR" --momentum 0.9 --nesterov
            --weight-decay "$TTA_WD" --schedule onecycle --warmup-epochs "$TTA_WARMUP"
            --label-smoothing "$TTA_LS" --aug "crop,flip" "${amp_args[@]}" --epochs "$TTA_EPOCHS"
            --target-accuracy "$TARGET" --seed "$2" --no-progress --json)
    else
        cmd=("$PT_PY" "$top/bench/torch_train.py" tta --device cuda --amp "$DEFAULT_AMP" --data "$pt_src"
            --model "$TTA_MODEL" --batch-size "$TTA_B" --lr "$TTA_LR" --nesterov --weight-decay "$TTA_WD"
            --schedule onecycle --warmup-epochs "$TTA_WARMUP" --label-smoothing "$TTA_LS"
            --epochs "$TTA_EPOCHS" --target-accuracy "$TARGET" --seed "$2")
    fi
}
cmd_profile() { # way model amp
    if [ "$1" = rt ]; then
        rt_amp "$3" || return 1
        rt_model "$2"
        cmd=("$RT" train --device "$DEVICE" --synthetic-data --profile-ops "${rt_model_args[@]}" --batch-size "${mbatch[$2]}"
            "${amp_args[@]}" --steps $((PROFILE_WARMUP + PROFILE_STEPS)) --json --no-progress)
    else
        cmd=("$PT_PY" "$top/bench/torch_train.py" profile --device "$DEVICE" --amp "$3" --model "$2"
            --batch-size "${mbatch[$2]}" --steps "$PROFILE_STEPS" --warmup "$PROFILE_WARMUP")
        [ -z "$TRACE_DIR" ] || cmd+=(--trace-out "$TRACE_DIR/torch-$2-$3.json.gz")
    fi
}

if [ "$DEVICE" = cuda ]; then
    echo "== ringtrain training on one GPU vs PyTorch on the same GPU =="
else
    echo "== ringtrain vs PyTorch on the CPU (--device cpu: host times, the tables' format; --only $ONLY) =="
fi
bench_machine
HOST="$(nproc) CPUs, ${cpu:-unknown CPU}, Linux $(uname -r)"
while IFS=, read -r idx name mem drv; do
    [ -n "$idx" ] || continue
    echo "gpu:      GPU$idx:$name,$mem, driver$drv"
done <<<"$gpu_list"
if [ "$DEVICE" = cuda ]; then
    gpu_busy=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
    if [ -n "$gpu_busy" ]; then
        echo "gpu busy: ${gpu_busy%%,*} % utilised,${gpu_busy#*,} MiB in use before the runs"
        if [ "${gpu_busy%%,*}" -gt 10 ] 2>/dev/null; then
            echo "          NOTE: something else is using the GPU; these numbers will be low and noisy"
        fi
    fi
fi
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $("$RT" --version 2>/dev/null | sed -n 's/^  cuda  *//p')"
if [ $PT = 1 ]; then
    echo "          PyTorch: $PT_PY: $torch_versions"
else
    echo "          NOTE: $torch_versions: ringtrain's figures alone"
fi
if part_on compute || part_on loader || part_on tta; then
    echo "settings: $RUNS runs alternated (the order of the ways reverses each run); batch per model:$(for m in "${models[@]}"; do echo -n " $m ${mbatch[$m]}"; done);"
    echo "          the loader part's batch $B; default precision"
    echo "          $DEFAULT_AMP ($amp_source)"
fi
[ $HAVE_AMP = 1 ] || echo "          NOTE: this ringtrain has no --amp option: its bf16/fp16 runs are skipped"
# The loader part trains on DIR's own images (32 px): the NAME@S models are left out of it.
loader_models=()
for m in "${models[@]}"; do [[ $m == *@* ]] || loader_models+=("$m"); done
LOADER_MODELS=$(IFS=,; echo "${loader_models[*]}")
if part_on loader; then
    [ ${#loader_models[@]} -gt 0 ] || bench_fail "--only loader: --models holds only NAME@S models; the loader part trains 32-px ones"
    [ "$LOADER_MODELS" = "$MODEL_NAMES" ] ||
        echo "loader:   NOTE: NAME@S models left out of the loader part (DIR holds 32-px images; --only folder feeds JPEGs)"
fi
declare -A steps  # model -> timed steps of the loader part (and the compute part's fallback)
for m in "${models[@]}"; do
    steps[$m]=$(bench_scaled_steps "$(steps_for "$m")" "$SCALE")
done
if part_on compute; then
    echo "compute:  windows of ~$(awk -v w="$WINDOW" -v f="$SCALE" 'BEGIN {print w * f}') s (--window-s $WINDOW x --steps-scale $SCALE) at the speed"
    echo "          of the run before (the first run: $CACHE/speeds.json, else one H100's figures); 3 untimed"
    echo "          steps first; extras: ${EXTRAS}; results JSON: $RESULTS_JSON"
    [ $HAVE_TF32 = 1 ] || ! extra_on strict || echo "          NOTE: this ringtrain has no --tf32: no strict fp32 row for it"
    [ $HAVE_DET = 1 ] || ! extra_on nondet || echo "          NOTE: this ringtrain has no --deterministic: no nondeterministic way"
fi
if part_on loader; then
    echo -n "loader:   $DATA, $WORKERS loader worker(s); 3 untimed steps, then timed:"
    for m in "${loader_models[@]}"; do echo -n " $m ${steps[$m]}"; done
    echo
fi
if part_on tta && [ $TTA = 1 ]; then
    echo "tta:      $TTA_MODEL on $CIFAR: batch $TTA_B, SGD nesterov lr $TTA_LR one cycle (up over $TTA_WARMUP epochs)"
    echo "          over $TTA_EPOCHS epochs, weight decay $TTA_WD, label smoothing $TTA_LS, crop+flip, until $TARGET"
    echo "          test accuracy, precision $DEFAULT_AMP; ringtrain reads $packed${PT_PY:+, PyTorch $pt_src}"
fi
if part_on profile; then
    echo "profile:  $PROFILE_WARMUP warm-up + $PROFILE_STEPS profiled steps each side, on the $DEVICE; JSON: $PROFILE_JSON"
    [ $HAVE_PROFILE = 1 ] || echo "          NOTE: this ringtrain has no train --profile-ops: the profile part is skipped"
fi

fails=0
declare -A skipped  # "way model amp" -> 1 once a way said it cannot run (torch.compile absent or failing)
measure() { # part way model amp run [batch]
    local rc wall out=$t/$1-$2.out err=$t/$1-$2.err arc=0
    bench_run "$out" "$err"
    report add "$t/results.jsonl" "$1" "$2" "$3" "$4" "$5" "$out" "$wall" "$TARGET" "${6:-$B}" || arc=$?
    if [ "$arc" = 3 ] && [ "$rc" -eq 0 ]; then
        skipped["$2 $3 $4"]=1
    elif [ "$arc" -ne 0 ] || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$err" "$out"
    fi
}
ways_rt_pt() { # run -> rt and pt in this run's order, rt alone without PyTorch
    if [ $PT = 1 ]; then bench_order "$1" rt pt; else echo rt; fi
}
compute_ways() { # run amp -> the compute part's ways, reversed in even runs
    local w=(rt)
    extra_on nondet && w+=(rt-nd)
    extra_on eager && w+=(rt-eager)
    [ "$2" = off ] && extra_on strict && w+=(rt-strict)
    if [ $PT = 1 ]; then
        w+=(pt)
        [ "$2" = off ] && extra_on strict && w+=(pt-strict)
        extra_on compile && w+=(ptc)
    fi
    bench_alternate "$1" "${w[@]}"
}

if part_on compute; then
    declare -A said  # a way that cannot run here, said once
    for i in $(seq "$RUNS"); do
        echo "compute run $i/$RUNS"
        for m in "${models[@]}"; do
            for a in "${amps[@]}"; do
                for w in $(compute_ways "$i" "$a"); do
                    [ -z "${skipped["$w $m $a"]:-}" ] || continue
                    n=$(report steps "$t/results.jsonl" "$CACHE/speeds.json" "$GPU_NAME" "$w" "$m" "$a" "${mbatch[$m]}" \
                        "$WINDOW" "$SCALE" "${steps[$m]}")
                    if cmd_compute "$w" "$m" "$a" "$n"; then
                        measure compute "$w" "$m" "$a" "$i" "${mbatch[$m]}"
                    elif [ -z "${said["$w $why"]:-}" ]; then
                        said["$w $why"]=1
                        echo "  ${w}: skipped ($why)"
                    fi
                done
            done
        done
    done
    report speeds "$t/results.jsonl" "$CACHE/speeds.json" "$GPU_NAME" "$B"
fi
if part_on loader; then
    for i in $(seq "$RUNS"); do
        echo "loader run $i/$RUNS"
        for m in "${loader_models[@]}"; do
            for w in $(bench_order "$i" syn data); do
                cmd_loader "$w" "$m" "${steps[$m]}" && measure loader "$w" "$m" default "$i"
            done
        done
        cmd=("$RT" loadbench "$DATA" --workers "$WORKERS" --batch-size "$B" --epochs 3 --json)
        measure loadbench lb - - "$i"
    done
fi
if [ $TTA = 1 ]; then
    for i in $(seq "$RUNS"); do
        echo "time-to-accuracy run $i/$RUNS (seed $i)"
        for w in $(ways_rt_pt "$i"); do
            if cmd_tta "$w" "$i"; then
                measure tta "$w" "$TTA_MODEL" "$DEFAULT_AMP" "$i"
            else
                echo "  ringtrain: skipped (precision $DEFAULT_AMP needs --amp, which this binary lacks)"
            fi
        done
    done
fi
# --- the folder part: a JPEG folder, packed, fed to ResNet-50 at 224 px on both sides ------------------
if part_on folder; then
    FOLDER_AMP=bf16
    fdir=$CACHE/imagefolder-${FOLDER_CLASSES}x${FOLDER_PER_CLASS}
    fpacked=$fdir-packed
    FOLDER_JSON=$CACHE/folder.json
    gen_py=${PT_PY:-$RPY}
    echo
    echo "Loader-fed training from a JPEG folder: $FOLDER_NAME (batch $FOLDER_B, $FOLDER_AMP), ringtrain with"
    echo "$FOLDER_WORKERS loader threads against PyTorch ImageFolder + DataLoader (num_workers $TORCH_WORKERS)"
    if [ ! -d "$fdir" ]; then
        "$gen_py" -c 'import numpy, PIL' 2>/dev/null ||
            bench_fail "--only folder: $gen_py lacks numpy or Pillow (bench/make_image_folder.py needs them)"
        echo "making $fdir ($FOLDER_CLASSES classes x $FOLDER_PER_CLASS JPEGs, bench/make_image_folder.py --jobs $(nproc))"
        t0=$EPOCHREALTIME
        "$gen_py" "$top/bench/make_image_folder.py" "$fdir" --classes "$FOLDER_CLASSES" --per-class "$FOLDER_PER_CLASS" \
            --jobs "$(nproc)" --force >"$t/mkfolder.out" 2>&1 || { cat "$t/mkfolder.out" >&2; bench_fail "making $fdir failed"; }
        sed -n 's/^\(folder\|files\): */  /p' "$t/mkfolder.out"
        echo "  generation: $(awk -v s="$(bench_seconds "$t0" "$EPOCHREALTIME")" 'BEGIN { printf "%.1f", s }') s"
        rm -rf "$fpacked"
    fi
    if [ ! -f "$fpacked/manifest.json" ]; then
        echo "packing $fpacked (ringtrain pack --codec jpeg --max-side 512)"
        t0=$EPOCHREALTIME
        "$RT" pack "$fdir" --out "$fpacked" --codec jpeg --max-side 512 --force >"$t/pack.out" 2>&1 ||
            { cat "$t/pack.out" >&2; bench_fail "packing $fdir failed"; }
        sed 's/^/  /' "$t/pack.out" | tail -n 2
        echo "  pack: $(awk -v s="$(bench_seconds "$t0" "$EPOCHREALTIME")" 'BEGIN { printf "%.1f", s }') s"
    fi
    FOLDER_IMAGES=$("$RPY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["splits"]["train"]["records"])' \
        "$fpacked/manifest.json")
    echo "folder:   $fdir ($FOLDER_IMAGES JPEGs) and $fpacked, both read once now (page cache warm for both sides)"
    cat "$fpacked"/* >/dev/null 2>&1 || true
    find "$fdir" -type f -exec cat {} + >/dev/null 2>&1 || true
    PT_FOLDER=0
    folder_pt_why="absent: no python3 whose torch runs on the $DEVICE"
    if [ $PT = 1 ]; then
        if out=$("$PT_PY" "$top/bench/torch_imagefolder.py" check 2>&1); then
            PT_FOLDER=1 folder_pt_why="$out"
        else
            folder_pt_why="absent: torchvision or Pillow missing for $PT_PY ($(echo "$out" | tail -n 1))"
            echo "          NOTE: PyTorch side skipped: $folder_pt_why"
        fi
    fi
    echo "          each run: ringtrain --epochs E (1 untimed, then >= 2 timed, E sized to >= ${FOLDER_SECONDS} s at"
    echo "          the last speed), PyTorch: 1 untimed epoch, then whole epochs until >= ${FOLDER_SECONDS} s and 2 epochs"
    echo "          (clock stopped at 3x that); results JSON: $FOLDER_JSON"
    folder_ways() { # run -> the ways, reversed in even runs
        local w=(frt) n
        if [ $PT_FOLDER = 1 ]; then for n in "${torch_workers[@]}"; do w+=("fpt-w$n"); done; fi
        bench_alternate "$1" "${w[@]}"
    }
    max_s=$(awk -v s="$FOLDER_SECONDS" 'BEGIN { print 3 * s }')
    for i in $(seq "$RUNS"); do
        echo "folder run $i/$RUNS"
        for w in $(folder_ways "$i"); do
            if [ "$w" = frt ]; then
                e=$(report folder-epochs "$t/results.jsonl" "$CACHE/speeds.json" "$GPU_NAME" "$FOLDER_NAME" \
                    "$FOLDER_AMP" "$FOLDER_B" "$FOLDER_IMAGES" "$FOLDER_SECONDS")
                rm -f "$t/folder-metrics.jsonl"
                cmd=("$RT" train --device "$DEVICE" --data "$fpacked" --model "${FOLDER_NAME%@*}" --image-size "$FOLDER_S"
                    --amp "$FOLDER_AMP" --batch-size "$FOLDER_B" --workers "$FOLDER_WORKERS" --epochs "$e"
                    --metrics "$t/folder-metrics.jsonl" --json --no-progress)
            else
                cmd=("$PT_PY" "$top/bench/torch_imagefolder.py" train --data "$fdir" --model "${FOLDER_NAME%@*}"
                    --image-size "$FOLDER_S" --batch-size "$FOLDER_B" --workers "${w#fpt-w}" --device "$DEVICE"
                    --amp "$FOLDER_AMP" --seconds "$FOLDER_SECONDS" --min-epochs 2 --max-seconds "$max_s")
            fi
            measure folder "$w" "$FOLDER_NAME" "$FOLDER_AMP" "$i" "$FOLDER_B" # its ringtrain --metrics: folder-metrics.jsonl
        done
    done
    report speeds "$t/results.jsonl" "$CACHE/speeds.json" "$GPU_NAME" "$FOLDER_B"
fi

PROFILED_JSON=  # the profile part's JSON once it ran: its idle names host-bound pairs in the compute table
# The profile part's pairs, --models x --amps: first those that trailed PyTorch eager in the last table
# (docs/PERFORMANCE.md: the wide models at 16 bits, the small ones in fp32), so that a run cut short by a
# time limit (the GPU kit gives this part what is left) has profiled the most telling ones; then the rest
# in --models x --amps order.
profile_pairs() {
    local first="resnet9:bf16 wrn-16-4:bf16 resnet9:fp16 wrn-16-4:fp16 resnet18:off mnist-net:off" p q
    local all=() out=()
    for m in "${models[@]}"; do for a in "${amps[@]}"; do all+=("$m:$a"); done; done
    for p in $first; do for q in "${all[@]}"; do [ "$q" != "$p" ] || out+=("$q"); done; done
    for q in "${all[@]}"; do case " $first " in *" $q "*) ;; *) out+=("$q") ;; esac; done
    echo "${out[@]}"
}

profile_side() { # way: runs cmd (cmd_profile's) into $t/profile-WAY.out; failed=1 when it fails
    local rc wall
    bench_run "$t/profile-$1.out" "$t/profile-$1.err"
    [ "$rc" = 0 ] || { failed=1; bench_show_failure "$rc" "$t/profile-$1.err" "$t/profile-$1.out"; }
}

if part_on profile && [ $HAVE_PROFILE = 1 ]; then
    # Each pair's tables as soon as it is measured, and the JSON rewritten after it: a run cut short
    # keeps what it finished.
    rm -f "$PROFILE_JSON"
    PROFILED_JSON=$PROFILE_JSON
    echo
    echo "Per-op profile, ringtrain beside PyTorch eager ($PROFILE_WARMUP + $PROFILE_STEPS steps each, on the $DEVICE; ms per step):"
    for pair in $(profile_pairs); do
        m=${pair%%:*} a=${pair#*:}
        rt_out='' pt_out='' failed=0
        if cmd_profile rt "$m" "$a"; then
            rt_out=$t/profile-rt.out
            profile_side rt
        else
            echo "  ringtrain $m $a: skipped (this binary has no --amp)"
        fi
        if [ $PT = 1 ]; then
            pt_out=$t/profile-pt.out
            cmd_profile pt "$m" "$a"
            profile_side pt
        fi
        # the pair's tables whatever failed (a side without a profile says why); a failure counts once
        "$RPY" "$top/bench/op_profile.py" add --json "$PROFILE_JSON" --gpu "$GPU_NAME" --host "$HOST" \
            --model "$m" --amp "$a" --batch "${mbatch[$m]}" ${rt_out:+--rt "$rt_out"} ${pt_out:+--pt "$pt_out"} || failed=1
        fails=$((fails + failed))
    done
fi

if part_on compute || part_on loader || part_on tta; then
    echo
    echo "Medians of $RUNS runs, batch per model:$(for m in "${models[@]}"; do echo -n " $m ${mbatch[$m]}"; done); $GPU_NAME;"
    echo "PyTorch: ${PT_PY:-absent}."
    report backends "$t/results.jsonl"
fi
if part_on compute; then
    report results-json "$t/results.jsonl" "$t/flops.jsonl" "$RESULTS_JSON" "$GPU_NAME" "$HOST" "$B" "$RUNS" \
        "$WINDOW" "$SCALE" "$MODEL_NAMES" "$AMPS" "$EXTRAS" "$torch_versions" "$PROFILED_JSON" "$MODEL_BATCHES"
    echo
    echo "Compute only (synthetic data on the GPU): training images/s; TFLOP/s = images/s x train GFLOP/image"
    echo "(3 x 2 x forward multiply-adds of conv + linear layers, from the PyTorch model). Results JSON: $RESULTS_JSON"
    echo
    report compute "$RESULTS_JSON" "$PROFILED_JSON"
fi
if part_on loader; then
    echo
    echo "Real loader against synthetic data, ringtrain, default precision ($DEFAULT_AMP): the same step fed from"
    echo "$DATA ($WORKERS loader worker(s)); input-pipeline cost = (synthetic - loader) / synthetic."
    echo
    report loader "$t/results.jsonl" "$LOADER_MODELS" "$DEFAULT_AMP"
    echo
    echo "Loader headroom: \`ringtrain loadbench\` (no compute) against what the GPU consumes (synthetic"
    echo "images/s above); >= 1.0x: the loader can feed the GPU."
    echo
    report headroom "$t/results.jsonl" "$LOADER_MODELS" "$WORKERS"
fi
if part_on tta; then
    echo
    if [ $TTA = 1 ]; then
        echo "Time to accuracy: $TTA_MODEL on CIFAR-10 ($CIFAR), the recipe above, precision $DEFAULT_AMP;"
        echo "time_s of each run (wall, data read and evals included); process wall adds process start-up"
        echo "(PyTorch: import torch)."
        echo
        report tta "$t/results.jsonl" "$TTA_MODEL" "$TARGET" "$TTA_EPOCHS" "$PT"
    else
        echo "Time to accuracy: skipped (no --cifar PATH: it needs the real CIFAR-10, the binary or python"
        echo "version, e.g. --cifar ~/Downloads/cifar-10-python.tar.gz)."
    fi
    echo
    echo "Published reference: airbench94 (K. Jordan, 2024) reaches 94 % on CIFAR-10 in 3.83 s on one A100"
    echo "(3.29 s with torch.compile); the DAWNBench ResNet-9 (D. Page, 2018) in 79 s on one V100."
fi
if part_on folder; then
    echo
    echo "Loader-fed training, $FOLDER_NAME batch $FOLDER_B $FOLDER_AMP on the $DEVICE ($GPU_NAME), from $fdir:"
    echo "end-to-end images/s over the timed epochs (ringtrain: its --metrics epochs after the first; PyTorch: whole"
    echo "epochs after an untimed one, each loss read one step late, as ringtrain reads its own); data wait = time"
    echo "waiting for the next batch / step time (ringtrain: its epochs' data_wait_frac; PyTorch: time in the"
    echo "DataLoader's next())."
    echo
    report folder "$t/results.jsonl" "$FOLDER_JSON" "$FOLDER_NAME" "$FOLDER_AMP" "$FOLDER_B" "$GPU_NAME" "$HOST" \
        "$fdir" "$fpacked" "$FOLDER_WORKERS" "$folder_pt_why"
fi
if [ -n "$PROFILED_JSON" ]; then
    echo
    "$RPY" "$top/bench/op_profile.py" summary --json "$PROFILE_JSON" || true
    echo "Profile JSON (ringtrain report $PROFILE_JSON draws it): $PROFILE_JSON"
fi
bench_finish $fails
