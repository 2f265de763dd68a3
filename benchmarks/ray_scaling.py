"""Scaling of ``--executor ray``: 2 workers with one CPU thread each vs 1 worker, in one run.

The demo's standard model and a query-bound suite (Square Attack L∞ with 1,000 queries, no
binarization test, and Gaussian noise with 3 tries at 4 intensities) on generated signs. Each
configuration is a full ``certify_model`` run against a local Ray instance that certify starts
on 127.0.0.1; throughput = model queries / time in the checks (Ray start-up and model loading
excluded). The in-process executor (its defaults: on the CPU, two sample groups at once, each
with single-threaded onnxruntime on half the cores) is compared with Ray's 1-worker run. All
runs must give identical metrics.

Every configuration gets the same ``--batch-size`` (default 48): the attack's own tensor work
runs faster per image on batches that fit a core's cache, so comparing 1 worker on large
batches with 2 workers on smaller ones would credit the executor with a cache effect.

Run: ``.venv/bin/python benchmarks/ray_scaling.py [--images 384] [--repeats 2] [--batch-size 48]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from certify.api import RunOptions, certify_model, demo_model_path
from certify.demo.synthetic import generate
from certify.device import choose_device

SUITE = {
    "name": "ray-bench", "seed": 3, "classes": [f"c{i}" for i in range(43)],
    "checks": [
        {"id": "square", "kind": "attack", "params": {
            "attack": "square_linf", "epsilon": 8 / 255, "max_queries": 1000,
            "binarization": False}},
        {"id": "noise", "kind": "corruption",
         "params": {"property": "gaussian_noise", "bound": 0.08, "steps": 4, "tries": 3}},
    ],
}


def _run(suite: Path, data: Path, n: int, out: Path, batch_size: int, **executor: Any
         ) -> tuple[float, dict[str, Any]]:
    results, _ = certify_model(RunOptions(model=str(demo_model_path("standard")),
                                          suite=str(suite), data=str(data), out=out,
                                          samples=n, pdf=False, batch_size=batch_size,
                                          **executor))
    busy = sum(results.provenance.timings["checks"].values())
    return results.measurement.queries.total / busy, {c.id: c.metrics.model_dump()
                                                      for c in results.checks}


def main() -> None:
    """Run the configurations and print a markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=48)
    args = ap.parse_args()
    dev = choose_device("auto")
    local = f"in-process ({dev.lanes} lane(s) × {dev.onnx_threads or 'default'} thread(s))"
    configs = [(local, {"executor": "local"}),
               ("Ray, 1 worker × 1 thread", {"executor": "ray", "workers": 1, "threads": 1}),
               ("Ray, 2 workers × 1 thread", {"executor": "ray", "workers": 2, "threads": 1})]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        suite = d / "suite.yaml"
        suite.write_text(yaml.safe_dump(SUITE))
        x, y = generate(args.images // 43 + 1, seed=91)
        data = d / "data.npz"
        np.savez(data, x=x[:args.images], y=y[:args.images])
        n = min(args.images, len(y))
        reference = None
        k = 0
        for label, opts in configs:
            best = 0.0
            for _ in range(args.repeats):
                k += 1
                tput, metrics = _run(suite, data, n, d / f"run{k}", args.batch_size, **opts)
                best = max(best, tput)
                reference = reference or metrics
                if metrics != reference:
                    raise SystemExit(f"{label}: metrics differ from the first run")
            rows.append((label, best))
    one = rows[1][1]
    print(f"{n} images; Square L∞ 1,000 queries + Gaussian noise; batch size "
          f"{args.batch_size}; best of {args.repeats}; identical metrics in every run")
    print("| executor | queries/s | vs 1 Ray worker |")
    print("|---|---|---|")
    for label, tput in rows:
        print(f"| {label} | {tput:,.0f} | {tput / one:.2f} |")


if __name__ == "__main__":
    main()
