# shellcheck shell=bash
# lib.sh - sourced by the bench/ scripts: what each prints about the machine
# before it measures, so that a figure can be read against the machine it came
# from and a busy machine is flagged, and the pieces they share: options and
# their checks, prerequisites, the scratch directory, datasets, alternation
# and timing, medians, and the report helper's Python.
#
# Source it near the top, after `set -eu`; it only defines functions. Messages start
# with the script's name ($bench_name, e.g. "train_vs_pytorch"). Functions
# that read a ringtrain binary use $RT, the ones that run a measurement's
# command line read the array cmd, as the scripts name them.

bench_name=${0##*/}
bench_name=${bench_name%.sh}

# Sets $cpu (the CPU model) and prints the machine line and how busy the CPUs
# were over the second before the runs (from /proc/stat), with a note above 10 %.
bench_machine() {
    local a b busy
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    echo "machine:  $(nproc) CPUs (nproc), ${cpu:-unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, Linux $(uname -r)"
    a=$(head -n 1 /proc/stat)
    sleep 1
    b=$(head -n 1 /proc/stat)
    busy=$(echo "$a $b" | awk '{for (i = 2; i <= 9; i++) { t0 += $i; t1 += $(i + 11) }
        idle = ($16 + $17) - ($5 + $6); printf "%.0f", 100 * (1 - idle / (t1 - t0))}')
    echo "busy:     ${busy} % of the CPUs busy in the second before the runs"
    if [ "$busy" -gt 10 ]; then
        echo "          NOTE: something else is using the CPUs; these numbers will be low and noisy"
    fi
}

# --- options -----------------------------------------------------------------------

# bench_usage [STATUS]: prints the script's header comment (line 2 up to
# `set -eu`, without the "# ") and exits with STATUS (default 0).
bench_usage() {
    sed -n '2,/^set -eu/p' "$0" | sed -n 's/^# \{0,1\}//p'
    exit "${1:-0}"
}

# bench_fail MESSAGE...: prints "NAME: MESSAGE" on stderr and exits 2 (a usage
# error or a missing prerequisite).
bench_fail() {
    echo "$bench_name: $*" >&2
    exit 2
}

# bench_options SPEC... -- ARGS...: parses the command line ARGS. Each SPEC is
# "--flag=VAR", an option taking a value that goes to the variable VAR, or
# "--flag=VAR:VALUE", a switch setting VAR to VALUE. -h and --help print the
# usage; an unknown option prints "NAME: unknown option 'X'" and the usage on
# stderr and exits 2, as does an option without its value.
bench_options() {
    local -A takes=() sets=()
    local spec flag var
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        flag=${1%%=*}
        var=${1#*=}
        case $var in
        *:*) sets[$flag]=$var ;;
        *) takes[$flag]=$var ;;
        esac
        shift
    done
    if [ $# -gt 0 ]; then shift; fi
    while [ $# -gt 0 ]; do
        case $1 in
        -h | --help) bench_usage 0 ;;
        esac
        if [ -n "${takes[$1]+x}" ]; then
            [ $# -ge 2 ] || { echo "$bench_name: $1 needs a value" >&2; bench_usage 2 >&2; }
            printf -v "${takes[$1]}" '%s' "$2"
            shift 2
        elif [ -n "${sets[$1]+x}" ]; then
            spec=${sets[$1]}
            printf -v "${spec%%:*}" '%s' "${spec#*:}"
            shift
        else
            echo "$bench_name: unknown option '$1'" >&2
            bench_usage 2 >&2
        fi
    done
}

# bench_posint VALUE...: exits 2 naming the first VALUE that is not a positive
# integer.
bench_posint() {
    local v
    for v in "$@"; do
        case $v in '' | *[!0-9]* | 0) bench_fail "'$v' is not a positive integer" ;; esac
    done
}

# bench_posnum VALUE: 0 when VALUE is a positive decimal number (1, 0.5, .25).
bench_posnum() { awk -v x="$1" 'BEGIN { exit !(x ~ /^[0-9]*\.?[0-9]+$/ && x + 0 > 0) }'; }

# bench_accuracy VALUE: 0 when VALUE is an accuracy in (0, 1].
bench_accuracy() { awk -v a="$1" 'BEGIN { exit !(a ~ /^[0-9]*\.?[0-9]+$/ && a + 0 > 0 && a + 0 <= 1) }'; }

# bench_list ARRAY LIST OPTION [NOTE]: splits the comma-separated LIST into the
# array named ARRAY; exits 2 ("OPTION is empty" and NOTE) when it holds nothing.
bench_list() {
    local -n bench_list_out=$1
    IFS=, read -r -a bench_list_out <<<"$2"
    [ ${#bench_list_out[@]} -gt 0 ] || bench_fail "$3 is empty${4:-}"
}

# bench_bin PATH: PATH, or where PATH is found on $PATH when it has no slash.
bench_bin() {
    case $1 in */*) echo "$1" ;; *) command -v "$1" || echo "$1" ;; esac
}

# --- prerequisites -----------------------------------------------------------------

# bench_sudo: sets $sudo to "sudo " unless this runs as root, for the install
# hints.
bench_sudo() {
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo "
}

# bench_need_bin [NOTE [CMAKE_OPTIONS]]: exits 2 with the command that builds
# it when $RT is not an executable. NOTE follows "build it" (e.g. what the
# build needs); CMAKE_OPTIONS are added to the configure command.
bench_need_bin() {
    [ ! -x "$RT" ] || return 0
    echo "$bench_name: no ringtrain binary at $RT; build it${1:-}:" >&2
    echo "  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release${2:+ $2} && cmake --build build" >&2
    exit 2
}

# bench_need_torch WHAT PYTHON SCRIPT ARGS...: runs PYTHON SCRIPT ARGS (a
# torch_*.py check, printing the versions) into $torch_versions; when PYTHON
# is not there or the check fails, exits 2 saying "WHAT" (e.g. "PyTorch for
# /usr/bin/python3 is missing"), what the check printed and how to install.
bench_need_torch() {
    local what=$1 py=$2
    shift 2
    if [ ! -x "$py" ] || ! torch_versions=$("$py" "$@"); then
        echo "$bench_name: $what${torch_versions:+ ($torch_versions)}; install:" >&2
        echo "  ${sudo}apt-get install -y python3-torch python3-torchvision" >&2
        exit 2
    fi
}

# --- scratch, datasets ---------------------------------------------------------------

# bench_scratch PREFIX: sets $t to a new directory ${TMPDIR:-/tmp}/PREFIX-XXXXXX,
# removed when the script exits.
bench_scratch() {
    t=$(mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX")
    trap 'rm -rf "$t"' EXIT
}

# bench_dataset [--quiet] SRC PACKED SYNTH_NOTE PACK_NOTE [SYNTH_OPTIONS...]:
# the synthetic CIFAR-10 datasets the benchmarks keep between runs. SRC (the
# original binary files under SRC/cifar-10-batches-bin) is made with
# `$RT synth --out SRC --format cifar10 SYNTH_OPTIONS` unless it holds
# data_batch_5.bin and test_batch.bin; PACKED with `$RT pack SRC --out PACKED
# --force` unless it holds manifest.json. Each step is announced: "making SRC
# (ringtrain synth<SYNTH_NOTE>)", "packing PACKED (ringtrain pack<PACK_NOTE>)";
# --quiet hides the commands' own output.
bench_dataset() {
    local quiet=0
    if [ "$1" = --quiet ]; then
        quiet=1
        shift
    fi
    local src=$1 packed=$2 synth_note=$3 pack_note=$4
    shift 4
    if [ ! -f "$src/cifar-10-batches-bin/data_batch_5.bin" ] || [ ! -f "$src/cifar-10-batches-bin/test_batch.bin" ]; then
        echo "making $src (ringtrain synth$synth_note)"
        bench_quiet_if $quiet "$RT" synth --out "$src" --format cifar10 "$@"
    fi
    if [ ! -f "$packed/manifest.json" ]; then
        echo "packing $packed (ringtrain pack$pack_note)"
        bench_quiet_if $quiet "$RT" pack "$src" --out "$packed" --force
    fi
}
# bench_quiet_if 1|0 COMMAND...: COMMAND with its stdout to /dev/null, or not.
bench_quiet_if() {
    if [ "$1" = 1 ]; then
        shift
        "$@" >/dev/null
    else
        shift
        "$@"
    fi
}

# --- runs ------------------------------------------------------------------------------

# bench_order RUN FIRST SECOND: "FIRST SECOND" in odd runs, "SECOND FIRST" in
# even ones: the way that goes first swaps every run.
bench_order() {
    if [ $(($1 % 2)) = 1 ]; then echo "$2 $3"; else echo "$3 $2"; fi
}

# bench_alternate RUN WAY...: the WAYs in their order in odd runs, reversed in
# even ones (bench_order for any number of ways; a way holds no space).
bench_alternate() {
    local run=$1
    shift
    if [ $((run % 2)) = 1 ]; then echo "$*"; else printf '%s\n' "$@" | tac | paste -sd ' '; fi
}

# bench_scaled_steps N F: N x F rounded, at least 1 (--steps-scale).
bench_scaled_steps() { awk -v n="$1" -v f="$2" 'BEGIN { s = int(n * f + 0.5); print s < 1 ? 1 : s }'; }

# bench_seconds T0 T1: T1 - T0, two $EPOCHREALTIME readings (LC_ALL=C: a decimal point).
bench_seconds() { awk -v a="$1" -v b="$2" 'BEGIN {print b - a}'; }

# bench_run OUT ERR: runs the measurement's command line, the array cmd, with
# its stdout in OUT and its stderr in ERR; sets rc to its exit status and wall
# to its wall-clock seconds (declare both local in the caller).
# shellcheck disable=SC2034,SC2154 # rc, wall and cmd are the caller's
bench_run() {
    local t0 t1
    rc=0
    t0=$EPOCHREALTIME
    "${cmd[@]}" >"$1" 2>"$2" || rc=$?
    t1=$EPOCHREALTIME
    wall=$(bench_seconds "$t0" "$t1")
}

# bench_show_failure RC ERR [OUT]: on stderr, the exit status and command line
# (the array cmd) of a failed measurement and the last 5 lines of ERR; the
# last 3 of OUT instead when ERR is empty and OUT is given.
bench_show_failure() {
    echo "    exit status $1 from: ${cmd[*]}" >&2
    if [ -n "${3:-}" ] && [ ! -s "$2" ]; then
        tail -n 3 "$3" | sed 's/^/    /' >&2
    else
        tail -n 5 "$2" | sed 's/^/    /' >&2
    fi
}

# bench_show_rank_failure RC ERR: the same for a multi-rank launch (mpirun, torchrun): the first 3 lines of ERR
# hold the program's own complaint, the last 6 the launcher's report of which rank failed.
bench_show_rank_failure() {
    echo "    exit status $1 from: ${cmd[*]}" >&2
    if [ "$(wc -l <"$2")" -gt 10 ]; then
        { head -n 3 "$2"; echo "[...]"; tail -n 6 "$2"; } | sed 's/^/    /' >&2
    else
        sed 's/^/    /' "$2" >&2
    fi
}

# bench_finish FAILS: exits 1 saying how many measurements failed when FAILS > 0.
bench_finish() {
    if [ "$1" -gt 0 ]; then
        echo "$bench_name: $1 measurement(s) failed (above)" >&2
        exit 1
    fi
}

# --- the machine's ceiling -----------------------------------------------------------------

# bench_jpeg_ceiling_build: builds bench/jpeg_ceiling.c (libjpeg-turbo's own
# full-size decode rate on a folder, the ceiling of a JPEG-decoding loader or
# packer) into $t/jpeg_ceiling with cc -O2. Returns 1, having printed
# "ceiling:  n/a (why)", where it cannot (no C compiler, no libturbojpeg).
# shellcheck disable=SC2154 # top and t are the caller's
bench_jpeg_ceiling_build() {
    if ! command -v cc >/dev/null 2>&1; then
        echo "ceiling:  n/a (no C compiler 'cc' to build bench/jpeg_ceiling.c)"
        return 1
    fi
    if ! pkg-config --exists libturbojpeg 2>/dev/null; then
        echo "ceiling:  n/a (no libturbojpeg for pkg-config; ${sudo:-}apt-get install -y libturbojpeg0-dev)"
        return 1
    fi
    # shellcheck disable=SC2046 # pkg-config's flags are words
    if ! cc -O2 -o "$t/jpeg_ceiling" "$top/bench/jpeg_ceiling.c" $(pkg-config --cflags --libs libturbojpeg) \
        -lpthread 2>"$t/ceiling.err"; then
        echo "ceiling:  n/a (bench/jpeg_ceiling.c does not build: $(head -n 1 "$t/ceiling.err"))"
        return 1
    fi
}

# bench_ceiling THREADS OUT [brief]: the GFLOP/s of one large fp32 and one
# bf16 matrix product through oneDNN on THREADS threads (bench/gemm_ceiling.c,
# built once into $t with `cc -O2 ... -ldnnl`, run with
# OMP_NUM_THREADS=THREADS). Writes its JSON line to OUT and prints
# "ceiling:  fp32 ... GFLOP/s, bf16 ..." and a line on how (with "brief": one
# indented line, for a run among others); bf16 says "n/a (why)" where oneDNN
# has no native bf16 matmul here. Returns 1, having printed "ceiling: n/a
# (why)" and left OUT empty, when it cannot be built or run (no C compiler,
# no libdnnl-dev).
# shellcheck disable=SC2154 # top and t are the caller's
bench_ceiling() {
    local threads=$1 out=$2 brief=${3:-} src=$top/bench/gemm_ceiling.c
    : >"$out"
    if [ ! -x "$t/gemm_ceiling" ]; then
        if ! command -v cc >/dev/null 2>&1; then
            echo "${brief:+  }ceiling:  n/a (no C compiler 'cc' to build bench/gemm_ceiling.c)"
            return 1
        fi
        if ! cc -O2 "$src" -o "$t/gemm_ceiling" -ldnnl 2>"$t/gemm_ceiling.err"; then
            echo "${brief:+  }ceiling:  n/a (bench/gemm_ceiling.c does not build: $({ grep -m 1 -i 'error' "$t/gemm_ceiling.err" ||
                head -n 1 "$t/gemm_ceiling.err"; } | sed 's/^[^ ]*: //');"
            echo "${brief:+  }          ${sudo:-}apt-get install -y libdnnl-dev)"
            rm -f "$t/gemm_ceiling"
            return 1
        fi
    fi
    if ! OMP_NUM_THREADS=$threads "$t/gemm_ceiling" >"$out" 2>"$t/gemm_ceiling.err" || ! [ -s "$out" ]; then
        echo "${brief:+  }ceiling:  n/a (gemm_ceiling failed: $(tail -n 1 "$t/gemm_ceiling.err"))"
        : >"$out"
        return 1
    fi
    "${PY:-python3}" -c 'import json, sys
c = json.loads(open(sys.argv[1]).read())
if sys.argv[2]:
    print("  ceiling   fp32 %.1f GFLOP/s (%.1f - %.1f), bf16 %s" % (
        c["fp32_gflops"], c["fp32_gflops_min"], c["fp32_gflops_max"], "%.1f GFLOP/s (%.1f - %.1f)" % (
            c["bf16_gflops"], c["bf16_gflops_min"], c["bf16_gflops_max"]) if c["bf16_gflops"] else "n/a"))
    sys.exit(0)
b = "%.1f GFLOP/s (%.1f - %.1f; matmul, bf16 in, fp32 out, %s)" % (
    c["bf16_gflops"], c["bf16_gflops_min"], c["bf16_gflops_max"], c["bf16_impl"]) if c["bf16_gflops"] else \
    "n/a (%s)" % c["bf16_note"]
print("ceiling:  fp32 %.1f GFLOP/s (%.1f - %.1f; dnnl_sgemm), bf16 %s:" % (
    c["fp32_gflops"], c["fp32_gflops_min"], c["fp32_gflops_max"], b))
print("          %dx%dx%d products on %s threads, median of %d after %d warm-up; oneDNN %s, ISA %s" % (
    c["size"], c["size"], c["size"], c["threads"], c["repeats"], c["warmup"], c["onednn"], c["isa"]))' "$out" "$brief"
}

# bench_ceiling_merge OUT FILE...: OUT = the first FILE's JSON with each
# GFLOP/s the median of the FILEs' medians (min of the mins, max of the
# maxima) and "rounds" their count; the empty FILEs (failed runs) left out.
# Returns 1, OUT empty, when none holds a figure.
bench_ceiling_merge() {
    local out=$1
    shift
    "${PY:-python3}" -c 'import json, statistics, sys
cs = []
for p in sys.argv[2:]:
    try:
        cs.append(json.loads(open(p).read()))
    except (OSError, ValueError):
        pass
if not cs:
    open(sys.argv[1], "w").close()
    sys.exit(1)
m = dict(cs[0], rounds=len(cs))
for k in ("fp32", "bf16"):
    xs = [c[k + "_gflops"] for c in cs if c.get(k + "_gflops")]
    if xs:
        m[k + "_gflops"] = statistics.median(xs)
        m[k + "_gflops_min"] = min(c[k + "_gflops_min"] for c in cs if c.get(k + "_gflops"))
        m[k + "_gflops_max"] = max(c[k + "_gflops_max"] for c in cs if c.get(k + "_gflops"))
open(sys.argv[1], "w").write(json.dumps(m) + "\n")' "$out" "$@"
}

# --- numbers -----------------------------------------------------------------------------

# bench_median: the median of the numbers on stdin, one a line (the mean of
# the middle two for an even count).
bench_median() { sort -n | awk '{a[NR]=$1} END{print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# bench_json_field PYTHON FILE KEY: KEY of the last line of FILE that starts
# with '{', when it is a string or a number; nothing otherwise.
bench_json_field() {
    "$1" -c 'import json, sys
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith("{")]
v = json.loads(lines[-1]).get(sys.argv[2]) if lines else None
print(v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else "")' "$2" "$3" 2>/dev/null || true
}

# bench_report_helper FILE: writes the report helper FILE (run with python3):
# the Python below, which the scripts' helpers share, then the script's own
# part read from stdin.
#   json_lines(path)      the lines of path that start with '{'
#   last_json(path)       the last of them as a dict, or None
#   last_line_json(path)  the last non-empty line of path as a dict, or None
#   isnum(x)              x is an int or a float (not a bool)
#   load(results)         the records of a results JSON Lines file ([] if none)
#   setup_line(path)      ringtrain's set-up line in path ("ringtrain train: ..."
#                         without its first word), or ""
#   backends(results)     prints each record's "backend" once, "ringtrain: ..."
#   med_lo_hi(xs)         (median, min, max)
#   tta_rows(rs, target)  the time-to-accuracy table of records rs (ways "rt",
#                         "pt", named by the script's WAY); returns {way:
#                         (median time, runs reaching target, runs)}
#   tta_goal(med, target, epochs)  the goal cell from tta_rows' result, or None
#                         without both ways
#   main(commands)        runs commands[argv[1]](*argv[2:]); exits with its result
bench_report_helper() {
    {
        cat <<'EOF'
import json, statistics, sys

def json_lines(path):
    """The lines starting with '{' (only rank 0 prints one)."""
    try:
        return [l for l in open(path, errors="replace").read().splitlines() if l.startswith("{")]
    except OSError:
        return []

def last_json(path):
    """The last of them as a JSON object, or None."""
    try:
        obj = json.loads(json_lines(path)[-1])
    except (IndexError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None

def last_line_json(path):
    """The last non-empty line of path as a JSON object, or None."""
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.strip()]
        obj = json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None

def isnum(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)

def load(results):
    try:
        return [json.loads(l) for l in open(results)]
    except OSError:
        return []

def setup_line(path):
    """ringtrain's set-up line, e.g. "world 1 (1 node, 1 rank per node), cpu: 2 threads, ...", or ""."""
    for l in open(path, errors="replace"):
        if l.startswith("ringtrain train:"):
            return l.split(":", 1)[1].strip()
    return ""

def backends(results):
    """ringtrain's set-up lines (world, compute backend, BLAS core or GPU), each once."""
    seen = []
    for r in load(results):
        if r.get("backend") and r["backend"] not in seen:
            seen.append(r["backend"])
    for b in seen:
        print("ringtrain: %s" % b)
    return 0

def med_lo_hi(xs):
    return statistics.median(xs), min(xs), max(xs)

def tta_rows(rs, target):
    """Prints the time-to-accuracy table; returns {way: (median s, runs reaching, runs)}."""
    print("| way | time to %.0f %% (median s) | min - max | epochs (median) | test acc at the end "
          "| runs reaching it | training images/s | process wall s |" % (100 * target))
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for w in ("rt", "pt"):
        xs = [r for r in rs if r["way"] == w]
        if not xs:
            print("| %s | n/a | | | | | | |" % WAY[w])
            continue
        ok = [r for r in xs if r["reached"]]
        tm, tlo, thi = med_lo_hi([r["time_s"] for r in xs])
        med[w] = (tm, len(ok), len(xs))
        print("| %s | %.1f | %.1f - %.1f | %g | %.4f | %d of %d | %.0f | %.1f |" % (
            WAY[w], tm, tlo, thi, statistics.median([r.get("epochs", 0) for r in xs]),
            statistics.median([r["val_acc"] for r in xs]), len(ok), len(xs),
            statistics.median([r.get("images_per_s") or 0 for r in xs]),
            statistics.median([r["process_s"] for r in xs])))
    return med

def tta_goal(med, target, epochs):
    """"<PyTorch s / ringtrain s>x PASS|MISS" with why when runs missed the target; None without both ways."""
    if "rt" not in med or "pt" not in med:
        return None
    x = med["pt"][0] / med["rt"][0]
    if med["rt"][1] < med["rt"][2]:
        return "%.2fx MISS (ringtrain reached %.0f %% in %d of %d runs)" % (
            x, 100 * target, med["rt"][1], med["rt"][2])
    if med["pt"][1] < med["pt"][2]:
        return "%.2fx %s (PyTorch missed %.0f %% in %d of %d runs: those times are its full %s epochs)" % (
            x, "PASS" if x >= 1.0 else "MISS", 100 * target, med["pt"][2] - med["pt"][1], med["pt"][2], epochs)
    return "%.2fx %s" % (x, "PASS" if x >= 1.0 else "MISS")

def main(commands):
    """The helper's command line: COMMAND ARGS...; the command's result is the exit status."""
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit(commands[cmd](*args) or 0)

EOF
        cat
    } >"$1"
}
