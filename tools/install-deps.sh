#!/usr/bin/env bash
# install-deps.sh - installs the Debian 12 packages ringtrain needs that are
# missing, and nothing else. Runs apt-get as root, or through sudo when not
# root (it says so first). Usage: tools/install-deps.sh [--test]
#   --test  also the test tools: clang + libFuzzer runtime for the fuzz targets, Slurm and munge
#           for the cluster tests (tests/cluster/lib.sh), and
#           Python with PyTorch, which reads our checkpoints back as a user's script would, and
#           mmdebstrap for the `fresh` test (a pristine Debian 12 root: tests/test_fresh.sh), and
#           Chromium, which renders the report page headless (tests/test_report_view.sh); its text
#           needs a font, which it gets through libfontconfig1 -> fontconfig-config -> fonts-dejavu-core.
# The build needs help2man (the man pages, made from --help), dpkg-dev and file (dpkg-shlibdeps and the
# file type check that `cpack -G DEB` uses to compute the package's dependencies).
set -eu

build_pkgs=(gcc libc6-dev make cmake ninja-build pkg-config liburing-dev libzstd-dev libturbojpeg0-dev
    libarchive-dev libxxhash-dev libjansson-dev zlib1g-dev libpng-dev libopenblas-openmp-dev libdnnl-dev
    libopenmpi-dev openmpi-bin help2man dpkg-dev file python3-dev libdlpack-dev
    libjpeg62-turbo-dev libwebp-dev libexif-dev libswscale-dev libavutil-dev libtiff-dev)
test_pkgs=(clang libclang-rt-14-dev python3 python3-numpy python3-torch python3-torchvision python3-pytest python3-pil
    python3-venv python3-pip
    slurmctld slurmd slurm-client munge iproute2 mmdebstrap chromium)

want=("${build_pkgs[@]}")
[ "${1:-}" = "--test" ] && want+=("${test_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null; then
    echo "install-deps: installing ${missing[*]} through sudo (apt-get needs root)" >&2
    sudo=(sudo)
else
    echo "install-deps: missing Debian packages: ${missing[*]}" >&2
    echo "install-deps: run as root: apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
