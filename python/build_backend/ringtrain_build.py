"""ringtrain_build - the PEP 517 / PEP 660 build backend of the `ringtrain` Python package.

pip calls it because pyproject.toml names it (build-backend = "ringtrain_build", backend-path =
["python/build_backend"]). It compiles nothing itself and knows no source file: it drives the project's
own CMake build, whose target `rt_python` makes the extension module `_ringtrain.abi3.so` and copies the
package's .py files beside it, in <build>/python/ringtrain/. It needs only the standard library, cmake
and a C compiler, so `pip install .` works offline (requires = []).

Hooks:
  build_wheel      configures a new build folder under the temporary directory (never inside the
                   source tree), builds `rt_python`, packs <build>/python/ringtrain/ into
                   ringtrain-<version>-cp311-abi3-<platform>.whl and removes the folder.
  build_editable   builds `rt_python` in a kept build folder (default <source>/build, the one the
                   build commands of docs/INSTALL.md use) and installs a .pth that puts <build>/python on
                   sys.path: `cmake --build build --target rt_python` then updates the installed
                   package in place.
  build_sdist      ringtrain-<version>.tar.gz of the files git knows (tracked, or new and not ignored).
  prepare_metadata_for_build_wheel / _editable, get_requires_for_build_wheel / _editable / _sdist.

Settings, from pip's --config-settings KEY=VALUE (pip 23.1 and later: -C) or else the environment:
  cmake-args  / RINGTRAIN_CMAKE_ARGS  more cmake configure arguments (shell words), after ours, so they
                                      win: e.g. "-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang".
  build-dir   / RINGTRAIN_BUILD_DIR   build in this folder and keep it (a later build is incremental);
                                      for build_editable, the folder the .pth points at.
  CMAKE_BUILD_PARALLEL_LEVEL          build jobs (default: the CPUs this process may run on).
The defaults for a new build folder: -G Ninja (when ninja is found) -DCMAKE_BUILD_TYPE=Release
-DRT_CUDA=OFF -DBUILD_TESTING=OFF -DPython3_EXECUTABLE=<the interpreter running pip, a venv's if
pip is a venv's>. An existing build folder keeps its configuration; given cmake-args are applied to it.

The version is the one in CMakeLists.txt's `project(ringtrain VERSION x.y.z)`; name, summary, Python
and dependencies come from pyproject.toml's [project] table. The wheel holds one abi3 module linked
against this system's shared libraries (liburing, zstd, turbojpeg, ...): it is a wheel for the machine
(distribution) it was built on, not a manylinux wheel.
"""

import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

NAME = "ringtrain"
TARGET = "rt_python"
# Keys of pyproject's [project] table this backend turns into metadata; any other key is an error,
# so that nothing written there is silently left out of the wheel.
PROJECT_KEYS = {"name", "dynamic", "description", "requires-python", "dependencies",
                "optional-dependencies", "license", "keywords", "classifiers", "urls"}


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


# ---- project facts ----------------------------------------------------------------------------------


def _root():
    # PEP 517: hooks run with the source tree as the working directory.
    root = Path.cwd()
    if not (root / "pyproject.toml").is_file() or not (root / "CMakeLists.txt").is_file():
        raise BuildError(f"{root}: not the ringtrain source tree (no pyproject.toml and CMakeLists.txt)")
    return root


def _version(root):
    text = (root / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"\bproject\(\s*ringtrain\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
    if not m:
        raise BuildError(f"{root / 'CMakeLists.txt'}: no `project(ringtrain VERSION x.y.z)`")
    return m.group(1)


def _project(root):
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the module is abi3 for 3.11 and later anyway
        raise BuildError(f"ringtrain needs Python 3.11 or later to build and run (this is "
                         f"{sys.version.split()[0]})") from None
    with open(root / "pyproject.toml", "rb") as f:
        project = tomllib.load(f).get("project", {})
    unknown = sorted(set(project) - PROJECT_KEYS)
    if unknown:
        raise BuildError(f"pyproject.toml [project]: {', '.join(unknown)}: not handled by ringtrain_build "
                         f"(it handles {', '.join(sorted(PROJECT_KEYS))})")
    if project.get("name") != NAME:
        raise BuildError(f"pyproject.toml [project] name is {project.get('name')!r}, expected {NAME!r}")
    if project.get("dynamic", []) != ["version"]:
        raise BuildError('pyproject.toml [project]: dynamic must be ["version"] (CMakeLists.txt holds it)')
    return project


def _metadata(root):
    """Core metadata 2.1 (METADATA in a wheel, PKG-INFO in an sdist), as text."""
    p = _project(root)
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {_version(root)}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "keywords" in p:
        lines.append(f"Keywords: {','.join(p['keywords'])}")
    lic = p.get("license")
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    elif lic is not None:
        raise BuildError('pyproject.toml [project] license: only {text = "..."} is handled')
    for label, url in p.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for d in deps:
            marker = f'extra == "{extra}"'
            lines.append(f"Requires-Dist: {d}; {marker}" if ";" not in d
                         else f"Requires-Dist: {d.split(';', 1)[0].strip()}; "
                              f"({d.split(';', 1)[1].strip()}) and {marker}")
    return "\n".join(lines) + "\n"


def _setting(config_settings, key, env):
    value = (config_settings or {}).get(key)
    if isinstance(value, list):  # pip passes a repeated -C KEY=... as a list
        value = " ".join(value)
    return value if value is not None else os.environ.get(env)


def _log(msg):
    print(f"ringtrain_build: {msg}", file=sys.stderr, flush=True)


# ---- the CMake build --------------------------------------------------------------------------------


def _run(cmd, what):
    _log(" ".join(shlex.quote(str(c)) for c in cmd))
    # The hooks' stdout is pip's to show; CMake's output goes to stderr with ours.
    rc = subprocess.run([str(c) for c in cmd], stdout=sys.stderr, stderr=sys.stderr).returncode
    if rc != 0:
        raise BuildError(f"{what} failed (exit {rc}); its output is above")


def _jobs():
    level = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "")
    if level.isdigit() and int(level) > 0:
        return int(level)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cmake_build(root, build, config_settings):
    """Configures `build` (when new, or when cmake-args are given) and builds rt_python there.
    Returns the package folder, build/python/ringtrain."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found: apt-get install cmake (or run tools/install-deps.sh)")
    extra = shlex.split(_setting(config_settings, "cmake-args", "RINGTRAIN_CMAKE_ARGS") or "")
    configure = [cmake, "-S", root, "-B", build]
    if not (build / "CMakeCache.txt").exists():
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        # The module is built for the interpreter that runs pip (that of the venv, if one).
        configure += ["-DCMAKE_BUILD_TYPE=Release", "-DRT_CUDA=OFF", "-DBUILD_TESTING=OFF",
                      f"-DPython3_EXECUTABLE={sys.executable}"]
        _run(configure + extra, "configuring with cmake")
    elif extra:
        _run(configure + extra, "configuring with cmake")
    # Say why when the module is not part of the build, rather than ninja's "unknown target".
    targets = subprocess.run([cmake, "--build", build, "--target", "help"], capture_output=True, text=True)
    if targets.returncode == 0 and not re.search(rf"\b{TARGET}\b", targets.stdout):
        raise BuildError(f"CMake made no target {TARGET}: the extension module needs Python 3.11 or later "
                         f"with its headers (apt-get install python3-dev) and dlpack/dlpack.h (apt-get "
                         f"install libdlpack-dev); the configure output above says what was not found")
    _run([cmake, "--build", build, "--target", TARGET, "-j", str(_jobs())], f"building {TARGET}")
    pkg = build / "python" / NAME
    if not (pkg / "__init__.py").is_file():
        raise BuildError(f"{pkg}: no __init__.py after building {TARGET}")
    return pkg


def _tag(root, pkg):
    """The wheel tag of the module in pkg: cp3X-abi3-<platform>, 3.X the limited API it was built for."""
    mods = sorted(pkg.glob("_ringtrain*.so"))
    if len(mods) != 1 or not mods[0].name.endswith(".abi3.so"):
        raise BuildError(f"{pkg}: expected one _ringtrain.abi3.so, found {[m.name for m in mods]}")
    # The limited API version the module was compiled against, as python/CMakeLists.txt defines it.
    cml = root / "python" / "CMakeLists.txt"
    m = re.search(r"Py_LIMITED_API=0x03([0-9A-Fa-f]{2})", cml.read_text(encoding="utf-8"))
    if not m:
        raise BuildError(f"{cml}: no Py_LIMITED_API=0x03XX0000 definition for the module")
    platform = re.sub(r"[^A-Za-z0-9_]", "_", sysconfig.get_platform())
    return f"cp3{int(m.group(1), 16)}-abi3-{platform}"


# ---- wheel writing ----------------------------------------------------------------------------------


def _epoch():
    return int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))


def _zipinfo(name, mode):
    t = time.gmtime(max(_epoch(), 315532800))  # zip dates start in 1980
    zi = zipfile.ZipInfo(name, date_time=t[:6])
    zi.external_attr = (stat.S_IFREG | mode) << 16
    zi.compress_type = zipfile.ZIP_DEFLATED
    return zi


def _write_wheel(wheel_directory, tag, files, metadata):
    """Writes <name>-<version>-<tag>.whl into wheel_directory. files: [(archive name, bytes, mode)].
    Returns the file name."""
    version = re.search(r"^Version: (.+)$", metadata, re.M).group(1)
    distinfo = f"{NAME}-{version}.dist-info"
    wheel = (f"Wheel-Version: 1.0\nGenerator: ringtrain_build {version}\nRoot-Is-Purelib: false\n"
             f"Tag: {tag}\n")
    files = files + [(f"{distinfo}/METADATA", metadata.encode(), 0o644),
                     (f"{distinfo}/WHEEL", wheel.encode(), 0o644)]
    record = []
    for arcname, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arcname},sha256={digest},{len(data)}")
    record.append(f"{distinfo}/RECORD,,")
    files.append((f"{distinfo}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    name = f"{NAME}-{version}-{tag}.whl"
    path = Path(wheel_directory) / name
    tmp = path.with_suffix(".whl.partial")
    with zipfile.ZipFile(tmp, "w") as zf:
        for arcname, data, mode in files:
            zf.writestr(_zipinfo(arcname, mode), data)
    tmp.replace(path)
    _log(f"wrote {path} ({path.stat().st_size} bytes, {len(files)} files)")
    return name


def _package_files(pkg):
    """The package as CMake left it in the build folder: every file but caches."""
    out = []
    for f in sorted(pkg.rglob("*")):
        if not f.is_file() or "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        mode = 0o755 if os.access(f, os.X_OK) else 0o644
        out.append((f"{NAME}/{f.relative_to(pkg).as_posix()}", f.read_bytes(), mode))
    return out


def _build_dir(config_settings, default=None):
    """(build folder, whether to remove it afterwards)."""
    kept = _setting(config_settings, "build-dir", "RINGTRAIN_BUILD_DIR") or default
    if kept:
        return Path(kept).resolve(), False
    return Path(tempfile.mkdtemp(prefix="ringtrain-build-")), True


# ---- PEP 517 hooks ----------------------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    root = _root()
    distinfo = Path(metadata_directory) / f"{NAME}-{_version(root)}.dist-info"
    distinfo.mkdir(parents=True, exist_ok=True)
    (distinfo / "METADATA").write_text(_metadata(root), encoding="utf-8")
    return distinfo.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = _root()
    metadata = _metadata(root)
    build, remove = _build_dir(config_settings)
    try:
        pkg = _cmake_build(root, build, config_settings)
        return _write_wheel(wheel_directory, _tag(root, pkg), _package_files(pkg), metadata)
    finally:
        if remove:
            shutil.rmtree(build, ignore_errors=True)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    root = _root()
    metadata = _metadata(root)
    build, _ = _build_dir(config_settings, default=root / "build")
    pkg = _cmake_build(root, build, config_settings)
    # A .pth line is a folder appended to sys.path; <build>/python holds only the package and CMake's
    # own files (CMakeFiles/ is not an importable name).
    pth = f"{pkg.parent}\n".encode()
    return _write_wheel(wheel_directory, _tag(root, pkg), [(f"_{NAME}_editable.pth", pth, 0o644)], metadata)


def _sdist_files(root):
    """Paths (relative to root) that make the source tree: those git knows that exist, or, in an unpacked
    sdist (PKG-INFO, no .git), every file."""
    if (root / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=False)
        if out.returncode != 0:
            raise BuildError(f"git ls-files in {root} failed: {out.stderr.decode(errors='replace').strip()}")
        names = [n for n in out.stdout.decode().split("\0") if n]
        return sorted(n for n in set(names) if (root / n).is_file() and not (root / n).is_symlink())
    if (root / "PKG-INFO").is_file():
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts and p.name != "PKG-INFO")
    raise BuildError(f"{root}: neither a git checkout (with git installed) nor an unpacked sdist: "
                     f"cannot tell which files are the source")


def build_sdist(sdist_directory, config_settings=None):
    root = _root()
    metadata = _metadata(root)
    version = _version(root)
    top = f"{NAME}-{version}"
    name = f"{top}.tar.gz"
    path = Path(sdist_directory) / name
    tmp = path.with_name(name + ".partial")
    mtime = _epoch()

    def add(tf, arcname, data, mode):
        ti = tarfile.TarInfo(f"{top}/{arcname}")
        ti.size, ti.mode, ti.mtime = len(data), mode, mtime
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        tf.addfile(ti, io.BytesIO(data))

    files = _sdist_files(root)
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in files:
            data = (root / rel).read_bytes()
            add(tf, rel, data, 0o755 if os.access(root / rel, os.X_OK) else 0o644)
        add(tf, "PKG-INFO", metadata.encode(), 0o644)
    tmp.replace(path)
    _log(f"wrote {path} ({path.stat().st_size} bytes, {len(files) + 1} files)")
    return name
