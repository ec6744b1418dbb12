#!/usr/bin/env bash
# test_no_cuda_libs.sh - a CUDA build of ringtrain on a machine without cuDNN, cuBLAS and NCCL (a login node,
# a CPU partition):
#   - ringtrain does not link them (no DT_NEEDED entry: common/cudalibs loads them at run time);
#   - with every copy of them hidden -- in a private mount namespace, an empty tmpfs over each folder that
#     holds them, or /dev/null over the library files themselves where the folder also holds libraries that
#     ringtrain or the shell need (/usr/lib/x86_64-linux-gnu) -- `ringtrain --version` runs and says each is
#     not found, a short `train --device cpu` trains to the same weights as with the libraries there, and
#     `train --device cuda` fails with a message and an exit code, not a signal.
# Usage: test_no_cuda_libs.sh path/to/ringtrain. Exit 0 pass, 1 fail, 77 skip (no CUDA in the build; mount
# namespaces, or for an ordinary user user namespaces, not permitted here).
set -u
export LC_ALL=C
if [ "${1:-}" != --inside ]; then
    RT=$(readlink -f "${1:?usage: test_no_cuda_libs.sh path/to/ringtrain}")
    W=$(mktemp -d "${TMPDIR:-/tmp}/rt-nolibs-XXXXXX")
    trap 'rm -rf "$W"' EXIT
else
    RT=$2 W=$3
fi
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
LIBS_RE='lib(cudnn|cublas|nccl)[^/]*\.so'

# CPU training, short: the value it ends with (the parameter digest), or "" on failure. $1: a tag for files.
train_cpu() {
    "$RT" train --data "$W/ds" --model mnist-net --device cpu --steps 5 --batch-size 32 --threads 2 --seed 1 \
        --json --no-progress >"$W/train-$1.out" 2>&1
    local rc=$?
    [ $rc -eq 0 ] && grep -q '^done (step limit): 5 steps' "$W/train-$1.out" &&
        grep -o 'param digest: [0-9a-f]*' "$W/train-$1.out" | tail -n 1
}

# ==== outside: the binary, the folders to hide, the reference run ==================================
if [ "${1:-}" != --inside ]; then
    "$RT" --version >"$W/version.out" 2>&1 || { echo "FAIL ringtrain --version: $(cat "$W/version.out")"; exit 1; }
    if ! grep -q '^  cuda  built with' "$W/version.out"; then
        echo "skip: this ringtrain has no CUDA backend"
        exit 77
    fi
    command -v readelf >/dev/null || { echo "FAIL readelf (binutils) is needed"; exit 1; }
    needed=$(readelf -d "$RT" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    bad=$(grep -E '^lib(cudnn|cublas|nccl)' <<<"$needed")
    [ -z "$bad" ] && pass "no DT_NEEDED on cuDNN, cuBLAS or NCCL ($(wc -l <<<"$needed") entries)" ||
        fail "ringtrain links $(echo $bad): it cannot start where they are missing"

    # A private mount namespace: root's own, or an ordinary user's inside a user namespace where it is root.
    ns=(unshare -m --propagation private)
    [ "$(id -u)" = 0 ] || ns=(unshare --user --map-root-user -m --propagation private)
    if ! "${ns[@]}" true 2>/dev/null; then
        echo "skip: ${ns[*]} is not permitted here; $fails failures so far"
        [ $fails -eq 0 ] && exit 77 || exit 1
    fi

    # Every folder a copy may be found in: the loader's cache and path, the toolkit's usual places, where
    # --version says they were loaded from, and where CMake found them (the loader's fallback).
    {
        ldconfig -p 2>/dev/null | grep -E "$LIBS_RE" | sed 's/.* => //' | xargs -r -n1 dirname
        sed -n 's/^  \(cuDNN\|cuBLAS\|NCCL\) .*(\(\/.*\)\/[^/]*)$/\2/p' "$W/version.out"
        tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}"
        ls -d /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu \
            /usr/lib64 /usr/local/lib 2>/dev/null
        cache=$(dirname "$RT")/CMakeCache.txt
        [ -f "$cache" ] && sed -n 's/^\(RT_CUDNN_LIB\|RT_NCCL_LIB\|CUDA_cublas_LIBRARY\):FILEPATH=\(\/.*\)/\2/p' "$cache" |
            xargs -r -n1 dirname
    } | while read -r d; do [ -n "$d" ] && [ -d "$d" ] && readlink -f "$d"; done | sort -u >"$W/dirs"
    # Folders holding what ringtrain and the shell themselves load: only the CUDA files are hidden there.
    { ldd "$RT"; ldd "$(command -v bash)"; } 2>/dev/null | sed -n 's/.* => \(\/[^ ]*\) .*/\1/p' |
        xargs -r -n1 readlink -f | xargs -r -n1 dirname | sort -u >"$W/keep"

    # The dataset and the run to compare with, while the libraries are there.
    "$RT" synth --format mnist --out "$W/src" --train 512 --test 128 --seed 3 >/dev/null 2>&1 &&
        "$RT" pack "$W/src" --out "$W/ds" >/dev/null 2>&1 || { echo "FAIL synth/pack"; exit 1; }
    ref=$(train_cpu ref)
    [ -n "$ref" ] || { echo "FAIL train --device cpu with the libraries present: $(tail -n 5 "$W/train-ref.out")"; exit 1; }

    "${ns[@]}" bash "$0" --inside "$RT" "$W" "$ref" "$fails"
    exit $?
fi

# ==== inside the private mount namespace =============================================================
ref=$4 fails=$5
hidden=()
while read -r d; do
    mapfile -t files < <(find "$d" -maxdepth 1 \( -type f -o -type l \) 2>/dev/null | grep -E "/$LIBS_RE")
    [ ${#files[@]} -gt 0 ] || continue
    if grep -qxF "$d" "$W/keep" || [ -e "$d/libc.so.6" ]; then
        for f in "${files[@]}"; do
            if [ -e "$f" ]; then mount --bind /dev/null "$f" || fail "could not hide $f"; fi
        done
        hidden+=("$d (${#files[@]} files, /dev/null)")
    else
        mount -t tmpfs -o size=1m,mode=0755 rt-no-cuda-libs "$d" || fail "could not hide $d"
        hidden+=("$d (tmpfs)")
    fi
    for f in "${files[@]}"; do [ -s "$f" ] && fail "$f is still readable"; done
done <"$W/dirs"
[ ${#hidden[@]} -gt 0 ] && pass "hidden: ${hidden[*]}" || fail "no copy of cuDNN, cuBLAS or NCCL found to hide"

# --version: starts, keeps its cuda line, and says why each library is not there.
"$RT" --version >"$W/v.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q '^  cuda  built with' "$W/v.out" && pass "--version runs without the libraries" ||
    fail "--version: exit $rc: $(cat "$W/v.out")"
for lib in cuDNN cuBLAS NCCL; do
    line=$(grep -E "^  $lib " "$W/v.out")
    if grep -Eq "/ not found \(.*lib${lib,,}[^ ]*\.so|not in this build" <<<"$line"; then
        pass "--version: $(sed 's/^ *//' <<<"$line" | cut -c 1-150)"
    else
        fail "--version on $lib: '$line'"
    fi
done

# Training on the CPU: the same weights as with the libraries present.
got=$(train_cpu inside)
[ -n "$got" ] && [ "$got" = "$ref" ] && pass "train --device cpu, 5 steps: $got, as with the libraries" ||
    fail "train --device cpu without the libraries: '$got' (with them: '$ref'): $(tail -n 5 "$W/train-inside.out")"

# --device cuda: a clean failure (here the driver is the first thing missing), never a signal.
"$RT" train --data "$W/ds" --model mnist-net --device cuda --steps 2 --no-progress >"$W/cuda.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -Eq 'error: --device cuda: .*(driver|GPU|cuDNN|cuBLAS|NCCL)' "$W/cuda.out"; then
    pass "train --device cuda: exit $rc: $(grep -m 1 'error:' "$W/cuda.out")"
else
    sig=
    [ $rc -ge 128 ] && sig=" (signal $((rc - 128)))"
    fail "train --device cuda without the libraries: exit $rc$sig: $(tail -n 5 "$W/cuda.out")"
fi

echo "$fails failures"
[ $fails -eq 0 ]
