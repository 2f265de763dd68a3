"""certify's batched corruptions vs the imagecorruptions package (ImageNet-C), in one run.

Both sides corrupt images at 32x32 and 224x224 on the CPU. imagecorruptions works one uint8
image per call (its only API); certify applies a property to a batch of float tensors, which
is how its checks call it. The peer runs in its own virtual environment (``.venv-bench``, made
on first use: it needs ``setuptools<81`` for ``pkg_resources``), started from this script.

Run: ``.venv/bin/python benchmarks/corruptions.py [--seconds 2]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from certify.perturbations import PROPERTIES

ROOT = Path(__file__).resolve().parents[1]
BENCH_VENV = ROOT / ".venv-bench"

# imagecorruptions name -> (certify property, parameter row of comparable strength: severity 3)
PAIRS = {
    "gaussian_noise": ("gaussian_noise", [0.18]),
    "impulse_noise": ("impulse_noise", [0.09]),
    "gaussian_blur": ("blur", [3.0]),
    "defocus_blur": ("blur", [3.0]),
    "brightness": ("brightness", [0.3]),
    "contrast": ("contrast", [-0.8]),
    "saturate": ("saturation", [1.0]),
}
BATCH = {32: 256, 224: 32}


def ensure_peer_env() -> Path:
    """Create the peer's virtual environment if missing; return its python."""
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "setuptools<81",
                        "imagecorruptions"], check=True)
    return py


def certify_rate(prop_name: str, row: list[float], size: int, seconds: float) -> float:
    """Images/s of one certify property applied in batches."""
    prop = PROPERTIES[prop_name]
    n = BATCH[size]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, size, size, generator=g)
    p = torch.tensor([row], dtype=torch.float32).expand(n, -1)
    seeds = torch.arange(n)
    prop.apply(x, p, seeds)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        prop.apply(x, p, seeds + done)
        done += n
    return done / (time.perf_counter() - t0)


def main() -> None:
    """Measure both sides and print a markdown table with the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    sizes = [32, 224]
    peer_py = ensure_peer_env()
    peer = json.loads(subprocess.run(
        [str(peer_py), str(ROOT / "benchmarks" / "corruptions_peer.py"), ",".join(PAIRS),
         ",".join(map(str, sizes)), str(args.seconds)],
        check=True, capture_output=True, text=True).stdout)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"certify batch {BATCH}; peer one image per call, severity 3\n")
    print("| corruption (peer → certify) | size | imagecorruptions img/s | certify img/s | ratio |")
    print("|---|---|---|---|---|")
    for name, (prop, row) in PAIRS.items():
        for size in sizes:
            ours = certify_rate(prop, row, size, args.seconds)
            theirs = peer[name][str(size)]
            if isinstance(theirs, str):
                cell, ratio = theirs.split(":")[0] + f" ({theirs.split(':', 2)[1].strip()})", "–"
            else:
                cell, ratio = f"{theirs:,.0f}", f"{ours / theirs:,.1f}×"
            print(f"| {name} → {prop} | {size} | {cell} | {ours:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
