"""The peer's side of benchmarks/corruptions.py, run inside the benchmark's own environment.

imagecorruptions (the ImageNet-C reference code) corrupts one uint8 HxWx3 image per call.
Prints a JSON object {corruption: images/s or "error: ..."} for the sizes asked.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from imagecorruptions import corrupt


def main() -> None:
    """Time each corruption at severity 3 on random images of each size."""
    names = sys.argv[1].split(",")
    sizes = [int(s) for s in sys.argv[2].split(",")]
    budget = float(sys.argv[3])
    out: dict[str, dict[str, object]] = {}
    rng = np.random.default_rng(0)
    for size in sizes:
        imgs = rng.integers(0, 256, size=(64, size, size, 3), dtype=np.uint8)
        for name in names:
            try:
                corrupt(imgs[0], corruption_name=name, severity=3)  # warm-up
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < budget:
                    corrupt(imgs[n % len(imgs)], corruption_name=name, severity=3)
                    n += 1
                out.setdefault(name, {})[str(size)] = n / (time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - the peer's failures are data here
                out.setdefault(name, {})[str(size)] = f"error: {type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
