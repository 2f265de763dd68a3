"""certify's black-box attacks vs ART's, on the same ONNX model, images, ε and budget.

The demo's standard model and 100 correctly classified generated signs. Square Attack L∞ at
ε = 8/255 with 1,000 iterations: success (broken within ε), model evaluations and wall time.
HopSkipJump L2 at ε = 0.5 on 20 of them (ART: 20 iterations of up to 1,000 evaluations; certify:
a budget of 5,000 queries per image). ART runs in ``.venv-bench`` (made by
benchmarks/corruptions.py, plus ``adversarial-robustness-toolbox`` and ``onnxruntime``).

Run: ``.venv/bin/python benchmarks/attacks.py``
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from certify.api import demo_model_path
from certify.attacks import HopSkipJump, SquareLinf, project
from certify.data.synthetic import generate
from certify.device import choose_device
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel

ROOT = Path(__file__).resolve().parents[1]
PEER_PY = ROOT / ".venv-bench" / "bin" / "python"


def main() -> None:
    """Run both sides and print a markdown table."""
    if not PEER_PY.exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "corruptions.py"),
                        "--seconds", "0.1"], check=True, capture_output=True)
    subprocess.run([str(PEER_PY), "-m", "pip", "install", "-q",
                    "adversarial-robustness-toolbox", "onnxruntime"], check=True)
    device = choose_device("cpu")
    model = OnnxModel(demo_model_path("standard"), device)
    xu8, y = generate(4, seed=4242)
    x = torch.from_numpy(xu8.transpose(0, 3, 1, 2).copy()).float() / 255
    yt = torch.from_numpy(y)
    keep = (model.predict(x).argmax(1) == yt).nonzero().flatten()[:100]
    x, yt = x[keep], yt[keep]
    eps = 8 / 255
    rows = []
    counter = QueryCounter(model)
    t0 = time.perf_counter()
    res = SquareLinf(epsilon=eps, max_queries=1000).run(counter, x, yt,
                                                         torch.arange(len(x)), "logits")
    wall = time.perf_counter() - t0
    adv = project(res.x_adv, x, "linf", eps)
    broken = int((model.predict(adv).argmax(1) != yt).sum())
    rows.append(("square_linf", len(x), broken, counter.queries, wall))
    xs, ys = x[:20], yt[:20]
    counter = QueryCounter(model)
    t0 = time.perf_counter()
    res = HopSkipJump(epsilon=0.5, max_queries=5000, norm="l2").run(
        counter, xs, ys, torch.arange(len(xs)), "logits")
    wall = time.perf_counter() - t0
    adv = project(res.x_adv, xs, "l2", 0.5)
    broken = int((model.predict(adv).argmax(1) != ys).sum())
    rows.append(("hopskipjump_l2", len(xs), broken, counter.queries, wall))
    with tempfile.TemporaryDirectory() as d:
        npz = Path(d) / "x.npz"
        np.savez(npz, x=x.numpy(), y=yt.numpy())
        peer = json.loads(subprocess.run(
            [str(PEER_PY), str(ROOT / "benchmarks" / "attacks_peer.py"),
             str(demo_model_path("standard")), str(npz), "1000", "20"],
            check=True, capture_output=True, text=True).stdout)
    print("| attack | images | ART broken | certify broken | ART evaluations | "
          "certify queries | evaluations ratio | ART s | certify s | time ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, n, b, q, w in rows:
        p = peer[name]
        print(f"| {name} | {n} | {p['broken']} | {b} | {p['evaluations']:,} | {q:,} | "
              f"{q / p['evaluations']:.2f} | {p['wall_s']:.1f} | {w:.1f} | "
              f"{w / p['wall_s']:.2f} |")


if __name__ == "__main__":
    main()
