"""The attack ensemble per threat model against an independent white-box PGD (issue 27).

For both demo models and each threat model of the packaged ``gtsrb`` suite that has a gradient
counterpart (L∞ 8/255 and L2 0.5), certify runs that suite's attack checks of the threat model
(their packaged parameters and sample counts) on the demo's test set, and the yardstick PGD of
``tests/pgd_oracle.py`` (a plain-torch PGD on an ``nn.Sequential`` rebuilt from the ONNX
weights: 100 steps, zero and random starts, margin and cross-entropy losses, every candidate
judged by onnxruntime) attacks the same samples: those of the threat model's headline row.

Printed per (model, threat model): the row's robust accuracy and status beside the oracle's,
the difference in points (target: certify ≤ oracle + 1 point), and per attack row its robust
accuracy, status, model queries, gradient evaluations and wall time.

Run: ``nice -n 10 .venv/bin/python benchmarks/ensemble.py [--models standard robust]``
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
import torch
import yaml

from certify.api import DEMO_PER_CLASS, DEMO_SEED, RunOptions, certify_model, demo_model_path
from certify.demo.synthetic import generate
from certify.results import unpack_bits
from certify.suite import resolve_suite_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pgd_oracle import Judge, oracle_broken, oracle_candidates, oracle_net  # noqa: E402

THREATS = {"linf": 8 / 255, "l2": 0.5}


def packaged_attacks() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The packaged gtsrb suite (raw) and its attack checks of the benchmarked threat models."""
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text(encoding="utf-8"))
    from certify.suite import parse_suite

    suite = parse_suite(raw, "gtsrb.yaml")
    keep = {s.id for s in suite.checks if s.kind == "attack"
            and s.check.threat_model()[0] in THREATS}
    return raw, [c for c in raw["checks"] if c.get("id") in keep]


def run_certify(model: Path, checks: list[dict[str, Any]], raw: dict[str, Any],
                data: Path, out: Path) -> tuple[dict[str, Any], dict[str, float], float]:
    """certify's measurement of the suite made of ``checks``, each check's seconds, and the
    run's wall seconds."""
    suite = out.parent / f"{out.name}.yaml"
    suite.write_text(yaml.safe_dump({**{k: v for k, v in raw.items() if k != "checks"},
                                     "name": "gtsrb-ensemble", "checks": checks}))
    t0 = time.perf_counter()
    result, _ = certify_model(RunOptions(model=str(model), suite=str(suite), data=str(data),
                                         out=out, pdf=False))
    doc = json.loads(json.dumps(result.to_json()))
    return (doc["measurement"], doc["provenance"]["timings"]["checks"],
            time.perf_counter() - t0)


def row_samples(m: dict[str, Any], row: dict[str, Any], n: int) -> np.ndarray:
    """The dataset indices the row counts: every one of its attacks evaluated them."""
    sel = np.ones(n, dtype=bool)
    for c in m["checks"]:
        if c["id"] in row["attacks"]:
            sel &= unpack_bits(c["outcomes"]["selected"], n)
    return np.flatnonzero(sel)


def oracle_robust(model: Path, x: torch.Tensor, y: torch.Tensor, norm: str) -> float:
    """The oracle's robust accuracy on (x, y): correct and unbroken by any of its runs."""
    judge = Judge(model)
    correct = judge.predict(x).argmax(1) == y
    xs, ys = x[correct], y[correct]
    broken = oracle_broken(oracle_candidates(oracle_net(model), xs, ys, norm, THREATS[norm]),
                           judge, ys)
    return int((~broken).sum()) / len(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["standard", "robust"])
    args = ap.parse_args()
    raw, checks = packaged_attacks()
    xn, yn = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    x = torch.from_numpy(xn).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(yn).long()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "demo.npz"
        np.savez(data, x=xn, y=yn)
        for name in args.models:
            model = demo_model_path(name)
            m, seconds, wall = run_certify(model, checks, raw, data, Path(tmp) / name)
            per = {c["id"]: c for c in m["checks"]}
            for row in m["attack_worst_case"]:
                idx = torch.from_numpy(row_samples(m, row, len(yn)))
                t0 = time.perf_counter()
                oracle = oracle_robust(model, x[idx], y[idx], row["norm"])
                rows.append({"model": name, "norm": row["norm"], "n": row["n"],
                             "certify": row["robust_accuracy"], "status": row["status"],
                             "oracle": oracle, "oracle_s": time.perf_counter() - t0,
                             "run_s": wall, "attacks": [
                                 {"id": i,
                                  "robust_accuracy": per[i]["metrics"]["robust_accuracy"],
                                  "status": per[i]["status"],
                                  "queries": per[i]["queries"]["total"],
                                  "gradients": per[i]["metrics"].get("gradient_evaluations")
                                  or 0,
                                  "seconds": seconds.get(i)} for i in row["attacks"]]})
    print(json.dumps(rows))
    print(f"{'model':<9} {'threat':<6} {'n':>4} {'certify':>8} {'oracle':>7} {'diff':>6} "
          f"{'status':<12} {'target':<7}")
    for r in rows:
        diff = 100 * (r["certify"] - r["oracle"])
        print(f"{r['model']:<9} {r['norm']:<6} {r['n']:>4} {100 * r['certify']:>7.1f}% "
              f"{100 * r['oracle']:>6.1f}% {diff:>+6.1f} {r['status']:<12} "
              f"{'met' if diff <= 1.0 + 1e-9 else 'MISSED':<7}")
        for a in r["attacks"]:
            print(f"    {a['id']:<16} {100 * a['robust_accuracy']:>6.1f}% {a['status']:<12} "
                  f"{a['queries']:>10,} queries {int(a['gradients']):>9,} gradients "
                  f"{a['seconds'] or 0:>6.1f} s")
        print(f"    certify run (both threat models) {r['run_s']:.0f} s; "
              f"oracle {r['oracle_s']:.0f} s")


if __name__ == "__main__":
    main()
