#!/usr/bin/env bash
# pack_folder.sh - `ringtrain pack` throughput (images/s) on a folder of
# variable-size JPEGs (bench/make_image_folder.py: ImageNet's spread of sizes,
# the folder bench/folder_vs_torchvision.sh uses), in three modes:
#   size64    --size 64                     fixed 64x64 (resize shorter side + centre
#                                           crop), raw codec
#   size224   --size 224                    fixed 224x224, raw codec
#   maxside   --codec jpeg --max-side 512   variable-size JPEG records: kept as they
#                                           are when <= 512 px (after a test decode),
#                                           else resized and re-encoded
#   bench/pack_folder.sh [--bin PATH] [options]
# A raw mode may name a zstd level, MODE:L (size224:3 is --size 224 --level 3),
# to set levels side by side in one run.
# The modes are alternated RUNS times (the order rotates every run), the page
# cache warm, each output removed and synced before the next run; images/s =
# the folder's images / the pack's wall-clock seconds.
# Medians and min - max printed, with the output size. Each run also measures
# the decode ceiling (bench/jpeg_ceiling.c, built with cc: libjpeg-turbo
# decoding every file of the folder from memory, full size, on as many
# threads as pack uses, nothing else) and each mode is given as a share of
# it; goal: size224 at >= 70 % of the ceiling (PASS/MISS). The ceiling leaves
# out what pack must also do (read the files, resize, compress, write), so
# 100 % is out of reach by construction.
# Options:
#   --bin PATH       ringtrain binary (default $RT_BIN, else build/ringtrain)
#   --dir DIR        where the folder is kept between runs (default $RT_BENCH_DIR,
#                    else /tmp/rt-bench-folder)
#   --classes N      class folders (default 10)
#   --per-class N    images per class (default 150)
#   --seed S         the folder's seed (default 0)
#   --runs R         rounds of all modes (default 3)
#   --threads T      pack's --threads (default: pack's own, the CPUs it may use)
#   --modes LIST     which modes, of size64,size224,maxside, size64:L, size224:L
#                    (default the first three)
#   --folder DIR     pack this folder of images instead of the generated one (your
#                    own photos, or bench/make_photo_folder.py's); the ceiling
#                    decodes its .jpg/.jpeg files only; --dir, --classes,
#                    --per-class and --seed are then not used
#   --out-dir DIR    where the packs are written (default: a scratch folder in
#                    $TMPDIR or /tmp); its file system counts: writing 209 MiB
#                    for size224 costs 0.2-0.8 s of system time on ext4 here,
#                    0.2 s on tmpfs (/dev/shm)
# Needs /usr/bin/python3 with Pillow and numpy (to write the folder once, ~30 s).
# About 2 minutes on 2 cores with the defaults.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=${RT_BIN:-$top/build/ringtrain}
DIR=${RT_BENCH_DIR:-/tmp/rt-bench-folder}
CLASSES=10
PER_CLASS=150
SEED=0
RUNS=3
THREADS=""
OUT_DIR=""
MODES=size64,size224,maxside
PY=/usr/bin/python3

FOLDER=""

bench_options --bin=RT --dir=DIR --classes=CLASSES --per-class=PER_CLASS --seed=SEED --runs=RUNS \
    --threads=THREADS --modes=MODES --out-dir=OUT_DIR --folder=FOLDER -- "$@"
bench_posint "$CLASSES" "$PER_CLASS" "$RUNS" ${THREADS:+"$THREADS"}
case $SEED in '' | *[!0-9]*) bench_fail "--seed '$SEED' is not a non-negative integer" ;; esac
bench_list modes "$MODES" --modes
# shellcheck disable=SC2154 # modes is set by bench_list
for m in "${modes[@]}"; do
    case $m in
    size64 | size224 | maxside) ;;
    size64:[1-9] | size64:1[0-9] | size64:2[0-2] | size224:[1-9] | size224:1[0-9] | size224:2[0-2]) ;;
    *) bench_fail "--modes: '$m' is not size64, size224, maxside, or size64:L / size224:L (zstd level L, 1-22)" ;;
    esac
done
RT=$(bench_bin "$RT")

# --- prerequisites -----------------------------------------------------------
# shellcheck disable=SC2119 # no note to add
bench_need_bin
# Packing variable-size folders came with issue 27: say so instead of failing mid-way.
"$RT" pack --help 2>&1 | grep -q -- --max-side ||
    bench_fail "$RT has no 'pack --max-side'/'--size' (image folders of any size); rebuild it from a tree that has issue 27's pack"
"$PY" -c 'import numpy, PIL' 2>/dev/null ||
    bench_fail "$PY lacks numpy or Pillow (to write the folder); install: apt-get install -y python3-numpy python3-pil"

# --- folder ------------------------------------------------------------------
folder=$DIR/folder-c$CLASSES-p$PER_CLASS-s$SEED
if [ -n "$FOLDER" ]; then
    [ -d "$FOLDER" ] || bench_fail "--folder $FOLDER is not a directory"
    folder=$(CDPATH='' cd -- "$FOLDER" && pwd)
else
    mkdir -p "$DIR"
fi
if [ ! -d "$folder" ]; then
    echo "making $folder (bench/make_image_folder.py, once; kept for the next run)"
    "$PY" "$top/bench/make_image_folder.py" "$folder" --classes "$CLASSES" --per-class "$PER_CLASS" \
        --seed "$SEED" | sed 's/^/  /'
fi
nimages=$(find "$folder" -type f \( -iname '*.jpeg' -o -iname '*.jpg' \) | wc -l)
if [ "$nimages" -eq 0 ] && [ -n "$FOLDER" ]; then
    bench_fail "--folder $FOLDER holds no .jpg/.jpeg files: the decode ceiling, and this bench, need JPEGs"
fi
[ "$nimages" -gt 0 ] || bench_fail "$folder holds no JPEGs (an interrupted run?); remove it and run again"
bench_scratch rt-packf
out=$t
if [ -n "$OUT_DIR" ]; then
    mkdir -p "$OUT_DIR" || bench_fail "--out-dir $OUT_DIR cannot be made"
    out=$(mktemp -d "$OUT_DIR/rt-packf-XXXXXX")
    trap 'rm -rf "$t" "$out"' EXIT
fi

# --- the decode ceiling -------------------------------------------------------------
# Without a C compiler or libturbojpeg's headers it is left out: no ceiling.ips, no shares.
if bench_jpeg_ceiling_build; then
    modes+=(ceiling)
fi

echo "== ringtrain pack throughput on a folder of variable-size JPEGs =="
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1)"
if [ -z "$FOLDER" ] && [ -f "$folder.summary.txt" ]; then
    cat "$folder.summary.txt"
else
    echo "folder:   $folder ($nimages JPEGs)"
fi
find "$folder" -type f -exec cat {} + >/dev/null

cmd_pack() {
    cmd=("$RT" pack "$folder" --out "$out/$1" --force ${THREADS:+--threads "$THREADS"})
    case ${1%%:*} in
    ceiling) cmd=("$t/jpeg_ceiling" "$folder" --threads "${THREADS:-$(nproc)}" --min-seconds 2) ;;
    size64) cmd+=(--size 64) ;;
    size224) cmd+=(--size 224) ;;
    maxside) cmd+=(--codec jpeg --max-side 512) ;;
    esac
    case $1 in *:*) cmd+=(--level "${1#*:}") ;; esac
}
echo "commands:"
for m in "${modes[@]}"; do cmd_pack "$m" && echo "  ${cmd[*]}"; done

fails=0
for i in $(seq "$RUNS"); do
    echo "run $i/$RUNS"
    # Rotate the order so that no mode always runs first (or right after the same one).
    n=${#modes[@]}
    for k in $(seq 0 $((n - 1))); do
        m=${modes[$(((k + i - 1) % n))]}
        cmd_pack "$m"
        # shellcheck disable=SC2034 # rc and wall are set by bench_run
        rc=0 wall=0
        bench_run "$t/$m.out" "$t/$m.err"
        if [ "$rc" -ne 0 ]; then
            fails=$((fails + 1))
            bench_show_failure "$rc" "$t/$m.err" "$t/$m.out"
            continue
        fi
        if [ "$m" = ceiling ]; then
            # Its own rate (decode passes over the files held in memory).
            ips=$(bench_json_field "$PY" "$t/$m.out" images_per_s)
            [ -n "$ips" ] || { fails=$((fails + 1)); bench_show_failure 1 "$t/$m.err" "$t/$m.out"; continue; }
            echo "$ips" >>"$t/ceiling.ips"
            printf "  %-10s %7.0f images/s  (full-size decode only, from memory)\n" "$m" "$ips"
            continue
        fi
        # The records pack says it wrote, else the folder's count (a pack that skipped files says so).
        recs=$(sed -n 's/^pack: \([0-9][0-9]*\) records.*/\1/p' "$t/$m.out" | head -n 1)
        recs=${recs:-$nimages}
        mb=$(du -sk "$out/$m" | awk '{printf "%.1f", $1 / 1024}')
        echo "$wall $recs $mb" >>"$t/$m.txt"
        printf "  %-10s %7.0f images/s  (%s records in %.2f s, %s MiB out)\n" "$m" \
            "$(awk -v n="$recs" -v w="$wall" 'BEGIN { print n / w }')" "$recs" "$wall" "$mb"
        # Gone and written back before the next run, so that no run pays for the one before it.
        rm -rf "${out:?}/$m"
        sync
    done
done

echo
echo "Medians of $RUNS runs, $nimages JPEGs, $(nproc) CPUs (${cpu:-unknown CPU}), pack threads:" \
    "${THREADS:-the default}, written to $(df --output=fstype "$out" | tail -n 1) ($out)"
echo
ceil=""
if [ -s "$t/ceiling.ips" ]; then
    ceil=$(bench_median <"$t/ceiling.ips")
fi
echo "| mode | images/s (median) | min - max | seconds (median) | MiB out | records | of the decode ceiling |"
echo "|---|---:|---:|---:|---:|---:|---:|"
verdict=""
for m in "${modes[@]}"; do
    [ "$m" != ceiling ] || continue
    if [ ! -s "$t/$m.txt" ]; then
        echo "| $m | n/a | | | | | |"
        continue
    fi
    awk '{print $2 / $1}' "$t/$m.txt" | sort -n >"$t/$m.ips"
    med=$(bench_median <"$t/$m.ips")
    lo=$(head -n 1 "$t/$m.ips")
    hi=$(tail -n 1 "$t/$m.ips")
    secs=$(cut -d ' ' -f 1 "$t/$m.txt" | bench_median)
    mib=$(cut -d ' ' -f 3 "$t/$m.txt" | bench_median)
    recs=$(tail -n 1 "$t/$m.txt" | cut -d ' ' -f 2)
    share=n/a
    if [ -n "$ceil" ]; then
        pct=$(awk -v a="$med" -v c="$ceil" 'BEGIN { printf "%.0f", 100 * a / c }')
        share="$pct %"
        if [ "$m" = size224 ] && [ -z "$FOLDER" ]; then # the goal is set on the generated folder
            verdict="$(awk -v a="$med" -v c="$ceil" 'BEGIN { print (a >= 0.7 * c ? "PASS" : "MISS") }') ($pct % of"
            verdict+=" the ceiling; goal >= 70 %)"
        fi
    fi
    printf "| %s | %.0f | %.0f - %.0f | %.2f | %s | %s | %s |\n" "$m" "$med" "$lo" "$hi" "$secs" "$mib" "$recs" \
        "$share"
done
if [ -n "$ceil" ]; then
    sort -n -o "$t/ceiling.ips" "$t/ceiling.ips"
    printf "| decode ceiling (bench/jpeg_ceiling.c, %s threads) | %.0f | %.0f - %.0f | | | | 100 %% |\n" \
        "${THREADS:-$(nproc)}" "$ceil" "$(head -n 1 "$t/ceiling.ips")" "$(tail -n 1 "$t/ceiling.ips")"
fi
[ -z "$verdict" ] || echo "size224: $verdict"
bench_finish $fails
