#!/usr/bin/env bash
# test_stage.sh - `ringtrain stage` as the ranks of a node run it: four
# processes at once (exactly one copies, all print the same path), kill -9
# mid-copy then a rerun (resumes, no stale lock), a flipped byte in a staged
# shard (only that shard copied again), an idempotent rerun, missing and
# damaged source files, a held lock with --timeout, a per-user directory
# others may write (refused, saying why), and a disk that is full before and
# during the copy (a small tmpfs in a user namespace; skipped where that
# cannot be mounted). Every staged result is compared byte for byte with the
# source. Copies land in PARENT/ringtrain-<uid>/<h>; what another user can do
# to them is test_stage_users.sh's.
#
# Interruption uses the test hook RINGTRAIN_TEST_SLOW_COPY (ringtrain stage
# --help, "Environment"): it sleeps after each block so a copy lasts long
# enough to be killed or raced. With 64 KiB blocks and 15 ms, the 10.8 MB
# dataset takes about 2.5 s to stage.
#
# Usage: test_stage.sh path/to/ringtrain (or RT_BIN set). Exit 0 pass, 1 fail.
set -u
RT=${1:-${RT_BIN:?usage: test_stage.sh path/to/ringtrain}}
case $RT in /*) ;; *) RT=$PWD/$RT ;; esac # one case runs from another directory
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-stage-sh-XXXXXX")
bg=()
cleanup() {
    for p in "${bg[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fails=0
checks=0
SLOW=(env RINGTRAIN_TEST_SLOW_COPY=15)

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); "$@" || fail "$*"; }
# expect_rc WANT CMD...: runs CMD, stdout to $T/out, stderr to $T/err, checks the exit code.
expect_rc() {
    local want=$1; shift
    checks=$((checks + 1))
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    [ "$rc" -eq "$want" ] || { fail "exit $rc (wanted $want): $*"; sed 's/^/    /' "$T/out" "$T/err" >&2; }
}
# expect_in FILE REGEX: FILE (out or err) matches.
expect_in() {
    checks=$((checks + 1))
    grep -Eq -- "$2" "$T/$1" || { fail "$1 lacks /$2/"; sed 's/^/    /' "$T/out" "$T/err" >&2; }
}
# same_tree SRC DEST: DEST holds exactly SRC's files, byte for byte.
same_tree() {
    checks=$((checks + 1))
    local a b
    a=$(cd "$1" && ls | sort | tr '\n' ' ')
    b=$(cd "$2" && ls -A | sort | tr '\n' ' ')
    [ "$a" = "$b" ] || { fail "$2 holds [$b], expected [$a]"; return; }
    for f in "$1"/*; do
        cmp -s "$f" "$2/$(basename "$f")" || fail "$2/$(basename "$f") differs from $f"
    done
}
# flip FILE OFFSET: changes the byte at OFFSET.
flip() {
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf %03o $(((b + 1) % 256)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
# wait_for SECONDS CMD...: polls CMD every 50 ms; 1 if it never held.
wait_for() {
    local n=$(($1 * 20)); shift
    while ! "$@"; do
        n=$((n - 1))
        [ "$n" -gt 0 ] || return 1
        sleep 0.05
    done
}
renamed_shards() { [ "$(ls "$1" 2>/dev/null | grep -c '\.rts$')" -ge "$2" ]; }
lock_free() { flock -n "$1" true; }

# A dataset of 12 files (11 shards of about 1 MB and the manifest).
"$RT" synth --out "$T/src" --train 3000 --test 500 --seed 3 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$T/src" --out "$T/ds" --shard-size 1M >/dev/null || { echo "pack failed"; exit 1; }
DS=$T/ds
NF=$(ls "$DS" | wc -l)

# ---- usage ----------------------------------------------------------------------
expect_rc 0 "$RT" stage --help
expect_in out 'RINGTRAIN_TEST_SLOW_COPY'
expect_in out '--to DIR'
expect_rc 2 "$RT" stage
expect_rc 2 "$RT" stage "$DS" --queue-depth 0
expect_rc 2 "$RT" stage "$DS" --block-size 5000
expect_rc 2 "$RT" stage "$DS" --engine fast
expect_rc 2 "$RT" stage "$DS" --timeout -1
expect_rc 1 "$RT" stage "$T/src" --to "$T/x"
expect_in err '^error: .*not a packed dataset'

# ---- where it goes: --to, $SLURM_TMPDIR, $TMPDIR; --quiet prints only the path ----
expect_rc 0 env -u SLURM_TMPDIR TMPDIR="$T/tmpdir" "$RT" stage "$DS" --quiet
check [ "$(wc -l <"$T/out")" -eq 1 ]
expect_in out "^$T/tmpdir/ringtrain-$(id -u)/[0-9a-f]{16}\$"
name=ringtrain-$(id -u)/$(basename "$(cat "$T/out")") # this user's directory, then the dataset's
expect_rc 0 env SLURM_TMPDIR="$T/slurm" TMPDIR="$T/tmpdir" "$RT" stage "$DS" --quiet
check [ "$(cat "$T/out")" = "$T/slurm/$name" ]
same_tree "$DS" "$T/slurm/$name"
# A relative --to prints an absolute path.
expect_rc 0 bash -c "cd '$T' && '$RT' stage ds --to rel --quiet"
check [ "$(cat "$T/out")" = "$T/rel/$name" ]

# ---- four ranks at once: one copies, three wait; all print the same path --------
for i in 1 2 3 4; do
    "${SLOW[@]}" "$RT" stage "$DS" --to "$T/conc" --block-size 64K >"$T/conc$i.out" 2>"$T/conc$i.err" &
    bg+=($!)
done
for p in "${bg[@]}"; do wait "$p" || fail "a concurrent stage exited non-zero"; done
bg=()
cat "$T"/conc?.out >"$T/out"
cat "$T"/conc?.err >"$T/err"
check [ "$(grep -c "^stage: copied $NF of $NF files" "$T/out")" -eq 1 ]
check [ "$(grep -c '^stage: already staged, copied 0 bytes.*while this one waited' "$T/out")" -eq 3 ]
check [ "$(grep -Ec 'is being staged by pid [0-9]+' "$T/err")" -eq 3 ]
check [ "$(for i in 1 2 3 4; do tail -1 "$T/conc$i.out"; done | sort -u)" = "$T/conc/$name" ]
same_tree "$DS" "$T/conc/$name"
expect_rc 0 "$RT" verify "$T/conc/$name"

# ---- idempotent: a second run copies nothing, checks every byte -------------------
stat -c '%i %Y %n' "$T/conc/$name"/* >"$T/before"
expect_rc 0 "$RT" stage "$DS" --to "$T/conc"
expect_in out "^stage: already staged, copied 0 bytes: $NF files, .* checked by size and XXH64"
check [ "$(tail -1 "$T/out")" = "$T/conc/$name" ]
stat -c '%i %Y %n' "$T/conc/$name"/* >"$T/after"
check cmp -s "$T/before" "$T/after"

# ---- a flipped byte in a staged shard: that shard is copied again, no other ------
D=$T/conc/$name
stat -c '%i %n' "$D"/*.rts >"$T/ino_before"
flip "$D/train-00002.rts" 5000
expect_rc 0 "$RT" stage "$DS" --to "$T/conc" --trust-size
expect_in out '^stage: already staged.*checked by size in'
expect_rc 0 "$RT" stage "$DS" --to "$T/conc"
expect_in err 'train-00002.rts: staged copy has xxh64 [0-9a-f]+, the manifest says [0-9a-f]+: copying it again'
expect_in out "^stage: copied 2 of $NF files.*1 damaged, copied again"
same_tree "$DS" "$D"
# Only that shard is a new file (a new inode); the others were left alone.
stat -c '%i %n' "$D"/*.rts >"$T/ino_after"
check [ "$(diff "$T/ino_before" "$T/ino_after" | grep '^>' | sed 's|.*/||')" = train-00002.rts ]

# ---- kill -9 mid-copy, then rerun: resumes, keeps finished shards, no stale lock ---
"${SLOW[@]}" "$RT" stage "$DS" --to "$T/kill" --block-size 64K >"$T/kill.out" 2>&1 &
victim=$!
bg+=("$victim")
check wait_for 20 renamed_shards "$T/kill/$name" 3
{ kill -9 "$victim" && wait "$victim"; } 2>/dev/null
bg=()
check [ ! -e "$T/kill/$name/manifest.json" ]
check ls "$T/kill/$name"/*.partial >/dev/null
kept=$(ls "$T/kill/$name" | grep -c '\.rts$')
check [ "$kept" -ge 3 ] && check [ "$kept" -lt $((NF - 1)) ]
check lock_free "$T/kill/$name.lock"
expect_rc 0 "$RT" stage "$DS" --to "$T/kill" --timeout 5
expect_in err 'removed [0-9]+ partial files? left by an interrupted run'
expect_in out "^stage: copied $((NF - kept)) of $NF files.*kept $kept already staged.*of an interrupted run discarded"
same_tree "$DS" "$T/kill/$name"
check lock_free "$T/kill/$name.lock"

# ---- killed while repairing a damaged shard: the directory must not look complete ---
flip "$T/kill/$name/train-00008.rts" 100
# 100 ms a block: the repair's .partial stays for 1.6 s, not 0.24 s, so a poll on a loaded machine sees it
env RINGTRAIN_TEST_SLOW_COPY=100 "$RT" stage "$DS" --to "$T/kill" --block-size 64K >"$T/kill.out" 2>&1 &
victim=$!
bg+=("$victim")
check wait_for 20 test -e "$T/kill/$name/train-00008.rts.partial"
{ kill -9 "$victim" && wait "$victim"; } 2>/dev/null
bg=()
check [ ! -e "$T/kill/$name/manifest.json" ]
expect_rc 0 "$RT" stage "$DS" --to "$T/kill"
expect_in out "^stage: copied 2 of $NF files"
same_tree "$DS" "$T/kill/$name"

# ---- a lock held elsewhere: --timeout gives up with a message naming it -------------
# held until killed (exec: the pid is the lock's holder; opened for reading, so its record is kept)
bash -c "exec 9<'$T/conc/$name.lock' && flock 9 && exec sleep 60" &
bg+=($!)
check wait_for 5 bash -c "! flock -n '$T/conc/$name.lock' true"
expect_rc 1 "$RT" stage "$DS" --to "$T/conc" --timeout 0.5
expect_in err "^error: $T/conc/$name is in use: .* has held its lock $T/conc/$name.lock for more than"
kill "${bg[@]}" 2>/dev/null
wait 2>/dev/null
bg=()

# ---- this user's directory, once others may write it: refused, saying why --------------
chmod 0777 "$T/conc/${name%/*}"
expect_rc 1 "$RT" stage "$DS" --to "$T/conc"
expect_in err "^error: $T/conc/${name%/*}: writable by group and others \(mode 0777\): refusing to stage into a directory other users can write; remove it or use --to DIR\$"
chmod 0700 "$T/conc/${name%/*}"
expect_rc 0 "$RT" stage "$DS" --to "$T/conc"
check [ "$(stat -c %a "$T/conc/$name")" = 700 ]

# ---- source problems: named, nothing left looking complete --------------------------
cp -r "$DS" "$T/ds_missing"
rm "$T/ds_missing/train-00005.rts"
expect_rc 1 "$RT" stage "$T/ds_missing" --to "$T/miss"
expect_in err "^error: $T/ds_missing/train-00005.rts: missing \(listed in $T/ds_missing/manifest.json\)"
check [ -z "$(ls -A "$T/miss/$name" 2>/dev/null)" ]
cp -r "$DS" "$T/ds_bad"
flip "$T/ds_bad/train-00001.rts" 7000
expect_rc 1 "$RT" stage "$T/ds_bad" --to "$T/bad"
expect_in err 'train-00001.rts: copy 2 of 3 does not match the manifest'
expect_in err "^error: $T/ds_bad/train-00001.rts: copied 3 times and the bytes never matched the manifest"
check [ ! -e "$T/bad/$name/manifest.json" ]
truncate -s -10 "$T/ds_bad/train-00003.rts"
expect_rc 1 "$RT" stage "$T/ds_bad" --to "$T/bad2"
expect_in err "train-00003.rts: [0-9]+ bytes, the manifest says [0-9]+"

# ---- read/write engine gives the same bytes -----------------------------------------
expect_rc 0 "$RT" stage "$DS" --to "$T/plain" --engine plain
expect_in out "^stage: copied $NF of $NF files.*\(read/write, 1 MiB blocks\)"
same_tree "$DS" "$T/plain/$name"

# ---- out of space: before copying (statvfs) and midway (ENOSPC) ----------------------
mkdir -p "$T/mnt"
nsname=ringtrain-0/${name#*/} # in the user namespace this user is root
if unshare -rm bash -c "mount -t tmpfs -o size=1m none '$T/mnt'" 2>/dev/null; then
    # Runs inside a private mount namespace; results come back through files under $T.
    unshare -rm bash -c "
        mount -t tmpfs -o size=4m none '$T/mnt' || exit 3
        '$RT' stage '$DS' --to '$T/mnt' >'$T/nospc1.out' 2>'$T/nospc1.err'; echo \$? >'$T/nospc1.rc'
        ls -A '$T/mnt/$nsname' >'$T/nospc1.ls'
        umount '$T/mnt'
        mount -t tmpfs -o size=12m none '$T/mnt' || exit 3
        RINGTRAIN_TEST_SLOW_COPY=15 '$RT' stage '$DS' --to '$T/mnt' --block-size 64K >'$T/nospc2.out' 2>'$T/nospc2.err' &
        pid=\$!
        n=200; while [ ! -e '$T/mnt/$nsname/train-00000.rts' ] && [ \$n -gt 0 ]; do sleep 0.05; n=\$((n - 1)); done
        fallocate -l 6M '$T/mnt/filler'
        wait \$pid; echo \$? >'$T/nospc2.rc'
        ls -A '$T/mnt/$nsname' >'$T/nospc2.ls'
        rm '$T/mnt/filler'
        '$RT' stage '$DS' --to '$T/mnt' >'$T/nospc3.out' 2>'$T/nospc3.err'; echo \$? >'$T/nospc3.rc'
        cmp_all=0; for f in '$DS'/*; do cmp -s \"\$f\" '$T/mnt/$nsname/'\$(basename \"\$f\") || cmp_all=1; done
        echo \$cmp_all >'$T/nospc3.cmp'
    "
    check [ "$(cat "$T/nospc1.rc")" = 1 ]
    cp "$T/nospc1.err" "$T/err"
    expect_in err "^error: $T/mnt/$nsname: not enough space: the files still to copy need 10\.[0-9] MB, [0-9.]+ [kM]B is available"
    check [ ! -s "$T/nospc1.ls" ]
    check [ "$(cat "$T/nospc2.rc")" = 1 ]
    cp "$T/nospc2.err" "$T/err"
    expect_in err "^error: $T/mnt/$nsname: out of space while copying train-000[0-9]{2}.rts \(No space left on device\): the files still to copy need [0-9.]+ MB, [0-9.]+ [kM]?B is available"
    check [ -z "$(grep -E 'manifest|partial' "$T/nospc2.ls")" ]
    check [ "$(cat "$T/nospc3.rc")" = 0 ]
    check [ "$(cat "$T/nospc3.cmp")" = 0 ]
    cp "$T/nospc3.out" "$T/out"
    expect_in out "^stage: copied [0-9]+ of $NF files.*kept [1-9][0-9]* already staged"
else
    echo "SKIP: out-of-space cases (cannot mount a small tmpfs in a user namespace here)"
fi

echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
