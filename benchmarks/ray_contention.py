"""``--executor ray`` on a busy machine: Ray's default worker niceness (15) against certify's (0).

On a machine with other work (a CI job's second test worker, a service's other runs), Ray's
workers at niceness 15 get a few percent of a core beside processes at niceness 0, and a run
whose work is all in the workers crawls. This runs the same small demo suite (one check of each
kind the demo runs, as the test suite's ``demo_small_suite``) three ways, each beside ``--hogs``
busy-looping processes at niceness 0:

- the in-process executor (the peer: what the machine gives a run at normal priority);
- ``--executor ray --workers 2`` with Ray's default niceness of 15 for its workers;
- ``--executor ray --workers 2`` with certify's ``WORKER_NICENESS`` (0).

Each is a ``certify demo --suite … --no-pdf`` subprocess; the figure is its wall time, and the
seconds its checks took (``provenance.timings.total_s``). All three must measure the same.

Run: ``.venv/bin/python benchmarks/ray_contention.py [--hogs 2]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import builders  # noqa: E402  (the test suite's demo_small_suite, so the figure matches it)

RUN = ("import sys, certify.distributed as d; d.WORKER_NICENESS = int(sys.argv[1]); "
       "from certify.cli import main; main(sys.argv[2:])")


def run(folder: Path, suite: Path, name: str, niceness: int | None) -> dict[str, float]:
    """One ``certify demo`` of ``suite`` (on Ray at ``niceness`` unless it is None)."""
    out = folder / name
    args = ["demo", "--suite", str(suite), "--no-pdf", "--out", str(out), "-q"]
    if niceness is not None:
        args += ["--executor", "ray", "--workers", "2"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUN, str(niceness or 0), *args],
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    r = json.loads((out / "results.json").read_text())
    return {"wall_s": round(wall, 1), "checks_s": round(r["provenance"]["timings"]["total_s"], 1),
            "measurement": r["measurement"]["checks"]}


def main() -> None:
    """Print each configuration's seconds beside ``--hogs`` busy processes, as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        suite = builders.write_demo_small_suite(folder / "small.yaml")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(a.hogs)]
        try:
            rows = {"in-process": run(folder, suite, "local", None),
                    "ray, niceness 15 (Ray's default)": run(folder, suite, "ray15", 15),
                    "ray, niceness 0 (certify)": run(folder, suite, "ray0", 0)}
        finally:
            for h in hogs:
                h.kill()
    same = len({json.dumps(r.pop("measurement"), sort_keys=True) for r in rows.values()}) == 1
    print(json.dumps({"hogs": a.hogs, "same_measurement": same, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
