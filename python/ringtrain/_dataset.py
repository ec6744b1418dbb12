"""ringtrain.Dataset: map-style random access to a packed split, for code that keeps torch's DataLoader."""

import os

from . import _ringtrain


class Dataset:
    """``ds[i]`` -> (uint8 numpy array (H, W, C), int label) of record `i` of `split`.

    For ``torch.utils.data.DataLoader(ringtrain.Dataset(path), ...)`` with torchvision transforms (which
    take HWC arrays). Reads one compressed block per miss through the C shard reader (checksummed; a corrupt
    block raises ringtrain.Error naming the shard and block) and keeps the last block read, so reading
    in order is cheap. Safe in DataLoader worker processes (fork). ringtrain.Loader is the fast path; this
    is the door for code that keeps its DataLoader.

    Datasets packed with ``--codec jpeg --max-side N`` (``variable`` True): every record has its own size,
    and ``ds[i]`` is the whole image decoded at that size, (H_i, W_i, C) -- not cropped or resized, as
    torchvision's ImageFolder gives it without a transform; ``shape`` is (C, None, None). Batching them
    needs a transform to one size (or ringtrain.Loader with image_size=).
    """

    def __init__(self, data, split="train"):
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', not {split!r}")
        self.root = os.fspath(data)
        self.split = split
        self._ds = _ringtrain.CDataset(self.root, split)
        #: True when every record has its own size (pack --max-side); then shape is (C, None, None).
        self.variable = self._ds.height == 0
        h, w = (None, None) if self.variable else (self._ds.height, self._ds.width)
        self.shape = (self._ds.channels, h, w)
        self.classes = list(self._ds.classes)

    def __len__(self):
        return len(self._ds)

    def __getitem__(self, i):
        import numpy as np

        n = len(self._ds)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {i} out of range: the {self.split} split has {n}")
        chw, label, h, w = self._ds.get(i)
        # HWC made contiguous: one copy, which is also writable (a read-only array makes torch's default
        # collate warn, and transforms that work in place fail).
        chw = np.frombuffer(chw, dtype=np.uint8).reshape(self.shape[0], h, w)
        return np.ascontiguousarray(chw.transpose(1, 2, 0)), int(label)

    def __repr__(self):
        c, h, w = self.shape
        size = f"{c}x{h}x{w}" if not self.variable else f"{c} x their own sizes"
        return f"ringtrain.Dataset({self.root!r}, split={self.split!r}: {len(self)} records {size})"
