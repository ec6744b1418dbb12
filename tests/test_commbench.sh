#!/usr/bin/env bash
# test_commbench.sh - `ringtrain commbench` at 1 rank (a plain process) and 2 ranks (mpirun), small sizes:
#   1. every size row of both paths is printed (1K..1M doubling, plus the bucket size
#      0.75 MiB as a row of its own), #wrong is 0 and the exit code 0;
#   2. busbw = algbw * 2(n-1)/n from the printed values (within their rounding), and
#      algbw = size / time; busbw 0 at one rank;
#   3. --json FILE parses and holds the same numbers as the table, the header's fields
#      and the verdict on the bucket size (the last line of the table);
#   4. the data check can fail: with the planted fault (RINGTRAIN_TEST_COMMBENCH_CORRUPT=1:
#      the last rank spoils one element after the reduction) every row reports #wrong 1
#      and the exit code is not 0;
#   5. bad options exit 2.
# Usage: test_commbench.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=${1:?usage: test_commbench.sh path/to/ringtrain}
[ -x "$RT" ] || { echo "not an executable: $RT"; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # absolute: mpirun execs it
command -v mpirun >/dev/null 2>&1 || { echo "skip: mpirun not found"; exit 77; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: python3 not found (needed to read JSON)"; exit 77; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine, whatever launched this script: no launcher variables leak into the runs.
for v in $(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_COMM_WORLD)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE RINGTRAIN_TEST_COMMBENCH_CORRUPT

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$(cd "$(dirname "$0")" && pwd)/train_lib.sh"
show() { sed 's/^/     | /' "$@" | tail -n 15; }

# mpi NP ARGS...: NP ranks under mpirun on this machine, or for NP 1 a plain process (no launcher: the
# world of one rt_comm_create makes without MPI); never longer than a minute.
mpi() {
    local np=$1
    shift
    if [ "$np" -eq 1 ]; then
        timeout -k 5 60 "$@"
    else
        timeout -k 5 60 mpirun -np "$np" --bind-to none --oversubscribe -x RINGTRAIN_TEST_COMMBENCH_CORRUPT "$@"
    fi
}
mpirun -np 2 --bind-to none --oversubscribe true >"$W/smoke" 2>&1 || { echo "skip: mpirun cannot start 2 processes here:"; show "$W/smoke"; exit 77; }

# Small sizes, a bucket size off the doubling grid, the CPU path (the same binary on a GPU machine would
# take NCCL for the bucketer under --device auto; this test is about the tool, not the device).
ARGS=(commbench --max-bytes 1M --iters 5 --warmup 2 --bucket-mb 0.75 --device cpu)

# check OUT JSON NP MODE: the table and the JSON of one run; MODE ok (#wrong 0) or fault (#wrong 1 per row).
check() {
    "$PY" - "$@" <<'EOF'
import json, re, sys
out, jpath, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sizes = [1024 << k for k in range(11)] + [786432]
sizes.sort()
paths = ["comm", "bucketer"]
errs = []
rows, path, avg, verdict, header = {}, None, {}, None, None
for line in open(out, errors="replace"):
    line = line.rstrip("\n")
    m = re.match(r"# path (\w+):", line)
    if m:
        path = m.group(1)
        continue
    m = re.match(r"# Avg bus bandwidth\s*: (\S+) \((\w+)\)", line)
    if m:
        avg[m.group(2)] = float(m.group(1))
        continue
    if line.startswith("# ranks "):
        header = line
    if line.startswith("# bucket "):
        verdict = line
    if line.startswith("#") or not line.strip() or line.startswith("{"):
        continue
    f = line.split()
    if len(f) != 10 or f[2] != "float" or f[3] != "sum" or f[4] != "-1":
        continue  # mpirun's or the library's own lines
    size, count = int(f[0]), int(f[1])
    if (path, size) in rows:
        errs.append("row %s %d printed twice" % (path, size))
    rows[(path, size)] = dict(count=count, time=f[5], algbw=f[6], busbw=f[7], wrong=int(f[8]), maxtime=f[9])

def dec(s):  # the rounding of a printed number: half a unit of its last digit
    return 0.5 * 10 ** -(len(s.split(".")[1]) if "." in s else 0)

factor = 2.0 * (n - 1) / n
for p in paths:
    for s in sizes:
        r = rows.get((p, s))
        if r is None:
            errs.append("no row for %s %d" % (p, s))
            continue
        if r["count"] != s // 4:
            errs.append("%s %d: count %d" % (p, s, r["count"]))
        want = 0 if mode == "ok" else 1
        if r["wrong"] != want:
            errs.append("%s %d: #wrong %d, expected %d" % (p, s, r["wrong"], want))
        alg, bus, t = float(r["algbw"]), float(r["busbw"]), float(r["time"])
        if abs(bus - alg * factor) > dec(r["busbw"]) + dec(r["algbw"]) * factor + 1e-9:
            errs.append("%s %d: busbw %s != algbw %s * %g" % (p, s, r["busbw"], r["algbw"], factor))
        if n == 1 and bus != 0:
            errs.append("%s %d: busbw %s at one rank" % (p, s, r["busbw"]))
        if float(r["maxtime"]) + dec(r["maxtime"]) < t - dec(r["time"]):
            errs.append("%s %d: maxtime %s below the mean %s" % (p, s, r["maxtime"], r["time"]))
if sorted(set(k[1] for k in rows)) != sizes:
    errs.append("sizes printed: %s" % sorted(set(k[1] for k in rows)))
if not header or not re.search(r"# ranks %d hosts 1 " % n, header):
    errs.append("header: %r" % header)
if sorted(avg) != sorted(paths):
    errs.append("Avg bus bandwidth lines: %s" % avg)
if not verdict:
    errs.append("no verdict line on the bucket size")
elif n == 1 and "one rank" not in verdict:
    errs.append("verdict at one rank: %s" % verdict)
elif n > 1 and not re.search(r"# bucket 0.75 MiB \(786432 B, bucketer path\): busbw \S+ GB/s = \d+% of the best "
                             r"measured, \S+ GB/s at \d+ B: (yes|no)", verdict):
    errs.append("verdict: %s" % verdict)

try:
    j = json.load(open(jpath))
except Exception as e:
    errs.append("JSON does not parse: %s" % e)
    j = None
if j is not None:
    for k, v in dict(command="commbench", collective="all_reduce", type="float", redop="sum", ranks=n, hosts=1,
                     device="cpu", min_bytes=1024, max_bytes=1 << 20, factor=2, warmup=2, iters=5).items():
        if j.get(k) != v:
            errs.append("JSON %s: %r, expected %r" % (k, j.get(k), v))
    for k in ("cpu", "collectives", "host_names", "gpu", "nccl", "avg_busbw", "bucket", "wrong"):
        if k not in j:
            errs.append("JSON lacks %s" % k)
    seen = set()
    for e in j.get("results", []):
        key = (e["path"], e["size"])
        seen.add(key)
        r = rows.get(key)
        if r is None:
            errs.append("JSON row %s not in the table" % (key,))
            continue
        for col, field in (("time", "time_us"), ("maxtime", "max_time_us"), ("algbw", "algbw"), ("busbw", "busbw")):
            if abs(float(r[col]) - e[field]) > dec(r[col]) + 1e-9:
                errs.append("%s: printed %s %s, JSON %r" % (key, col, r[col], e[field]))
        if e["wrong"] != r["wrong"] or e["count"] != r["count"]:
            errs.append("%s: #wrong/count differ between the table and JSON" % (key,))
        if e["time_us"] > 0 and abs(e["algbw"] - e["size"] / (e["time_us"] * 1e3)) > 1e-9 * e["algbw"] + 1e-12:
            errs.append("%s: JSON algbw %r is not size / time" % (key, e["algbw"]))
        if abs(e["busbw"] - e["algbw"] * factor) > 1e-9 * e["algbw"] + 1e-12:
            errs.append("%s: JSON busbw %r != algbw * %g" % (key, e["busbw"], factor))
    if seen != set(rows):
        errs.append("JSON holds %d rows, the table %d" % (len(seen), len(rows)))
    for p in paths:
        if abs(j.get("avg_busbw", {}).get(p, -1) - avg.get(p, -2)) > 1e-5 * (1 + avg.get(p, 0)):
            errs.append("avg busbw %s: JSON %r, printed %r" % (p, j.get("avg_busbw", {}).get(p), avg.get(p)))
    b = j.get("bucket", {})
    if b.get("bytes") != 786432 or b.get("path") != "bucketer" or b.get("measured") is not True:
        errs.append("JSON bucket: %s" % b)
    elif n > 1:
        bus = [e["busbw"] for e in j["results"] if e["path"] == "bucketer"]
        at = [e["busbw"] for e in j["results"] if e["path"] == "bucketer" and e["size"] == 786432][0]
        if abs(b["fraction"] - at / max(bus)) > 1e-9 or b["best_busbw"] != max(bus):
            errs.append("JSON bucket fraction %r, expected %r" % (b["fraction"], at / max(bus)))
    if j.get("wrong") != sum(e["wrong"] for e in j.get("results", [])):
        errs.append("JSON wrong %r" % j.get("wrong"))
for e in errs[:12]:
    print("   ", e)
sys.exit(1 if errs else 0)
EOF
}

for np in 1 2; do
    run="np $np"
    rc=0
    mpi "$np" "$RT" "${ARGS[@]}" --json "$W/np$np.json" >"$W/np$np.out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$run: exit $rc"
        show "$W/np$np.out"
    elif check "$W/np$np.out" "$W/np$np.json" "$np" ok >"$W/np$np.check" 2>&1; then
        pass "$run: 24 rows (2 paths x 12 sizes), #wrong 0, busbw = algbw x 2(n-1)/n, JSON matches the table"
    else
        fail "$run: the table or the JSON:"
        cat "$W/np$np.check"
        show "$W/np$np.out"
    fi

    # The planted fault: the check must see it, in every row, and fail the run.
    rc=0
    RINGTRAIN_TEST_COMMBENCH_CORRUPT=1 mpi "$np" "$RT" "${ARGS[@]}" --json "$W/f$np.json" >"$W/f$np.out" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        fail "$run, planted fault: exit $rc, expected a failure"
        show "$W/f$np.out"
    elif ! check "$W/f$np.out" "$W/f$np.json" "$np" fault >"$W/f$np.check" 2>&1; then
        fail "$run, planted fault: the table or the JSON:"
        cat "$W/f$np.check"
        show "$W/f$np.out"
    elif ! grep -q "^# Wrong values *: 12 FAILED" "$W/f$np.out" || ! grep -q "came back wrong" "$W/f$np.out"; then
        fail "$run, planted fault: no FAILED summary or error message"
        show "$W/f$np.out"
    else
        pass "$run, planted fault: #wrong 1 in every row, exit $rc"
    fi
done

# --json to stdout: the last line, after the table.
rc=0
"$RT" commbench --max-bytes 4K --iters 2 --path comm --json >"$W/stdout.out" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && [ "$(jfield "$W/stdout.out" ranks)" = 1 ] && [ "$(tail -n 1 "$W/stdout.out" | cut -c1)" = "{" ]; then
    pass "--json without a file: one JSON line at the end of stdout"
else
    fail "--json to stdout (exit $rc)"
    show "$W/stdout.out"
fi

# Usage errors: exit 2 before anything runs.
f0=$fails
for bad in "--max-bytes 5G" "--min-bytes 2M --max-bytes 1M" "--factor 1" "--iters 0" "--path gpu" \
    "--device tpu" "--bucket-mb 0" "--min-bytes 1Q" "stray"; do
    rc=0
    # shellcheck disable=SC2086 # the options are words
    "$RT" commbench $bad >"$W/usage.out" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || { fail "commbench $bad: exit $rc, expected 2"; show "$W/usage.out"; }
done
"$RT" commbench --help >"$W/help.out" 2>&1 && grep -q -- "--bucket-mb" "$W/help.out" || fail "--help"
[ "$fails" -eq "$f0" ] && pass "usage errors exit 2, --help prints the options"

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all passed"
exit 0
