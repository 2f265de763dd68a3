"""Auto budgets against a long fixed budget (issue 17, acceptance of point 1).

Runs the packaged suite's ``square_linf`` check (``max_queries: auto``) on the demo standard
model and the demo data, and the same check (same id, so the same samples and seeds) with a
fixed budget of 20,000 queries per sample, then prints both robust accuracies, their gap in
points, the queries and the wall time. The binarization test is off in both: it does not
change the robust accuracy.

    .venv/bin/python benchmarks/convergence.py [--check square_linf] [--fixed 20000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
from certify.demo.synthetic import generate
from certify.suite import packaged_suites


def _run(suite: dict, data: Path, out: Path) -> tuple[dict, float]:
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(suite))
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "certify"), "run",
                    str(demo_model_path("standard")), "--suite", str(path), "--data", str(data),
                    "--out", str(out), "--no-pdf"], check=False, capture_output=True)
    wall = time.perf_counter() - t0
    (check,) = json.loads((out / "results.json").read_text())["measurement"]["checks"]
    return check, wall


def main() -> None:
    """Run both configurations and print a markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", default="square_linf")
    ap.add_argument("--fixed", type=int, default=20000)
    args = ap.parse_args()
    raw = yaml.safe_load(packaged_suites()["gtsrb"].read_text())
    check = next(c for c in raw["checks"] if c["id"] == args.check)
    auto = {**check, "params": {**check["params"], "binarization": False}}
    fixed_params = {k: v for k, v in auto["params"].items()
                    if k not in ("initial_queries", "query_cap")}
    fixed = {**check, "params": {**fixed_params, "max_queries": args.fixed}}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
        data = Path(d) / "demo.npz"
        np.savez(data, x=x, y=y)
        for name, c in (("packaged (auto)", auto), (f"fixed {args.fixed:,}", fixed)):
            suite = {**{k: raw[k] for k in ("name", "seed", "classes", "data", "preprocessing")},
                     "checks": [c]}
            res, wall = _run(suite, data, Path(d) / name.split()[0])
            m = res["metrics"]
            rows.append((name, m["robust_accuracy"], res["intervals"]["robust_accuracy"],
                         m["rounds"], m["query_budget"], res["queries"]["total"], wall,
                         res["details"]["convergence"]["converged"]))
    print("| configuration | robust accuracy | 95% CI | rounds | queries per unbroken sample "
          "| total queries | converged | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ra, ci, rounds, budget, total, wall, conv in rows:
        print(f"| {name} | {ra:.1%} | {ci[0]:.1%}–{ci[1]:.1%} | {rounds} | {budget:,} | "
              f"{total:,} | {'yes' if conv else 'no'} | {wall:.0f} |")
    gap = 100 * (rows[0][1] - rows[1][1])
    print(f"\ngap: {gap:+.1f} points (target: within 5); query ratio "
          f"{rows[0][5] / rows[1][5]:.2f}, time ratio {rows[0][6] / rows[1][6]:.2f}")


if __name__ == "__main__":
    main()
