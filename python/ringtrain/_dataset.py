"""ringtrain.Dataset: map-style random access to a packed split, for code that keeps torch's DataLoader."""

import os

from . import _ringtrain


class Dataset:
    """``ds[i]`` -> (uint8 numpy array (H, W, C), int label) of record `i` of `split`.

    For ``torch.utils.data.DataLoader(ringtrain.Dataset(path), ...)`` with torchvision transforms (which
    take HWC arrays). Reads one compressed block per miss through the C shard reader (checksummed; a corrupt
    block raises ringtrain.Error naming the shard and block) and keeps the last block decoded, so reading
    in order is cheap. Safe in DataLoader worker processes (fork). ringtrain.Loader is the fast path; this
    is the door for code that keeps its DataLoader.
    """

    def __init__(self, data, split="train"):
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', not {split!r}")
        self.root = os.fspath(data)
        self.split = split
        self._ds = _ringtrain.CDataset(self.root, split)
        self.shape = (self._ds.channels, self._ds.height, self._ds.width)
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
        chw, label = self._ds.get(i)
        c, h, w = self.shape
        img = np.frombuffer(chw, dtype=np.uint8).reshape(c, h, w).transpose(1, 2, 0)
        return img, int(label)

    def __repr__(self):
        c, h, w = self.shape
        return f"ringtrain.Dataset({self.root!r}, split={self.split!r}: {len(self)} records {c}x{h}x{w})"
