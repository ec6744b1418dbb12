#!/usr/bin/env bash
# test_install_deps.sh - tools/install-deps.sh's three ways, against stand-in dpkg-query, apt-get, sudo and id on a
# PATH of their own (runs as any user; the real root path runs in test_fresh.sh):
#   nothing missing -> nothing run; root -> apt-get itself; another user with sudo -> sudo apt-get, said first;
#   another user without sudo -> exit 1 and the command to run as root; --test adds the test tools;
#   an apt-get that fails fails the script.
set -u
script=${1:?usage: test_install_deps.sh tools/install-deps.sh}
T=$(mktemp -d /tmp/rt-deps.XXXXXX)
trap 'rm -rf "$T"' EXIT
checks=0 fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# A PATH holding only the tools the script may use, and the stand-ins.
mkdir -p "$T/bin"
for t in bash env grep cat; do ln -s "$(type -P "$t")" "$T/bin/$t"; done
# dpkg-query -W -f=... PKG: installed unless PKG is listed in $T/missing.
cat >"$T/bin/dpkg-query" <<EOF
#!/bin/bash
p=\${!#}
grep -qx "\$p" "$T/missing" 2>/dev/null && exit 1
printf 'install ok installed'
EOF
cat >"$T/bin/apt-get" <<EOF
#!/bin/bash
echo "apt-get uid=\$(id -u) \$*" >>"$T/calls"
[ ! -e "$T/apt-fails" ]
EOF
cat >"$T/bin/id" <<EOF
#!/bin/bash
[ "\$1" = -u ] && { cat "$T/uid"; exit 0; }
exit 1
EOF
cat >"$T/sudo" <<EOF
#!/bin/bash
echo "sudo \$*" >>"$T/calls"
echo 0 >"$T/uid"
exec "\$@"
EOF
chmod +x "$T/bin/dpkg-query" "$T/bin/apt-get" "$T/bin/id" "$T/sudo"

# run UID SUDO(yes|no) ARGS...: the script with the stand-ins; output in $T/out, calls in $T/calls.
run() {
    local uid=$1 sudo=$2
    shift 2
    echo "$uid" >"$T/uid"
    rm -f "$T/calls" "$T/bin/sudo"
    [ "$sudo" = yes ] && ln -s "$T/sudo" "$T/bin/sudo"
    PATH="$T/bin" bash "$script" "$@" >"$T/out" 2>&1
}
# expect WHAT COND: one check.
expect() {
    checks=$((checks + 1))
    eval "$2" || { fail "$1"; sed 's/^/    out: /' "$T/out" >&2; [ -e "$T/calls" ] && sed 's/^/    call: /' "$T/calls" >&2; }
}

: >"$T/missing"
run 1000 no
rc=$?
expect "nothing missing: exit 0" "[ $rc -eq 0 ]"
expect "nothing missing: nothing run" '[ ! -e "$T/calls" ]'

printf 'liburing-dev\nlibdnnl-dev\n' >"$T/missing"
run 0 no
rc=$?
expect "root: exit 0" "[ $rc -eq 0 ]"
expect "root: apt-get itself, update then install" \
    'grep -q "^apt-get uid=0 update" "$T/calls" && grep -q "^apt-get uid=0 install -y .*--no-install-recommends liburing-dev libdnnl-dev$" "$T/calls"'
expect "root: no sudo" '! grep -q "^sudo" "$T/calls"'
expect "root: names what it installs" 'grep -q "apt-get install liburing-dev libdnnl-dev" "$T/out"'

run 1000 yes
rc=$?
expect "user with sudo: exit 0" "[ $rc -eq 0 ]"
expect "user with sudo: says so first" 'grep -q "through sudo (apt-get needs root)" "$T/out"'
expect "user with sudo: sudo apt-get install" \
    'grep -q "^sudo apt-get install -y .*liburing-dev libdnnl-dev$" "$T/calls" && grep -q "^apt-get uid=0 install" "$T/calls"'

run 1000 no
rc=$?
expect "user without sudo: exit 1" "[ $rc -eq 1 ]"
expect "user without sudo: the command to run as root" \
    'grep -q "missing Debian packages: liburing-dev libdnnl-dev" "$T/out" && grep -q "run as root: apt-get install -y liburing-dev libdnnl-dev$" "$T/out"'
expect "user without sudo: nothing run" '[ ! -e "$T/calls" ]'

printf 'mmdebstrap\n' >"$T/missing"
run 0 no
expect "build packages only without --test" '[ ! -e "$T/calls" ]'
run 0 no --test
expect "--test: the test tools too" 'grep -q "install -y .*mmdebstrap$" "$T/calls"'

touch "$T/apt-fails"
run 0 no --test
rc=$?
expect "a failing apt-get fails the script (exit $rc)" "[ $rc -ne 0 ]"

echo "test_install_deps: $((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
