"""The packaged corruption checks against 16x larger ones of the same properties (issue 40).

Searched properties (a bounded, parameterised transform: its worst case within the bound) run
as packaged and with ``max_queries`` 16 times the packaged budget (the same rounds, continued
while the robust share still falls); their scores should agree within 2 points when the
packaged search converged. Random corruptions (noise: decided per sample at a stated
confidence) run as packaged and with 16 times the draws per sample (``max_draws``): the 16x
run's decided-robust share must lie inside the packaged run's robust-share interval (which
counts undecided samples on both sides), and the two runs must agree on at least 97% of the
samples both decided. Pairs are left out.

Run: ``.venv/bin/python benchmarks/search_strength.py [--out DIR]`` (the demo's standard model and
430 signs)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from certify.checks.corruption import Corruption
from certify.suite import resolve_suite_path

FACTOR = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    checks = []
    for c in raw["checks"]:
        if c["kind"] != "corruption":
            continue
        check = Corruption(**c["params"])
        if check.statistical():
            more = {"max_draws": FACTOR * check.plan().max_draws}
        else:
            more = {"max_queries": FACTOR * check.budget()}
        checks += [c, {**c, "id": c["id"] + "@16x", "params": {**c["params"], **more}}]
    raw.update(name="search-strength", checks=checks)
    out = args.out or Path(tempfile.mkdtemp(prefix="search-strength-"))
    out.mkdir(parents=True, exist_ok=True)
    suite = out / "suite.yaml"
    suite.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.perf_counter()
    cmd = [str(Path(sys.executable).parent / "certify"), "demo", "--suite", str(suite),
           "--out", str(out / "run"), "--no-pdf", "-q"]
    subprocess.run(cmd, check=True)
    took = time.perf_counter() - t0
    doc = json.loads((out / "run" / "results.json").read_text())
    res = {c["id"]: c for c in doc["measurement"]["checks"]}
    outcomes: dict[str, dict[int, str]] = {}
    for line in (out / "run" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        outcomes.setdefault(r["check"], {})[int(r["i"])] = r["outcome"]
    searched = [c for c in checks[::2] if "search_rounds" in res[c["id"]]["details"]]
    noisy = [c for c in checks[::2] if "statistical" in res[c["id"]]["details"]]
    print("Searched properties (worst case within the bound):\n")
    print("| property | packaged score | rounds | queries/sample | converged | 16x score | "
          "rounds | queries/sample | converged | packaged − 16x (points) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|---:|")
    worst = 0.0
    for c in searched:
        a, b = res[c["id"]], res[c["id"] + "@16x"]
        sa, sb = a["details"]["search_rounds"], b["details"]["search_rounds"]
        gap = 100 * (a["metrics"]["robustness_score"] - b["metrics"]["robustness_score"])
        worst = max(worst, abs(gap))
        print(f"| {c['id']} | {100 * a['metrics']['robustness_score']:.1f}% | "
              f"{len(sa['rounds'])} | {sa['spent']:,} | {'yes' if sa['converged'] else 'no'} | "
              f"{100 * b['metrics']['robustness_score']:.1f}% | {len(sb['rounds'])} | "
              f"{sb['spent']:,} | {'yes' if sb['converged'] else 'no'} | {gap:.1f} |")
    print(f"\nlargest gap: {worst:.1f} points\n")
    print("Random corruptions (robust at delta with confidence, by sequential draws):\n")
    print("| property | packaged robust share (95% CI, undecided both ways) | undecided | "
          "draws/sample | 16x robust share | undecided | draws/sample | 16x inside? | "
          "both decided | agree |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    failures = []
    for c in noisy:
        a, b = res[c["id"]], res[c["id"] + "@16x"]
        lo, hi = a["intervals"]["robustness_score"]
        sb = b["metrics"]["robustness_score"]
        oa, ob = outcomes[c["id"]], outcomes[c["id"] + "@16x"]
        decided = ("robust", "broken")
        both = [i for i in oa if oa[i] in decided and ob.get(i) in decided]
        agree = sum(oa[i] == ob[i] for i in both) / len(both) if both else float("nan")
        inside = lo <= sb <= hi
        if not inside or agree < 0.97:
            failures.append(c["id"])
        print(f"| {c['id']} | {100 * a['metrics']['robustness_score']:.1f}% "
              f"({100 * lo:.1f}–{100 * hi:.1f}%) | {a['metrics']['n_undecided']} | "
              f"{a['metrics']['mean_draws']:.0f} | {100 * sb:.1f}% | "
              f"{b['metrics']['n_undecided']} | {b['metrics']['mean_draws']:.0f} | "
              f"{'yes' if inside else 'NO'} | {len(both)} | {100 * agree:.1f}% |")
    print(f"\nrandom corruptions outside the acceptance: {failures or 'none'}; run took "
          f"{took:.0f} s; records in {out}")


if __name__ == "__main__":
    main()
