"""PyTorch weights to safetensors, for ``ringtrain train --init FILE``.

    python3 -m ringtrain.convert resnet18.pth resnet18.safetensors
    python3 path/to/python/ringtrain/convert.py resnet18.pth      # writes resnet18.safetensors

reads a ``.pth`` the way ``torch.load(map_location="cpu", weights_only=True)`` does (only tensors and plain
containers; ``--unsafe-pickle`` allows any pickle, which can run code), finds the state_dict in it (the object
itself, or the entry of a training checkpoint under "state_dict", "model", "model_state_dict", "net" or
"module"), drops the "module." (DistributedDataParallel) and "_orig_mod." (torch.compile) prefixes of its names,
and writes it as safetensors: the names are PyTorch's, which are ringtrain's models' names too
(torchvision's resnet18 and resnet50).

From a script, without the ``.pth`` step::

    ringtrain.save_safetensors(model.state_dict(), "model.safetensors")
    model.load_state_dict(ringtrain.load_state_dict("model.safetensors"))   # or a .pth, or ringtrain's checkpoint

This file is standalone: it needs torch and numpy and no part of ringtrain (not its C module), so it also runs
by path where only the ``ringtrain`` command and torch are installed. It does not check names or shapes against
a model: ``ringtrain train --init`` does, and lists every difference.
"""

import argparse
import json
import os
import struct
import sys
import tempfile

__all__ = ["save_safetensors", "load_state_dict", "convert", "main"]

#: The entries of a training checkpoint that usually hold the model's state_dict, in the order they are tried.
WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "net", "module")
#: Name prefixes that wrappers add to every key: DistributedDataParallel / DataParallel, torch.compile.
STRIP_PREFIXES = ("module.", "_orig_mod.")
#: Names of batchnorm statistics: buffers, not parameters, in the summary line.
_BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")


class ConvertError(Exception):
    """A file that cannot be read or converted; str() is the whole message, naming the file."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ConvertError(f"PyTorch is needed to read and write these files (import torch: {e})") from e
    return torch


def _st_dtypes(torch):
    """torch dtype -> (safetensors name, element size, numpy little-endian integer of that size).

    Signed integers: torch.from_numpy takes no uint16/32/64."""
    return {
        torch.float32: ("F32", 4, "<i4"),
        torch.float16: ("F16", 2, "<i2"),
        torch.bfloat16: ("BF16", 2, "<i2"),
        torch.float64: ("F64", 8, "<i8"),
        torch.int64: ("I64", 8, "<i8"),
        torch.int32: ("I32", 4, "<i4"),
        torch.uint8: ("U8", 1, "u1"),
    }


# ---- writing ------------------------------------------------------------------------------------------------


def _tensor_data(torch, t, view):
    """The tensor's elements in C order as a little-endian numpy array, for write() (no copy of a contiguous
    tensor on a little-endian host; a byte swap on a big-endian one)."""
    itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    flat = t.detach().reshape(-1).contiguous()
    # Reinterpreted as integers of the same size: numpy has no bfloat16, and integers byte-swap exactly.
    a = flat.view(itype).numpy() if flat.dtype != itype else flat.numpy()
    return a.astype(view, copy=False)


def save_safetensors(tensors, path, metadata=None):
    """Writes ``tensors`` (a mapping name -> torch.Tensor, such as a state_dict) to ``path`` as safetensors.

    The layout is the format's: the 8-byte little-endian length of a JSON header padded with spaces to a
    multiple of 8, then the tensors' bytes, contiguous, in C order and little-endian. dtypes F32, F16, BF16,
    F64, I64, I32 and U8 (those ringtrain reads); each tensor keeps its own (convert floating ones first for
    another). ``metadata`` (str -> str) goes into "__metadata__", with "format": "pt" unless given. The data is
    ordered by element size, largest first, so every tensor starts aligned to its element size.

    The write is atomic: a temporary file in the same directory, fsync, rename over ``path``, fsync of the
    directory; on any failure ``path`` is as it was and the temporary file is gone. Returns the bytes written.
    Raises TypeError for a value that is not a tensor, ValueError for an unsupported dtype or metadata that is
    not strings, OSError when the file cannot be written.
    """
    torch = _torch()
    dtypes = _st_dtypes(torch)
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, not {type(name).__name__} ({name!r})")
        if name == "__metadata__":
            raise ValueError("'__metadata__' is the safetensors header's own key, not a tensor name")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"'{name}' is a {type(t).__name__}, not a tensor")
        if t.dtype not in dtypes:
            raise ValueError(f"'{name}': dtype {t.dtype} is not one ringtrain reads "
                             f"(float32, float16, bfloat16, float64, int64, int32, uint8)")
        if t.is_sparse or t.layout != torch.strided:
            raise ValueError(f"'{name}': a {t.layout} tensor; only dense tensors can be stored")
        items.append((name, t.detach().cpu()))
    meta = {"format": "pt"}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"metadata must map strings to strings: {k!r}: {v!r}")
        meta[k] = v

    # Stable by element size, largest first: with an 8-byte aligned data section every tensor is then aligned.
    order = sorted(range(len(items)), key=lambda i: -dtypes[items[i][1].dtype][1])
    header = {"__metadata__": meta}
    spans = {}
    offset = 0
    for i in order:
        name, t = items[i]
        nbytes = t.numel() * dtypes[t.dtype][1]
        spans[name] = (offset, offset + nbytes)
        offset += nbytes
    for name, t in items:  # the header lists them in the mapping's order
        header[name] = {"dtype": dtypes[t.dtype][0], "shape": list(t.shape), "data_offsets": list(spans[name])}
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    head += b" " * (-len(head) % 8)

    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would make the result private
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for i in order:
                name, t = items[i]
                f.write(_tensor_data(torch, t, dtypes[t.dtype][2]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        dfd = -1  # a directory that cannot be opened (no read permission) cannot be fsynced either
    if dfd >= 0:
        try:
            os.fsync(dfd)
        except OSError:
            pass  # some file systems refuse fsync on a directory; the rename itself has happened
        finally:
            os.close(dfd)
    return 8 + len(head) + offset


# ---- reading ------------------------------------------------------------------------------------------------


def _is_safetensors(path):
    with open(path, "rb") as f:
        first = f.read(9)
        size = os.fstat(f.fileno()).st_size
    if len(first) < 9:
        return False
    (n,) = struct.unpack("<Q", first[:8])
    return 2 <= n <= size - 8 and first[8:9] == b"{"


def _read_safetensors(torch, path):
    names = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
    views = {name: _st_dtypes(torch)[dt][2] for name, dt in names.items()}
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise ConvertError(f"{path}: not a safetensors file: its header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: not a safetensors file: its header is not a JSON object")
    base = 8 + n
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (b, e) = v["dtype"], [int(d) for d in v["shape"]], v["data_offsets"]
            b, e = int(b), int(e)
        except (TypeError, KeyError, ValueError) as err:
            raise ConvertError(f"{path}: tensor '{name}': needs dtype, shape and data_offsets [begin, end]") from err
        if dt not in names:
            raise ConvertError(f"{path}: tensor '{name}': dtype {dt} is not one of {', '.join(names)}")
        count = 1
        for d in shape:
            count *= max(d, -1)  # a negative dimension fails the size check below
        size = torch.empty((), dtype=names[dt]).element_size()
        if not 0 <= b <= e <= len(data) - base or e - b != count * size:
            raise ConvertError(f"{path}: tensor '{name}': data_offsets [{b}, {e}] do not hold {dt} {shape} "
                               f"in a data section of {len(data) - base} bytes")
        # Read as little-endian integers, copied into native ones (writable, swapped on a big-endian host).
        a = np.frombuffer(data, dtype=views[dt], count=count, offset=base + b).astype(views[dt][-2:])
        out[name] = torch.from_numpy(a).view(names[dt]).reshape(shape)
    return out


def _plural(n, one, many):
    return f"{n:,} {one if n == 1 else many}"


def _describe(obj):
    if isinstance(obj, dict):
        keys = list(obj)
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"a dict of {_plural(len(keys), 'entry', 'entries')}" + (f" ({shown})" if keys else "")
    return f"a {type(obj).__module__}.{type(obj).__qualname__}" if type(obj).__module__ != "builtins" \
        else f"a {type(obj).__name__}"


def _find_state_dict(torch, obj, path, key=None):
    """(the state_dict in obj, where it was: "" for obj itself, else the entries taken, "model.state_dict")."""
    where = []
    if key is not None:
        for part in key.split("."):
            if not isinstance(obj, dict) or part not in obj:
                raise ConvertError(f"{path}: no entry '{'.'.join(where + [part])}' (it holds {_describe(obj)})")
            obj = obj[part]
            where.append(part)
    while True:
        if isinstance(obj, torch.nn.Module):  # a whole pickled model (only with --unsafe-pickle)
            obj = obj.state_dict()
            where.append("state_dict()")  # "model.state_dict()": the model's
        if not isinstance(obj, dict):
            raise ConvertError(f"{path}: not a state_dict: {'.'.join(where) or 'the file'} holds {_describe(obj)}; "
                               f"a state_dict is a dict of names to tensors (torch.save(model.state_dict(), ...))")
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj, ".".join(where)
        if key is None:
            wrapped = [k for k in WRAPPER_KEYS if isinstance(obj.get(k), (dict, torch.nn.Module))]
            if wrapped:
                obj = obj[wrapped[0]]
                where.append(wrapped[0])
                continue
        other = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
        inside = f" in '{'.'.join(where)}'" if where else ""
        if len(other) < len(obj):
            listed = ", ".join(f"'{k}' ({_describe(obj[k])[2:] if isinstance(obj[k], dict) else type(obj[k]).__name__})"
                               for k in other[:8]) + (f" and {len(other) - 8} more" if len(other) > 8 else "")
            raise ConvertError(f"{path}: not a state_dict{inside}: {len(other)} of its {len(obj)} entries are not "
                               f"tensors: {listed}")
        hint = "" if key is not None else \
            f"; none of {', '.join(WRAPPER_KEYS)} holds one: name the entry with --key"
        raise ConvertError(f"{path}: no state_dict{inside}: {_describe(obj)}, none a tensor{hint}")


def _strip_prefixes(sd):
    """Drops every prefix of STRIP_PREFIXES that all names share, repeatedly; returns (dict, prefixes dropped)."""
    stripped = []
    while sd:
        for p in STRIP_PREFIXES:
            if all(isinstance(k, str) and k.startswith(p) for k in sd):
                sd = {k[len(p):]: v for k, v in sd.items()}
                stripped.append(p)
                break
        else:
            break
    return sd, stripped


def _load(path, unsafe_pickle=False, key=None):
    """(state_dict, notes): the state_dict of the file at path, and what was done to find it (for messages)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConvertError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ConvertError(f"{path}: a directory, not a file")
    torch = _torch()
    notes = []
    try:
        if _is_safetensors(path):
            obj = _read_safetensors(torch, path)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=not unsafe_pickle)
    except ConvertError:
        raise
    except OSError as e:
        raise ConvertError(f"{path}: {e.strerror or e}") from e
    except Exception as e:  # torch.load's own errors are of many types (KeyError on a file that is no pickle)
        text = str(e)
        if isinstance(e, TypeError) and "weights_only" in text:
            raise ConvertError(f"{path}: torch {torch.__version__} has no torch.load(weights_only=...), which reads "
                               f"only tensors and plain containers (torch 1.13 and later do); with a torch this old "
                               f"only --unsafe-pickle reads the file, for files you trust") from e
        if not unsafe_pickle and "Weights only load failed" in text:
            what = text.split("WeightsUnpickler error:")[-1].strip().splitlines()[0][:200]
            raise ConvertError(
                f"{path}: holds more than tensors and plain containers ({what}); weights_only=True reads no "
                f"other objects because unpickling them can run any code. If you trust the file, --unsafe-pickle "
                f"reads it anyway; better, save model.state_dict() alone") from e
        if "zip archive" in text and "jit" in text:
            raise ConvertError(f"{path}: a TorchScript archive (torch.jit.save); load it with torch.jit.load and "
                               f"save its state_dict() with torch.save, then convert that") from e
        first = text.splitlines()[0] if text else ""
        raise ConvertError(f"{path}: not a file torch.load can read ({type(e).__name__}: {first[:200]})") from e
    sd, where = _find_state_dict(torch, obj, path, key)
    if where.endswith("state_dict()"):
        inside = where[:-len("state_dict()")].rstrip(".")
        notes.append("the state_dict() of the model pickled " + (f"under '{inside}'" if inside else "in the file"))
    elif where:
        notes.append(f"the state_dict under '{where}'")
    sd, stripped = _strip_prefixes(dict(sd))
    if stripped:
        notes.append("names without " + " and ".join(f"'{p}'" for p in stripped))
    return sd, notes


def load_state_dict(path, unsafe_pickle=False, key=None):
    """The state_dict held in the file at ``path``, on the CPU: a dict of names to tensors.

    The file may be a ``.pth`` of torch.save (read with weights_only=True unless ``unsafe_pickle``) holding a
    state_dict, a training checkpoint with one under "state_dict", "model", "model_state_dict", "net" or
    "module" (or under ``key``, "a.b" for nested entries), or a whole model (with ``unsafe_pickle`` only); or a
    safetensors file (ringtrain's checkpoints are). "module." and "_orig_mod." prefixes shared by every name are
    dropped. Raises ConvertError naming the file and what is wrong.
    """
    return _load(path, unsafe_pickle, key)[0]


def _default_output(src):
    root, ext = os.path.splitext(src)
    return (root if ext.lower() in (".pth", ".pt", ".bin", ".ckpt", ".tar") else src) + ".safetensors"


def convert(src, dst=None, dtype=None, unsafe_pickle=False, key=None):
    """Converts ``src`` (see load_state_dict) into the safetensors file ``dst`` (default: src's name with
    ".safetensors" in place of .pth/.pt/.bin/.ckpt/.tar). ``dtype="f32"`` stores every floating tensor as
    float32; None keeps each tensor's dtype. Returns the summary line the command prints. Raises ConvertError.
    """
    torch = _torch()
    src = os.fspath(src)
    dst = os.fspath(dst) if dst is not None else _default_output(src)
    if dtype not in (None, "keep", "f32"):
        raise ConvertError(f"--dtype {dtype}: 'f32' or 'keep'")
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise ConvertError(f"{dst}: the output would replace the input")
    sd, notes = _load(src, unsafe_pickle, key)
    if dtype == "f32":
        sd = {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}
    dtypes = _st_dtypes(torch)
    bad = [f"'{k}' ({v.dtype})" for k, v in sd.items() if v.dtype not in dtypes]
    if bad:
        raise ConvertError(f"{src}: {len(bad)} tensors of a type ringtrain does not read: {', '.join(bad[:8])}"
                           + (" ..." if len(bad) > 8 else "") + " (float32, float16, bfloat16, float64, int64, int32"
                           ", uint8)")
    try:
        nbytes = save_safetensors(sd, dst, {"format": "pt", "source": os.path.basename(src)})
    except OSError as e:
        raise ConvertError(f"{dst}: cannot write: {e.strerror or e}") from e
    except (TypeError, ValueError) as e:
        raise ConvertError(f"{src}: {e}") from e
    params = sum(v.numel() for k, v in sd.items() if not k.endswith(_BUFFER_SUFFIXES))
    buffers = sum(v.numel() for k, v in sd.items() if k.endswith(_BUFFER_SUFFIXES))
    kinds = sorted({dtypes[v.dtype][0] for v in sd.values()}, key=lambda s: ("F" not in s, s))
    line = (f"wrote {dst}: {_plural(len(sd), 'tensor', 'tensors')} ({', '.join(kinds)}), "
            f"{_plural(params, 'parameter', 'parameters')}"
            + (f" + {buffers:,} batchnorm statistics" if buffers else "") + f", {nbytes:,} bytes")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m ringtrain.convert" if __package__ else None,  # by path: argv[0]
        description="Convert a PyTorch .pth (a state_dict, or a training checkpoint holding one) into the "
                    "safetensors file `ringtrain train --init FILE` starts from. Prints one line: what it wrote.",
        epilog="Names are kept as PyTorch's (torchvision's resnet18/resnet50 are ringtrain's); 'module.' "
               "(DistributedDataParallel) and '_orig_mod.' (torch.compile) prefixes are dropped. Exit 0, or 1 "
               "with one 'error:' line.")
    p.add_argument("input", help=".pth / .pt file of torch.save (or a .safetensors file, to change its dtype)")
    p.add_argument("output", nargs="?", help="the .safetensors to write (default: the input's name with "
                                             ".safetensors); replaced atomically")
    p.add_argument("--dtype", choices=("keep", "f32"), default="keep",
                   help="f32: store floating tensors as float32 (default keep: each tensor's own dtype)")
    p.add_argument("--key", metavar="ENTRY",
                   help="the checkpoint's entry holding the state_dict ('model_ema', 'a.b' for nested ones), "
                        f"when it is none of {', '.join(WRAPPER_KEYS)}")
    p.add_argument("--unsafe-pickle", action="store_true",
                   help="read with torch.load(weights_only=False): needed for a checkpoint holding other objects "
                        "(argparse.Namespace, a whole model), but unpickling can run any code the file names: "
                        "only for files you trust")
    a = p.parse_args(argv)
    try:
        if a.unsafe_pickle:
            print(f"warning: --unsafe-pickle: {a.input} is read with weights_only=False, which runs whatever code "
                  f"its pickle names; use it only on files you trust", file=sys.stderr)
        print(convert(a.input, a.output, a.dtype, a.unsafe_pickle, a.key))
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
