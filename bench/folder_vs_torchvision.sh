#!/usr/bin/env bash
# folder_vs_torchvision.sh - ringtrain's loader against torchvision's ImageFolder
# pipeline on the same folder of variable-size JPEGs (generated with ImageNet's
# spread of sizes, bench/make_image_folder.py): RandomResizedCrop(S) + random
# horizontal flip into uint8 (B,3,S,S) batches, no model, at S = 64, 128, 224.
#   bench/folder_vs_torchvision.sh [--bin PATH] [options]
# Ways, alternated RUNS times per S (the way that goes first swaps every run),
# medians printed with the ratio ringtrain / torchvision and PASS/MISS against
# the goal (>= 3x at S=224; the other sizes are reported):
#   ringtrain    `ringtrain loadbench PACKED --image-size S`, PACKED being the
#                folder packed once with `ringtrain pack --codec jpeg
#                --max-side 512` (timed): variable-size records, RandomResizedCrop
#                + flip at load time. Its stage table gives the decode share.
#   torchvision  ImageFolder + Compose([RandomResizedCrop(S), RandomHorizontalFlip(),
#                PILToTensor()]) + DataLoader (bench/torch_imagefolder.py), with
#                the best num_workers of 0..4, found once per S before the runs
#   ceiling      libjpeg-turbo's full-size decode rate on the folder's files on
#                the loader's thread count (bench/jpeg_ceiling.c, built with cc),
#                once per run; the loader's rate is quoted against it
# Options:
#   --bin PATH          ringtrain binary (default $RT_BIN, else build/ringtrain)
#   --dir DIR           where the folder and the packed dataset are kept between
#                       runs (default $RT_BENCH_DIR, else /tmp/rt-bench-folder)
#   --classes N         class folders (default 10)
#   --per-class N       images per class (default 150; 10 x 150 = 1500 images,
#                       205 MB; more: e.g. --per-class 500)
#   --seed S            the folder's seed (default 0)
#   --sizes LIST        crop sizes S (default 64,128,224)
#   --runs R            rounds per size (default 3)
#   --batch-size B      images per batch, both ways (default 64)
#   --workers N         ringtrain's loader threads and the ceiling's (default 2)
#   --epochs E          loadbench epochs per run (default 3)
#   --batches K         torchvision's timed batches per run (default 20, after
#                       2 x num_workers + 2 warm-up: the workers' prefetch
#                       backlog); the num_workers search uses max(8, K/2)
#   --max-side N        pack's --max-side (default 512: FFCV's ImageNet choice
#                       of a 512-px longest side covers S <= 224 crops of the
#                       500-px majority without upscaling, and re-encodes only
#                       the larger tail)
#   --goal X            the ratio to reach at S=224 (default 3)
#   --torch-only        measure torchvision and the ceiling only (no ringtrain)
# Needs /usr/bin/python3 with torch, torchvision, Pillow and numpy, and for the
# ceiling cc + libturbojpeg0-dev. About 5 minutes on 2 cores with the defaults
# (the first run also writes the folder: ~30 s).
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=${RT_BIN:-$top/build/ringtrain}
DIR=${RT_BENCH_DIR:-/tmp/rt-bench-folder}
CLASSES=10
PER_CLASS=150
SEED=0
SIZES=64,128,224
RUNS=3
B=64
WORKERS=2
EPOCHS=3
BATCHES=20
MAX_SIDE=512
GOAL=3
TORCH_ONLY=0
PY=/usr/bin/python3

bench_options --bin=RT --dir=DIR --classes=CLASSES --per-class=PER_CLASS --seed=SEED --sizes=SIZES \
    --runs=RUNS --batch-size=B --workers=WORKERS --epochs=EPOCHS --batches=BATCHES --max-side=MAX_SIDE \
    --goal=GOAL --torch-only=TORCH_ONLY:1 -- "$@"
bench_posint "$CLASSES" "$PER_CLASS" "$RUNS" "$B" "$WORKERS" "$EPOCHS" "$BATCHES" "$MAX_SIDE"
case $SEED in '' | *[!0-9]*) bench_fail "--seed '$SEED' is not a non-negative integer" ;; esac
bench_posnum "$GOAL" || bench_fail "--goal '$GOAL' is not a positive number"
bench_list sizes "$SIZES" --sizes
# shellcheck disable=SC2154 # sizes is set by bench_list
bench_posint "${sizes[@]}"
RT=$(bench_bin "$RT")
search=$((BATCHES / 2 > 8 ? BATCHES / 2 : 8))  # the num_workers search's timed batches
[ $((CLASSES * PER_CLASS)) -ge "$B" ] || bench_fail "$CLASSES x $PER_CLASS images is less than one batch of $B"

# --- prerequisites -----------------------------------------------------------
bench_sudo
bench_need_torch "PyTorch/torchvision for $PY is missing" "$PY" "$top/bench/torch_imagefolder.py" check
if [ "$TORCH_ONLY" = 0 ]; then
    # shellcheck disable=SC2119 # no note to add
    bench_need_bin
    # The variable-size pack and --image-size came with issue 27: say so instead of failing mid-way.
    if ! "$RT" pack --help 2>&1 | grep -q -- --max-side; then
        bench_fail "$RT has no 'pack --max-side' (variable-size JPEG records); rebuild it from a tree that has" \
            "issue 27's pack, or run with --torch-only for the torchvision side and the ceiling"
    fi
    if ! "$RT" loadbench --help 2>&1 | grep -q -- --image-size; then
        bench_fail "$RT has no 'loadbench --image-size'; rebuild it from a tree that has issue 27's loader," \
            "or run with --torch-only"
    fi
fi

# --- folder, pack -------------------------------------------------------------
folder=$DIR/folder-c$CLASSES-p$PER_CLASS-s$SEED
packed=$DIR/packed-c$CLASSES-p$PER_CLASS-s$SEED-max$MAX_SIDE
mkdir -p "$DIR"
bench_scratch rt-fvt
if [ ! -d "$folder" ]; then
    echo "making $folder (bench/make_image_folder.py, once; kept for the next run)"
    "$PY" "$top/bench/make_image_folder.py" "$folder" --classes "$CLASSES" --per-class "$PER_CLASS" \
        --seed "$SEED" | sed 's/^/  /'
fi
nimages=$(find "$folder" -type f -iname '*.jpeg' | wc -l)
[ "$nimages" -ge "$B" ] || bench_fail "$folder holds $nimages JPEGs (an interrupted run?); remove it and run again"

echo "== ringtrain loader vs torchvision ImageFolder: RandomResizedCrop(S) + flip from variable-size JPEGs, no model =="
bench_machine
rt_version="ringtrain: n/a"
[ "$TORCH_ONLY" = 1 ] || rt_version=$("$RT" --version 2>/dev/null | head -n 1)
echo "software: $rt_version; $torch_versions; $(cc --version 2>/dev/null | head -n 1 || echo "no cc")"
if [ -f "$folder.summary.txt" ]; then
    cat "$folder.summary.txt"
    echo "          (bench/make_image_folder.py --classes $CLASSES --per-class $PER_CLASS --seed $SEED)"
else
    echo "folder:   $folder ($nimages JPEGs)"
fi
# Every way reads from the page cache: warm it once up front.
find "$folder" -type f -exec cat {} + >/dev/null

pack_line=""
if [ "$TORCH_ONLY" = 0 ]; then
    cmd=("$RT" pack "$folder" --out "$packed" --codec jpeg --max-side "$MAX_SIDE" --force)
    # shellcheck disable=SC2034 # rc and wall are set by bench_run
    rc=0 wall=0
    bench_run "$t/pack.out" "$t/pack.err"
    if [ "$rc" -ne 0 ]; then
        bench_show_failure "$rc" "$t/pack.err" "$t/pack.out"
        bench_fail "the pack failed; nothing to measure"
    fi
    pack_line=$(grep -m 1 '^pack:' "$t/pack.out" || tail -n 1 "$t/pack.out")
    echo "packed:   ${cmd[*]}"
    echo "          $(awk -v n="$nimages" -v w="$wall" 'BEGIN { printf "%.2f s wall, %.0f images/s", w, n / w }') ($(du -sh "$packed" | cut -f1) on disk)"
    echo "          $pack_line"
    find "$packed" -type f -exec cat {} + >/dev/null
fi

# --- the ceiling program --------------------------------------------------------
have_ceiling=0
bench_jpeg_ceiling_build && have_ceiling=1

# --- the report helper --------------------------------------------------------
bench_report_helper "$t/report.py" <<'EOF'
LABEL = {"rt": "ringtrain loadbench", "tv": "torchvision ImageFolder", "ceiling": "libjpeg-turbo decode"}

def add(results, way, size, run, path):
    """Records the last JSON line of path (a run's output) as way/size/run; prints its rate."""
    r = last_json(path)
    if r is None or not isnum(r.get("images_per_s")):
        print("  %-26s FAILED: no JSON line with images_per_s in its output" % LABEL[way])
        return 1
    r.update(way=way, size=int(size), run=int(run))
    with open(results, "a") as f:
        f.write(json.dumps(r) + "\n")
    extra = ""
    if way == "rt":
        d = (r.get("stages") or {}).get("decode") or {}
        if isnum(d.get("share")):
            extra = "  (decode %.0f %% of worker time)" % (100 * d["share"])
    elif way == "tv":
        extra = "  (num_workers=%d)" % r["workers"]
    elif way == "ceiling":
        extra = "  (%d threads, %.0f MB/s compressed, %.0f Mpixel/s)" % (r["threads"], r["mb_per_s"], r["mpixel_per_s"])
    print("  %-26s %8.0f images/s%s" % (LABEL[way] + ("" if way == "ceiling" else " S=%d" % r["size"]),
                                         r["images_per_s"], extra))
    return 0

def best(path):
    """The best num_workers from a --workers all run, and the line that says so."""
    r = last_json(path)
    if r is None or r.get("mode") != "imagefolder_best":
        return 1
    print(r["workers"])
    return 0

def stages(r):
    st = r.get("stages") or {}
    out = []
    for name in ("io", "decompress", "decode", "augment", "slot_wait", "ring_wait", "idle"):
        v = st.get(name)
        if isinstance(v, dict) and isnum(v.get("share")):
            out.append("%s %.0f %%" % (name.replace("_", " "), 100 * v["share"]))
    return ", ".join(out)

def table(results, sizes, goal, workers, search, tries=""):
    """The summary; tries is "S=BEST(W:IMG/S,...) ..." from the num_workers searches."""
    rs = load(results)
    goal = float(goal)
    tried = dict(t.split("=", 1) for t in tries.split()) if tries else {}
    ceil = [r["images_per_s"] for r in rs if r["way"] == "ceiling"]
    cm = statistics.median(ceil) if ceil else None
    print("| S | ringtrain img/s (median) | min - max | torchvision img/s (median) | min - max | best num_workers "
          "| ringtrain : torchvision | goal | ringtrain : ceiling | decode share |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    verdicts = []
    for s in [int(x) for x in sizes.split(",")]:
        rt = sorted((r for r in rs if r["way"] == "rt" and r["size"] == s), key=lambda r: r["images_per_s"])
        tv = sorted((r for r in rs if r["way"] == "tv" and r["size"] == s), key=lambda r: r["images_per_s"])
        cells = ["%d" % s]
        for xs in (rt, tv):
            if xs:
                m, lo, hi = med_lo_hi([r["images_per_s"] for r in xs])
                cells += ["%.0f" % m, "%.0f - %.0f" % (lo, hi)]
            else:
                cells += ["n/a", ""]
        cells.append(tried.get(str(s), "n/a").split("(")[0])
        if rt and tv:
            x = statistics.median(r["images_per_s"] for r in rt) / statistics.median(r["images_per_s"] for r in tv)
            cells.append("%.2fx" % x)
            if s == 224:
                v = "%.2fx %s (>= %gx)" % (x, "PASS" if x >= goal else "MISS", goal)
                verdicts.append(v)
                cells.append(v)
            else:
                cells.append("(reported)")
        else:
            cells += ["n/a", "(no ringtrain runs)" if not rt else "n/a"]
        if rt and cm:
            cells.append("%.2f" % (statistics.median(r["images_per_s"] for r in rt) / cm))
        else:
            cells.append("n/a")
        mid = rt[(len(rt) - 1) // 2] if rt else None
        d = ((mid or {}).get("stages") or {}).get("decode") or {}
        cells.append("%.0f %%" % (100 * d["share"]) if isnum(d.get("share")) else "n/a")
        print("| " + " | ".join(cells) + " |")
    print()
    if cm:
        lo, hi = min(ceil), max(ceil)
        print("ceiling: libjpeg-turbo decodes these files full size at %.0f images/s (median of %d; %.0f - %.0f) on %s "
              "threads; ringtrain : ceiling above is the loader's img/s over that (above 1: it decodes less than "
              "every full image, through scaled IDCT and crop-region decoding)" % (cm, len(ceil), lo, hi, workers))
    for s in [int(x) for x in sizes.split(",")]:
        rt = sorted((r for r in rs if r["way"] == "rt" and r["size"] == s), key=lambda r: r["images_per_s"])
        if rt:
            mid = rt[(len(rt) - 1) // 2]
            print("ringtrain S=%d, stages of the median run (run %d): %s" % (s, mid["run"], stages(mid)))
    if tried:
        print("torchvision: num_workers search, images/s by num_workers (%s timed batches each): %s" % (
            search, "; ".join("S=%s: %s" % (k, v.split("(", 1)[1].rstrip(")").replace(",", ", "))
                              for k, v in sorted(tried.items(), key=lambda kv: int(kv[0])) if "(" in v)))
    return 0

def tried(path):
    """'0: 123, 1: 234, ...' from a --workers all run's last line."""
    r = last_json(path)
    if r is None or "tried" not in r:
        return 1
    print(",".join("%s:%.0f" % kv for kv in r["tried"].items()))
    return 0

if __name__ == "__main__":
    main({"add": add, "best": best, "table": table, "tried": tried})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
cmd_rt() {
    cmd=("$RT" loadbench "$packed" --image-size "$1" --batch-size "$B" --workers "$WORKERS" --epochs "$EPOCHS" --json)
}
cmd_tv() {
    cmd=("$PY" "$top/bench/torch_imagefolder.py" run --data "$folder" --image-size "$1" --batch-size "$B"
        --workers "$2" --batches "$3")
}
cmd_ceiling() {
    cmd=("$t/jpeg_ceiling" "$folder" --threads "$WORKERS" --min-seconds 3)
}

echo "settings: batch $B, $RUNS runs per S alternated, S in ${sizes[*]}; ringtrain: $WORKERS workers, $EPOCHS epochs,"
echo "          loadbench's steady images/s (from its first batch); torchvision: $BATCHES timed batches after"
echo "          2 x num_workers + 2 warm-up, best num_workers of 0..4 (searched with $search batches each, once per S);"
echo "          page cache warm; both give uint8 (B,3,S,S) batches (torchvision: PILToTensor, no Normalize)"
echo "commands:"
if [ "$TORCH_ONLY" = 0 ]; then
    cmd_rt S && echo "  ${cmd[*]}"
else
    echo "  (ringtrain rows skipped: --torch-only)"
fi
cmd_tv S "all|best" "$BATCHES" && echo "  ${cmd[*]}"
[ $have_ceiling = 0 ] || { cmd_ceiling && echo "  ${cmd[*]}  (built with cc -O2 ... \$(pkg-config --cflags --libs libturbojpeg) -lpthread)"; }

# --- the runs ----------------------------------------------------------------
fails=0
measure() {  # measure WAY SIZE RUN: runs cmd, records its JSON line
    # shellcheck disable=SC2034 # wall: every way times itself
    local rc wall
    bench_run "$t/$1.out" "$t/$1.err"
    if ! report add "$t/results.jsonl" "$1" "$2" "$3" "$t/$1.out" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$t/$1.err" "$t/$1.out"
    fi
}
tries=""
for s in "${sizes[@]}"; do
    echo "S=$s: torchvision num_workers search"
    cmd_tv "$s" all "$search"
    # shellcheck disable=SC2034 # wall
    rc=0 wall=0
    bench_run "$t/search.out" "$t/search.err"
    if [ "$rc" -ne 0 ] || ! best=$(report best "$t/search.out"); then
        bench_show_failure "$rc" "$t/search.err"
        fails=$((fails + 1))
        continue
    fi
    tries="$tries $s=$best($(report tried "$t/search.out"))"
    echo "  best num_workers=$best (images/s: $(report tried "$t/search.out" | sed 's/,/, /g'))"
    for i in $(seq "$RUNS"); do
        echo "S=$s run $i/$RUNS"
        for way in $(bench_order "$i" rt tv); do
            if [ "$way" = rt ]; then
                [ "$TORCH_ONLY" = 1 ] || { cmd_rt "$s" && measure rt "$s" "$i"; }
            else
                cmd_tv "$s" "$best" "$BATCHES" && measure tv "$s" "$i"
            fi
        done
    done
done
if [ $have_ceiling = 1 ]; then
    echo "ceiling"
    for i in $(seq "$RUNS"); do cmd_ceiling && measure ceiling 0 "$i"; done
fi

echo
echo "Medians of $RUNS runs, batch $B, $(nproc) CPUs (${cpu:-unknown CPU}); ringtrain with $WORKERS workers."
echo "Ratios are ringtrain's images/s over torchvision's with its best num_workers; decode share: loadbench's"
echo "decode stage as a share of worker time (the median run's stage table)."
echo
report table "$t/results.jsonl" "$(IFS=,; echo "${sizes[*]}")" "$GOAL" "$WORKERS" "$search" "$tries"
if [ "$TORCH_ONLY" = 1 ]; then
    echo "folder_vs_torchvision: --torch-only: no ringtrain rows, no goal verdict" >&2
    exit 1
fi
bench_finish $fails
