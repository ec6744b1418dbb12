#!/usr/bin/env bash
# python_gpu.sh - the Python package on a GPU machine that has PyTorch with CUDA but none of our Debian
# libraries: runs bench/python_loader.py --device cuda (ringtrain.Loader against DataLoader + pin_memory
# and the in-memory tensor idiom) and the converted ResNet-18 script both ways with --device cuda.
#
# Usage: bench/python_gpu.sh KIT_DIR [SECONDS] [PARTS]
#   KIT_DIR  a folder with python/ringtrain/ (the package, its _ringtrain.abi3.so built on Debian 12) and
#            lib/ (the Debian libraries it links, plain or .xz), as the GPU kit in .gpu/ holds them once
#            build/python has been copied into it.
#   SECONDS  time for the whole script (default 300); each part gets a share and is stopped at its end.
#   PARTS    comma-separated, default check,loader,example: `check` bench/python_gpu_check.py (device="cuda"
#            batches against device="cpu" ones), `loader` python_loader.py (its options from RT_PYLOADER_ARGS,
#            default "--device cuda --runs 3 --seconds 1.5"), `example` the ResNet-18 script.
#            Two more, not in the default list (each starts Lightning or compiles models: a minute or two):
#            `lightning` python/examples/cifar10_lightning_ddp.py (ringtrain.Loader from a LightningDataModule) on
#            a synthetic CIFAR-10 of 10000 records, 2 epochs as Trainer(accelerator="cpu", devices=2,
#            strategy="ddp") and as Trainer(accelerator="gpu", devices=1), each with --coverage --json (every
#            image once per epoch across the ranks, the figures, both ranks' parameter digests); it fails when
#            the example fails, and says so and passes when this python has no Lightning.
#            `compile` bench/python_compile_check.py: a torch.compile'd model fed by the Loader (uint8; normalize;
#            mark_dynamic; normalize + channels_last + bfloat16) over 2 epochs with and without a short last batch;
#            fails when it compiles more graphs than allowed (1, or 2 with a short last batch), i.e. per batch.
#            Their shares of SECONDS assume they run by themselves: `python_gpu.sh KIT 300 lightning,compile`.
# Figures go to stdout; the script exits non-zero when a part fails (not when a goal is missed).
set -u
kit=$(cd "${1:?usage: python_gpu.sh KIT_DIR [SECONDS]}" && pwd)
budget=${2:-300}
parts=,${3:-check,loader,example},
root=$(cd "$(dirname "$0")/.." && pwd)
py=
for p in /opt/torch/.venv/bin/python3 "$(command -v python3)" /usr/bin/python3; do
    [ -x "$p" ] && "$p" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && { py=$p; break; }
done
[ -n "$py" ] || { echo "python_gpu: no python3 with a CUDA torch here"; exit 2; }
work=$(mktemp -d /tmp/rt-pygpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib"

# The module's libraries this machine lacks, from the kit (only those: the machine's own go first).
mod=$kit/python/ringtrain/_ringtrain.abi3.so
for _ in 1 2 3 4 5 6; do
    missing=$(LD_LIBRARY_PATH=$work/lib ldd "$mod" 2>/dev/null | awk '/not found/ {print $1}')
    [ -z "$missing" ] && break
    for so in $missing; do
        if [ -e "$kit/lib/$so" ]; then ln -sf "$kit/lib/$so" "$work/lib/$so"
        elif [ -e "$kit/lib/$so.xz" ]; then
            "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                "$kit/lib/$so.xz" "$work/lib/$so"
        else echo "python_gpu: $so is needed by the module and neither here nor in the kit"; fi
    done
done
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$kit/python
echo "== python_gpu: $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))')"
"$py" -c 'import ringtrain; print("ringtrain", ringtrain.__version__, "from", ringtrain.__file__)' || exit 1
echo "libraries from the kit: $(ls "$work/lib" | paste -sd' ')"
nproc_=$(nproc)
rc=0
part() {  # part SECONDS CMD...: runs CMD with a time limit, prints its status
    local t=$1; shift
    echo "== $*"
    timeout "$t" "$@"
    local r=$?
    echo "== exit $r"
    [ $r -eq 0 ] || rc=1
}
[[ $parts == *,check,* ]] && part $((budget * 15 / 100)) "$py" "$root/bench/python_gpu_check.py" "$work/check"
[[ $parts == *,loader,* ]] && part $((budget * 45 / 100)) "$py" "$root/bench/python_loader.py" --workers "$nproc_" \
    --data "$work/bench-data" ${RT_PYLOADER_ARGS:---device cuda --runs 3 --seconds 1.5}
if [[ $parts == *,example,* ]]; then
    data=$work/data
    part $((budget * 15 / 100)) "$py" "$root/python/examples/cifar10_resnet18_ddp.py" --prepare "$data"
    for loader in ringtrain torch ringtrain torch; do
        sub=packed
        [ "$loader" = torch ] && sub=torchvision
        part $((budget * 9 / 100)) "$py" "$root/python/examples/cifar10_resnet18_ddp.py" --loader "$loader" \
            --data "$data/$sub" --device cuda --epochs 1 --batch-size 512 --workers "$nproc_" --json --verdict
    done
fi
if [[ $parts == *,lightning,* ]]; then
    if lv=$("$py" -c 'try:
    import lightning as L
except ImportError:
    import pytorch_lightning as L
print(L.__name__, L.__version__)' 2>/dev/null); then
        echo "== $lv"
        ex=$root/python/examples/cifar10_lightning_ddp.py
        ldata=$work/lightning-data
        part $((budget * 5 / 100)) "$py" "$ex" --prepare "$ldata" --synth-train 10000 --synth-test 1000
        # Two CPU ranks of a 2-core share each: torch threads and loader threads per rank from this machine's cores.
        part $((budget * 20 / 100)) "$py" "$ex" --data "$ldata/packed" --accelerator cpu --devices 2 --strategy ddp \
            --epochs 2 --batch-size 64 --workers 2 --threads $(( nproc_ > 8 ? (nproc_ - 4) / 2 : 2 )) --coverage --json
        part $((budget * 15 / 100)) "$py" "$ex" --data "$ldata/packed" --accelerator gpu --devices 1 \
            --epochs 2 --batch-size 256 --workers "$nproc_" --coverage --json
    else
        echo "== lightning: skipped: $py has neither lightning nor pytorch_lightning"
    fi
fi
[[ $parts == *,compile,* ]] && part $((budget * 50 / 100)) "$py" "$root/bench/python_compile_check.py" "$work/compile"
exit $rc
