#!/usr/bin/env bash
# test_stage_users.sh - staging, checkpoints, metrics and traces on a node
# that another user shares. Runs as root and makes a second local user (removed
# at exit), who does what a hostile or careless neighbour can do in a shared
# parent such as /tmp:
#   A. pre-creates root's per-user directory PARENT/ringtrain-0 (and makes it
#      world-writable): staging refuses it, naming the path and its owner;
#      a world-writable PARENT/ringtrain-<h> (where copies once went) is ignored;
#   B. plants a link in a per-user directory root left world-writable: refused;
#   C. plants links where the stager creates or writes: as the per-user
#      directory, as a dataset directory, as the lock file, and as `.partial`
#      files while a copy runs: nothing is ever written through them (their
#      targets are compared before and after);
#   D. (root) swaps a staged shard for other bytes of the same size: the next
#      `ringtrain stage` and `train --stage-to` notice and copy it again, and
#      of three stagers started together one copies, the two that waited only
#      check sizes; the other user cannot write there at all;
#   E. stages the same dataset to the same parent: each user gets a copy of
#      their own (PARENT/ringtrain-<uid>/<h>) and cannot see the other's;
#   F. plants links as the checkpoint directory, the metrics file and the
#      trace's old temporary name, and owns a checkpoint directory root is
#      given: refused, or not followed.
#
# The dataset is small (600 records, 3 files) so that the whole test takes a
# few seconds. Usage: test_stage_users.sh path/to/ringtrain. Exit 0 pass,
# 1 fail, 77 skip (not root, or no useradd).
set -u
RT=${1:?usage: test_stage_users.sh path/to/ringtrain}
case $RT in /*) ;; *) RT=$PWD/$RT ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster/lib.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (to make a second local user)"; exit 77; }
for tool in useradd userdel runuser; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool is missing (package passwd / util-linux)"; exit 77; }
done

OTHER=rtstage$$
T=$(mktemp -d /tmp/rt-stage-users-XXXXXX)
bg=()
cleanup() {
    for p in "${bg[@]}"; do kill -9 "$p" 2>/dev/null; done
    userdel "$OTHER" >/dev/null 2>&1
    rm -rf "$T"
}
trap cleanup EXIT
useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$OTHER" 2>"$T/useradd.err" ||
    { echo "SKIP: useradd $OTHER failed: $(cat "$T/useradd.err")"; exit 77; }
OUID=$(id -u "$OTHER")
cd "$T" && chmod 755 "$T" # the other user reads the dataset and works in $T/p*, as in /tmp

fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); "$@" || fail "$*"; }
as_other() { runuser -u "$OTHER" -- "$@"; }
# expect_rc WANT CMD...: runs CMD, stdout to $T/out, stderr to $T/err, checks the exit code.
expect_rc() {
    local want=$1; shift
    checks=$((checks + 1))
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    [ "$rc" -eq "$want" ] || { fail "exit $rc (wanted $want): $*"; sed 's/^/    /' "$T/out" "$T/err" | tail -5 >&2; }
}
# expect_in FILE REGEX: FILE (out or err) matches.
expect_in() {
    checks=$((checks + 1))
    grep -Eq -- "$2" "$T/$1" || { fail "$1 lacks /$2/"; sed 's/^/    /' "$T/out" "$T/err" | tail -5 >&2; }
}
# same_tree SRC DEST: DEST holds exactly SRC's files, byte for byte.
same_tree() {
    checks=$((checks + 1))
    local a b f
    a=$(cd "$1" && ls | sort | tr '\n' ' ')
    b=$(cd "$2" 2>/dev/null && ls -A | sort | tr '\n' ' ')
    [ "$a" = "$b" ] || { fail "$2 holds [$b], expected [$a]"; return; }
    for f in "$1"/*; do cmp -s "$f" "$2/${f##*/}" || fail "$2/${f##*/} differs from $f"; done
}
# What the other user would like root to write into: never changed. After a failure it is made again, so
# that each case is judged on its own.
VICTIM_TEXT="root's own file, not ringtrain's"
victims() { rm -rf "$T/victim.d" && mkdir "$T/victim.d" && printf '%s' "$VICTIM_TEXT" >"$T/victim.txt"; }
untouched() {
    checks=$((checks + 1))
    [ -f "$T/victim.txt" ] && [ ! -L "$T/victim.txt" ] && [ "$(cat "$T/victim.txt")" = "$VICTIM_TEXT" ] &&
        [ -z "$(ls -A "$T/victim.d")" ] && return
    fail "$1: written through a link: victim.txt now [$(head -c 60 "$T/victim.txt" | tr -cd '[:print:]')], victim.d holds [$(ls -A "$T/victim.d" | tr '\n' ' ')]"
    victims
}
# swap FILE: the same number of bytes, other values (a new file renamed over it, as a replacement would be).
swap() {
    tr '\000-\377' '\001-\377\000' <"$1" >"$1.new" && mv -f "$1.new" "$1"
}
# shared DIR: a fresh directory like /tmp (root's, sticky, world-writable).
shared() { rm -rf "$1" && mkdir -p "$1" && chmod 1777 "$1"; }

victims
"$RT" synth --out "$T/src" --train 500 --test 100 >/dev/null || { echo "synth failed"; exit 1; }
"$RT" pack "$T/src" --out "$T/ds" >/dev/null || { echo "pack failed"; exit 1; }
DS=$T/ds
NF=$(ls "$DS" | wc -l)
chmod -R a+rX "$DS"
# <h>, the dataset directory's name, as this binary prints it (the old layout prefixed it with ringtrain-).
"$RT" stage "$DS" --to "$T/probe" --quiet >"$T/out" || { echo "stage failed"; exit 1; }
H=$(basename "$(cat "$T/out")")
H=${H#ringtrain-}
cl_el "second user $OTHER (uid $OUID); dataset $DS: $NF files, <h> = $H"

# ---- A. the other user's directory where root's would be --------------------------
P=$T/pA
shared "$P"
as_other mkdir "$P/ringtrain-0"
msg="^error: $P/ringtrain-0: owned by $OTHER \\(uid $OUID\\), not by root \\(uid 0\\): refusing to stage into a directory another user controls; remove it or use --to DIR\$"
expect_rc 1 "$RT" stage "$DS" --to "$P"
expect_in err "$msg"
check [ -z "$(ls -A "$P/ringtrain-0")" ]
as_other chmod 0777 "$P/ringtrain-0"
expect_rc 1 "$RT" stage "$DS" --to "$P"
expect_in err "$msg"
check [ -z "$(ls -A "$P/ringtrain-0")" ]
rm -rf "$P/ringtrain-0"
# Where every user's copy of this dataset went before: theirs, world-writable. Not used.
as_other mkdir -m 0777 "$P/ringtrain-$H"
expect_rc 0 "$RT" stage "$DS" --to "$P" --quiet
check [ "$(cat "$T/out")" = "$P/ringtrain-0/$H" ]
check [ "$(stat -c '%u %a' "$P/ringtrain-0" 2>&1)" = "0 700" ]
check [ "$(stat -c '%u %a' "$P/ringtrain-0/$H" 2>&1)" = "0 700" ]
check [ -z "$(ls -A "$P/ringtrain-$H")" ]
same_tree "$DS" "$P/ringtrain-0/$H"
cl_el "A. a per-user directory the other user made (or opened to all): refused, naming its owner"

# ---- B. root's own per-user directory left world-writable, a link planted in it ------
P=$T/pB
shared "$P"
mkdir -m 0777 "$P/ringtrain-0"
as_other ln -s "$T/victim.d" "$P/ringtrain-0/$H"
expect_rc 1 "$RT" stage "$DS" --to "$P"
expect_in err "^error: $P/ringtrain-0: writable by group and others \\(mode 0777\\): refusing to stage into a directory other users can write; remove it or use --to DIR\$"
untouched "B: a link in a world-writable per-user directory"
cl_el "B. a world-writable per-user directory: refused"

# ---- C. links where the stager creates or writes ----------------------------------
P=$T/pC
shared "$P"
as_other ln -s "$T/victim.d" "$P/ringtrain-0"
expect_rc 1 "$RT" stage "$DS" --to "$P"
expect_in err "^error: $P/ringtrain-0: is a symbolic link: refusing to stage into a directory reached through a link; remove it or use --to DIR\$"
untouched "C: the per-user directory as a link"
rm -rf "$P"/ringtrain-*
# The dataset directory and the lock where copies once went, as links.
as_other ln -s "$T/victim.d" "$P/ringtrain-$H"
as_other ln -s "$T/victim.txt" "$P/ringtrain-$H.lock"
expect_rc 0 "$RT" stage "$DS" --to "$P"
untouched "C: links as the dataset directory and the lock file"
same_tree "$DS" "$P/ringtrain-0/$H"
# In root's per-user directory the other user can plant nothing.
checks=$((checks + 1))
if as_other ln -s "$T/victim.d" "$P/ringtrain-0/x" 2>/dev/null || as_other ln -s "$T/victim.txt" "$P/ringtrain-0/$H/x.partial" 2>/dev/null; then
    fail "the other user could plant a link in $P/ringtrain-0"
fi
# `.partial` links planted again and again while a copy runs (slowed down by the test hook), in every
# directory the copy could be in; the old one made theirs and world-writable.
rm -rf "$P"/ringtrain-*
as_other mkdir -m 0777 "$P/ringtrain-$H"
rm -f "$T/stop"
as_other bash -c "until [ -e '$T/stop' ]; do
    for d in '$P/ringtrain-$H' '$P/ringtrain-0/$H'; do
        for f in '$DS'/*; do ln -s '$T/victim.txt' \"\$d/\${f##*/}.partial\" 2>/dev/null; done
    done; sleep 0.01; done" &
bg+=($!)
sleep 0.2
expect_rc 0 env RINGTRAIN_TEST_SLOW_COPY=20 "$RT" stage "$DS" --to "$P" --block-size 64K
touch "$T/stop"
wait "${bg[@]}" 2>/dev/null
bg=()
untouched "C: .partial links planted while copying"
same_tree "$DS" "$P/ringtrain-0/$H"
cl_el "C. links as the per-user directory, a dataset directory, the lock, .partial files: none followed"

# ---- D. a shard swapped after staging -----------------------------------------------
P=$T/pD
shared "$P"
expect_rc 0 "$RT" stage "$DS" --to "$P" --quiet
D=$(cat "$T/out")
SHARD=$(cd "$DS" && ls train-*.rts | head -1)
checks=$((checks + 1))
as_other bash -c "cp /dev/null '$D/$SHARD'" 2>/dev/null && fail "the other user could write $D/$SHARD"
swap "$D/$SHARD"
check [ "$(stat -c %s "$D/$SHARD")" = "$(stat -c %s "$DS/$SHARD")" ]
expect_rc 0 "$RT" stage "$DS" --to "$P"
expect_in err "$SHARD: staged copy has xxh64 [0-9a-f]{16}, the manifest says [0-9a-f]{16}: copying it again"
expect_in out "^stage: copied 2 of $NF files.*1 damaged, copied again"
same_tree "$DS" "$D"
swap "$D/$SHARD"
TR=(--data "$DS" --epochs 1 --steps 1 --batch-size 64 --threads 2 --no-progress)
expect_rc 0 "$RT" train "${TR[@]}" --stage-to "$P"
expect_in err "$SHARD: staged copy has xxh64 [0-9a-f]{16}, the manifest says [0-9a-f]{16}: copying it again"
expect_in err "staged $DS to $D: 2 of $NF files copied"
same_tree "$DS" "$D"
# Three stagers at once after a swap (the ranks of a node): the one that takes the lock first checks every
# byte and copies the shard again; the two that waited for it check sizes only.
swap "$D/$SHARD"
for i in 1 2 3; do
    env RINGTRAIN_TEST_SLOW_COPY=20 "$RT" stage "$DS" --to "$P" --block-size 64K >"$T/c$i.out" 2>"$T/c$i.err" &
    bg+=($!)
done
for p in "${bg[@]}"; do wait "$p" || fail "a concurrent stage exited non-zero"; done
bg=()
check [ "$(cat "$T"/c?.out | grep -c "^stage: copied 2 of $NF files.*1 damaged")" = 1 ]
check [ "$(cat "$T"/c?.out | grep -c "^stage: already staged, copied 0 bytes: $NF files, .* checked by size in .*while this one waited")" = 2 ]
same_tree "$DS" "$D"
cl_el "D. a swapped shard: copied again by stage and by train --stage-to; waiters trusted the holder's check"

# ---- E. both users stage the same dataset to the same parent ------------------------
stat -c '%i %n' "$D"/* >"$T/root.before"
expect_rc 0 as_other "$RT" stage "$DS" --to "$P" --quiet
OD=$(cat "$T/out")
check [ "$OD" = "$P/ringtrain-$OUID/$H" ]
check [ "$OD" != "$D" ]
check [ "$(stat -c '%U %a' "$OD" 2>&1)" = "$OTHER 700" ]
same_tree "$DS" "$OD"
checks=$((checks + 1))
as_other ls "$D" >/dev/null 2>&1 && fail "the other user can list root's copy $D"
stat -c '%i %n' "$OD"/* >"$T/other.before"
expect_rc 0 "$RT" stage "$DS" --to "$P" --quiet
check [ "$(cat "$T/out")" = "$D" ]
stat -c '%i %n' "$D"/* >"$T/root.after"
stat -c '%i %n' "$OD"/* >"$T/other.after"
check cmp -s "$T/root.before" "$T/root.after"
check cmp -s "$T/other.before" "$T/other.after"
cl_el "E. two users, one dataset, one parent: two private copies"

# ---- F. checkpoints, metrics and traces -----------------------------------------------
OH=$T/other-home # a directory the other user controls
mkdir "$OH"
chown "$OTHER" "$OH"
as_other ln -s "$T/victim.d" "$OH/ck"
expect_rc 1 "$RT" train "${TR[@]}" --checkpoint-dir "$OH/ck"
expect_in err "^error: --checkpoint-dir: $OH/ck: is a symbolic link: refusing to write checkpoints into a directory reached through a link"
untouched "F: the checkpoint directory as a link"
as_other mkdir "$OH/ck2"
expect_rc 1 "$RT" train "${TR[@]}" --checkpoint-dir "$OH/ck2"
expect_in err "^error: --checkpoint-dir: $OH/ck2: owned by $OTHER \\(uid $OUID\\), not by root \\(uid 0\\): refusing to write checkpoints into a directory another user controls"
check [ -z "$(ls -A "$OH/ck2")" ]
mkdir -m 0777 "$T/ck3"
for f in model.safetensors optimizer.safetensors state.json; do as_other ln -s "$T/victim.txt" "$T/ck3/$f.tmp"; done
expect_rc 1 "$RT" train "${TR[@]}" --checkpoint-dir "$T/ck3"
expect_in err "^error: --checkpoint-dir: $T/ck3: writable by group and others \\(mode 0777\\): refusing to write checkpoints into a directory other users can write"
untouched "F: .tmp links in a world-writable checkpoint directory"
as_other ln -s "$T/victim.txt" "$OH/m.jsonl"
expect_rc 1 "$RT" train "${TR[@]}" --metrics "$OH/m.jsonl"
expect_in err "^error: $OH/m.jsonl: is a symbolic link: refusing to write metrics through it"
untouched "F: the metrics file as a link"
as_other ln -s "$T/victim.txt" "$OH/t.json.tmp"
expect_rc 0 "$RT" train "${TR[@]}" --trace "$OH/t.json" --checkpoint-dir "$T/ck4"
untouched "F: a link at the trace's old temporary name"
check [ -f "$OH/t.json" ] && check [ ! -L "$OH/t.json" ]
check [ "$(stat -c '%u %a' "$T/ck4" 2>&1)" = "0 755" ]
check [ -f "$T/ck4/model.safetensors" ]
cl_el "F. checkpoint directory, metrics and trace: links refused or not followed"

echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
