#!/usr/bin/env bash
# quickstart.sh - the main job on a fresh Debian 12 machine: installs what is
# missing, builds, and runs the data path end to end on the built-in default
# (a generated CIFAR-10-like dataset) or on the CIFAR/MNIST input or folder of pictures you name:
#   tools/quickstart.sh                       # synthetic CIFAR-10
#   tools/quickstart.sh ~/cifar-10-binary.tar.gz
#   tools/quickstart.sh ~/photos              # ~/photos/<class>/*.jpg|png|webp of any sizes: kept as JPEGs
#                                             # of at most 256 px (--max-side), unusable files skipped and
#                                             # listed, 10 % held out for validation unless ~/photos has
#                                             # train/ and val/; resnet18 on RandomResizedCrop(64) + flip
#   tools/quickstart.sh ~/photos --image-size 96   # the crop size for a folder of pictures (default 64)
#   tools/quickstart.sh --small               # a short check that the machine works: 10,000 + 1,000
#                                             # synthetic images, 3 epochs (about 80 %, 10 s of training)
# Steps: synth (default only) -> pack -> verify -> inspect -> loadbench (the
# loader and batch ring feeding no compute, 2 epochs) -> train (the default
# model, mnist-net, 2 epochs: under 3 minutes on 2 cores, above 95 % test
# accuracy on the synthetic set) -> eval of the checkpoint -> report: data/report.html, one page of
# charts (loss, accuracy, images/s, the step profile, the loader's stages; open it in any browser).
# Output under data/.
set -eu -o pipefail
epochs=2 synth=data/synth synth_size=() input= image_size=64 want_size=
for a in "$@"; do
    if [ -n "$want_size" ]; then
        image_size=$a want_size=
        continue
    fi
    case $a in
    --small) epochs=3 synth=data/synth-small synth_size=(--train 10000 --test 1000) ;;
    --image-size) want_size=1 ;;
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
# A folder of pictures (class folders holding image files, or train/ and val/ above them) rather than
# CIFAR or MNIST: pictures of any size are kept at their own (at most 256 px) and cropped when loaded.
pictures=
if [ -d "$input" ] && ! find "$input" -maxdepth 2 \( -name '*.bin' -o -name '*-ubyte*' -o -name '*.tar.gz' \
        -o -name 'data_batch_*' \) -print -quit | grep -q . &&
    find "$input" -mindepth 2 -maxdepth 3 -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' \
        -o -iname '*.webp' -o -iname '*.ppm' -o -iname '*.pgm' \) -print -quit | grep -q .; then
    pictures=1
fi
if [ -n "$pictures" ]; then
    split=()
    [ -d "$input/val" ] || [ -d "$input/test" ] || split=(--val-split 0.1)
    build/ringtrain pack "$input" --out data/dataset --force --codec jpeg --max-side 256 --skip-bad "${split[@]}"
    # Batches of 32, or the whole training split when it is smaller (a few dozen photos train too).
    n=$(build/ringtrain inspect data/dataset | awk '$1 == "train" { print $2; exit }')
    sized=(--image-size "$image_size" --batch-size $((n < 32 ? n : 32)))
    model=(--model resnet18)
else
    build/ringtrain pack "$input" --out data/dataset --force
    sized=() model=()
fi
build/ringtrain verify data/dataset
build/ringtrain inspect data/dataset
build/ringtrain loadbench data/dataset --epochs 2 --digest --json "${sized[@]}" | tee data/loadbench.out
build/ringtrain train --data data/dataset --epochs "$epochs" --checkpoint-dir data/checkpoint \
    --metrics data/metrics.jsonl --json "${sized[@]}" "${model[@]}" | tee data/train.out
if [ -z "$pictures" ] || [ -d "$input/test" ]; then
    build/ringtrain eval --data data/dataset --checkpoint data/checkpoint/model.safetensors
fi
# One page of charts from what the steps above wrote (ringtrain report --help).
build/ringtrain report data/metrics.jsonl,data/train.out,data/checkpoint data/loadbench.out \
    --title "ringtrain quick start" -o data/report.html
echo "report: $top/data/report.html (open it in a browser)"
