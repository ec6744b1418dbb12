#!/usr/bin/env bash
# quickstart.sh - the main job on a fresh Debian 12 machine: installs what is
# missing, builds, and runs the data path end to end on the built-in default
# (a generated CIFAR-10-like dataset) or on the CIFAR/MNIST input you name:
#   tools/quickstart.sh                       # synthetic CIFAR-10
#   tools/quickstart.sh ~/cifar-10-binary.tar.gz
#   tools/quickstart.sh --small               # a short check that the machine works: 10,000 + 1,000
#                                             # synthetic images, 3 epochs (about 80 %, 10 s of training)
# Steps: synth (default only) -> pack -> verify -> inspect -> loadbench (the
# loader and batch ring feeding no compute, 2 epochs) -> train (the default
# model, mnist-net, 2 epochs: under 3 minutes on 2 cores, above 95 % test
# accuracy on the synthetic set) -> eval of the checkpoint. Output under data/.
set -eu
epochs=2 synth=data/synth synth_size=() input=
for a in "$@"; do
    case $a in
    --small) epochs=3 synth=data/synth-small synth_size=(--train 10000 --test 1000) ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "quickstart: unknown option $a (--small, or an input to pack)" >&2; exit 2 ;;
    *) input=$(realpath -- "$a") ;;
    esac
done
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build

if [ -z "$input" ]; then
    input=$synth
    [ -e "$input" ] || build/ringtrain synth --out "$synth" "${synth_size[@]}"
fi
build/ringtrain pack "$input" --out data/dataset --force
build/ringtrain verify data/dataset
build/ringtrain inspect data/dataset
build/ringtrain loadbench data/dataset --epochs 2 --digest
build/ringtrain train --data data/dataset --epochs "$epochs" --checkpoint-dir data/checkpoint \
    --metrics data/metrics.jsonl
build/ringtrain eval --data data/dataset --checkpoint data/checkpoint/model.safetensors
