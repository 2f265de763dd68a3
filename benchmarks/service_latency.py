"""A run's latency through ``certify serve``: from submission to a card one can download.

Starts a real ``certify serve`` (SQLite, ``--workers 1``) on 127.0.0.1 and submits runs of the
demo model one after another: a two-check suite (clean accuracy and Gaussian noise, thresholds
at 0) on ``--samples`` demo signs of a registered dataset, with the service's usual PDF card.
Each run's latency is from the start of ``POST /api/v1/runs`` (model and suite uploaded) until
the run is ``done`` and ``GET /api/v1/runs/<id>/card.html`` answers 200; the client polls the
run every 20 ms. One warm-up run is made first (the server's first run: it may wait for its
job host to finish its imports) and reported apart. The CPU seconds are the server's and
every process under it (job hosts, job processes), per measured run.

The same invocation runs ``benchmarks/reference_workload.py`` first (the machine's speed, issue
42), so that the median can be compared across days as a ratio.

Issue 53's target: a median of 3 s or less on an idle 2-core machine.

Run: ``.venv/bin/python benchmarks/service_latency.py [--runs 20] [--samples 12]
[--label NAME]``; prints JSON, then a Markdown row.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from service_fixture import Service, small_inputs  # noqa: E402

from certify.api import demo_model_path  # noqa: E402


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and everything under it: its own, its reaped children's, and
    its live descendants' (with what they reaped)."""
    total = 0.0
    root = psutil.Process(pid)
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def one_run(svc: Service, token: str, suite: Path, samples: int, seed: int) -> float:
    """Seconds from submitting a run until its card.html can be downloaded."""
    headers = {"Authorization": f"Bearer {token}"}
    s = requests.Session()
    s.headers.update(headers)
    t0 = time.perf_counter()
    with demo_model_path().open("rb") as m, suite.open("rb") as f:
        r = s.post(f"{svc.url}/api/v1/runs", files={"model": ("standard.onnx", m),
                                                    "suite_file": ("small.yaml", f)},
                   data={"dataset": "small", "samples": str(samples), "seed": str(seed)},
                   timeout=120)
    r.raise_for_status()
    run_id = r.json()["id"]
    while True:
        doc = s.get(f"{svc.url}/api/v1/runs/{run_id}", timeout=30).json()
        if doc["state"] == "done":
            break
        if doc["state"] in ("error", "cancelled"):
            raise SystemExit(f"run {run_id} ended {doc['state']}: {doc.get('error')}")
        time.sleep(0.02)
    card = s.get(f"{svc.url}/api/v1/runs/{run_id}/card.html", timeout=30)
    took = time.perf_counter() - t0
    if card.status_code != 200 or b"<html" not in card.content[:2000].lower():
        raise SystemExit(f"run {run_id}: card.html answered {card.status_code}")
    return took


def reference() -> float:
    """The reference workload's best round (s), in its own process."""
    out = subprocess.run([sys.executable, str(HERE / "reference_workload.py")],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["best_s"])


def main() -> None:
    """Run the benchmark; print JSON and a Markdown row."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--label", default="certify serve --workers 1")
    ap.add_argument("--keep", action="store_true",
                    help="keep the service's folder and log (its path is printed)")
    args = ap.parse_args()
    ref = reference()
    tmp = Path(tempfile.mkdtemp(prefix="certify-latency-"))
    suite, data = small_inputs(tmp / "in")
    svc = Service(tmp / "home", "--workers", "1", "--dataset", f"small={data}").start()
    try:
        token = svc.token("submit", "--max-concurrent", "4")
        warm_up = one_run(svc, token, suite, args.samples, 0)
        assert svc.proc is not None
        cpu0 = tree_cpu_s(svc.proc.pid)
        latencies = [one_run(svc, token, suite, args.samples, i + 1) for i in range(args.runs)]
        cpu = (tree_cpu_s(svc.proc.pid) - cpu0) / args.runs
    finally:
        svc.stop()
        if args.keep:
            print(f"kept: {tmp} (the server's log: {svc.log_path})", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median(latencies)
    q = statistics.quantiles(latencies, n=10) if len(latencies) > 1 else latencies * 9
    doc = {"label": args.label, "runs": args.runs, "samples": args.samples,
           "median_s": round(med, 3), "p90_s": round(q[-1], 3),
           "min_s": round(min(latencies), 3), "max_s": round(max(latencies), 3),
           "warm_up_s": round(warm_up, 3), "cpu_s_per_run": round(cpu, 3),
           "reference_best_s": ref, "median_over_reference": round(med / ref, 3),
           "latencies_s": [round(x, 3) for x in latencies],
           "target_median_s": 3.0}
    print(json.dumps(doc))
    print("| variant | runs | median s | p90 s | min s | max s | CPU s/run (server + "
          "children) | reference s | median / reference |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.label} | {args.runs} | {med:.2f} | {q[-1]:.2f} | {min(latencies):.2f} | "
          f"{max(latencies):.2f} | {cpu:.2f} | {ref:.2f} | {med / ref:.2f} |")


if __name__ == "__main__":
    main()
