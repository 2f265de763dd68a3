"""certify's black-box attacks vs ART's, on the same ONNX model, images, ε and budget.

The demo's standard model and 100 correctly classified generated signs. Square Attack L∞ at
ε = 8/255 with 1,000 iterations, at the ImageNet ``p_init`` 0.05 and at certify's default for
32×32 inputs (0.8), and at ε = 12/255 with the default, both sides with the same ``p_init``:
success (broken within ε), model evaluations and wall time. HopSkipJump L2 at ε = 0.5 on 20
of them (ART: 20 iterations of up to 1,000 evaluations; certify: a budget of 5,000 queries per
image). ART runs in
``.venv-bench`` (made by benchmarks/corruptions.py, plus ``adversarial-robustness-toolbox``
and ``onnxruntime``) and reads the model's logits, as certify does. Each configuration runs
three times (three seeds on each side, certify and ART interleaved): the table gives every
run's success, the mean evaluations and the best wall time, since other work on the machine
slows single runs by up to 3x.

Run: ``.venv/bin/python benchmarks/attacks.py``
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from certify.api import demo_model_path
from certify.attacks import HopSkipJump, SquareLinf, project
from certify.attacks.square import default_p_init
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel

ROOT = Path(__file__).resolve().parents[1]
PEER_PY = ROOT / ".venv-bench" / "bin" / "python"
# (p_init, ε): the ImageNet p_init and certify's default for 32×32 at the suite's ε, and the
# default at 12/255, where about 85 of the 100 images break (the measured regime)
SQUARE = ((0.05, 8 / 255), (default_p_init(SquareLinf.large_p_init, 32, 32), 8 / 255),
          (default_p_init(SquareLinf.large_p_init, 32, 32), 12 / 255))
RUNS = 3  # seeds per configuration; success varies by a few images, wall time by load


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
    configs: list[tuple[str, str, Any, torch.Tensor, torch.Tensor, str, float]] = [
        (f"square_linf p={p:g} ε={e * 255:g}/255", f"square:{p:g}:{e!r}",
         lambda p=p, e=e: SquareLinf(epsilon=e, max_queries=1000, p_init=p), x, yt, "linf", e)
        for p, e in SQUARE]
    configs.append(("hopskipjump_l2", "hopskipjump",
                    lambda: HopSkipJump(epsilon=0.5, max_queries=5000, norm="l2"),
                    x[:20], yt[:20], "l2", 0.5))
    mine: dict[str, dict[str, list[Any]]] = {}
    peer: dict[str, dict[str, list[Any]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(RUNS):  # interleaved, so both sides see the same load on the machine
            for name, peer_name, make, xs, ys, norm, e in configs:
                npz = Path(d) / f"{len(xs)}.npz"
                np.savez(npz, x=xs.numpy(), y=ys.numpy())
                _add(mine, name, _certify_run(make, model, xs, ys, norm, e, r))
                _add(peer, name, json.loads(subprocess.run(
                    [str(PEER_PY), str(ROOT / "benchmarks" / "attacks_peer.py"),
                     str(demo_model_path("standard")), str(npz), peer_name, str(r)],
                    check=True, capture_output=True, text=True).stdout))
    print(f"| attack | images | ART broken ({RUNS} runs) | certify broken ({RUNS} runs) | "
          "ART evaluations (mean) | certify queries (mean) | evaluations ratio | "
          "ART s (best) | certify s (best) | time ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _, xs, *_ in configs:
        p, m = peer[name], mine[name]
        qa, qc = statistics.fmean(p["evaluations"]), statistics.fmean(m["evaluations"])
        wa, wc = min(p["wall_s"]), min(m["wall_s"])
        print(f"| {name} | {len(xs)} | {' / '.join(map(str, p['broken']))} | "
              f"{' / '.join(map(str, m['broken']))} | {qa:,.0f} | {qc:,.0f} | "
              f"{qc / qa:.2f} | {wa:.1f} | {wc:.1f} | {wc / wa:.2f} |")


def _add(table: dict[str, dict[str, list[Any]]], name: str, run: dict[str, Any]) -> None:
    for k, v in run.items():
        table.setdefault(name, {}).setdefault(k, []).append(v)


def _certify_run(make: Any, model: OnnxModel, x: torch.Tensor, y: torch.Tensor, norm: str,
                 eps: float, r: int) -> dict[str, Any]:
    """One seeded run of an attack: images broken within ε, queries and wall time."""
    counter = QueryCounter(model)
    t0 = time.perf_counter()
    res = make().run(counter, x, y, torch.arange(len(x)) + 1000 * r, "logits")
    wall = time.perf_counter() - t0
    adv = project(res.x_adv, x, norm, eps)
    return {"broken": int((model.predict(adv).argmax(1) != y).sum()),
            "evaluations": counter.queries, "wall_s": wall}

if __name__ == "__main__":
    main()
