"""A certify run against an endpoint that fails quietly vs the same endpoint without faults.

The demo's standard model (a GTSRB CNN, 32x32) served over KServe v2 (binary tensors) by the
threaded loopback server of tests/servers.py, and an 8-check suite (clean accuracy, sanity,
two corruptions, brittleness, Square L∞ and HopSkipJump L2) on generated signs. Two runs with
certify's defaults (4 requests in flight, 64 images per request, hedging on):

1. the server without faults;
2. the same server injecting the issue's fixed mix, drawn per inference request from a seeded
   generator: 4% HTTP 500, 4% HTTP 429 with ``Retry-After: 1``, 4% accepted and never
   answered, 3% garbage or truncated bodies (1.5% each).

Wall time is the whole ``certify_model`` call (loading, checks, card without PDF). Metrics
must be identical. Printed: both walls and their ratio, the retries, hedges and the deadlines
certify chose, and the floor the mix's Retry-After waits put under the faulty run: the sample
group that waited longest for 429s (each costs its Retry-After on that group's critical
path; the other groups go on meanwhile) cannot finish before its own clean work plus those
waits.

Run: ``.venv/bin/python benchmarks/endpoint_faults.py [--images 128] [--seed 11]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from certify.api import RunOptions, certify_model, demo_model_path  # noqa: E402
from certify.data.synthetic import generate  # noqa: E402

from servers import Faults, OnnxHttpServer  # noqa: E402

SUITE = {
    "name": "faults-bench", "seed": 4, "classes": [f"c{i}" for i in range(43)],
    "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "sanity", "kind": "sanity", "samples": 32},
        {"id": "noise", "kind": "corruption",
         "params": {"property": "gaussian_noise", "bound": 0.08, "steps": 4, "tries": 3}},
        {"id": "rotation", "kind": "corruption",
         "params": {"property": "rotation", "bound": 15, "steps": 5}},
        {"id": "brittle", "kind": "brittleness", "samples": 16, "params": {"num_masks": 100}},
        {"id": "square", "kind": "attack", "params": {
            "attack": "square_linf", "epsilon": 8 / 255, "max_queries": 300,
            "binarization": False}},
        {"id": "hsj", "kind": "attack", "samples": 32, "params": {
            "attack": "hopskipjump", "norm": "l2", "epsilon": 0.5, "max_queries": 300,
            "binarization": False}},
        {"id": "coverage", "kind": "coverage"},
    ],
}

#: The issue's fixed mix: 15% of inference requests fail.
MIX = {"p_500": 0.04, "p_429": 0.04, "p_hang": 0.04, "p_garbage": 0.015,
       "p_malformed": 0.015, "retry_after": 1}


def _run(url: str, suite: Path, data: Path, n: int, out: Path
         ) -> tuple[float, dict[str, Any], dict[str, Any]]:
    t0 = time.perf_counter()
    results, _ = certify_model(RunOptions(model=url, suite=str(suite), data=str(data), out=out,
                                          samples=n, pdf=False))
    wall = time.perf_counter() - t0
    metrics = {c.id: c.metrics.model_dump() if c.metrics else None for c in results.checks}
    traffic = (results.provenance.traffic or {})["model"]
    return wall, metrics, traffic


def main() -> None:
    """Run clean and faulty, print a markdown table and the traffic record."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    model = demo_model_path("standard")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        suite = d / "suite.yaml"
        suite.write_text(yaml.safe_dump(SUITE))
        x, y = generate(args.images // 43 + 1, seed=61)
        data = d / "data.npz"
        np.savez(data, x=x[:args.images], y=y[:args.images])
        n = min(args.images, len(y))
        server = OnnxHttpServer(model)
        try:
            clean_wall, clean_metrics, clean_t = _run(server.v2_url, suite, data, n,
                                                      d / "clean")
        finally:
            server.stop()
        server = OnnxHttpServer(model, faults=Faults(seed=args.seed, **MIX))  # type: ignore[arg-type]
        try:
            wall, metrics, t = _run(server.v2_url, suite, data, n, d / "faults")
            injected = dict(server.faults_injected)
            requests = server.infer_requests
        finally:
            server.stop()
    same = metrics == clean_metrics
    print(f"{n} images, 8 checks, certify's HTTP defaults; fault mix {MIX} (seed {args.seed})")
    print("| server | wall s | vs clean | requests | retries | hedges (won) | timeouts | "
          "same metrics |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, w, tr in (("clean", clean_wall, clean_t), ("15% faults", wall, t)):
        print(f"| {label} | {w:.1f} | {w / clean_wall:.2f} | {tr['requests']:,} | "
              f"{tr['retries']:,} | {tr['hedges']} ({tr['hedge_wins']}) | {tr['timeouts']} | "
              f"{'yes' if same or tr is clean_t else 'NO'} |")
    print(f"\ninjected: {injected} of {requests:,} inference requests")
    print("faulty run's deadlines:", json.dumps(t["deadlines"], ensure_ascii=False))
    print("faulty run's failures:", {k: t[k] for k in ("timeouts", "connection_errors",
                                                        "overloaded", "server_errors",
                                                        "malformed")},
          "breaker:", t["breaker"])
    if not same:
        raise SystemExit("metrics differ between the clean and the faulty run")


if __name__ == "__main__":
    main()
