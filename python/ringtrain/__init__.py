"""ringtrain for PyTorch scripts: the loader, staging and the input profiler.

A thin layer over the C libraries that the ``ringtrain`` command is built from
(the io_uring loader and its ring of batch slots, node-local staging, pack and
verify, the input verdict); nothing here re-implements what they do.

    import ringtrain
    loader = ringtrain.Loader("/data/cifar10-packed", batch_size=256)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:      # uint8 (B,C,H,W), int64 (B,)
            x = images.float().div_(255)   # normalisation stays with the model
            ...

Weights for ``ringtrain train --init``: ``ringtrain.save_safetensors(model.state_dict(), "m.safetensors")``,
``ringtrain.convert("m.pth")`` (``python3 -m ringtrain.convert`` on the command line) and
``ringtrain.load_state_dict(path)``, from ringtrain/convert.py.

See docs/PYTHON.md for the whole manual: the batch lifetime, resume,
distributed use, the profiler and the errors.
"""

try:
    from . import _ringtrain
except ImportError as e:  # pragma: no cover - a build without python3-dev
    raise ImportError(
        "ringtrain's C module (_ringtrain.abi3.so) is missing or does not load: build the project with "
        "python3-dev installed (tools/install-deps.sh) and put <build>/python on PYTHONPATH, or `pip install .` "
        f"from the source tree ({e})"
    ) from e

from ._loader import Loader
from ._dataset import Dataset
from ._profile import Profile, Profiler, profile
from ._tools import dataset_info, pack, stage, synth, verify

#: Every failure reported by the C libraries: an OSError whose ``errno`` says what kind
#: (EBADMSG corrupt data, ENOENT missing file, EBUSY a batch held too long, ...) and whose
#: ``strerror`` (and str()) is the C message naming the file, shard, block or record.
Error = _ringtrain.Error

__version__ = _ringtrain.version().split()[1]  # "ringtrain X.Y.Z (build ...)"

# convert.py's functions, imported on first use: `python3 -m ringtrain.convert` imports this package before it runs
# the module, which would warn that the module was already imported; and `import ringtrain` needs no torch.
_CONVERT_NAMES = ("convert", "save_safetensors", "load_state_dict", "ConvertError")


def __getattr__(name):
    if name in _CONVERT_NAMES:
        import importlib

        mod = importlib.import_module(".convert", __name__)
        # Importing the submodule bound `convert` to it; the package's `convert` is the function.
        globals().update({n: getattr(mod, n) for n in _CONVERT_NAMES})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Error",
    "Loader",
    "Dataset",
    "Profile",
    "Profiler",
    "profile",
    "stage",
    "pack",
    "synth",
    "verify",
    "dataset_info",
    "convert",
    "save_safetensors",
    "load_state_dict",
    "ConvertError",
    "__version__",
]
