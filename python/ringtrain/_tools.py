"""The offline tools -- stage, pack, synth, verify -- as calls into the C libraries."""

import os

from . import _ringtrain


def _path(p):
    return os.fspath(p)


def dataset_info(data):
    """The manifest of the packed dataset at `data`, as a dict: codec, shape, classes, records per split, mean/std.

    Datasets packed with ``--codec jpeg --max-side N`` keep each image at its own size: "height" and "width"
    are 0, "variable" is True, "max_side" is N and "size_min"/"size_median"/"size_max" are (height, width)
    of the smallest, median and largest record by area (None for fixed-size datasets, whose "max_side" is 0).
    "skipped_files" and "ignored_files" count the files pack skipped as bad (--skip-bad) and passed over
    as hidden or not images (0 for CIFAR/MNIST).
    """
    return _ringtrain.dataset_info(_path(data))


def stage(data, to=None, verify="full"):
    """Copy the packed dataset `data` to node-local disk once per node and return the copy's path.

    The same call as ``ringtrain stage``: the copy lands in TO/ringtrain-<uid>/<manifest hash>, where TO is
    `to`, else $SLURM_TMPDIR, else $TMPDIR, else /tmp. Every rank of a node may call it: one copies while
    the others wait on its lock, then find the copy done. Files already staged are checked (size and
    XXH64; verify="size" checks sizes only) and copied again if they differ; an interrupted copy resumes.
    Raises ringtrain.Error naming the file (missing source, out of space, a directory another user controls).
    """
    if verify not in ("full", "size"):
        raise ValueError(f"verify must be 'full' or 'size', not {verify!r}")
    res = _ringtrain.stage(_path(data), None if to is None else _path(to), verify)
    return res["path"]


def pack(input, output, codec="raw", val_split=0.0, quality=0, force=False, label="fine", threads=0, level=0,
         split_seed=0, size=None, fit="crop", max_side=0, channels=0, skip_bad=False, exif_rotate=False):
    """Pack CIFAR-10/100 (binary, .tar.gz or the python tarball), MNIST IDX or an image folder into shards.

    The same as ``ringtrain pack INPUT OUTPUT``. Returns the pack's figures as a dict (records per split,
    bytes in and out, shards, seconds; for an image folder also files, ignored, skipped, skipped_summary,
    passthrough, scaled_decode -- JPEGs decoded at 1/2, 1/4, 1/8 -- warned, the JPEGs kept though libjpeg
    warned, and first_warning, "PATH: warning" or ""). Output appears only when complete.

    Image folders (any sizes and formats): size=S or (H, W) stores every image at that size (fit "crop":
    Resize + CenterCrop, "stretch" or "pad"); codec="jpeg", max_side=N keeps each at its own size, at most N
    on its longer side, for Loader(..., image_size=S) to crop; channels=1 stores gray; skip_bad=True leaves
    out unusable files and lists them in the manifest (else the first one raises ringtrain.Error);
    exif_rotate=True turns images as their EXIF orientation says. As ``--size``, ``--fit``, ``--max-side``,
    ``--channels``, ``--skip-bad``, ``--exif-rotate``.
    """
    if size is None:
        size_h = size_w = 0
    elif isinstance(size, int):
        size_h = size_w = size
    else:
        size_h, size_w = (int(v) for v in size)
    if codec not in ("raw", "jpeg"):
        raise ValueError(f"codec must be 'raw' or 'jpeg', not {codec!r}")
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', not {label!r}")
    if not 0.0 <= val_split < 1.0:
        raise ValueError(f"val_split must be in [0, 1), not {val_split!r}")
    if size is not None and not (0 < size_h <= 65535 and 0 < size_w <= 65535):
        raise ValueError(f"size must be S or (H, W) with sides in 1..65535, not {size!r}")
    if fit not in ("crop", "stretch", "pad"):
        raise ValueError(f"fit must be 'crop', 'stretch' or 'pad', not {fit!r}")
    if channels not in (0, 1, 3):
        raise ValueError(f"channels must be 1 or 3, not {channels!r}")
    return _ringtrain.pack(_path(input), _path(output), codec=codec, quality=int(quality), level=int(level),
                           val_split=float(val_split), split_seed=int(split_seed), label=label,
                           threads=int(threads), force=bool(force), size_h=size_h, size_w=size_w, fit=fit,
                           max_side=int(max_side), channels=int(channels), skip_bad=bool(skip_bad),
                           exif_rotate=bool(exif_rotate))


def synth(output, kind="cifar10", train=50000, test=10000, seed=0, threads=0):
    """Write a learnable synthetic dataset in the original distribution's layout; returns `output`.

    kind: "cifar10" (output/cifar-10-batches-bin), "cifar100" (output/cifar-100-binary) or "mnist"
    (IDX .gz files). Same seed, same bytes. Pack it with ringtrain.pack(output, packed_dir).
    """
    if kind not in ("cifar10", "cifar100", "mnist"):
        raise ValueError(f"kind must be 'cifar10', 'cifar100' or 'mnist', not {kind!r}")
    _ringtrain.synth(_path(output), format=kind, train=int(train), test=int(test), seed=int(seed),
                     threads=int(threads))
    return _path(output)


def verify(data):
    """Check every shard of the packed dataset `data` (sizes, checksums, headers, labels, every block).

    Returns None when all is well; raises ringtrain.Error (errno EBADMSG) listing every problem otherwise.
    """
    problems = _ringtrain.verify(_path(data))
    if problems:
        import errno

        shown = problems[:20]
        more = f"\n... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        raise _ringtrain.Error(errno.EBADMSG, f"{_path(data)}: {len(problems)} problem(s):\n" + "\n".join(shown) + more)
    return None
