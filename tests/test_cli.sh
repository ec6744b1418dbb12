#!/usr/bin/env bash
# test_cli.sh - the `ringtrain` command as a user drives it: synth -> pack ->
# verify -> inspect, the values they print, exit codes, and what verify says
# about damaged shards. Usage: test_cli.sh path/to/ringtrain. Exit 0 pass, 1 fail.
set -u
RT=${1:?usage: test_cli.sh path/to/ringtrain}
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-cli-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
checks=0

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# expect_rc WANT CMD...: runs CMD, output to $T/out, checks the exit code.
expect_rc() {
    local want=$1; shift
    checks=$((checks + 1))
    "$@" >"$T/out" 2>&1
    local rc=$?
    [ "$rc" -eq "$want" ] || { fail "exit $rc (wanted $want): $*"; sed 's/^/    /' "$T/out" >&2; }
}
# expect_out REGEX: the last command's output matches.
expect_out() {
    checks=$((checks + 1))
    grep -Eq -- "$1" "$T/out" || { fail "output lacks /$1/"; sed 's/^/    /' "$T/out" >&2; }
}

expect_rc 0 "$RT" --version
expect_out '^ringtrain [0-9]+\.[0-9]+\.[0-9]+'
expect_out 'cpu +[0-9]+ CPUs'
expect_out 'zstd +[0-9.]+ / [0-9.]+'
expect_rc 0 "$RT" --help
expect_out 'pack'
expect_rc 2 "$RT" frobnicate
expect_rc 2 "$RT" pack
expect_rc 2 "$RT" synth --out "$T/x" --format cifar11
expect_rc 2 "$RT" pack "$T" --out "$T/y" --quality 0

expect_rc 0 "$RT" synth --out "$T/src" --train 500 --test 100 --seed 3
expect_out 'wrote 500 train \+ 100 test'
[ -f "$T/src/cifar-10-batches-bin/data_batch_5.bin" ] || fail "synth layout"
expect_rc 0 "$RT" pack "$T/src" --out "$T/ds" --val-split 0.2 --split-seed 1 --shard-size 400K
expect_out 'pack: 600 records \(train 400, val 100, test 100\) from cifar10-bin'
expect_out 'ratio [0-9.]+'
expect_out '[0-9.]+ MB/s'
[ ! -e "$T/ds.partial" ] || fail "pack left ds.partial"

expect_rc 0 "$RT" verify "$T/ds"
expect_out '^OK .*: [0-9]+ shards, 600 records'
expect_rc 0 "$RT" inspect "$T/ds"
expect_out '^train +400 +[0-9]+'
expect_out '^val +100 +1'
expect_out '^test +100 +1'
expect_out 'shape +3x32x32'
# The training split's per-channel normalisation statistics, from the manifest.
expect_out '^mean +0\.[0-9]{4} 0\.[0-9]{4} 0\.[0-9]{4}  \(training split'
expect_out '^std +0\.[0-9]{4} 0\.[0-9]{4} 0\.[0-9]{4}$'
# Per-class counts in the summary add up to the split sizes.
awk '/^ +[0-9]+  /{t+=$(NF-2); v+=$(NF-1); s+=$NF} END{exit !(t==400 && v==100 && s==100)}' "$T/out" ||
    fail "class counts in inspect do not add up to 400/100/100"

# A manifest written before "mean"/"std" existed still loads; inspect says they are missing.
cp -r "$T/ds" "$T/old"
sed -i '/"mean": \[/,/\],/d; /"std": \[/,/\],/d' "$T/old/manifest.json"
expect_rc 0 "$RT" inspect "$T/old"
expect_out '^mean +not recorded'
expect_out '^train +400 '

expect_rc 0 "$RT" inspect "$T/ds" --record 17 --split test --out "$T/r17.png"
expect_out '^record 17 of test: label [0-9] \('
head -c 8 "$T/r17.png" | od -An -tx1 | grep -q '89 50 4e 47 0d 0a 1a 0a' || fail "r17.png is not a PNG"
expect_rc 0 "$RT" inspect "$T/ds" --record 3 --out "$T/r3.ppm"
[ "$(head -c 2 "$T/r3.ppm")" = P6 ] && [ "$(stat -c %s "$T/r3.ppm")" -eq $((3072 + 13)) ] || fail "r3.ppm"
expect_rc 1 "$RT" inspect "$T/ds" --record 100 --split test
expect_out 'out of range'

# The label inspect prints is the label byte in the source file (test record 17).
want=$(od -An -tu1 -j $((17 * 3073)) -N1 "$T/src/cifar-10-batches-bin/test_batch.bin" | tr -d ' ')
"$RT" inspect "$T/ds" --record 17 --split test | grep -q "label $want " || fail "record 17 label is not $want"

# Damage: one flipped byte in a block, a truncated shard, a missing shard.
cp -r "$T/ds" "$T/bad"
f=$(ls "$T/bad"/train-*.rts | head -1)
printf '\xff' | dd of="$f" bs=1 seek=40000 conv=notrunc status=none
expect_rc 1 "$RT" verify "$T/bad"
expect_out "FAIL .*$(basename "$f"): block [0-9]+ .*checksum mismatch"
expect_out "FAIL .*$(basename "$f"): file checksum"
expect_out '^[0-9]+ problems? in'
cp "$T/ds/$(basename "$f")" "$f"
truncate -s -1000 "$f"
expect_rc 1 "$RT" verify "$T/bad"
expect_out "FAIL .*$(basename "$f").*(truncated|size)"
rm "$f"
expect_rc 1 "$RT" verify "$T/bad"
expect_out "FAIL .*$(basename "$f"): missing"
echo '{"format": "ringtrain-dataset", "version": 7}' >"$T/bad/manifest.json"
expect_rc 1 "$RT" verify "$T/bad"
expect_out 'newer ringtrain'
expect_rc 1 "$RT" verify "$T"
expect_out 'not a packed dataset'

# A failing pack leaves no dataset; an existing one is not clobbered without --force.
truncate -s -5 "$T/src/cifar-10-batches-bin/data_batch_2.bin"
expect_rc 1 "$RT" pack "$T/src" --out "$T/ds2"
expect_out 'data_batch_2.bin: .*3073-byte records'
[ ! -e "$T/ds2" ] && [ ! -e "$T/ds2.partial" ] || fail "failed pack left output"
expect_rc 1 "$RT" pack "$T/src" --out "$T/ds"
expect_out 'already holds a packed dataset'

# MNIST end to end, jpeg codec.
expect_rc 0 "$RT" synth --format mnist --out "$T/mn" --train 300 --test 50
expect_rc 0 "$RT" pack "$T/mn" --out "$T/mnds" --codec jpeg --quality 95
expect_out 'from mnist-idx'
expect_rc 0 "$RT" verify "$T/mnds"
expect_rc 0 "$RT" inspect "$T/mnds"
expect_out '^mean +0\.[0-9]{4}  \(training split'
expect_rc 0 "$RT" inspect "$T/mnds" --record 0 --out "$T/m0.pgm"
[ "$(head -c 2 "$T/m0.pgm")" = P5 ] || fail "m0.pgm is not a PGM"

# loadbench: same digest from io_uring and the pread pool, and across worker counts;
# the JSON line carries the figures; the JPEG path decodes; bad options are usage errors.
expect_rc 0 "$RT" loadbench "$T/ds" --batch-size 32 --epochs 2 --workers 1,2 --io uring --digest --json
expect_out 'digest: [0-9a-f]{16} \(identical for every worker count\)'
expect_out '^\{"images_per_s":[0-9.]+,.*"workers":2,"batch_size":32,.*"stages":\{"io":'
expect_out 'verdict: '
d1=$(grep -o 'digest: [0-9a-f]*' "$T/out" | head -1)
expect_rc 0 "$RT" loadbench "$T/ds" --batch-size 32 --epochs 2 --workers 3 --io pread --queue-depth 1 --digest
d2=$(grep -o 'digest: [0-9a-f]*' "$T/out" | head -1)
[ -n "$d1" ] && [ "$d1" = "$d2" ] || fail "io_uring digest '$d1' != pread digest '$d2'"
RINGTRAIN_NO_IO_URING=1 expect_rc 0 "$RT" loadbench "$T/ds" --batch-size 32 --epochs 2 --workers 2 --digest
expect_out 'io_uring unavailable .*pread threads instead'
d3=$(grep -o 'digest: [0-9a-f]*' "$T/out" | head -1)
[ "$d1" = "$d3" ] || fail "fallback digest '$d3' != '$d1'"
expect_rc 0 "$RT" loadbench "$T/ds" --split val --batch-size 64 --epochs 1 --world 3 --rank 2
expect_out 'last batch pad, aug none, rank 2/3'
expect_rc 0 "$RT" loadbench "$T/mnds" --batch-size 16 --epochs 1 --shuffle window --window-blocks 2
expect_out 'decode +[0-9.]+ +[0-9.]+% +[0-9]+ img/s/core'
expect_rc 2 "$RT" loadbench "$T/ds" --workers 0
expect_rc 2 "$RT" loadbench "$T/ds" --aug crop,wobble
expect_rc 1 "$RT" loadbench "$T/ds" --batch-size 100000
expect_out 'too few for 1 rank\(s\) x batch 100000'
# Many shards: the soft open-file limit is raised as needed; a hard limit too low is explained.
expect_rc 0 "$RT" synth --out "$T/src2" --train 400 --test 50
expect_rc 0 "$RT" pack "$T/src2" --out "$T/many" --shard-size 20K
expect_rc 0 bash -c "ulimit -Sn 40 && exec '$RT' loadbench '$T/many' --batch-size 16 --epochs 1 --digest"
expect_out 'digest: [0-9a-f]{16}'
expect_rc 1 bash -c "ulimit -n 40 && exec '$RT' loadbench '$T/many' --batch-size 16 --epochs 1"
expect_out 'open files, but `ulimit -n` allows 40'
# Beyond `ulimit -l` the slots are pageable, said in one line; --pin stops with the numbers and the fix
# (as root this needs setpriv to drop CAP_IPC_LOCK; an ordinary user has no such capability).
nocap=()
[ "$(id -u)" -eq 0 ] && nocap=(setpriv --inh-caps=-all --bounding-set=-ipc_lock)
if [ ${#nocap[@]} -eq 0 ] || { command -v setpriv >/dev/null && setpriv --bounding-set=-ipc_lock true 2>/dev/null; }; then
    expect_rc 0 bash -c 'ulimit -l 64 && exec "$@"' - "${nocap[@]}" "$RT" loadbench "$T/ds" --epochs 1 --digest
    expect_out 'batch ring: .* of pageable slots, not page-locked \(`ulimit -l` allows 65.5 kB\)'
    expect_out 'ring [0-9]+ slots, .* pageable'
    [ "$(grep -c 'pageable slots' "$T/out")" -eq 1 ] || fail "the pageable line is said more than once"
    expect_rc 1 bash -c 'ulimit -l 64 && exec "$@"' - "${nocap[@]}" "$RT" loadbench "$T/ds" --epochs 1 --pin
    expect_out 'page-locked memory but `ulimit -l` allows .*--no-pin'
    expect_rc 0 bash -c 'ulimit -l 64 && exec "$@"' - "${nocap[@]}" "$RT" loadbench "$T/ds" --epochs 1 --no-pin
    grep -q 'pageable slots, not page-locked' "$T/out" && fail "--no-pin still says its line"
    checks=$((checks + 1))
fi

echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
