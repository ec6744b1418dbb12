#!/usr/bin/env bash
# test_pip_install.sh - `pip install .` as a user runs it: a fresh venv (with the system's site packages,
# so Debian's torch and numpy are seen), pip offline (--no-index) with its default build isolation, the
# in-tree backend (python/build_backend/ringtrain_build.py) building the module in its own temporary
# CMake folder. Then, from a directory outside the tree and with no PYTHONPATH:
#   - `import ringtrain` loads the installed package and module (their files are in the venv), and
#     ringtrain.__version__ and the installed distribution's version equal CMakeLists.txt's
#     project(ringtrain VERSION ...);
#   - the wheel is tagged cp311-abi3-<this platform>; every file in RECORD has the size and sha256 it
#     lists; the module's run path does not point into the (removed) build folder;
#   - the installed module works: synth, pack, verify, dataset_info and Dataset on a 120-record set
#     give the counts and shapes asked for, and a Loader batch arrives as torch tensors;
#   - `pip uninstall` removes every file it installed.
# The build is a Release build of the module and the static libraries it links (12 s on 2 idle cores).
#
# Usage: test_pip_install.sh [SOURCE_DIR] (default: the tree this script is in).
# RT_PYTHON: the interpreter for the venv (default /usr/bin/python3).
# Exit 0 pass, 1 fail, 77 skip (no python3-venv or pip).
set -u
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
ROOT=$(cd "$ROOT" && pwd)
PY=${RT_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-pip-install-XXXXXX")
trap 'rm -rf "$T"' EXIT
# What a user's shell may hold must not decide the result: no in-tree module on the path, no user site,
# no package index, no kept or differently configured build.
unset PYTHONPATH PYTHONHOME RINGTRAIN_BUILD_DIR RINGTRAIN_CMAKE_ARGS PIP_INDEX_URL PIP_EXTRA_INDEX_URL \
    PIP_FIND_LINKS PIP_CONFIG_FILE
export PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

"$PY" -c 'import venv, ensurepip' 2>/dev/null || { echo "SKIP: $PY has no venv/ensurepip (apt-get install python3-venv)"; exit 77; }
"$PY" -m venv --system-site-packages "$T/venv" >"$T/venv.log" 2>&1 ||
    { sed 's/^/    /' "$T/venv.log"; echo "SKIP: $PY -m venv failed (apt-get install python3-venv)"; exit 77; }
V=$T/venv/bin/python
"$V" -m pip --version >/dev/null 2>&1 || { echo "SKIP: no pip in the venv (apt-get install python3-pip)"; exit 77; }

want=$(sed -nE 's/^project\(ringtrain VERSION ([0-9.]+).*/\1/p' "$ROOT/CMakeLists.txt")
[ -n "$want" ] || { echo "FAIL: no project(ringtrain VERSION ...) in $ROOT/CMakeLists.txt"; exit 1; }

t0=$(date +%s%N)
(cd "$ROOT" && "$V" -m pip install --no-index --no-cache-dir -v .) >"$T/pip.log" 2>&1
rc=$?
t1=$(date +%s%N)
if [ "$rc" -ne 0 ]; then
    tail -60 "$T/pip.log" | sed 's/^/    /'
    echo "FAIL: pip install --no-index $ROOT: exit $rc"
    exit 1
fi
ms=$(((t1 - t0) / 1000000))
printf 'pip install: %d.%d s\n' $((ms / 1000)) $((ms % 1000 / 100))
grep -E '^ *ringtrain_build: (/|wrote)' "$T/pip.log" | sed 's/^ */    /'

mkdir "$T/outside"
cd "$T/outside" || exit 1
"$V" - "$want" "$T" <<'EOF' || { echo "FAIL: the installed package"; exit 1; }
import hashlib, base64, importlib.metadata, os, subprocess, sys, sysconfig, shutil, tempfile
want, tmp = sys.argv[1], sys.argv[2]
fails = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails.append(what)

import ringtrain
from ringtrain import _ringtrain
site = sysconfig.get_paths()["platlib"]
check(ringtrain.__file__ == os.path.join(site, "ringtrain", "__init__.py"),
      f"ringtrain imported from the venv: {ringtrain.__file__}")
check(_ringtrain.__file__ == os.path.join(site, "ringtrain", "_ringtrain.abi3.so"),
      f"the module imported from the venv: {_ringtrain.__file__}")
check(ringtrain.__version__ == want, f"ringtrain.__version__ {ringtrain.__version__} == {want}")
check(importlib.metadata.version("ringtrain") == want,
      f"installed distribution version {importlib.metadata.version('ringtrain')} == {want}")

dist = importlib.metadata.distribution("ringtrain")
tags = [l.split(": ", 1)[1] for l in dist.read_text("WHEEL").splitlines() if l.startswith("Tag: ")]
plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
check(tags == [f"cp311-abi3-{plat}"], f"wheel tag {tags} == ['cp311-abi3-{plat}']")

bad, listed = [], 0
for f in dist.files:
    if f.hash is None:
        continue
    listed += 1
    data = f.locate().read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if f.hash.mode != "sha256" or f.hash.value != digest or f.size != len(data):
        bad.append(str(f))
check(listed >= 3 and not bad, f"RECORD: {listed} files with sizes and sha256, mismatched: {bad}")
names = {str(f) for f in dist.files}
check({"ringtrain/__init__.py", "ringtrain/_ringtrain.abi3.so"} <= names, "RECORD lists the package and module")

if shutil.which("readelf"):
    dyn = subprocess.run(["readelf", "-d", _ringtrain.__file__], capture_output=True, text=True).stdout
    paths = [l for l in dyn.splitlines() if "RPATH" in l or "RUNPATH" in l]
    check(not any("ringtrain-build-" in l for l in paths), f"no run path into the build folder: {paths}")
    check("libpython" not in dyn, "the module is not linked to libpython")

raw, packed = os.path.join(tmp, "raw"), os.path.join(tmp, "packed")
ringtrain.synth(raw, kind="cifar10", train=100, test=20, seed=1)
st = ringtrain.pack(raw, packed)
info = ringtrain.dataset_info(packed)
splits = {k: v for k, v in info["splits"].items() if v}
check(splits == {"train": 100, "test": 20}, f"packed splits {splits} == train 100, test 20")
check(ringtrain.verify(packed) is None, "verify: no problems")
ds = ringtrain.Dataset(packed, "test")
img, label = ds[19]
check(len(ds) == 20 and img.shape == (32, 32, 3) and str(img.dtype) == "uint8" and 0 <= label < 10,
      f"Dataset: {len(ds)} records, ds[19] {img.shape} {img.dtype} label {label}")
try:
    import torch
except ImportError:
    print("skip Loader: no torch")
else:
    loader = ringtrain.Loader(packed, batch_size=10, workers=1)
    images, labels = next(iter(loader))
    check(tuple(images.shape) == (10, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.int64
          and len(loader) == 10,
          f"Loader: {len(loader)} batches, first {tuple(images.shape)} {images.dtype}, labels {labels.dtype}")
    del images, labels
    loader.close()
sys.exit(1 if fails else 0)
EOF

pkgdir=$("$V" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
"$V" -m pip uninstall -y ringtrain >"$T/uninstall.log" 2>&1 || { cat "$T/uninstall.log"; echo "FAIL: pip uninstall"; exit 1; }
left=$(cd "$pkgdir" && ls -d ringtrain ringtrain-*.dist-info 2>/dev/null)
[ -z "$left" ] || { echo "FAIL: left after pip uninstall in $pkgdir: $left"; exit 1; }
"$V" -c 'import ringtrain' 2>/dev/null && { echo "FAIL: ringtrain still imports after pip uninstall"; exit 1; }
echo "ok   pip uninstall removed everything"
echo "PASS"
