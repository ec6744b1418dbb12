#!/usr/bin/env bash
# loader_vs_pytorch.sh - ringtrain's input pipeline against PyTorch's on one
# machine, side by side: augmented CIFAR-10 training batches per second
# (random crop 32 with 4-pixel zero padding + random horizontal flip), no model.
#   bench/loader_vs_pytorch.sh [--bin PATH] [--data DIR] [--batch-size B]
#                              [--runs R] [--epochs E] [--workers N]
# Ways measured, alternated RUNS times (these machines swing +-25 % between
# runs), medians printed with PASS/MISS against the goals:
#   ringtrain   `ringtrain loadbench` on the packed raw (zstd) dataset, with
#               --shuffle exact (held in RAM after the first read) and
#               --shuffle window (streams the shards every epoch)
#   DataLoader  torchvision's recipe, num_workers 0, 1 and 2 (bench/torch_loader.py)
#   tensor      the train set as one uint8 tensor, crops + flips by indexing
#   preshift    the tensor way with 18 pre-shifted copies (reference only)
#   zstd -d     the shards' zstd blocks through `zstd -d`, one core
# Options:
#   --bin PATH        ringtrain binary (default build/ringtrain)
#   --data DIR        where the dataset lives (default data/bench); made when
#                     absent (synth, then pack) and kept for the next run
#   --batch-size B    images per batch, every way (default 256)
#   --runs R          rounds of all ways (default 3)
#   --epochs E        epochs for ringtrain and the tensor ways (default 10);
#                     each DataLoader runs 1 epoch
#   --workers N       ringtrain's loader threads (default: nproc)
#   --jitter          both pipelines also jitter and erase: ringtrain --aug
#                     crop,flip,jitter=0.4,erase=0.25 (the C workers, uint8),
#                     DataLoader + ColorJitter(0.4, 0.4, 0.4) and, after
#                     Normalize, RandomErasing(0.25); the tensor ways, which
#                     have no such step, are left out
# Needs /usr/bin/python3 with torch + torchvision, and zstd (it says how to
# install them). About 3 minutes on 2 cores with the defaults.
set -eu
export LC_ALL=C  # a decimal point in $EPOCHREALTIME and in awk, whatever the locale
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
RT=$top/build/ringtrain
DATA=$top/data/bench
B=256
RUNS=3
EPOCHS=10
WORKERS=$(nproc)
PY=/usr/bin/python3
ZSTD_REPS=10

JITTER=0
bench_options --bin=RT --data=DATA --batch-size=B --runs=RUNS --epochs=EPOCHS --workers=WORKERS --jitter=JITTER:1 \
    -- "$@"
RT_AUG=()
DL_AUG=()
if [ "$JITTER" = 1 ]; then
    RT_AUG=(--aug crop,flip,jitter=0.4,erase=0.25)
    DL_AUG=(--jitter)
fi
bench_posint "$B" "$RUNS" "$EPOCHS" "$WORKERS"
RT=$(bench_bin "$RT")

# --- prerequisites -----------------------------------------------------------
bench_sudo
bench_need_bin
bench_need_torch "PyTorch for $PY is missing" "$PY" "$top/bench/torch_loader.py" check
command -v zstd >/dev/null || bench_fail "zstd is missing; install: ${sudo}apt-get install -y zstd"

# --- dataset -----------------------------------------------------------------
src=$DATA/src/cifar-10-batches-bin
packed=$DATA/cifar10-raw
bench_dataset "$DATA/src" "$packed" "" ", codec raw"
shards=("$packed"/train-*.rts)
[ -f "${shards[0]}" ] || { echo "loader_vs_pytorch: no train-*.rts in $packed" >&2; exit 1; }

bench_scratch rt-lvp
# Every way reads from memory or the page cache: warm it once up front.
cat "$src"/data_batch_*.bin "${shards[@]}" >/dev/null
blocks=$("$PY" "$top/bench/zstd_blocks.py" "$t/blocks.zst" "${shards[@]}")
read -r nshards zrecords zstored zraw <<<"$blocks"

# --- the report helper: parses each result line, prints the table at the end --
bench_report_helper "$t/report.py" <<'EOF'
def num(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if abs(x) >= 1000:
        return "%.0f" % x
    return "%.4g" % x

def stage_text(v):
    """One stage's numbers: loadbench gives {busy_s, share, rate, unit}; any
    other keys are printed as they come."""
    if not isinstance(v, dict):
        return num(v)
    v = dict(v)
    out = []
    if isinstance(v.get("share"), (int, float)):
        out.append("%5.1f %%" % (100 * v.pop("share")))
    if isinstance(v.get("busy_s"), (int, float)):
        out.append("busy %.3f s" % v.pop("busy_s"))
    if "rate" in v:
        rate, unit = v.pop("rate"), v.pop("unit", "")
        if rate:
            out.append("%s %s" % (num(rate), unit))
    out += ["%s %s" % (k, num(x)) for k, x in v.items()]
    return "  ".join(out)

def stages_text(st, indent):
    """stages as loadbench gives them, one line per stage when it is a dict of
    dicts or a list of dicts, as JSON otherwise."""
    items = []
    if isinstance(st, dict):
        items = list(st.items())
    elif isinstance(st, list) and all(isinstance(s, dict) for s in st):
        for s in st:
            s = dict(s)
            items.append((s.pop("name", s.pop("stage", "?")), s))
    else:
        return indent + json.dumps(st)
    return "\n".join("%s%-12s %s" % (indent, name, stage_text(v)) for name, v in items)

def load_text(r, records):
    """'first read X s (Y images/s)' when r holds a first read (load_s > 0)."""
    ls, lips = r.get("load_s"), r.get("load_images_per_s")
    if not isinstance(ls, (int, float)) or ls <= 0:
        return ""
    if not isinstance(lips, (int, float)) and records:
        lips = records / ls
    return "first read %.3f s%s" % (ls, " (%.0f images/s)" % lips if lips else "")

LABEL = {
    "rt_exact": "ringtrain, --shuffle exact", "rt_window": "ringtrain, --shuffle window",
    "dl0": "DataLoader, num_workers=0", "dl1": "DataLoader, num_workers=1",
    "dl2": "DataLoader, num_workers=2", "dl_best": "DataLoader, best of 0/1/2",
    "tensor": "PyTorch uint8 tensor + indexing", "preshift": "same, 18 pre-shifted copies",
    "zstd": "zstd -d (1 thread)",
}

def add(results, way, run, path, records="0"):
    r = last_line_json(path)
    if r is None or not isinstance(r.get("images_per_s"), (int, float)):
        if r is not None and "skipped" in r:
            print("  %-32s skipped: %s" % (LABEL[way], r["skipped"]))
            return 0
        print("  %-32s FAILED: no JSON line with images_per_s at the end of its output" % LABEL[way])
        return 1
    r.update(way=way, run=int(run))
    with open(results, "a") as f:
        f.write(json.dumps(r) + "\n")
    extra = []
    if isinstance(r.get("end_to_end_images_per_s"), (int, float)):
        extra.append("end to end %.0f" % r["end_to_end_images_per_s"])
    if load_text(r, int(records)):
        extra.append(load_text(r, int(records)))
    if "mb_per_s" in r:
        extra.append("%.0f MB/s of pixels" % r["mb_per_s"])
    print("  %-32s %9.0f images/s%s" % (LABEL[way], r["images_per_s"],
                                         "  (%s)" % ", ".join(extra) if extra else ""))
    return 0

def zstd(results, run, seconds, reps, raw_bytes, stored_bytes, path):
    secs = float(seconds) / int(reps)
    r = {"images_per_s": int(raw_bytes) / 3072 / secs, "seconds": secs,
         "mb_per_s": int(raw_bytes) / 1e6 / secs, "stored_bytes": int(stored_bytes)}
    with open(path, "w") as f:
        f.write(json.dumps(r) + "\n")
    return add(results, "zstd", run, path)

def table(results, nproc, workers, runs, records):
    nproc, workers, runs, records = int(nproc), int(workers), int(runs), int(records)
    rs = load(results)
    by = {}
    for r in rs:
        by.setdefault(r["way"], {})[r["run"]] = r
    for run in range(1, runs + 1):  # best DataLoader of each run
        best = max((by[w][run] for w in ("dl0", "dl1", "dl2") if run in by.get(w, {})),
                   key=lambda r: r["images_per_s"], default=None)
        if best:
            by.setdefault("dl_best", {})[run] = dict(best, way="dl_best")
    cores = {"dl0": 1, "dl1": min(nproc, 2), "dl2": min(nproc, 3), "tensor": nproc,
             "preshift": nproc, "zstd": 1}
    med = {w: statistics.median(r["images_per_s"] for r in v.values()) for w, v in by.items()}
    lo = {w: min(r["images_per_s"] for r in v.values()) for w, v in by.items()}
    hi = {w: max(r["images_per_s"] for r in v.values()) for w, v in by.items()}
    for rt in ("rt_exact", "rt_window"):  # loadbench's own counts when it gives them
        if rt in by:
            r = by[rt][max(by[rt])]
            w = r.get("workers") if isinstance(r.get("workers"), int) else workers
            c = r.get("cpus") if isinstance(r.get("cpus"), int) else nproc
            cores[rt] = max(1, min(w, c, nproc))
    if "dl_best" in by:  # the cores of the way that won the median run
        bests = sorted(by["dl_best"].values(), key=lambda r: r["images_per_s"])
        cores["dl_best"] = cores["dl%d" % bests[(len(bests) - 1) // 2]["workers"]]
    per_core = {w: med[w] / cores[w] for w in med}

    def ratio(rt, w):
        if rt not in med or w not in med:
            return "n/a"
        if w == "zstd":
            return "%.2f (per core)" % (per_core[rt] / per_core[w])
        return "%.1f" % (med[rt] / med[w])

    order = ["rt_exact", "rt_window", "dl0", "dl1", "dl2", "dl_best", "tensor", "preshift", "zstd"]
    print("| way | images/s (median) | min - max | cores | images/s per core "
          "| exact : way | window : way |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for w in order:
        if w not in med:
            print("| %s | n/a | | | | | |" % LABEL[w])
            continue
        print("| %s | %.0f | %.0f - %.0f | %d | %.0f | %s | %s |" % (
            LABEL[w], med[w], lo[w], hi[w], cores[w], per_core[w],
            "" if w.startswith("rt_") else ratio("rt_exact", w),
            "" if w.startswith("rt_") else ratio("rt_window", w)))
    print()
    goals = [("ringtrain >= 25x best DataLoader", "dl_best", 25.0, False),
             ("ringtrain >= 2x uint8 tensor way", "tensor", 2.0, False),
             ("ringtrain per core >= 0.5x zstd -d per core", "zstd", 0.5, True)]
    print("| goal | --shuffle exact | --shuffle window |")
    print("|---|---|---|")
    for text, peer, need, pc in goals:
        cells = []
        for rt in ("rt_exact", "rt_window"):
            if rt not in med or peer not in med:
                cells.append("n/a")
                continue
            x = per_core[rt] / per_core[peer] if pc else med[rt] / med[peer]
            cells.append("%.2fx %s" % (x, "PASS" if x >= need else "MISS"))
        print("| %s | %s | %s |" % (text, cells[0], cells[1]))
    for rt in ("rt_exact", "rt_window"):
        if rt not in by:
            continue
        print()
        print("%s (medians; stages of the median run):" % LABEL[rt])
        runs_rt = sorted(by[rt].values(), key=lambda r: r["images_per_s"])
        mid = runs_rt[(len(runs_rt) - 1) // 2]
        e2e = [r["end_to_end_images_per_s"] for r in runs_rt
               if isinstance(r.get("end_to_end_images_per_s"), (int, float))]
        if e2e:
            print("  end to end, start-up and first read included: %.0f images/s" % statistics.median(e2e))
        loads = sorted((r for r in runs_rt if load_text(r, records)), key=lambda r: r["load_s"])
        if loads:
            print("  " + load_text(loads[(len(loads) - 1) // 2], records))
        if "stages" in mid:
            print("  stages (run %d):" % mid["run"])
            print(stages_text(mid["stages"], "    "))

if __name__ == "__main__":
    main({"add": add, "zstd": zstd, "table": table})
EOF
report() { "$PY" "$t/report.py" "$@"; }

# --- what runs ---------------------------------------------------------------
have_lb=1
"$RT" loadbench --help >/dev/null 2>&1 || have_lb=0
# Each sets cmd=(...) to the command line of one way.
cmd_rt() {
    cmd=("$RT" loadbench "$packed" --batch-size "$B" --workers "$WORKERS" --epochs "$EPOCHS"
        --shuffle "$1" --json "${RT_AUG[@]}")
}
cmd_dl() {
    cmd=("$PY" "$top/bench/torch_loader.py" dataloader --data "$src" --batch-size "$B"
        --workers "$1" --epochs 1 --warmup 10 "${DL_AUG[@]}")
}
cmd_tensor() {
    [ "$JITTER" = 0 ] || return 1
    cmd=("$PY" "$top/bench/torch_loader.py" "$1" --data "$src" --batch-size "$B"
        --epochs "$EPOCHS" --warmup 10)
}

echo "== ringtrain loader vs PyTorch input pipelines: augmented CIFAR-10 batches, no model =="
[ "$JITTER" = 0 ] || echo "augmentation: crop + flip + ColorJitter(0.4, 0.4, 0.4) + RandomErasing(0.25) (--jitter)"
bench_machine
echo "software: $("$RT" --version 2>/dev/null | head -n 1); $torch_versions; $(zstd --version | sed 's/^\*\*\* //; s/ \*\*\*$//; s/, by .*//')"
echo "dataset:  $packed (raw codec: zstd blocks; $zrecords train images, 3x32x32)"
echo "          PyTorch reads $src/data_batch_{1..5}.bin"
echo "settings: batch $B, $RUNS runs alternated, $EPOCHS epochs for ringtrain and the tensor ways,"
echo "          1 epoch for each DataLoader; the first 10 batches of each PyTorch run untimed;"
echo "          ringtrain: loadbench's images_per_s, timed from its first batch (with --shuffle"
echo "          exact the first read into RAM comes before that and is shown on its own);"
echo "          page cache warm; zstd: $nshards shards' data sections ($zstored B stored -> $zraw B),"
echo "          decompressed $ZSTD_REPS times per run"
echo "batches:  ringtrain and the tensor ways give uint8 (B,3,32,32) (normalizing is the device's job);"
echo "          DataLoader gives float32 normalized, as torchvision's recipe does"
echo "commands:"
if [ $have_lb = 1 ]; then
    cmd_rt exact && echo "  ${cmd[*]}"
    cmd_rt window && echo "  ${cmd[*]}"
else
    echo "  (ringtrain rows skipped: $RT has no loadbench subcommand)"
fi
for w in 0 1 2; do cmd_dl $w && echo "  ${cmd[*]}"; done
cmd_tensor tensor && echo "  ${cmd[*]}"
cmd_tensor preshift && echo "  ${cmd[*]}"
echo "  $PY $top/bench/zstd_blocks.py $t/blocks.zst ${shards[*]}"
echo "  zstd -q -d -c $t/blocks.zst > /dev/null   (x$ZSTD_REPS)"

# --- the runs ----------------------------------------------------------------
fails=0
# measure WAY RUN: runs cmd with its output in files, records its JSON line.
measure() {
    # shellcheck disable=SC2034 # wall: loadbench and torch_loader.py time themselves
    local way=$1 i=$2 rc wall
    bench_run "$t/$way.out" "$t/$way.err"
    if ! report add "$t/results.jsonl" "$way" "$i" "$t/$way.out" "$zrecords" || [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        bench_show_failure "$rc" "$t/$way.err"
    fi
}
for i in $(seq "$RUNS"); do
    echo "run $i/$RUNS"
    if [ $have_lb = 1 ]; then
        cmd_rt exact && measure rt_exact "$i"
        cmd_rt window && measure rt_window "$i"
    fi
    for w in 0 1 2; do cmd_dl $w && measure "dl$w" "$i"; done
    cmd_tensor tensor && measure tensor "$i"
    cmd_tensor preshift && measure preshift "$i"
    t0=$EPOCHREALTIME
    for _ in $(seq "$ZSTD_REPS"); do zstd -q -d -c "$t/blocks.zst" >/dev/null; done
    t1=$EPOCHREALTIME
    report zstd "$t/results.jsonl" "$i" "$(bench_seconds "$t0" "$t1")" "$ZSTD_REPS" "$zraw" "$zstored" "$t/zstd.out" ||
        fails=$((fails + 1))
done

echo
echo "Medians of $RUNS runs, batch $B, $(nproc) CPUs (${cpu:-unknown CPU}). Ratios are ringtrain's images/s"
echo "over the way's (per core for zstd -d). Cores: CPUs a way can keep busy (ringtrain: its"
echo "--workers $WORKERS; DataLoader: workers + main process; zstd -d: 1), capped at nproc."
echo
report table "$t/results.jsonl" "$(nproc)" "$WORKERS" "$RUNS" "$zrecords"
if [ $have_lb = 0 ]; then
    echo "loader_vs_pytorch: $RT has no loadbench subcommand: no ringtrain rows" >&2
    exit 1
fi
bench_finish $fails
