#!/usr/bin/python3
"""Writes tests/fixtures/rrc/torchvision_rrc.json: statistics of torchvision's
RandomResizedCrop.get_params boxes, which tests/test_rrc.c compares with
loader/rrc.c's sampler (same distribution, different random numbers).

For each case (image size, scale range, ratio range) it draws N boxes with a
fixed torch seed and stores the 5/25/50/75/95 % quantiles of
  area   = w*h / (W*H)        log_aspect = log(w/h)
  top    = top / H            left       = left / W
and the fallback rate (none of the 10 tries fitted; counted by watching for
get_params' torch.randint calls, which only an accepted try makes).

Run with Debian's interpreter (torch 1.13, torchvision 0.14):
  /usr/bin/python3 tools/dev/gen_rrc_fixture.py [--n 20000] [--out tests/fixtures/rrc/torchvision_rrc.json]
"""
import argparse
import json
import math
import os

import numpy as np
import torch
import torchvision
from torchvision.transforms import RandomResizedCrop

QUANTILES = [0.05, 0.25, 0.5, 0.75, 0.95]
DEFAULT_RATIO = [3.0 / 4.0, 4.0 / 3.0]
CASES = [
    # (width, height, scale, ratio)
    (500, 375, [0.08, 1.0], DEFAULT_RATIO),
    (375, 500, [0.08, 1.0], DEFAULT_RATIO),
    (64, 64, [0.08, 1.0], DEFAULT_RATIO),
    (2000, 100, [0.08, 1.0], DEFAULT_RATIO),  # extreme aspect: no try can fit, always the fallback
    (1000, 250, [0.08, 1.0], DEFAULT_RATIO),  # wide: some tries fit, the fallback is frequent
    (1000, 1000, [0.5, 1.0], DEFAULT_RATIO),
]


def sample(width, height, scale, ratio, n):
    img = torch.empty(1, height, width, dtype=torch.uint8)
    real_randint = torch.randint
    calls = [0]

    def counting_randint(*args, **kwargs):
        calls[0] += 1
        return real_randint(*args, **kwargs)

    boxes, fallbacks = [], 0
    torch.randint = counting_randint
    try:
        for _ in range(n):
            before = calls[0]
            i, j, h, w = RandomResizedCrop.get_params(img, scale, ratio)
            if calls[0] == before:
                fallbacks += 1
            boxes.append((i, j, h, w))
    finally:
        torch.randint = real_randint
    b = np.array(boxes, dtype=np.float64)
    i, j, h, w = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    stats = {
        "area": w * h / (width * height),
        "log_aspect": np.log(w / h),
        "top": i / height,
        "left": j / width,
    }
    # 'lower' keeps each quantile a value the sampler produced, so ties stay exact.
    quant = {k: [float(np.quantile(v, q, method="lower")) for q in QUANTILES] for k, v in stats.items()}
    return {
        "width": width,
        "height": height,
        "scale": scale,
        "ratio": ratio,
        "n": n,
        "quantiles": quant,
        "fallback_rate": fallbacks / n,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "rrc", "torchvision_rrc.json"),
    )
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cases = [sample(w, h, s, r, args.n) for (w, h, s, r) in CASES]
    doc = {
        "generator": "tools/dev/gen_rrc_fixture.py",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "seed": args.seed,
        "quantiles": QUANTILES,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for c in cases:
        print(f"{c['width']}x{c['height']} scale {c['scale']}: fallback {c['fallback_rate']:.4f}, "
              f"median area {c['quantiles']['area'][2]:.3f}, median log aspect {c['quantiles']['log_aspect'][2]:.3f}")


if __name__ == "__main__":
    main()
