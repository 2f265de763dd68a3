"""The peer's side of benchmarks/corruptions.py, run inside the benchmark's own environment.

imagecorruptions (the ImageNet-C reference code) corrupts one uint8 HxWx3 image per call.
Reads one JSON request ``[corruption, size, seconds]`` per line on stdin and answers each with
one JSON line: images/s at severity 3, or ``"error: ..."``. Staying alive between requests
lets the benchmark alternate short rounds of the peer and of certify under the same load.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from imagecorruptions import corrupt


def rate(name: str, imgs: np.ndarray, budget: float) -> float | str:
    """Images/s of one corruption at severity 3, cycling over ``imgs``."""
    try:
        corrupt(imgs[0], corruption_name=name, severity=3)  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < budget:
            corrupt(imgs[n % len(imgs)], corruption_name=name, severity=3)
            n += 1
        return n / (time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - the peer's failures are data here
        return f"error: {type(exc).__name__}: {exc}"


def main() -> None:
    """Answer timing requests until stdin closes."""
    images: dict[int, np.ndarray] = {}
    for line in sys.stdin:
        name, size, budget = json.loads(line)
        if size not in images:
            images[size] = np.random.default_rng(0).integers(
                0, 256, size=(64, size, size, 3), dtype=np.uint8)
        print(json.dumps(rate(name, images[size], float(budget))), flush=True)


if __name__ == "__main__":
    main()
