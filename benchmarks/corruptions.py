"""certify's batched corruptions vs the imagecorruptions package (ImageNet-C), in one run.

Both sides corrupt images at 32x32 and 224x224 on the CPU. imagecorruptions works one uint8
image per call (its only API); certify applies a property to a batch of float tensors, which
is how its checks call it: batches of the size ``certify run`` uses for an in-process model on
the CPU at that image size (``certify.engine.cpu_batch_size``: the default ``--batch-size`` of
256, capped at ``CPU_BATCH_BYTES`` of images per batch; a search applies each candidate to the
batch's still-unbroken samples, at most that many), with torch on the one thread that
``certify.device.choose_device`` sets on the CPU for a run. The peer runs
in its own virtual environment (``.venv-bench``, made on first use: it needs ``setuptools<81``
for ``pkg_resources``), started once from this script; each row alternates short rounds of the
two sides and keeps each side's best, so that load from other processes hits both alike.

Run: ``.venv/bin/python benchmarks/corruptions.py [--seconds 2] [--rounds 4] [--batch N]
[--only impulse_noise,defocus_blur]`` (``--batch`` overrides the run's batch at both sizes)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from certify.device import choose_device
from certify.engine import cpu_batch_size
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
RUN_BATCH = 256  # `certify run --batch-size` default (certify/cli.py, certify/engine/local.py)


def run_batch(size: int) -> int:
    """The batch a run hands a property for 3 x size x size float32 images on the CPU."""
    return cpu_batch_size(RUN_BATCH, (3, size, size), 4)


def ensure_peer_env() -> Path:
    """Create the peer's virtual environment if missing; return its python."""
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "setuptools<81",
                        "imagecorruptions"], check=True)
    return py


def certify_rate(prop_name: str, row: list[float], size: int, seconds: float, n: int) -> float:
    """Images/s of one certify property applied in batches of ``n`` (``copy``: ``x.clone()``)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, size, size, generator=g)
    p = torch.tensor([row], dtype=torch.float32).expand(n, -1)
    seeds = torch.arange(n)

    def apply(s: torch.Tensor) -> torch.Tensor:
        return x.clone() if prop_name == "copy" else PROPERTIES[prop_name].apply(x, p, s)

    apply(seeds)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        apply(seeds + done)
        done += n
    return done / (time.perf_counter() - t0)


class Peer:
    """imagecorruptions in its own venv, timing one corruption per request."""

    def __init__(self, python: Path) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "benchmarks" / "corruptions_peer.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def rate(self, name: str, size: int, seconds: float) -> float | str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([name, size, seconds]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    """Measure both sides and print a markdown table with the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per side and row, in all")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=0,
                    help="certify's batch size (default: what certify run uses at each size)")
    ap.add_argument("--only", default="", help="comma-separated peer corruption names")
    args = ap.parse_args()
    choose_device("cpu")  # torch's thread count as in a run on the CPU
    sizes = [32, 224]
    batch = {size: args.batch or run_batch(size) for size in sizes}
    pairs = {k: v for k, v in PAIRS.items() if not args.only or k in args.only.split(",")}
    peer = Peer(ensure_peer_env())
    each = args.seconds / args.rounds
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; "
          "certify batch " + ", ".join(f"{batch[s]} at {s}x{s}" for s in sizes)
          + "; peer one image per call, severity 3; "
          f"best of {args.rounds} alternating rounds of {each:g} s per side\n")
    print("| corruption (peer → certify) | size | imagecorruptions img/s | certify img/s | ratio |")
    print("|---|---|---|---|---|")
    try:
        for name, (prop, row) in pairs.items():
            for size in sizes:
                # alternate short rounds of both sides and keep each side's best, so that a
                # burst of load from other processes does not land on one side only
                theirs: list[float | str] = []
                ours: list[float] = []
                for _ in range(args.rounds):
                    theirs.append(peer.rate(name, size, each))
                    if isinstance(theirs[-1], str):
                        break
                    ours.append(certify_rate(prop, row, size, each, batch[size]))
                if isinstance(theirs[-1], str):
                    err = theirs[-1]
                    ours.append(certify_rate(prop, row, size, args.seconds, batch[size]))
                    cell, ratio = err.split(":")[0] + f" ({err.split(':', 2)[1].strip()})", "–"
                else:
                    best = max(t for t in theirs if not isinstance(t, str))
                    cell, ratio = f"{best:,.0f}", f"{max(ours) / best:,.1f}×"
                print(f"| {name} → {prop} | {size} | {cell} | {max(ours):,.0f} | {ratio} |",
                      flush=True)
        # the floor under every property: a new batch of the same size, written once
        floor = {size: max(certify_rate("copy", [], size, each, batch[size])
                           for _ in range(args.rounds)) for size in sizes}
        print("\nFor scale, `x.clone()` of a batch (what any property's output costs at least): "
              + ", ".join(f"{floor[s]:,.0f} img/s at {s}×{s}" for s in sizes) + ".")
    finally:
        peer.close()


if __name__ == "__main__":
    main()
