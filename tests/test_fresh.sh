#!/usr/bin/env bash
# test_fresh.sh - the README's quick start on a new machine: a pristine Debian 12 root (mmdebstrap
# --variant=minbase, this machine's package sources), a clean clone of the commit copied in, then inside it
#   1. as an ordinary user with no sudo: tools/install-deps.sh stops and names what to install as root;
#   2. as root: tools/install-deps.sh, then tools/install-deps.sh --test, from nothing;
#   3. as a new ordinary user (`ulimit -l` 8 MiB, as a login gives): the quick start
#      (tools/quickstart.sh --small), its accuracy and report page read back, a unit-labelled subset of the
#      test suite (Chromium drawing the report page among them)
#      and one mpirun test, then `cpack -G DEB`;
#   4. in a second untouched copy of the root: `apt-get install ./ringtrain_*.deb` pulls what dpkg-shlibdeps
#      computed, no build package comes with it, and the ordinary user runs
#      `ringtrain train --synthetic-data --steps 5` and reads the man page's source.
# Usage: test_fresh.sh SOURCE_REPO. RT_FRESH_COMMIT (default HEAD) picks the commit; RT_FRESH_CACHE (default
# /var/cache/ringtrain-fresh) keeps the untouched base root (a tar; rebuilt after 7 days or when the package
# sources change); RT_FRESH_KEEP=1 keeps the work folder. Needs root, mmdebstrap, unshare and the package
# sources; skips (77) saying which is missing. Label `fresh`; tools/test.sh runs it after the other tests.
set -u
src=${1:?usage: test_fresh.sh SOURCE_REPO}
commit=${RT_FRESH_COMMIT:-HEAD}
cache=${RT_FRESH_CACHE:-/var/cache/ringtrain-fresh}
ok=0
skip() { echo "SKIP: $*"; ok=1; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
t_start=$SECONDS
stamp() { printf '[%4d s] %s\n' $((SECONDS - t_start)) "$*"; }

[ "$(id -u)" -eq 0 ] || skip "needs root (chroot, mounts, a user made inside the root)"
command -v mmdebstrap >/dev/null || skip "mmdebstrap is not installed (tools/install-deps.sh --test installs it)"
unshare --mount --pid --fork true 2>/dev/null || skip "cannot make mount and pid namespaces (unshare)"
sources=/etc/apt/sources.list.d/debian.sources
[ -r "$sources" ] || sources=/etc/apt/sources.list
[ -r "$sources" ] || skip "no Debian package sources configured here ($sources)"
rev=$(git -C "$src" rev-parse --verify -q "$commit^{commit}") || fail "no commit '$commit' in $src"

work=$(mktemp -d /var/tmp/rt-fresh.XXXXXX)
# The work folder goes after a pass or a skip; a failure keeps it, logs included.
cleanup() {
    # The mounts live in the namespaces of in_root's processes, gone with them; never delete through a mount.
    if grep -q " $work/" /proc/mounts; then
        echo "warning: mounts left under $work; not deleting it"
    elif [ "$ok" = 1 ] && [ "${RT_FRESH_KEEP:-0}" != 1 ]; then
        rm -rf "$work"
    else
        echo "kept $work"
    fi
}
trap cleanup EXIT

# ---- the base root: built once from the package sources, kept untouched ------------------------------------
# What apt needs of this machine's configuration to reach those sources: its Acquire settings (proxies, the
# date checks of a snapshot mirror), not its index targets.
apt-config dump Acquire | grep -Ev '^Acquire::(IndexTargets|cdrom|Changelogs)' |
    grep -Ev ' "";$' >"$work/acquire.conf"
key=$( (cat "$sources" "$work/acquire.conf"; echo "bookworm minbase") | sha256sum | cut -c1-16)
base=$cache/bookworm-minbase-$key.tar
mkdir -p "$cache"
if [ -z "$(find "$base" -mtime -7 2>/dev/null)" ]; then
    stamp "building the base root (mmdebstrap --variant=minbase bookworm) into $base"
    if ! mmdebstrap --quiet --variant=minbase --mode=root --format=tar --aptopt="$work/acquire.conf" \
        bookworm "$base.partial" - <"$sources" >"$work/mmdebstrap.log" 2>&1; then
        tail -5 "$work/mmdebstrap.log"
        rm -f "$base.partial"
        skip "cannot build a Debian 12 root here (mmdebstrap failed; the package sources unreachable?)"
    fi
    mv "$base.partial" "$base"
    find "$cache" -name 'bookworm-minbase-*.tar' ! -name "${base##*/}" -delete
fi
stamp "base root: $base ($(du -m "$base" | cut -f1) MB)"

# new_root DIR: an untouched copy of the base root that can resolve the package sources' host names. Its dpkg
# skips fsync (force-unsafe-io, as mmdebstrap itself does while it builds a root): a root that is thrown away
# needs no durability, and the installs take half the time.
# Its apt finds the .deb files this machine's apt has kept (hard links into its archive folder, as a caching
# proxy would serve them): a file is used only where it is the very version and checksum the root's own package
# index asks for, and only for a package the install asks for; anything else is downloaded. What is installed is
# the same; what it saves is the download (over 1 GB with --test, Chromium and PyTorch among them).
new_root() {
    mkdir -p "$1" && tar -C "$1" -xpf "$base" && cp /etc/resolv.conf "$1/etc/resolv.conf" &&
        echo force-unsafe-io >"$1/etc/dpkg/dpkg.cfg.d/ringtrain-fresh-unsafe-io" || fail "cannot unpack $base"
    local debs=(/var/cache/apt/archives/*.deb)
    [ -e "${debs[0]}" ] && cp -l "${debs[@]}" "$1/var/cache/apt/archives/" 2>/dev/null || true
}
# in_root DIR USER CMD: CMD (a bash script) inside DIR as USER (root, or the test's user with `ulimit -l` 8 MiB
# and a login's environment), with its own /proc, /dev/shm and a read-only /sys, in new mount and pid namespaces.
# Whatever kills unshare kills everything in the root (--kill-child: the namespace goes with its first process).
in_root() {
    local root=$1 user=$2 cmd=$3 drop=()
    [ "$user" = root ] || drop=(setpriv --reuid="$user" --regid="$user" --init-groups --reset-env)
    unshare --mount --pid --fork --kill-child --propagation private bash -c '
        root=$1; shift
        mount -t proc proc "$root/proc" && mount -t tmpfs -o mode=1777 shm "$root/dev/shm" &&
            mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" &&
            mount --rbind -o ro /sys "$root/sys" || exit 70
        ulimit -l 8192
        exec chroot "$root" "$@"' - "$root" "${drop[@]}" /usr/bin/env LANG=C.UTF-8 \
        PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin \
        /bin/bash -ec "$cmd"
}
# step NAME ROOT USER CMD: in_root, its output to $work/NAME.log; on failure its last lines and exit 1.
step() {
    local name=$1 t0=$SECONDS
    shift
    if ! in_root "$@" >"$work/$name.log" 2>&1; then
        echo "---- last lines of $name:"
        tail -30 "$work/$name.log"
        fail "$name failed in the fresh root (log: $work/$name.log)"
    fi
    stamp "$name: ok in $((SECONDS - t0)) s"
}

# ---- the build root -----------------------------------------------------------------------------------------
R=$work/build-root
new_root "$R"
user=newuser
in_root "$R" root "useradd --create-home --shell /bin/bash $user" || fail "cannot create the user"
clone=$R/home/$user/ringtrain
git -c safe.directory='*' clone -q --no-hardlinks "$src" "$clone" && git -C "$clone" checkout -q "$rev" ||
    fail "cannot clone $rev"
chroot "$R" chown -R "$user:$user" "/home/$user/ringtrain"
stamp "clean clone of $(git -C "$src" log -1 --format='%h %s' "$rev" | cut -c1-70)"

# 1. An ordinary user without sudo is told what to install, and as what.
if in_root "$R" "$user" "cd ~/ringtrain && tools/install-deps.sh" >"$work/nosudo.log" 2>&1; then
    fail "install-deps.sh as an ordinary user without sudo succeeded on a bare root"
fi
grep -q 'run as root: apt-get install -y .*liburing-dev' "$work/nosudo.log" ||
    fail "install-deps.sh without root or sudo did not name the packages: $(tail -2 "$work/nosudo.log")"
stamp "install-deps as an ordinary user without sudo: refused, naming the packages"

# 2. As root, from nothing.
step install-deps "$R" root "cd /home/$user/ringtrain && tools/install-deps.sh"
step install-deps-test "$R" root "cd /home/$user/ringtrain && tools/install-deps.sh --test"

# 3. As the ordinary user: the quick start, some of the tests, the package.
step quickstart "$R" "$user" "cd ~/ringtrain && tools/quickstart.sh --small"
acc=$(sed -nE 's/.* test split: .* accuracy ([0-9.]+)%.*/\1/p' "$work/quickstart.log" | tail -1)
[ -n "$acc" ] || fail "the quick start printed no eval accuracy"
awk -v a="$acc" 'BEGIN { exit !(a > 50) }' || fail "the quick start's eval accuracy is $acc %, expected above 50 %"
grep -q 'pageable slots' "$work/quickstart.log" && stamp "quick start: ring slots pageable under the 8 MiB limit"
stamp "quick start: eval accuracy $acc % ($(grep -c '' "$work/quickstart.log") lines of output)"
# The quick start ends by writing its report page: one, with the run's charts.
for c in loss accuracy throughput loadbench-workers; do
    grep -q "id=\"chart-$c\"" "$R/home/$user/ringtrain/data/report.html" 2>/dev/null ||
        fail "the quick start's data/report.html has no chart $c"
done
stamp "quick start: data/report.html ($(grep -o 'class="chart"' "$R/home/$user/ringtrain/data/report.html" | wc -l) charts)"
# test_report_view: Chromium, as the test command installed it, drawing the report as this user. (test_help, which
# checks text against text and nothing of this root, runs in CI's own stages only.)
units='^test_(common|format|ring|loader|sampler|safetensors|optim|cli|stage_cli|install_deps|comm_np2|python|report_view)$'
step tests "$R" "$user" "cd ~/ringtrain && ctest --test-dir build --output-on-failure -j \$(nproc) -R '$units'"
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$work/tests.log")
[ "$passed" -ge 12 ] || { tail -20 "$work/tests.log"; fail "only $passed of the subset passed (skips count as failures here)"; }
grep -qE 'Test +#[0-9]+: test_report_view .* Passed' "$work/tests.log" ||
    { grep -A12 'test_report_view' "$work/tests.log" | tail -14; fail "test_report_view did not pass as the new user"; }
stamp "tests: $passed passed, test_report_view (Chromium drawing the report) among them"
step package "$R" "$user" "cd ~/ringtrain/build && cpack -G DEB && cp ringtrain_*.deb /tmp/"
deb=$(cd "$R/tmp" && ls ringtrain_*.deb) || fail "cpack made no .deb"

# 4. The package in another untouched root: what it pulls in, and a run as an ordinary user.
P=$work/package-root
new_root "$P"
cp "$R/tmp/$deb" "$P/tmp/" && chmod 644 "$P/tmp/$deb"
step install-deb "$P" root "useradd --create-home $user && apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/$deb &&
    dpkg-query -W -f='\${Package}\n' > /tmp/installed"
for p in gcc cmake libdnnl-dev libopenmpi-dev; do
    grep -qx "$p" "$P/tmp/installed" && fail "installing $deb pulled in the build package $p"
done
for p in libdnnl2 libopenmpi3 liburing2 libzstd1 libopenblas0-openmp; do
    grep -qx "$p" "$P/tmp/installed" || fail "installing $deb did not pull in $p"
done
step run-deb "$P" "$user" "cd && ringtrain --version && ringtrain train --synthetic-data --steps 5 --threads 2 &&
    zcat -f /usr/share/man/man1/ringtrain-train.1* | grep -q -- 'synthetic' &&
    test -x /usr/share/ringtrain/tools/check_trace.py"
grep -q 'done (step limit): 5 steps' "$work/run-deb.log" || { tail -5 "$work/run-deb.log"; fail "no fifth step in the packaged run"; }
stamp "packaged run as $user: ok (the package Depends on $(dpkg-deb -f "$P/tmp/$deb" Depends | tr ',' '\n' | grep -c .) packages)"
ok=1
echo "fresh: all steps passed in $((SECONDS - t_start)) s"
