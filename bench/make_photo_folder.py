#!/usr/bin/python3
"""make_photo_folder.py - writes a folder of JPEGs cut from the two photographs
that Debian installs with SciPy and Matplotlib, for benches whose figures
depend on what photographs look like to a compressor, which the generated
folder of bench/make_image_folder.py (structured, grainy content) does not
show: zstd finds many matches in a photo's smooth regions and runs three
times slower on them than on grain.

  ROOT/<class>/<n>.jpg    class c0: the raccoon (scipy.misc.face, 1024x768,
                          python3-scipy), class c1: Grace Hopper
                          (grace_hopper.jpg, 512x600, python-matplotlib-data)

Each file is a random crop of its photograph (a third to all of each side),
scaled by 0.8..1.6 (more where the shorter side would be under 300 pixels)
with Pillow's BICUBIC and saved at quality 75, 85, 90 or 95: sides from 300
to about 1600 pixels, 4:2:0.
Two photographs are little variety; they stand for photographic content, not
for a dataset. Deterministic for a given --seed and Pillow.

Usage:
  make_photo_folder.py ROOT [--per-class 150] [--seed 0] [--force]
"""
import argparse
import os
import random
import shutil
import sys
import warnings

import numpy as np
from PIL import Image

HOPPER = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"


def photographs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy.misc is deprecated in favour of a downloading scipy.datasets
        try:
            from scipy import misc
            face = Image.fromarray(np.asarray(misc.face()))
        except (ImportError, AttributeError, OSError) as e:
            sys.exit("make_photo_folder.py: no scipy.misc.face (%s); install: apt-get install -y python3-scipy" % e)
    if not os.path.exists(HOPPER):
        sys.exit("make_photo_folder.py: no %s; install: apt-get install -y python-matplotlib-data" % HOPPER)
    return [face, Image.open(HOPPER).convert("RGB")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--per-class", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace ROOT if it exists")
    a = ap.parse_args()
    if a.per_class < 1:
        sys.exit("make_photo_folder.py: --per-class must be at least 1")
    if os.path.exists(a.root) and not a.force:
        sys.exit("make_photo_folder.py: %s exists (--force replaces it)" % a.root)
    rng = random.Random(a.seed)
    tmp = a.root.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    total = 0
    for c, im in enumerate(photographs()):
        os.makedirs(os.path.join(tmp, "c%d" % c))
        w, h = im.size
        for i in range(a.per_class):
            cw, ch = rng.randint(w // 3, w), rng.randint(h // 3, h)
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            s = max(rng.uniform(0.8, 1.6), 300 / min(cw, ch))
            out = im.crop((x, y, x + cw, y + ch)).resize((round(cw * s), round(ch * s)), Image.BICUBIC)
            path = os.path.join(tmp, "c%d" % c, "%04d.jpg" % i)
            out.save(path, quality=rng.choice([75, 85, 90, 95]))
            total += os.path.getsize(path)
    # The old folder goes only once the new one is complete.
    shutil.rmtree(a.root, ignore_errors=True)
    os.rename(tmp, a.root)
    print("%s: %d JPEGs, %.1f MB" % (a.root, 2 * a.per_class, total / 1e6))


if __name__ == "__main__":
    main()
